// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon's lock keeper: systemd's file descriptor store (or any
//! supervisor speaking its protocol) holds the file descriptions of the
//! guest's locks, so a `kill -9` of the daemon releases none of them.
//!
//! - A lock granted: `FDSTORE=1\nFDNAME=9p-lock-<fid>` with the fd
//!   (`SCM_RIGHTS`) to `$NOTIFY_SOCKET`; its last lock released or its fid
//!   gone: `FDSTOREREMOVE=1\nFDNAME=9p-lock-<fid>`.
//! - At start: the stored fds come back as `LISTEN_FDS`, `LISTEN_FDNAMES`
//!   and `LISTEN_PID` (fds 3 and up); the restored session adopts those of
//!   its fids ([`virtio_9p_server::LockKeeper::adopt`]); the rest are
//!   unlocked, closed and removed from the store, with a log line
//!   ([`FdStore::close_unclaimed`]).
//!
//! The socket is connected before the sandbox hides its path. Sending is
//! done by one thread of its own ([`FdStore::start`], after the sandbox's
//! fork): the engine's workers, where a Tlock runs, may not call
//! `sendmsg`. A keep waits until the message is in the store's socket
//! queue, where the kernel holds the file description for the receiver
//! even if the daemon dies the next instant.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use log::{error, info, warn};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// The first fd of `LISTEN_FDS` (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: RawFd = 3;

/// Most fds taken from `LISTEN_FDS`; a larger count is refused whole.
const MAX_LISTEN_FDS: usize = 65_536;

/// The prefix of the names this daemon stores: `9p-lock-<fid>`.
const NAME_PREFIX: &str = "9p-lock-";

/// The name fid `fid`'s file description is stored under.
fn name(fid: u32) -> String {
    format!("{NAME_PREFIX}{fid}")
}

/// What the environment passed: `LISTEN_FDS` fds with their names, for
/// this process. Names that are not this daemon's are logged and closed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Inherited {
    /// fd number and fid, for the fds whose name is one of ours.
    pub named: Vec<(RawFd, u32)>,
    /// fds passed with a name that is not ours (or none): closed.
    pub foreign: Vec<(RawFd, String)>,
}

impl Inherited {
    /// Every inherited fd number, for the startup's fd sweep to spare.
    pub fn fds(&self) -> Vec<RawFd> {
        let mut v: Vec<RawFd> = self
            .named
            .iter()
            .map(|(fd, _)| *fd)
            .chain(self.foreign.iter().map(|(fd, _)| *fd))
            .collect();
        v.sort_unstable();
        v
    }
}

/// The fid of a name this daemon stores (`9p-lock-<u32>`, digits only).
fn fid_of(name: &str) -> Option<u32> {
    let n = name.strip_prefix(NAME_PREFIX)?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// Parses `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES` as
/// `sd_listen_fds_with_names(3)` does, for the process `pid`. `Err` is the
/// line to log when they are there but unusable (then no fd is taken).
pub fn parse_listen(
    listen_pid: Option<&str>,
    listen_fds: Option<&str>,
    names: Option<&str>,
    pid: u32,
) -> Result<Inherited, String> {
    let (Some(lpid), Some(nfds)) = (listen_pid, listen_fds) else {
        return Ok(Inherited::default());
    };
    match lpid.parse::<u32>() {
        Ok(p) if p == pid => {}
        Ok(_) => return Ok(Inherited::default()),
        Err(_) => {
            return Err(format!(
                "LISTEN_PID {lpid:?} is not a pid; LISTEN_FDS ignored"
            ))
        }
    }
    let n = match nfds.parse::<usize>() {
        Ok(n) if n <= MAX_LISTEN_FDS => n,
        _ => {
            return Err(format!(
                "LISTEN_FDS {nfds:?} is not a count of fds; ignored"
            ))
        }
    };
    let names: Vec<&str> = match names {
        Some(s) => s.split(':').collect(),
        None => Vec::new(),
    };
    let mut out = Inherited::default();
    for i in 0..n {
        let fd = LISTEN_FDS_START + i as RawFd;
        let name = names.get(i).copied().unwrap_or("");
        match fid_of(name).filter(|_| names.len() == n) {
            Some(fid) => out.named.push((fd, fid)),
            None => out.foreign.push((fd, name.to_owned())),
        }
    }
    Ok(out)
}

/// A request to the sending thread.
enum Msg {
    /// Store the fd under the name; answer when sent.
    Keep(String, RawFd, mpsc::SyncSender<io::Result<()>>),
    /// Remove what is stored under the name.
    Remove(String),
}

/// systemd's file descriptor store as a [`virtio_9p_server::LockKeeper`].
#[derive(Debug)]
pub struct FdStore {
    /// The connected `$NOTIFY_SOCKET`, until [`FdStore::start`] moves it
    /// to its thread; `None` without one (adoption only).
    socket: Mutex<Option<UnixDatagram>>,
    /// To the sending thread, once started.
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    /// Inherited fds not adopted yet, by fid.
    inherited: Mutex<HashMap<u32, OwnedFd>>,
}

impl FdStore {
    /// Takes what the environment passed: `NOTIFY_SOCKET` (connected now)
    /// and the `LISTEN_FDS` given by [`parse_listen`] (taken over, made
    /// close-on-exec; foreign ones closed with a log line). Call early,
    /// before the fd sweep and the sandbox.
    pub fn from_env(inherited: Inherited) -> Self {
        let socket = match std::env::var_os("NOTIFY_SOCKET") {
            Some(path) => match connect(&path) {
                Ok(s) => Some(s),
                Err(e) => {
                    error!(
                        "lock keeper: NOTIFY_SOCKET {}: {e}; the guest's locks are not kept across a crash",
                        path.to_string_lossy()
                    );
                    None
                }
            },
            None => None,
        };
        let mut map = HashMap::new();
        for (fd, name) in inherited.foreign {
            // SAFETY: the environment passed this fd to this process
            // (LISTEN_PID matched); nothing else in it owns the number.
            let own = unsafe { OwnedFd::from_raw_fd(fd) };
            warn!(
                "lock keeper: inherited fd {fd} named {name:?} is not one of this daemon's (9p-lock-<fid>); closed"
            );
            drop(own);
        }
        for (fd, fid) in inherited.named {
            // SAFETY: as above.
            let own = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: F_SETFD on an fd we own.
            unsafe { libc::fcntl(own.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
            if let Some(dup) = map.insert(fid, own) {
                warn!(
                    "lock keeper: {} was passed twice; the first copy is closed",
                    name(fid)
                );
                unlock_all(dup.as_raw_fd());
            }
        }
        FdStore {
            socket: Mutex::new(socket),
            tx: Mutex::new(None),
            inherited: Mutex::new(map),
        }
    }

    /// Whether there is a store to keep fds in (`NOTIFY_SOCKET`).
    pub fn can_keep(&self) -> bool {
        self.socket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
            || self.tx.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Starts the sending thread (after the sandbox's fork: a thread does
    /// not survive it).
    pub fn start(self: &Arc<Self>) -> io::Result<()> {
        let Some(socket) = self.socket.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(());
        };
        let (tx, rx) = mpsc::channel::<Msg>();
        std::thread::Builder::new()
            .name("lock-keeper".into())
            .spawn(move || {
                for msg in rx {
                    match msg {
                        Msg::Keep(name, fd, done) => {
                            let text = format!("FDSTORE=1\nFDNAME={name}");
                            let r = socket.send_with_fd(text.as_bytes(), fd).map(drop);
                            let _ = done.send(r.map_err(io::Error::from));
                        }
                        Msg::Remove(name) => {
                            let text = format!("FDSTOREREMOVE=1\nFDNAME={name}");
                            if let Err(e) = socket.send(text.as_bytes()) {
                                warn!("lock keeper: removing {name}: {e}");
                            }
                        }
                    }
                }
            })?;
        *self.tx.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        Ok(())
    }

    fn send(&self, msg: Msg) -> bool {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        tx.as_ref().is_some_and(|tx| tx.send(msg).is_ok())
    }

    /// Unlocks, closes and removes from the store every inherited fd the
    /// restored session did not adopt, with a log line each.
    pub fn close_unclaimed(&self) {
        let left: Vec<(u32, OwnedFd)> = self
            .inherited
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        for (fid, fd) in left {
            warn!(
                "lock keeper: {} kept by an earlier instance belongs to no restored fid; its locks are released",
                name(fid)
            );
            unlock_all(fd.as_raw_fd());
            drop(fd);
            self.send(Msg::Remove(name(fid)));
        }
    }
}

impl virtio_9p_server::LockKeeper for FdStore {
    fn keep(&self, fid: u32, fd: BorrowedFd<'_>) -> io::Result<()> {
        let (done, wait) = mpsc::sync_channel(1);
        if !self.send(Msg::Keep(name(fid), fd.as_raw_fd(), done)) {
            return Err(io::Error::new(io::ErrorKind::NotConnected, "no fd store"));
        }
        // The fd stays open (the caller borrows it) until this returns.
        wait.recv()
            .unwrap_or_else(|_| Err(io::Error::other("the lock keeper thread is gone")))
    }

    fn release(&self, fid: u32) {
        self.send(Msg::Remove(name(fid)));
    }

    fn adopt(&self, fid: u32) -> Option<OwnedFd> {
        self.inherited
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fid)
    }
}

/// Releases every OFD lock of `fd`'s file description: another process
/// (the sandbox's supervisor) may hold a copy, so closing alone is not
/// enough.
fn unlock_all(fd: RawFd) {
    // SAFETY: a zeroed flock is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_UNLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: an fd we own and a flock that lives for the call.
    unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &fl) };
}

/// A datagram socket connected to `NOTIFY_SOCKET` (a path, or `@name`
/// for an abstract socket).
fn connect(path: &std::ffi::OsStr) -> io::Result<UnixDatagram> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    let sock = UnixDatagram::unbound()?;
    let bytes = path.as_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.connect_addr(&addr)?;
    } else {
        sock.connect(path)?;
    }
    info!(
        "lock keeper: the guest's locks are kept in the fd store at {}",
        path.to_string_lossy()
    );
    Ok(sock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_listen_fds_for_another_pid_are_not_ours() {
        assert_eq!(
            parse_listen(Some("7"), Some("2"), Some("9p-lock-1:9p-lock-2"), 8),
            Ok(Inherited::default())
        );
        assert_eq!(parse_listen(None, None, None, 8), Ok(Inherited::default()));
    }

    #[test]
    fn test_listen_fds_named_ours_are_taken() {
        let got = parse_listen(Some("8"), Some("2"), Some("9p-lock-1:9p-lock-20"), 8).unwrap();
        assert_eq!(got.named, vec![(3, 1), (4, 20)]);
        assert!(got.foreign.is_empty());
        assert_eq!(got.fds(), vec![3, 4]);
    }

    #[test]
    fn test_garbage_listen_fds_are_refused_or_set_apart() {
        assert!(parse_listen(Some("x"), Some("1"), None, 8)
            .unwrap_err()
            .contains("LISTEN_PID"));
        assert!(parse_listen(Some("8"), Some("-1"), None, 8)
            .unwrap_err()
            .contains("LISTEN_FDS"));
        assert!(parse_listen(Some("8"), Some("99999999"), None, 8).is_err());
        // Garbage names, and names that do not match the count: closed.
        let got = parse_listen(
            Some("8"),
            Some("5"),
            Some("9p-lock-:9p-lock-x:stored:9p-lock-99999999999:9p-lock-3"),
            8,
        )
        .unwrap();
        assert_eq!(got.named, vec![(7, 3)]);
        assert_eq!(got.foreign.len(), 4);
        let got = parse_listen(Some("8"), Some("2"), Some("9p-lock-1"), 8).unwrap();
        assert!(got.named.is_empty());
        assert_eq!(got.fds(), vec![3, 4]);
    }
}
