//! Per-client session state: the negotiated msize and the fid table.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::fs::Filesystem;
use crate::protocol::MIN_MSIZE;

use super::errno;

/// A cheap multiplicative hasher for fid numbers. A guest that picks
/// colliding fids only slows its own session's table, which
/// `Config::max_fids` bounds.
#[derive(Default)]
pub(crate) struct FidHasher(u64);

impl Hasher for FidHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64);
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing; fold the high half down so that both the low
        // (bucket) and the high (tag) bits of the result depend on `n`.
        let h = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = h ^ (h >> 32);
    }
}

type FidTable<F> = HashMap<u32, Arc<Fid<F>>, BuildHasherDefault<FidHasher>>;

/// What a fid refers to.
pub(crate) enum FidKind<F: Filesystem> {
    /// Walked, not opened.
    Path,
    /// Opened with Tlopen/Tlcreate.
    Open {
        /// The open file.
        file: F::File,
    },
    /// Created by Txattrwalk: the value (or name list) to read.
    XattrRead(Vec<u8>),
    /// Turned into an xattr writer by Txattrcreate; committed on Tclunk.
    XattrWrite(Mutex<XattrWrite>),
}

/// An xattr being written.
pub(crate) struct XattrWrite {
    pub name: Vec<u8>,
    pub size: usize,
    pub flags: u32,
    pub data: Vec<u8>,
}

/// One fid. Shared through an `Arc`, so a Tclunk while a Tread of the same
/// fid is in flight only removes the table entry; the file closes when the
/// last request drops its reference.
pub(crate) struct Fid<F: Filesystem> {
    pub inode: F::Inode,
    pub uid: u32,
    pub kind: FidKind<F>,
}

/// The state of one client connection (one virtio device or one socket).
///
/// `Session` is `Sync`: many requests of one session may run at once. The
/// fid table sits behind a mutex held only for lookups and updates, never
/// across filesystem calls.
pub struct Session<F: Filesystem> {
    msize: AtomicU32,
    fids: Mutex<FidTable<F>>,
}

impl<F: Filesystem> Default for Session<F> {
    fn default() -> Self {
        Session {
            msize: AtomicU32::new(0),
            fids: Mutex::new(FidTable::default()),
        }
    }
}

impl<F: Filesystem> std::fmt::Debug for Session<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("msize", &self.msize())
            .field("fids", &self.fid_count())
            .finish()
    }
}

impl<F: Filesystem> Session<F> {
    /// A fresh session; nothing is negotiated until Tversion.
    pub fn new() -> Self {
        Self::default()
    }

    /// The negotiated msize, or 0 before Tversion.
    pub fn msize(&self) -> u32 {
        self.msize.load(Ordering::Acquire)
    }

    /// The largest request a transport should accept now: the msize, or
    /// [`MIN_MSIZE`] before Tversion (a Tversion is tiny).
    pub fn frame_limit(&self) -> u32 {
        match self.msize() {
            0 => MIN_MSIZE,
            m => m,
        }
    }

    /// Fids in use.
    pub fn fid_count(&self) -> usize {
        self.table().len()
    }

    fn table(&self) -> MutexGuard<'_, FidTable<F>> {
        // A panic while holding the lock cannot leave the map inconsistent
        // (every update is a single insert/remove), so recover from poison.
        self.fids.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tversion: forget every fid and set the msize.
    pub(crate) fn reset(&self, msize: u32) {
        let old = std::mem::take(&mut *self.table());
        self.msize.store(msize, Ordering::Release);
        drop(old);
    }

    pub(crate) fn get(&self, fid: u32) -> Result<Arc<Fid<F>>, u32> {
        self.table().get(&fid).cloned().ok_or(errno::EBADF)
    }

    /// Adds a new fid; fails if it is in use or the table is full.
    pub(crate) fn insert_new(&self, fid: u32, entry: Fid<F>, max_fids: usize) -> Result<(), u32> {
        let mut t = self.table();
        if t.contains_key(&fid) {
            return Err(errno::EBADF);
        }
        if t.len() >= max_fids {
            return Err(errno::EMFILE);
        }
        t.insert(fid, Arc::new(entry));
        Ok(())
    }

    /// Replaces (or adds) a fid; `replaces` is the walk source when
    /// `newfid == fid`, so the table size does not grow.
    pub(crate) fn replace(&self, fid: u32, entry: Fid<F>) {
        self.table().insert(fid, Arc::new(entry));
    }

    /// Replaces `fid` only if it still refers to `expected` (guards
    /// concurrent Tlopen/Txattrcreate of one fid).
    pub(crate) fn replace_if(
        &self,
        fid: u32,
        expected: &Arc<Fid<F>>,
        entry: Fid<F>,
    ) -> Result<(), u32> {
        let mut t = self.table();
        match t.get(&fid) {
            Some(cur) if Arc::ptr_eq(cur, expected) => {
                t.insert(fid, Arc::new(entry));
                Ok(())
            }
            _ => Err(errno::EBADF),
        }
    }

    pub(crate) fn remove(&self, fid: u32) -> Result<Arc<Fid<F>>, u32> {
        self.table().remove(&fid).ok_or(errno::EBADF)
    }
}
