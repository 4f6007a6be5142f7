// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The guest's locks across a `kill -9` of the daemon: with a lock keeper
//! (systemd's file descriptor store, played here by the test: a
//! `NOTIFY_SOCKET` datagram socket that stores the fds it is sent and
//! passes them back with `LISTEN_FDS` at the restart) no host process
//! gets a guest's lock at any instant of the kill and the restart;
//! without one the gap exists and is logged. Kept fds that do not fit
//! (another file, names that are not the daemon's) are refused with a
//! log line.

mod vhost_user_support;

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vhost_user_support::scenarios::attach_open;
use vhost_user_support::*;
use virtio_9p_server::protocol::*;
use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout, VmmOptions};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

const BIN: &str = env!("CARGO_BIN_EXE_virtio-9p-server");
/// A tmpfs for the state directory, as `--state-dir` requires.
const TMPFS: &str = "/dev/shm";

/// The fd store of a service manager: what `FDSTORE=1` sent, by name,
/// until `FDSTOREREMOVE=1`.
struct FdStore {
    path: PathBuf,
    fds: Arc<Mutex<Vec<(String, OwnedFd)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FdStore {
    fn new(path: PathBuf) -> FdStore {
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let fds = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let fds = Arc::clone(&fds);
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while !stop.load(Ordering::Acquire) {
                    let Ok((n, file)) = sock.recv_with_fd(&mut buf) else {
                        continue;
                    };
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let mut store = false;
                    let mut remove = false;
                    let mut name = String::new();
                    for line in text.lines() {
                        match line.split_once('=') {
                            Some(("FDSTORE", "1")) => store = true,
                            Some(("FDSTOREREMOVE", "1")) => remove = true,
                            Some(("FDNAME", n)) => name = n.to_owned(),
                            _ => {}
                        }
                    }
                    let mut fds = fds.lock().unwrap();
                    if store {
                        if let Some(f) = file {
                            fds.push((name, OwnedFd::from(f)));
                        }
                    } else if remove {
                        fds.retain(|(n, _)| *n != name);
                    }
                }
            })
        };
        FdStore {
            path,
            fds,
            stop,
            thread: Some(thread),
        }
    }

    fn names(&self) -> Vec<String> {
        self.fds
            .lock()
            .unwrap()
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Waits until `name` is (or is not) stored.
    fn wait_for(&self, name: &str, present: bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.names().iter().any(|n| n == name) != present {
            assert!(
                Instant::now() < deadline,
                "{name} stored: {:?}, want {present}",
                self.names()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stores `fd` under `name` (what a service manager was sent).
    fn put(&self, name: &str, fd: OwnedFd) {
        self.fds.lock().unwrap().push((name.to_owned(), fd));
    }

    /// Drops what is stored under `name`.
    fn drop_name(&self, name: &str) {
        self.fds.lock().unwrap().retain(|(n, _)| n != name);
    }

    /// Close-on-exec copies of the stored fds above 100, with their names.
    fn copies(&self) -> Vec<(OwnedFd, String)> {
        self.fds
            .lock()
            .unwrap()
            .iter()
            .map(|(n, fd)| {
                // SAFETY: F_DUPFD_CLOEXEC on a valid fd.
                let d = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 100) };
                assert!(d >= 0);
                // SAFETY: a new fd nothing else owns.
                (unsafe { OwnedFd::from_raw_fd(d) }, n.clone())
            })
            .collect()
    }
}

impl Drop for FdStore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The daemon, its stderr collected on a thread.
struct Daemon {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Daemon {
    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until the log has a line containing every one of `parts`.
    fn wait_log(&self, parts: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            if let Some(l) = log.lines().find(|l| parts.iter().all(|p| l.contains(p))) {
                return l.to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "no line with {parts:?} in:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The daemon in its own process group with `--state-dir state` and
/// `--log-level info`; with `store`, as systemd starts a unit with an fd
/// store: `NOTIFY_SOCKET`, and the stored fds as `LISTEN_FDS` (from fd 3,
/// with `LISTEN_PID` set by the shell that then becomes the daemon).
fn spawn(share: &Path, sock: &Path, state: &Path, store: Option<&FdStore>) -> Daemon {
    let mut cmd = Command::new("/bin/sh");
    cmd.process_group(0)
        .arg("-c")
        .arg("LISTEN_PID=$$; export LISTEN_PID; exec \"$0\" \"$@\"")
        .arg(BIN)
        .arg("--socket-path")
        .arg(sock)
        .arg("--shared-dir")
        .arg(share)
        .arg("--state-dir")
        .arg(state)
        .args(["--thread-pool-size", "2", "--log-level", "info"])
        .env_remove("NOTIFY_SOCKET")
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_FDNAMES")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let copies = store.map(FdStore::copies).unwrap_or_default();
    if let Some(store) = store {
        cmd.env("NOTIFY_SOCKET", &store.path);
        if !copies.is_empty() {
            let names: Vec<&str> = copies.iter().map(|(_, n)| n.as_str()).collect();
            cmd.env("LISTEN_FDS", copies.len().to_string())
                .env("LISTEN_FDNAMES", names.join(":"));
        }
    }
    let raw: Vec<RawFd> = copies.iter().map(|(fd, _)| fd.as_raw_fd()).collect();
    // SAFETY: only dup2(2), async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            for (i, fd) in raw.iter().enumerate() {
                if libc::dup2(*fd, 3 + i as RawFd) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    drop(copies);
    let log = Arc::new(Mutex::new(String::new()));
    let mut err = child.stderr.take().unwrap();
    {
        let log = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                log.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
    }
    let d = Daemon { child, log };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        assert!(
            Instant::now() < deadline,
            "the daemon did not bind:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    d
}

/// SIGKILL to the daemon's process group (the sandbox's supervisor and
/// the serving process, as `systemctl kill -s KILL` does to a unit), then
/// waits until nothing listens on `sock` any more.
fn kill9(d: &mut Daemon, sock: &Path) {
    let pgid = -(d.child.id() as i32);
    // SAFETY: kill(2) on our own child's process group.
    let r = unsafe { libc::kill(pgid, libc::SIGKILL) };
    assert_eq!(r, 0);
    let _ = d.child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(sock).is_ok() {
        assert!(Instant::now() < deadline, "the killed daemon still listens");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn call(vmm: &mut FakeVmm, tag: u16, m: Tmessage) -> Rmessage {
    decode(&vmm.call(&frame(tag, m), 256, Layout::Direct).unwrap()).1
}

/// Walks `fid` from the root to `name` and opens it read-write.
fn open_rw(vmm: &mut FakeVmm, fid: u32, name: &str) {
    let walk = Tmessage::Walk(Twalk {
        fid: 0,
        newfid: fid,
        wnames: vec![name.as_bytes().to_vec()],
    });
    assert!(matches!(call(vmm, 20, walk), Rmessage::Walk(_)));
    let open = Tmessage::Lopen(Tlopen {
        fid,
        flags: OpenFlags::RDWR,
    });
    assert!(matches!(call(vmm, 21, open), Rmessage::Lopen(..)));
}

/// A non-blocking Tlock of the whole file on `fid`.
fn lock(vmm: &mut FakeVmm, fid: u32, ty: LockType) -> Rmessage {
    let m = Tmessage::Lock(Tlock {
        fid,
        ty,
        flags: LockFlags::empty(),
        start: 0,
        length: 0,
        proc_id: fid,
        client_id: b"guest".to_vec(),
    });
    call(vmm, 22, m)
}

/// Whether a host process can take a write lock on `path` now (it
/// releases it at once).
fn host_can_lock(path: &Path) -> bool {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    // SAFETY: a zeroed flock is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    // SAFETY: a valid fd and flock pointer for the call.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &fl) == 0 }
}

/// A host thread trying `F_OFD_SETLK` on a file without pause.
struct Poller {
    won: Arc<AtomicBool>,
    tries: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Poller {
    fn start(path: PathBuf) -> Poller {
        let won = Arc::new(AtomicBool::new(false));
        let tries = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (won, tries, stop) = (Arc::clone(&won), Arc::clone(&tries), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    if host_can_lock(&path) {
                        won.store(true, Ordering::Release);
                    }
                    tries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(200));
                }
            })
        };
        Poller {
            won,
            tries,
            stop,
            thread: Some(thread),
        }
    }

    fn won(&self) -> bool {
        self.won.load(Ordering::Acquire)
    }

    fn tries(&self) -> usize {
        self.tries.load(Ordering::Relaxed)
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A share with `lockme` and `f`, a run directory on a tmpfs holding the
/// socket, the state directory and the fd store's socket.
struct Setup {
    share: tempfile::TempDir,
    run: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let share = tempfile::tempdir().unwrap();
        let run = tempfile::tempdir_in(TMPFS).unwrap();
        std::fs::write(share.path().join("lockme"), b"x").unwrap();
        std::fs::write(share.path().join("other"), b"y").unwrap();
        std::fs::write(share.path().join("f"), b"f").unwrap();
        std::fs::create_dir(run.path().join("state")).unwrap();
        Setup { share, run }
    }

    fn sock(&self) -> PathBuf {
        self.run.path().join("vu.sock")
    }

    fn state(&self) -> PathBuf {
        self.run.path().join("state")
    }

    fn file(&self, name: &str) -> PathBuf {
        self.share.path().join(name)
    }

    fn spawn(&self, store: Option<&FdStore>) -> Daemon {
        spawn(self.share.path(), &self.sock(), &self.state(), store)
    }

    /// A guest with fid 2 open on `lockme` holding a write lock.
    fn guest_with_lock(&self) -> FakeVmm {
        let mut o = VmmOptions::default();
        o.mem_size = 16 << 20;
        o.queue_size = 256;
        let mut vmm = FakeVmm::connect(&self.sock(), o).unwrap();
        version(&mut vmm, 65536);
        attach_open(&mut vmm, "f", OpenFlags::RDONLY);
        open_rw(&mut vmm, 2, "lockme");
        assert_eq!(
            lock(&mut vmm, 2, LockType::Wrlck),
            Rmessage::Lock(LockStatus::Success)
        );
        assert!(!host_can_lock(&self.file("lockme")));
        vmm
    }
}

/// Reconnects as a frontend with `reconnect-ms` does and makes one call
/// (the restored session answers it).
fn rejoin(vmm: &mut FakeVmm, sock: &Path) {
    vmm.reconnect(sock).unwrap();
    let read = Tmessage::Read(Tread {
        fid: 1,
        offset: 0,
        count: 16,
    });
    assert_eq!(call(vmm, 9, read), Rmessage::Read(b"f".to_vec()));
}

#[test]
fn test_a_kept_lock_is_never_free_through_kill_and_restart() {
    let s = Setup::new();
    let store = FdStore::new(s.run.path().join("notify.sock"));
    let mut old = s.spawn(Some(&store));
    let mut vmm = s.guest_with_lock();
    store.wait_for("9p-lock-2", true);
    assert_eq!(store.names(), vec!["9p-lock-2".to_owned()]);

    let poller = Poller::start(s.file("lockme"));
    let before = poller.tries();
    kill9(&mut old, &s.sock());
    // The kill is long over; the lock is still held (by the store's copy).
    std::thread::sleep(Duration::from_millis(100));
    assert!(!poller.won(), "a host process took the lock after the kill");
    let new = s.spawn(Some(&store));
    rejoin(&mut vmm, &s.sock());
    new.wait_log(&["fid 2", "adopted its kept file description"]);
    assert!(
        poller.tries() > before + 10,
        "the poller did not run through the restart"
    );
    assert!(
        !poller.won(),
        "a host process took the lock through the restart"
    );

    // The guest still holds it: another open of the file (a second client
    // process) is refused, and so is the host.
    open_rw(&mut vmm, 5, "lockme");
    assert_eq!(
        lock(&mut vmm, 5, LockType::Wrlck),
        Rmessage::Lock(LockStatus::Blocked)
    );
    assert!(!poller.won());
    assert_eq!(
        lock(&mut vmm, 2, LockType::Wrlck),
        Rmessage::Lock(LockStatus::Success),
        "the guest's own lock"
    );
    assert!(!new.log().contains("taken again"), "{}", new.log());

    // The guest unlocks: the host gets the lock, the store lets go.
    assert_eq!(
        lock(&mut vmm, 2, LockType::Unlck),
        Rmessage::Lock(LockStatus::Success)
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !poller.won() {
        assert!(
            Instant::now() < deadline,
            "the host never got the released lock"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    store.wait_for("9p-lock-2", false);
}

/// A fid clunked while it holds a lock releases the lock at once, though
/// the store still had its file description a moment ago.
#[test]
fn test_a_clunked_fid_releases_its_kept_lock() {
    let s = Setup::new();
    let store = FdStore::new(s.run.path().join("notify.sock"));
    let _d = s.spawn(Some(&store));
    let mut vmm = s.guest_with_lock();
    store.wait_for("9p-lock-2", true);
    assert_eq!(
        call(&mut vmm, 7, Tmessage::Clunk(Tfid { fid: 2 })),
        Rmessage::Clunk
    );
    assert!(host_can_lock(&s.file("lockme")));
    store.wait_for("9p-lock-2", false);
}

#[test]
fn test_without_a_keeper_the_gap_is_logged() {
    let s = Setup::new();
    let mut old = s.spawn(None);
    old.wait_log(&["no lock keeper", "NOTIFY_SOCKET"]);
    let mut vmm = s.guest_with_lock();
    let poller = Poller::start(s.file("lockme"));
    kill9(&mut old, &s.sock());
    let new = s.spawn(None);
    rejoin(&mut vmm, &s.sock());
    // Taken again, or lost to the poller in the gap: logged either way.
    let line = new.wait_log(&["fid 2: lock"]);
    assert!(
        line.contains("no lock keeper held it through the restart") || line.contains("lost"),
        "{line}"
    );
    drop(poller);
}

/// A kept fd of another file under the fid's name: closed (its lock
/// released), the fid's lock taken again on a file opened again.
#[test]
fn test_a_kept_fd_of_another_file_is_refused() {
    let s = Setup::new();
    let store = FdStore::new(s.run.path().join("notify.sock"));
    let mut old = s.spawn(Some(&store));
    let mut vmm = s.guest_with_lock();
    kill9(&mut old, &s.sock());
    // The store's entry swapped for an fd of `other`, holding a lock.
    store.drop_name("9p-lock-2");
    let other = vhost_user_support::scenarios::hold_lock(&s.file("other"));
    store.put("9p-lock-2", OwnedFd::from(other));
    assert!(!host_can_lock(&s.file("other")));

    let new = s.spawn(Some(&store));
    rejoin(&mut vmm, &s.sock());
    let line = new.wait_log(&["fid 2", "its kept fd refused", "another file"]);
    assert!(line.contains("taken again"), "{line}");
    new.wait_log(&["fid 2: lock", "the lock keeper held no file description"]);
    assert!(
        host_can_lock(&s.file("other")),
        "the refused fd's lock stayed"
    );
    assert!(
        !host_can_lock(&s.file("lockme")),
        "the fid's lock was not taken again"
    );
    assert_eq!(
        lock(&mut vmm, 2, LockType::Wrlck),
        Rmessage::Lock(LockStatus::Success)
    );
    // Kept again, now the right file.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let fds = store.fds.lock().unwrap();
        let st = std::fs::metadata(s.file("lockme")).unwrap();
        let right = fds.iter().filter(|(n, _)| n == "9p-lock-2").all(|(_, fd)| {
            // SAFETY: a zeroed stat is a valid out value.
            let mut sb: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: a valid fd and out pointer.
            unsafe { libc::fstat(fd.as_raw_fd(), &mut sb) };
            use std::os::unix::fs::MetadataExt;
            sb.st_ino == st.ino()
        });
        if right && fds.iter().any(|(n, _)| n == "9p-lock-2") {
            break;
        }
        drop(fds);
        assert!(Instant::now() < deadline, "{:?}", store.names());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `LISTEN_FDS` with names that are not the daemon's, and one of its
/// names that no restored fid claims: closed with a log line each, the
/// unclaimed one's lock released; the daemon serves.
#[test]
fn test_garbage_and_unclaimed_listen_fds_are_closed() {
    let s = Setup::new();
    let store = FdStore::new(s.run.path().join("notify.sock"));
    for name in ["bogus", "9p-lock-x", "9p-lock-"] {
        let f = std::fs::File::open(s.file("f")).unwrap();
        store.put(name, OwnedFd::from(f));
    }
    let other = vhost_user_support::scenarios::hold_lock(&s.file("other"));
    store.put("9p-lock-7", OwnedFd::from(other));
    assert!(!host_can_lock(&s.file("other")));

    let d = s.spawn(Some(&store));
    for name in ["\"bogus\"", "\"9p-lock-x\"", "\"9p-lock-\""] {
        d.wait_log(&[name, "is not one of this daemon's", "closed"]);
    }
    d.wait_log(&["9p-lock-7", "belongs to no restored fid"]);
    // The daemon logs the line before it unlocks: give the unlock a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !host_can_lock(&s.file("other")) {
        assert!(Instant::now() < deadline, "the unclaimed fd's lock stayed");
        std::thread::sleep(Duration::from_millis(5));
    }
    store.wait_for("9p-lock-7", false);
    let mut vmm = FakeVmm::connect(&s.sock(), VmmOptions::default()).unwrap();
    assert_eq!(version(&mut vmm, 65536), 65536);
    assert!(!d.log().contains("panicked"), "{}", d.log());
}
