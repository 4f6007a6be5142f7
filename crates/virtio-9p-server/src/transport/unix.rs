// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Unix socket files that replace nothing but a stale socket, and are
//! created owner-only.
//!
//! Both the socket transport (`--listen unix:PATH`) and the vhost-user
//! daemon (`--socket-path PATH`) bind through [`bind`]:
//!
//! - nothing at `PATH`: the socket is created;
//! - a socket nobody listens on (`connect` answers `ECONNREFUSED`, as after
//!   a killed daemon): it is replaced;
//! - anything else (a regular file, a directory, a symlink, a socket a
//!   server is listening on, or a socket whose state cannot be told):
//!   refused with an error that says what is there, and nothing is touched.
//!
//! The socket file is mode 0600 from the moment it exists: the socket's
//! inode mode is set before `bind(2)`, which creates the file with that
//! mode (less the umask). With a group ([`SocketPerms::group`]) it is then
//! given to that group and made 0660.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// Backlog of the listening socket.
const BACKLOG: libc::c_int = 128;

/// Who may connect to a socket [`bind`] creates.
/// `#[non_exhaustive]`: start from [`SocketPerms::default`] (owner only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SocketPerms {
    /// `None`: the owner only (mode 0600). `Some(gid)`: that group too
    /// (mode 0660, group `gid`).
    pub group: Option<libc::gid_t>,
}

impl SocketPerms {
    /// The mode of the socket file.
    pub fn mode(&self) -> libc::mode_t {
        if self.group.is_some() {
            0o660
        } else {
            0o600
        }
    }
}

fn refuse(kind: io::ErrorKind, path: &Path, what: &str) -> io::Error {
    io::Error::new(kind, format!("{} {what}", path.display()))
}

/// Makes `path` free for a new socket: removes a stale socket, refuses
/// anything else that is there.
pub(crate) fn clear_stale(path: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        let what = if meta.is_dir() {
            "a directory"
        } else if meta.file_type().is_symlink() {
            "a symlink"
        } else if meta.is_file() {
            "a regular file"
        } else {
            "not a socket"
        };
        return Err(refuse(
            io::ErrorKind::AlreadyExists,
            path,
            &format!("exists and is {what}; refusing to replace it"),
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(refuse(
            io::ErrorKind::AddrInUse,
            path,
            "is a live socket (a server is listening on it); refusing to replace it",
        )),
        Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
            log::debug!("replacing the stale socket {}", path.display());
            std::fs::remove_file(path)
        }
        Err(e) => Err(refuse(
            e.kind(),
            path,
            &format!("is a socket whose state cannot be told ({e}); refusing to replace it"),
        )),
    }
}

/// Binds a listening unix socket at `path` with `perms`, after
/// `clear_stale`.
pub fn bind(path: &Path, perms: SocketPerms) -> io::Result<UnixListener> {
    clear_stale(path)?;
    // SAFETY: a zeroed sockaddr_un is valid (AF_UNSPEC, empty path).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: a socket path must be 1 to {} bytes without NUL",
                path.display(),
                addr.sun_path.len() - 1
            ),
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // bind(2) creates the file with the socket inode's mode less the
    // umask: 0600 here, so the file is never more open than that.
    // SAFETY: fchmod on an fd we own.
    if unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: `addr` is a valid sockaddr_un and `len` is within it.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast::<libc::sockaddr>(),
            len as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let listener = UnixListener::from(fd);
    let set_perms = || -> io::Result<()> {
        let c = std::ffi::CString::new(bytes)?;
        if let Some(gid) = perms.group {
            // SAFETY: valid C string; uid -1 leaves the owner as it is.
            if unsafe { libc::chown(c.as_ptr(), u32::MAX, gid) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // Also where fchmod did not carry over (or a umask took bits
        // away): the final mode is exactly the one asked for.
        // SAFETY: valid C string.
        if unsafe { libc::chmod(c.as_ptr(), perms.mode()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    if let Err(e) = set_perms() {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    // SAFETY: listen(2) on a bound socket we own.
    if unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) } != 0 {
        let e = io::Error::last_os_error();
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn test_bind_creates_an_owner_only_socket() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s");
        let l = bind(&p, SocketPerms::default()).unwrap();
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.permissions().mode() & 0o7777, 0o600);
        UnixStream::connect(&p).unwrap();
        drop(l);
    }

    #[test]
    fn test_bind_replaces_only_a_stale_socket() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s");
        drop(UnixListener::bind(&p).unwrap());
        // Stale: nobody listens.
        let l = bind(&p, SocketPerms::default()).unwrap();
        // Live: refused, and the live socket still works.
        let e = bind(&p, SocketPerms::default()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        assert!(e.to_string().contains("is a live socket"), "{e}");
        UnixStream::connect(&p).unwrap();
        drop(l);
    }

    #[test]
    fn test_bind_refuses_files_dirs_and_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("f");
        std::fs::write(&f, b"precious").unwrap();
        let e = bind(&f, SocketPerms::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{} exists and is a regular file; refusing to replace it",
                f.display()
            )
        );
        assert_eq!(std::fs::read(&f).unwrap(), b"precious");
        let e = bind(d.path(), SocketPerms::default()).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        let l = d.path().join("l");
        std::os::unix::fs::symlink(&f, &l).unwrap();
        let e = bind(&l, SocketPerms::default()).unwrap_err();
        assert!(e.to_string().contains("is a symlink"), "{e}");
        assert!(std::fs::symlink_metadata(&l)
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn test_bind_with_a_group_and_bad_paths() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("g");
        // SAFETY: plain getter.
        let gid = unsafe { libc::getegid() };
        let _l = bind(&p, SocketPerms { group: Some(gid) }).unwrap();
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o660);
        let long = d.path().join("x".repeat(200));
        let e = bind(&long, SocketPerms::default()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
