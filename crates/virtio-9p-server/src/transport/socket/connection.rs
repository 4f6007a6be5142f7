// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The connection loop: one socket thread's epoll loop over its
//! connections. It reads frames, starts each request on the engine,
//! and writes the replies in the order they finish.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use coro_pool::{PoolConfig, StackPool};
use log::{debug, error, info, warn};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::admission::{worker_bound, Admission, Admit, Slots};
use super::buffers::{trim_heap, BufPool, BufferBudget, KEEP_BUFFER, SMALL_BUFFER};
use super::framing::{frame_size, Arrived, Close, Input};
use super::limits::{too_slow_error, RateFloor, SocketLimits, DUPLICATE_TAG_ERRNO};
use super::output::{Out, Output};
use super::pipes::{self, PipePool, SharedPipes};
use super::requests::{Buffered, Handoff, Job, Req, Requests, Streamed};
use super::splice::{SigpipeBlocked, Splicer};
use super::stream::{StreamState, STREAM_CHUNK, TWRITE_HEAD};
use crate::engine::{Engine, EngineConfig, EngineExec, Executor, ThreadPool, DEFAULT_STACK_SIZE};
use crate::fs::Filesystem;
use crate::protocol::{Header, MsgType, HEADER_SIZE};
use crate::server::{Cancel, Server, Session};

/// Epoll data of the thread's own fds; connections use their id.
const EV_NEW: u64 = 0;
const EV_ENGINE: u64 = 1;
/// The first connection id.
const FIRST_CONN: u32 = 16;

/// Whether a connection's socket may be read now.
enum Gate {
    /// Not now: closed, streaming, at its limits or waiting for a slot.
    Stop,
    /// The rest of a frame begun.
    Rest,
    /// A new frame, in the slot it takes.
    New(Admit),
}

/// One connection of a socket thread.
struct Conn<F: Filesystem> {
    sock: Arc<File>,
    session: Arc<Session<F>>,
    input: Input,
    /// Replies waiting to be written.
    output: Output,
    /// Requests started, or answered and not yet written.
    in_flight: usize,
    /// The epoll events registered now.
    interest: EventSet,
    /// The thread's slots it holds (see "Fairness").
    slots: Slots,
    /// When the frame being read started, and its bytes so far (the
    /// minimum-rate check).
    frame_start: Option<Instant>,
    frame_got: usize,
    /// A Tversion waiting for the connection's other requests to end.
    version: Option<(Vec<u8>, usize)>,
    /// A request that always runs on a worker, waiting for its turn
    /// ("Workers" in the module docs).
    held: Option<(Vec<u8>, usize)>,
}

/// One socket thread: its epoll loop, engine and connections.
struct Loop<F: Filesystem> {
    shared: Shared<F>,
    epoll: Epoll,
    engine: Engine,
    exec: EngineExec,
    conns: HashMap<u32, Conn<F>>,
    next_conn: u32,
    reqs: Requests,
    /// Replies in pooled buffers waiting to be written.
    queued: usize,
    /// Slots and worker turns, and the connections waiting for them.
    adm: Admission,
    /// Some connection may be in the middle of a frame: check rates.
    stall_watch: bool,
    next_stall_check: Instant,
    bufs: BufPool,
    /// Pipes for spliced Rreads, shared with this thread's requests.
    pipes: SharedPipes,
    done: Vec<(u16, u32)>,
    /// Connections whose output or interest may need work.
    dirty: Vec<u32>,
    /// Why the last connection that failed ended (for [`serve_connection`](super::serve_connection)).
    last_error: Option<io::Error>,
    ctx_rx: mpsc::Receiver<OwnedFd>,
    ctx_wake: EventFd,
    conns_count: Arc<AtomicUsize>,
    active: Arc<AtomicUsize>,
}

/// How often a socket thread checks the rate of frames being read.
const STALL_CHECK: Duration = Duration::from_millis(250);

/// What every socket thread of a listener shares.
pub(super) struct Shared<F> {
    pub(super) server: Arc<Server<F>>,
    pub(super) budget: Arc<BufferBudget>,
    pub(super) limits: SocketLimits,
    pub(super) executor: Option<Arc<dyn Executor>>,
    pub(super) pool: Arc<StackPool>,
}

impl<F> Clone for Shared<F> {
    fn clone(&self) -> Self {
        Shared {
            server: Arc::clone(&self.server),
            budget: Arc::clone(&self.budget),
            limits: self.limits.clone(),
            executor: self.executor.clone(),
            pool: Arc::clone(&self.pool),
        }
    }
}

impl<F: Filesystem + 'static> Shared<F> {
    /// What the threads of a listener within `limits` share: the worker
    /// pool, the coroutine stacks and the buffer budget.
    pub(super) fn new(server: Arc<Server<F>>, limits: &SocketLimits) -> io::Result<Self> {
        let executor: Option<Arc<dyn Executor>> = if limits.workers > 0 {
            Some(Arc::new(ThreadPool::new(limits.workers, None)?))
        } else {
            None
        };
        let pool = StackPool::new(PoolConfig::default().stack_size(DEFAULT_STACK_SIZE))
            .map_err(io::Error::other)?;
        Ok(Shared {
            server,
            budget: BufferBudget::new(limits.buffer_bytes),
            limits: limits.clone(),
            executor,
            pool: Arc::new(pool),
        })
    }
}

/// What one socket thread is given: the shared part, the channel its
/// connections come on (with the eventfd that announces them), and the
/// connection counts it lowers as they close.
pub(super) struct ThreadCtx<F> {
    pub(super) shared: Shared<F>,
    pub(super) rx: mpsc::Receiver<OwnedFd>,
    pub(super) wake: EventFd,
    pub(super) conns: Arc<AtomicUsize>,
    pub(super) active: Arc<AtomicUsize>,
}

/// Runs one socket thread's loop ("Threads" in the module docs): until
/// its channel closes, or with `single` until its one connection ends.
pub(super) fn run_thread<F: Filesystem + 'static>(
    ctx: ThreadCtx<F>,
    single: bool,
) -> io::Result<()> {
    // Splices into sockets raise SIGPIPE on a hang-up: keep it pending on
    // this thread (and take it) rather than let it reach the process.
    let _sigpipe = SigpipeBlocked::new();
    let adm = Admission::new(&ctx.shared.limits);
    let engine_config = EngineConfig {
        workers: 0,
        executor: ctx.shared.executor.clone(),
        max_in_flight: adm.cap(),
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
        pipes: Arc::new(Mutex::new(PipePool::new(pipes::MAX_PIPES))),
        shared: ctx.shared,
        epoll,
        engine,
        exec: EngineExec::new(engine_config.offload),
        conns: HashMap::new(),
        next_conn: FIRST_CONN,
        reqs: Requests::default(),
        adm,
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
    fn run(&mut self, single: bool) -> io::Result<()> {
        let mut events = vec![EpollEvent::default(); 64];
        let mut served_one = false;
        loop {
            let n = match self.epoll.wait(self.wait_timeout(), &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            for ev in &events[..n] {
                match ev.data() {
                    EV_NEW => served_one |= self.open_new(),
                    EV_ENGINE => self.engine.poll(),
                    id => self.on_conn_event(id as u32, ev.event_set()),
                }
            }
            self.collect();
            self.settle();
            self.check_stalls();
            if single && served_one && self.conns.is_empty() {
                self.drain();
                return self.last_error.take().map_or(Ok(()), Err);
            }
        }
    }

    /// How long the epoll wait may sleep (ms, -1: no limit): not at all
    /// with work pending, else until the next buffer or pipe expires or
    /// the next rate check is due.
    fn wait_timeout(&self) -> i32 {
        let pipes = pipes::lock(&self.pipes).next_expiry();
        let stalls = self.stall_watch.then(|| {
            self.next_stall_check
                .saturating_duration_since(Instant::now())
        });
        let pending = !self.dirty.is_empty() || self.adm.turns_to_give();
        match self
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
        }
    }

    /// Opens the connections the hub sent; whether there were any.
    fn open_new(&mut self) -> bool {
        let _ = self.ctx_wake.read();
        let mut any = false;
        while let Ok(fd) = self.ctx_rx.try_recv() {
            any = true;
            self.open(fd);
        }
        any
    }

    /// Lets the requests of closed connections return.
    fn drain(&mut self) {
        while self.adm.live() > 0 {
            self.engine.poll();
            self.collect();
            if self.adm.live() > 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Starts serving the connection `fd`, with a session of its own.
    fn open(&mut self, fd: OwnedFd) {
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
                output: Output::default(),
                in_flight: 0,
                interest: EventSet::IN,
                slots: Slots::default(),
                frame_start: None,
                frame_got: 0,
                version: None,
                held: None,
            },
        );
    }

    /// Ends the connection: its socket is closed at once and its requests
    /// cancelled ("Hang-up" in the module docs).
    fn close(&mut self, id: u32, why: Close) {
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
        self.adm.close(&conn.slots);
        for (buf, _) in conn.version.into_iter().chain(conn.held) {
            self.bufs.put(buf, self.keep());
        }
        for o in conn.output.into_unsent() {
            if let Some(buf) = o.into_pooled() {
                self.queued -= 1;
                self.bufs.put(buf, self.keep());
            }
        }
        self.conns_count.fetch_sub(1, Ordering::AcqRel);
        self.active.fetch_sub(1, Ordering::AcqRel);
    }

    /// The connection's socket is ready to be read or written.
    fn on_conn_event(&mut self, id: u32, ev: EventSet) {
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

    /// Reads and starts what the socket holds, within the limits.
    /// `from_queue`: the connection's turn in the queue came, its next
    /// frame takes a shared slot ahead of the others waiting.
    fn read_conn(&mut self, id: u32, mut from_queue: bool) -> Result<(), Close> {
        // A bounded number of frames per wakeup keeps connections fair.
        for _ in 0..64 {
            // Send what finished at once (a cached read runs inline), so
            // the client reads replies while the next requests run.
            self.collect();
            self.flush_out(id).map_err(Close::Failed)?;
            let admit = match self.gate(id, from_queue) {
                Gate::Stop => break,
                Gate::Rest => None,
                Gate::New(how) => Some(how),
            };
            let Some(c) = self.conns.get_mut(&id) else {
                return Ok(());
            };
            let arrived = c.input.read(&c.sock)?;
            if matches!(arrived, Arrived::Nothing) {
                break;
            }
            if let Some(how) = admit {
                // The frame's first bytes: it holds its slot from now.
                from_queue = false;
                self.reserve(id, how);
            }
            self.on_arrival(id, arrived)?;
        }
        Ok(())
    }

    /// Whether to read the connection's socket now, and for a new frame
    /// the slot it takes. A new frame needs the connection's and the
    /// thread's room; without the thread's it waits in the queue.
    fn gate(&mut self, id: u32, from_queue: bool) -> Gate {
        let Some(c) = self.conns.get(&id) else {
            return Gate::Stop;
        };
        if matches!(c.input, Input::Streaming) {
            return Gate::Stop;
        }
        if !c.input.at_boundary() {
            return Gate::Rest;
        }
        if !self.conn_ready(c) {
            return Gate::Stop;
        }
        match self.adm.admit(&c.slots, from_queue) {
            Some(how) => Gate::New(how),
            None => {
                self.enqueue(id);
                Gate::Stop
            }
        }
    }

    /// Acts on what one read of the connection's socket brought.
    fn on_arrival(&mut self, id: u32, arrived: Arrived) -> Result<(), Close> {
        match arrived {
            Arrived::Nothing => {}
            Arrived::Part(n) => self.got(id, n),
            Arrived::Header(hdr, n) => {
                self.got(id, n);
                self.on_header(id, hdr)?;
            }
            Arrived::Frame(buf, size) => {
                self.frame_done(id);
                self.start(id, buf, size);
            }
            Arrived::TwriteHead(head, n) => {
                self.got(id, n);
                self.start_stream(id, head);
            }
            Arrived::Skipped(n, answer) => {
                self.got(id, n);
                self.frame_done(id);
                if let Some((tag, errno)) = answer {
                    self.answer_now(id, tag, errno);
                }
            }
        }
        Ok(())
    }

    /// The frame being read is whole: the connection is between frames
    /// (no rate to check).
    fn frame_done(&mut self, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.frame_start = None;
        }
    }

    /// `n` more bytes of the frame being read arrived.
    fn got(&mut self, id: u32, n: usize) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.frame_got += n;
        }
    }

    /// Closes the connections whose frame in progress arrives below the
    /// minimum rate ([`SocketLimits::min_request_rate`](super::SocketLimits::min_request_rate)); a streamed
    /// Twrite checks its own.
    fn check_stalls(&mut self) {
        if !self.stall_watch {
            return;
        }
        let now = Instant::now();
        if now < self.next_stall_check {
            return;
        }
        self.next_stall_check = now + STALL_CHECK;
        let floor = RateFloor::of(&self.shared.limits);
        let mut partial = false;
        let mut slow = Vec::new();
        for (&id, c) in &self.conns {
            let Some(start) = c.frame_start else {
                continue;
            };
            partial = true;
            if !matches!(c.input, Input::Streaming) && floor.too_slow(start, c.frame_got, now) {
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
    fn on_header(&mut self, id: u32, hdr: [u8; HEADER_SIZE]) -> Result<(), Close> {
        let Some(c) = self.conns.get_mut(&id) else {
            return Ok(());
        };
        let h = Header::from_bytes(&hdr);
        let size = match frame_size(&h, c.session.frame_limit()) {
            Ok(size) => size,
            Err(e) => {
                if self.shared.server.log_limit().admit() {
                    warn!("9p: closing connection {id}: {e}");
                }
                return Err(Close::Failed(e));
            }
        };
        if h.ty == MsgType::Twrite && size > KEEP_BUFFER {
            c.input = Input::twrite_head(hdr);
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
    fn answer_now(&mut self, id: u32, tag: u16, errno: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.in_flight += 1;
        c.output.push(Out::error(tag, errno));
        self.dirty.push(id);
    }

    /// Runs the buffered request `buf[..size]` on the engine, unless it
    /// waits (a Tversion for the requests it aborts, a worker-bound
    /// request for its turn) or is refused.
    fn start(&mut self, id: u32, buf: Vec<u8>, size: usize) {
        let Some(c) = self.conns.get_mut(&id) else {
            self.bufs.put(buf, self.keep());
            return;
        };
        let h = Header::from_bytes(buf[..HEADER_SIZE].try_into().unwrap_or(&[0; HEADER_SIZE]));
        if h.ty == MsgType::Tversion && c.slots.held() > 1 {
            // Tversion aborts the connection's requests in flight: they
            // are cancelled, and it runs once the last has returned, so
            // no reply of theirs follows the Rversion.
            c.version = Some((buf, size));
            self.engine.cancel_group(id);
            self.dirty.push(id);
            return;
        }
        let on_worker = worker_bound(h.ty);
        if on_worker && !self.adm.worker_turn_free() {
            // Its turn comes when a worker-bound request of the thread
            // returns; a connection with nothing else running goes first.
            let alone = c.slots.held() == 1;
            c.held = Some((buf, size));
            self.adm.wait_for_worker(id, alone);
            self.dirty.push(id);
            return;
        }
        let limit = c.session.frame_limit();
        let session = Arc::clone(&c.session);
        if self.engine.has_tag(id, h.tag) {
            if self.shared.server.log_limit().admit() {
                warn!("9p: connection {id}: tag {} is already in flight", h.tag);
            }
            self.refuse(id, h.tag, DUPLICATE_TAG_ERRNO as u32, buf);
            return;
        }
        let Some((reply, room)) = self.bufs.take_reply(&buf[..size], limit) else {
            self.refuse(id, h.tag, libc::ENOMEM as u32, buf);
            return;
        };
        // An Rread may go out as its header plus a spliced file range.
        let splicer = (h.ty == MsgType::Tread && self.shared.limits.splice_reads)
            .then(|| Splicer::new(Arc::clone(&self.pipes)));
        let job = Buffered {
            server: Arc::clone(&self.shared.server),
            session,
            frame: buf,
            size,
            reply,
            room,
            splicer,
        };
        self.spawn(id, h.tag, job, None, on_worker);
    }

    /// Answers the buffered request `buf` with `errno` instead of running
    /// it; its slot is free.
    fn refuse(&mut self, id: u32, tag: u16, errno: u32, buf: Vec<u8>) {
        self.bufs.put(buf, self.keep());
        self.unreserve(id);
        self.answer_now(id, tag, errno);
    }

    /// Runs a large Twrite whose data the request reads from the socket
    /// itself, chunk by chunk, as it arrives ("Slow senders").
    fn start_stream(&mut self, id: u32, head: [u8; TWRITE_HEAD]) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let h = Header::from_bytes(head[..HEADER_SIZE].try_into().unwrap_or(&[0; HEADER_SIZE]));
        let frame_start = c.frame_start.unwrap_or_else(Instant::now);
        if self.engine.has_tag(id, h.tag) {
            if self.shared.server.log_limit().admit() {
                warn!("9p: connection {id}: tag {} is already in flight", h.tag);
            }
            self.unreserve(id);
            // Skip its data, then answer.
            if let Some(c) = self.conns.get_mut(&id) {
                c.input = Input::Skip {
                    left: (h.size as usize - TWRITE_HEAD) as u64,
                    answer: Some((h.tag, DUPLICATE_TAG_ERRNO as u32)),
                };
            }
            return;
        }
        // Small buffers are never refused.
        let reply = self
            .bufs
            .take(SMALL_BUFFER)
            .unwrap_or_else(|| vec![0u8; SMALL_BUFFER]);
        let chunk = self
            .bufs
            .take(STREAM_CHUNK)
            .or_else(|| self.bufs.take(KEEP_BUFFER))
            .unwrap_or_else(|| vec![0u8; KEEP_BUFFER]);
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let state = StreamState::new(h.size as usize);
        let job = Streamed {
            server: Arc::clone(&self.shared.server),
            session: Arc::clone(&c.session),
            head,
            sock: Arc::clone(&c.sock),
            state: Arc::clone(&state),
            frame_start,
            floor: RateFloor::of(&self.shared.limits),
            chunk,
            reply,
        };
        self.spawn(id, h.tag, job, Some(state), false);
    }

    /// Starts `job` on the engine, in the connection's tag space, with
    /// the slot its frame reserved.
    fn spawn(
        &mut self,
        id: u32,
        tag: u16,
        job: impl Job + 'static,
        stream: Option<Arc<StreamState>>,
        on_worker: bool,
    ) {
        let streaming = stream.is_some();
        let handoff = Rc::new(Handoff::default());
        let Some(token) = self.reqs.insert(Req {
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
        self.adm.started(on_worker);
        // Its interest may change (in-flight limit, streaming).
        self.dirty.push(id);
        let cancel = Cancel::new();
        let token_cancel = cancel.clone();
        let exec = self.exec;
        let task = move || job.run(exec, &handoff, &token_cancel);
        if let Err(e) = self.engine.spawn_in(id, token, Some(tag), cancel, task) {
            // The task (and its buffers) is dropped unrun.
            error!("9p: connection {id}: cannot start tag {tag}: {e}");
            self.not_started(id, tag, token, on_worker, streaming);
        }
    }

    /// Undoes [`spawn`](Self::spawn) for a request the engine refused:
    /// answered `ENOMEM`, or for a streamed Twrite (whose frame cannot be
    /// skipped reliably) the connection ends.
    fn not_started(&mut self, id: u32, tag: u16, token: u16, on_worker: bool, streaming: bool) {
        self.reqs.remove(token);
        self.adm.ended(on_worker);
        self.drop_slot(id);
        if let Some(c) = self.conns.get_mut(&id) {
            c.in_flight -= 1;
            if streaming {
                c.input = Input::header();
                self.close(
                    id,
                    Close::Failed(io::Error::other("cannot start a streamed Twrite")),
                );
                return;
            }
        }
        self.answer_now(id, tag, libc::ENOMEM as u32);
    }

    /// Routes finished requests to their connections' output.
    fn collect(&mut self) {
        self.engine.take_completed(&mut self.done);
        let done = std::mem::take(&mut self.done);
        let mut slow = Vec::new();
        for &(token, len) in &done {
            if let Some(req) = self.reqs.remove(token) {
                slow.extend(self.finish(req, len));
            }
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

    /// A request returned with a reply of `len` bytes (0: none): its
    /// buffers go back to the pool and its reply to its connection's
    /// output. Returns the connection if it is to close: its streamed
    /// Twrite's data arrived below the minimum rate.
    fn finish(&mut self, req: Req, len: u32) -> Option<u32> {
        self.adm.ended(req.on_worker);
        if let Some(b) = req.handoff.request.take() {
            self.bufs.put(b, self.keep());
        }
        let reply = req.handoff.reply.take();
        let spliced = req.handoff.spliced.take();
        if !self.conns.contains_key(&req.conn) {
            if let Some(b) = reply {
                self.bufs.put(b, self.keep());
            }
            return None;
        }
        self.drop_slot(req.conn);
        let slow = req
            .stream
            .as_ref()
            .is_some_and(|st| self.stream_ended(req.conn, st));
        let c = self.conns.get_mut(&req.conn)?;
        match reply {
            Some(buf) if len > 0 && len as usize <= buf.len() => {
                self.queued += 1;
                c.output.push(Out::reply(buf, len as usize, spliced));
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
        slow.then_some(req.conn)
    }

    /// A streamed Twrite returned: the connection reads frames again, past
    /// the rest of the Twrite's frame (left by an error before all its data
    /// was used), which is skipped, not parsed. Returns whether the data
    /// arrived below the minimum rate.
    fn stream_ended(&mut self, id: u32, st: &StreamState) -> bool {
        let Some(c) = self.conns.get_mut(&id) else {
            return false;
        };
        c.frame_got = st.got();
        let left = st.unread();
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
        st.too_slow()
    }

    /// Serves the queues, writes the replies and reads the sockets of the
    /// connections marked dirty, updates their epoll interest, and frees
    /// the pools once idle.
    fn settle(&mut self) {
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
                if let Err(why) = self.settle_conn(id) {
                    self.close(id, why);
                }
            }
            self.collect();
        }
        // Buffers unused for IDLE_RELEASE go back to the kernel, whether
        // or not other connections of the thread are busy.
        pipes::lock(&self.pipes).expire();
        if self.bufs.expire() {
            trim_heap();
            if self.adm.live() == 0 {
                self.shared.pool.trim();
            }
        }
    }

    /// One dirty connection: writes its replies, starts its Tversion once
    /// the requests it waited for have returned, reads its socket if a
    /// slot freed, and updates its epoll interest.
    fn settle_conn(&mut self, id: u32) -> Result<(), Close> {
        self.flush_out(id).map_err(Close::Failed)?;
        if let Some(c) = self.conns.get_mut(&id) {
            if c.slots.held() == 1 {
                if let Some((buf, size)) = c.version.take() {
                    self.start(id, buf, size);
                }
            }
        }
        let Some(c) = self.conns.get(&id) else {
            return Ok(());
        };
        if self.readable(c) {
            // A slot freed: read what waits in the socket (level
            // triggered epoll would also tell us).
            self.read_conn(id, false)?;
        }
        self.update_interest(id);
        Ok(())
    }

    /// Writes the connection's replies, as far as its socket takes them.
    fn flush_out(&mut self, id: u32) -> io::Result<()> {
        let keep = self.keep();
        let Some(c) = self.conns.get_mut(&id) else {
            return Ok(());
        };
        let log = self.shared.server.log_limit();
        let (bufs, queued, in_flight) = (&mut self.bufs, &mut self.queued, &mut c.in_flight);
        c.output.flush(
            c.sock.as_fd(),
            &self.pipes,
            || log.admit(),
            |o| {
                *in_flight -= 1;
                if let Some(buf) = o.into_pooled() {
                    *queued -= 1;
                    bufs.put(buf, keep);
                }
            },
        )
    }

    /// Registers the epoll events the connection waits for now (and puts
    /// it in the queue when only the thread's slots stop it).
    fn update_interest(&mut self, id: u32) {
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
        if !c.output.is_empty() {
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

    /// Free buffers the pool may keep: a request and a reply buffer for
    /// each request in flight, and a few more.
    fn keep(&self) -> usize {
        2 * (self.adm.live() + self.queued) + 4
    }

    /// Whether the connection may start another request, as far as it
    /// alone is concerned: the per-connection limits.
    fn conn_ready(&self, c: &Conn<F>) -> bool {
        c.in_flight < self.shared.limits.max_in_flight.max(1)
            && !c.output.is_full()
            && self.adm.within_share(&c.slots)
            && c.version.is_none()
            && c.held.is_none()
            && !matches!(c.input, Input::Streaming)
    }

    /// Whether to read the connection's socket now.
    fn readable(&self, c: &Conn<F>) -> bool {
        match c.input {
            Input::Streaming => false,
            ref i if !i.at_boundary() => true,
            _ => {
                self.conn_ready(c) && !c.slots.queued() && self.adm.admit(&c.slots, false).is_some()
            }
        }
    }

    /// Puts the connection in the thread's queue for a slot.
    fn enqueue(&mut self, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            self.adm.enqueue(id, &mut c.slots);
        }
    }

    /// The frame just begun takes a slot, and its arrival rate is watched.
    fn reserve(&mut self, id: u32, how: Admit) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        self.adm.reserve(&mut c.slots, how);
        c.frame_start = Some(Instant::now());
        c.frame_got = 0;
        self.stall_watch = true;
    }

    /// The frame being read gives its slot to the request it starts.
    fn take_reservation(&mut self, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            self.adm.take_reservation(&mut c.slots);
        }
    }

    /// The frame being read ends without a request: its slot is free.
    fn unreserve(&mut self, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            self.adm.unreserve(&mut c.slots);
        }
    }

    /// One of the connection's slots is free.
    fn drop_slot(&mut self, id: u32) {
        let slots = self.conns.get_mut(&id).map(|c| &mut c.slots);
        self.adm.drop_slot(slots);
    }

    /// Starts the requests waiting for a worker turn, in order, while the
    /// thread has turns free.
    fn serve_workq(&mut self) {
        while let Some(id) = self.adm.next_worker_turn() {
            let Some((buf, size)) = self.conns.get_mut(&id).and_then(|c| c.held.take()) else {
                continue;
            };
            self.start(id, buf, size);
            self.dirty.push(id);
        }
    }

    /// Gives the connections waiting for a slot their turn, in order, as
    /// long as slots are free: each starts one request, then waits again
    /// at the back if it has more.
    fn serve_waiters(&mut self) {
        let Some(waiting) = self.adm.waiters_turn() else {
            return;
        };
        let mut passed = Vec::new();
        for _ in 0..waiting {
            let Some(id) = self.adm.next_waiter() else {
                break;
            };
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            self.adm.left_queue(&mut c.slots);
            let c = &self.conns[&id];
            if !self.conn_ready(c) || !c.input.at_boundary() {
                // It waits for itself now, not for the thread.
                self.dirty.push(id);
                continue;
            }
            if self.adm.admit(&c.slots, true).is_none() {
                if let Some(c) = self.conns.get_mut(&id) {
                    self.adm.passed(&mut c.slots);
                }
                passed.push(id);
                continue;
            }
            if let Err(why) = self.read_conn(id, true) {
                self.close(id, why);
                continue;
            }
            self.dirty.push(id);
        }
        // Those that could not have a slot keep their place.
        self.adm.keep_places(passed);
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
