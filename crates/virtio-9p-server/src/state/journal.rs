// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The crash-safe form of a session: the last snapshot (a whole saved
//! session) plus an append-only journal of the fid changes made since,
//! kept in a state directory (on tmpfs). A daemon killed at any instant
//! leaves a snapshot and a journal whose records up to the first torn or
//! foreign one are the fid table it had; its successor replays them.
//!
//! ```text
//! session.snap     magic "V9PCRASH" | version u32 | epoch u64
//!                  | session length u32 | session (crate::state format)
//!                  | crc32 u32 (of everything before it)
//! session.journal  header (32 bytes): magic "V9PJOURN" | version u32
//!                  | capacity u32 | epoch u64 | crc32 of those 24 bytes
//!                  | 4 zero bytes; then records:
//!                  length u32 | seq u32 | kind u8 | payload | crc32 u32
//!                  (length counts kind and payload; the crc covers the
//!                  snapshot's epoch, length, seq, kind and payload)
//! kinds:           1 set: a fid (crate::state's fid encoding)
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
//! it are ignored. When the journal reaches half its capacity the session
//! is written as a new snapshot and the journal starts again (compaction):
//! it touches at most half its capacity plus one record of memory.

use std::ffi::CStr;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::{Reader, SavedFid, SavedSession};
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
/// The format version of both files.
pub(crate) const CRASH_VERSION: u32 = 2;
/// Journal header bytes.
pub(crate) const HEADER: usize = 32;
/// Bytes a record adds to its kind and payload.
pub(crate) const RECORD_OVERHEAD: usize = 12;
/// The journal's capacity: 4 MiB of file, of which at most half plus one
/// record is written between two snapshots.
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

fn journal_header(capacity: usize, epoch: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(JOURNAL_MAGIC);
    h[8..12].copy_from_slice(&CRASH_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(capacity as u32).to_le_bytes());
    h[16..24].copy_from_slice(&epoch.to_le_bytes());
    let crc = crc32fast::hash(&h[..24]);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
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
/// in order, up to the first that does not (see the module docs).
///
/// A journal of another format version is refused; one whose header is
/// damaged or of another epoch is ignored (`stale`: the snapshot was
/// written after it). A record whose checksum holds but whose contents do
/// not parse is refused (`Malformed`).
pub(crate) fn replay(
    session: &mut SavedSession,
    epoch: u64,
    journal: &[u8],
) -> Result<Replay, StateProblem> {
    let mut out = Replay::default();
    if journal.len() < HEADER || &journal[..8] != JOURNAL_MAGIC {
        out.stale = true;
        return Ok(out);
    }
    let version = u32::from_le_bytes(journal[8..12].try_into().unwrap_or_default());
    if version != CRASH_VERSION {
        return Err(StateProblem::Version {
            found: version,
            expected: CRASH_VERSION,
        });
    }
    let crc = u32::from_le_bytes(journal[24..28].try_into().unwrap_or_default());
    let header_epoch = u64::from_le_bytes(journal[16..24].try_into().unwrap_or_default());
    if crc32fast::hash(&journal[..24]) != crc || header_epoch != epoch {
        out.stale = true;
        return Ok(out);
    }
    let mut fids: std::collections::BTreeMap<u32, SavedFid> = std::mem::take(&mut session.fids)
        .into_iter()
        .map(|f| (f.fid, f))
        .collect();
    let mut at = HEADER;
    let mut seq = 0u32;
    while let Some(rec) = journal.get(at..at + 8) {
        let len = u32::from_le_bytes(rec[..4].try_into().unwrap_or_default());
        let got_seq = u32::from_le_bytes(rec[4..8].try_into().unwrap_or_default());
        let end = at
            .checked_add(RECORD_OVERHEAD)
            .and_then(|e| e.checked_add(len as usize));
        let Some(body_crc) = end.and_then(|end| journal.get(at + 8..end)) else {
            out.torn = len != 0 || got_seq != 0;
            break;
        };
        let (body, crc) = body_crc.split_at(len as usize);
        let crc = u32::from_le_bytes(crc.try_into().unwrap_or_default());
        if len == 0 || got_seq != seq || record_crc(epoch, len, got_seq, body) != crc {
            out.torn = len != 0 || got_seq != 0 || crc != 0;
            break;
        }
        apply(&mut fids, &mut session.msize, body)?;
        seq = seq.wrapping_add(1);
        at = end.unwrap_or(at);
        out.records += 1;
    }
    out.bytes = at - HEADER;
    session.fids = fids.into_values().collect();
    Ok(out)
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

/// The journal file mapped shared, written by appending records.
pub(crate) struct JournalMap {
    ptr: *mut u8,
    cap: usize,
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
        let cap = cap.max(MIN_CAPACITY);
        let fd = openat(dir, JOURNAL, libc::O_RDWR | libc::O_CREAT, 0o600)?;
        // SAFETY: ftruncate on a file we opened for writing.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), cap as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh shared mapping of `cap` bytes of a file that
        // long; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                cap,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
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

    /// Starts the journal again for the snapshot of `epoch` (written and
    /// renamed into place before this call).
    pub fn reset(&mut self, epoch: u64) {
        // The first record slot is zeroed first, then the header: a kill
        // in between leaves a header of the old epoch (ignored).
        self.write_at(HEADER, &[0u8; RECORD_OVERHEAD]);
        let h = journal_header(self.cap, epoch);
        self.write_at(0, &h);
        self.head = HEADER;
        self.seq = 0;
        self.epoch = epoch;
    }

    /// Appends one record (kind and payload); false when it does not fit
    /// before half the capacity: then write a snapshot and reset.
    pub fn append(&mut self, body: &[u8]) -> bool {
        let total = RECORD_OVERHEAD + body.len();
        if self.head + total > self.cap / 2 || self.epoch == 0 {
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

    /// Bytes of records since the last reset.
    #[cfg(test)]
    pub fn used(&self) -> usize {
        self.head - HEADER
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
    unlink(dir, super::inflight::INFLIGHT)
}

/// Moves refused crash state aside (`*.refused`).
pub(crate) fn set_aside(dir: BorrowedFd<'_>) -> io::Result<()> {
    for (from, to) in [
        (SNAPSHOT, SNAPSHOT_REFUSED),
        (JOURNAL, JOURNAL_REFUSED),
        (super::inflight::INFLIGHT, INFLIGHT_REFUSED),
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
    use crate::state::SavedKind;

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
                expected: 2
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
