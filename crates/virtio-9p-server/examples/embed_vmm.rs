// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Embedding the virtio-9p device in a VMM, the way a cloud-hypervisor or
//! crosvm device model would (README, "Embedding in a VMM").
//!
//! The VMM side is what a device model owns:
//!
//! - guest memory as `GuestMemoryAtomic<GuestMemoryMmap>` and a
//!   `virtio_queue::Queue` configured by the driver (here by the mock);
//! - an **epoll handler thread** (cloud-hypervisor's `EpollHelper`, crosvm's
//!   `WaitContext`) that waits on the queue's kick eventfd, the request
//!   queue's resume fd ([`RequestQueue::more_fd`]) and the engine's fds
//!   ([`Engine::fds`](virtio_9p_server::engine::Engine::fds)), plus a stop
//!   eventfd of its own;
//! - an **interrupt callback**, called when the used ring got entries and
//!   `needs_notification` says so (a VMM raises the MSI-X vector there).
//!
//! The guest is virtqueue-large's `MockDriver` on the same memory: it lays
//! out real chains, kicks and waits for the interrupt. It sends real 9P
//! requests (Tversion, Tattach, Twalk, Tlopen, Tread, Twrite, Tclunk)
//! against a [`PassthroughFs`] on a temporary directory and checks every
//! reply and the file on the host.
//!
//! ```text
//! cargo run -p virtio-9p-server --example embed_vmm
//! ```
//!
//! It prints `embed_vmm: ok: ...` and exits 0, or prints what failed and
//! exits 1 (CI runs it: `ci/embed-vmm.sh`).

use std::os::fd::{AsRawFd, RawFd};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use coro_pool::{PoolConfig, StackPool};
use virtio_9p_server::engine::EngineConfig;
use virtio_9p_server::protocol::*;
use virtio_9p_server::virtio::RequestQueue;
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server, Session};
use virtio_queue::{Queue, QueueT};
use virtqueue_large::mock::{guest_memory, Layout, MockDriver};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

type Mem = GuestMemoryMmap<()>;
type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const QUEUE_SIZE: u16 = 256;
const MSIZE: u32 = 128 << 10;

// Epoll tokens of the device thread.
const KICK: u64 = 0;
const STOP: u64 = 1;
const MORE: u64 = 2;
const ENGINE: u64 = 3;

/// The VMM's device model: what it hands the device thread on activation.
struct Activation {
    mem: GuestMemoryAtomic<Mem>,
    queue: Queue,
    kick: EventFd,
    stop: EventFd,
    /// The interrupt callback (a VMM's `VirtioInterrupt::trigger`).
    interrupt: Box<dyn Fn() + Send>,
    shared_dir: std::path::PathBuf,
}

/// The device's epoll handler thread. The request queue is built here: its
/// coroutines belong to the thread that drives them.
fn device_thread(a: Activation) -> Res<()> {
    let Activation {
        mem,
        mut queue,
        kick,
        stop,
        interrupt,
        shared_dir,
    } = a;
    let fs = PassthroughFs::new(PassthroughConfig::new(&shared_dir))?;
    let server = Arc::new(Server::new(fs, Config::default())?);
    let pool = Arc::new(StackPool::new(PoolConfig::default())?);
    let mut config = EngineConfig::default();
    config.workers = 2;
    config.max_in_flight = usize::from(QUEUE_SIZE);
    let mut rq = RequestQueue::new(server, Arc::new(Session::new()), pool, &config, true)?;

    // The fds of the device's own epoll loop: the kick, our stop fd, and
    // what the library asks to be polled.
    let epoll = Epoll::new()?;
    let add = |fd: RawFd, token: u64| {
        epoll.ctl(
            ControlOperation::Add,
            fd,
            EpollEvent::new(EventSet::IN, token),
        )
    };
    add(kick.as_raw_fd(), KICK)?;
    add(stop.as_raw_fd(), STOP)?;
    add(rq.more_fd(), MORE)?;
    for fd in rq.engine().fds() {
        add(fd, ENGINE)?;
    }

    let mut events = vec![EpollEvent::default(); 8];
    loop {
        let n = epoll.wait(-1, &mut events)?;
        for ev in &events[..n] {
            match ev.data() {
                STOP => {
                    // Deactivation: cancel what is in flight (bounded) and
                    // return; the queue drops on this thread.
                    let leaked = rq.cancel_all();
                    if leaked > 0 {
                        return Err(format!("{leaked} requests leaked at stop").into());
                    }
                    return Ok(());
                }
                KICK | MORE => {
                    if ev.data() == KICK {
                        let _ = kick.read();
                    } else {
                        rq.clear_more();
                    }
                    // An Arc of the current memory: requests keep it while
                    // they run, even if the VMM swaps the memory meanwhile.
                    rq.process(&mut queue, mem.memory().into_inner())?;
                }
                _ => rq.poll(),
            }
        }
        // Completions (inline ones and the workers') to the used ring, then
        // the interrupt if the driver wants one.
        let m = mem.memory();
        if rq.complete(&mut queue, &*m)? && queue.needs_notification(&*m)? {
            interrupt();
        }
    }
}

/// The guest: a driver on the same memory that sends one request at a
/// time and waits for the interrupt.
struct Guest<'a> {
    driver: MockDriver<'a, Mem>,
    kick: EventFd,
    irq: EventFd,
    next_tag: u16,
}

impl Guest<'_> {
    fn call(&mut self, msg: Tmessage) -> Res<Rmessage> {
        let tag = self.next_tag;
        self.next_tag += 1;
        let frame = msg.encode_frame(tag);
        let chain = self
            .driver
            .add_chain_with_data(Layout::Direct, &[&frame], &[MSIZE])?;
        self.kick.write(1)?;
        let used = loop {
            let used = self.driver.take_used();
            if !used.is_empty() {
                break used;
            }
            wait_readable(self.irq.as_raw_fd(), Duration::from_secs(10))?;
            let _ = self.irq.read();
        };
        let [(head, len)] = used[..] else {
            return Err(format!("expected one used entry, got {used:?}").into());
        };
        if head != u32::from(chain.head) {
            return Err(format!("used head {head}, published {}", chain.head).into());
        }
        let reply = self.driver.read_writable(&chain)?;
        let (rtag, r) = Rmessage::decode_frame(&reply[..len as usize], MSIZE)?;
        if rtag != tag {
            return Err(format!("reply tag {rtag} to tag {tag}").into());
        }
        if let Rmessage::Lerror(e) = r {
            return Err(format!("{msg:?} failed: errno {e}").into());
        }
        Ok(r)
    }
}

fn wait_readable(fd: RawFd, timeout: Duration) -> Res<()> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one valid pollfd for the duration of the call.
    let r = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
    match r {
        0 => Err("no interrupt within the timeout".into()),
        r if r < 0 => Err(std::io::Error::last_os_error().into()),
        _ => Ok(()),
    }
}

fn run() -> Res<String> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("hello"), b"hello from the host\n")?;

    // The VMM's guest memory and the queue the driver configured.
    let mem: Mem = guest_memory(16 << 20);
    let driver = MockDriver::new(&mem, QUEUE_SIZE);
    let queue = driver.create_queue();

    let kick = EventFd::new(EFD_NONBLOCK)?;
    let stop = EventFd::new(EFD_NONBLOCK)?;
    let irq = EventFd::new(EFD_NONBLOCK)?;
    let irq_out = irq.try_clone()?;
    let interrupts = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&interrupts);
    let activation = Activation {
        mem: GuestMemoryAtomic::new(mem.clone()),
        queue,
        kick: kick.try_clone()?,
        stop: stop.try_clone()?,
        interrupt: Box::new(move || {
            counted.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = irq_out.write(1) {
                eprintln!("embed_vmm: cannot raise the interrupt: {e}");
            }
        }),
        shared_dir: dir.path().to_path_buf(),
    };
    let device: JoinHandle<Res<()>> = std::thread::Builder::new()
        .name("virtio-9p".into())
        .spawn(move || device_thread(activation))?;

    let mut guest = Guest {
        driver,
        kick,
        irq,
        next_tag: 1,
    };
    let result = session(&mut guest, dir.path());
    stop.write(1)?;
    let joined = device.join().map_err(|_| "the device thread panicked")?;
    joined?;
    let summary = result?;
    // Without event-idx and with no NO_INTERRUPT flag, every completion
    // round that used the ring raised one.
    let n = interrupts.load(Ordering::Relaxed);
    if n == 0 {
        return Err("the interrupt callback never ran".into());
    }
    Ok(format!("{summary}, {n} interrupts"))
}

/// The 9P session of the guest, checked step by step.
fn session(g: &mut Guest<'_>, dir: &std::path::Path) -> Res<String> {
    match g.call(Tmessage::Version(Tversion {
        msize: MSIZE,
        version: VERSION_9P2000_L.to_vec(),
    }))? {
        Rmessage::Version(v) if v.msize == MSIZE => {}
        r => return Err(format!("Rversion: {r:?}").into()),
    }
    let attach = Tmessage::Attach(Tattach {
        fid: 0,
        afid: NOFID,
        uname: b"root".to_vec(),
        aname: Vec::new(),
        n_uname: 0,
    });
    if !matches!(g.call(attach)?, Rmessage::Attach(_)) {
        return Err("Tattach not answered with Rattach".into());
    }
    // Read the host's file.
    let walk = |fid, newfid, name: &[u8]| {
        Tmessage::Walk(Twalk {
            fid,
            newfid,
            wnames: vec![name.to_vec()],
        })
    };
    match g.call(walk(0, 1, b"hello"))? {
        Rmessage::Walk(qids) if qids.len() == 1 => {}
        r => return Err(format!("Rwalk: {r:?}").into()),
    }
    g.call(Tmessage::Lopen(Tlopen {
        fid: 1,
        flags: OpenFlags::RDONLY,
    }))?;
    let read = g.call(Tmessage::Read(Tread {
        fid: 1,
        offset: 0,
        count: 4096,
    }))?;
    if read != Rmessage::Read(b"hello from the host\n".to_vec()) {
        return Err(format!("Rread: {read:?}").into());
    }
    g.call(Tmessage::Clunk(Tfid { fid: 1 }))?;

    // Create a file from the guest and write it.
    // A second fid on the root (a walk of no names), made the new file.
    g.call(Tmessage::Walk(Twalk {
        fid: 0,
        newfid: 2,
        wnames: Vec::new(),
    }))?;
    g.call(Tmessage::Lcreate(Tlcreate {
        fid: 2,
        name: b"from-guest".to_vec(),
        flags: OpenFlags::RDWR | OpenFlags::CREATE,
        mode: 0o644,
        gid: 0,
    }))?;
    let data = b"written by the guest".to_vec();
    match g.call(Tmessage::Write(Twrite {
        fid: 2,
        offset: 0,
        data: data.clone(),
    }))? {
        Rmessage::Write(n) if n as usize == data.len() => {}
        r => return Err(format!("Rwrite: {r:?}").into()),
    }
    g.call(Tmessage::Clunk(Tfid { fid: 2 }))?;
    let on_host = std::fs::read(dir.join("from-guest"))?;
    if on_host != data {
        return Err(format!("the host file holds {on_host:?}").into());
    }
    Ok(format!(
        "{} requests through a virtio_queue::Queue, the host file reads back",
        g.next_tag - 1
    ))
}

fn main() -> ExitCode {
    match run() {
        Ok(summary) => {
            println!("embed_vmm: ok: {summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("embed_vmm: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
