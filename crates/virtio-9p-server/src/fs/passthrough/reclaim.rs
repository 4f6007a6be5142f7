// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A bounded number of `O_PATH` fds for walked files.
//!
//! A guest that caches dentries (v9fs `cache=loose`) keeps a fid for every
//! file it has seen, tens of thousands of them. Holding an `O_PATH` fd per
//! walked inode would run the process out of descriptors, so past
//! [`PassthroughConfig::max_path_fds`](super::PassthroughConfig::max_path_fds)
//! idle ones not used since the last pass are closed, then, if that is not
//! enough, any idle ones (a second-chance clock; QEMU's 9p reclaims the fds of
//! idle fids the same way). A closed inode is reopened on its next use:
//!
//! - by its name in its parent (the parent reopened first if it was closed
//!   too), with the walk's own checks: one validated name, no symlink
//!   followed, nothing outside the export;
//! - and only if the file found there is the same `(dev, ino)`; otherwise
//!   (renamed or replaced on the host meanwhile) a non-directory is tried
//!   by the file handle taken when its fd was closed, which needs
//!   `CAP_DAC_READ_SEARCH`; else the fid answers `ESTALE`.
//!
//! An unlinked file can only be found by its handle, and only while an
//! open fid keeps it alive: it is closed only where handles work (a fid
//! that is not open then answers `ESTALE`). A removed directory is closed
//! too; its fid answers `ESTALE`. Never closed: the export root, an fd
//! some call is using right now, and inodes with no known parent (those
//! reached by `..`, or restored by handle).
//!
//! Metadata queries (`fstat`, `statx`: Tgetattr) take no lock at all:
//! they read the raw fd and a per-slot sequence number, make the call, and
//! keep the answer only if the sequence did not move meanwhile (a
//! seqlock). A pass bumps the sequence to odd before it closes the fd and
//! to even after, so a query that raced a close, whose fd number may even
//! have been reused for another file, is thrown away and made again under
//! the slot's shared lock. Such a query only reads metadata, so running it
//! on a stale fd has no effect; calls that act on the file hold the lock.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, AtomicI32, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError, Weak};

use super::saved_inode::{file_handle, open_handle};
use super::{err, sys, Inode, InodeData, PassthroughFs};

/// What a reclaim pass closes down to: half the limit, so passes are rare.
const LOW_WATER_DIVISOR: usize = 2;

/// An `O_PATH` fd counted in the cache's open fds.
#[derive(Debug)]
pub(super) struct CountedFd {
    fd: OwnedFd,
    open: Arc<AtomicUsize>,
}

impl Drop for CountedFd {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl AsFd for CountedFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The open `O_PATH` fd of an inode, held for one call: a shared lock on
/// the inode's slot, so no reclaim pass closes it meanwhile (passes only
/// ever `try_write`, so holders never wait for one).
#[derive(Debug)]
pub(super) struct PathFd<'a> {
    _slot: RwLockReadGuard<'a, Option<CountedFd>>,
    raw: RawFd,
}

impl AsFd for PathFd<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `raw` is the fd in the slot `_slot` locks; the fd cannot
        // be taken out or closed while the guard lives.
        unsafe { BorrowedFd::borrow_raw(self.raw) }
    }
}

/// The fd slot of one inode.
#[derive(Debug)]
pub(super) struct FdSlot {
    /// Shared-locked by every call that uses the fd; a pass takes it out
    /// only when `try_write` succeeds, that is when no call holds it.
    fd: RwLock<Option<CountedFd>>,
    /// The raw fd held in `fd`, or -1: read without the lock by
    /// [`PassthroughFs::fstat_of`] and [`PassthroughFs::statx_of`].
    raw: AtomicI32,
    /// Even while `raw` is stable; odd while a pass closes the fd. A
    /// lock-free query keeps its answer only if it saw the same even value
    /// before and after.
    seq: AtomicU32,
    /// Used since the last pass (those are closed last). A flag, not a
    /// global clock: no counter all threads write on every call.
    used: AtomicBool,
    /// The file handle taken when the fd was closed.
    handle: Mutex<Option<(i32, Vec<u8>)>>,
}

impl FdSlot {
    pub(super) fn new(fd: CountedFd) -> Self {
        FdSlot {
            raw: AtomicI32::new(fd.as_fd().as_raw_fd()),
            seq: AtomicU32::new(0),
            fd: RwLock::new(Some(fd)),
            used: AtomicBool::new(true),
            handle: Mutex::new(None),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Option<CountedFd>> {
        self.fd.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot, if no call holds its fd right now.
    fn try_write(&self) -> Option<RwLockWriteGuard<'_, Option<CountedFd>>> {
        match self.fd.try_write() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Whether the inode has an open fd now.
    pub(super) fn is_open(&self) -> bool {
        self.read().is_some()
    }

    /// Marks the slot used since the last pass (a store only when the flag
    /// was clear, so a busy inode's cache line stays shared).
    fn mark_used(&self) {
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
    }

    /// Runs the read-only `query` on the fd without taking the lock:
    /// `None` when the fd is closed, being closed, or was closed while the
    /// query ran (its answer may then be about another file).
    fn query_unlocked<T>(&self, query: impl Fn(RawFd) -> io::Result<T>) -> Option<io::Result<T>> {
        let seq = self.seq.load(Ordering::Acquire);
        let raw = self.raw.load(Ordering::Acquire);
        if !seq.is_multiple_of(2) || raw < 0 {
            return None;
        }
        let answer = query(raw);
        // Orders the query (and the kernel's fd table lookup it made)
        // before the second read of the sequence: a close that the query
        // could have seen was preceded by the odd store, which is then
        // visible here.
        fence(Ordering::Acquire);
        (self.seq.load(Ordering::Relaxed) == seq).then_some(answer)
    }

    /// Takes the fd out of the write-locked slot `slot` and closes it,
    /// with the sequence odd meanwhile (see [`Self::query_unlocked`]).
    fn close_locked(&self, slot: &mut Option<CountedFd>) {
        self.seq.fetch_add(1, Ordering::Relaxed);
        // The odd sequence is stored before `raw` is cleared and before
        // the close below (a system call after it in program order).
        fence(Ordering::Release);
        self.raw.store(-1, Ordering::Relaxed);
        *slot = None;
        self.seq.fetch_add(1, Ordering::Release);
    }
}

/// Every inode's fd slot, and how many `O_PATH` fds are open.
#[derive(Debug)]
pub(super) struct FdCache {
    /// Most `O_PATH` fds open before a pass closes idle ones.
    limit: usize,
    open: Arc<AtomicUsize>,
    /// The open count at which `register` runs the next pass: the limit,
    /// or more after a pass that found too few idle fds (so a tree of
    /// busy fds does not cost a pass per walk).
    next_pass: AtomicUsize,
    inodes: Mutex<Registry>,
    /// This process can open the export's files by handle (checked when
    /// the filesystem is built): only then are unlinked files closed.
    handles_work: bool,
}

/// The inodes a pass may close; dead entries are dropped by each pass and
/// whenever the list has doubled since it was last compacted.
#[derive(Debug, Default)]
struct Registry {
    inodes: Vec<Weak<InodeData>>,
    compact_at: usize,
}

/// The registry is compacted no more often than every this many entries.
const MIN_COMPACT: usize = 1024;

impl FdCache {
    pub(super) fn new(limit: usize, handles_work: bool) -> Self {
        let limit = limit.max(1);
        FdCache {
            handles_work,
            limit,
            open: Arc::new(AtomicUsize::new(0)),
            next_pass: AtomicUsize::new(limit),
            inodes: Mutex::new(Registry {
                inodes: Vec::new(),
                compact_at: MIN_COMPACT,
            }),
        }
    }

    /// Counts `fd` as one of the cache's open fds.
    pub(super) fn adopt(&self, fd: OwnedFd) -> CountedFd {
        self.open.fetch_add(1, Ordering::Relaxed);
        CountedFd {
            fd,
            open: Arc::clone(&self.open),
        }
    }

    /// `O_PATH` fds open now (held by inodes or by calls).
    pub(super) fn open_fds(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Lists a new inode whose fd the cache may close; runs a pass when
    /// the fds are over the limit.
    pub(super) fn register(&self, inode: &Inode) {
        {
            let mut r = self.inodes.lock().unwrap_or_else(|e| e.into_inner());
            r.inodes.push(Arc::downgrade(&inode.0));
            if r.inodes.len() >= r.compact_at {
                r.inodes.retain(|w| w.strong_count() > 0);
                r.compact_at = (r.inodes.len() * 2).max(MIN_COMPACT);
            }
        }
        self.pass_if_over();
    }

    /// Runs a pass when the fds are over the limit (or over what the last
    /// pass could not close, plus half the limit).
    fn pass_if_over(&self) {
        if self.open_fds() > self.next_pass.load(Ordering::Relaxed) {
            self.reclaim(self.limit / LOW_WATER_DIVISOR);
            let after = self.open_fds();
            let next = if after > self.limit / LOW_WATER_DIVISOR {
                after + self.limit / LOW_WATER_DIVISOR
            } else {
                self.limit
            };
            self.next_pass
                .store(next.max(self.limit), Ordering::Relaxed);
        }
    }

    /// Closes idle fds until at most `target` are open or no more can be
    /// closed: first those not used since the last pass, then the rest.
    /// Clears every use flag. Returns how many it closed. One pass at a
    /// time; a caller that finds one running returns at once.
    pub(super) fn reclaim(&self, target: usize) -> usize {
        let Ok(mut r) = self.inodes.try_lock() else {
            return 0;
        };
        r.inodes.retain(|w| w.strong_count() > 0);
        r.compact_at = (r.inodes.len() * 2).max(MIN_COMPACT);
        let (mut cold, mut warm) = (Vec::new(), Vec::new());
        for d in r.inodes.iter().filter_map(Weak::upgrade) {
            if is_idle(&d) {
                if d.slot.used.swap(false, Ordering::Relaxed) {
                    warm.push(d);
                } else {
                    cold.push(d);
                }
            }
        }
        drop(r);
        let mut closed = 0;
        for d in cold.iter().chain(&warm) {
            if self.open_fds() <= target {
                break;
            }
            if close_if_idle(d, self.handles_work) {
                closed += 1;
            }
        }
        closed
    }
}

/// True when the inode's fd is open and it has a parent and name to be
/// found by (whether a call holds the fd, the close finds out).
fn is_idle(d: &InodeData) -> bool {
    let has_parent = d.link.lock().unwrap_or_else(|e| e.into_inner()).is_some();
    has_parent && d.slot.is_open()
}

/// Whether the export root can be found by its own file handle: the
/// filesystem has handles and the process `CAP_DAC_READ_SEARCH`.
pub(super) fn handles_work(root: BorrowedFd<'_>) -> bool {
    file_handle(root).is_some_and(|(ty, h)| open_handle(root, ty, &h).is_ok())
}

fn close_if_idle(d: &InodeData, handles_work: bool) -> bool {
    // Held by a call: not idle.
    let Some(mut slot) = d.slot.try_write() else {
        return false;
    };
    let Some(fd) = slot.as_ref() else {
        return false;
    };
    if d.host_type != libc::S_IFDIR {
        let Ok(st) = sys::fstat(fd.as_fd()) else {
            return false;
        };
        // A handle is of use only where handles open: not taken elsewhere.
        let handle = handles_work.then(|| file_handle(fd.as_fd())).flatten();
        // An unlinked file is found only by its handle, and only while
        // an open fid keeps it alive. Without one it stays open.
        if st.st_nlink == 0 && handle.is_none() {
            return false;
        }
        *d.slot.handle.lock().unwrap_or_else(|e| e.into_inner()) = handle;
    }
    // A removed directory is closed too: nothing can be created in it,
    // and a fid on it answers ESTALE from then on.
    d.slot.close_locked(&mut slot);
    true
}

impl PassthroughFs {
    /// The open `O_PATH` fd of `inode`, reopened if a reclaim pass closed
    /// it. Hold it for as long as the call uses the fd (or a
    /// `/proc/self/fd` path naming it).
    pub(super) fn fd<'a>(&self, inode: &'a Inode) -> io::Result<PathFd<'a>> {
        let slot = &inode.0.slot;
        slot.mark_used();
        let mut reopened = None;
        let mut installed = false;
        loop {
            let guard = slot.read();
            if let Some(fd) = guard.as_ref() {
                let raw = fd.as_fd().as_raw_fd();
                let held = PathFd { _slot: guard, raw };
                if installed {
                    // Ours is held, so the pass leaves it open.
                    self.fds.pass_if_over();
                }
                return Ok(held);
            }
            drop(guard);
            if reopened.is_none() {
                reopened = Some(self.adopt_retrying(|| self.reopen(inode))?);
            }
            // A call that reopened it meanwhile holds it: then read again.
            if let Some(mut w) = slot.try_write() {
                if w.is_none() {
                    *w = reopened.take();
                    if let Some(fd) = w.as_ref() {
                        slot.raw.store(fd.as_fd().as_raw_fd(), Ordering::Release);
                    }
                    installed = true;
                }
            }
        }
    }

    /// `fstat` of `inode`'s fd, without a lock while the fd stays open
    /// (see the module docs), else through [`Self::fd`].
    pub(super) fn fstat_of(&self, inode: &Inode) -> io::Result<libc::stat64> {
        self.query(inode, sys::fstat_raw)
    }

    /// `statx` (basic stats and birth time) of `inode`'s fd, as
    /// [`Self::fstat_of`].
    pub(super) fn statx_of(&self, inode: &Inode) -> io::Result<libc::statx> {
        self.query(inode, sys::statx_raw)
    }

    /// Runs the read-only `query` on `inode`'s fd: lock-free when no pass
    /// closes the fd meanwhile, else again under the slot's shared lock.
    fn query<T>(&self, inode: &Inode, query: impl Fn(RawFd) -> io::Result<T>) -> io::Result<T> {
        let slot = &inode.0.slot;
        slot.mark_used();
        if let Some(answer) = slot.query_unlocked(&query) {
            return answer;
        }
        let fd = self.fd(inode)?;
        query(fd.as_fd().as_raw_fd())
    }

    /// Opens an `O_PATH` fd with `open` ([`Self::retry_out_of_fds`]) and
    /// counts it in the cache.
    pub(super) fn adopt_retrying(
        &self,
        open: impl Fn() -> io::Result<OwnedFd>,
    ) -> io::Result<CountedFd> {
        Ok(self.fds.adopt(self.retry_out_of_fds(open)?))
    }

    /// Runs `open`, and once more after closing idle `O_PATH` fds if the
    /// process is out of fds (`EMFILE`, `ENFILE`: nothing was opened).
    pub(super) fn retry_out_of_fds<T>(&self, open: impl Fn() -> io::Result<T>) -> io::Result<T> {
        match open() {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                if self.fds.reclaim(self.fds.open_fds() / LOW_WATER_DIVISOR) == 0 {
                    return Err(e);
                }
                open()
            }
            r => r,
        }
    }

    /// Finds a closed inode again: by name in its parent, else by handle.
    fn reopen(&self, inode: &Inode) -> io::Result<OwnedFd> {
        let d = &inode.0;
        let same = |fd: &OwnedFd| {
            sys::fstat(fd.as_fd()).is_ok_and(|st| st.st_dev == d.dev && st.st_ino == d.ino)
        };
        // A parent that is gone too leaves the handle.
        if let Some((parent, name)) = inode.link() {
            if let (Ok(pfd), Ok(c)) = (self.fd(&parent), sys::cstr(&name)) {
                let found =
                    sys::open_beneath(pfd.as_fd(), &c, libc::O_PATH, 0, self.cfg.use_openat2);
                if let Some(fd) = found.ok().filter(same) {
                    return Ok(fd);
                }
            }
        }
        let handle = d
            .slot
            .handle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some((ty, h)) = handle.filter(|_| d.host_type != libc::S_IFDIR) {
            let root = self.fd(&self.root)?;
            if let Ok(fd) = open_handle(root.as_fd(), ty, &h) {
                if same(&fd) {
                    return Ok(fd);
                }
            }
        }
        Err(err(libc::ESTALE))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Inode, PassthroughConfig, PassthroughFs};
    use crate::fs::{Cred, Filesystem};
    use crate::protocol::{GetattrMask, OpenFlags};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;

    const ROOT: Cred = Cred { uid: 0, gid: 0 };

    /// A tree `d0/f0..` of `dirs` directories with `files` files each
    /// (file `dD/fF` holds "D/F"), served with at most `limit` walked
    /// files' fds, and its root.
    fn export(
        dirs: usize,
        files: usize,
        limit: usize,
    ) -> (tempfile::TempDir, PassthroughFs, Inode) {
        let t = tempfile::tempdir().unwrap();
        for d in 0..dirs {
            let dir = t.path().join(format!("d{d}"));
            std::fs::create_dir(&dir).unwrap();
            for f in 0..files {
                std::fs::write(dir.join(format!("f{f}")), format!("{d}/{f}")).unwrap();
            }
        }
        let mut cfg = PassthroughConfig::new(t.path());
        cfg.max_path_fds = limit;
        let fs = PassthroughFs::new(cfg).unwrap();
        let (root, _) = fs.attach(b"", ROOT).unwrap();
        (t, fs, root)
    }

    /// The first bytes of `inode`, opened read-only.
    fn contents(fs: &PassthroughFs, inode: &Inode) -> Vec<u8> {
        let (opened, _) = fs.open(inode, OpenFlags::RDONLY).unwrap();
        let mut buf = vec![0u8; 16];
        // SAFETY: a valid fd and buffer.
        let n = unsafe { libc::pread(opened.fd().as_raw_fd(), buf.as_mut_ptr().cast(), 16, 0) };
        buf.truncate(usize::try_from(n).unwrap());
        buf
    }

    #[test]
    fn test_walked_files_past_the_limit_stay_usable() {
        let (_t, fs, root) = export(8, 40, 32);
        let mut held = Vec::new();
        for d in 0..8 {
            let (dir, _) = fs.walk(&root, format!("d{d}").as_bytes()).unwrap();
            for f in 0..40 {
                let (file, qid) = fs.walk(&dir, format!("f{f}").as_bytes()).unwrap();
                held.push((d, f, file, qid));
            }
        }
        // 328 inodes, at most the limit (and a pass's slack) of fds.
        assert!(
            fs.fds.open_fds() <= 32 + 1,
            "{} fds open",
            fs.fds.open_fds()
        );
        for (d, f, file, qid) in &held {
            let a = fs.getattr(file, GetattrMask::BASIC).unwrap();
            assert_eq!(a.qid.path, qid.path);
            assert_eq!(contents(&fs, file), format!("{d}/{f}").as_bytes());
        }
        assert!(
            fs.fds.open_fds() <= 32 + 1,
            "{} fds open",
            fs.fds.open_fds()
        );
    }

    #[test]
    fn test_a_closed_fid_replaced_on_the_host_answers_estale() {
        let (t, fs, root) = export(1, 1, 1);
        let (dir, _) = fs.walk(&root, b"d0").unwrap();
        let (file, _) = fs.walk(&dir, b"f0").unwrap();
        // Push both out of the cache.
        let (_other, _) = fs.walk(&root, b"d0").unwrap();
        fs.fds.reclaim(0);
        assert!(fs.fds.open_fds() <= 2, "{}", fs.fds.open_fds());
        // The directory is replaced by a symlink to outside the export,
        // the file by another file: neither may be reopened.
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("f0"), "secret").unwrap();
        std::fs::rename(t.path().join("d0"), t.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(outside.path(), t.path().join("d0")).unwrap();
        let e = fs.getattr(&dir, GetattrMask::BASIC).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESTALE));
        // The file's own handle still finds it (with CAP_DAC_READ_SEARCH)
        // or it is stale; never the file outside.
        match fs.getattr(&file, GetattrMask::BASIC) {
            Ok(a) => {
                let moved = std::fs::metadata(t.path().join("moved/f0")).unwrap();
                assert_eq!(a.size, moved.len());
                assert_eq!(a.nlink, moved.nlink());
                assert_eq!(contents(&fs, &file), b"0/0");
            }
            Err(e) => {
                assert!(!fs.fds.handles_work, "found by its handle");
                assert_eq!(e.raw_os_error(), Some(libc::ESTALE));
            }
        }
    }

    #[test]
    fn test_busy_fds_stay_open() {
        let (_t, fs, root) = export(1, 1, 64);
        let (dir, _) = fs.walk(&root, b"d0").unwrap();
        let (busy, _) = fs.walk(&dir, b"f0").unwrap();
        let held = fs.fd(&busy).unwrap();
        fs.fds.reclaim(0);
        assert!(busy.0.slot.is_open());
        assert!(!dir.0.slot.is_open());
        drop(held);
        fs.fds.reclaim(0);
        assert!(!busy.0.slot.is_open());
        assert_eq!(fs.getattr(&busy, GetattrMask::BASIC).unwrap().size, 3);
    }

    #[test]
    fn test_unlinked_files_are_found_by_handle_while_open() {
        let (t, fs, root) = export(1, 2, 64);
        let (dir, _) = fs.walk(&root, b"d0").unwrap();
        let (walked, _) = fs.walk(&dir, b"f0").unwrap();
        let (opened, _) = fs.walk(&dir, b"f1").unwrap();
        let (file, _) = fs.open(&opened, OpenFlags::RDONLY).unwrap();
        std::fs::remove_file(t.path().join("d0/f0")).unwrap();
        std::fs::remove_file(t.path().join("d0/f1")).unwrap();
        // A new file under the old name must not be taken for it.
        std::fs::write(t.path().join("d0/f1"), "impostor").unwrap();
        fs.fds.reclaim(0);
        if fs.fds.handles_work {
            assert!(!walked.0.slot.is_open());
            assert!(!opened.0.slot.is_open());
            // Nothing keeps the walked one alive: gone for good.
            let e = fs.getattr(&walked, GetattrMask::BASIC).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ESTALE));
            // The open one is still there, by its handle.
            let a = fs.getattr(&opened, GetattrMask::BASIC).unwrap();
            assert_eq!((a.nlink, a.size), (0, 3));
        } else {
            // Without handles, unlinked files keep their fds.
            assert!(walked.0.slot.is_open());
            assert_eq!(fs.getattr(&opened, GetattrMask::BASIC).unwrap().nlink, 0);
        }
        drop(file);
    }

    #[test]
    fn test_lock_free_getattr_racing_passes_never_sees_another_file() {
        let (_t, fs, root) = export(1, 8, 4);
        let (dir, _) = fs.walk(&root, b"d0").unwrap();
        let files: Vec<_> = (0..8)
            .map(|f| fs.walk(&dir, format!("f{f}").as_bytes()).unwrap())
            .collect();
        let (target, qid) = &files[0];
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                // Close every idle fd, then reopen the others, so the fd
                // numbers are freed and taken again by other files.
                for _ in 0..2000 {
                    fs.fds.reclaim(0);
                    for (other, _) in &files[1..] {
                        fs.getattr(other, GetattrMask::ALL).unwrap();
                        drop(fs.fd(other).unwrap());
                    }
                }
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let a = fs.getattr(target, GetattrMask::BASIC).unwrap();
                assert_eq!(a.qid.path, qid.path, "after {n} calls");
                let b = fs.getattr(target, GetattrMask::ALL).unwrap();
                assert_eq!(b.qid.path, qid.path, "after {n} calls");
                n += 1;
            }
            assert!(n > 0);
        });
        // Passes did close it in between: the lock-free path had to notice.
        fs.fds.reclaim(0);
        assert!(!target.0.slot.is_open());
        assert_eq!(
            fs.getattr(target, GetattrMask::BASIC).unwrap().qid.path,
            qid.path
        );
    }

    #[test]
    fn test_a_query_that_raced_a_close_is_made_again_under_the_lock() {
        let (t, fs, root) = export(1, 2, 64);
        let (dir, _) = fs.walk(&root, b"d0").unwrap();
        let (target, _) = fs.walk(&dir, b"f0").unwrap();
        let want = std::fs::metadata(t.path().join("d0/f0")).unwrap().ino();
        let calls = std::cell::Cell::new(0);
        let reused = std::cell::RefCell::new(None);
        let st = fs
            .query(&target, |raw| {
                calls.set(calls.get() + 1);
                if calls.get() == 1 {
                    // A pass closes the fd under the query, and another
                    // file takes its number (the lowest free one).
                    assert!(super::close_if_idle(&target.0, fs.fds.handles_work));
                    let other = std::fs::File::open(t.path().join("d0/f1")).unwrap();
                    assert_eq!(other.as_raw_fd(), raw);
                    *reused.borrow_mut() = Some(other);
                }
                super::sys::fstat_raw(raw)
            })
            .unwrap();
        assert_eq!(calls.get(), 2, "the raced answer was kept");
        assert_eq!(st.st_ino, want);
        assert!(target.0.slot.is_open());
    }

    #[test]
    fn test_renamed_through_the_fs_reopens_under_the_new_name() {
        let (t, fs, root) = export(2, 1, 64);
        let (d0, _) = fs.walk(&root, b"d0").unwrap();
        let (d1, _) = fs.walk(&root, b"d1").unwrap();
        let (file, _) = fs.walk(&d0, b"f0").unwrap();
        fs.rename(&file, &d1, b"renamed").unwrap();
        fs.fds.reclaim(0);
        assert!(!file.0.slot.is_open());
        let a = fs.getattr(&file, GetattrMask::BASIC).unwrap();
        assert_eq!(a.size, 3);
        assert!(t.path().join("d1/renamed").exists());
    }
}
