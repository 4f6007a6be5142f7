// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The documented syscall lists ([`virtio_9p_server::syscalls`]) against
//! a run: a child process builds a device (server, passthrough
//! filesystem, engine, request queue on a `MockDriver` ring), then installs
//! a seccomp filter that allows only the documented calls and traps on
//! anything else (a SIGSYS handler prints the syscall number and exits
//! with status 159). The device thread gets `DEVICE_THREAD` plus
//! `WORKER_THREAD`; each engine worker gets `WORKER_THREAD` from its
//! start hook. A representative workload then runs through the queue:
//! attach, walk, create, write, read, readdir, xattrs, locks (a blocking
//! one too), rename, link, symlink, mkdir, unlink, fsync, statfs, setattr,
//! Tflush, and the engine's teardown. Each combination runs: calls on
//! workers, the default policy (workers, with the short metadata calls of
//! the local export inline on the device thread) or every call inline on
//! the device thread, the passthrough from a path
//! (`/proc` path xattrs) or from fds (`*xattrat`).
//!
//! A socket child does the same for the socket transport: once the
//! listener, its socket threads and workers are up and the clients have
//! connected, every thread of the process gets a filter of `WORKER_THREAD`
//! plus `DEVICE_THREAD` (and `exit_group`, the test harness's own exit),
//! and a session runs spliced and copied Rreads, cached and uncached, a
//! client whose replies wait for the socket, a streamed Twrite, Tflush
//! and a hang-up with spliced replies pending.
//!
//! With the `daemon` feature, every child runs a second time under the
//! daemon's own filters (`src/daemon/sandbox/seccomp.rs`, compiled in as
//! the binary does): the process-wide list on the device thread (on every
//! thread for the socket child), the worker list on each worker. The
//! daemon builds them from the same lists, so this checks that its
//! argument checks and narrowing leave serving whole.
//!
//! To see what a child calls, run it without the filter under strace:
//! `SYSCALLS_CHILD=workers-fds SYSCALLS_NOFILTER=1 strace -f <this test
//! binary> --exact test_documented_syscalls_cover_a_run --nocapture`; the
//! lines after `MARK-START` (device thread) and `MARK-WORKER` (workers)
//! are the library's.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coro_pool::{PoolConfig, StackPool};
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
use virtio_9p_server::client::{Client, StreamTransport};
use virtio_9p_server::engine::{EngineConfig, OffloadPolicy};
use virtio_9p_server::protocol::*;
use virtio_9p_server::syscalls::{Syscall, DEVICE_THREAD, WORKER_THREAD};
use virtio_9p_server::transport::socket::{ListenAddr, Listener, SocketLimits};
use virtio_9p_server::virtio::RequestQueue;
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server, Session};
use virtqueue_large::mock::{guest_memory, Buf, ChainLayout, Layout, MockDriver};
use vm_memory::GuestMemoryMmap;

// The daemon's filters are the binary's code (src/daemon/sandbox/), not a
// library module: compiled in as the binary does.
#[cfg(feature = "daemon")]
#[allow(dead_code, unused_imports)]
#[path = "../src/daemon/error.rs"]
mod error;
#[cfg(feature = "daemon")]
#[allow(dead_code, unused_imports)]
#[path = "../src/daemon/sandbox/mod.rs"]
mod sandbox;

const CHILD: &str = "SYSCALLS_CHILD";
const OK: &str = "syscalls: child ok";

/// The filters of a child: of the library's lists alone, or the
/// daemon's (`daemon` true).
struct Filters {
    /// The device thread's (every thread's, for the socket child).
    device: BpfProgram,
    /// Each engine worker's.
    worker: BpfProgram,
}

impl Filters {
    fn new(daemon: bool, device: &[&[Syscall]]) -> Filters {
        if daemon {
            return Filters::daemon();
        }
        Filters {
            device: filter(device),
            worker: filter(&[WORKER_THREAD]),
        }
    }

    #[cfg(feature = "daemon")]
    fn daemon() -> Filters {
        use sandbox::seccomp::{build, build_thread, SeccompMode, ThreadKind};
        Filters {
            device: build(SeccompMode::Trap).unwrap().unwrap(),
            worker: build_thread(ThreadKind::Worker, SeccompMode::Trap)
                .unwrap()
                .unwrap(),
        }
    }

    #[cfg(not(feature = "daemon"))]
    fn daemon() -> Filters {
        unreachable!("the daemon's filters need the daemon feature")
    }
}

fn filter(lists: &[&[Syscall]]) -> BpfProgram {
    let rules: BTreeMap<i64, Vec<_>> = lists
        .iter()
        .flat_map(|l| l.iter())
        .map(|s| (s.nr, Vec::new()))
        .collect();
    let arch = TargetArch::try_from(std::env::consts::ARCH).unwrap();
    SeccompFilter::new(rules, SeccompAction::Trap, SeccompAction::Allow, arch)
        .unwrap()
        .try_into()
        .unwrap()
}

extern "C" fn on_sigsys(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // siginfo's _sigsys: the call address, then the syscall number, after
    // the 16-byte header on 64-bit.
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler;
    // the offset is inside it.
    let nr = unsafe {
        *(info
            .cast::<u8>()
            .add(16 + std::mem::size_of::<usize>())
            .cast::<i32>())
    };
    let mut msg = *b"syscalls: undocumented syscall 000\n";
    let n = msg.len();
    for (i, d) in [nr / 100, nr / 10, nr].into_iter().enumerate() {
        msg[n - 4 + i] = b'0' + (d % 10) as u8;
    }
    // SAFETY: write(2) and _exit(2) are async-signal-safe.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(128 + libc::SIGSYS);
    }
}

fn install_sigsys_handler() {
    // SAFETY: a zeroed sigaction is valid; the handler only makes
    // async-signal-safe calls.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigsys
            as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
            as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()), 0);
    }
}

struct Device {
    mem: Arc<GuestMemoryMmap<()>>,
    queue: virtio_queue::Queue,
    rq: RequestQueue<PassthroughFs>,
    driver: MockDriver<'static, GuestMemoryMmap<()>>,
}

impl Device {
    fn start(&mut self, tag: u16, m: &Tmessage, room: u32) -> ChainLayout {
        let frame = m.encode_frame(tag);
        let chain = self
            .driver
            .add_chain(Layout::Direct, &[Buf::r(frame.len() as u32), Buf::w(room)])
            .unwrap();
        self.driver.fill_readable(&chain, &frame).unwrap();
        self.rq
            .process(&mut self.queue, Arc::clone(&self.mem))
            .unwrap();
        chain
    }

    fn wait(&mut self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = 0;
        while got < n {
            assert!(Instant::now() < deadline, "no reply");
            self.rq.poll();
            self.rq.complete(&mut self.queue, &*self.mem).unwrap();
            got += self.driver.take_used().len();
            // Spin: a sleep or yield here would be the test's syscall,
            // not the library's.
            std::hint::spin_loop();
        }
    }

    fn reply(&self, chain: &ChainLayout) -> Rmessage {
        let bytes = self.driver.read_writable(chain).unwrap();
        let size = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        Rmessage::decode_frame(&bytes[..size], MAX_MSIZE).unwrap().1
    }

    /// Sends `m`, waits for its reply, and checks it is not an error.
    fn call(&mut self, m: Tmessage) -> Rmessage {
        let chain = self.start(1, &m, 16 << 10);
        self.wait(1);
        let r = self.reply(&chain);
        assert!(!matches!(r, Rmessage::Lerror(_)), "{m:?}: {r:?}");
        r
    }
}

fn walk(fid: u32, newfid: u32, names: &[&[u8]]) -> Tmessage {
    Tmessage::Walk(Twalk {
        fid,
        newfid,
        wnames: names.iter().map(|n| n.to_vec()).collect(),
    })
}

fn setattr(fid: u32, valid: SetattrMask) -> Tmessage {
    Tmessage::Setattr(Tsetattr {
        fid,
        valid,
        mode: 0o640,
        uid: 0,
        gid: 0,
        size: 3,
        atime_sec: 1,
        atime_nsec: 0,
        mtime_sec: 2,
        mtime_nsec: 0,
    })
}

fn lock(fid: u32, ty: LockType, flags: LockFlags) -> Tmessage {
    Tmessage::Lock(Tlock {
        fid,
        ty,
        flags,
        start: 0,
        length: 1,
        proc_id: 1,
        client_id: b"c".to_vec(),
    })
}

/// The child: everything from the first request to the engine's teardown
/// runs under the filter.
fn child(daemon: bool, mode: &str) {
    // "workers": every call on a worker (Always); "auto": workers with the
    // default policy, so the short metadata calls of a local export run
    // on the device thread; "inline": no workers.
    let workers = mode.starts_with("workers") || mode.starts_with("auto");
    let from_fds = mode.ends_with("fds");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data"), vec![7u8; 256 << 10]).unwrap();
    // Two walked files' fds at most: every request closes idle ones and
    // reopens its own, so those calls run under the filters too.
    let with_small_cache = |mut cfg: PassthroughConfig| {
        cfg.max_path_fds = 2;
        cfg
    };
    let fs = if from_fds {
        let root = std::fs::File::open(dir.path()).unwrap();
        let proc_fd = std::fs::File::open("/proc/self/fd").unwrap();
        PassthroughFs::from_fd(
            root.as_fd(),
            Some(proc_fd.as_fd()),
            with_small_cache(PassthroughConfig::new("")),
        )
    } else {
        PassthroughFs::new(with_small_cache(PassthroughConfig::new(dir.path())))
    }
    .unwrap();
    let Filters {
        device: device_filter,
        worker,
    } = Filters::new(daemon, &[WORKER_THREAD, DEVICE_THREAD]);
    let worker_filter = Arc::new(worker);
    install_sigsys_handler();

    let mem = Arc::new(guest_memory(16 << 20));
    let leaked: &'static GuestMemoryMmap<()> = Box::leak(Box::new((*mem).clone()));
    let driver = MockDriver::new(leaked, 256);
    let queue = driver.create_queue();
    let mut config = Config::default();
    config.lock_wait = Some(Duration::from_millis(50));
    let server = Arc::new(Server::new(fs, config).unwrap());
    let pool = Arc::new(StackPool::new(PoolConfig::default()).unwrap());
    let hook = Arc::clone(&worker_filter);
    let mut engine = EngineConfig::default();
    engine.workers = if workers { 2 } else { 0 };
    engine.max_in_flight = 64;
    engine.offload = if mode.starts_with("workers") {
        OffloadPolicy::Always
    } else {
        OffloadPolicy::Auto
    };
    engine.on_worker_start = Some(Arc::new(move || {
        if std::env::var_os("SYSCALLS_NOFILTER").is_none() {
            seccompiler::apply_filter(&hook).unwrap()
        } else {
            eprintln!("MARK-WORKER");
        }
    }));
    let rq = RequestQueue::new(server, Arc::new(Session::new()), pool, &engine, false).unwrap();
    let mut d = Device {
        mem,
        queue,
        rq,
        driver,
    };
    // From here on only the documented calls.
    if std::env::var_os("SYSCALLS_NOFILTER").is_none() {
        seccompiler::apply_filter(&device_filter).unwrap();
    } else {
        eprintln!("MARK-START");
    }

    d.call(Tmessage::Version(Tversion {
        msize: 128 << 10,
        version: VERSION_9P2000_L.to_vec(),
    }));
    d.call(Tmessage::Attach(Tattach {
        fid: 0,
        afid: NOFID,
        uname: b"root".to_vec(),
        aname: Vec::new(),
        n_uname: 0,
    }));
    d.call(Tmessage::Statfs(Tfid { fid: 0 }));
    // Create, write, fsync, read back (cold and cached), getattr.
    d.call(walk(0, 1, &[]));
    d.call(Tmessage::Lcreate(Tlcreate {
        fid: 1,
        name: b"f".to_vec(),
        flags: OpenFlags::RDWR,
        mode: 0o644,
        gid: 0,
    }));
    let r = d.call(Tmessage::Write(Twrite {
        fid: 1,
        offset: 0,
        data: b"hello".to_vec(),
    }));
    assert_eq!(r, Rmessage::Write(5));
    d.call(Tmessage::Fsync(Tfsync {
        fid: 1,
        datasync: 0,
    }));
    d.call(walk(0, 2, &[b"data"]));
    d.call(Tmessage::Lopen(Tlopen {
        fid: 2,
        flags: OpenFlags::RDONLY,
    }));
    for _ in 0..2 {
        let r = d.call(Tmessage::Read(Tread {
            fid: 2,
            offset: 4096,
            count: 8192,
        }));
        assert!(matches!(r, Rmessage::Read(v) if v.len() == 8192));
    }
    d.call(Tmessage::Getattr(Tgetattr {
        fid: 1,
        request_mask: GetattrMask::ALL,
    }));
    d.call(setattr(1, SetattrMask::MODE));
    d.call(setattr(1, SetattrMask::SIZE));
    d.call(setattr(
        1,
        SetattrMask::ATIME | SetattrMask::ATIME_SET | SetattrMask::MTIME | SetattrMask::MTIME_SET,
    ));
    // Xattrs: set (xattrcreate, write, clunk), get, list.
    d.call(walk(0, 3, &[b"f"]));
    d.call(Tmessage::Xattrcreate(Txattrcreate {
        fid: 3,
        name: b"user.k".to_vec(),
        attr_size: 1,
        flags: 0,
    }));
    let r = d.call(Tmessage::Write(Twrite {
        fid: 3,
        offset: 0,
        data: b"v".to_vec(),
    }));
    assert_eq!(r, Rmessage::Write(1));
    d.call(Tmessage::Clunk(Tfid { fid: 3 }));
    for name in [&b"user.k"[..], b""] {
        d.call(Tmessage::Xattrwalk(Txattrwalk {
            fid: 1,
            newfid: 4,
            name: name.to_vec(),
        }));
        d.call(Tmessage::Clunk(Tfid { fid: 4 }));
    }
    // Size 0 with XATTR_REPLACE removes it on the clunk.
    d.call(walk(0, 3, &[b"f"]));
    d.call(Tmessage::Xattrcreate(Txattrcreate {
        fid: 3,
        name: b"user.k".to_vec(),
        attr_size: 0,
        flags: libc::XATTR_REPLACE as u32,
    }));
    d.call(Tmessage::Clunk(Tfid { fid: 3 }));
    // Locks: take, test, a blocking attempt that waits on the timer and
    // gives up (another owner holds it), flushed, then unlock.
    d.call(lock(1, LockType::Wrlck, LockFlags::empty()));
    d.call(Tmessage::Getlock(Tgetlock {
        fid: 1,
        ty: LockType::Wrlck,
        start: 0,
        length: 1,
        proc_id: 2,
        client_id: b"c".to_vec(),
    }));
    d.call(walk(0, 5, &[b"f"]));
    d.call(Tmessage::Lopen(Tlopen {
        fid: 5,
        flags: OpenFlags::RDWR,
    }));
    let blocked = d.start(2, &lock(5, LockType::Wrlck, LockFlags::BLOCK), 64);
    let flush = d.start(3, &Tmessage::Flush(Tflush { oldtag: 2 }), 64);
    d.wait(2);
    assert_eq!(d.reply(&flush), Rmessage::Flush);
    let _ = d.reply(&blocked);
    d.call(lock(1, LockType::Unlck, LockFlags::empty()));
    // Names: mkdir, symlink, readlink, link, rename, renameat, readdir,
    // unlinkat, remove.
    d.call(Tmessage::Mkdir(Tmkdir {
        dfid: 0,
        name: b"d".to_vec(),
        mode: 0o755,
        gid: 0,
    }));
    d.call(Tmessage::Symlink(Tsymlink {
        fid: 0,
        name: b"s".to_vec(),
        symtgt: b"f".to_vec(),
        gid: 0,
    }));
    d.call(walk(0, 6, &[b"s"]));
    d.call(Tmessage::Readlink(Tfid { fid: 6 }));
    d.call(Tmessage::Link(Tlink {
        dfid: 0,
        fid: 1,
        name: b"l".to_vec(),
    }));
    d.call(Tmessage::Rename(Trename {
        fid: 6,
        dfid: 0,
        name: b"s2".to_vec(),
    }));
    d.call(Tmessage::Renameat(Trenameat {
        olddirfid: 0,
        oldname: b"l".to_vec(),
        newdirfid: 0,
        newname: b"l2".to_vec(),
    }));
    d.call(walk(0, 7, &[]));
    d.call(Tmessage::Lopen(Tlopen {
        fid: 7,
        flags: OpenFlags::RDONLY,
    }));
    d.call(Tmessage::Readdir(Treaddir {
        fid: 7,
        offset: 0,
        count: 8192,
    }));
    d.call(Tmessage::Unlinkat(Tunlinkat {
        dirfid: 0,
        name: b"d".to_vec(),
        flags: UnlinkFlags::REMOVEDIR,
    }));
    d.call(Tmessage::Unlinkat(Tunlinkat {
        dirfid: 0,
        name: b"l2".to_vec(),
        flags: UnlinkFlags::empty(),
    }));
    d.call(Tmessage::Remove(Tfid { fid: 6 }));
    d.call(Tmessage::Clunk(Tfid { fid: 1 }));
    // Teardown: the engine stops its workers.
    drop(d);
    eprintln!("{OK}");
}

/// The test harness's own exit, outside the library's lists.
const HARNESS_EXIT: &[Syscall] = &[Syscall {
    name: "exit_group",
    nr: libc::SYS_exit_group,
}];

fn sock_client(path: &std::path::Path) -> Client<StreamTransport<UnixStream>> {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    Client::new(StreamTransport(s))
}

fn sock_send(c: &mut Client<StreamTransport<UnixStream>>, tag: u16, m: &Tmessage) {
    c.transport().0.write_all(&m.encode_frame(tag)).unwrap();
}

fn sock_recv(c: &mut Client<StreamTransport<UnixStream>>) -> (u16, Rmessage) {
    let frame = c.transport().read_frame().unwrap();
    Rmessage::decode_frame(&frame, MAX_MSIZE).unwrap()
}

fn tread(fid: u32, offset: u64, count: u32) -> Tmessage {
    Tmessage::Read(Tread { fid, offset, count })
}

/// The socket child: a listener with its threads and workers, then every
/// thread under the documented lists.
fn socket_child(daemon: bool) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data"), vec![7u8; 2 << 20]).unwrap();
    std::fs::write(dir.path().join("cold"), vec![9u8; 1 << 20]).unwrap();
    let cold = std::fs::File::open(dir.path().join("cold")).unwrap();
    cold.sync_all().unwrap();
    // SAFETY: fadvise on an fd we hold; no memory is passed.
    unsafe { libc::posix_fadvise(cold.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let fs = PassthroughFs::new(PassthroughConfig::new(dir.path())).unwrap();
    let server = Arc::new(Server::new(fs, Config::default()).unwrap());
    let path = dir.path().join("9p.sock");
    let listener = Listener::bind(&ListenAddr::Unix(path.clone())).unwrap();
    let mut limits = SocketLimits::default();
    limits.threads = 1;
    limits.workers = 2;
    std::thread::spawn(move || listener.serve_with(server, limits));
    let mut c = sock_client(&path);
    let mut slow = sock_client(&path);
    let mut gone = sock_client(&path);
    c.version(MAX_MSIZE).unwrap();
    install_sigsys_handler();
    // From here on, on every thread, only the documented calls.
    if std::env::var_os("SYSCALLS_NOFILTER").is_none() {
        let f = Filters::new(daemon, &[WORKER_THREAD, DEVICE_THREAD, HARNESS_EXIT]);
        seccompiler::apply_filter_all_threads(&f.device).unwrap();
    } else {
        eprintln!("MARK-START");
    }
    c.attach(0, 0).unwrap();
    c.walk(0, 1, &[b"data"]).unwrap();
    c.lopen(1, OpenFlags::RDWR).unwrap();
    c.walk(0, 2, &[b"cold"]).unwrap();
    c.lopen(2, OpenFlags::RDONLY).unwrap();
    // Spliced (cached, and uncached on a worker) and copied Rreads.
    assert_eq!(c.read(1, 4096, 100_000).unwrap(), vec![7u8; 100_000]);
    assert_eq!(c.read(2, 0, 100_000).unwrap(), vec![9u8; 100_000]);
    assert_eq!(c.read(1, 0, 1000).unwrap(), vec![7u8; 1000]);
    // A streamed Twrite.
    assert_eq!(c.write(1, 0, &vec![7u8; 200_000]).unwrap(), 200_000);
    // Tflush of a read.
    sock_send(&mut c, 10, &tread(1, 0, 65_536));
    sock_send(&mut c, 11, &Tmessage::Flush(Tflush { oldtag: 10 }));
    loop {
        match sock_recv(&mut c) {
            (10, Rmessage::Read(_)) => {}
            (11, Rmessage::Flush) => break,
            r => panic!("{r:?}"),
        }
    }
    // A client whose replies wait for the socket (EAGAIN mid-splice).
    for (s, fid) in [(&mut slow, 5u32), (&mut gone, 6)] {
        s.version(MAX_MSIZE).unwrap();
        s.attach(0, 0).unwrap();
        s.walk(0, fid, &[b"data"]).unwrap();
        s.lopen(fid, OpenFlags::RDONLY).unwrap();
        for i in 0..8u16 {
            sock_send(s, 20 + i, &tread(fid, u64::from(i) * 200_000, 200_000));
        }
    }
    std::thread::sleep(Duration::from_millis(100));
    for _ in 0..8 {
        assert!(matches!(sock_recv(&mut slow), (_, Rmessage::Read(d)) if d.len() == 200_000));
    }
    // A hang-up with spliced replies pending.
    drop(gone);
    c.getattr(1).unwrap();
    c.clunk(1).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(slow.getattr(0).is_ok());
    eprintln!("{OK}");
}

fn run(mode: &str) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "test_documented_syscalls_cover_a_run",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, mode)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains(OK),
        "{mode}: {:?}\n{err}",
        out.status
    );
}

#[test]
fn test_documented_syscalls_cover_a_run() {
    if let Ok(mode) = std::env::var(CHILD) {
        let (daemon, mode) = match mode.strip_prefix("daemon-") {
            Some(m) => (true, m),
            None => (false, mode.as_str()),
        };
        if mode == "socket" {
            socket_child(daemon);
        } else {
            child(daemon, mode);
        }
        return;
    }
    let modes = [
        "socket",
        "workers-path",
        "workers-fds",
        "auto-path",
        "auto-fds",
        "inline-path",
        "inline-fds",
    ];
    for mode in modes {
        run(mode);
    }
    if cfg!(feature = "daemon") {
        for mode in modes {
            run(&format!("daemon-{mode}"));
        }
    }
}
