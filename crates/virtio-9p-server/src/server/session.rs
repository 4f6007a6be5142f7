// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Per-client session state: the negotiated msize and the fid table.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::fs::{Cred, Filesystem};
use crate::persist::session_format::MAX_LOCKS_PER_FID;
use crate::protocol::{LockType, OpenFlags, Tlock, MIN_MSIZE};

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

pub(crate) type FidTable<F> = HashMap<u32, Arc<Fid<F>>, BuildHasherDefault<FidHasher>>;

/// A session's journal.
type Log<F> = Arc<dyn FidLog<F>>;

/// Where a session's fid changes go as they happen: the crash-safe
/// journal of a device with a state directory
/// ([`Server::journal_session`](super::Server::journal_session)).
pub(crate) trait FidLog<F: Filesystem>: Send + Sync {
    /// The record that sets `fid` to `entry`. Built before the table lock
    /// is taken: it may make system calls.
    fn set_record(&self, fid: u32, entry: &Fid<F>) -> Vec<u8>;

    /// Appends `record`; called under the table lock, so records go in
    /// the order the table changed. `table` and `msize` are the session
    /// after the change, for a compaction.
    fn append(&self, record: &[u8], msize: u32, table: &FidTable<F>);

    /// Work an append deferred until the table lock is dropped (a
    /// snapshot's next few fids); called after every append.
    fn settle(&self) {}
}

/// What a fid refers to.
pub(crate) enum FidKind<F: Filesystem> {
    /// Walked, not opened.
    Path,
    /// Opened with Tlopen/Tlcreate.
    Open {
        /// The open file.
        file: F::File,
        /// The flags it was opened with (to open it again after a restart).
        flags: OpenFlags,
        /// The Tlocks granted on it, in order (replayed after a restart).
        locks: Mutex<LockLog>,
        /// Its count against `Config::max_open_fids`; held, never read.
        #[allow(dead_code)]
        charge: Charge,
    },
    /// Created by Txattrwalk: the value (or name list) to read, and its
    /// charge against the xattr byte limits.
    // The charge is held, never read: dropping it gives the bytes back.
    XattrRead(Vec<u8>, #[allow(dead_code)] Charge),
    /// Turned into an xattr writer by Txattrcreate; committed on Tclunk.
    XattrWrite(Mutex<XattrWrite>),
}

/// An xattr being written.
pub(crate) struct XattrWrite {
    pub name: Vec<u8>,
    pub size: usize,
    pub flags: u32,
    pub data: Vec<u8>,
    /// `size` bytes charged against the xattr byte limits (held, never
    /// read: dropping it gives them back).
    pub _charge: Charge,
}

/// The granted Tlocks of an open fid, in order: replaying them on a new
/// open file rebuilds the same byte-range locks. An unlock of the whole
/// file clears it; past [`MAX_LOCKS_PER_FID`] it stops recording and
/// marks itself incomplete.
#[derive(Debug, Default)]
pub(crate) struct LockLog {
    pub granted: Vec<Tlock>,
    pub incomplete: bool,
    /// The file description kept outside the process while it holds
    /// locks ([`LockKeeper`](super::keeper::LockKeeper)); dropping it
    /// unlocks and releases it.
    pub kept: Option<super::keeper::Kept>,
}

impl LockLog {
    /// Whether the fid may hold a lock: one recorded, or more than the
    /// log could record.
    pub fn holds_locks(&self) -> bool {
        !self.granted.is_empty() || self.incomplete
    }

    /// Records a granted (or unlocking) Tlock.
    pub fn record(&mut self, m: &Tlock) {
        if m.ty == LockType::Unlck && m.start == 0 && m.length == 0 {
            self.granted.clear();
            self.incomplete = false;
            return;
        }
        if self.granted.len() >= MAX_LOCKS_PER_FID {
            self.incomplete = true;
            return;
        }
        self.granted.push(m.clone());
    }
}

/// One waiting Tlock, counted in its session until dropped.
/// A counted waiting Tlock: in its session and in the whole server.
pub(crate) struct LockWait<'a> {
    session: &'a AtomicUsize,
    total: &'a AtomicUsize,
}

impl LockWait<'_> {
    /// Tlocks waiting in the whole server, this one included.
    pub fn server_wide(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }
}

impl Drop for LockWait<'_> {
    fn drop(&mut self) {
        self.session.fetch_sub(1, Ordering::AcqRel);
        self.total.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Tries to add `n` to `counter` without passing `max`.
pub(crate) fn try_add(counter: &AtomicUsize, n: usize, max: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
            cur.checked_add(n).filter(|&v| v <= max)
        })
        .is_ok()
}

/// Bytes held against a session's and the server's xattr limits; given
/// back when dropped (the fid is clunked, the session reset or closed).
#[derive(Debug)]
pub(crate) struct Charge {
    session: Arc<AtomicUsize>,
    total: Arc<AtomicUsize>,
    bytes: usize,
}

impl Charge {
    /// Shrinks the charge to `bytes` (after the real size is known).
    pub fn shrink_to(&mut self, bytes: usize) {
        if bytes < self.bytes {
            let give = self.bytes - bytes;
            self.session.fetch_sub(give, Ordering::AcqRel);
            self.total.fetch_sub(give, Ordering::AcqRel);
            self.bytes = bytes;
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.shrink_to(0);
    }
}

/// Server-wide usage shared by every session of one server: what
/// [`Limits`] bounds in total.
#[derive(Debug, Default)]
pub(crate) struct Usage {
    /// Fids held by all sessions.
    pub fids: Arc<AtomicUsize>,
    /// Bytes held by xattr fids of all sessions.
    pub xattr_bytes: Arc<AtomicUsize>,
    /// Open fids of all sessions.
    pub open_fids: Arc<AtomicUsize>,
    /// Blocking Tlocks waiting in all sessions.
    pub lock_waiters: AtomicUsize,
}

/// The limits a session checks, from the server's `Config`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits<'a> {
    pub usage: &'a Usage,
    pub max_fids: usize,
    pub max_total_fids: usize,
    pub max_xattr_bytes: usize,
    pub max_total_xattr_bytes: usize,
    pub max_open_fids: usize,
}

/// One fid. Shared through an `Arc`, so a Tclunk while a Tread of the same
/// fid is in flight only removes the table entry; the file closes when the
/// last request drops its reference.
pub(crate) struct Fid<F: Filesystem> {
    pub inode: F::Inode,
    pub uid: u32,
    pub kind: FidKind<F>,
}

impl<F: Filesystem> Fid<F> {
    /// Who creates through this fid: its user and the group a create
    /// message names.
    pub fn cred(&self, gid: u32) -> Cred {
        Cred { uid: self.uid, gid }
    }
}

/// The state of one client connection (one virtio device or one socket).
///
/// `Session` is `Sync`: many requests of one session may run at once. The
/// fid table sits behind a mutex held only for lookups and updates, never
/// across filesystem calls.
pub struct Session<F: Filesystem> {
    msize: AtomicU32,
    fids: Mutex<FidTable<F>>,
    /// The server-wide fid counter this session's fids are counted in
    /// (set by the first fid).
    total_fids: OnceLock<Arc<AtomicUsize>>,
    /// Bytes held by this session's xattr fids.
    xattr_bytes: Arc<AtomicUsize>,
    /// This session's open fids (each holds a host fd).
    open_fids: Arc<AtomicUsize>,
    /// Blocking Tlocks of this session waiting in the server.
    lock_waiters: AtomicUsize,
    /// The journal of fid changes, when the session is kept crash-safe.
    log: OnceLock<Log<F>>,
    /// Fids a Tremove claimed and has not released yet: no other Tremove
    /// or Tclunk releases them (one winner per fid). Taken only under the
    /// table lock.
    releasing: Mutex<Vec<u32>>,
    /// Fids of a restored session whose file is gone or changed on this
    /// host (a migration): each answers `ESTALE` until it is clunked or
    /// used again as a new fid.
    stale: Mutex<HashSet<u32>>,
}

impl<F: Filesystem> Default for Session<F> {
    fn default() -> Self {
        Session {
            msize: AtomicU32::new(0),
            fids: Mutex::new(FidTable::default()),
            total_fids: OnceLock::new(),
            xattr_bytes: Arc::new(AtomicUsize::new(0)),
            open_fids: Arc::new(AtomicUsize::new(0)),
            lock_waiters: AtomicUsize::new(0),
            log: OnceLock::new(),
            releasing: Mutex::new(Vec::new()),
            stale: Mutex::new(HashSet::new()),
        }
    }
}

impl<F: Filesystem> Drop for Session<F> {
    fn drop(&mut self) {
        let n = self.table().len();
        self.uncount(n);
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

    /// Blocking Tlocks of this session waiting in the server now.
    pub fn lock_waiters(&self) -> usize {
        self.lock_waiters.load(Ordering::Acquire)
    }

    /// Counts one more waiting Tlock unless `max` wait already; the guard
    /// uncounts it.
    pub(crate) fn start_lock_wait<'a>(
        &'a self,
        max: usize,
        usage: &'a Usage,
    ) -> Option<LockWait<'a>> {
        // `then`, not `then_some`: a guard built and dropped on failure
        // would uncount a waiter that was never counted.
        try_add(&self.lock_waiters, 1, max).then(|| {
            usage.lock_waiters.fetch_add(1, Ordering::AcqRel);
            LockWait {
                session: &self.lock_waiters,
                total: &usage.lock_waiters,
            }
        })
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

    /// Bytes held by this session's xattr fids.
    pub fn xattr_bytes(&self) -> usize {
        self.xattr_bytes.load(Ordering::Acquire)
    }

    /// Takes `n` fids off the server-wide count.
    fn uncount(&self, n: usize) {
        if let Some(total) = self.total_fids.get() {
            total.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Counts one more fid in this session (at most `max_fids`) and in the
    /// server (at most `max_total_fids`); the caller holds the table lock.
    fn count_new(&self, len: usize, l: &Limits<'_>) -> Result<(), u32> {
        if len >= l.max_fids {
            return Err(errno::EMFILE);
        }
        let total = self.total_fids.get_or_init(|| Arc::clone(&l.usage.fids));
        if !try_add(total, 1, l.max_total_fids) {
            return Err(errno::ENFILE);
        }
        Ok(())
    }

    /// Reserves `bytes` for an xattr fid: `ENOMEM` past the session's or
    /// the server's limit.
    pub(crate) fn charge_xattr(&self, bytes: usize, l: &Limits<'_>) -> Result<Charge, u32> {
        if !try_add(&self.xattr_bytes, bytes, l.max_xattr_bytes) {
            return Err(errno::ENOMEM);
        }
        if !try_add(&l.usage.xattr_bytes, bytes, l.max_total_xattr_bytes) {
            self.xattr_bytes.fetch_sub(bytes, Ordering::AcqRel);
            return Err(errno::ENOMEM);
        }
        Ok(Charge {
            session: Arc::clone(&self.xattr_bytes),
            total: Arc::clone(&l.usage.xattr_bytes),
            bytes,
        })
    }

    /// Counts one more open fid: `EMFILE` past `max_open_fids`, unless
    /// `force` (a fid restored after a restart was open before it).
    pub(crate) fn charge_open(&self, l: &Limits<'_>, force: bool) -> Result<Charge, u32> {
        let max = if force { usize::MAX } else { l.max_open_fids };
        if !try_add(&self.open_fids, 1, max) {
            return Err(errno::EMFILE);
        }
        l.usage.open_fids.fetch_add(1, Ordering::AcqRel);
        Ok(Charge {
            session: Arc::clone(&self.open_fids),
            total: Arc::clone(&l.usage.open_fids),
            bytes: 1,
        })
    }

    fn table(&self) -> MutexGuard<'_, FidTable<F>> {
        // A panic while holding the lock cannot leave the map inconsistent
        // (every update is a single insert/remove), so recover from poison.
        self.fids.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether fid changes are journaled ([`Session::set_log`]).
    pub(crate) fn is_journaled(&self) -> bool {
        self.log.get().is_some()
    }

    /// Sends every later fid change of this session to `log` (once).
    pub(crate) fn set_log(&self, log: Log<F>) -> bool {
        self.log.set(log).is_ok()
    }

    /// Runs `f` on the fid table and msize under the table lock (no fid
    /// changes meanwhile).
    pub(crate) fn with_table<T>(&self, f: impl FnOnce(&FidTable<F>, u32) -> T) -> T {
        let t = self.table();
        f(&t, self.msize())
    }

    /// Saves what the journal's appends deferred; the table lock is free.
    fn settle(&self) {
        if let Some(log) = self.log.get() {
            log.settle();
        }
    }

    /// The journal record setting `fid` to `entry`, if journaled.
    fn set_record(&self, fid: u32, entry: &Fid<F>) -> Option<(&Log<F>, Vec<u8>)> {
        let log = self.log.get()?;
        Some((log, log.set_record(fid, entry)))
    }

    /// Tversion: forget every fid and set the msize.
    pub(crate) fn reset(&self, msize: u32) {
        let mut t = self.table();
        let old = std::mem::take(&mut *t);
        // A Tremove still running releases nothing of the new session.
        self.claims().clear();
        self.uncount(old.len());
        self.msize.store(msize, Ordering::Release);
        if let Some(log) = self.log.get() {
            log.append(
                &crate::persist::snapshot_journal::reset_record(msize),
                msize,
                &t,
            );
        }
        drop(t);
        self.settle();
        drop(old);
    }

    /// Journals `fid` again after a change inside its entry (a lock
    /// granted, xattr data written). No-op unless journaled.
    pub(crate) fn touch(&self, fid: u32) {
        if self.log.get().is_none() {
            return;
        }
        let Ok(cur) = self.get(fid) else {
            return;
        };
        let Some((log, rec)) = self.set_record(fid, &cur) else {
            return;
        };
        let t = self.table();
        if t.get(&fid).is_some_and(|f| Arc::ptr_eq(f, &cur)) {
            log.append(&rec, self.msize(), &t);
            drop(t);
            log.settle();
        }
    }

    /// Every fid and its entry, sorted by fid (a snapshot).
    pub(crate) fn entries(&self) -> Vec<(u32, Arc<Fid<F>>)> {
        let mut v: Vec<_> = self
            .table()
            .iter()
            .map(|(k, f)| (*k, Arc::clone(f)))
            .collect();
        v.sort_unstable_by_key(|(k, _)| *k);
        v
    }

    /// Sets the msize of a session being restored.
    pub(crate) fn set_msize(&self, msize: u32) {
        self.msize.store(msize, Ordering::Release);
    }

    pub(crate) fn get(&self, fid: u32) -> Result<Arc<Fid<F>>, u32> {
        let got = self.table().get(&fid).cloned();
        got.ok_or_else(|| self.missing(fid))
    }

    fn stale_fids(&self) -> MutexGuard<'_, HashSet<u32>> {
        // Single inserts and removes: recover from poison.
        self.stale.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The error for a fid not in the table: `ESTALE` if a restore marked
    /// it ([`Session::mark_stale`]), else `EBADF`.
    fn missing(&self, fid: u32) -> u32 {
        if self.stale_fids().contains(&fid) {
            errno::ESTALE
        } else {
            errno::EBADF
        }
    }

    /// A restored fid whose file is gone or changed: it answers `ESTALE`
    /// (not `EBADF`) until a Tclunk releases it or a walk reuses it.
    pub(crate) fn mark_stale(&self, fid: u32) {
        self.stale_fids().insert(fid);
    }

    /// Adds a new fid; fails if it is in use (`EBADF`), the session's
    /// table is full (`EMFILE`) or the server's is (`ENFILE`).
    pub(crate) fn insert_new(&self, fid: u32, entry: Fid<F>, l: &Limits<'_>) -> Result<(), u32> {
        let rec = self.set_record(fid, &entry);
        let mut t = self.table();
        if t.contains_key(&fid) {
            return Err(errno::EBADF);
        }
        self.count_new(t.len(), l)?;
        self.stale_fids().remove(&fid);
        t.insert(fid, Arc::new(entry));
        if let Some((log, rec)) = rec {
            log.append(&rec, self.msize(), &t);
            drop(t);
            log.settle();
        }
        Ok(())
    }

    /// Replaces (or adds, within the limits) a fid; used when the walk
    /// source is the target (`newfid == fid`).
    pub(crate) fn replace(&self, fid: u32, entry: Fid<F>, l: &Limits<'_>) -> Result<(), u32> {
        let rec = self.set_record(fid, &entry);
        let mut t = self.table();
        if !t.contains_key(&fid) {
            self.count_new(t.len(), l)?;
        }
        self.stale_fids().remove(&fid);
        t.insert(fid, Arc::new(entry));
        if let Some((log, rec)) = rec {
            log.append(&rec, self.msize(), &t);
            drop(t);
            log.settle();
        }
        Ok(())
    }

    /// Replaces `fid` only if it still refers to `expected` (guards
    /// concurrent Tlopen/Txattrcreate of one fid).
    pub(crate) fn replace_if(
        &self,
        fid: u32,
        expected: &Arc<Fid<F>>,
        entry: Fid<F>,
    ) -> Result<(), u32> {
        let rec = self.set_record(fid, &entry);
        let mut t = self.table();
        match t.get(&fid) {
            Some(cur) if Arc::ptr_eq(cur, expected) => {
                t.insert(fid, Arc::new(entry));
                if let Some((log, rec)) = rec {
                    log.append(&rec, self.msize(), &t);
                    drop(t);
                    log.settle();
                }
                Ok(())
            }
            _ => Err(errno::EBADF),
        }
    }

    fn claims(&self) -> MutexGuard<'_, Vec<u32>> {
        // Every update is a single push/remove: recover from poison.
        self.releasing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tclunk: removes `fid` from the table, unless a Tremove claimed it
    /// ([`Session::claim_removal`]): then `EBADF`, the Tremove releases it.
    pub(crate) fn remove(&self, fid: u32) -> Result<Arc<Fid<F>>, u32> {
        let t = self.table();
        if self.claims().contains(&fid) {
            return Err(errno::EBADF);
        }
        if !t.contains_key(&fid) && self.stale_fids().remove(&fid) {
            // Released: the guest learns its file is gone.
            return Err(errno::ESTALE);
        }
        self.remove_locked(t, fid)
    }

    /// Tremove, before its filesystem call: claims `fid`, so that a
    /// Tclunk or another Tremove of it sent meanwhile fails with `EBADF`
    /// (exactly one request releases a fid). Returns its entry;
    /// [`Session::release_claimed`] removes it afterwards.
    pub(crate) fn claim_removal(&self, fid: u32) -> Result<Arc<Fid<F>>, u32> {
        let t = self.table();
        let entry = t.get(&fid).cloned().ok_or(errno::EBADF)?;
        let mut claims = self.claims();
        if claims.contains(&fid) {
            return Err(errno::EBADF);
        }
        claims.push(fid);
        Ok(entry)
    }

    /// Ends a Tremove's claim on `fid` and removes it from the table
    /// (unless a Tversion forgot every fid meanwhile).
    pub(crate) fn release_claimed(&self, fid: u32) {
        let t = self.table();
        let mut claims = self.claims();
        let Some(i) = claims.iter().position(|&f| f == fid) else {
            return;
        };
        claims.swap_remove(i);
        drop(claims);
        let _ = self.remove_locked(t, fid);
    }

    fn remove_locked(
        &self,
        mut t: MutexGuard<'_, FidTable<F>>,
        fid: u32,
    ) -> Result<Arc<Fid<F>>, u32> {
        let out = t.remove(&fid).ok_or(errno::EBADF)?;
        if let Some(log) = self.log.get() {
            log.append(
                &crate::persist::snapshot_journal::remove_record(fid),
                self.msize(),
                &t,
            );
        }
        drop(t);
        self.settle();
        self.uncount(1);
        Ok(out)
    }
}
