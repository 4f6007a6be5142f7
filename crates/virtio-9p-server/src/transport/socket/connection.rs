// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The connection loop: one socket thread's epoll loop over its
//! connections. It reads frames, starts each request on the engine,
//! and writes the replies in the order they finish.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::buffers::{reply_room, trim_heap, BufPool, KEEP_BUFFER};
use super::fairness::{thread_slots, worker_bound, worker_turns};
use super::hub::{Shared, ThreadCtx};
use super::listener::DUPLICATE_TAG_ERRNO;
use super::splice::{
    self, Filled, PipePool, SharedPipes, SigpipeBlocked, SockWriter, Splicer, Tail,
};
use super::splice::{rread_tail, set_rread_count};
use super::stream::StreamState;
use crate::engine::{self, Engine, EngineConfig, EngineExec};
use crate::error::Result;
use crate::fs::Filesystem;
use crate::io::SliceReader;
use crate::protocol::{Header, MsgType, Rmessage, HEADER_SIZE};
use crate::server::{Cancel, Session};
use crate::sys::{read_some, send_fd};

/// Epoll data of the thread's own fds; connections use their id.
pub(super) const EV_NEW: u64 = 0;
pub(super) const EV_ENGINE: u64 = 1;
/// The first connection id.
pub(super) const FIRST_CONN: u32 = 16;

/// The input state of a connection.
pub(super) enum Input {
    /// Reading the 7-byte header (`have` 0: between frames).
    Header { hdr: [u8; HEADER_SIZE], have: usize },
    /// Reading the rest of a frame into `buf`.
    Body {
        buf: Vec<u8>,
        size: usize,
        have: usize,
    },
    /// Reading the fixed part of a large Twrite (streamed after it).
    TwriteHead {
        head: [u8; TWRITE_HEAD],
        have: usize,
    },
    /// A streamed Twrite owns the socket's input until it finishes.
    Streaming,
    /// Dropping `left` bytes of a frame, then answering `tag` with
    /// `errno` (if any).
    Skip {
        left: u64,
        answer: Option<(u16, u32)>,
    },
}

/// Header plus `fid[4] offset[8] count[4]` of a Twrite.
pub(super) const TWRITE_HEAD: usize = HEADER_SIZE + 16;

impl Input {
    pub(super) fn header() -> Input {
        Input::Header {
            hdr: [0; HEADER_SIZE],
            have: 0,
        }
    }

    /// Between two frames: the next byte starts a new request.
    pub(super) fn at_boundary(&self) -> bool {
        matches!(self, Input::Header { have: 0, .. })
    }
}

/// One reply waiting to be written: `buf[..len]`, then the spliced data
/// of an Rread.
pub(super) struct Out {
    pub(super) buf: Vec<u8>,
    pub(super) len: usize,
    /// Whether `buf` came from the pool.
    pub(super) pooled: bool,
    pub(super) tail: Option<Tail>,
}

impl Out {
    /// Bytes of the whole reply.
    pub(super) fn total(&self) -> usize {
        self.len + self.tail.as_ref().map_or(0, |t| t.len)
    }
}

pub(super) struct Conn<F: Filesystem> {
    pub(super) sock: Arc<File>,
    pub(super) session: Arc<Session<F>>,
    pub(super) input: Input,
    pub(super) out: VecDeque<Out>,
    /// Bytes of the front reply already written.
    pub(super) out_pos: usize,
    /// Requests started, or answered and not yet written.
    pub(super) in_flight: usize,
    /// Bytes of the replies waiting to be written.
    pub(super) out_bytes: usize,
    /// The epoll events registered now.
    pub(super) interest: EventSet,
    /// Request slots of the thread this connection holds: its requests
    /// on the engine, plus the frame being read (see "Fairness").
    pub(super) slots: usize,
    /// One of `slots` is the thread's first-slot reserve.
    pub(super) first: bool,
    /// The frame being read holds a slot (taken with its first byte).
    pub(super) reserved: bool,
    /// Waiting in the thread's queue for a slot.
    pub(super) queued: bool,
    /// When the frame being read started, and its bytes so far (the
    /// minimum-rate check).
    pub(super) frame_start: Option<Instant>,
    pub(super) frame_got: usize,
    /// A Tversion waiting for the connection's other requests to end.
    pub(super) version: Option<(Vec<u8>, usize)>,
    /// A request that always runs on a worker, waiting for its turn
    /// ("Workers" in the module docs).
    pub(super) held: Option<(Vec<u8>, usize)>,
}

/// What a request hands back to its socket thread when it finishes.
#[derive(Default)]
pub(super) struct Handoff {
    pub(super) request: Cell<Option<Vec<u8>>>,
    pub(super) reply: Cell<Option<Vec<u8>>>,
    /// An Rread's data, spliced into a pipe.
    pub(super) spliced: Cell<Option<Filled>>,
}

/// A request in flight, by its engine token.
pub(super) struct Req {
    pub(super) conn: u32,
    pub(super) handoff: Rc<Handoff>,
    /// For a streamed Twrite: its state and the frame's size.
    pub(super) stream: Option<(Arc<StreamState>, usize)>,
    /// It counts against the thread's worker turns.
    pub(super) on_worker: bool,
}

/// Why a connection ends.
pub(super) enum Close {
    /// The client hung up.
    HungUp,
    /// A framing or socket error.
    Failed(io::Error),
}

/// Which reserve a new request slot comes from (see "Fairness").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    /// The connection's first slot, from the reserve kept for
    /// connections that have nothing running.
    First,
    /// A further slot, from the shared part.
    Shared,
}

pub(super) struct Loop<F: Filesystem> {
    pub(super) shared: Shared<F>,
    pub(super) epoll: Epoll,
    pub(super) engine: Engine,
    pub(super) exec: EngineExec,
    pub(super) conns: HashMap<u32, Conn<F>>,
    pub(super) next_conn: u32,
    pub(super) reqs: Vec<Option<Req>>,
    pub(super) free_tokens: Vec<u16>,
    /// Requests of this thread on the engine (all connections, closed
    /// ones too until their calls return).
    pub(super) live: usize,
    /// Frames being read that hold a slot.
    pub(super) reserved: usize,
    /// Replies in pooled buffers waiting to be written.
    pub(super) queued: usize,
    /// Most requests this thread runs at once (its share of
    /// [`SocketLimits::max_requests`](super::SocketLimits::max_requests)).
    pub(super) thread_cap: usize,
    /// Slots kept for connections with nothing running.
    pub(super) first_slots: usize,
    /// Connections holding one of those.
    pub(super) firsts: usize,
    /// Most slots one connection holds.
    pub(super) share: usize,
    /// Connections waiting for a slot, served in turn.
    pub(super) waitq: VecDeque<u32>,
    /// A slot was freed since the queue was last served.
    pub(super) released: bool,
    /// Requests of worker-bound types running, the most at once, and the
    /// connections whose next one waits for a turn.
    pub(super) on_workers: usize,
    pub(super) worker_turns: usize,
    pub(super) workq: VecDeque<u32>,
    /// Some connection may be in the middle of a frame: check rates.
    pub(super) stall_watch: bool,
    pub(super) next_stall_check: Instant,
    pub(super) bufs: BufPool,
    /// Pipes for spliced Rreads, shared with this thread's requests.
    pub(super) pipes: SharedPipes,
    pub(super) done: Vec<(u16, u32)>,
    /// Connections whose output or interest may need work.
    pub(super) dirty: Vec<u32>,
    /// Why the last connection that failed ended (for [`serve_connection`](super::serve_connection)).
    pub(super) last_error: Option<io::Error>,
    pub(super) ctx_rx: mpsc::Receiver<OwnedFd>,
    pub(super) ctx_wake: EventFd,
    pub(super) conns_count: Arc<AtomicUsize>,
    pub(super) active: Arc<AtomicUsize>,
}

/// A connection whose unwritten replies reach this many bytes reads no
/// further request until the client has taken some: a client that does not
/// read its replies makes the server stop reading, and the replies in the
/// making stay few (and warm in the cache) however many requests the client
/// keeps outstanding.
pub(crate) const OUT_HIGH_WATER: usize = 256 << 10;

/// Whether a request that started arriving at `start` and has `got`
/// bytes now falls below the minimum rate: once `grace` has passed, it
/// must have kept up `rate` bytes a second over the time since (`rate`
/// 0: never).
pub(super) fn too_slow(
    rate: usize,
    grace: Duration,
    start: Instant,
    got: usize,
    now: Instant,
) -> bool {
    if rate == 0 {
        return false;
    }
    let late = now.saturating_duration_since(start);
    let Some(over) = late.checked_sub(grace) else {
        return false;
    };
    (got as f64) < over.as_secs_f64() * rate as f64
}

/// How often a socket thread checks the rate of frames being read.
pub(super) const STALL_CHECK: Duration = Duration::from_millis(250);

pub(super) fn too_slow_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "request arriving below the minimum rate",
    )
}

pub(super) fn run_thread<F: Filesystem + 'static>(
    ctx: ThreadCtx<F>,
    single: bool,
) -> io::Result<()> {
    // Splices into sockets raise SIGPIPE on a hang-up: keep it pending on
    // this thread (and take it) rather than let it reach the process.
    let _sigpipe = SigpipeBlocked::new();
    let (thread_cap, first_slots, share) = thread_slots(&ctx.shared.limits);
    let worker_turns = worker_turns(&ctx.shared.limits);
    let engine_config = EngineConfig {
        workers: 0,
        executor: ctx.shared.executor.clone(),
        max_in_flight: thread_cap,
        ..EngineConfig::default()
    };
    let engine =
        Engine::new(Arc::clone(&ctx.shared.pool), &engine_config).map_err(io::Error::other)?;
    let epoll = Epoll::new()?;
    epoll.ctl(
        ControlOperation::Add,
        ctx.wake.as_raw_fd(),
        EpollEvent::new(EventSet::IN, EV_NEW),
    )?;
    for fd in engine.fds() {
        epoll.ctl(
            ControlOperation::Add,
            fd,
            EpollEvent::new(EventSet::IN, EV_ENGINE),
        )?;
    }
    let mut l = Loop {
        bufs: BufPool {
            free: Vec::new(),
            budget: Arc::clone(&ctx.shared.budget),
        },
        pipes: Arc::new(Mutex::new(PipePool::new(splice::MAX_PIPES))),
        shared: ctx.shared,
        epoll,
        engine,
        exec: EngineExec::new(engine_config.offload),
        conns: HashMap::new(),
        next_conn: FIRST_CONN,
        reqs: Vec::new(),
        free_tokens: Vec::new(),
        live: 0,
        reserved: 0,
        thread_cap,
        first_slots,
        firsts: 0,
        share,
        waitq: VecDeque::new(),
        released: false,
        on_workers: 0,
        worker_turns,
        workq: VecDeque::new(),
        stall_watch: false,
        next_stall_check: Instant::now(),
        queued: 0,
        done: Vec::new(),
        dirty: Vec::new(),
        last_error: None,
        ctx_rx: ctx.rx,
        ctx_wake: ctx.wake,
        conns_count: ctx.conns,
        active: ctx.active,
    };
    l.run(single)
}

impl<F: Filesystem + 'static> Loop<F> {
    /// Serves until the thread's channel closes, or with `single` until
    /// its one connection ends (with that connection's result).
    pub(super) fn run(&mut self, single: bool) -> io::Result<()> {
        let mut events = vec![EpollEvent::default(); 64];
        let mut served_one = false;
        loop {
            let pipes = splice::lock(&self.pipes).next_expiry();
            let stalls = self.stall_watch.then(|| {
                self.next_stall_check
                    .saturating_duration_since(Instant::now())
            });
            let pending = !self.dirty.is_empty()
                || (self.released && !self.waitq.is_empty())
                || (self.on_workers < self.worker_turns && !self.workq.is_empty());
            let timeout = match self
                .bufs
                .next_expiry()
                .into_iter()
                .chain(pipes)
                .chain(stalls)
                .min()
            {
                _ if pending => 0,
                Some(left) => left.as_millis().clamp(1, i32::MAX as u128) as i32,
                None => -1,
            };
            let n = match self.epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            for ev in &events[..n] {
                match ev.data() {
                    EV_NEW => {
                        let _ = self.ctx_wake.read();
                        while let Ok(fd) = self.ctx_rx.try_recv() {
                            served_one = true;
                            self.open(fd);
                        }
                    }
                    EV_ENGINE => self.engine.poll(),
                    id => self.on_conn_event(id as u32, ev.event_set()),
                }
            }
            self.collect();
            self.settle();
            self.check_stalls();
            if single && served_one && self.conns.is_empty() {
                // Let the requests of the closed connection return.
                while self.live > 0 {
                    self.engine.poll();
                    self.collect();
                    if self.live > 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                return self.last_error.take().map_or(Ok(()), Err);
            }
        }
    }

    pub(super) fn open(&mut self, fd: OwnedFd) {
        let id = self.next_conn;
        self.next_conn = self.next_conn.checked_add(1).unwrap_or(FIRST_CONN);
        let sock = Arc::new(File::from(fd));
        if let Err(e) = self.epoll.ctl(
            ControlOperation::Add,
            sock.as_raw_fd(),
            EpollEvent::new(EventSet::IN, u64::from(id)),
        ) {
            error!("9p: cannot watch a new connection: {e}");
            self.conns_count.fetch_sub(1, Ordering::AcqRel);
            self.active.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        if self.shared.server.log_limit().admit() {
            info!("9p: connection {id} opened");
        }
        self.conns.insert(
            id,
            Conn {
                sock,
                session: Arc::new(Session::new()),
                input: Input::header(),
                out: VecDeque::new(),
                out_pos: 0,
                in_flight: 0,
                out_bytes: 0,
                interest: EventSet::IN,
                slots: 0,
                first: false,
                reserved: false,
                queued: false,
                frame_start: None,
                frame_got: 0,
                version: None,
                held: None,
            },
        );
    }

    pub(super) fn close(&mut self, id: u32, why: Close) {
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        let _ = self.epoll.ctl(
            ControlOperation::Delete,
            conn.sock.as_raw_fd(),
            EpollEvent::default(),
        );
        let left = self.engine.cancel_group(id);
        match why {
            Close::HungUp => {
                if self.shared.server.log_limit().admit() {
                    info!("9p: connection {id} closed");
                }
            }
            Close::Failed(e) => {
                if self.shared.server.log_limit().admit() {
                    warn!("9p: connection {id} ended: {e}");
                }
                self.last_error = Some(e);
            }
        }
        if left > 0 {
            debug!("9p: connection {id}: {left} requests still in filesystem calls");
        }
        // Its requests still running hold plain slots until they return.
        if conn.reserved {
            self.reserved -= 1;
        }
        if conn.first {
            self.firsts -= 1;
        }
        self.released = true;
        for (buf, _) in conn.version.into_iter().chain(conn.held) {
            self.bufs.put(buf, self.keep());
        }
        for o in conn.out {
            if o.pooled {
                self.queued -= 1;
                self.bufs.put(o.buf, self.keep());
            }
        }
        self.conns_count.fetch_sub(1, Ordering::AcqRel);
        self.active.fetch_sub(1, Ordering::AcqRel);
    }

    pub(super) fn on_conn_event(&mut self, id: u32, ev: EventSet) {
        if ev.contains(EventSet::OUT) {
            self.dirty.push(id);
        }
        if ev.intersects(EventSet::IN | EventSet::HANG_UP | EventSet::ERROR) {
            if let Err(why) = self.read_conn(id, false) {
                self.close(id, why);
                return;
            }
            if ev.intersects(EventSet::HANG_UP | EventSet::ERROR) {
                // Nothing more to read and nowhere to write.
                if self.conns.get(&id).is_some_and(|c| !self.readable(c)) {
                    self.close(id, Close::HungUp);
                }
            }
        }
    }

    /// frame takes a shared slot ahead of the others waiting.
    pub(super) fn read_conn(
        &mut self,
        id: u32,
        mut from_queue: bool,
    ) -> std::result::Result<(), Close> {
        // A bounded number of frames per wakeup keeps connections fair.
        for _ in 0..64 {
            // Send what finished at once (a cached read runs inline), so
            // the client reads replies while the next requests run.
            self.collect();
            self.flush_out(id).map_err(Close::Failed)?;
            let Some(c) = self.conns.get(&id) else {
                return Ok(());
            };
            if matches!(c.input, Input::Streaming) {
                break;
            }
            let mut admit = None;
            if c.input.at_boundary() {
                // A new request: it needs the connection's and the
                // thread's room.
                if !self.conn_ready(c) {
                    break;
                }
                match self.admit(c, from_queue) {
                    Some(how) => admit = Some(how),
                    None => {
                        self.enqueue(id);
                        break;
                    }
                }
            }
            let Some(c) = self.conns.get_mut(&id) else {
                return Ok(());
            };
            let sock = Arc::clone(&c.sock);
            match &mut c.input {
                Input::Header { hdr, have } => {
                    let Some(n) = read_some(&sock, &mut hdr[*have..]).map_err(Close::Failed)?
                    else {
                        break;
                    };
                    if n == 0 {
                        return Err(Close::HungUp);
                    }
                    *have += n;
                    let (hdr, have) = (*hdr, *have);
                    if let Some(how) = admit {
                        from_queue = false;
                        self.reserve(id, how);
                    }
                    self.got(id, n);
                    if have < HEADER_SIZE {
                        continue;
                    }
                    self.on_header(id, hdr)?;
                }
                Input::Body { buf, size, have } => {
                    let Some(n) =
                        read_some(&sock, &mut buf[*have..*size]).map_err(Close::Failed)?
                    else {
                        break;
                    };
                    if n == 0 {
                        return Err(Close::HungUp);
                    }
                    *have += n;
                    if *have == *size {
                        let (size, buf) = (*size, std::mem::take(buf));
                        c.input = Input::header();
                        c.frame_start = None;
                        self.start(id, buf, size);
                    } else {
                        self.got(id, n);
                    }
                }
                Input::TwriteHead { head, have } => {
                    let Some(n) = read_some(&sock, &mut head[*have..]).map_err(Close::Failed)?
                    else {
                        break;
                    };
                    if n == 0 {
                        return Err(Close::HungUp);
                    }
                    *have += n;
                    if *have == TWRITE_HEAD {
                        let head = *head;
                        c.input = Input::Streaming;
                        self.got(id, n);
                        self.start_stream(id, head);
                    } else {
                        self.got(id, n);
                    }
                }
                Input::Skip { left, answer } => {
                    if *left > 0 {
                        let mut scratch = [0u8; 8192];
                        let want = scratch.len().min(*left as usize);
                        let Some(n) =
                            read_some(&sock, &mut scratch[..want]).map_err(Close::Failed)?
                        else {
                            break;
                        };
                        if n == 0 {
                            return Err(Close::HungUp);
                        }
                        *left -= n as u64;
                        c.frame_got += n;
                    }
                    if *left == 0 {
                        let answer = answer.take();
                        c.input = Input::header();
                        c.frame_start = None;
                        if let Some((tag, errno)) = answer {
                            self.answer_now(id, tag, errno);
                        }
                    }
                }
                Input::Streaming => break,
            }
        }
        Ok(())
    }

    /// `n` more bytes of the frame being read arrived.
    pub(super) fn got(&mut self, id: u32, n: usize) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.frame_got += n;
        }
    }

    /// Closes the connections whose frame in progress arrives below the
    /// minimum rate ([`SocketLimits::min_request_rate`](super::SocketLimits::min_request_rate)); a streamed
    /// Twrite checks its own.
    pub(super) fn check_stalls(&mut self) {
        if !self.stall_watch {
            return;
        }
        let now = Instant::now();
        if now < self.next_stall_check {
            return;
        }
        self.next_stall_check = now + STALL_CHECK;
        let limits = &self.shared.limits;
        let mut partial = false;
        let mut slow = Vec::new();
        for (&id, c) in &self.conns {
            let Some(start) = c.frame_start else {
                continue;
            };
            partial = true;
            let (rate, grace) = (limits.min_request_rate, limits.request_grace);
            if !matches!(c.input, Input::Streaming)
                && too_slow(rate, grace, start, c.frame_got, now)
            {
                slow.push(id);
            }
        }
        self.stall_watch = partial;
        for id in slow {
            if self.shared.server.log_limit().admit() {
                warn!("9p: closing connection {id}: its request arrives below the minimum rate");
            }
            self.close(id, Close::Failed(too_slow_error()));
        }
    }

    /// A whole header arrived: check the frame size and pick how to read
    /// the rest.
    pub(super) fn on_header(
        &mut self,
        id: u32,
        hdr: [u8; HEADER_SIZE],
    ) -> std::result::Result<(), Close> {
        let Some(c) = self.conns.get_mut(&id) else {
            return Ok(());
        };
        let h = Header::from_bytes(&hdr);
        let size = h.size as usize;
        // A Tversion may announce any msize, but the frame itself is tiny.
        let limit = c.session.frame_limit();
        if size < HEADER_SIZE || h.size > limit {
            if self.shared.server.log_limit().admit() {
                warn!("9p: closing connection {id}: frame size {size} outside 7..={limit}");
            }
            return Err(Close::Failed(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame size {size} outside 7..={limit}"),
            )));
        }
        if h.ty == MsgType::Twrite && size > KEEP_BUFFER {
            let mut head = [0u8; TWRITE_HEAD];
            head[..HEADER_SIZE].copy_from_slice(&hdr);
            c.input = Input::TwriteHead {
                head,
                have: HEADER_SIZE,
            };
            return Ok(());
        }
        let Some(mut buf) = self.bufs.take(size) else {
            // Over the shared budget: drop the frame, answer ENOMEM.
            if self.shared.server.log_limit().admit() {
                warn!(
                    "9p: request of {size} bytes (tag {}) refused: connection buffers are at their limit",
                    h.tag
                );
            }
            c.input = Input::Skip {
                left: (size - HEADER_SIZE) as u64,
                answer: Some((h.tag, libc::ENOMEM as u32)),
            };
            self.unreserve(id);
            return Ok(());
        };
        buf[..HEADER_SIZE].copy_from_slice(&hdr);
        if size == HEADER_SIZE {
            c.input = Input::header();
            c.frame_start = None;
            self.start(id, buf, size);
        } else {
            c.input = Input::Body {
                buf,
                size,
                have: HEADER_SIZE,
            };
        }
        Ok(())
    }

    /// Queues an Rlerror for `tag` without running anything.
    pub(super) fn answer_now(&mut self, id: u32, tag: u16, errno: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let frame = Rmessage::Lerror(errno).encode_frame(tag);
        let len = frame.len();
        c.in_flight += 1;
        c.out_bytes += len;
        c.out.push_back(Out {
            buf: frame,
            len,
            pooled: false,
            tail: None,
        });
        self.dirty.push(id);
    }

    pub(super) fn token(&mut self, req: Req) -> Option<u16> {
        let t = match self.free_tokens.pop() {
            Some(t) => t,
            None if self.reqs.len() < usize::from(u16::MAX) => {
                self.reqs.push(None);
                (self.reqs.len() - 1) as u16
            }
            None => return None,
        };
        self.reqs[usize::from(t)] = Some(req);
        Some(t)
    }

    /// Runs the buffered request `buf[..size]` on the engine.
    pub(super) fn start(&mut self, id: u32, buf: Vec<u8>, size: usize) {
        let Some(c) = self.conns.get_mut(&id) else {
            self.bufs.put(buf, self.keep());
            return;
        };
        let h = Header::from_bytes(buf[..HEADER_SIZE].try_into().unwrap_or(&[0; HEADER_SIZE]));
        if h.ty == MsgType::Tversion && c.slots > 1 {
            // Tversion aborts the connection's requests in flight: they
            // are cancelled, and it runs once the last has returned, so
            // no reply of theirs follows the Rversion.
            c.version = Some((buf, size));
            self.engine.cancel_group(id);
            self.dirty.push(id);
            return;
        }
        let on_worker = worker_bound(h.ty);
        if on_worker && self.on_workers >= self.worker_turns {
            // Its turn comes when a worker-bound request of the thread
            // returns; a connection with nothing else running goes first.
            let alone = c.slots == 1;
            c.held = Some((buf, size));
            if alone {
                self.workq.push_front(id);
            } else {
                self.workq.push_back(id);
            }
            self.dirty.push(id);
            return;
        }
        let limit = c.session.frame_limit();
        let session = Arc::clone(&c.session);
        if self.engine.has_tag(id, h.tag) {
            if self.shared.server.log_limit().admit() {
                warn!("9p: connection {id}: tag {} is already in flight", h.tag);
            }
            self.bufs.put(buf, self.keep());
            self.unreserve(id);
            self.answer_now(id, h.tag, DUPLICATE_TAG_ERRNO as u32);
            return;
        }
        let mut room = reply_room(&buf[..size], limit);
        let reply = match self.bufs.take(room) {
            Some(r) => r,
            None => {
                // A shorter Rread/Rreaddir, as POSIX allows.
                room = KEEP_BUFFER.min(limit as usize);
                match self.bufs.take(room) {
                    Some(r) => r,
                    None => {
                        self.bufs.put(buf, self.keep());
                        self.unreserve(id);
                        self.answer_now(id, h.tag, libc::ENOMEM as u32);
                        return;
                    }
                }
            }
        };
        let server = Arc::clone(&self.shared.server);
        let exec = self.exec;
        let handoff = Rc::new(Handoff::default());
        let back = Rc::clone(&handoff);
        // An Rread may go out as its header plus a spliced file range.
        let splicer = (h.ty == MsgType::Tread && self.shared.limits.splice_reads)
            .then(|| Splicer::new(Arc::clone(&self.pipes)));
        let task = move |cancel: Cancel| {
            let mut reply = reply;
            let r = server.handle(
                &session,
                &mut SliceReader::new(&buf[..size]),
                &mut SockWriter::new(&mut reply[..room], splicer.as_ref(), exec),
                &exec,
                &cancel,
            );
            back.request.set(Some(buf));
            back.reply.set(Some(reply));
            back.spliced.set(splicer.as_ref().and_then(Splicer::take));
            reply_len(r, &cancel)
        };
        self.spawn(id, h.tag, handoff, None, on_worker, task);
    }

    pub(super) fn spawn(
        &mut self,
        id: u32,
        tag: u16,
        handoff: Rc<Handoff>,
        stream: Option<(Arc<StreamState>, usize)>,
        on_worker: bool,
        task: impl FnOnce(Cancel) -> u32 + 'static,
    ) {
        let streaming = stream.is_some();
        let Some(token) = self.token(Req {
            conn: id,
            handoff: Rc::clone(&handoff),
            stream,
            on_worker,
        }) else {
            if self.shared.server.log_limit().admit() {
                warn!("9p: connection {id}: no request slot for tag {tag}");
            }
            self.unreserve(id);
            self.answer_now(id, tag, libc::EAGAIN as u32);
            return;
        };
        self.take_reservation(id);
        if let Some(c) = self.conns.get_mut(&id) {
            c.in_flight += 1;
        }
        self.live += 1;
        if on_worker {
            self.on_workers += 1;
        }
        // Its interest may change (in-flight limit, streaming).
        self.dirty.push(id);
        let cancel = Cancel::new();
        let token_cancel = cancel.clone();
        if let Err(e) = self
            .engine
            .spawn_in(id, token, Some(tag), cancel, move || task(token_cancel))
        {
            // The task (and its buffers) is dropped unrun.
            error!("9p: connection {id}: cannot start tag {tag}: {e}");
            self.reqs[usize::from(token)] = None;
            self.free_tokens.push(token);
            self.live -= 1;
            if on_worker {
                self.on_workers -= 1;
            }
            self.drop_slot(id);
            if let Some(c) = self.conns.get_mut(&id) {
                c.in_flight -= 1;
                if streaming {
                    c.input = Input::header();
                    // The frame cannot be skipped reliably: end it.
                    self.close(
                        id,
                        Close::Failed(io::Error::other("cannot start a streamed Twrite")),
                    );
                    return;
                }
            }
            self.answer_now(id, tag, libc::ENOMEM as u32);
        }
    }

    /// Routes finished requests to their connections' output.
    pub(super) fn collect(&mut self) {
        self.engine.take_completed(&mut self.done);
        let done = std::mem::take(&mut self.done);
        let mut slow = Vec::new();
        for &(token, len) in &done {
            let Some(req) = self.reqs.get_mut(usize::from(token)).and_then(Option::take) else {
                continue;
            };
            self.free_tokens.push(token);
            self.live -= 1;
            self.released = true;
            if req.on_worker {
                self.on_workers -= 1;
            }
            if let Some(b) = req.handoff.request.take() {
                self.bufs.put(b, self.keep());
            }
            let reply = req.handoff.reply.take();
            let spliced = req.handoff.spliced.take();
            if !self.conns.contains_key(&req.conn) {
                if let Some(b) = reply {
                    self.bufs.put(b, self.keep());
                }
                continue;
            }
            self.drop_slot(req.conn);
            let Some(c) = self.conns.get_mut(&req.conn) else {
                continue;
            };
            if let Some((st, size)) = &req.stream {
                if st.too_slow.load(Ordering::Acquire) {
                    slow.push(req.conn);
                }
                c.frame_got = st.got(*size);
                // The rest of the streamed frame (an error before all its
                // data was used) is skipped, not parsed.
                let left = st.unread.load(Ordering::Acquire);
                c.input = if left > 0 {
                    self.stall_watch = true;
                    Input::Skip {
                        left: left as u64,
                        answer: None,
                    }
                } else {
                    c.frame_start = None;
                    Input::header()
                };
            }
            match reply {
                Some(mut buf) if len > 0 && len as usize <= buf.len() => {
                    let (len, tail) = match spliced {
                        Some(f) => rread_tail(&mut buf, len as usize, f),
                        None => (len as usize, None),
                    };
                    self.queued += 1;
                    let out = Out {
                        buf,
                        len,
                        pooled: true,
                        tail,
                    };
                    c.out_bytes += out.total();
                    c.out.push_back(out);
                }
                other => {
                    // Flushed before it answered, or not answerable.
                    c.in_flight -= 1;
                    if let Some(b) = other {
                        self.bufs.put(b, self.keep());
                    }
                }
            }
            self.dirty.push(req.conn);
        }
        self.done = done;
        self.done.clear();
        for id in slow {
            if self.shared.server.log_limit().admit() {
                warn!(
                    "9p: closing connection {id}: its Twrite data arrives below the minimum rate"
                );
            }
            self.close(id, Close::Failed(too_slow_error()));
        }
    }

    /// the epoll interest, and frees the pool once idle.
    pub(super) fn settle(&mut self) {
        // Bounded, so new connections and events are seen between rounds
        // of a busy queue; what is left makes the next epoll wait return
        // at once.
        for _ in 0..16 {
            self.serve_workq();
            self.serve_waiters();
            if self.dirty.is_empty() {
                break;
            }
            let mut dirty = std::mem::take(&mut self.dirty);
            dirty.sort_unstable();
            dirty.dedup();
            for id in dirty {
                if let Err(e) = self.flush_out(id) {
                    self.close(id, Close::Failed(e));
                    continue;
                }
                if let Some(c) = self.conns.get(&id) {
                    if c.version.is_some() && c.slots == 1 {
                        // The requests a Tversion waited for have returned.
                        if let Some(c) = self.conns.get_mut(&id) {
                            if let Some((buf, size)) = c.version.take() {
                                self.start(id, buf, size);
                            }
                        }
                    }
                }
                let Some(c) = self.conns.get(&id) else {
                    continue;
                };
                if self.readable(c) {
                    // A slot freed: read what waits in the socket (level
                    // triggered epoll would also tell us).
                    if let Err(why) = self.read_conn(id, false) {
                        self.close(id, why);
                        continue;
                    }
                }
                self.update_interest(id);
            }
            self.collect();
        }
        // Buffers unused for IDLE_RELEASE go back to the kernel, whether
        // or not other connections of the thread are busy.
        splice::lock(&self.pipes).expire();
        if self.bufs.expire() {
            trim_heap();
            if self.live == 0 {
                self.shared.pool.trim();
            }
        }
    }

    pub(super) fn flush_out(&mut self, id: u32) -> io::Result<()> {
        let keep = self.keep();
        let Some(c) = self.conns.get_mut(&id) else {
            return Ok(());
        };
        let log = self.shared.server.log_limit();
        while let Some(front) = c.out.front_mut() {
            if c.out_pos == 0 {
                if let Some(t) = front.tail.as_mut() {
                    if t.left == t.len {
                        // Just before its header goes out: a file that
                        // shrank since the fill cuts the reply.
                        let old = t.len;
                        if let Some(len) = t.recount() {
                            c.out_bytes -= old - len;
                            set_rread_count(&mut front.buf, len);
                        }
                    }
                }
            }
            if c.out_pos < front.len {
                let more = front.tail.is_some();
                let Some(n) = send_fd(c.sock.as_fd(), &front.buf[c.out_pos..front.len], more)?
                else {
                    break;
                };
                c.out_pos += n;
                continue;
            }
            if let Some(t) = front.tail.as_mut().filter(|t| t.left > 0) {
                // The header is out: now the pipe (kept while the socket
                // is full).
                let Some(n) = splice::splice_out(t, c.sock.as_fd(), || log.admit())? else {
                    break;
                };
                t.left -= n;
                continue;
            }
            c.out_pos = 0;
            c.in_flight -= 1;
            c.out_bytes -= front.total();
            if let Some(o) = c.out.pop_front() {
                if let Some((pipe, empty)) = o.tail.and_then(Tail::into_pipe) {
                    // Sent in full: empty, unless the reply was cut.
                    splice::lock(&self.pipes).put(pipe, empty);
                }
                if o.pooled {
                    self.queued -= 1;
                    self.bufs.put(o.buf, keep);
                }
            }
        }
        Ok(())
    }

    pub(super) fn update_interest(&mut self, id: u32) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let mut want = EventSet::empty();
        let mut wait_turn = false;
        if self.readable(c) {
            want |= EventSet::IN;
        } else {
            // Only the thread's slots stop it: it waits in the queue, so
            // it is read again when its turn comes (never left unread).
            wait_turn = c.input.at_boundary() && self.conn_ready(c);
        }
        if !c.out.is_empty() {
            want |= EventSet::OUT;
        }
        if wait_turn {
            self.enqueue(id);
        }
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if want == c.interest {
            return;
        }
        let fd = c.sock.as_raw_fd();
        if let Err(e) = self.epoll.ctl(
            ControlOperation::Modify,
            fd,
            EpollEvent::new(want, u64::from(id)),
        ) {
            error!("9p: connection {id}: cannot update its epoll events: {e}");
        }
        if let Some(c) = self.conns.get_mut(&id) {
            c.interest = want;
        }
    }
}

impl<F: Filesystem> Drop for Loop<F> {
    fn drop(&mut self) {
        // Cancel everything; the engine's own drop waits (bounded).
        for id in self.conns.keys().copied().collect::<Vec<_>>() {
            self.engine.cancel_group(id);
        }
    }
}

/// flushed before it answered, or could not be answered at all.
pub(super) fn reply_len(r: Result<crate::server::Reply>, cancel: &Cancel) -> u32 {
    match r {
        Ok(reply) if engine::flushed_silently(reply.reply_type, cancel) => 0,
        Ok(reply) => reply.size,
        Err(e) => {
            warn!("9p: request not answered: {e}");
            0
        }
    }
}
