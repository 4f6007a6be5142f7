// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `--state-dir`: where a daemon that hands over (SIGUSR1) leaves its
//! session, and where the next one finds it. The directory is opened
//! before the sandbox, which would hide it, and used through that fd.
//!
//! The library keeps the session crash-safe there too (`session.snap`
//! and `session.journal`, see the library's design notes): a daemon
//! killed with SIGKILL leaves what its successor needs to go on.
//!
//! The handover state is one file, `session.state`, written as `session.state.tmp`,
//! synced and renamed over it, so a crash while saving leaves either the
//! old file or the new one, never half of one. The next daemon reads it
//! at start and removes it once its session is restored: it describes the
//! old process's fids, and is no good to a later start.

use std::ffi::CStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::error::{Error, Result};

const FILE: &CStr = c"session.state";
const TMP: &CStr = c"session.state.tmp";
const BAD: &CStr = c"session.state.refused";

/// An open state directory.
#[derive(Debug)]
pub struct StateDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl StateDir {
    /// Opens `path`, which must be a directory.
    pub fn open(path: &Path) -> Result<StateDir> {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| state_err(path, io::Error::from_raw_os_error(libc::EINVAL)))?;
        // SAFETY: a valid C string; the fd returned is checked.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(state_err(path, io::Error::last_os_error()));
        }
        Ok(StateDir {
            // SAFETY: a new fd we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
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

fn state_err(path: &Path, source: io::Error) -> Error {
    Error::StateDir {
        path: path.to_path_buf(),
        source,
    }
}
