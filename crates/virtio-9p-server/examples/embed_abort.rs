// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A VMM-side virtio-9p device built with `panic = "abort"`, as crosvm's
//! release profile is, that proves the engine's cancellation never unwinds
//! a coroutine (which would abort the process).
//!
//! The device is a [`RequestQueue`] on a `virtio_queue::Queue` in real
//! guest memory, driven by virtqueue-large's `MockDriver` as the guest.
//! Each round:
//!
//! 1. **Tflush flood**: 128 blocking Tlocks on a file whose lock the host
//!    holds (given time to fail their first attempts and sleep between
//!    attempts), then 128 Treads (some queued behind busy workers, some
//!    running), then at once a Tflush for every one of them.
//!    Every Tflush must get its Rflush, and every chain must come back.
//! 2. **Reset with 1024 in flight**: 512 blocked Tlocks (sleeping) and 512
//!    Treads just queued, then the device reset ([`RequestQueue::cancel_all`]): the queue must be
//!    empty afterwards, nothing leaked.
//! 3. **Disconnect**: 128 blocked Tlocks and 128 Treads in flight, then the
//!    device is dropped
//!    (the engine's `Drop`), and a new one is built for the next round.
//!
//! The engine's counters must show no suspended coroutine dropped
//! (`unwound == 0`; a debug build also asserts it inside the engine). The
//! run is bounded: `ROUNDS` rounds or `TIME_LIMIT`, whichever comes first.
//!
//! Build and run it as CI does (`ci/embed-abort.sh`):
//!
//! ```text
//! cargo run --profile embed-abort -p virtio-9p-server --features test-utils --example embed_abort
//! ```
//!
//! It exits 0 on success, 1 with a message on a failed check; an unwind
//! would abort it (SIGABRT).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coro_pool::{PoolConfig, StackPool};
use virtio_9p_server::engine::{EngineConfig, OffloadPolicy, DEFAULT_STACK_SIZE};
use virtio_9p_server::protocol::*;
use virtio_9p_server::virtio::RequestQueue;
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server, Session};
use virtqueue_large::mock::{guest_memory, Buf, ChainLayout, Layout, MockDriver, UsedEntry};
use vm_memory::{Bytes, GuestMemoryMmap};

const ROUNDS: usize = 100;
/// How long the blocked Tlocks get to reach their sleep before the flood.
const SETTLE: Duration = Duration::from_millis(20);
const TIME_LIMIT: Duration = Duration::from_secs(120);
const QUEUE_SIZE: u16 = 2048;
const MSIZE: u32 = 64 << 10;
const MEMORY: usize = 64 << 20;
const DATA_LEN: usize = 4 << 20;
const LOCK_FID: u32 = 1;
const DATA_FID: u32 = 2;

type Fs = PassthroughFs;
type Mem = GuestMemoryMmap<()>;

fn fail(msg: String) -> ! {
    eprintln!("embed_abort: FAILED: {msg}");
    std::process::exit(1);
}

macro_rules! check {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            fail(format!($($arg)*));
        }
    };
}

/// The guest side of one device lifetime: memory, rings and the chains it
/// published.
struct Guest<'a> {
    mem: Arc<Mem>,
    driver: MockDriver<'a, Mem>,
    queue: virtio_queue::Queue,
    published: HashMap<u16, (ChainLayout, u8, u16)>,
}

impl<'a> Guest<'a> {
    fn new(mem: &'a Arc<Mem>) -> Guest<'a> {
        let driver = MockDriver::new(&**mem, QUEUE_SIZE);
        let queue = driver.create_queue();
        Guest {
            mem: Arc::clone(mem),
            driver,
            queue,
            published: HashMap::new(),
        }
    }

    /// Publishes `msg` with `tag` and room for a reply of `reply` bytes.
    fn publish(&mut self, tag: u16, msg: &Tmessage, reply: u32) {
        let frame = msg.encode_frame(tag);
        let bufs = [Buf::r(frame.len() as u32), Buf::w(reply)];
        let chain = self
            .driver
            .add_chain(Layout::Indirect, &bufs)
            .unwrap_or_else(|e| fail(format!("cannot publish a chain: {e}")));
        self.driver
            .fill_readable(&chain, &frame)
            .unwrap_or_else(|e| fail(format!("cannot fill a chain: {e}")));
        let head = chain.head;
        self.published.insert(head, (chain, frame[4], tag));
    }

    fn kick(&mut self, rq: &mut RequestQueue<Fs>) {
        if let Err(e) = rq.process(&mut self.queue, Arc::clone(&self.mem)) {
            fail(format!("the queue broke: {e}"));
        }
    }

    /// Polls the device until `pending` chains are left (or 30 s), and
    /// returns the replies of the chains that came back: (request type,
    /// tag, reply type or 0 for an empty chain).
    fn collect(&mut self, rq: &mut RequestQueue<Fs>, pending: usize) -> Vec<(u8, u16, u8)> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut out = Vec::new();
        loop {
            rq.poll();
            if let Err(e) = rq.complete(&mut self.queue, &*self.mem) {
                fail(format!("used ring: {e}"));
            }
            for UsedEntry { id, len } in self.driver.take_used() {
                let Some((chain, ty, tag)) = self.published.remove(&(id as u16)) else {
                    fail(format!("used entry {id} for no published chain"));
                };
                let reply = if len == 0 {
                    0
                } else {
                    let (addr, _, _) = *chain
                        .buffers
                        .iter()
                        .find(|b| b.2)
                        .unwrap_or_else(|| fail("chain without a writable part".into()));
                    let mut hdr = [0u8; HEADER_SIZE];
                    self.mem
                        .read_slice(&mut hdr, addr)
                        .unwrap_or_else(|e| fail(format!("reading a reply: {e}")));
                    let h = Header::from_bytes(&hdr);
                    check!(h.tag == tag, "reply tag {} to tag {tag}", h.tag);
                    h.ty
                };
                out.push((ty, tag, reply));
            }
            if self.published.len() <= pending || Instant::now() >= deadline {
                return out;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Sends one request and waits for its reply type.
    fn call(&mut self, rq: &mut RequestQueue<Fs>, msg: &Tmessage) -> u8 {
        self.publish(0, msg, MSIZE);
        self.kick(rq);
        match self.collect(rq, 0).as_slice() {
            [(_, _, reply)] => *reply,
            other => fail(format!("expected one reply, got {other:?}")),
        }
    }

    /// Tversion, Tattach and the two open fids of a round.
    fn attach(&mut self, rq: &mut RequestQueue<Fs>) {
        let steps = [
            Tmessage::Version(Tversion {
                msize: MSIZE,
                version: VERSION_9P2000_L.to_vec(),
            }),
            Tmessage::Attach(Tattach {
                fid: 0,
                afid: NOFID,
                uname: b"root".to_vec(),
                aname: Vec::new(),
                n_uname: 0,
            }),
            walk(LOCK_FID, b"lockme"),
            Tmessage::Lopen(Tlopen {
                fid: LOCK_FID,
                flags: OpenFlags::RDWR,
            }),
            walk(DATA_FID, b"data"),
            Tmessage::Lopen(Tlopen {
                fid: DATA_FID,
                flags: OpenFlags::RDONLY,
            }),
        ];
        for m in &steps {
            let reply = self.call(rq, m);
            check!(
                reply != MsgType::Rlerror && reply != 0,
                "setup step {m:?} failed"
            );
        }
    }

    /// Lets the device run for a while (the Tlocks try, find the lock
    /// held and go to sleep between attempts); nothing is expected back.
    fn settle(&mut self, rq: &mut RequestQueue<Fs>) {
        let until = Instant::now() + SETTLE;
        while Instant::now() < until {
            let back = self.collect(rq, usize::MAX);
            check!(back.is_empty(), "blocked requests came back: {back:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Starts `locks` blocking Tlocks (tags from 1) and lets them block,
    /// then starts `reads` Treads (the next tags) without waiting.
    fn blocked_then_reads(&mut self, rq: &mut RequestQueue<Fs>, locks: u16, reads: u16) {
        self.flood(1, locks, 0);
        self.kick(rq);
        self.settle(rq);
        self.flood(1 + locks, 0, reads);
        self.kick(rq);
    }

    /// Publishes `locks` blocking Tlocks and `reads` Treads, tags from
    /// `first`.
    fn flood(&mut self, first: u16, locks: u16, reads: u16) {
        for i in 0..locks {
            let m = Tmessage::Lock(Tlock {
                fid: LOCK_FID,
                ty: LockType::Wrlck,
                flags: LockFlags::BLOCK,
                start: 0,
                length: 0,
                proc_id: u32::from(i),
                client_id: b"embed".to_vec(),
            });
            self.publish(first + i, &m, 64);
        }
        for i in 0..reads {
            let m = Tmessage::Read(Tread {
                fid: DATA_FID,
                offset: (u64::from(i) * 4096 * 7) % (DATA_LEN as u64),
                count: 4096,
            });
            self.publish(first + locks + i, &m, 4096 + 11);
        }
    }
}

fn walk(newfid: u32, name: &[u8]) -> Tmessage {
    Tmessage::Walk(Twalk {
        fid: 0,
        newfid,
        wnames: vec![name.to_vec()],
    })
}

fn new_device(server: &Arc<Server<Fs>>, pool: &Arc<StackPool>) -> RequestQueue<Fs> {
    let config = {
        let mut ecfg = EngineConfig::default();
        ecfg.workers = 2;
        ecfg.max_in_flight = usize::from(QUEUE_SIZE);
        ecfg.offload = OffloadPolicy::Always;
        ecfg
    };
    RequestQueue::new(
        Arc::clone(server),
        Arc::new(Session::new()),
        Arc::clone(pool),
        &config,
        true,
    )
    .unwrap_or_else(|e| fail(format!("cannot build the device: {e}")))
}

/// Holds a write lock on `path` (an OFD lock, which conflicts with the
/// server's own OFD locks in this process) while it lives.
fn hold_lock(path: &Path) -> File {
    let f = File::options()
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| fail(format!("open {}: {e}", path.display())));
    // SAFETY: an all-zero flock is a valid value; the fields are set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: fcntl reads the flock we pass, valid for the call, on an
    // open fd.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    check!(
        r == 0,
        "cannot lock {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    f
}

fn main() -> ExitCode {
    let dir = std::env::temp_dir().join(format!("embed-abort-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(format!("mkdir: {e}")));
    std::fs::write(dir.join("lockme"), b"x").unwrap_or_else(|e| fail(format!("write: {e}")));
    std::fs::write(dir.join("data"), vec![7u8; DATA_LEN])
        .unwrap_or_else(|e| fail(format!("write: {e}")));
    let _lock = hold_lock(&dir.join("lockme"));

    let fs = PassthroughFs::new(PassthroughConfig::new(&dir))
        .unwrap_or_else(|e| fail(format!("cannot open the export: {e}")));
    let server = Arc::new(
        Server::new(fs, {
            let mut cfg = Config::default();
            cfg.msize_max = MSIZE;
            cfg.lock_wait = None;
            // Every Tlock of the flood waits: none answers BLOCKED.
            cfg.max_lock_waiters = usize::MAX;
            cfg
        })
        .unwrap_or_else(|e| fail(format!("server: {e}"))),
    );
    let pool = Arc::new(
        StackPool::new(PoolConfig::default().stack_size(DEFAULT_STACK_SIZE))
            .unwrap_or_else(|e| fail(format!("stack pool: {e}"))),
    );

    let start = Instant::now();
    let mut rounds = 0;
    let (mut flushes, mut reset_requests, mut dropped_requests) = (0usize, 0usize, 0usize);
    // Suspended requests resumed with "cancelled" (before each disconnect).
    let mut cancel_resumes = 0u64;
    let mut rq = new_device(&server, &pool);
    while rounds < ROUNDS && start.elapsed() < TIME_LIMIT {
        let mem = Arc::new(guest_memory(MEMORY));

        // 1. Tflush at blocked Tlocks and at reads in flight.
        {
            let mut g = Guest::new(&mem);
            g.attach(&mut rq);
            g.blocked_then_reads(&mut rq, 128, 128);
            for old in 1..=256u16 {
                g.publish(1000 + old, &Tmessage::Flush(Tflush { oldtag: old }), 64);
            }
            g.kick(&mut rq);
            let replies = g.collect(&mut rq, 0);
            check!(
                g.published.is_empty(),
                "{} chains never came back after the flushes",
                g.published.len()
            );
            let rflush = replies
                .iter()
                .filter(|(ty, _, reply)| *ty == MsgType::Tflush && *reply == MsgType::Rflush)
                .count();
            check!(rflush == 256, "{rflush} of 256 Tflush got an Rflush");
            let locked = replies
                .iter()
                .filter(|(ty, _, reply)| *ty == MsgType::Tlock && *reply == MsgType::Rlock)
                .count();
            check!(locked == 0, "{locked} Tlocks got a lock the host holds");
            check!(
                rq.in_flight() == 0,
                "{} requests left after the flushes",
                rq.in_flight()
            );
            flushes += rflush;
        }

        // 2. Reset with 1024 requests in flight.
        {
            let mut g = Guest::new(&mem);
            g.attach(&mut rq);
            g.blocked_then_reads(&mut rq, 512, 512);
            // Finished reads stay in flight until the device polls.
            let running = rq.in_flight();
            check!(
                running == 1024,
                "{running} of 1024 requests in flight before the reset"
            );
            let leaked = rq.cancel_all();
            check!(leaked == 0, "the reset leaked {leaked} requests");
            check!(
                rq.in_flight() == 0,
                "{} requests left after the reset",
                rq.in_flight()
            );
            // The driver reset the ring: the chains are not returned.
            rq.discard_completed();
            rq.reset(true)
                .unwrap_or_else(|e| fail(format!("queue reset: {e}")));
            reset_requests += running;
        }

        // 3. Disconnect with requests in flight: the device goes away.
        {
            let mut g = Guest::new(&mem);
            g.attach(&mut rq);
            g.blocked_then_reads(&mut rq, 128, 128);
            dropped_requests += rq.in_flight();
            let st = rq.engine_stats();
            cancel_resumes += st.cancel_resumes;
            check!(st.unwound == 0 && st.leaked == 0, "engine counters {st:?}");
            drop(rq);
            rq = new_device(&server, &pool);
        }
        rounds += 1;
    }
    let st = rq.engine_stats();
    check!(st.unwound == 0, "engine counters {st:?}");
    drop(rq);
    let _ = std::fs::remove_dir_all(&dir);
    check!(rounds > 0, "no round ran");
    println!(
        "embed_abort: ok: {rounds} rounds in {:.1} s: {flushes} Rflush, {reset_requests} requests reset, {dropped_requests} dropped by disconnect, {cancel_resumes} resumed cancelled, panic = {}",
        start.elapsed().as_secs_f64(),
        if cfg!(panic = "abort") { "abort" } else { "unwind" }
    );
    ExitCode::SUCCESS
}
