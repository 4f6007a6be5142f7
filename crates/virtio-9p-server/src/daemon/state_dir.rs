// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `--state-dir`: where a daemon that hands over (SIGUSR1) leaves its
//! session, and where the next one finds it. The directory is opened
//! before the sandbox, which would hide it, and used through that fd.
//!
//! The library keeps the session crash-safe there too (`session.snap`,
//! `session.journal` and `session.inflight`, all in the library's
//! `src/persist/`): a daemon killed with SIGKILL leaves what its
//! successor needs to go on. These checks stay in the binary: a safe
//! directory, its lock and the handover file are the daemon's policy,
//! and the library only takes the directory as an fd.
//!
//! The handover state is one file, `session.state`, written as `session.state.tmp`,
//! synced and renamed over it, so a crash while saving leaves either the
//! old file or the new one, never half of one. The next daemon reads it
//! at start and removes it once its session is restored: it describes the
//! old process's fids, and is no good to a later start.

use std::ffi::CStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::error::{Error, Result};

const FILE: &CStr = c"session.state";
const TMP: &CStr = c"session.state.tmp";
const BAD: &CStr = c"session.state.refused";
/// `statfs` types of the memory filesystems a state directory may be on.
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;
/// How long a start waits for the lock of a daemon that is going away.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// Deepest directory tree walked up looking for the shared directory.
const MAX_DEPTH: usize = 4096;

/// An open state directory.
#[derive(Debug)]
pub struct StateDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl StateDir {
    /// Opens `path` and takes it for this daemon. It is refused (one line
    /// naming it and why) unless it is a directory only this daemon can
    /// reach: not a symlink, not inside `shared_dir` (by `(dev, ino)`
    /// ancestry of the opened directory, so no path spelling or symlink
    /// above it gets round the check), owned by the daemon's user, not
    /// writable by group or others, on a tmpfs (the state describes a live
    /// guest and must not outlive the host: see SECURITY.md), and not in
    /// use by another daemon: an exclusive `flock` on the directory is held
    /// for as long as the daemon (or, in the namespace sandbox, its
    /// supervisor) runs.
    pub fn open(path: &Path, shared_dir: &Path) -> Result<StateDir> {
        let refuse = |reason: String| Error::StateDirUnsafe {
            path: path.to_path_buf(),
            reason,
        };
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| state_err(path, io::Error::from_raw_os_error(libc::EINVAL)))?;
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(refuse("it is a symlink; give the directory itself".into()))
            }
            Ok(_) => {}
            Err(e) => return Err(state_err(path, e)),
        }
        // O_NOFOLLOW: a symlink swapped in since the check fails (ELOOP).
        // SAFETY: a valid C string; the fd returned is checked.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ELOOP) {
                return Err(refuse("it is a symlink; give the directory itself".into()));
            }
            return Err(state_err(path, e));
        }
        // SAFETY: a new fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        check_outside(fd.as_fd(), shared_dir)
            .map_err(|e| state_err(path, e))?
            .map_or(Ok(()), |r| Err(refuse(r)))?;
        let st = fstat(fd.as_fd()).map_err(|e| state_err(path, e))?;
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        if st.st_uid != euid {
            return Err(refuse(format!(
                "it is owned by uid {}, not by the daemon's uid {euid}",
                st.st_uid
            )));
        }
        if st.st_mode & 0o022 != 0 {
            return Err(refuse(format!(
                "it is writable by group or others (mode {:04o}); chmod 0700 it",
                st.st_mode & 0o7777
            )));
        }
        let fs_type = statfs_type(fd.as_fd()).map_err(|e| state_err(path, e))?;
        if fs_type != TMPFS_MAGIC && fs_type != RAMFS_MAGIC {
            return Err(refuse(format!(
                "it is not on a tmpfs (filesystem type {fs_type:#x}); the state must not outlive the host, use a directory under /run or /dev/shm"
            )));
        }
        // A daemon killed a moment ago (kill -9 and an immediate restart)
        // may still be going away, its sandboxed child with it: wait a
        // little for its lock before calling the directory in use.
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        loop {
            // SAFETY: flock on a valid fd.
            if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(state_err(path, e));
            }
            if std::time::Instant::now() >= deadline {
                return Err(refuse("another daemon is using it".into()));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(StateDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The directory's fd, shared with the library, which keeps the
    /// session crash-safe in it (`session.snap`, `session.journal`).
    pub fn shared_fd(&self) -> Result<std::sync::Arc<OwnedFd>> {
        self.fd
            .try_clone()
            .map(std::sync::Arc::new)
            .map_err(|e| state_err(&self.path, e))
    }

    /// The path of the crash-safe snapshot, for messages.
    pub fn snapshot_file(&self) -> PathBuf {
        self.path.join("session.snap")
    }

    /// The path of the state file, for messages.
    pub fn file(&self) -> PathBuf {
        self.path.join("session.state")
    }

    /// The saved state, if a daemon left one.
    pub fn read(&self) -> Result<Option<Vec<u8>>> {
        let fd = match self.openat(FILE, libc::O_RDONLY, 0) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(state_err(&self.file(), e)),
        };
        let mut bytes = Vec::new();
        std::fs::File::from(fd)
            .read_to_end(&mut bytes)
            .map_err(|e| state_err(&self.file(), e))?;
        Ok(Some(bytes))
    }

    /// Removes the state file (it was used).
    pub fn consume(&self) -> Result<()> {
        // SAFETY: a valid dirfd and C string.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), FILE.as_ptr(), 0) } != 0 {
            return Err(state_err(&self.file(), io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Moves a refused state file aside (`session.state.refused`).
    pub fn set_aside(&self) -> Result<()> {
        // SAFETY: a valid dirfd and C strings.
        let r = unsafe {
            libc::renameat(
                self.fd.as_raw_fd(),
                FILE.as_ptr(),
                self.fd.as_raw_fd(),
                BAD.as_ptr(),
            )
        };
        if r != 0 {
            return Err(state_err(&self.file(), io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Writes `bytes` as the state file: all of it or, after a crash,
    /// none of it.
    pub fn write(&self, bytes: &[u8]) -> Result<()> {
        let err = |e| state_err(&self.file(), e);
        let fd = self
            .openat(TMP, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o600)
            .map_err(err)?;
        let mut f = std::fs::File::from(fd);
        f.write_all(bytes).map_err(err)?;
        f.sync_all().map_err(err)?;
        drop(f);
        // SAFETY: a valid dirfd and C strings.
        let r = unsafe {
            libc::renameat(
                self.fd.as_raw_fd(),
                TMP.as_ptr(),
                self.fd.as_raw_fd(),
                FILE.as_ptr(),
            )
        };
        if r != 0 {
            return Err(err(io::Error::last_os_error()));
        }
        // The rename itself reaches the disk with the directory.
        let dir = self
            .openat(c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)
            .map_err(err)?;
        std::fs::File::from(dir).sync_all().map_err(err)
    }

    fn openat(&self, name: &CStr, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
        // SAFETY: a valid dirfd and C string; the fd returned is checked.
        let fd = unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
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
}

fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd and a stat buffer valid for the call.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

fn statfs_type(fd: BorrowedFd<'_>) -> io::Result<i64> {
    // SAFETY: an all-zero statfs is a valid value to overwrite.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd and a statfs buffer valid for the call.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_type as i64)
}

/// `None` if the directory `dir` is not `shared_dir` nor below it, else
/// why. Walks up from the opened directory by `..` and compares each
/// ancestor's `(dev, ino)` with the shared directory's, so it holds
/// whatever symlinks or spellings the two paths went through.
fn check_outside(dir: BorrowedFd<'_>, shared_dir: &Path) -> io::Result<Option<String>> {
    use std::os::unix::fs::MetadataExt;
    // A shared directory that cannot be found fails the start on its
    // own, with its own message; nothing can be inside it.
    let Ok(share) = std::fs::metadata(shared_dir) else {
        return Ok(None);
    };
    let target = (share.dev(), share.ino());
    let mut cur = dir.try_clone_to_owned()?;
    let mut st = fstat(cur.as_fd())?;
    for _ in 0..MAX_DEPTH {
        if (st.st_dev, st.st_ino) == target {
            return Ok(Some(format!(
                "it is the shared directory {} or inside it, where the guest could write it",
                shared_dir.display()
            )));
        }
        // SAFETY: a valid dirfd and C string; the fd returned is checked.
        let up = unsafe {
            libc::openat(
                cur.as_raw_fd(),
                c"..".as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if up < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new fd we own.
        let up = unsafe { OwnedFd::from_raw_fd(up) };
        let up_st = fstat(up.as_fd())?;
        if (up_st.st_dev, up_st.st_ino) == (st.st_dev, st.st_ino) {
            return Ok(None);
        }
        cur = up;
        st = up_st;
    }
    Err(io::Error::from_raw_os_error(libc::ELOOP))
}

fn state_err(path: &Path, source: io::Error) -> Error {
    Error::StateDir {
        path: path.to_path_buf(),
        source,
    }
}
