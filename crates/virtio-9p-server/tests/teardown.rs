// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Bounded teardown: a reset or a drop of the device
//! returns within the engine's bound even when a `Filesystem` call never
//! returns; the stuck request is leaked and counted, never freed under the
//! worker, and the device keeps serving. Also where calls run under the
//! default policy: a filesystem that does not say its metadata calls are
//! local keeps them on workers, so a hung one never stalls the device.

mod common;

use std::io;
use std::sync::{Arc, Mutex};

use common::Gate;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use coro_pool::{PoolConfig, StackPool};
use virtio_9p_server::engine::{EngineConfig, OffloadPolicy, WORKER_JOIN_TIMEOUT};
use virtio_9p_server::fs::{Cred, Filesystem};
use virtio_9p_server::protocol::*;
use virtio_9p_server::virtio::RequestQueue;
use virtio_9p_server::{Config, Server, Session};
use virtqueue_large::mock::{guest_memory, Buf, ChainLayout, Layout, MockDriver, UsedEntry};
use vm_memory::{Bytes, GuestMemoryMmap};

/// How long the tests let a reset wait for a running call.
const QUIESCE: Duration = Duration::from_millis(400);

/// A filesystem of one directory whose Tgetattr blocks until the gate
/// opens (for ever, in the drop test); every walk leads back to the root,
/// and the rest is the trait's defaults. It does not say its metadata
/// calls are local (the default hint), so the engine keeps them on
/// workers.
struct StuckFs(Arc<Gate>);

impl Filesystem for StuckFs {
    type Inode = ();
    type File = ();

    fn attach(&self, _: &[u8], _: Cred) -> io::Result<((), Qid)> {
        Ok(((), Qid::default()))
    }
    fn walk(&self, _: &(), _: &[u8]) -> io::Result<((), Qid)> {
        Ok(((), Qid::default()))
    }
    fn getattr(&self, _: &(), _: GetattrMask) -> io::Result<Rgetattr> {
        self.0.wait();
        Ok(Rgetattr::default())
    }
}

/// A filesystem whose metadata calls are quick and, by its hint, local;
/// it records the thread of each Tgetattr, Twalk and Tsetattr.
#[derive(Default)]
struct LocalFs {
    threads: Arc<Mutex<Vec<(&'static str, ThreadId)>>>,
}

impl LocalFs {
    fn record(&self, what: &'static str) {
        self.threads
            .lock()
            .unwrap()
            .push((what, std::thread::current().id()));
    }
}

impl Filesystem for LocalFs {
    type Inode = ();
    type File = ();

    fn attach(&self, _: &[u8], _: Cred) -> io::Result<((), Qid)> {
        Ok(((), Qid::default()))
    }
    fn walk(&self, _: &(), _: &[u8]) -> io::Result<((), Qid)> {
        self.record("walk");
        Ok(((), Qid::default()))
    }
    fn getattr(&self, _: &(), _: GetattrMask) -> io::Result<Rgetattr> {
        self.record("getattr");
        Ok(Rgetattr::default())
    }
    fn setattr(&self, _: &(), _: Option<&()>, _: &Tsetattr) -> io::Result<()> {
        self.record("setattr");
        Ok(())
    }
    fn metadata_is_local(&self) -> bool {
        true
    }
}

struct Device<F: Filesystem = StuckFs> {
    mem: Arc<GuestMemoryMmap<()>>,
    queue: virtio_queue::Queue,
    rq: RequestQueue<F>,
}

fn device(gate: &Arc<Gate>) -> (Device, MockDriver<'static, GuestMemoryMmap<()>>) {
    device_of(StuckFs(Arc::clone(gate)), 1)
}

fn device_of<F: Filesystem + 'static>(
    fs: F,
    workers: usize,
) -> (Device<F>, MockDriver<'static, GuestMemoryMmap<()>>) {
    let mem = Arc::new(guest_memory(4 << 20));
    // The driver borrows the memory for the test's life.
    let leaked: &'static GuestMemoryMmap<()> = Box::leak(Box::new((*mem).clone()));
    let driver = MockDriver::new(leaked, 64);
    let queue = driver.create_queue();
    let server = Arc::new(Server::new(fs, Config::default()).unwrap());
    let pool = Arc::new(StackPool::new(PoolConfig::default()).unwrap());
    let config = {
        let mut ecfg = EngineConfig::default();
        ecfg.workers = workers;
        ecfg.max_in_flight = 64;
        ecfg.offload = OffloadPolicy::Auto;
        ecfg.quiesce_timeout = QUIESCE;
        ecfg
    };
    let rq = RequestQueue::new(server, Arc::new(Session::new()), pool, &config, false).unwrap();
    (Device { mem, queue, rq }, driver)
}

impl<F: Filesystem + 'static> Device<F> {
    fn send(
        &mut self,
        d: &mut MockDriver<'_, GuestMemoryMmap<()>>,
        tag: u16,
        m: &Tmessage,
    ) -> ChainLayout {
        let frame = m.encode_frame(tag);
        let chain = d
            .add_chain(Layout::Direct, &[Buf::r(frame.len() as u32), Buf::w(512)])
            .unwrap();
        d.fill_readable(&chain, &frame).unwrap();
        self.rq
            .process(&mut self.queue, Arc::clone(&self.mem))
            .unwrap();
        chain
    }

    /// Polls until `n` used entries arrived (10 s at most).
    fn used(&mut self, d: &mut MockDriver<'_, GuestMemoryMmap<()>>, n: usize) -> Vec<UsedEntry> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut out = Vec::new();
        while out.len() < n && Instant::now() < deadline {
            self.rq.poll();
            self.rq.complete(&mut self.queue, &*self.mem).unwrap();
            out.extend(d.take_used());
            std::thread::sleep(Duration::from_millis(1));
        }
        out
    }

    /// Sends each `(tag, request, expected reply type)` one after another
    /// and checks its reply; with `at_once`, each must be answered within
    /// `process` (inline on this thread, no worker hop or poll).
    fn serve_each(
        &mut self,
        d: &mut MockDriver<'_, GuestMemoryMmap<()>>,
        cases: &[(u16, Tmessage, MsgType)],
        at_once: bool,
    ) {
        for (tag, m, reply) in cases {
            let c = self.send(d, *tag, m);
            let used = if at_once {
                self.rq.complete(&mut self.queue, &*self.mem).unwrap();
                d.take_used().len()
            } else {
                self.used(d, 1).len()
            };
            assert_eq!(used, 1, "{m:?} answered (at once: {at_once})");
            assert_eq!(self.reply_type(&c), *reply, "{m:?}");
        }
    }

    fn reply_type(&self, chain: &ChainLayout) -> u8 {
        let (addr, _, _) = *chain.buffers.iter().find(|b| b.2).unwrap();
        let mut hdr = [0u8; HEADER_SIZE];
        self.mem.read_slice(&mut hdr, addr).unwrap();
        hdr[4]
    }

    fn attach(&mut self, d: &mut MockDriver<'_, GuestMemoryMmap<()>>) {
        let version = Tmessage::Version(Tversion {
            msize: 8192,
            version: VERSION_9P2000_L.to_vec(),
        });
        let attach = Tmessage::Attach(Tattach {
            fid: 0,
            afid: NOFID,
            uname: b"root".to_vec(),
            aname: Vec::new(),
            n_uname: 0,
        });
        for m in [version, attach] {
            let c = self.send(d, 0, &m);
            assert_eq!(self.used(d, 1).len(), 1);
            assert_ne!(self.reply_type(&c), MsgType::Rlerror, "{m:?}");
        }
    }
}

fn getattr() -> Tmessage {
    Tmessage::Getattr(Tgetattr {
        fid: 0,
        request_mask: GetattrMask::BASIC,
    })
}

#[test]
fn test_reset_with_a_stuck_filesystem_call_is_bounded_and_counted() {
    let gate = Arc::new(Gate::default());
    let (mut dev, mut d) = device(&gate);
    dev.attach(&mut d);
    // Tag 1 is stuck on the only worker; tag 2 waits behind it.
    dev.send(&mut d, 1, &getattr());
    gate.wait_entered(1);
    dev.send(&mut d, 2, &getattr());
    assert_eq!(dev.rq.in_flight(), 2);

    let t0 = Instant::now();
    assert_eq!(dev.rq.cancel_all(), 1, "the stuck call is leaked");
    let took = t0.elapsed();
    assert!(
        took >= QUIESCE && took < QUIESCE + Duration::from_secs(3),
        "reset took {took:?}"
    );
    assert_eq!(dev.rq.in_flight(), 0);
    let st = dev.rq.engine_stats();
    assert_eq!((st.leaked, st.unwound), (1, 0));
    // Both chains go back empty: the queued one was cancelled (EINTR, no
    // reply), the stuck one given up.
    let mut used = dev.used(&mut d, 2);
    used.sort_unstable_by_key(|u| (u.id, u.len));
    assert_eq!(used.iter().map(|u| u.len).collect::<Vec<_>>(), vec![0, 0]);

    // The call returns late: its completion is ignored, and the device
    // keeps serving on the freed worker.
    gate.open();
    let c = dev.send(&mut d, 3, &getattr());
    let used = dev.used(&mut d, 1);
    assert_eq!(used.len(), 1);
    assert!(used[0].len > 0);
    assert_eq!(dev.reply_type(&c), MsgType::Rgetattr);
    assert_eq!(dev.rq.engine_stats().leaked, 1);
}

#[test]
fn test_drop_with_a_filesystem_call_that_never_returns_is_bounded() {
    // The gate never opens: the worker stays stuck after the test.
    let gate = Arc::new(Gate::default());
    let (mut dev, mut d) = device(&gate);
    dev.attach(&mut d);
    dev.send(&mut d, 1, &getattr());
    gate.wait_entered(1);
    let t0 = Instant::now();
    drop(dev);
    let took = t0.elapsed();
    assert!(
        took < QUIESCE + WORKER_JOIN_TIMEOUT + Duration::from_secs(2),
        "drop took {took:?}"
    );
    assert!(
        took >= QUIESCE,
        "drop returned before the quiesce bound: {took:?}"
    );
}

#[test]
fn test_disconnect_with_a_stuck_call_is_bounded_and_the_daemon_serves_on() {
    use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout as VmmLayout, VmmOptions};
    use virtio_9p_server::vhost_user::{Daemon, DaemonConfig, Listen};

    let gate = Arc::new(Gate::default());
    let sock_dir = tempfile::tempdir().unwrap();
    let socket = sock_dir.path().join("vu.sock");
    let server = Arc::new(Server::new(StuckFs(Arc::clone(&gate)), Config::default()).unwrap());
    let mut config = DaemonConfig::default();
    config.listen = Listen::Path(socket.clone());
    config.backend.tag = "stuck".into();
    config.backend.queue_size = 64;
    config.backend.engine.workers = 1;
    config.backend.engine.max_in_flight = 64;
    config.backend.engine.quiesce_timeout = QUIESCE;
    config.stack_trim_interval = None;
    let mut daemon = Daemon::new(server, config).unwrap();
    let stop = daemon.stop_handle();
    let thread = std::thread::spawn(move || daemon.run());
    let opts = || {
        let mut o = VmmOptions::default();
        o.queue_size = 64;
        o
    };
    let version = Tmessage::Version(Tversion {
        msize: 8192,
        version: VERSION_9P2000_L.to_vec(),
    })
    .encode_frame(0);

    let mut vmm = FakeVmm::connect(&socket, opts()).unwrap();
    vmm.call(&version, 64, VmmLayout::Direct).unwrap();
    let attach = Tmessage::Attach(Tattach {
        fid: 0,
        afid: NOFID,
        uname: b"root".to_vec(),
        aname: Vec::new(),
        n_uname: 0,
    });
    vmm.call(&attach.encode_frame(1), 64, VmmLayout::Direct)
        .unwrap();
    vmm.submit(&getattr().encode_frame(2), 256, VmmLayout::Direct)
        .unwrap();
    vmm.kick().unwrap();
    gate.wait_entered(1);

    // The frontend goes away while the call is stuck; the next one is
    // served once the daemon has torn the first session down, within the
    // engine's bound (plus slack for the handshake).
    let t0 = Instant::now();
    drop(vmm);
    let mut vmm = FakeVmm::connect(&socket, opts()).unwrap();
    let reply = vmm.call(&version, 64, VmmLayout::Direct).unwrap();
    let took = t0.elapsed();
    assert_eq!(reply[4], MsgType::Rversion);
    assert!(
        took < QUIESCE + WORKER_JOIN_TIMEOUT + Duration::from_secs(3),
        "reconnect took {took:?}"
    );
    drop(vmm);
    stop.stop();
    thread.join().unwrap().unwrap();
    gate.open();
}

/// Twalk of fid 0 to fid 1, Tgetattr of fid 0, Tclunk of fid 1.
fn walk_getattr_clunk() -> [(u16, Tmessage, MsgType); 3] {
    [
        (1, walk(0, 1), MsgType::Rwalk),
        (2, getattr(), MsgType::Rgetattr),
        (3, Tmessage::Clunk(Tfid { fid: 1 }), MsgType::Rclunk),
    ]
}

fn walk(fid: u32, newfid: u32) -> Tmessage {
    Tmessage::Walk(Twalk {
        fid,
        newfid,
        wnames: vec![b"a".to_vec()],
    })
}

#[test]
fn test_auto_runs_metadata_calls_inline_for_a_local_filesystem() {
    let fs = LocalFs::default();
    let threads = Arc::clone(&fs.threads);
    let (mut dev, mut d) = device_of(fs, 2);
    dev.attach(&mut d);
    let before = dev.rq.engine_stats().offloaded;
    // Twalk, Tgetattr and Tclunk are answered inline, within `process`,
    // on this (the device) thread: no worker hop.
    dev.serve_each(&mut d, &walk_getattr_clunk(), true);
    assert_eq!(dev.rq.engine_stats().offloaded, before);
    // A change still goes to a worker.
    let c = dev.send(&mut d, 4, &Tmessage::Setattr(common::setattr_base(0)));
    assert_eq!(dev.used(&mut d, 1).len(), 1);
    assert_eq!(dev.reply_type(&c), MsgType::Rsetattr);
    assert_eq!(dev.rq.engine_stats().offloaded, before + 1);
    let me = std::thread::current().id();
    let threads = threads.lock().unwrap().clone();
    assert_eq!(
        threads
            .iter()
            .map(|&(w, t)| (w, t == me))
            .collect::<Vec<_>>(),
        vec![("walk", true), ("getattr", true), ("setattr", false)]
    );
}

#[test]
fn test_auto_offloads_metadata_calls_of_a_filesystem_with_the_default_hint() {
    let gate = Arc::new(Gate::default());
    gate.open();
    let (mut dev, mut d) = device_of(StuckFs(Arc::clone(&gate)), 2);
    dev.attach(&mut d);
    let before = dev.rq.engine_stats().offloaded;
    dev.serve_each(&mut d, &walk_getattr_clunk(), false);
    assert_eq!(dev.rq.engine_stats().offloaded, before + 3);
}

#[test]
fn test_a_hung_getattr_of_a_non_local_filesystem_never_stalls_the_device() {
    // The gate never opens: Tgetattr hangs on a worker for ever. Under the
    // default policy the device thread goes on serving, on the other
    // worker, and the drop stays bounded.
    let gate = Arc::new(Gate::default());
    let (mut dev, mut d) = device_of(StuckFs(Arc::clone(&gate)), 2);
    dev.attach(&mut d);
    dev.send(&mut d, 1, &getattr());
    gate.wait_entered(1);
    let cases = [
        (2, walk(0, 1), MsgType::Rwalk),
        (3, Tmessage::Statfs(Tfid { fid: 1 }), MsgType::Rlerror),
        (4, Tmessage::Clunk(Tfid { fid: 1 }), MsgType::Rclunk),
    ];
    dev.serve_each(&mut d, &cases, false);
    assert_eq!(dev.rq.in_flight(), 1, "only the hung Tgetattr");
    let t0 = Instant::now();
    drop(dev);
    let took = t0.elapsed();
    assert!(
        took < QUIESCE + WORKER_JOIN_TIMEOUT + Duration::from_secs(2),
        "drop took {took:?}"
    );
}
