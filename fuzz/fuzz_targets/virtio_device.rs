// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! 9P requests in fuzzed descriptor chains into virtio-9p-server's virtio
//! request queue (`virtio::RequestQueue`: the chain walk under the large
//! policy, the coroutine engine, Tflush handling and the server), with the
//! driver side played by virtqueue-large's mock.
//!
//! One request queue per fuzzing process (its engine starts worker
//! threads), serving `vmm_fuzz_common::sandbox::Sandbox`'s export; every
//! input gets fresh guest memory and rings, the seed export (laid out again
//! when the input before changed it) and a Tversion of the harness first,
//! which resets the 9P session.
//!
//! Checked: the queue never breaks on the mock's valid chains; after the
//! final kick every chain comes back; each used length fits the chain's
//! writable part, and a non-empty reply decodes strictly within the msize
//! with the request's tag (Rflush for Tflush, Rlerror with a real errno);
//! nothing outside the export is opened, read or changed.

#![no_main]

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coro_pool::{PoolConfig, StackPool};
use libfuzzer_sys::fuzz_target;
use virtio_9p_server::engine::{EngineConfig, OffloadPolicy, DEFAULT_STACK_SIZE};
use virtio_9p_server::protocol::*;
use virtio_9p_server::virtio::RequestQueue;
use virtio_9p_server::{PassthroughFs, Server, Session};
use virtio_queue::QueueT;
use virtqueue_large::mock::{guest_memory, Buf, ChainLayout, Layout, MockDriver, UsedEntry};
use vm_memory::GuestMemoryMmap;
use vmm_fuzz_common::device::{DeviceInput, DeviceStep};
use vmm_fuzz_common::p9::SERVER_MSIZE;
use vmm_fuzz_common::sandbox::Sandbox;

/// Guest memory per input.
const MEMORY: usize = 8 << 20;
/// The largest queue a [`DeviceInput`] asks for.
const MAX_QUEUE: usize = 64;

struct State {
    sandbox: Sandbox,
    /// One queue per (security model, read-only) pair, created on demand.
    queues: HashMap<(u8, bool, bool), RequestQueue<PassthroughFs>>,
    pool: Arc<StackPool>,
}

thread_local! {
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

fn new_queue(state: &State, input: &DeviceInput) -> RequestQueue<PassthroughFs> {
    let c = input.config;
    let cfg = c.passthrough(state.sandbox.export());
    let fs = PassthroughFs::new(cfg).expect("open the export");
    let config = vmm_fuzz_common::p9::server_config();
    let server = Arc::new(Server::new(fs, config).expect("server"));
    let engine = {
        let mut ecfg = EngineConfig::default();
        ecfg.workers = 1;
        ecfg.max_in_flight = MAX_QUEUE;
        ecfg.offload = OffloadPolicy::Never;
        ecfg
    };
    RequestQueue::new(
        server,
        Arc::new(Session::new()),
        Arc::clone(&state.pool),
        &engine,
        input.indirect,
    )
    .expect("request queue")
}

struct Published {
    chain: ChainLayout,
    writable: u64,
    header: Option<Header>,
}

struct Run<'a> {
    mem: Arc<GuestMemoryMmap<()>>,
    driver: MockDriver<'a, GuestMemoryMmap<()>>,
    queue: virtio_queue::Queue,
    published: HashMap<u16, Published>,
    returned: usize,
    total: usize,
}

impl Run<'_> {
    fn publish(&mut self, frame: &[u8], pieces: u8, writable: &[u16], indirect: bool) -> bool {
        let pieces = usize::from(pieces % 8) + 1;
        let per = frame.len().div_ceil(pieces).max(1);
        let mut bufs: Vec<Buf> = frame.chunks(per).map(|c| Buf::r(c.len() as u32)).collect();
        if bufs.is_empty() {
            bufs.push(Buf::r(0));
        }
        if writable.is_empty() {
            bufs.push(Buf::w(SERVER_MSIZE));
        } else {
            bufs.extend(writable.iter().map(|w| Buf::w(u32::from(*w))));
        }
        let layout = if indirect {
            Layout::Indirect
        } else {
            Layout::Direct
        };
        let Ok(chain) = self.driver.add_chain(layout, &bufs) else {
            return false; // ring or data area full
        };
        self.driver
            .fill_readable(&chain, frame)
            .expect("fill request");
        let header = frame
            .get(..HEADER_SIZE)
            .map(|h| Header::from_bytes(h.try_into().expect("7 bytes")));
        let writable = bufs
            .iter()
            .filter(|b| b.writable)
            .map(|b| u64::from(b.len))
            .sum();
        let head = chain.head;
        assert!(self
            .published
            .insert(
                head,
                Published {
                    chain,
                    writable,
                    header
                }
            )
            .is_none());
        self.total += 1;
        true
    }

    fn kick(&mut self, rq: &mut RequestQueue<PassthroughFs>) {
        rq.process(&mut self.queue, Arc::clone(&self.mem))
            .expect("valid chains never break the queue");
        assert!(!rq.is_broken());
        self.collect(rq);
    }

    fn collect(&mut self, rq: &mut RequestQueue<PassthroughFs>) {
        rq.poll();
        rq.complete(&mut self.queue, &*self.mem).expect("used ring");
        for UsedEntry { id, len } in self.driver.take_used() {
            let head = u16::try_from(id).expect("used id fits a head");
            let p = self
                .published
                .remove(&head)
                .expect("used entry for a published chain");
            self.returned += 1;
            assert!(
                u64::from(len) <= p.writable,
                "used length {len} over {} writable bytes",
                p.writable
            );
            if len == 0 {
                continue;
            }
            let reply = self.read_reply(&p.chain, len as usize);
            let reply = &reply[..];
            let (tag, msg) = Rmessage::decode_frame(reply, SERVER_MSIZE)
                .unwrap_or_else(|e| panic!("malformed reply {reply:02x?}: {e}"));
            let h = p.header.expect("a reply to a request without a header");
            assert_eq!(tag, h.tag, "reply tag");
            match msg {
                Rmessage::Lerror(errno) => assert!((1..4096).contains(&errno), "Rlerror {errno}"),
                m => assert_eq!(
                    u8::from(m.msg_type()),
                    h.ty.wrapping_add(1),
                    "reply type to request type {}",
                    h.ty
                ),
            }
        }
    }

    /// The first `len` bytes of the chain's writable buffers (not all of
    /// them: most replies are far shorter than the msize buffers).
    fn read_reply(&self, chain: &ChainLayout, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len);
        for (addr, size, _) in chain.buffers.iter().filter(|b| b.2) {
            if out.len() == len {
                break;
            }
            let n = (*size as usize).min(len - out.len());
            out.extend(self.driver.read(*addr, n).expect("read reply"));
        }
        assert_eq!(out.len(), len, "used length over the writable buffers");
        out
    }

    /// Kicks and polls until every chain is back.
    fn finish(&mut self, rq: &mut RequestQueue<PassthroughFs>) {
        self.kick(rq);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.published.is_empty() || rq.in_flight() > 0 {
            assert!(
                Instant::now() < deadline,
                "{} requests never completed",
                rq.in_flight()
            );
            std::thread::sleep(Duration::from_micros(200));
            // A kick's work budget can leave chains on the ring; the queue
            // then signals its resume fd, which a VMM polls beside the kick.
            if fd_readable(rq.more_fd()) {
                rq.clear_more();
                self.kick(rq);
            } else {
                self.collect(rq);
            }
        }
        assert_eq!(self.returned, self.total);
    }
}

/// Whether `fd` is readable now.
fn fd_readable(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no timeout.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

fuzz_target!(|data: &[u8]| {
    let input = DeviceInput::decode(data);
    STATE.with(|cell| {
        let mut guard = cell.borrow_mut();
        let state = guard.get_or_insert_with(|| State {
            sandbox: Sandbox::new("virtio-device").expect("fuzz sandbox"),
            queues: HashMap::new(),
            pool: Arc::new(
                StackPool::new(PoolConfig::default().stack_size(DEFAULT_STACK_SIZE))
                    .expect("stack pool"),
            ),
        });
        state
            .sandbox
            .reset_export_if_changed()
            .expect("reset the export");
        let c = input.config;
        let key = (c.security_model, c.readonly, c.openat2);
        if !state.queues.contains_key(&key) {
            let q = new_queue(state, &input);
            state.queues.insert(key, q);
        }
        let rq = state.queues.get_mut(&key).expect("queue");
        rq.reset(input.indirect).expect("reset the queue");

        let mem = Arc::new(guest_memory(MEMORY));
        let mem_ref: &GuestMemoryMmap<()> = &mem;
        let driver = MockDriver::new(mem_ref, input.queue_size());
        let mut queue = driver.create_queue();
        queue.set_event_idx(input.event_idx);
        let mut run = Run {
            mem: Arc::clone(&mem),
            driver,
            queue,
            published: HashMap::new(),
            returned: 0,
            total: 0,
        };
        // The harness's Tversion resets the session of the long-lived queue.
        let version = Tmessage::Version(Tversion {
            msize: SERVER_MSIZE,
            version: VERSION_9P2000_L.to_vec(),
        })
        .encode_frame(NOTAG);
        assert!(run.publish(&version, 0, &[], false));
        run.kick(rq);
        for step in &input.steps {
            match step {
                DeviceStep::Kick => run.kick(rq),
                DeviceStep::Request {
                    frame,
                    pieces,
                    writable,
                    indirect,
                } => {
                    if !run.publish(frame, *pieces, writable, *indirect) {
                        // Full: let the device catch up, then retry once.
                        run.finish(rq);
                        run.publish(frame, *pieces, writable, *indirect);
                    }
                }
            }
        }
        run.finish(rq);
        let bad = state.sandbox.violations();
        assert!(bad.is_empty(), "touched outside the export: {bad:?}");
        assert!(
            state.sandbox.canary_unchanged(),
            "the canary beside the export changed"
        );
    });
});
