// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The crash-safe form of a session: the last snapshot (a whole saved
//! session) plus an append-only journal of the fid changes made since,
//! kept in a state directory (on tmpfs). A daemon killed at any instant
//! leaves a snapshot and a journal whose records up to the first torn or
//! foreign one are the fid table it had; its successor replays them.
//!
//! ```text
//! session.snap     magic "V9PCRASH" | version u32 | epoch u64
//!                  | session length u32 | session (crate::persist::session_format)
//!                  | crc32 u32 (of everything before it)
//! session.journal  two segments, each half the file: a header (48
//!                  bytes): magic "V9PJOURN" | version u32 | capacity u32
//!                  (of the file) | epoch u64 | previous epoch u64
//!                  | crc32 of those 32 bytes | 12 zero bytes; then
//!                  records: length u32 | seq u32 | kind u8 | payload
//!                  | crc32 u32 (length counts kind and payload; the crc
//!                  covers the segment's epoch, length, seq, kind and
//!                  payload)
//! kinds:           1 set: a fid (session_format's fid encoding)
//!                  2 remove: fid u32       3 reset (Tversion): msize u32
//! ```
//!
//! The snapshot is written aside and renamed over the old one, so it is
//! always whole. The journal is one file of fixed capacity, mapped shared:
//! a record is a few stores into the page cache, no system call, and a
//! SIGKILL loses nothing written before it. Each snapshot gets a new
//! random epoch, and a record counts only if its checksum, which covers
//! the epoch, matches and its sequence number is the next one: records of
//! an older snapshot, a record cut short by the kill, and anything after
//! it are ignored.
//!
//! Compaction never stops the writer for the whole session. When the
//! active segment is full, the writer starts the other one with a new
//! epoch that names the full one's as its previous, and a new snapshot of
//! that epoch is written a few fids at a time while records go on into
//! the new segment ([`SnapshotWriter`]). A successor replays the segment
//! of the snapshot's epoch, then the one that follows it: until the new
//! snapshot is renamed into place that is the old snapshot, the full
//! segment and the new one; afterwards the new snapshot and the new
//! segment. The new snapshot is fuzzy (fids saved as they are when
//! reached, not as they were when the segment started), which the replay
//! makes exact: every record sets, removes or resets whole fids, so
//! replaying a segment onto any state between its start and now ends in
//! the same fids.

use std::ffi::CStr;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::session_format::{Reader, SavedFid, SavedSession};
use crate::error::StateProblem;

/// The snapshot file in the state directory.
pub(crate) const SNAPSHOT: &CStr = c"session.snap";
const SNAPSHOT_TMP: &CStr = c"session.snap.tmp";
/// The journal file in the state directory.
pub(crate) const JOURNAL: &CStr = c"session.journal";
/// Where refused crash state is moved.
const SNAPSHOT_REFUSED: &CStr = c"session.snap.refused";
const JOURNAL_REFUSED: &CStr = c"session.journal.refused";
const INFLIGHT_REFUSED: &CStr = c"session.inflight.refused";

const SNAP_MAGIC: &[u8; 8] = b"V9PCRASH";
const JOURNAL_MAGIC: &[u8; 8] = b"V9PJOURN";
/// The format version of both files (3: two journal segments).
pub(crate) const CRASH_VERSION: u32 = 3;
/// Journal segment header bytes.
pub(crate) const HEADER: usize = 48;
/// Bytes a record adds to its kind and payload.
pub(crate) const RECORD_OVERHEAD: usize = 12;
/// The journal's capacity: 4 MiB of file, two segments of 2 MiB.
pub(crate) const JOURNAL_CAPACITY: usize = 4 << 20;
/// Smallest journal capacity accepted (tests use small ones).
pub(crate) const MIN_CAPACITY: usize = 4096;

/// Record kinds.
const SET: u8 = 1;
const REMOVE: u8 = 2;
const RESET: u8 = 3;

/// A new random epoch (never 0).
pub(crate) fn new_epoch() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let mut e = u64::from_le_bytes(b);
    if n != 8 {
        // No entropy call: the clock is different enough for an epoch.
        e = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            ^ u64::from(std::process::id()) << 32;
    }
    e.max(1)
}

/// The snapshot file's bytes for `session` (an encoded saved session).
pub(crate) fn encode_snapshot(epoch: u64, session: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(session.len() + 28);
    out.extend_from_slice(SNAP_MAGIC);
    out.extend_from_slice(&CRASH_VERSION.to_le_bytes());
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&(session.len() as u32).to_le_bytes());
    out.extend_from_slice(session);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The epoch and the saved session of a snapshot file.
pub(crate) fn decode_snapshot(bytes: &[u8]) -> Result<(u64, SavedSession), StateProblem> {
    if bytes.len() < 8 || &bytes[..8] != SNAP_MAGIC {
        return Err(StateProblem::NotState);
    }
    const FIXED: usize = 24;
    if bytes.len() < FIXED {
        return Err(StateProblem::Truncated {
            len: bytes.len(),
            needed: FIXED,
        });
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or_default());
    if version != CRASH_VERSION {
        return Err(StateProblem::Version {
            found: version,
            expected: CRASH_VERSION,
        });
    }
    let epoch = u64::from_le_bytes(bytes[12..20].try_into().unwrap_or_default());
    let len = u32::from_le_bytes(bytes[20..24].try_into().unwrap_or_default()) as usize;
    let needed = FIXED + len + 4;
    if bytes.len() < needed {
        return Err(StateProblem::Truncated {
            len: bytes.len(),
            needed,
        });
    }
    if bytes.len() > needed {
        return Err(StateProblem::Malformed("bytes after the checksum"));
    }
    let (data, crc) = bytes.split_at(FIXED + len);
    if crc32fast::hash(data) != u32::from_le_bytes(crc.try_into().unwrap_or_default()) {
        return Err(StateProblem::Checksum);
    }
    Ok((epoch, SavedSession::decode(&data[FIXED..])?))
}

/// The record setting a fid.
pub(crate) fn set_record(f: &SavedFid) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + f.inode.len());
    out.push(SET);
    f.encode_into(&mut out);
    out
}

/// The record removing `fid` (Tclunk, Tremove, or a fid that cannot be
/// saved).
pub(crate) fn remove_record(fid: u32) -> [u8; 5] {
    let b = fid.to_le_bytes();
    [REMOVE, b[0], b[1], b[2], b[3]]
}

/// The record of a Tversion: every fid goes, the msize becomes `msize`.
pub(crate) fn reset_record(msize: u32) -> [u8; 5] {
    let b = msize.to_le_bytes();
    [RESET, b[0], b[1], b[2], b[3]]
}

fn record_crc(epoch: u64, len: u32, seq: u32, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&epoch.to_le_bytes());
    h.update(&len.to_le_bytes());
    h.update(&seq.to_le_bytes());
    h.update(body);
    h.finalize()
}

fn journal_header(capacity: usize, epoch: u64, prev: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(JOURNAL_MAGIC);
    h[8..12].copy_from_slice(&CRASH_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(capacity as u32).to_le_bytes());
    h[16..24].copy_from_slice(&epoch.to_le_bytes());
    h[24..32].copy_from_slice(&prev.to_le_bytes());
    let crc = crc32fast::hash(&h[..32]);
    h[32..36].copy_from_slice(&crc.to_le_bytes());
    h
}

/// A segment header's epoch and previous epoch.
#[derive(Debug, Clone, Copy)]
struct SegmentHeader {
    epoch: u64,
    prev: u64,
}

/// The header of the segment at `at` of `journal`; `None` when there is
/// none there or it is damaged, or names another capacity. Another
/// format version is refused.
fn segment_header(journal: &[u8], at: usize) -> Result<Option<SegmentHeader>, StateProblem> {
    let Some(h) = journal.get(at..at + HEADER) else {
        return Ok(None);
    };
    if &h[..8] != JOURNAL_MAGIC {
        return Ok(None);
    }
    let word = |r: std::ops::Range<usize>| u64::from_le_bytes(h[r].try_into().unwrap_or_default());
    let version = u32::from_le_bytes(h[8..12].try_into().unwrap_or_default());
    if version != CRASH_VERSION {
        return Err(StateProblem::Version {
            found: version,
            expected: CRASH_VERSION,
        });
    }
    let capacity = u32::from_le_bytes(h[12..16].try_into().unwrap_or_default());
    let crc = u32::from_le_bytes(h[32..36].try_into().unwrap_or_default());
    if crc32fast::hash(&h[..32]) != crc || capacity as usize != journal.len() {
        return Ok(None);
    }
    Ok(Some(SegmentHeader {
        epoch: word(16..24),
        prev: word(24..32),
    }))
}

/// What a replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Replay {
    /// Records applied.
    pub records: usize,
    /// Journal bytes those records held (from the header's end).
    pub bytes: usize,
    /// The journal belonged to an older snapshot (it was all ignored).
    pub stale: bool,
    /// Something that was not a record of this epoch followed the last
    /// one (a record cut short by the kill, or an older journal's).
    pub torn: bool,
}

/// Applies the records of `journal` that belong to `epoch` to `session`,
/// in order, up to the first that does not (see the module docs): the
/// segment of `epoch`, then the segment that follows it, if any.
///
/// A journal of another format version is refused; one with no segment
/// of `epoch` (headers damaged or of other epochs) is ignored (`stale`:
/// the snapshot was written after it). A record whose checksum holds but
/// whose contents do not parse is refused (`Malformed`).
pub(crate) fn replay(
    session: &mut SavedSession,
    epoch: u64,
    journal: &[u8],
) -> Result<Replay, StateProblem> {
    let mut out = Replay::default();
    let half = journal.len() / 2;
    let bases = [0, half];
    let heads = [
        segment_header(journal, bases[0])?,
        segment_header(journal, bases[1])?,
    ];
    let Some(first) = (0..2).find(|&i| heads[i].is_some_and(|h| h.epoch == epoch)) else {
        out.stale = true;
        return Ok(out);
    };
    let mut order = vec![first];
    if heads[1 - first].is_some_and(|h| h.prev == epoch && h.epoch != epoch) {
        order.push(1 - first);
    }
    let mut fids: std::collections::BTreeMap<u32, SavedFid> = std::mem::take(&mut session.fids)
        .into_iter()
        .map(|f| (f.fid, f))
        .collect();
    for i in order {
        let seg = &journal[bases[i]..bases[i] + half];
        let seg_epoch = heads[i].map_or(0, |h| h.epoch);
        let (records, bytes, torn) = replay_segment(&mut fids, &mut session.msize, seg_epoch, seg)?;
        out.records += records;
        out.bytes += bytes;
        // Only the last segment's end says whether a kill cut a record.
        out.torn = torn;
    }
    session.fids = fids.into_values().collect();
    Ok(out)
}

/// Applies the records of one segment: how many, their bytes, and
/// whether something not a record of `epoch` followed them.
fn replay_segment(
    fids: &mut std::collections::BTreeMap<u32, SavedFid>,
    msize: &mut u32,
    epoch: u64,
    seg: &[u8],
) -> Result<(usize, usize, bool), StateProblem> {
    let mut records = 0;
    let mut torn = false;
    let mut at = HEADER;
    let mut seq = 0u32;
    while let Some(rec) = seg.get(at..at + 8) {
        let len = u32::from_le_bytes(rec[..4].try_into().unwrap_or_default());
        let got_seq = u32::from_le_bytes(rec[4..8].try_into().unwrap_or_default());
        let end = at
            .checked_add(RECORD_OVERHEAD)
            .and_then(|e| e.checked_add(len as usize));
        let Some(body_crc) = end.and_then(|end| seg.get(at + 8..end)) else {
            torn = len != 0 || got_seq != 0;
            break;
        };
        let (body, crc) = body_crc.split_at(len as usize);
        let crc = u32::from_le_bytes(crc.try_into().unwrap_or_default());
        if len == 0 || got_seq != seq || record_crc(epoch, len, got_seq, body) != crc {
            torn = len != 0 || got_seq != 0 || crc != 0;
            break;
        }
        apply(fids, msize, body)?;
        seq = seq.wrapping_add(1);
        at = end.unwrap_or(at);
        records += 1;
    }
    Ok((records, at - HEADER, torn))
}

pub(crate) fn apply(
    fids: &mut std::collections::BTreeMap<u32, SavedFid>,
    msize: &mut u32,
    body: &[u8],
) -> Result<(), StateProblem> {
    let mut r = Reader(&body[1..]);
    match body[0] {
        SET => {
            let f = SavedFid::decode_from(&mut r)?;
            fids.insert(f.fid, f);
        }
        REMOVE => {
            fids.remove(&r.u32()?);
        }
        RESET => {
            *msize = r.u32()?;
            fids.clear();
        }
        _ => return Err(StateProblem::Malformed("unknown journal record")),
    }
    if !r.0.is_empty() {
        return Err(StateProblem::Malformed("bytes after a journal record"));
    }
    Ok(())
}

/// The journal file mapped shared, written by appending records to its
/// active segment.
pub(crate) struct JournalMap {
    ptr: *mut u8,
    cap: usize,
    /// The active segment (0 or 1).
    seg: usize,
    /// Where the next record goes (from the file's start).
    head: usize,
    seq: u32,
    epoch: u64,
}

// SAFETY: the mapping is owned by this value (unmapped on drop) and only
// written through `&mut self`.
unsafe impl Send for JournalMap {}

impl std::fmt::Debug for JournalMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalMap")
            .field("cap", &self.cap)
            .field("seg", &self.seg)
            .field("head", &self.head)
            .field("seq", &self.seq)
            .finish()
    }
}

impl Drop for JournalMap {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `cap` are the mapping made in `open`, unmapped
        // only here.
        unsafe { libc::munmap(self.ptr.cast(), self.cap) };
    }
}

impl JournalMap {
    /// Creates (or takes) `session.journal` in `dir`, sized to `cap`
    /// bytes, and maps it. Its contents stay until [`JournalMap::reset`].
    pub fn open(dir: BorrowedFd<'_>, cap: usize) -> io::Result<JournalMap> {
        // Two segments of whole words.
        let cap = cap.max(MIN_CAPACITY) & !15;
        let fd = openat(dir, JOURNAL, libc::O_RDWR | libc::O_CREAT, 0o600)?;
        // SAFETY: ftruncate on a file we opened for writing.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), cap as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh shared mapping of `cap` bytes of a file that
        // long; the result is checked. Populated now, so that no append
        // takes a page fault under the fid table's lock.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                cap,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(JournalMap {
            ptr: ptr.cast(),
            cap,
            seg: 0,
            head: HEADER,
            seq: 0,
            epoch: 0,
        })
    }

    fn write_at(&mut self, at: usize, bytes: &[u8]) {
        debug_assert!(at + bytes.len() <= self.cap);
        // SAFETY: `at + bytes.len()` is within the mapping (checked by
        // every caller); the source is a distinct Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(at), bytes.len()) };
    }

    /// Where segment `seg` starts in the file.
    fn base(&self, seg: usize) -> usize {
        seg * (self.cap / 2)
    }

    /// Starts segment `seg` with `epoch`, following `prev` (0: none).
    fn start(&mut self, seg: usize, epoch: u64, prev: u64) {
        let base = self.base(seg);
        // The first record slot is zeroed first, then the header: a kill
        // in between leaves a header of an old epoch (ignored).
        self.write_at(base + HEADER, &[0u8; RECORD_OVERHEAD]);
        let h = journal_header(self.cap, epoch, prev);
        self.write_at(base, &h);
        self.seg = seg;
        self.head = base + HEADER;
        self.seq = 0;
        self.epoch = epoch;
    }

    /// Starts the journal again for the snapshot of `epoch` (written and
    /// renamed into place before this call): the first segment holds its
    /// records, the second none.
    pub fn reset(&mut self, epoch: u64) {
        // The second segment's header goes first: a kill before the first
        // segment's header leaves no segment of `epoch` (the snapshot
        // alone is the session then).
        let second = self.base(1);
        self.write_at(second, &[0u8; HEADER]);
        self.start(0, epoch, 0);
    }

    /// Closes the active segment and starts the other with `epoch`, which
    /// follows the closed one. The other segment's records are gone
    /// then: call it only when the snapshot on disk is of the active
    /// segment's epoch ([`JournalMap::epoch`]).
    pub fn switch(&mut self, epoch: u64) {
        let prev = self.epoch;
        self.start(1 - self.seg, epoch, prev);
    }

    /// The active segment's epoch (0 before the first reset).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Appends one record (kind and payload); false when it does not fit
    /// in the active segment: then switch segments (or, for a record
    /// larger than a segment, write a snapshot and reset).
    pub fn append(&mut self, body: &[u8]) -> bool {
        let total = RECORD_OVERHEAD + body.len();
        let end = self.base(self.seg) + self.cap / 2;
        if self.head + total > end || self.epoch == 0 {
            return false;
        }
        let len = body.len() as u32;
        let crc = record_crc(self.epoch, len, self.seq, body);
        let at = self.head;
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&len.to_le_bytes());
        head[4..].copy_from_slice(&self.seq.to_le_bytes());
        self.write_at(at, &head);
        self.write_at(at + 8, body);
        self.write_at(at + 8 + body.len(), &crc.to_le_bytes());
        self.head += total;
        self.seq = self.seq.wrapping_add(1);
        true
    }

    /// Bytes of records in the active segment.
    #[cfg(test)]
    pub fn used(&self) -> usize {
        self.head - self.base(self.seg) - HEADER
    }

    /// Bytes of records a segment holds.
    pub fn usable(&self) -> usize {
        self.cap / 2 - HEADER
    }
}

fn openat(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<OwnedFd> {
    // SAFETY: a valid dirfd and C string; the fd returned is checked.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            libc::c_uint::from(mode),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads `name` in `dir`; `None` if it does not exist.
pub(crate) fn read_file(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Option<Vec<u8>>> {
    let fd = match openat(dir, name, libc::O_RDONLY, 0) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    std::fs::File::from(fd).read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

/// Writes the snapshot file: aside, then renamed over the old one.
pub(crate) fn write_snapshot(dir: BorrowedFd<'_>, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let fd = openat(
        dir,
        SNAPSHOT_TMP,
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        0o600,
    )?;
    std::fs::File::from(fd).write_all(bytes)?;
    rename(dir, SNAPSHOT_TMP, SNAPSHOT)
}

/// A snapshot written a few fids at a time: the bytes
/// [`encode_snapshot`] makes of a whole saved session, streamed into the
/// aside file with the checksums combined at the end, so that no step
/// costs more than the fids it is given. [`SnapshotWriter::finish`]
/// renames it into place.
pub(crate) struct SnapshotWriter {
    file: std::fs::File,
    epoch: u64,
    /// The session body's start (export id, msize, filesystem state).
    prefix: Vec<u8>,
    count: u32,
    /// Encoded fids not yet written.
    buf: Vec<u8>,
    /// The checksum and length of the fids written.
    fids: crc32fast::Hasher,
    fids_len: usize,
}

/// Encoded fids a [`SnapshotWriter`] keeps before it writes them.
const SNAPSHOT_CHUNK: usize = 64 << 10;
/// The snapshot frame's fixed header.
const SNAP_HEADER: usize = 24;

impl SnapshotWriter {
    /// Starts the snapshot of `epoch` in the aside file of `dir`.
    pub fn create(
        dir: BorrowedFd<'_>,
        epoch: u64,
        export_id: &[u8],
        msize: u32,
        fs_state: &[u8],
    ) -> io::Result<SnapshotWriter> {
        let fd = openat(
            dir,
            SNAPSHOT_TMP,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            0o600,
        )?;
        Ok(SnapshotWriter {
            file: std::fs::File::from(fd),
            epoch,
            prefix: super::session_format::body_prefix(export_id, msize, fs_state),
            count: 0,
            buf: Vec::new(),
            fids: crc32fast::Hasher::new(),
            fids_len: 0,
        })
    }

    /// Where the fids start in the file.
    fn fids_at(&self) -> usize {
        SNAP_HEADER + 16 + self.prefix.len() + 4
    }

    /// Adds one fid (in fid order, each once).
    pub fn push(&mut self, f: &SavedFid) -> io::Result<()> {
        f.encode_into(&mut self.buf);
        self.count += 1;
        if self.buf.len() >= SNAPSHOT_CHUNK {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let at = self.fids_at() + self.fids_len;
        self.file.write_all_at(&self.buf, at as u64)?;
        self.fids.update(&self.buf);
        self.fids_len += self.buf.len();
        self.buf.clear();
        Ok(())
    }

    /// The snapshot's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Writes the headers and checksums and renames the snapshot into
    /// place.
    pub fn finish(mut self, dir: BorrowedFd<'_>) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.flush()?;
        let body_len = self.prefix.len() + 4 + self.fids_len;
        let session_header = super::session_format::session_header(body_len);
        let count = self.count.to_le_bytes();
        let mut inner = crc32fast::Hasher::new();
        inner.update(&session_header);
        inner.update(&self.prefix);
        inner.update(&count);
        inner.combine(&self.fids);
        let inner_crc = inner.finalize().to_le_bytes();
        let mut head = Vec::with_capacity(self.fids_at());
        head.extend_from_slice(SNAP_MAGIC);
        head.extend_from_slice(&CRASH_VERSION.to_le_bytes());
        head.extend_from_slice(&self.epoch.to_le_bytes());
        head.extend_from_slice(&((16 + body_len + 4) as u32).to_le_bytes());
        head.extend_from_slice(&session_header);
        head.extend_from_slice(&self.prefix);
        head.extend_from_slice(&count);
        let mut outer = crc32fast::Hasher::new();
        outer.update(&head);
        outer.combine(&self.fids);
        outer.update(&inner_crc);
        let mut tail = inner_crc.to_vec();
        tail.extend_from_slice(&outer.finalize().to_le_bytes());
        self.file.write_all_at(&head, 0)?;
        self.file
            .write_all_at(&tail, (self.fids_at() + self.fids_len) as u64)?;
        rename(dir, SNAPSHOT_TMP, SNAPSHOT)
    }
}

fn rename(dir: BorrowedFd<'_>, from: &CStr, to: &CStr) -> io::Result<()> {
    // SAFETY: a valid dirfd and C strings.
    let r = unsafe { libc::renameat(dir.as_raw_fd(), from.as_ptr(), dir.as_raw_fd(), to.as_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn unlink(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: a valid dirfd and C string.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOENT) {
            return Err(e);
        }
    }
    Ok(())
}

/// Removes the crash state (the session ended cleanly).
pub(crate) fn remove_state(dir: BorrowedFd<'_>) -> io::Result<()> {
    unlink(dir, SNAPSHOT)?;
    unlink(dir, JOURNAL)?;
    unlink(dir, super::inflight_table::INFLIGHT)
}

/// Moves refused crash state aside (`*.refused`).
pub(crate) fn set_aside(dir: BorrowedFd<'_>) -> io::Result<()> {
    for (from, to) in [
        (SNAPSHOT, SNAPSHOT_REFUSED),
        (JOURNAL, JOURNAL_REFUSED),
        (super::inflight_table::INFLIGHT, INFLIGHT_REFUSED),
    ] {
        match rename(dir, from, to) {
            Err(e) if e.raw_os_error() != Some(libc::ENOENT) => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Reads the crash state in `dir`: the snapshot with the journal replayed
/// onto it, or `None` when there is no snapshot.
pub(crate) fn load(
    dir: BorrowedFd<'_>,
) -> io::Result<Option<Result<(SavedSession, Replay), StateProblem>>> {
    let Some(snap) = read_file(dir, SNAPSHOT)? else {
        return Ok(None);
    };
    let journal = read_file(dir, JOURNAL)?.unwrap_or_default();
    Ok(Some(decode_snapshot(&snap).and_then(
        |(epoch, mut session)| replay(&mut session, epoch, &journal).map(|r| (session, r)),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::session_format::SavedKind;

    fn fid(n: u32, path: &str) -> SavedFid {
        SavedFid {
            fid: n,
            uid: 0,
            inode: path.as_bytes().to_vec(),
            kind: SavedKind::Walked,
        }
    }

    fn base() -> SavedSession {
        SavedSession {
            export_id: b"export".to_vec(),
            msize: 8192,
            fs_state: Vec::new(),
            fids: vec![fid(0, "root")],
        }
    }

    /// A journal in a temporary directory with `records` appended.
    fn journal_with(
        dir: &tempfile::TempDir,
        epoch: u64,
        cap: usize,
        records: &[Vec<u8>],
    ) -> Vec<u8> {
        let d = std::fs::File::open(dir.path()).unwrap();
        let fd = std::os::fd::AsFd::as_fd(&d);
        let mut j = JournalMap::open(fd, cap).unwrap();
        j.reset(epoch);
        for r in records {
            assert!(j.append(r));
        }
        drop(j);
        std::fs::read(dir.path().join("session.journal")).unwrap()
    }

    fn records() -> Vec<Vec<u8>> {
        vec![
            set_record(&fid(1, "a")),
            set_record(&fid(2, "b")),
            remove_record(1).to_vec(),
            set_record(&SavedFid {
                fid: 3,
                uid: 1000,
                inode: b"c".to_vec(),
                kind: SavedKind::Open {
                    flags: 2,
                    locks: Some(vec![b"lock".to_vec()]),
                },
            }),
        ]
    }

    #[test]
    fn test_journal_replays_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = journal_with(&dir, 7, MIN_CAPACITY, &records());
        let mut s = base();
        let r = replay(&mut s, 7, &bytes).unwrap();
        assert_eq!(r.records, 4);
        assert!(!r.stale && !r.torn);
        let ids: Vec<u32> = s.fids.iter().map(|f| f.fid).collect();
        assert_eq!(ids, vec![0, 2, 3]);
        assert!(matches!(s.fids[2].kind, SavedKind::Open { flags: 2, .. }));

        // A Tversion record drops every fid and sets the msize.
        let bytes = journal_with(
            &dir,
            8,
            MIN_CAPACITY,
            &[set_record(&fid(5, "x")), reset_record(65536).to_vec()],
        );
        let mut s = base();
        replay(&mut s, 8, &bytes).unwrap();
        assert!(s.fids.is_empty());
        assert_eq!(s.msize, 65536);
    }

    #[test]
    fn test_journal_cut_anywhere_keeps_every_whole_record() {
        let dir = tempfile::tempdir().unwrap();
        let recs = records();
        let bytes = journal_with(&dir, 9, MIN_CAPACITY, &recs);
        // Record boundaries.
        let mut ends = vec![HEADER];
        for r in &recs {
            ends.push(ends.last().unwrap() + RECORD_OVERHEAD + r.len());
        }
        for cut in HEADER..=*ends.last().unwrap() {
            // A kill mid-record: the rest of the file is whatever was
            // there (zeros here, or garbage).
            for fill in [0u8, 0xa5] {
                let mut b = bytes.clone();
                b[cut..].fill(fill);
                let mut s = base();
                let r = replay(&mut s, 9, &b).unwrap();
                let whole = ends.iter().filter(|e| **e <= cut).count() - 1;
                assert_eq!(r.records, whole, "cut at {cut}, fill {fill:#x}");
                assert_eq!(r.bytes, ends[whole] - HEADER);
            }
        }
    }

    #[test]
    fn test_journal_of_another_epoch_or_damaged_header_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = journal_with(&dir, 11, MIN_CAPACITY, &records());
        let mut s = base();
        let r = replay(&mut s, 12, &bytes).unwrap();
        assert!(r.stale);
        assert_eq!(s, base());
        let mut b = bytes.clone();
        b[17] ^= 1;
        let r = replay(&mut s, 11, &b).unwrap();
        assert!(r.stale && r.records == 0);
        // Not a journal at all, or an empty file: nothing to replay.
        assert!(replay(&mut s, 11, b"").unwrap().stale);
        assert!(replay(&mut s, 11, &[0u8; 64]).unwrap().stale);
    }

    #[test]
    fn test_records_of_an_older_epoch_after_a_reset_are_not_replayed() {
        let dir = tempfile::tempdir().unwrap();
        journal_with(&dir, 21, MIN_CAPACITY, &records());
        // The same file, reset for a new snapshot, one record written:
        // the older records behind it fail their checksum.
        let bytes = journal_with(&dir, 22, MIN_CAPACITY, &[remove_record(0).to_vec()]);
        let mut s = base();
        let r = replay(&mut s, 22, &bytes).unwrap();
        assert_eq!(r.records, 1);
        assert!(r.torn, "the old records follow");
        assert!(s.fids.is_empty());
    }

    #[test]
    fn test_every_flipped_bit_of_a_record_ends_the_replay_there() {
        let dir = tempfile::tempdir().unwrap();
        let recs = records();
        let bytes = journal_with(&dir, 31, MIN_CAPACITY, &recs);
        let first_end = HEADER + RECORD_OVERHEAD + recs[0].len();
        for i in HEADER..first_end {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            let mut s = base();
            let r = replay(&mut s, 31, &b).unwrap();
            assert_eq!(r.records, 0, "byte {i}");
            assert!(r.torn);
        }
    }

    #[test]
    fn test_journal_of_another_version_is_refused_and_bad_records_malformed() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = journal_with(&dir, 41, MIN_CAPACITY, &records());
        bytes[8..12].copy_from_slice(&9u32.to_le_bytes());
        let mut s = base();
        assert_eq!(
            replay(&mut s, 41, &bytes),
            Err(StateProblem::Version {
                found: 9,
                expected: CRASH_VERSION
            })
        );
        // A checksummed record of an unknown kind: written by no build of
        // this version, so refused rather than skipped.
        let bytes = journal_with(&dir, 42, MIN_CAPACITY, &[vec![99, 0, 0, 0, 0]]);
        assert!(matches!(
            replay(&mut s, 42, &bytes),
            Err(StateProblem::Malformed(_))
        ));
        let bytes = journal_with(&dir, 43, MIN_CAPACITY, &[vec![REMOVE, 1, 2]]);
        assert!(matches!(
            replay(&mut s, 43, &bytes),
            Err(StateProblem::Malformed(_))
        ));
    }

    #[test]
    fn test_journal_fills_to_half_its_capacity() {
        let dir = tempfile::tempdir().unwrap();
        let d = std::fs::File::open(dir.path()).unwrap();
        let mut j = JournalMap::open(std::os::fd::AsFd::as_fd(&d), MIN_CAPACITY).unwrap();
        assert!(!j.append(&remove_record(1)), "no epoch yet");
        j.reset(5);
        let rec = remove_record(1);
        let mut n = 0;
        while j.append(&rec) {
            n += 1;
        }
        assert_eq!(
            n,
            (MIN_CAPACITY / 2 - HEADER) / (RECORD_OVERHEAD + rec.len())
        );
        assert!(j.used() <= MIN_CAPACITY / 2);
        j.reset(6);
        assert_eq!(j.used(), 0);
        assert!(j.append(&rec));
    }

    #[test]
    fn test_a_snapshot_written_in_steps_is_the_whole_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let d = std::fs::File::open(dir.path()).unwrap();
        let fd = std::os::fd::AsFd::as_fd(&d);
        // Enough fids for several chunks, one of them large.
        let mut s = base();
        s.fs_state = b"qids".to_vec();
        for n in 1..3000u32 {
            s.fids.push(fid(n, &format!("path/{n:040}")));
        }
        s.fids.push(SavedFid {
            fid: 5000,
            uid: 7,
            inode: b"x".to_vec(),
            kind: SavedKind::XattrRead(vec![0x5a; 100_000]),
        });
        let mut w = SnapshotWriter::create(fd, 99, &s.export_id, s.msize, &s.fs_state).unwrap();
        assert_eq!(w.epoch(), 99);
        for f in &s.fids {
            w.push(f).unwrap();
        }
        w.finish(fd).unwrap();
        let got = std::fs::read(dir.path().join("session.snap")).unwrap();
        assert_eq!(got, encode_snapshot(99, &s.encode()));
        assert_eq!(decode_snapshot(&got).unwrap(), (99, s));
        // No fid at all.
        let empty = SavedSession {
            fids: Vec::new(),
            ..base()
        };
        let w = SnapshotWriter::create(fd, 5, &empty.export_id, empty.msize, &[]).unwrap();
        w.finish(fd).unwrap();
        let got = std::fs::read(dir.path().join("session.snap")).unwrap();
        assert_eq!(got, encode_snapshot(5, &empty.encode()));
    }

    #[test]
    fn test_a_switched_journal_replays_the_segment_that_follows() {
        let dir = tempfile::tempdir().unwrap();
        let d = std::fs::File::open(dir.path()).unwrap();
        let fd = std::os::fd::AsFd::as_fd(&d);
        let mut j = JournalMap::open(fd, MIN_CAPACITY).unwrap();
        j.reset(51);
        assert!(j.append(&set_record(&fid(1, "a"))));
        assert!(j.append(&set_record(&fid(2, "b"))));
        j.switch(52);
        assert_eq!(j.epoch(), 52);
        assert_eq!(j.used(), 0);
        assert!(j.append(&remove_record(1)));
        assert!(j.append(&set_record(&fid(3, "c"))));
        let bytes = std::fs::read(dir.path().join("session.journal")).unwrap();
        // The old snapshot: both segments.
        let mut s = base();
        let r = replay(&mut s, 51, &bytes).unwrap();
        assert_eq!(r.records, 4);
        assert!(!r.stale && !r.torn);
        let ids: Vec<u32> = s.fids.iter().map(|f| f.fid).collect();
        assert_eq!(ids, vec![0, 2, 3]);
        // The new one (written while fid 3 was set, say): the second
        // segment alone, onto it.
        let mut s = base();
        s.fids.push(fid(2, "b"));
        s.fids.push(fid(3, "c"));
        let r = replay(&mut s, 52, &bytes).unwrap();
        assert_eq!(r.records, 2);
        let ids: Vec<u32> = s.fids.iter().map(|f| f.fid).collect();
        assert_eq!(ids, vec![0, 2, 3]);
        // Back to the first segment: the records of 51 are gone, so a
        // snapshot of 51 finds no segment of its own.
        j.switch(53);
        assert!(j.append(&remove_record(2)));
        let bytes = std::fs::read(dir.path().join("session.journal")).unwrap();
        assert!(replay(&mut base(), 51, &bytes).unwrap().stale);
        let mut s = base();
        let r = replay(&mut s, 52, &bytes).unwrap();
        assert_eq!(r.records, 3);
        // A segment fills and refuses what does not fit.
        let rec = remove_record(9);
        while j.append(&rec) {}
        assert!(j.used() <= j.usable());
        assert!(j.usable() - j.used() < RECORD_OVERHEAD + rec.len());
    }

    #[test]
    fn test_snapshot_round_trips_and_refuses_damage() {
        let s = base();
        let bytes = encode_snapshot(77, &s.encode());
        assert_eq!(decode_snapshot(&bytes).unwrap(), (77, s));
        assert_eq!(decode_snapshot(b"V9PSTATE"), Err(StateProblem::NotState));
        for len in 8..bytes.len() {
            assert!(matches!(
                decode_snapshot(&bytes[..len]),
                Err(StateProblem::Truncated { .. })
            ));
        }
        for i in 24..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 1;
            assert!(decode_snapshot(&b).is_err(), "byte {i}");
        }
        let mut b = bytes.clone();
        b[8] = 9;
        assert!(matches!(
            decode_snapshot(&b),
            Err(StateProblem::Version { found: 9, .. })
        ));
    }

    #[test]
    fn test_load_reads_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let d = std::fs::File::open(dir.path()).unwrap();
        let fd = std::os::fd::AsFd::as_fd(&d);
        assert!(load(fd).unwrap().is_none());
        write_snapshot(fd, &encode_snapshot(3, &base().encode())).unwrap();
        let mut j = JournalMap::open(fd, MIN_CAPACITY).unwrap();
        j.reset(3);
        assert!(j.append(&set_record(&fid(4, "d"))));
        let (s, r) = load(fd).unwrap().unwrap().unwrap();
        assert_eq!(r.records, 1);
        assert_eq!(s.fids.len(), 2);
        set_aside(fd).unwrap();
        assert!(load(fd).unwrap().is_none());
        assert!(dir.path().join("session.snap.refused").exists());
        write_snapshot(fd, b"garbage").unwrap();
        assert_eq!(load(fd).unwrap().unwrap(), Err(StateProblem::NotState));
        remove_state(fd).unwrap();
        assert!(load(fd).unwrap().is_none());
        remove_state(fd).unwrap();
    }
}
