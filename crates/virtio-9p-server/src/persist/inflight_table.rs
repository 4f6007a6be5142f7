// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The device's own record of the chains it took (exactly once
//! across a crash): one slot per ring position modulo the queue size, in
//! a file of the state directory mapped shared, so a SIGKILL loses no
//! store made before it.
//!
//! ```text
//! session.inflight  header (64 bytes): magic "V9PINFLT" | version u32
//!                   | queue size u32 | layout u8 (0 split, 1 packed)
//!                   | 3 zero bytes | crc32 of those 20 bytes
//!                   | 24: ring word u64 (packed): next available u16
//!                     | next used u16 | started u16 | valid bit 48
//!                   | 32: descriptor ring, driver area, device area
//!                     (u64 guest addresses) | zeros
//!                   then queue-size slots of 256 bytes:
//!   0  control u64: state u8 | message type u8 | tag u16 | position u32
//!   8  used position u32 | buffer id u16 | ring slots u16
//!  16  the chain's first descriptor as it was in the ring (16 bytes)
//!  32  intent: time u64 (ns, CLOCK_REALTIME) | qid path u64
//!  48  request digest u32 (crc32 of its first 64 bytes) | 4 zero bytes
//!  56  reply length u16 | 6 zero bytes
//!  64  reply (up to 192 bytes)
//! ```
//!
//! A slot's fields are written first and its control word last, with one
//! 8-byte release store: a slot is always a whole old state or a whole
//! new one. States: popped (the device took the chain), intent (a call
//! that is not idempotent is about to run), committed (its reply is
//! recorded), used (its used element went to the ring at the used
//! position). Positions are the split ring's available index, or the
//! packed ring's slot plus the queue size when its wrap counter is 0
//! (so they run modulo 65536, or modulo twice the queue size).
//!
//! The request digest binds a slot to the chain it was taken from: a
//! chain offered again at a recorded position is that chain only if its
//! request has the same digest (a driver never changes a request it made
//! available). A guest that was reset while the daemon was down, which
//! lays out other requests at the same positions (Linux reuses its tags
//! the same way each boot), does not match, and the table is discarded.
//!
//! The ring word keeps a packed ring's own position, which a frontend
//! that lost its backend cannot give back (QEMU keeps the base it last
//! sent or read, see [`RingRecord`]): the next available and next used
//! slot, each with its wrap counter in bit 15, stored after every chain
//! taken and every used element written, and the base the ring was
//! started with (or reported at its last stop). It is one 8-byte store.

// Opened and read back by the vhost-user backend only.
#![cfg_attr(not(feature = "vhost-user"), allow(dead_code))]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// The server's view of one slot while its request runs (see
/// `exactly_once`): what it records there.
pub(crate) trait RequestRecord {
    /// Before a call that is not idempotent: the time and the qid path
    /// of what it moves or removes (0 if none).
    fn intent(&self, time: u64, qid: u64);
    /// The encoded reply, before it goes out.
    fn commit(&self, reply: &[u8]);
}

/// What a slot says of a request a killed daemon took and did not
/// answer, for `Server::recover`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Left {
    /// An intent was recorded.
    pub intent: bool,
    /// Its time (for a reader of the table; no decision uses it).
    pub time: u64,
    /// The qid path it recorded: the file moved or removed, or what the
    /// name to create held already (0: nothing).
    pub qid: u64,
}

/// The table file in the state directory.
pub(crate) const INFLIGHT: &std::ffi::CStr = c"session.inflight";
const MAGIC: &[u8; 8] = b"V9PINFLT";
const VERSION: u32 = 2;
const HEADER: usize = 64;
/// Bytes per slot.
pub(crate) const SLOT: usize = 256;
/// Largest reply a slot records.
pub(crate) const MAX_REPLY: usize = SLOT - 64;

/// Slot states.
pub(crate) const EMPTY: u8 = 0;
pub(crate) const POPPED: u8 = 1;
pub(crate) const INTENT: u8 = 2;
pub(crate) const COMMITTED: u8 = 3;
pub(crate) const USED: u8 = 4;
/// Set beside the state once a reply is recorded (kept when used).
const HAS_REPLY: u64 = 0x10;
/// The header bytes that name the table (magic to CRC).
const NAMED: usize = 24;
/// Offset of the ring word and of the ring addresses in the header.
const RING_WORD: usize = 24;
const RING_ADDRS: usize = 32;
/// The ring word holds a position.
const RING_VALID: u64 = 1 << 48;

/// A packed ring's position as the table last recorded it: the next
/// available and next used slot (wrap counter in bit 15), the
/// `SET_VRING_BASE` value the ring was started with or the base its last
/// stop reported (what the frontend knows), and its guest addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingRecord {
    pub avail: u16,
    pub used: u16,
    pub started: u16,
    pub addrs: [u64; 3],
}

impl RingRecord {
    /// The ring word of this record.
    pub fn word(&self) -> u64 {
        u64::from(self.avail)
            | u64::from(self.used) << 16
            | u64::from(self.started) << 32
            | RING_VALID
    }
}

/// One slot as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slot {
    pub state: u8,
    pub ty: u8,
    pub tag: u16,
    pub pos: u32,
    pub used: u32,
    pub id: u16,
    pub slots: u16,
    pub desc: [u8; 16],
    pub time: u64,
    pub qid: u64,
    /// The digest of the request ([`request_digest`]).
    pub digest: u32,
    /// The recorded reply, if the slot was committed before it was used.
    pub reply: Option<Vec<u8>>,
}

/// The digest a slot records of a request: crc32 of its first bytes (up
/// to 64; the 9P header and the fields that name what it does).
pub(crate) fn request_digest(first: &[u8]) -> u32 {
    crc32fast::hash(&first[..first.len().min(64)])
}

fn control(state: u8, ty: u8, tag: u16, pos: u32) -> u64 {
    u64::from(state) | u64::from(ty) << 8 | u64::from(tag) << 16 | u64::from(pos) << 32
}

fn header(queue_size: u16, packed: bool) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&u32::from(queue_size).to_le_bytes());
    h[16] = u8::from(packed);
    let crc = crc32fast::hash(&h[..20]);
    h[20..24].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The table of one ring, mapped shared.
pub(crate) struct InflightTable {
    ptr: *mut u8,
    len: usize,
    size: u16,
}

// SAFETY: the mapping is owned by the table (unmapped on drop). Slots are
// written through atomics (the control word) and plain stores to a slot
// only its request's owner writes (one request per position at a time).
unsafe impl Send for InflightTable {}
// SAFETY: as above.
unsafe impl Sync for InflightTable {}

impl std::fmt::Debug for InflightTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InflightTable")
            .field("size", &self.size)
            .finish()
    }
}

impl Drop for InflightTable {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, unmapped only here.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl InflightTable {
    /// Opens (creating) the table of a ring of `queue_size` entries and
    /// `packed` layout in `dir`, and returns it with the slots a previous
    /// instance left, if the file was one of the same ring (else empty).
    /// With it, the packed ring position it recorded, if any.
    pub fn open(
        dir: BorrowedFd<'_>,
        queue_size: u16,
        packed: bool,
    ) -> io::Result<(Self, Vec<Slot>, Option<RingRecord>)> {
        let len = HEADER + SLOT * usize::from(queue_size);
        // SAFETY: a valid dirfd and C string; the fd returned is checked.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                INFLIGHT.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new fd we own.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // SAFETY: ftruncate on a file we opened for writing.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh shared mapping of `len` bytes of a file that
        // long; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let t = InflightTable {
            ptr: ptr.cast(),
            len,
            size: queue_size,
        };
        let want = header(queue_size, packed);
        if t.bytes(0, NAMED) == &want[..NAMED] {
            let old = (0..queue_size).filter_map(|i| t.read(i)).collect();
            let ring = t.ring_record();
            return Ok((t, old, ring));
        }
        t.clear();
        t.write(0, &want);
        Ok((t, Vec::new(), None))
    }

    /// [`InflightTable::open`] of a new, empty table in place of the one
    /// in `dir`, for a ring of another size or layout (a driver that set
    /// a new size after a stop). The old file is unlinked first, so a
    /// mapping of it still alive (a request given up on by a reset) keeps
    /// its own pages and never faults on a shrunk file.
    pub fn recreate(dir: BorrowedFd<'_>, queue_size: u16, packed: bool) -> io::Result<Self> {
        // SAFETY: a valid dirfd and C string.
        if unsafe { libc::unlinkat(dir.as_raw_fd(), INFLIGHT.as_ptr(), 0) } != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
        }
        let (t, _, _) = Self::open(dir, queue_size, packed)?;
        Ok(t)
    }

    /// The queue size the table is laid out for.
    pub fn queue_size(&self) -> u16 {
        self.size
    }

    fn ring_word(&self) -> &AtomicU64 {
        // SAFETY: offset 24 is 8-byte aligned within the page-aligned
        // mapping, and AtomicU64 has the layout of u64.
        unsafe { &*(self.ptr.add(RING_WORD) as *const AtomicU64) }
    }

    /// The packed ring position recorded, if any.
    pub fn ring_record(&self) -> Option<RingRecord> {
        let w = self.ring_word().load(Ordering::Acquire);
        if w & RING_VALID == 0 {
            return None;
        }
        let b = self.bytes(RING_ADDRS, 24);
        let a = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap_or_default());
        Some(RingRecord {
            avail: w as u16,
            used: (w >> 16) as u16,
            started: (w >> 32) as u16,
            addrs: [a(0), a(1), a(2)],
        })
    }

    /// Records a packed ring as started (or stopped): its addresses, then
    /// its ring word.
    pub fn set_ring(&self, rec: &RingRecord) {
        let mut b = [0u8; 24];
        for (i, a) in rec.addrs.iter().enumerate() {
            b[8 * i..8 * i + 8].copy_from_slice(&a.to_le_bytes());
        }
        self.ring_word().store(0, Ordering::Release);
        self.write(RING_ADDRS, &b);
        self.ring_word().store(rec.word(), Ordering::Release);
    }

    /// Stores a ring word (the data path: one store after each chain
    /// taken and each used element written).
    pub fn store_ring_word(&self, word: u64) {
        self.ring_word().store(word, Ordering::Release);
    }

    /// Forgets the ring position (the device was reset).
    pub fn forget_ring(&self) {
        self.ring_word().store(0, Ordering::Release);
    }

    fn bytes(&self, at: usize, n: usize) -> &[u8] {
        assert!(at + n <= self.len);
        // SAFETY: within the mapping (checked); racing writers only
        // change what a reader of a live slot would ignore.
        unsafe { std::slice::from_raw_parts(self.ptr.add(at), n) }
    }

    fn write(&self, at: usize, b: &[u8]) {
        assert!(at + b.len() <= self.len);
        // SAFETY: within the mapping (checked); one writer per slot.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.ptr.add(at), b.len()) };
    }

    fn ctl(&self, index: u16) -> &AtomicU64 {
        let at = HEADER + SLOT * usize::from(index);
        // SAFETY: slot offsets are 8-byte aligned within a page-aligned
        // mapping, and AtomicU64 has the layout of u64.
        unsafe { &*(self.ptr.add(at) as *const AtomicU64) }
    }

    /// Empties every slot (a fresh ring: nothing of before is in flight).
    pub fn clear(&self) {
        for i in 0..self.size {
            self.ctl(i).store(0, Ordering::Release);
        }
    }

    /// Records that the chain at `pos` (buffer id or head `id`, `slots`
    /// ring slots, first descriptor `desc`) was taken, with its 9P tag
    /// and type and the digest of its request ([`request_digest`]).
    #[allow(clippy::too_many_arguments)]
    pub fn popped(
        &self,
        pos: u32,
        id: u16,
        slots: u16,
        desc: [u8; 16],
        tag: u16,
        ty: u8,
        digest: u32,
    ) {
        let index = (pos % u32::from(self.size)) as u16;
        let at = HEADER + SLOT * usize::from(index);
        let mut b = [0u8; 48];
        b[4..6].copy_from_slice(&id.to_le_bytes());
        b[6..8].copy_from_slice(&slots.to_le_bytes());
        b[8..24].copy_from_slice(&desc);
        b[40..44].copy_from_slice(&digest.to_le_bytes());
        self.ctl(index).store(0, Ordering::Release);
        self.write(at + 8, &b);
        self.ctl(index)
            .store(control(POPPED, ty, tag, pos), Ordering::Release);
    }

    fn live(&self, pos: u32) -> Option<(u16, u64)> {
        let index = (pos % u32::from(self.size)) as u16;
        let c = self.ctl(index).load(Ordering::Acquire);
        ((c >> 32) as u32 == pos && c & 0x0f != 0).then_some((index, c))
    }

    /// Records the intent of a call that is not idempotent: the time
    /// before it and the qid path of what it will change (0 if none).
    pub fn intent(&self, pos: u32, time: u64, qid: u64) {
        let Some((index, c)) = self.live(pos) else {
            return;
        };
        let at = HEADER + SLOT * usize::from(index) + 32;
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&time.to_le_bytes());
        b[8..].copy_from_slice(&qid.to_le_bytes());
        self.write(at, &b);
        self.ctl(index)
            .store(c & !0xff | u64::from(INTENT), Ordering::Release);
    }

    /// Records the reply of the request at `pos` (if it fits).
    pub fn commit(&self, pos: u32, reply: &[u8]) {
        let Some((index, c)) = self.live(pos) else {
            return;
        };
        if reply.len() > MAX_REPLY {
            return;
        }
        let at = HEADER + SLOT * usize::from(index);
        self.write(at + 56, &(reply.len() as u16).to_le_bytes());
        self.write(at + 64, reply);
        self.ctl(index).store(
            c & !0xff | u64::from(COMMITTED) | HAS_REPLY,
            Ordering::Release,
        );
    }

    /// Records that the chain at `pos` went to the used ring at `used`.
    pub fn used(&self, pos: u32, used: u32) {
        let Some((index, c)) = self.live(pos) else {
            return;
        };
        let at = HEADER + SLOT * usize::from(index);
        self.write(at + 8, &used.to_le_bytes());
        self.ctl(index).store(
            c & !0xff | u64::from(USED) | (c & HAS_REPLY),
            Ordering::Release,
        );
    }

    /// Forgets the chain at `pos`.
    pub fn forget(&self, pos: u32) {
        if let Some((index, _)) = self.live(pos) {
            self.ctl(index).store(0, Ordering::Release);
        }
    }

    /// Slot `index` as it is, if not empty.
    pub fn read(&self, index: u16) -> Option<Slot> {
        let c = self.ctl(index).load(Ordering::Acquire);
        let state = (c & 0x0f) as u8;
        if state == EMPTY || state > USED {
            return None;
        }
        let at = HEADER + SLOT * usize::from(index);
        let b = self.bytes(at, SLOT);
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or_default());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
        let reply_len = usize::from(u16_at(56));
        let mut desc = [0u8; 16];
        desc.copy_from_slice(&b[16..32]);
        Some(Slot {
            state,
            ty: (c >> 8) as u8,
            tag: (c >> 16) as u16,
            pos: (c >> 32) as u32,
            used: u32_at(8),
            id: u16_at(12),
            slots: u16_at(14),
            desc,
            time: u64_at(32),
            qid: u64_at(40),
            digest: u32_at(48),
            reply: (c & HAS_REPLY != 0 && reply_len <= MAX_REPLY)
                .then(|| b[64..64 + reply_len].to_vec()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn dir() -> (tempfile::TempDir, std::fs::File) {
        let d = tempfile::tempdir().unwrap();
        let f = std::fs::File::open(d.path()).unwrap();
        (d, f)
    }

    #[test]
    fn test_slots_go_through_their_states_and_survive_the_process() {
        let (_d, f) = dir();
        let (t, old, _) = InflightTable::open(f.as_fd(), 8, false).unwrap();
        assert!(old.is_empty());
        t.popped(9, 3, 1, [7; 16], 42, 72, 0xfeed);
        t.popped(10, 4, 1, [0; 16], 43, 110, 0);
        t.intent(9, 1234, 99);
        t.commit(9, b"reply");
        t.used(10, 5);
        // A position not in the table (another lap) changes nothing.
        t.used(17, 6);
        t.commit(1, b"x");
        drop(t);
        // What a successor reads: the same file, the same ring.
        let (t, mut old, _) = InflightTable::open(f.as_fd(), 8, false).unwrap();
        old.sort_by_key(|s| s.pos);
        assert_eq!(old.len(), 2);
        assert_eq!(
            old[0],
            Slot {
                state: COMMITTED,
                ty: 72,
                tag: 42,
                pos: 9,
                used: 0,
                id: 3,
                slots: 1,
                desc: [7; 16],
                time: 1234,
                qid: 99,
                digest: 0xfeed,
                reply: Some(b"reply".to_vec()),
            }
        );
        assert_eq!(
            (old[1].state, old[1].used, old[1].reply.clone()),
            (USED, 5, None)
        );
        // Used after its reply was recorded: the reply stays readable.
        t.used(9, 8);
        let s = t.read(1).unwrap();
        assert_eq!(
            (s.state, s.used, s.reply),
            (USED, 8, Some(b"reply".to_vec()))
        );
        // A new chain at the same slot a lap later replaces it whole.
        t.popped(17, 2, 1, [0; 16], 1, 100, 0);
        let s = t.read(1).unwrap();
        assert_eq!((s.state, s.pos, s.reply, s.time), (POPPED, 17, None, 0));
        t.forget(17);
        assert!(t.read(1).is_none());
        t.clear();
        assert!((0..8).all(|i| t.read(i).is_none()));
    }

    #[test]
    fn test_a_table_of_another_ring_or_damaged_is_not_used() {
        let (d, f) = dir();
        let (t, _, _) = InflightTable::open(f.as_fd(), 8, false).unwrap();
        t.popped(0, 0, 1, [0; 16], 1, 100, 0);
        drop(t);
        // Another layout or size: nothing of it is served, and it is emptied.
        let (t, old, _) = InflightTable::open(f.as_fd(), 8, true).unwrap();
        assert!(old.is_empty());
        t.popped(0, 0, 1, [0; 16], 1, 100, 0);
        drop(t);
        let (_t, old, _) = InflightTable::open(f.as_fd(), 16, true).unwrap();
        assert!(old.is_empty());
        // A damaged header, or a file that is not a table.
        let path = d.path().join("session.inflight");
        let mut b = std::fs::read(&path).unwrap();
        b[3] ^= 1;
        std::fs::write(&path, &b).unwrap();
        let (_t, old, _) = InflightTable::open(f.as_fd(), 16, true).unwrap();
        assert!(old.is_empty());
        std::fs::write(&path, b"garbage").unwrap();
        let (_t, old, _) = InflightTable::open(f.as_fd(), 16, true).unwrap();
        assert!(old.is_empty());
        // A slot with an unknown state is ignored.
        let (t, _, _) = InflightTable::open(f.as_fd(), 16, true).unwrap();
        t.popped(3, 1, 1, [0; 16], 1, 100, 0);
        t.ctl(3).store(0x0f | 3 << 32, Ordering::Release);
        assert!(t.read(3).is_none());
    }

    #[test]
    fn test_the_packed_ring_position_survives_and_goes_with_the_ring() {
        let (_d, f) = dir();
        let (t, _, ring) = InflightTable::open(f.as_fd(), 8, true).unwrap();
        assert!(ring.is_none());
        let rec = RingRecord {
            avail: 0x8000 | 3,
            used: 0x8000 | 1,
            started: 0x8000,
            addrs: [0x1000, 0x2000, 0x3000],
        };
        t.set_ring(&rec);
        // The data path moves the positions on (avail 6 of the next lap).
        let moved = RingRecord { avail: 6, ..rec };
        t.store_ring_word(moved.word());
        t.popped(9, 3, 1, [0; 16], 42, 72, 0);
        // Emptying the slots (a stop with nothing in flight) keeps it.
        t.clear();
        drop(t);
        let (t, old, ring) = InflightTable::open(f.as_fd(), 8, true).unwrap();
        assert!(old.is_empty());
        assert_eq!(ring, Some(moved));
        // A reset forgets it.
        t.forget_ring();
        assert_eq!(t.ring_record(), None);
        t.set_ring(&rec);
        drop(t);
        // A table of another ring does not keep it.
        let (_t, _, ring) = InflightTable::open(f.as_fd(), 16, true).unwrap();
        assert_eq!(ring, None);
    }
}
