// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Shared helpers of the tests that run the hardened binary: a daemon
//! process that is stopped on drop, and a socket-mode session to it.
#![allow(dead_code)]

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use virtio_9p_server::client::{Client, StreamTransport};
use virtio_9p_server::protocol::{
    DirEntry, OpenFlags as of, Rmessage, Tattach, Tmessage, Tversion,
};
use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout, VmmOptions};

/// The daemon binary of this package.
pub const BIN: &str = env!("CARGO_BIN_EXE_virtio-9p-server");
/// Every `--sandbox` mode.
pub const MODES: [&str; 3] = ["namespace", "chroot", "none"];
/// The msize the sessions ask for.
pub const SESSION_MSIZE: u32 = 256 << 10;

/// A running daemon; stopped with SIGTERM (then SIGKILL) on drop.
pub struct Daemon {
    child: Option<Child>,
    /// Its stderr, written to a file.
    pub log: PathBuf,
}

impl Daemon {
    /// Starts the binary with `args`, stderr into `log`.
    pub fn spawn(args: &[&str], log: PathBuf) -> Daemon {
        Self::spawn_with(Command::new(BIN).args(args), log)
    }

    /// Starts `cmd`, stderr into `log`.
    pub fn spawn_with(cmd: &mut Command, log: PathBuf) -> Daemon {
        Self::spawn_stdin(cmd.stdin(Stdio::null()), log)
    }

    /// Starts `cmd` with the stdin it was given (a pipe, say), stderr into
    /// `log`.
    pub fn spawn_stdin(cmd: &mut Command, log: PathBuf) -> Daemon {
        let f = std::fs::File::create(&log).unwrap();
        let child = cmd.stdout(Stdio::null()).stderr(f).spawn().unwrap();
        Daemon {
            child: Some(child),
            log,
        }
    }

    /// The stdin pipe of a daemon started with [`Daemon::spawn_stdin`].
    pub fn stdin(&mut self) -> Option<std::process::ChildStdin> {
        self.child.as_mut().unwrap().stdin.take()
    }

    /// The pid of the started process (the supervisor in namespace mode).
    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// What it wrote on stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process that serves: in namespace mode the child of the
    /// supervising parent.
    pub fn server_pid(&self, mode: &str) -> i32 {
        let pid = self.pid();
        if mode != "namespace" {
            return pid;
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            if let Some(c) = children.split_whitespace().next() {
                return c.parse().unwrap();
            }
            if Instant::now() > deadline {
                return pid;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The exit status, if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().unwrap().try_wait().unwrap()
    }

    /// Waits for the exit (20 s at most).
    pub fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.try_wait() {
                self.child = None;
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "daemon did not exit: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then waits for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        self.wait()
    }

    /// Waits for `path` to appear while the daemon lives; `false` (with
    /// the daemon reaped) if it exited first.
    pub fn wait_for(&mut self, path: &Path) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !path.exists() {
            if self.try_wait().is_some() {
                self.child = None;
                return false;
            }
            assert!(
                Instant::now() < deadline,
                "no {}: {}",
                path.display(),
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Waits until the hook output or startup log holds `needle`.
    pub fn wait_log(&mut self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.stderr().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Asserts that the daemon still runs (a syscall outside the seccomp
    /// list would have killed it), then stops it and asserts exit 0.
    pub fn assert_alive_then_stop(mut self, what: &str) {
        assert!(
            self.try_wait().is_none(),
            "{what}: the daemon died: {}",
            self.stderr()
        );
        let st = self.terminate();
        assert_eq!(st.code(), Some(0), "{what}: {st:?} {}", self.stderr());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Prints a skip notice and returns true when the daemon could not create
/// its namespaces.
pub fn no_namespaces(d: &Daemon, what: &str) -> bool {
    if d.stderr().contains("cannot create namespaces") {
        eprintln!(
            "SKIP {what}: namespaces cannot be created here: {}",
            d.stderr()
        );
        return true;
    }
    false
}

/// Starts the socket daemon serving `export` on the unix socket `sock`
/// in sandbox `mode` under `--seccomp kill`, plus `extra`; waits until it
/// is confined. `None` (after a notice) when namespace mode is impossible
/// here.
pub fn socket_daemon(
    export: &Path,
    sock: &Path,
    log: PathBuf,
    mode: &str,
    extra: &[&str],
) -> Option<Daemon> {
    let listen = format!("unix:{}", sock.display());
    let mut args = vec![
        "--shared-dir",
        export.to_str().unwrap(),
        "--listen",
        &listen,
        "--sandbox",
        mode,
        "--seccomp",
        "kill",
        "--log-level",
        "debug",
    ];
    args.extend_from_slice(extra);
    let mut d = Daemon::spawn(&args, log);
    if !d.wait_for(sock) {
        if no_namespaces(&d, "namespace mode") {
            return None;
        }
        panic!("daemon ({mode}) exited: {}", d.stderr());
    }
    // The socket is bound before the sandbox: wait until it is set up.
    d.wait_log("capabilities [");
    Some(d)
}

/// A 9P client over a unix socket.
pub type SockClient = Client<StreamTransport<UnixStream>>;

/// A session on `sock`: version (256 KiB msize) and attach as uid 0 on
/// `root_fid`.
pub fn session(sock: &Path, root_fid: u32) -> SockClient {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut c = Client::new(StreamTransport(s));
    c.version(SESSION_MSIZE).unwrap();
    c.attach(root_fid, 0).unwrap();
    c
}

/// Tversion over vhost-user; returns the granted msize.
pub fn version(vmm: &mut FakeVmm, msize: u32) -> u32 {
    let req = Tmessage::Version(Tversion {
        msize,
        version: b"9P2000.L".to_vec(),
    })
    .encode_frame(0xffff);
    match Rmessage::decode_frame(&vmm.call(&req, 64, Layout::Direct).unwrap(), 128 << 20)
        .unwrap()
        .1
    {
        Rmessage::Version(v) => v.msize,
        other => panic!("unexpected {other:?}"),
    }
}

/// One request over vhost-user with room for a `reply`-byte answer.
pub fn vcall(vmm: &mut FakeVmm, tag: u16, msg: Tmessage, reply: u32) -> Rmessage {
    let r = vmm
        .call(&msg.encode_frame(tag), reply, Layout::Direct)
        .unwrap();
    Rmessage::decode_frame(&r, 128 << 20).unwrap().1
}

/// The mount sequence over vhost-user (version, attach, walk, lopen, read,
/// write, readdir, clunk) against the binary; the export must hold
/// `hello` with `hello world`, which becomes `HELLO world`.
pub fn vhost_mount_sequence(sock: &Path) {
    use virtio_9p_server::protocol::{Tfid, Tlopen, Tread, Treaddir, Twalk, Twrite};
    let mut vmm = FakeVmm::connect(sock, VmmOptions::default()).unwrap();
    assert_eq!(version(&mut vmm, 512 << 10), 512 << 10);
    let attach = Tmessage::Attach(Tattach {
        fid: 0,
        afid: u32::MAX,
        uname: b"root".to_vec(),
        aname: Vec::new(),
        n_uname: 0,
    });
    assert!(matches!(
        vcall(&mut vmm, 1, attach, 64),
        Rmessage::Attach(_)
    ));
    let walk = |fid, newfid, n: &[u8]| {
        Tmessage::Walk(Twalk {
            fid,
            newfid,
            wnames: vec![n.to_vec()],
        })
    };
    assert!(matches!(
        vcall(&mut vmm, 2, walk(0, 1, b"hello"), 256),
        Rmessage::Walk(_)
    ));
    let lopen = Tmessage::Lopen(Tlopen {
        fid: 1,
        flags: of::RDWR,
    });
    assert!(matches!(vcall(&mut vmm, 3, lopen, 64), Rmessage::Lopen(..)));
    let write = Tmessage::Write(Twrite {
        fid: 1,
        offset: 0,
        data: b"HELLO".to_vec(),
    });
    assert!(matches!(vcall(&mut vmm, 4, write, 64), Rmessage::Write(_)));
    let read = Tmessage::Read(Tread {
        fid: 1,
        offset: 0,
        count: 64,
    });
    match vcall(&mut vmm, 5, read, 4096) {
        Rmessage::Read(r) => assert_eq!(r, b"HELLO world"),
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        vcall(&mut vmm, 6, walk(0, 2, b"."), 256),
        Rmessage::Walk(_)
    ));
    let lopen = Tmessage::Lopen(Tlopen {
        fid: 2,
        flags: of::RDONLY | of::DIRECTORY,
    });
    assert!(matches!(vcall(&mut vmm, 7, lopen, 64), Rmessage::Lopen(..)));
    let readdir = Tmessage::Readdir(Treaddir {
        fid: 2,
        offset: 0,
        count: 8192,
    });
    match vcall(&mut vmm, 8, readdir, 16384) {
        Rmessage::Readdir(r) => {
            let entries = DirEntry::decode_all(&r).unwrap();
            assert!(entries.iter().any(|e| e.name == b"hello"), "{entries:?}")
        }
        other => panic!("unexpected {other:?}"),
    }
    for (tag, fid) in [(9, 1), (10, 2)] {
        let clunk = Tmessage::Clunk(Tfid { fid });
        assert!(matches!(vcall(&mut vmm, tag, clunk, 64), Rmessage::Clunk));
    }
}
