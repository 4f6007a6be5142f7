// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Locks that survive a crash of the process: the file description that
//! holds a fid's byte-range locks, kept open by a [`LockKeeper`] outside
//! the process.
//!
//! Open file description locks (`F_OFD_SETLK`, what
//! [`PassthroughFs`](crate::PassthroughFs) takes) belong to the open file
//! description, not to the process: while any fd of it stays open
//! anywhere, the locks stay held. So when a Tlock is granted on a fid
//! whose file description no keeper holds yet, the server hands the
//! keeper a duplicate of the fd ([`LockKeeper::keep`]) before it answers;
//! when the fid's last lock is released (an unlock of the whole file) or
//! the fid goes away, it unlocks the whole file through its own duplicate
//! and tells the keeper ([`LockKeeper::release`]). A `kill -9` runs
//! neither, so the keeper's copy holds the locks through the crash.
//!
//! A server restoring a session ([`Server::restore_session`],
//! [`Server::recover_session`](crate::Server::recover_session)) asks the
//! keeper for each open fid's kept file description
//! ([`LockKeeper::adopt`]), checks with
//! [`Filesystem::adopt_file`] that it is the same file as the restored
//! fid, and serves the fid on it: the locks never left. A kept fd of
//! another file is unlocked, closed and released, with a log line, and
//! the fid's locks are taken again as without a keeper.
//!
//! A kept file description is known by its fid's number: what the saved
//! session and its journal record.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use log::{error, info, warn};

use super::Server;
use crate::fs::Filesystem;
use crate::protocol::{OpenFlags, Tlock};

/// Keeps the file descriptions holding a session's locks open outside the
/// process (the daemon's is systemd's file descriptor store, or any
/// supervisor speaking its protocol). Set it in
/// [`Config::lock_keeper`](crate::Config::lock_keeper); see "Locks across
/// a crash" in the crate README.
///
/// The calls come from the server's threads (a worker may be one) while
/// a request is answered; `keep` must have handed the fd over (or failed)
/// when it returns, so that a lock the guest was told it holds is kept.
pub trait LockKeeper: Send + Sync + fmt::Debug {
    /// Keep a duplicate of `fd`, the open file of `fid`: a lock was
    /// granted on it. Failing only loses the protection (the server logs
    /// it).
    fn keep(&self, fid: u32, fd: BorrowedFd<'_>) -> io::Result<()>;

    /// Drop what is kept for `fid`: its locks are released (the server
    /// has unlocked the whole file already).
    fn release(&self, fid: u32);

    /// The file description a previous instance kept for `fid`, if any;
    /// it stays kept for the next crash.
    fn adopt(&self, fid: u32) -> Option<OwnedFd>;
}

/// A fid's file description, kept: unlocks and releases it when dropped
/// (the fid's last lock released, the fid clunked or removed, the session
/// ended), which a killed process never does.
pub(crate) struct Kept {
    keeper: Arc<dyn LockKeeper>,
    fid: u32,
    /// A duplicate of the fid's fd, to unlock through when dropped.
    fd: OwnedFd,
}

impl fmt::Debug for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kept").field("fid", &self.fid).finish()
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        // The keeper's copy would hold the locks on: release them here,
        // on the shared file description, before it lets go.
        unlock_all(self.fd.as_fd());
        self.keeper.release(self.fid);
    }
}

/// Releases every OFD lock `fd`'s file description holds.
pub(crate) fn unlock_all(fd: BorrowedFd<'_>) {
    // SAFETY: a zeroed flock is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_UNLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: a valid fd and a flock that lives for the call.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
}

/// A close-on-exec duplicate of `fd`.
fn dup(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on a valid fd returns a new fd or -1.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `n` is a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

impl<F: Filesystem> Server<F> {
    /// After a Tlock on `fid` changed its lock log: keeps the file
    /// description in `kept` when it holds its first lock (`holds`),
    /// releases it when its last lock went (an unlock of the whole file).
    /// No-op without a keeper.
    pub(crate) fn keep_locks(
        &self,
        fid: u32,
        file: &F::File,
        holds: bool,
        kept: &mut Option<Kept>,
    ) {
        let Some(keeper) = &self.config.lock_keeper else {
            return;
        };
        if !holds {
            // Dropping unlocks (nothing is locked any more) and releases.
            *kept = None;
            return;
        }
        if kept.is_some() {
            return;
        }
        let Some(fd) = self.fs.lock_fd(file) else {
            return;
        };
        let handed = dup(fd).and_then(|own| {
            keeper.keep(fid, own.as_fd())?;
            Ok(own)
        });
        match handed {
            Ok(fd) => {
                *kept = Some(Kept {
                    keeper: Arc::clone(keeper),
                    fid,
                    fd,
                })
            }
            Err(e) => error!(
                "9p: fid {fid}: its lock is not kept outside the process ({e}); a crash would release it"
            ),
        }
    }

    /// At a restore: a lock of `fid` taken again on a file opened again.
    /// Nothing held it between the crash and now: a host process could
    /// have taken it in that gap (and then the restore finds it taken).
    pub(crate) fn lock_retaken(&self, fid: u32, m: &Tlock) {
        warn!(
            "9p: restore: fid {fid}: lock {:?} {}+{} taken again: {}, so a host process could take it between the crash and now",
            m.ty,
            m.start,
            m.length,
            if self.config.lock_keeper.is_some() {
                "the lock keeper held no file description for it"
            } else {
                "no lock keeper held it through the restart"
            }
        );
    }

    /// At a restore: the file a keeper kept for `fid`, if it is the file
    /// of `inode` (opened as `flags`), with its [`Kept`]; `None` (open it
    /// again) without a keeper, with nothing kept, or with a kept fd of
    /// another file, which is unlocked, closed and released with a log
    /// line.
    pub(crate) fn adopt_kept(
        &self,
        fid: u32,
        inode: &F::Inode,
        flags: OpenFlags,
    ) -> Option<(F::File, Kept)> {
        let keeper = self.config.lock_keeper.as_ref()?;
        let fd = keeper.adopt(fid)?;
        let mine = match dup(fd.as_fd()) {
            Ok(d) => d,
            Err(e) => {
                error!("9p: restore: fid {fid}: its kept fd not adopted: {e}");
                unlock_all(fd.as_fd());
                keeper.release(fid);
                return None;
            }
        };
        match self.fs.adopt_file(inode, flags, fd) {
            Ok(file) => {
                info!("9p: restore: fid {fid}: adopted its kept file description; its locks never left");
                Some((
                    file,
                    Kept {
                        keeper: Arc::clone(keeper),
                        fid,
                        fd: mine,
                    },
                ))
            }
            Err(e) => {
                error!(
                    "9p: restore: fid {fid}: its kept fd refused ({e}); it is closed and the fid's locks are taken again"
                );
                // Dropping `Kept` unlocks what that fd held and releases it.
                drop(Kept {
                    keeper: Arc::clone(keeper),
                    fid,
                    fd: mine,
                });
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;
    use crate::protocol::*;
    use crate::{Config, Inline, PassthroughConfig, PassthroughFs, Session};

    /// A keeper in the test's process: what it keeps, and what it was
    /// asked, in order.
    #[derive(Debug, Default)]
    struct Store {
        fds: Mutex<HashMap<u32, OwnedFd>>,
        calls: Mutex<Vec<String>>,
    }

    impl LockKeeper for Store {
        fn keep(&self, fid: u32, fd: BorrowedFd<'_>) -> io::Result<()> {
            self.calls.lock().unwrap().push(format!("keep {fid}"));
            let fd = dup(fd)?;
            self.fds.lock().unwrap().insert(fid, fd);
            Ok(())
        }

        fn release(&self, fid: u32) {
            self.calls.lock().unwrap().push(format!("release {fid}"));
            self.fds.lock().unwrap().remove(&fid);
        }

        fn adopt(&self, fid: u32) -> Option<OwnedFd> {
            self.calls.lock().unwrap().push(format!("adopt {fid}"));
            let fds = self.fds.lock().unwrap();
            fds.get(&fid).map(|fd| dup(fd.as_fd()).unwrap())
        }
    }

    fn server(dir: &std::path::Path, store: &Arc<Store>) -> Server<PassthroughFs> {
        let fs = PassthroughFs::new(PassthroughConfig::new(dir)).unwrap();
        let cfg = Config {
            lock_keeper: Some(Arc::clone(store) as Arc<dyn LockKeeper>),
            ..Config::default()
        };
        Server::new(fs, cfg).unwrap()
    }

    fn call(s: &Server<PassthroughFs>, session: &Session<PassthroughFs>, m: Tmessage) -> Rmessage {
        let req = m.encode_frame(1);
        let mut r = crate::io::SliceReader::new(&req);
        let mut buf = vec![0u8; 1 << 16];
        let mut w = crate::io::SliceWriter::new(&mut buf);
        let reply = s
            .handle(session, &mut r, &mut w, &Inline, &crate::Cancel::new())
            .unwrap();
        Rmessage::decode_frame(&buf[..reply.size as usize], 1 << 20)
            .unwrap()
            .1
    }

    /// Tversion, Tattach fid 0, and fids 1 and 2 open read-write on `a`
    /// and `b`.
    fn session(s: &Server<PassthroughFs>) -> Session<PassthroughFs> {
        let session = Session::new();
        let v = Tmessage::Version(Tversion {
            msize: 65536,
            version: b"9P2000.L".to_vec(),
        });
        assert!(matches!(call(s, &session, v), Rmessage::Version(_)));
        let a = Tmessage::Attach(Tattach {
            fid: 0,
            afid: u32::MAX,
            uname: b"root".to_vec(),
            aname: Vec::new(),
            n_uname: 0,
        });
        assert!(matches!(call(s, &session, a), Rmessage::Attach(_)));
        for (fid, name) in [(1, "a"), (2, "b")] {
            let w = Tmessage::Walk(Twalk {
                fid: 0,
                newfid: fid,
                wnames: vec![name.as_bytes().to_vec()],
            });
            assert!(matches!(call(s, &session, w), Rmessage::Walk(_)));
            let o = Tmessage::Lopen(Tlopen {
                fid,
                flags: OpenFlags::RDWR,
            });
            assert!(matches!(call(s, &session, o), Rmessage::Lopen(..)));
        }
        session
    }

    fn lock(fid: u32, ty: LockType) -> Tmessage {
        Tmessage::Lock(Tlock {
            fid,
            ty,
            flags: LockFlags::empty(),
            start: 0,
            length: 0,
            proc_id: 1,
            client_id: b"t".to_vec(),
        })
    }

    fn host_can_lock(path: &std::path::Path) -> bool {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        // SAFETY: a zeroed flock is a valid value.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        // SAFETY: a valid fd and flock for the call.
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &fl) == 0 }
    }

    /// The inode number of `fd`'s file.
    fn ino(fd: BorrowedFd<'_>) -> u64 {
        let dup = std::fs::File::from(dup(fd).unwrap());
        use std::os::unix::fs::MetadataExt;
        dup.metadata().unwrap().ino()
    }

    fn setup() -> (tempfile::TempDir, Arc<Store>) {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), b"a").unwrap();
        std::fs::write(d.path().join("b"), b"b").unwrap();
        (d, Arc::new(Store::default()))
    }

    #[test]
    fn test_a_granted_lock_is_kept_until_its_release() {
        let (d, store) = setup();
        let s = server(d.path(), &store);
        let session = session(&s);
        let ok = Rmessage::Lock(LockStatus::Success);
        assert_eq!(call(&s, &session, lock(1, LockType::Wrlck)), ok);
        // A second lock on a kept fid sends nothing more.
        assert_eq!(call(&s, &session, lock(1, LockType::Rdlck)), ok);
        assert_eq!(*store.calls.lock().unwrap(), ["keep 1"]);
        assert!(!host_can_lock(&d.path().join("a")));
        assert_eq!(call(&s, &session, lock(1, LockType::Unlck)), ok);
        assert_eq!(*store.calls.lock().unwrap(), ["keep 1", "release 1"]);
        assert!(host_can_lock(&d.path().join("a")));
    }

    #[test]
    fn test_a_clunk_unlocks_though_the_keeper_holds_a_copy() {
        // The keeper here ignores the release: the lock goes all the same.
        #[derive(Debug, Default)]
        struct Deaf(Mutex<Vec<OwnedFd>>);
        impl LockKeeper for Deaf {
            fn keep(&self, _: u32, fd: BorrowedFd<'_>) -> io::Result<()> {
                self.0.lock().unwrap().push(dup(fd)?);
                Ok(())
            }
            fn release(&self, _: u32) {}
            fn adopt(&self, _: u32) -> Option<OwnedFd> {
                None
            }
        }
        let (d, _) = setup();
        let fs = PassthroughFs::new(PassthroughConfig::new(d.path())).unwrap();
        let deaf = Arc::new(Deaf::default());
        let cfg = Config {
            lock_keeper: Some(Arc::clone(&deaf) as Arc<dyn LockKeeper>),
            ..Config::default()
        };
        let s = Server::new(fs, cfg).unwrap();
        let session = session(&s);
        let ok = Rmessage::Lock(LockStatus::Success);
        assert_eq!(call(&s, &session, lock(2, LockType::Wrlck)), ok);
        assert!(!host_can_lock(&d.path().join("b")));
        assert_eq!(
            call(&s, &session, Tmessage::Clunk(Tfid { fid: 2 })),
            Rmessage::Clunk
        );
        assert_eq!(deaf.0.lock().unwrap().len(), 1);
        assert!(host_can_lock(&d.path().join("b")));
    }

    #[test]
    fn test_a_restored_session_adopts_the_kept_file_description() {
        let (d, store) = setup();
        let s = server(d.path(), &store);
        let old = session(&s);
        let ok = Rmessage::Lock(LockStatus::Success);
        assert_eq!(call(&s, &old, lock(1, LockType::Wrlck)), ok);
        let saved = s.save_session(&old).unwrap();
        // A crash: the old session's fds are gone without a release.
        std::mem::forget(old);
        let kept_ino = {
            let fds = store.fds.lock().unwrap();
            ino(fds[&1].as_fd())
        };

        let s2 = server(d.path(), &store);
        let session = s2.restore_session(&saved).unwrap();
        assert!(store.calls.lock().unwrap().contains(&"adopt 1".to_owned()));
        // Adopted, not kept again: one keep in all.
        let keeps = store
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.starts_with("keep"))
            .count();
        assert_eq!(keeps, 1);
        assert!(!host_can_lock(&d.path().join("a")));
        // The fid's file is the kept description: its unlock frees the file
        // though the keeper still holds a copy until the release.
        assert_eq!(call(&s2, &session, lock(1, LockType::Unlck)), ok);
        assert!(host_can_lock(&d.path().join("a")));
        assert!(store.fds.lock().unwrap().is_empty());
        assert_ne!(kept_ino, 0);
    }

    #[test]
    fn test_a_kept_fd_of_another_file_is_refused_and_the_lock_taken_again() {
        let (d, store) = setup();
        let s = server(d.path(), &store);
        let old = session(&s);
        let ok = Rmessage::Lock(LockStatus::Success);
        assert_eq!(call(&s, &old, lock(1, LockType::Wrlck)), ok);
        let saved = s.save_session(&old).unwrap();
        drop(old);
        assert!(store.fds.lock().unwrap().is_empty());
        // Under fid 1's name: an fd of `b`, holding a lock.
        let other = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(d.path().join("b"))
            .unwrap();
        let other = OwnedFd::from(other);
        // SAFETY: a zeroed flock is a valid value.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as libc::c_short;
        // SAFETY: a valid fd and flock for the call.
        let r = unsafe { libc::fcntl(other.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
        assert_eq!(r, 0);
        store.fds.lock().unwrap().insert(1, other);
        assert!(!host_can_lock(&d.path().join("b")));

        let s2 = server(d.path(), &store);
        let session = s2.restore_session(&saved).unwrap();
        // Refused: unlocked and released; the fid's lock taken again and
        // kept, now on its own file.
        assert!(host_can_lock(&d.path().join("b")));
        assert!(!host_can_lock(&d.path().join("a")));
        let calls = store.calls.lock().unwrap().clone();
        // (Every restored open fid asks; fid 2 had nothing kept.)
        assert_eq!(
            calls[2..],
            ["adopt 1", "release 1", "keep 1", "adopt 2"],
            "{calls:?}"
        );
        let fds = store.fds.lock().unwrap();
        use std::os::unix::fs::MetadataExt;
        let a = std::fs::metadata(d.path().join("a")).unwrap();
        assert_eq!(ino(fds[&1].as_fd()), a.ino());
        drop(fds);
        drop(session);
    }
}
