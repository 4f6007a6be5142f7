// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! What a VMM does around the data path, through a vhost-user frontend on
//! both ring layouts:
//!
//! - a pause (GET_VRING_BASE, as QEMU's `stop`) drains: every request in
//!   flight is answered on the used ring before the base comes back, slow
//!   calls after they return; waiting Tlocks stay in flight, written
//!   nowhere while stopped, and are granted as soon as the host frees the
//!   lock after `cont`; if the ring comes back as another guest's, they
//!   are discarded without a write;
//! - RESET_DEVICE ends every request and drops the session;
//! - a request given up on by a reset never writes guest memory, nor
//!   reads it (a Twrite's data), even when its filesystem call returns
//!   afterwards.

mod common;
#[macro_use]
mod vhost_user_support;

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use common::Gate;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vhost_user_support::scenarios::{
    attach, attach_open, blocking_lock, hold_lock, ofd_lock, Ring,
};
use vhost_user_support::*;
use virtio_9p_server::engine::OffloadPolicy;
use virtio_9p_server::fs::{Cred, Filesystem};
use virtio_9p_server::protocol::*;
use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout, Submitted, VmmOptions};
use virtio_9p_server::vhost_user::{Daemon, DaemonConfig, Listen, StopHandle};
use virtio_9p_server::{Config, ReplyWriter, RequestReader, Server};
use virtqueue_large::mock::UsedEntry;
use vm_memory::{Bytes, GuestAddress};

/// How long a reset waits for a running call before giving up on it.
const QUIESCE: Duration = Duration::from_millis(300);

/// An in-process daemon over any filesystem.
struct Device {
    socket: PathBuf,
    _sock_dir: tempfile::TempDir,
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
}

impl Device {
    fn start<F: Filesystem + 'static>(fs: F, offload: OffloadPolicy) -> (Device, Arc<Server<F>>) {
        let sock_dir = tempfile::tempdir().unwrap();
        let socket = sock_dir.path().join("vu.sock");
        let server = Arc::new(Server::new(fs, Config::default()).unwrap());
        let mut config = DaemonConfig::default();
        config.listen = Listen::Path(socket.clone());
        config.backend.queue_size = 64;
        config.backend.engine.workers = 2;
        config.backend.engine.max_in_flight = 64;
        config.backend.engine.offload = offload;
        config.backend.engine.quiesce_timeout = QUIESCE;
        let mut daemon = Daemon::new(Arc::clone(&server), config).unwrap();
        let stop = daemon.stop_handle();
        let thread = std::thread::spawn(move || daemon.run().unwrap());
        let dev = Device {
            socket,
            _sock_dir: sock_dir,
            stop,
            thread: Some(thread),
        };
        (dev, server)
    }

    fn connect(&self, ring: Ring) -> FakeVmm {
        let mut o = VmmOptions::default();
        o.mem_size = 16 << 20;
        o.queue_size = 64;
        FakeVmm::connect(&self.socket, ring.opts(o)).unwrap()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The pattern a late call tries to write into guest memory.
const LATE: u8 = 0xab;

/// One directory and one file whose read waits for the gate, then writes
/// [`LATE`] bytes into the reply and records what that write returned;
/// whose getattr takes `slow_getattr`; whose fsync waits for a pass of
/// `fsync`.
struct GatedFs {
    gate: Arc<Gate>,
    fsync: Arc<Turnstile>,
    late_write: Arc<Mutex<Option<io::Result<()>>>>,
    /// Where a Twrite's data goes, and what the write returned.
    sink: Arc<tempfile::NamedTempFile>,
    late_read: Arc<Mutex<Option<io::Result<usize>>>>,
    slow_getattr: Duration,
}

impl GatedFs {
    fn new(slow_getattr: Duration) -> Self {
        GatedFs {
            gate: Arc::default(),
            fsync: Arc::default(),
            late_write: Arc::default(),
            sink: Arc::new(tempfile::NamedTempFile::new().unwrap()),
            late_read: Arc::default(),
            slow_getattr,
        }
    }
}

impl Filesystem for GatedFs {
    type Inode = ();
    type File = ();

    fn attach(&self, _: &[u8], _: Cred) -> io::Result<((), Qid)> {
        Ok(((), Qid::default()))
    }
    fn walk(&self, _: &(), _: &[u8]) -> io::Result<((), Qid)> {
        Ok(((), Qid::default()))
    }
    fn getattr(&self, _: &(), _: GetattrMask) -> io::Result<Rgetattr> {
        std::thread::sleep(self.slow_getattr);
        Ok(Rgetattr::default())
    }
    fn open(&self, _: &(), _: OpenFlags) -> io::Result<((), Qid)> {
        Ok(((), Qid::default()))
    }
    fn fsync(&self, _: &(), _: bool) -> io::Result<()> {
        self.fsync.enter();
        Ok(())
    }
    fn read<W: ReplyWriter>(&self, _: &(), w: &mut W, count: usize, _: u64) -> io::Result<usize> {
        self.gate.wait();
        let r = w.write_all(&vec![LATE; count]);
        let ok = r.is_ok();
        *self.late_write.lock().unwrap() = Some(r);
        if ok {
            Ok(count)
        } else {
            Err(io::Error::from_raw_os_error(libc::EIO))
        }
    }
    fn write<R: RequestReader>(
        &self,
        _: &(),
        r: &mut R,
        count: usize,
        _: u64,
    ) -> io::Result<usize> {
        use std::os::fd::AsFd;
        self.gate.wait();
        let res = r.read_to_file_at(self.sink.as_file().as_fd(), count, 0);
        let out = match &res {
            Ok(n) => Ok(*n),
            Err(e) => Err(io::Error::from_raw_os_error(
                e.raw_os_error().unwrap_or(libc::EIO),
            )),
        };
        *self.late_read.lock().unwrap() = Some(res);
        out
    }
}

fn getattr(tag: u16, fid: u32) -> Vec<u8> {
    frame(
        tag,
        Tmessage::Getattr(Tgetattr {
            fid,
            request_mask: GetattrMask::BASIC,
        }),
    )
}

/// Waits for `n` used entries (at most 20 s).
fn wait_n(vmm: &mut FakeVmm, n: usize) -> Vec<UsedEntry> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < n && Instant::now() < deadline {
        out.extend(vmm.wait_used(Duration::from_millis(200)).unwrap());
    }
    out
}

/// What a call the test held in the filesystem returned, once it did.
fn late_result<T>(slot: &Mutex<Option<T>>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(r) = slot.lock().unwrap().take() {
            return r;
        }
        assert!(Instant::now() < deadline, "the late call returned");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A new driver after a reset is served: a session and a Tgetattr.
fn next_driver_is_served(vmm: &mut FakeVmm) {
    version(vmm, 65536);
    attach_open(vmm, "file", OpenFlags::RDONLY);
    let r = decode(&vmm.call(&getattr(3, 1), 256, Layout::Direct).unwrap());
    assert!(matches!(r.1, Rmessage::Getattr(_)), "{r:?}");
}

/// A Twrite of 8 KiB of 0x11 at offset 0 of fid 1.
fn twrite_8k(tag: u16) -> Vec<u8> {
    frame(
        tag,
        Tmessage::Write(Twrite {
            fid: 1,
            offset: 0,
            data: vec![0x11; 8192],
        }),
    )
}

/// A daemon, a host process holding the lock of its file "lockme", and a
/// fake VMM whose guest has `n` blocking Tlocks on that file waiting.
fn waiting_locks(ring: Ring, n: u16) -> (TestDaemon, std::fs::File, FakeVmm, Vec<Submitted>) {
    let d = TestDaemon::start_with(2, 64, OffloadPolicy::Auto);
    let path = d.dir.path().join("lockme");
    std::fs::write(&path, b"x").unwrap();
    let holder = hold_lock(&path);
    let mut vmm = d.connect(ring.opts({
        let mut o = VmmOptions::default();
        o.mem_size = 16 << 20;
        o.queue_size = 64;
        o
    }));
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "lockme", OpenFlags::RDWR);
    let subs: Vec<_> = (100..100 + n)
        .map(|tag| vmm.submit(&blocking_lock(tag), 64, Layout::Direct).unwrap())
        .collect();
    vmm.kick().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    (d, holder, vmm, subs)
}

/// QEMU's `stop` then `cont` with 8 blocking Tlocks waiting on a lock the
/// host holds: GET_VRING_BASE reports them taken (the driver's base) and
/// leaves them in flight; nothing is written while the ring is stopped;
/// when the host frees the lock after `cont`, every waiter is granted at
/// once (not after the client's 30 s lock timeout), exactly once. The
/// session goes on.
fn pause_keeps_waiting_locks_and_the_session(ring: Ring) {
    let (d, holder, mut vmm, subs) = waiting_locks(ring, 8);
    assert!(vmm.collect_used().unwrap().is_empty(), "the locks wait");

    let expected = vmm.driver_ring_base();
    let t0 = Instant::now();
    let base = vmm.stop_ring().unwrap();
    // Generous bounds: they catch a stop that waits for the locks and a
    // grant after a lock timeout (Linux: 30 s), not speed.
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "the stop did not wait for the locks"
    );
    assert_eq!(base, expected, "the waiters count as taken");
    // Suspended: nothing reaches the ring or the reply buffers.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        vmm.collect_used().unwrap().is_empty(),
        "a waiter was answered at the stop"
    );

    // `cont`: same ring, same session, no kick.
    vmm.resume_ring(base).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        vmm.collect_used().unwrap().is_empty(),
        "the locks still wait"
    );
    let released = Instant::now();
    ofd_lock(&holder, libc::F_UNLCK);
    let used = wait_n(&mut vmm, subs.len());
    let waited = released.elapsed();
    assert_eq!(
        used.len(),
        subs.len(),
        "every waiter answered after the release"
    );
    assert!(
        waited < Duration::from_secs(10),
        "granted {waited:?} after the release"
    );
    for u in &used {
        let sub = subs.iter().find(|s| u32::from(s.head) == u.id).unwrap();
        let reply = decode(&vmm.read(sub.reply_addr, u.len as usize).unwrap());
        assert_eq!(reply.1, Rmessage::Lock(LockStatus::Success), "{reply:?}");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        vmm.collect_used().unwrap().is_empty(),
        "a waiter was answered twice"
    );
    let r = decode(&vmm.call(&getattr(7, 1), 256, Layout::Direct).unwrap());
    assert!(matches!(r.1, Rmessage::Getattr(_)), "{r:?}");
    drop(vmm);
    d.stop();
}

/// A pause keeps waiting Tlocks, then the ring comes back as a new
/// guest's (a reboot without RESET_DEVICE: fresh rings at base 0): the
/// kept requests are discarded: when the host frees the lock, nothing is
/// written into the old reply buffers (which the new guest reuses) and no
/// used entry appears; the new ring is served.
fn pause_then_another_guest_discards_the_waiters(ring: Ring) {
    let (d, holder, mut vmm, subs) = waiting_locks(ring, 4);
    vmm.stop_ring().unwrap();
    assert!(vmm.collect_used().unwrap().is_empty());
    // The new guest's data where the old replies would go.
    for s in &subs {
        vmm.memory()
            .write_slice(&[0x77; 64], GuestAddress(s.reply_addr))
            .unwrap();
    }
    vmm.restart_ring().unwrap();
    ofd_lock(&holder, libc::F_UNLCK);
    std::thread::sleep(Duration::from_millis(500));
    for s in &subs {
        let now = vmm.read(s.reply_addr, 64).unwrap();
        assert!(
            now.iter().all(|b| *b == 0x77),
            "a dead guest's reply was written"
        );
    }
    assert!(
        vmm.collect_used().unwrap().is_empty(),
        "a dead guest's reply came back"
    );
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "lockme", OpenFlags::RDWR);
    let r = decode(&vmm.call(&blocking_lock(9), 64, Layout::Direct).unwrap());
    assert_eq!(r.1, Rmessage::Lock(LockStatus::Success), "{r:?}");
    drop(vmm);
    d.stop();
}

/// A pause while a slow call runs on a worker: GET_VRING_BASE waits for
/// it (however long it takes), and its reply is on the used ring when the
/// base comes back.
fn pause_waits_for_a_running_call(ring: Ring) {
    let slow = Duration::from_millis(1500);
    let (d, _server) = Device::start(GatedFs::new(slow), OffloadPolicy::Auto);
    let mut vmm = d.connect(ring);
    version(&mut vmm, 65536);
    attach(&mut vmm);
    let sub = vmm.submit(&getattr(2, 0), 256, Layout::Direct).unwrap();
    vmm.kick().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    vmm.stop_ring().unwrap();
    let waited = t0.elapsed();
    let used = vmm.collect_used().unwrap();
    assert_eq!(used.len(), 1, "the reply is on the ring at the stop");
    let reply = decode(&vmm.read(sub.reply_addr, used[0].len as usize).unwrap());
    assert!(matches!(reply.1, Rmessage::Getattr(_)), "{reply:?}");
    // It cannot have answered before the call returned.
    assert!(waited >= slow / 2, "stopped after {waited:?}");
}

/// RESET_DEVICE while a read is stuck in the filesystem past the bound:
/// the reset gives up on it; when the call returns and writes its data,
/// the guest memory of the old reply buffer (reused by the guest after
/// the reset) is unchanged, and the device serves the next driver.
fn reset_never_lets_a_late_call_write_guest_memory(ring: Ring) {
    let fs = GatedFs::new(Duration::ZERO);
    let gate = Arc::clone(&fs.gate);
    let late_write = Arc::clone(&fs.late_write);
    // Every call on a worker, as for a filesystem on a peer.
    let (d, _server) = Device::start(fs, OffloadPolicy::Always);
    let mut vmm = d.connect(ring);
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "file", OpenFlags::RDONLY);
    let read = frame(
        9,
        Tmessage::Read(Tread {
            fid: 1,
            offset: 0,
            count: 4096,
        }),
    );
    let sub = vmm.submit(&read, 4096 + 11, Layout::Direct).unwrap();
    vmm.kick().unwrap();
    gate.wait_entered(1);

    let t0 = Instant::now();
    vmm.reset_device().unwrap();
    assert!(
        t0.elapsed() >= QUIESCE,
        "the reset waited for the call first"
    );
    // The guest reuses the old reply buffer.
    let addr = GuestAddress(sub.reply_addr);
    let len = sub.reply_len as usize;
    vmm.memory().write_slice(&vec![0x22; len], addr).unwrap();

    // The call returns late and tries to write.
    gate.open();
    let r = late_result(&late_write);
    assert!(r.is_err(), "the late write was refused");
    std::thread::sleep(Duration::from_millis(100));
    let mut now = vec![0u8; len];
    vmm.memory().read_slice(&mut now, addr).unwrap();
    assert!(now.iter().all(|b| *b == 0x22), "guest memory changed");

    // The next driver is served.
    next_driver_is_served(&mut vmm);
}

/// RESET_DEVICE while a Twrite is stuck in the filesystem past the bound,
/// before it wrote its data: when the call goes on, it reads nothing of
/// the guest's buffer (reused by the guest after the reset): the write
/// fails and the file gets none of the guest's new bytes.
fn reset_never_lets_a_late_call_read_guest_memory(ring: Ring) {
    let fs = GatedFs::new(Duration::ZERO);
    let gate = Arc::clone(&fs.gate);
    let late_read = Arc::clone(&fs.late_read);
    let sink = Arc::clone(&fs.sink);
    let (d, _server) = Device::start(fs, OffloadPolicy::Always);
    let mut vmm = d.connect(ring);
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "file", OpenFlags::WRONLY);
    let write = twrite_8k(9);
    let sub = vmm.submit(&write, 64, Layout::Direct).unwrap();
    vmm.kick().unwrap();
    gate.wait_entered(1);

    vmm.reset_device().unwrap();
    // The guest reuses the request's buffer.
    let secret = vec![0x5e; write.len()];
    vmm.memory()
        .write_slice(&secret, GuestAddress(sub.request_addr))
        .unwrap();

    gate.open();
    let r = late_result(&late_read);
    let data = std::fs::read(sink.path()).unwrap();
    assert!(
        !data.contains(&0x5e),
        "the late call read the guest's reused buffer ({} bytes went to the file)",
        data.len()
    );
    assert!(r.is_err(), "the late read was refused: {r:?}");

    next_driver_is_served(&mut vmm);
}

/// A pause (GET_VRING_BASE) while a Twrite and a Tread are stuck on
/// workers before touching their buffers: the base comes back only after
/// both calls went through guest memory and their replies are on the
/// ring, so nothing reads or writes the guest's buffers after it.
fn pause_waits_for_calls_holding_guest_memory(ring: Ring) {
    let fs = GatedFs::new(Duration::ZERO);
    let gate = Arc::clone(&fs.gate);
    let late_read = Arc::clone(&fs.late_read);
    let late_write = Arc::clone(&fs.late_write);
    let (d, _server) = Device::start(fs, OffloadPolicy::Always);
    let mut vmm = d.connect(ring);
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "file", OpenFlags::RDWR);
    let write = twrite_8k(9);
    let read = frame(
        10,
        Tmessage::Read(Tread {
            fid: 1,
            offset: 0,
            count: 4096,
        }),
    );
    vmm.submit(&write, 64, Layout::Direct).unwrap();
    vmm.submit(&read, 4096 + 11, Layout::Direct).unwrap();
    vmm.kick().unwrap();
    gate.wait_entered(2);
    let hold = Duration::from_millis(500);
    let opener = std::thread::spawn(move || {
        std::thread::sleep(hold);
        gate.open();
    });
    let t0 = Instant::now();
    vmm.stop_ring().unwrap();
    let waited = t0.elapsed();
    // Both calls finished with guest memory before the base came back.
    assert!(waited >= hold / 2, "stopped after {waited:?}");
    assert!(
        matches!(*late_read.lock().unwrap(), Some(Ok(8192))),
        "the Twrite read its data before the stop"
    );
    assert!(
        matches!(*late_write.lock().unwrap(), Some(Ok(()))),
        "the Tread wrote its data before the stop"
    );
    let used = vmm.collect_used().unwrap();
    assert_eq!(used.len(), 2, "both replies are on the ring at the stop");
    opener.join().unwrap();
}

/// A daemon over a passthrough export keeping its state in a directory.
fn stateful_device(export: &std::path::Path, state: &std::path::Path) -> Device {
    use virtio_9p_server::{PassthroughConfig, PassthroughFs};
    let sock_dir = tempfile::tempdir().unwrap();
    let socket = sock_dir.path().join("vu.sock");
    let fs = PassthroughFs::new(PassthroughConfig::new(export)).unwrap();
    let server = Arc::new(Server::new(fs, Config::default()).unwrap());
    let mut config = DaemonConfig::default();
    config.listen = Listen::Path(socket.clone());
    config.backend.queue_size = 64;
    config.backend.engine.workers = 2;
    config.backend.engine.max_in_flight = 64;
    config.backend.state_dir = Some(Arc::new(std::fs::File::open(state).unwrap().into()));
    let mut daemon = Daemon::new(server, config).unwrap();
    let stop = daemon.stop_handle();
    let thread = std::thread::spawn(move || daemon.run().unwrap());
    Device {
        socket,
        _sock_dir: sock_dir,
        stop,
        thread: Some(thread),
    }
}

/// The in-flight table file: its queue size and the positions of the
/// slots in use.
fn table_file(state: &std::path::Path) -> (u32, Vec<u32>) {
    let b = std::fs::read(state.join("session.inflight")).unwrap();
    let size = u32::from_le_bytes(b[12..16].try_into().unwrap());
    let mut pos = Vec::new();
    let mut at = 64;
    while at + 256 <= b.len() {
        let c = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        if c & 0x0f != 0 {
            pos.push((c >> 32) as u32);
        }
        at += 256;
    }
    (size, pos)
}

/// A ring stopped, then started again with another size (SET_VRING_NUM
/// after a guest reboot; no RESET_DEVICE): the in-flight table follows
/// the new size, so 40 chains in flight on a 64-entry ring each have a
/// slot of their own (a 32-slot table would make them collide).
fn a_ring_resized_after_a_stop_gets_a_table_of_its_size(ring: Ring) {
    let export = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    std::fs::write(export.path().join("lockme"), b"x").unwrap();
    let holder = hold_lock(&export.path().join("lockme"));
    let d = stateful_device(export.path(), state.path());
    let mut vmm = {
        let mut o = VmmOptions::default();
        o.mem_size = 16 << 20;
        o.queue_size = 32;
        FakeVmm::connect(&d.socket, ring.opts(o)).unwrap()
    };
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "lockme", OpenFlags::RDWR);
    assert_eq!(table_file(state.path()).0, 32);
    vmm.stop_ring().unwrap();
    vmm.set_queue_size(64);
    vmm.restart_ring().unwrap();
    // One ring descriptor each (indirect), so 40 fit.
    let subs: Vec<_> = (100..140u16)
        .map(|tag| {
            vmm.submit(&blocking_lock(tag), 64, Layout::Indirect { seg: 64 })
                .unwrap()
        })
        .collect();
    vmm.kick().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let (size, mut pos) = table_file(state.path());
    assert_eq!(size, 64, "the table follows the ring's new size");
    pos.sort_unstable();
    pos.dedup();
    assert_eq!(
        pos.len(),
        subs.len(),
        "every chain in flight has its own slot"
    );
    ofd_lock(&holder, libc::F_UNLCK);
    let used = wait_n(&mut vmm, subs.len());
    assert_eq!(used.len(), subs.len());
}

/// RESET_DEVICE with blocked Tlocks in flight: they end (no reply on the
/// new ring), the session's fids are dropped at once, and the next driver
/// starts clean.
fn reset_device_ends_requests_and_drops_the_session(ring: Ring) {
    let d = TestDaemon::start_with(2, 64, OffloadPolicy::Auto);
    let path = d.dir.path().join("lockme");
    std::fs::write(&path, b"x").unwrap();
    std::fs::write(d.dir.path().join("f"), b"after reset").unwrap();
    let holder = hold_lock(&path);
    let mut vmm = d.connect(ring.opts({
        let mut o = VmmOptions::default();
        o.mem_size = 16 << 20;
        o.queue_size = 64;
        o
    }));
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "lockme", OpenFlags::RDWR);
    assert_eq!(d.server.total_fids(), 2);
    for tag in 100..104u16 {
        vmm.submit(&blocking_lock(tag), 64, Layout::Direct).unwrap();
    }
    vmm.kick().unwrap();
    std::thread::sleep(Duration::from_millis(200));

    vmm.reset_device().unwrap();
    assert_eq!(d.server.total_fids(), 0, "the old session's fids are gone");
    ofd_lock(&holder, libc::F_UNLCK);

    version(&mut vmm, 65536);
    attach_open(&mut vmm, "f", OpenFlags::RDONLY);
    let read = Tmessage::Read(Tread {
        fid: 1,
        offset: 0,
        count: 64,
    });
    let r = decode(&vmm.call(&frame(9, read), 128, Layout::Direct).unwrap());
    assert_eq!(r.1, Rmessage::Read(b"after reset".to_vec()));
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        vmm.collect_used().unwrap().is_empty(),
        "a request of the old driver came back"
    );
    drop(vmm);
    d.stop();
}

/// Fsync calls (on a worker) that each wait for one pass of the test.
#[derive(Default)]
struct Turnstile {
    /// (calls entered, passes given)
    state: Mutex<(usize, usize)>,
    cv: std::sync::Condvar,
}

impl Turnstile {
    fn wait_entered(&self, n: usize) {
        let g = self.state.lock().unwrap();
        let (g, t) = self
            .cv
            .wait_timeout_while(g, Duration::from_secs(10), |s| s.0 < n)
            .unwrap();
        assert!(!t.timed_out(), "fsync {n} never started");
        drop(g);
    }

    fn pass(&self) {
        self.state.lock().unwrap().1 += 1;
        self.cv.notify_all();
    }

    /// Waits for the pass of this call.
    fn enter(&self) {
        let mut g = self.state.lock().unwrap();
        g.0 += 1;
        let me = g.0;
        self.cv.notify_all();
        let _g = self.cv.wait_while(g, |s| s.1 < me).unwrap();
    }
}

/// A request whose call ends as the VMM pauses (a worker's Tfsync or
/// Twrite under a real guest) is answered at the stop, never dropped:
/// GET_VRING_BASE clears the ring's ready flag before the stop reaches
/// the vring thread, and a completion that lands in between used to be
/// thrown away, losing the reply (split) or leaving a hole that hangs
/// the driver after `cont` (packed). The window is a few microseconds,
/// so the pause is repeated as the call returns.
fn pause_keeps_replies_that_finish_as_the_ring_stops(ring: Ring) {
    const ROUNDS: usize = 40;
    let fs = GatedFs::new(Duration::ZERO);
    let turnstile = Arc::clone(&fs.fsync);
    let (d, _server) = Device::start(fs, OffloadPolicy::Auto);
    let mut vmm = d.connect(ring);
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "file", OpenFlags::RDONLY);
    for round in 1..=ROUNDS {
        let tag = round as u16;
        let fsync = frame(
            tag,
            Tmessage::Fsync(Tfsync {
                fid: 1,
                datasync: 0,
            }),
        );
        let sub = vmm.submit(&fsync, 64, Layout::Direct).unwrap();
        vmm.kick().unwrap();
        turnstile.wait_entered(round);
        turnstile.pass();
        let base = vmm.stop_ring().unwrap();
        let used = vmm.collect_used().unwrap();
        assert_eq!(
            used.len(),
            1,
            "round {round}: the reply is on the ring at the stop"
        );
        let reply = decode(&vmm.read(sub.reply_addr, used[0].len as usize).unwrap());
        assert_eq!(reply, (tag, Rmessage::Fsync), "round {round}");
        vmm.resume_ring(base).unwrap();
    }
}

on_both_rings! {
    pause_keeps_replies_that_finish_as_the_ring_stops => pause_keeps_replies_that_finish_as_the_ring_stops;
    pause_keeps_waiting_locks => pause_keeps_waiting_locks_and_the_session;
    pause_then_another_guest_discards_the_waiters => pause_then_another_guest_discards_the_waiters;
    pause_waits_for_a_running_call => pause_waits_for_a_running_call;
    reset_never_lets_a_late_call_write_guest_memory => reset_never_lets_a_late_call_write_guest_memory;
    reset_device_ends_requests_and_drops_the_session => reset_device_ends_requests_and_drops_the_session;
    reset_never_lets_a_late_call_read_guest_memory => reset_never_lets_a_late_call_read_guest_memory;
    pause_waits_for_calls_holding_guest_memory => pause_waits_for_calls_holding_guest_memory;
    a_ring_resized_after_a_stop_gets_a_table_of_its_size => a_ring_resized_after_a_stop_gets_a_table_of_its_size;
}
