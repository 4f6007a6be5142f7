// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The locked `<socket>.pid` file: virtiofsd's guard against a second
//! daemon on the same socket.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::error::{Error, Result};

/// An open, locked pid file. The lock lasts as long as the file stays
/// open in this process or a child that inherited it (the namespace
/// sandbox's daemon), so it is released however the daemon ends.
#[derive(Debug)]
pub struct PidFile {
    path: PathBuf,
    _file: File,
}

/// The pid file of a socket: `<socket-path>.pid`, as virtiofsd names it.
pub fn path_for(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".pid");
    PathBuf::from(p)
}

impl PidFile {
    /// Opens and locks the pid file of `socket`, then writes `pid` into it.
    /// A pid file locked by a running daemon is left as it is (not
    /// truncated) and the call fails with a message naming that daemon.
    pub fn acquire(socket: &Path, pid: u32) -> Result<PidFile> {
        let path = path_for(socket);
        let fail = |action: &'static str| {
            let path = path.clone();
            move |source| Error::PidFile {
                action,
                path,
                source,
            }
        };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&path)
            .map_err(fail("open"))?;
        let meta = file.metadata().map_err(fail("stat"))?;
        if !meta.file_type().is_file() {
            return Err(Error::PidFileNotRegular(path.clone()));
        }
        // SAFETY: flock on an fd this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut text = String::new();
                let _ = file.take(32).read_to_string(&mut text);
                return Err(Error::AlreadyRunning {
                    socket: socket.to_path_buf(),
                    pid_file: path.clone(),
                    holder: text.trim().parse::<u32>().ok(),
                });
            }
            return Err(fail("lock")(e));
        }
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{pid}"))
            .and_then(|()| file.flush())
            .map_err(fail("write"))?;
        Ok(PidFile { path, _file: file })
    }

    /// Removes the file and drops the lock: for a start that fails before
    /// serving, so that it leaves nothing behind.
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_second_lock_is_refused_and_file_kept() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        assert_eq!(path_for(&sock), dir.path().join("s.sock.pid"));
        let first = PidFile::acquire(&sock, 4242).unwrap();
        assert_eq!(std::fs::read_to_string(first.path()).unwrap(), "4242\n");
        // flock locks belong to the open file: a second open conflicts
        // even in the same process.
        let e = PidFile::acquire(&sock, 1).unwrap_err().to_string();
        assert!(e.contains("another instance is already serving"), "{e}");
        assert!(e.contains("(pid 4242)"), "{e}");
        assert_eq!(std::fs::read_to_string(first.path()).unwrap(), "4242\n");
        drop(first);
        let again = PidFile::acquire(&sock, 7).unwrap();
        assert_eq!(std::fs::read_to_string(again.path()).unwrap(), "7\n");
    }

    #[test]
    fn test_pid_file_must_be_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("d");
        std::fs::create_dir(path_for(&sock)).unwrap();
        let e = PidFile::acquire(&sock, 1).unwrap_err().to_string();
        assert!(e.contains("cannot open the pid file"), "{e}");
        let link = dir.path().join("l");
        std::os::unix::fs::symlink("/etc/passwd", path_for(&link)).unwrap();
        let e = PidFile::acquire(&link, 1).unwrap_err().to_string();
        assert!(e.contains("cannot open the pid file"), "{e}");
    }
}
