// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The virtio device adapter ([`virtio::Device`]) through every transition
//! of its life, with both driver mocks of virtqueue-large (split and
//! packed ring): features, config space, activation, kicks, pause and
//! resume, snapshot and restore, reset; and a driver that misbehaves
//! (features acked twice or late, activation before features or with a
//! ring that is not set up, kicks before activation, a reset in the middle
//! of a request, a damaged snapshot).

mod common;

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::Gate;
use virtio_9p_server::engine::EngineConfig;
use virtio_9p_server::fs::{Cred, Filesystem};
use virtio_9p_server::protocol::*;
use virtio_9p_server::virtio::{Device, VirtioError, DEVICE_FEATURES};
use virtio_9p_server::{Config, Error, PassthroughConfig, PassthroughFs, Server};
use virtio_queue::{Queue, QueueT};
use virtqueue_large::mock::{
    guest_memory, ChainLayout, Layout, MockDriver, MockPackedDriver, MockRing, UsedEntry,
};
use vm_memory::{GuestAddress, GuestMemoryAtomic, GuestMemoryMmap};

type Mem = GuestMemoryMmap<()>;

const SIZE: u16 = 64;
const MSIZE: u32 = 8192;
const PACKED: u64 = 1 << 34;

/// A split-ring driver on the device's memory.
fn split(mem: &Mem) -> MockDriver<'static, Mem> {
    MockDriver::new_owned(mem.clone(), SIZE)
}

/// A packed-ring driver on the device's memory.
fn packed(mem: &Mem) -> MockPackedDriver<'static, Mem> {
    MockPackedDriver::new_owned(mem.clone(), SIZE)
}

/// What these tests do with a driver of either layout, on top of
/// virtqueue-large's [`MockRing`].
trait Driver: MockRing<Memory = Mem> {
    /// The features the driver acks: all offered, packed only on a packed ring.
    fn features(&self) -> u64 {
        if self.is_packed() {
            DEVICE_FEATURES
        } else {
            DEVICE_FEATURES & !PACKED
        }
    }

    fn add(&mut self, msg: Tmessage, tag: u16) -> ChainLayout {
        let frame = msg.encode_frame(tag);
        self.add_chain_with_data(Layout::Direct, &[&frame], &[MSIZE])
            .unwrap()
    }

    fn writable(&self, chain: &ChainLayout) -> Vec<u8> {
        self.read_writable(chain).unwrap()
    }

    /// The reply to `chain`, which must be the only used entry.
    fn reply(&mut self, chain: &ChainLayout) -> Rmessage {
        let used = self.take_used();
        assert_eq!(used.len(), 1, "used entries {used:?}");
        assert_eq!(used[0].id, u32::from(chain.head));
        let bytes = self.writable(chain);
        Rmessage::decode_frame(&bytes[..used[0].len as usize], MSIZE)
            .unwrap()
            .1
    }
}

impl<R: MockRing<Memory = Mem>> Driver for R {}

/// A ready split `Queue` whose three addresses are `(d, a, u)`.
fn queue_at((d, a, u): (GuestAddress, GuestAddress, GuestAddress)) -> Queue {
    let mut q = Queue::new(SIZE).unwrap();
    q.set_size(SIZE);
    q.set_desc_table_address(Some(d.0 as u32), Some((d.0 >> 32) as u32));
    q.set_avail_ring_address(Some(a.0 as u32), Some((a.0 >> 32) as u32));
    q.set_used_ring_address(Some(u.0 as u32), Some((u.0 >> 32) as u32));
    q.set_ready(true);
    q
}

fn engine() -> EngineConfig {
    let mut e = EngineConfig::default();
    e.workers = 1;
    e.max_in_flight = usize::from(SIZE);
    e.quiesce_timeout = Duration::from_millis(400);
    e
}

fn interrupt(count: &Arc<AtomicUsize>) -> Box<dyn Fn() + Send> {
    let c = Arc::clone(count);
    Box::new(move || {
        c.fetch_add(1, Ordering::Relaxed);
    })
}

fn version() -> Tmessage {
    Tmessage::Version(Tversion {
        msize: MSIZE,
        version: VERSION_9P2000_L.to_vec(),
    })
}

fn attach() -> Tmessage {
    Tmessage::Attach(Tattach {
        fid: 0,
        afid: NOFID,
        uname: b"root".to_vec(),
        aname: Vec::new(),
        n_uname: 0,
    })
}

fn getattr(fid: u32) -> Tmessage {
    Tmessage::Getattr(Tgetattr {
        fid,
        request_mask: GetattrMask::ALL,
    })
}

/// Sends `msg`, kicks and returns the reply.
fn call<F: Filesystem + 'static>(
    dev: &mut Device<F, Mem>,
    d: &mut impl Driver,
    msg: Tmessage,
) -> Rmessage {
    let chain = d.add(msg, 1);
    for _ in 0..1000 {
        dev.process_queue().unwrap();
        match d.take_used().as_slice() {
            [] => std::thread::sleep(Duration::from_millis(2)),
            [UsedEntry { id: head, len }] => {
                assert_eq!(*head, u32::from(chain.head));
                let bytes = d.writable(&chain);
                return Rmessage::decode_frame(&bytes[..*len as usize], MSIZE)
                    .unwrap()
                    .1;
            }
            more => panic!("used entries {more:?}"),
        }
    }
    panic!("no reply");
}

fn is_state(r: Result<(), Error>, what: &str) {
    match r {
        Err(Error::Virtio(VirtioError::DeviceState(m))) => {
            assert!(m.contains(what), "{m:?} lacks {what:?}")
        }
        other => panic!("expected a device state error about {what:?}, got {other:?}"),
    }
}

fn lifecycle<R: Driver>(new_driver: fn(&Mem) -> R) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"data").unwrap();
    let server = Arc::new(
        Server::new(
            PassthroughFs::new(PassthroughConfig::new(dir.path())).unwrap(),
            Config::default(),
        )
        .unwrap(),
    );
    let mem = guest_memory(4 << 20);
    let mut d = new_driver(&mem);
    let mut dev: Device<_, Mem> = Device::new(Arc::clone(&server), "share", &engine()).unwrap();
    let irqs = Arc::new(AtomicUsize::new(0));

    // What the transport reads before the driver starts.
    assert_eq!(dev.device_type(), 9);
    assert_eq!(dev.queue_max_sizes(), &[SIZE]);
    assert_eq!(dev.features(), DEVICE_FEATURES);
    let mut cfg = [0xffu8; 10];
    dev.read_config(0, &mut cfg);
    assert_eq!(&cfg, b"\x05\x00share\0\0\0");
    dev.write_config(0, &[1, 2]);
    dev.read_config(2, &mut cfg[..5]);
    assert_eq!(&cfg[..5], b"share");

    // A kick before activation is ignored; the chain waits on the ring.
    let early = d.add(version(), 7);
    assert!(!dev.process_queue().unwrap());
    assert!(d.take_used().is_empty());

    // Activation before features, acks twice, activation with a ring that
    // is not set up.
    let m = GuestMemoryAtomic::new(mem.clone());
    is_state(
        dev.activate(m.clone(), d.config_queue(), interrupt(&irqs)),
        "before the driver acked",
    );
    dev.ack_features(d.features() | (1 << 50)).unwrap();
    assert_eq!(dev.acked_features(), Some(d.features()));
    is_state(dev.ack_features(d.features()), "acked twice");
    let mut not_ready = d.config_queue();
    not_ready.set_ready(false);
    is_state(
        dev.activate(m.clone(), not_ready, interrupt(&irqs)),
        "not ready",
    );
    let outside = queue_at((
        GuestAddress(64 << 20),
        GuestAddress(65 << 20),
        GuestAddress(66 << 20),
    ));
    assert!(dev.activate(m.clone(), outside, interrupt(&irqs)).is_err());
    assert!(!dev.is_active());
    is_state(dev.pause(), "before activation");

    // Activation serves the chain made available before it.
    dev.activate(m.clone(), d.config_queue(), interrupt(&irqs))
        .unwrap();
    assert!(dev.is_active());
    assert!(matches!(d.reply(&early), Rmessage::Version(_)));
    assert_eq!(irqs.load(Ordering::Relaxed), 1);
    is_state(dev.ack_features(d.features()), "after activation");
    is_state(
        dev.activate(m.clone(), d.config_queue(), interrupt(&irqs)),
        "twice",
    );

    assert!(matches!(
        call(&mut dev, &mut d, attach()),
        Rmessage::Attach(_)
    ));
    let walk = Tmessage::Walk(Twalk {
        fid: 0,
        newfid: 1,
        wnames: vec![b"f".to_vec()],
    });
    assert!(matches!(call(&mut dev, &mut d, walk), Rmessage::Walk(_)));

    // Pause: a kick is not served until resume; a running device cannot
    // be snapshotted.
    assert!(dev.snapshot().is_err());
    dev.pause().unwrap();
    assert!(dev.is_paused());
    let waiting = d.add(getattr(1), 9);
    assert!(!dev.process_queue().unwrap());
    assert!(d.take_used().is_empty());
    dev.resume().unwrap();
    match d.reply(&waiting) {
        Rmessage::Getattr(a) => assert_eq!(a.size, 4),
        r => panic!("{r:?}"),
    }

    // Snapshot while paused, reset, restore into the same device, and the
    // fid walked before the snapshot still names the file.
    dev.pause().unwrap();
    let snap = dev.snapshot().unwrap();
    dev.reset();
    assert!(!dev.is_active());
    assert_eq!(dev.acked_features(), None);
    is_state(
        dev.restore(b"not a snapshot"),
        "not a virtio-9p device snapshot",
    );
    let mut damaged = snap.clone();
    damaged.truncate(snap.len() - 1);
    assert!(dev.restore(&damaged).is_err());
    dev.restore(&snap).unwrap();
    assert_eq!(dev.acked_features(), Some(d.features()));
    // The transport's queue configuration is written again by the driver;
    // the ring position comes from the snapshot.
    dev.activate(m.clone(), d.config_queue(), interrupt(&irqs))
        .unwrap();
    is_state(dev.restore(&snap), "activated");
    match call(&mut dev, &mut d, getattr(1)) {
        Rmessage::Getattr(a) => assert_eq!(a.size, 4),
        r => panic!("{r:?}"),
    }

    // A new device (another VMM process) restores the same snapshot.
    let mut dev2: Device<_, Mem> = Device::new(server, "share", &engine()).unwrap();
    dev.pause().unwrap();
    let snap = dev.snapshot().unwrap();
    drop(dev);
    dev2.restore(&snap).unwrap();
    dev2.activate(m, d.config_queue(), interrupt(&irqs))
        .unwrap();
    match call(&mut dev2, &mut d, getattr(1)) {
        Rmessage::Getattr(a) => assert_eq!(a.size, 4),
        r => panic!("{r:?}"),
    }

    // A reset forgets the session: the fid is gone after a new activation.
    dev2.reset();
    assert!(!dev2.process_queue().unwrap());
    let mut d = new_driver(&mem);
    dev2.ack_features(d.features()).unwrap();
    dev2.activate(
        GuestMemoryAtomic::new(mem.clone()),
        d.config_queue(),
        interrupt(&irqs),
    )
    .unwrap();
    assert!(matches!(
        call(&mut dev2, &mut d, version()),
        Rmessage::Version(_)
    ));
    assert!(matches!(
        call(&mut dev2, &mut d, getattr(1)),
        Rmessage::Lerror(_)
    ));
}

#[test]
fn test_device_lifecycle_split() {
    lifecycle(split);
}

#[test]
fn test_device_lifecycle_packed() {
    lifecycle(packed);
}

/// One directory whose Tgetattr blocks until the gate opens.
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

/// A reset while a request runs: the request is given up on, and nothing
/// reaches the ring or the reply buffer afterwards, even when the call
/// returns later.
fn reset_mid_request<R: Driver>(new_driver: fn(&Mem) -> R) {
    let gate = Arc::new(Gate::default());
    let server = Arc::new(Server::new(StuckFs(Arc::clone(&gate)), Config::default()).unwrap());
    let mem = guest_memory(4 << 20);
    let mut d = new_driver(&mem);
    let mut dev: Device<_, Mem> = Device::new(server, "share", &engine()).unwrap();
    let irqs = Arc::new(AtomicUsize::new(0));
    dev.ack_features(d.features()).unwrap();
    dev.activate(
        GuestMemoryAtomic::new(mem.clone()),
        d.config_queue(),
        interrupt(&irqs),
    )
    .unwrap();
    assert!(matches!(
        call(&mut dev, &mut d, version()),
        Rmessage::Version(_)
    ));
    assert!(matches!(
        call(&mut dev, &mut d, attach()),
        Rmessage::Attach(_)
    ));

    let stuck = d.add(getattr(0), 3);
    dev.process_queue().unwrap();
    gate.wait_entered(1);
    let before = d.writable(&stuck);
    let irqs_before = irqs.load(Ordering::Relaxed);
    dev.reset();
    gate.open();
    std::thread::sleep(Duration::from_millis(200));
    // Kicks after the reset do nothing either.
    assert!(!dev.process_queue().unwrap());
    assert!(
        d.take_used().is_empty(),
        "the reset request reached the used ring"
    );
    assert_eq!(
        d.writable(&stuck),
        before,
        "the reply buffer was written after reset"
    );
    assert_eq!(irqs.load(Ordering::Relaxed), irqs_before);
    // Nor after the driver starts the device again on a fresh ring at the
    // same place: the engine runs again, the old request stays dead.
    let mut d2 = new_driver(&mem);
    dev.ack_features(d2.features()).unwrap();
    dev.activate(
        GuestMemoryAtomic::new(mem.clone()),
        d2.config_queue(),
        interrupt(&irqs),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    dev.process_queue().unwrap();
    assert!(
        d2.take_used().is_empty(),
        "the reset request reached the new ring"
    );
    assert_eq!(
        d.writable(&stuck),
        before,
        "the reply buffer was written after reset"
    );
    assert!(matches!(
        call(&mut dev, &mut d2, version()),
        Rmessage::Version(_)
    ));
}

#[test]
fn test_device_reset_mid_request_split() {
    reset_mid_request(split);
}

#[test]
fn test_device_reset_mid_request_packed() {
    reset_mid_request(packed);
}

#[test]
fn test_device_refuses_bad_construction() {
    let dir = tempfile::tempdir().unwrap();
    let server = Arc::new(
        Server::new(
            PassthroughFs::new(PassthroughConfig::new(dir.path())).unwrap(),
            Config::default(),
        )
        .unwrap(),
    );
    let bad_tag = Device::<_, Mem>::new(Arc::clone(&server), "", &engine());
    assert!(matches!(
        bad_tag,
        Err(Error::Virtio(VirtioError::TagLength(0)))
    ));
    let mut e = engine();
    e.max_in_flight = 1000;
    let bad_size = Device::<_, Mem>::new(server, "share", &e);
    assert!(matches!(
        bad_size,
        Err(Error::Virtio(VirtioError::QueueSize(1000)))
    ));
}

/// A thread handed over to [`Device::run`]: the device serves kicks until
/// the stop eventfd fires, then pauses and snapshots on its thread.
fn run_on_thread<R: Driver>(new_driver: fn(&Mem) -> R) {
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
    let dir = tempfile::tempdir().unwrap();
    let mem = guest_memory(4 << 20);
    let mut d = new_driver(&mem);
    // Without event-idx every used round raises the interrupt (with it,
    // the split mock would have to move its used event along).
    let (features, queue) = (d.features() & !(1 << 29), d.config_queue());
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let stop = EventFd::new(EFD_NONBLOCK).unwrap();
    let irq = EventFd::new(EFD_NONBLOCK).unwrap();
    let (k, s, i) = (
        kick.try_clone().unwrap(),
        stop.try_clone().unwrap(),
        irq.try_clone().unwrap(),
    );
    let (m, path) = (mem.clone(), dir.path().to_path_buf());
    let device = std::thread::spawn(move || -> Result<Vec<u8>, Error> {
        let fs = PassthroughFs::new(PassthroughConfig::new(path))?;
        let server = Arc::new(Server::new(fs, Config::default())?);
        let mut dev: Device<_, Mem> = Device::new(server, "share", &engine())?;
        dev.ack_features(features)?;
        let raise = Box::new(move || {
            i.write(1).unwrap();
        });
        dev.activate(GuestMemoryAtomic::new(m), queue, raise)?;
        dev.run(&k, &s)?;
        dev.pause()?;
        dev.snapshot()
    });
    for (tag, msg) in [(1, version()), (2, attach()), (3, getattr(0))] {
        let chain = d.add(msg, tag);
        kick.write(1).unwrap();
        let reply = loop {
            let mut pfd = libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&irq),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            let ready = unsafe { libc::poll(&mut pfd, 1, 10_000) };
            assert_eq!(ready, 1, "no interrupt");
            let _ = irq.read();
            if let Some(&UsedEntry { len, .. }) = d.take_used().first() {
                let bytes = d.writable(&chain);
                break Rmessage::decode_frame(&bytes[..len as usize], MSIZE)
                    .unwrap()
                    .1;
            }
        };
        assert!(!matches!(reply, Rmessage::Lerror(_)), "{reply:?}");
    }
    stop.write(1).unwrap();
    let snap = device.join().unwrap().unwrap();
    assert!(snap.starts_with(b"V9PDEV"));
}

#[test]
fn test_device_run_on_a_handed_over_thread_split() {
    run_on_thread(split);
}

#[test]
fn test_device_run_on_a_handed_over_thread_packed() {
    run_on_thread(packed);
}
