// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The coroutine request engine.
//!
//! Every in-flight request runs on its own stackful coroutine (from
//! `coro-pool`), on the engine's thread (the vring thread). A request that
//! must block hands the call to an [`Executor`] (by default the engine's
//! own [worker threads](EngineConfig::workers)) and yields (`offload`);
//! the thread goes on serving other requests and resumes the coroutine
//! when the call's result is posted. So a handful of OS threads keeps a
//! whole queue of requests in flight, and the engine's thread itself never
//! blocks.
//!
//! What runs where (the inline-vs-offload line, measured in the
//! `virtio-9p` benchmark suite and documented in the repository's
//! `docs/virtio-9p-benchmarks.md`):
//!
//! - Tread of a filesystem whose reads go through the reply writer
//!   ([`Filesystem::reads_through_writer`](crate::fs::Filesystem::reads_through_writer))
//!   runs inline, and the writer asks the executor where each range is
//!   read ([`Blocking::read_at`]): a range already in the page cache
//!   (`cachestat(2)`) right there, since the `preadv` into guest memory
//!   costs less than a thread hop; any other range on a worker. Every
//!   other filesystem's Tread runs on a worker.
//! - The short metadata calls (Tgetattr, Twalk, Tclunk's `close`, Tstatfs,
//!   Treadlink, Txattrwalk) run inline when the filesystem says its
//!   metadata calls are local
//!   ([`Filesystem::metadata_is_local`](crate::fs::Filesystem::metadata_is_local):
//!   a local disk or memory filesystem, where they return within a disk
//!   access). The server passes the hint with every call
//!   ([`Blocking::run_hinted`]), the engine decides. On any other
//!   filesystem (the default hint: NFS, CIFS, FUSE, 9P, Ceph, unknown)
//!   they go to a worker, so a call that hangs on a peer never stalls the
//!   engine's thread. Treaddir (a large cold directory reads many blocks,
//!   with no cache hint), Tlopen, Tattach, every call that changes the
//!   tree, Tgetlock and Tfsync always go to a worker.
//! - A blocking Tlock waits between its attempts in `sleep` (a timer:
//!   the coroutine yields and holds no thread), and its attempts run apart
//!   from reads and writes ([`Job::may_wait`]), so a pile of blocked locks
//!   never starves them. It waits until granted, flushed, the device stops
//!   or the session ends (see `Config::lock_wait`).
//! - Every other filesystem call goes through [`Blocking::run`], which
//!   offloads it unless the [`OffloadPolicy`] says otherwise.
//! - With zero workers and no executor every call runs inline on the
//!   engine's thread (a slow call then stalls the queue).
//!
//! # Cancellation
//!
//! Cancellation never unwinds a stack, so the engine works in a program
//! built with `panic = "abort"`. Tflush, [`Engine::quiesce`] (device reset,
//! disconnect) and [`Engine::shutdown`] set the request's [`Cancel`] token
//! and, when the request is suspended (sleeping, waiting for a flush
//! target, or its call still queued for a worker), resume it with
//! "cancelled": the pending `offload` returns
//! [`Interrupted::interrupted`] (EINTR), `sleep` and `flush` return
//! early, and every later suspension of that request is answered the same
//! way at once, so the request returns normally and drops its locals on
//! the way out. A request whose call is running on a worker is waited for.
//! No code path drops a suspended coroutine: [`EngineStats::unwound`]
//! counts the attempts (always 0; a debug build asserts it), and such a
//! coroutine would be leaked rather than unwound.
//!
//! # Tflush
//!
//! The engine is the one owner of Tflush, for every transport. The
//! server's Tflush arm calls [`Blocking::flush`], which `EngineExec`
//! implements with `flush`: it finds the request with `oldtag` in the
//! Tflush's own tag space (one per connection, [`Engine::spawn_in`]),
//! cancels it as above and returns only once the old request has finished;
//! the server then encodes Rflush with the protocol codec. So the old
//! request's reply (if it answered before it was cancelled) goes out before
//! the Rflush, a request cancelled before it answered gets no reply (its
//! transport drops an interrupted Rlerror, see `flushed_silently`), and a
//! Tflush of an unknown tag is answered at once. A Tflush that is itself
//! flushed keeps waiting for its own target (only teardown cuts that wait
//! short), so every Rflush of a chain goes out after the reply it
//! promises: the flushed request's, then each Tflush's in turn.
//!
//! # Stopping (vhost-user GET_VRING_BASE)
//!
//! [`Engine::drain`] finishes every request in flight without cancelling
//! any, as the vhost-user specification asks of a back-end whose ring
//! stops: requests waiting for something that may never come (a blocking
//! Tlock) are told to end their wait ([`Cancel::end_waits`]) and answer
//! what their client retries (BLOCKED); calls running on workers are
//! waited for, however long they take, with a warning every
//! 5 s (`DRAIN_LOG_EVERY`). The device writes their replies to the ring
//! before it answers, and nothing is in flight afterwards.
//!
//! # Teardown
//!
//! [`Engine::shutdown`] (also run by `Drop`) and [`Engine::reset`] return
//! within [`EngineConfig::quiesce_timeout`] plus [`WORKER_JOIN_TIMEOUT`]
//! (5 s + 1 s by default), even when a worker is stuck in a call that never
//! returns. Such a request is leaked, never freed under the worker: its
//! coroutine stack and everything the call borrows stay allocated, its
//! late completion is ignored, and [`EngineStats::leaked`] counts it. It is
//! also abandoned ([`Cancel::abandon`]) before its chain goes back, so the
//! call cannot write guest memory when it returns: writers used off the
//! engine's thread copy into guest memory only under
//! [`Cancel::guest_access`] (see [`crate::virtio::ChainWriter`]). A worker
//! thread still stuck when the engine's own pool is dropped is detached.
//!
//! # Threads and fds
//!
//! The engine's thread is the embedder's: the engine never blocks it
//! except in [`Engine::quiesce`]/[`Engine::shutdown`]. Add
//! [`Engine::fds`] (completion eventfd, timer fd) to your epoll loop for
//! `EPOLLIN` and call [`Engine::poll`] when one is readable. Worker
//! threads are the engine's own (`workers`, each running
//! [`EngineConfig::on_worker_start`] first) or the embedder's
//! ([`EngineConfig::executor`]), or there are none (`workers: 0`).

mod workers;

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coro_pool::{Coroutine, CoroutineResult, Reservation, StackPool, Yielder};
use log::{debug, error, warn};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use crate::error::Error;
use crate::protocol::{
    MsgType, RLERROR, TCLUNK, TGETATTR, TLOCK, TREAD, TREADLINK, TSTATFS, TVERSION, TWALK,
    TXATTRWALK,
};
use crate::server::{Blocking, Cancel, Interrupted};
use crate::sys::{set_nonblocking, wait_readable};

pub(crate) use workers::ThreadPool;
use workers::{Completions, Done, JobCell, JobFn, JobId, Outcome};
pub use workers::{Executor, Job, StartHook, MAX_WORKERS, WORKER_JOIN_TIMEOUT};

/// Default number of worker threads (`--thread-pool-size`).
pub const DEFAULT_WORKERS: usize = 8;
/// Default usable stack size of a request coroutine.
pub const DEFAULT_STACK_SIZE: usize = 256 << 10;
/// Default of [`EngineConfig::quiesce_timeout`]: how long a reset,
/// disconnect or drop waits for requests running on workers before it
/// leaks them.
pub const QUIESCE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often [`Engine::drain`] says what it still waits for.
pub(crate) const DRAIN_LOG_EVERY: Duration = Duration::from_secs(5);

/// Which filesystem calls leave the engine's thread (see the module docs,
/// "What runs where").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OffloadPolicy {
    /// Tread of cached data inline; Tgetattr, Twalk, Tclunk, Tstatfs,
    /// Treadlink and Txattrwalk inline when the filesystem says its
    /// metadata calls are local
    /// ([`Filesystem::metadata_is_local`](crate::fs::Filesystem::metadata_is_local));
    /// everything else, and every call of a filesystem that does not say
    /// so, on a worker (default).
    #[default]
    Auto,
    /// Every call on a worker, including cached reads.
    Always,
    /// Every call inline on the engine's thread (no worker hop; a slow
    /// filesystem call stalls every request of the queue). For measurements.
    Never,
}

/// Engine settings.
#[derive(Clone)]
#[non_exhaustive]
pub struct EngineConfig {
    /// The engine's own worker threads for blocking calls (0 to
    /// [`MAX_WORKERS`] per pool; there are two pools, see [`Job::may_wait`]).
    /// 0 with no [`executor`](EngineConfig::executor): every call runs
    /// inline on the engine's thread.
    pub workers: usize,
    /// Requests the engine must keep in flight at once: the pool reservation
    /// (queue size × queues).
    pub max_in_flight: usize,
    /// Where the calls run.
    pub offload: OffloadPolicy,
    /// Runs the blocking calls on the embedder's threads instead of the
    /// engine's own (`workers` is then ignored).
    pub executor: Option<Arc<dyn Executor>>,
    /// Called on each of the engine's own worker threads as it starts,
    /// before it runs any call (the daemon installs its seccomp filter).
    pub on_worker_start: Option<StartHook>,
    /// How long [`Engine::reset`] and [`Engine::shutdown`] wait for calls
    /// running on workers before they leak those requests.
    pub quiesce_timeout: Duration,
}

impl std::fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineConfig")
            .field("workers", &self.workers)
            .field("max_in_flight", &self.max_in_flight)
            .field("offload", &self.offload)
            .field("executor", &self.executor.is_some())
            .field("on_worker_start", &self.on_worker_start.is_some())
            .field("quiesce_timeout", &self.quiesce_timeout)
            .finish()
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            workers: DEFAULT_WORKERS,
            max_in_flight: 1024,
            offload: OffloadPolicy::Auto,
            executor: None,
            on_worker_start: None,
            quiesce_timeout: QUIESCE_TIMEOUT,
        }
    }
}

/// Input of a resumed coroutine.
enum Resume {
    /// First run, a sleep ended, or a flush target finished.
    Go,
    /// The offloaded job finished; `true` if it panicked.
    JobDone(bool),
    /// The request was cancelled: return as soon as possible.
    Cancelled,
}

/// Why a coroutine yielded.
enum Suspend {
    /// Run this job on a worker; `true`: it may wait long (Tlock).
    Offload(JobFn, bool),
    /// Wake me at this instant.
    Sleep(Instant),
    /// Cancel the request with this tag and wake me when it is gone.
    Flush(u16),
}

type Co = Coroutine<Resume, Suspend, u32>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Being resumed, or about to be.
    Runnable,
    /// Its job is queued or running on a worker.
    OnWorker(JobId),
    /// Sleeping until a deadline.
    Sleeping,
    /// A Tflush waiting for its target.
    Flushing,
}

struct Slot {
    co: Co,
    generation: u64,
    token: u16,
    /// The tag space (one per 9P connection; 0 for [`Engine::spawn`]).
    group: u32,
    tag: Option<u16>,
    cancel: Cancel,
    state: State,
    /// The claim word of the job while `state` is `OnWorker`.
    job: Option<Arc<JobCell>>,
    /// Resumed with "cancelled": every later suspension is answered the
    /// same way at once.
    cancelled: bool,
    /// Tflush coroutines (slot, generation) waiting for this request.
    waiters: Vec<(usize, u64)>,
}

/// What a running coroutine can reach from the calls it makes: its
/// yielder.
struct Context {
    yielder: NonNull<Yielder<Resume, Suspend>>,
}

thread_local! {
    /// The context of the coroutine currently running on this thread. Set
    /// by the coroutine when it starts and after every suspension, cleared
    /// by the engine when a resume returns: only the running coroutine's
    /// calls see it.
    static CURRENT: Cell<Option<NonNull<Context>>> = const { Cell::new(None) };
}

/// Restores [`CURRENT`] on scope exit.
struct CurrentGuard(Option<NonNull<Context>>);

impl Drop for CurrentGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

fn suspend(s: Suspend) -> Option<Resume> {
    let ctx = CURRENT.with(|c| c.get())?;
    // SAFETY: CURRENT only holds the context of the coroutine running on
    // this thread right now; it lives on that coroutine's stack for the
    // coroutine's whole run, and the yielder as long as its coroutine.
    let yielder = unsafe { ctx.as_ref().yielder.as_ref() };
    let input = yielder.suspend(s);
    CURRENT.with(|c| c.set(Some(ctx)));
    Some(input)
}

/// Whether the caller runs on an engine coroutine.
pub(crate) fn on_coroutine() -> bool {
    CURRENT.with(|c| c.get().is_some())
}

/// Runs `f` on a worker thread while the calling coroutine yields, and
/// returns its result. Outside an engine coroutine it simply calls `f`.
/// When the request is cancelled before the call started, `f` never runs
/// and the result is [`Interrupted::interrupted`]. A panic in `f` is
/// propagated to the caller.
pub(crate) fn offload<R: Interrupted + Send>(f: impl FnOnce() -> R + Send) -> R {
    offload_in(false, f)
}

fn offload_in<R: Interrupted + Send>(may_wait: bool, f: impl FnOnce() -> R + Send) -> R {
    if !on_coroutine() {
        return f();
    }
    let mut f = Some(f);
    let mut out: Option<R> = None;
    let mut call = || {
        if let Some(f) = f.take() {
            out = Some(f());
        }
    };
    let dyn_call: &mut (dyn FnMut() + Send) = &mut call;
    // SAFETY: only the lifetime is erased. The engine keeps this coroutine
    // suspended, and never drops it, until the call has finished or was
    // cancelled before it started (see `Engine::run` and `Job`), so the
    // borrow outlives every use.
    let ptr: *mut (dyn FnMut() + Send + 'static) = unsafe { std::mem::transmute(dyn_call) };
    match suspend(Suspend::Offload(JobFn(ptr), may_wait)) {
        Some(Resume::JobDone(true)) => resume_unwind(Box::new("filesystem call panicked")),
        Some(Resume::JobDone(false)) => match out {
            Some(r) => r,
            None => {
                error!("virtio-9p: an offloaded call did not run");
                R::interrupted()
            }
        },
        Some(Resume::Cancelled) => R::interrupted(),
        Some(Resume::Go) | None => {
            error!("virtio-9p: engine resumed an offloaded request early");
            R::interrupted()
        }
    }
}

/// Sleeps `d`: on an engine coroutine by yielding to a timer (the thread
/// keeps serving), elsewhere with `std::thread::sleep`. Returns early when
/// the request is cancelled.
pub(crate) fn sleep(d: Duration) {
    if !on_coroutine() {
        std::thread::sleep(d);
        return;
    }
    let _ = suspend(Suspend::Sleep(Instant::now() + d));
}

/// Cancels the in-flight request with `tag` (see the module docs) and
/// returns once it has finished (or the flush itself was cancelled). Must
/// run on an engine coroutine; elsewhere it returns at once.
pub(crate) fn flush(tag: u16) {
    let _ = suspend(Suspend::Flush(tag));
}

/// Whether a finished request's reply is dropped: it was flushed and
/// interrupted before it answered (an Rlerror after its [`Cancel`] was
/// set). A request that completed keeps its reply, which may record a
/// change; QEMU does the same.
pub(crate) fn flushed_silently(reply_type: u8, cancel: &Cancel) -> bool {
    cancel.is_cancelled() && reply_type == RLERROR
}

/// The requests whose filesystem calls run inline on the engine's thread
/// under [`OffloadPolicy::Auto`] when the filesystem says its metadata
/// calls are local ([`Filesystem::metadata_is_local`]): they only read
/// metadata (Tclunk: the `close` of the fid's fds; its xattr commit is a
/// separate Txattrcreate call) and return within a disk access there.
/// Treaddir stays on a worker (a large cold directory reads many blocks,
/// and there is no cheap cache hint for directories), as does every call
/// that changes the tree, Tlock, Tgetlock, Tfsync, Tlopen and Tattach.
///
/// [`Filesystem::metadata_is_local`]: crate::fs::Filesystem::metadata_is_local
const INLINE_IF_LOCAL: [MsgType; 6] = [TGETATTR, TWALK, TCLUNK, TSTATFS, TREADLINK, TXATTRWALK];

/// The [`Blocking`] executor the engine hands to the server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EngineExec {
    policy: OffloadPolicy,
}

impl EngineExec {
    /// An executor with `policy`.
    pub fn new(policy: OffloadPolicy) -> Self {
        EngineExec { policy }
    }
}

impl Blocking for EngineExec {
    fn run<R: Interrupted + Send>(&self, op: MsgType, f: impl FnOnce() -> R + Send) -> R {
        match self.policy {
            OffloadPolicy::Never => f(),
            OffloadPolicy::Always => offload(f),
            OffloadPolicy::Auto if op == TVERSION => f(),
            OffloadPolicy::Auto if op == TLOCK => offload_in(true, f),
            OffloadPolicy::Auto => offload(f),
        }
    }

    fn run_hinted<R: Interrupted + Send>(
        &self,
        op: MsgType,
        hint: bool,
        f: impl FnOnce() -> R + Send,
    ) -> R {
        let inline = match op {
            // The reply writer places each range (`read_at`).
            TREAD => on_coroutine(),
            // A short metadata call on a local filesystem: cheaper than the
            // thread hop, and it cannot hang on a peer.
            _ => INLINE_IF_LOCAL.contains(&op),
        };
        if self.policy == OffloadPolicy::Auto && hint && inline {
            f()
        } else {
            self.run(op, f)
        }
    }

    fn read_at<R: Interrupted + Send>(
        &self,
        cached: impl FnOnce() -> bool,
        read: impl FnOnce() -> R + Send,
    ) -> R {
        // Only an inline Tread (`run_hinted`) reads on the engine's
        // thread: there a range that may block goes to a worker. Anywhere
        // else (a worker, `Never`, off the engine) the read runs here.
        if self.policy == OffloadPolicy::Auto && on_coroutine() && !cached() {
            offload(read)
        } else {
            read()
        }
    }

    fn sleep(&self, d: Duration) {
        // On a coroutine: a timer, no thread held (a waiting Tlock).
        sleep(d);
    }

    fn flush(&self, oldtag: u16) {
        // The engine owns Tflush: cancel `oldtag` and wait for its end.
        flush(oldtag);
    }
}

/// Counters of an engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Requests started.
    pub started: u64,
    /// Requests finished normally, not cancelled.
    pub completed: u64,
    /// Requests cancelled (Tflush, reset, shutdown) that then returned.
    pub cancelled: u64,
    /// Suspended requests resumed with "cancelled".
    pub cancel_resumes: u64,
    /// Jobs handed to workers.
    pub offloaded: u64,
    /// Calls run inline on the engine's thread because there are no
    /// workers.
    pub inline_calls: u64,
    /// Requests leaked because their call never returned before a reset or
    /// shutdown gave up on it: their stacks and buffers stay allocated.
    pub leaked: u64,
    /// Suspended coroutines the engine was about to drop (which would
    /// unwind them). Always 0: a debug build asserts it, a release build
    /// leaks such a coroutine instead.
    pub unwound: u64,
    /// Most requests in flight at once.
    pub peak_in_flight: usize,
}

/// The engine of one queue. It is not `Send`: create, drive and drop it on
/// one thread.
pub struct Engine {
    pool: Arc<StackPool>,
    _reservation: Reservation,
    completions: Arc<Completions>,
    wake: EventFd,
    own_pool: Option<ThreadPool>,
    executor: Option<Arc<dyn Executor>>,
    timer: TimerFd,
    timer_deadline: Option<Instant>,
    sleepers: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    next_generation: u64,
    tags: HashMap<(u32, u16), usize>,
    runq: VecDeque<(usize, Resume)>,
    completed: Vec<(u16, u32)>,
    done_scratch: Vec<Done>,
    max_in_flight: usize,
    quiesce_timeout: Duration,
    live: usize,
    stats: EngineStats,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("in_flight", &self.live)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Engine {
    /// An engine whose coroutines take stacks from `pool`; it reserves
    /// `config.max_in_flight` stacks while it lives.
    pub fn new(pool: Arc<StackPool>, config: &EngineConfig) -> Result<Engine, Error> {
        let wake = EventFd::new(EFD_NONBLOCK).map_err(Error::Workers)?;
        let completions = Arc::new(Completions::new(wake.try_clone().map_err(Error::Workers)?));
        let own_pool = if config.executor.is_none() && config.workers > 0 {
            Some(
                ThreadPool::new(config.workers, config.on_worker_start.as_ref())
                    .map_err(Error::Workers)?,
            )
        } else {
            None
        };
        let timer =
            TimerFd::new().map_err(|e| Error::Timer(io::Error::from_raw_os_error(e.errno())))?;
        set_nonblocking(timer.as_raw_fd()).map_err(Error::Timer)?;
        let reservation = pool.reserve(config.max_in_flight);
        Ok(Engine {
            pool,
            _reservation: reservation,
            completions,
            wake,
            own_pool,
            executor: config.executor.clone(),
            timer,
            timer_deadline: None,
            sleepers: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            next_generation: 1,
            tags: HashMap::new(),
            runq: VecDeque::new(),
            completed: Vec::new(),
            done_scratch: Vec::new(),
            max_in_flight: config.max_in_flight.max(1),
            quiesce_timeout: config.quiesce_timeout,
            live: 0,
            stats: EngineStats::default(),
        })
    }

    /// The fd that becomes readable when workers have finished jobs; call
    /// [`Engine::poll`] then.
    pub fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// The timer fd that becomes readable when a sleeping request is due;
    /// call [`Engine::poll`] then.
    pub fn timer_fd(&self) -> RawFd {
        self.timer.as_raw_fd()
    }

    /// Every fd the embedder adds to its epoll loop (`EPOLLIN`, level
    /// triggered): the completion eventfd and the timer fd. Call
    /// [`Engine::poll`] when one is readable. The engine owns them.
    pub fn fds(&self) -> [RawFd; 2] {
        [self.wake_fd(), self.timer_fd()]
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.live
    }

    /// Counters.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// Starts a request: `task` runs on a new coroutine right away, until it
    /// first yields or finishes. `token` comes back with the task's result
    /// from [`Engine::take_completed`]; `tag` (the 9P tag) makes it
    /// findable by Tflush. `cancel` is the token a Tflush sets.
    pub fn spawn<F>(
        &mut self,
        token: u16,
        tag: Option<u16>,
        cancel: Cancel,
        task: F,
    ) -> Result<(), Error>
    where
        F: FnOnce() -> u32 + 'static,
    {
        self.spawn_in(0, token, tag, cancel, task)
    }

    /// [`Engine::spawn`] in the tag space `group`: one engine can serve
    /// many 9P connections (the socket transport gives each its own
    /// group), and a Tflush only finds requests of its own group.
    pub fn spawn_in<F>(
        &mut self,
        group: u32,
        token: u16,
        tag: Option<u16>,
        cancel: Cancel,
        task: F,
    ) -> Result<(), Error>
    where
        F: FnOnce() -> u32 + 'static,
    {
        if self.live >= self.max_in_flight {
            return Err(Error::TooManyRequests(self.max_in_flight));
        }
        let co = Coroutine::new_in(
            &self.pool,
            move |yielder: &Yielder<Resume, Suspend>, _input| {
                let ctx = Context {
                    yielder: NonNull::from(yielder),
                };
                let _guard = CurrentGuard(None);
                CURRENT.with(|c| c.set(Some(NonNull::from(&ctx))));
                match catch_unwind(AssertUnwindSafe(task)) {
                    Ok(len) => len,
                    Err(_) => {
                        error!("virtio-9p: request handler panicked; returning its buffers empty");
                        0
                    }
                }
            },
        )
        .map_err(Error::Stack)?;
        let generation = self.next_generation;
        self.next_generation += 1;
        let slot = Slot {
            co,
            generation,
            token,
            group,
            tag,
            cancel,
            state: State::Runnable,
            job: None,
            cancelled: false,
            waiters: Vec::new(),
        };
        let idx = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        if let Some(tag) = tag {
            self.tags.insert((group, tag), idx);
        }
        self.live += 1;
        self.stats.started += 1;
        self.stats.peak_in_flight = self.stats.peak_in_flight.max(self.live);
        self.runq.push_back((idx, Resume::Go));
        self.run();
        Ok(())
    }

    /// Whether a request with `tag` is in flight in the tag space `group`.
    pub fn has_tag(&self, group: u32, tag: u16) -> bool {
        self.tags.contains_key(&(group, tag))
    }

    /// Cancels every request of `group` without waiting: the suspended
    /// ones are resumed with "cancelled" and return now; one whose call
    /// runs on a worker returns when the call does (and is cancelled at
    /// its next suspension). Their completions still come out of
    /// [`Engine::take_completed`]. Returns the requests of the group still
    /// in flight.
    pub fn cancel_group(&mut self, group: u32) -> usize {
        for idx in 0..self.slots.len() {
            if let Some(s) = self.slots[idx].as_ref().filter(|s| s.group == group) {
                s.cancel.cancel();
                self.try_cancel(idx);
            }
        }
        self.run();
        self.slots
            .iter()
            .flatten()
            .filter(|s| s.group == group)
            .count()
    }

    /// Collects finished jobs and due sleepers and resumes their requests.
    pub fn poll(&mut self) {
        let mut done = std::mem::take(&mut self.done_scratch);
        let _ = self.wake.read();
        self.completions.take(&mut done);
        for d in done.drain(..) {
            match self.slots.get_mut(d.id.slot).and_then(|s| s.as_mut()) {
                Some(s)
                    if s.generation == d.id.generation
                        && matches!(s.state, State::OnWorker(id) if id == d.id) =>
                {
                    s.job = None;
                    s.state = State::Runnable;
                    let input = match d.outcome {
                        Outcome::Ran(panicked) => Resume::JobDone(panicked),
                        Outcome::NotRun => {
                            s.cancelled = true;
                            Resume::Cancelled
                        }
                    };
                    self.runq.push_back((d.id.slot, input));
                }
                _ => debug!("virtio-9p: stale worker completion {:?}", d.id),
            }
        }
        self.done_scratch = done;
        if self.timer_deadline.is_some() && self.timer.wait().is_ok() {
            self.timer_deadline = None;
        }
        let now = Instant::now();
        while let Some(Reverse((when, idx, generation))) = self.sleepers.peek().copied() {
            if when > now {
                break;
            }
            self.sleepers.pop();
            if let Some(s) = self.slots.get_mut(idx).and_then(|s| s.as_mut()) {
                if s.generation == generation && s.state == State::Sleeping {
                    s.state = State::Runnable;
                    self.runq.push_back((idx, Resume::Go));
                }
            }
        }
        self.arm_timer();
        self.run();
    }

    /// Takes the `(token, used length)` of the requests finished since the
    /// last call.
    pub fn take_completed(&mut self, out: &mut Vec<(u16, u32)>) {
        out.append(&mut self.completed);
    }

    /// Cancels every request: the suspended ones are resumed with
    /// "cancelled" and return; those whose call runs on a worker are waited
    /// for up to `timeout`, then resumed (and cancelled at their next
    /// yield). Returns the requests still in flight afterwards (calls that
    /// did not return in time).
    pub fn quiesce(&mut self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            for idx in 0..self.slots.len() {
                if let Some(s) = self.slots[idx].as_ref() {
                    s.cancel.cancel();
                    self.try_cancel(idx);
                }
            }
            self.run();
            if self.live == 0 {
                return 0;
            }
            let now = Instant::now();
            if now >= deadline {
                return self.live;
            }
            let step = (deadline - now).min(Duration::from_millis(50));
            wait_readable(self.wake.as_raw_fd(), step);
            self.poll();
        }
    }

    /// Finishes every request in flight, as a device that stops must
    /// (vhost-user GET_VRING_BASE): nothing is cancelled. Waits that may
    /// never end (a blocking Tlock) are ended ([`Cancel::end_waits`]: the
    /// Tlock answers BLOCKED, which its client retries); calls running on
    /// workers are waited for however long they take, with a warning every
    /// 5 s (`DRAIN_LOG_EVERY`) that says what is still running. The
    /// completions come out of [`Engine::take_completed`] as usual.
    ///
    /// `give_up` is asked between rounds: when it says true (the process
    /// is shutting down), `drain` returns early. Returns the requests
    /// still in flight (0 once drained).
    pub fn drain(&mut self, give_up: impl Fn() -> bool) -> usize {
        let started = Instant::now();
        let mut next_log = started + DRAIN_LOG_EVERY;
        loop {
            for idx in 0..self.slots.len() {
                if let Some(s) = self.slots[idx].as_mut() {
                    s.cancel.end_waits();
                    if s.state == State::Sleeping {
                        s.state = State::Runnable;
                        self.runq.push_back((idx, Resume::Go));
                    }
                }
            }
            self.run();
            if self.live == 0 || give_up() {
                return self.live;
            }
            let now = Instant::now();
            if now >= next_log {
                next_log = now + DRAIN_LOG_EVERY;
                let on_workers: Vec<u16> = self
                    .slots
                    .iter()
                    .flatten()
                    .filter(|s| matches!(s.state, State::OnWorker(_)))
                    .filter_map(|s| s.tag)
                    .collect();
                warn!(
                    "virtio-9p: stopping the device: still waiting after {:?} for {} requests, {} of them in filesystem calls (tags {:?})",
                    now - started,
                    self.live,
                    on_workers.len(),
                    &on_workers[..on_workers.len().min(16)]
                );
            }
            wait_readable(self.wake.as_raw_fd(), Duration::from_millis(50));
            self.poll();
        }
    }

    /// [`quiesce`](Engine::quiesce)s with the configured timeout, then
    /// gives up on the requests whose call never returned: they are leaked
    /// (counted in [`EngineStats::leaked`]), never resumed or freed, and the
    /// engine is empty and usable again. Returns the number leaked now.
    pub fn reset(&mut self) -> usize {
        let left = if self.live > 0 {
            self.quiesce(self.quiesce_timeout)
        } else {
            0
        };
        if left == 0 {
            return 0;
        }
        let mut leaked = 0;
        for idx in 0..self.slots.len() {
            let Some(slot) = self.slots[idx].take() else {
                continue;
            };
            // After a full quiesce only requests whose call is running on a
            // worker are left (anything else was resumed and returned).
            debug_assert!(matches!(slot.state, State::OnWorker(_)));
            self.free.push(idx);
            self.live -= 1;
            if let Some(tag) = slot.tag {
                if self.tags.get(&(slot.group, tag)) == Some(&idx) {
                    self.tags.remove(&(slot.group, tag));
                }
            }
            // No guest-memory access from the call from now on (waits for
            // a copy in progress); then the chain goes back empty, its
            // buffers stay with the call.
            slot.cancel.abandon();
            self.completed.push((slot.token, 0));
            for (w, generation) in &slot.waiters {
                self.wake_waiter(*w, *generation);
            }
            // The worker still runs the closure on this coroutine's stack:
            // keep the stack (and what the call borrows) forever.
            std::mem::forget(slot);
            leaked += 1;
        }
        self.stats.leaked += leaked as u64;
        error!(
            "virtio-9p: leaked {leaked} requests whose filesystem calls did not return in {:?}",
            self.quiesce_timeout
        );
        self.run();
        leaked
    }

    /// Ends the engine: [`reset`](Engine::reset), then stops its own worker
    /// threads, detaching those stuck in calls (bounded by
    /// [`WORKER_JOIN_TIMEOUT`]). Returns the final counters. `Drop` calls
    /// it too; later calls do nothing more.
    pub fn shutdown(&mut self) -> EngineStats {
        self.reset();
        if let Some(mut pool) = self.own_pool.take() {
            let detached = pool.shutdown(WORKER_JOIN_TIMEOUT);
            if detached > 0 {
                error!("virtio-9p: detached {detached} worker threads stuck in filesystem calls");
            }
        }
        self.stats
    }

    /// Cancels `idx` if it is suspended: resumes it with "cancelled" (it
    /// finishes on its own). Returns true if it was resumed.
    fn try_cancel(&mut self, idx: usize) -> bool {
        let Some(s) = self.slots[idx].as_mut() else {
            return false;
        };
        s.cancelled = true;
        let cancellable = match s.state {
            State::OnWorker(_) => s.job.as_ref().is_some_and(|j| j.try_cancel()),
            State::Sleeping | State::Flushing => true,
            State::Runnable => false,
        };
        if cancellable {
            s.job = None;
            s.state = State::Runnable;
            self.stats.cancel_resumes += 1;
            self.runq.push_back((idx, Resume::Cancelled));
        }
        cancellable
    }

    /// Cancels the target of a Tflush: as [`Engine::try_cancel`], except
    /// that a target which is itself a Tflush waiting for its own target
    /// keeps waiting. Its Rflush promises that the request it flushes has
    /// answered (or never will), so it must not go out before that
    /// request's reply; and the Tflush flushing it waits for it in turn.
    fn flush_target(&mut self, idx: usize) {
        match self.slots[idx].as_mut() {
            Some(s) if s.state == State::Flushing => s.cancelled = true,
            Some(_) => {
                self.try_cancel(idx);
            }
            None => {}
        }
    }

    fn wake_waiter(&mut self, w: usize, generation: u64) {
        if let Some(ws) = self.slots.get_mut(w).and_then(|s| s.as_mut()) {
            if ws.generation == generation && ws.state == State::Flushing {
                ws.state = State::Runnable;
                self.runq.push_back((w, Resume::Go));
            }
        }
    }

    /// Removes a request whose coroutine returned and wakes its waiters.
    fn finish(&mut self, idx: usize, len: u32) {
        let Some(slot) = self.slots[idx].take() else {
            return;
        };
        self.free.push(idx);
        self.live -= 1;
        if let Some(tag) = slot.tag {
            if self.tags.get(&(slot.group, tag)) == Some(&idx) {
                self.tags.remove(&(slot.group, tag));
            }
        }
        if slot.cancelled || slot.cancel.is_cancelled() {
            self.stats.cancelled += 1;
        } else {
            self.stats.completed += 1;
        }
        let Slot {
            co, token, waiters, ..
        } = slot;
        if co.done() {
            // Returned: its stack is back in the pool, nothing unwinds.
            drop(co);
        } else {
            // Never reached: only returned coroutines are finished. Leak
            // rather than unwind (which aborts under panic = "abort").
            self.stats.unwound += 1;
            debug_assert!(false, "virtio-9p engine: finishing a suspended coroutine");
            error!("virtio-9p: leaking a suspended request instead of unwinding it");
            std::mem::forget(co);
        }
        self.completed.push((token, len));
        for (w, generation) in waiters {
            self.wake_waiter(w, generation);
        }
    }

    /// Hands a job to the executor, or runs it right here without one.
    fn dispatch(&mut self, idx: usize, func: JobFn, may_wait: bool) {
        let Some(slot) = self.slots[idx].as_mut() else {
            return;
        };
        let executor: Option<&dyn Executor> = match (&self.executor, &self.own_pool) {
            (Some(e), _) => Some(e.as_ref()),
            (None, Some(p)) => Some(p),
            (None, None) => None,
        };
        let Some(executor) = executor else {
            // No workers: run the call inline on the engine's thread (the
            // coroutine is suspended, its closure alive and ours alone).
            self.stats.inline_calls += 1;
            let f = func.0;
            // SAFETY: as in `Job::run`: the closure lives on the suspended
            // coroutine's stack and nothing else touches it meanwhile.
            let r = catch_unwind(AssertUnwindSafe(|| unsafe { (*f)() }));
            self.runq.push_back((idx, Resume::JobDone(r.is_err())));
            return;
        };
        let id = JobId {
            slot: idx,
            generation: slot.generation,
        };
        let job = Job::new(id, func, may_wait, Arc::clone(&self.completions));
        slot.job = Some(job.cell());
        slot.state = State::OnWorker(id);
        self.stats.offloaded += 1;
        executor.execute(job);
    }

    fn run(&mut self) {
        while let Some((idx, input)) = self.runq.pop_front() {
            let Some(slot) = self.slots.get_mut(idx).and_then(|s| s.as_mut()) else {
                continue;
            };
            slot.state = State::Runnable;
            let result = slot.co.try_resume(input);
            CURRENT.with(|c| c.set(None));
            let slot = match result {
                Ok(CoroutineResult::Return(len)) => {
                    self.finish(idx, len);
                    continue;
                }
                Err(e) => {
                    // Only a coroutine that already returned fails to
                    // resume; it holds nothing.
                    error!("virtio-9p: cannot resume request: {e}");
                    self.finish(idx, 0);
                    continue;
                }
                Ok(CoroutineResult::Yield(s)) => (s, self.slots[idx].as_mut()),
            };
            let (suspend, Some(slot)) = slot else {
                continue;
            };
            if slot.cancelled || slot.cancel.is_cancelled() {
                // Cancelled: answer every suspension at once, so the
                // request runs to its end without starting anything.
                slot.cancelled = true;
                self.stats.cancel_resumes += 1;
                self.runq.push_back((idx, Resume::Cancelled));
                continue;
            }
            match suspend {
                Suspend::Offload(func, may_wait) => self.dispatch(idx, func, may_wait),
                Suspend::Sleep(_) if slot.cancel.waits_ended() => {
                    // Stopping (see `drain`): the wait ends at once.
                    self.runq.push_back((idx, Resume::Go));
                }
                Suspend::Sleep(when) => {
                    slot.state = State::Sleeping;
                    let generation = slot.generation;
                    self.sleepers.push(Reverse((when, idx, generation)));
                    self.arm_timer();
                }
                Suspend::Flush(oldtag) => {
                    slot.state = State::Flushing;
                    let generation = slot.generation;
                    let target = self
                        .tags
                        .get(&(slot.group, oldtag))
                        .copied()
                        .filter(|t| *t != idx);
                    match target {
                        None => {
                            slot.state = State::Runnable;
                            self.runq.push_back((idx, Resume::Go));
                        }
                        Some(t) => {
                            if let Some(ts) = self.slots[t].as_mut() {
                                ts.cancel.cancel();
                                ts.waiters.push((idx, generation));
                            }
                            // Resumed with "cancelled" now if suspended; it
                            // wakes us when it returns.
                            self.flush_target(t);
                        }
                    }
                }
            }
        }
    }

    fn arm_timer(&mut self) {
        while let Some(Reverse((_, idx, generation))) = self.sleepers.peek().copied() {
            let live = self
                .slots
                .get(idx)
                .and_then(|s| s.as_ref())
                .is_some_and(|s| s.generation == generation && s.state == State::Sleeping);
            if live {
                break;
            }
            self.sleepers.pop();
        }
        let Some(Reverse((next, _, _))) = self.sleepers.peek().copied() else {
            return;
        };
        if self
            .timer_deadline
            .is_some_and(|d| d <= next && d > Instant::now())
        {
            return;
        }
        let d = next
            .saturating_duration_since(Instant::now())
            .max(Duration::from_micros(1));
        if let Err(e) = self.timer.reset(d, None) {
            error!("virtio-9p: cannot arm the engine timer: {e}");
        }
        self.timer_deadline = Some(next);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Bounded: see the module docs ("Teardown").
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    fn config(workers: usize) -> EngineConfig {
        EngineConfig {
            workers,
            ..EngineConfig::default()
        }
    }

    fn engine_with(config: &EngineConfig) -> Engine {
        let pool = Arc::new(
            StackPool::new(coro_pool::PoolConfig::default().stack_size(DEFAULT_STACK_SIZE))
                .unwrap(),
        );
        Engine::new(pool, config).unwrap()
    }

    fn engine(workers: usize) -> Engine {
        engine_with(&config(workers))
    }

    /// Polls until `n` completions arrived (or 10 s).
    fn drive(e: &mut Engine, n: usize) -> Vec<(u16, u32)> {
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.len() < n && Instant::now() < deadline {
            e.poll();
            e.take_completed(&mut out);
            std::thread::sleep(Duration::from_millis(1));
        }
        out
    }

    /// The length a task reports for a call result: the value, or 0 for
    /// EINTR (cancelled), 1000 + errno for other errors.
    fn len_of(r: io::Result<u32>) -> u32 {
        match r {
            Ok(v) => v,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => 0,
            Err(e) => 1000 + e.raw_os_error().unwrap_or(0) as u32,
        }
    }

    /// Starts a Tflush of `oldtag` (its task returns 7) and returns what
    /// completed by the time it yielded or finished.
    fn flush_now(e: &mut Engine, token: u16, oldtag: u16) -> Vec<(u16, u32)> {
        e.spawn(token, None, Cancel::new(), move || {
            flush(oldtag);
            7
        })
        .unwrap();
        let mut out = Vec::new();
        e.take_completed(&mut out);
        out
    }

    /// Counts drops: proves a cancelled request's locals are dropped.
    struct Dropped(Arc<AtomicUsize>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn test_offload_runs_off_thread_and_returns() {
        let mut e = engine(2);
        let me = std::thread::current().id();
        e.spawn(1, Some(1), Cancel::new(), move || {
            len_of(offload(move || {
                Ok(u32::from(std::thread::current().id() != me))
            }))
        })
        .unwrap();
        assert_eq!(e.in_flight(), 1);
        assert_eq!(drive(&mut e, 1), vec![(1, 1)]);
        assert_eq!(e.stats().offloaded, 1);
    }

    #[test]
    fn test_inline_request_completes_without_a_hop() {
        let mut e = engine(1);
        e.spawn(3, None, Cancel::new(), || 7).unwrap();
        let mut out = Vec::new();
        e.take_completed(&mut out);
        assert_eq!(out, vec![(3, 7)]);
        assert_eq!(e.stats().offloaded, 0);
    }

    #[test]
    fn test_1024_in_flight_on_two_workers() {
        let mut e = engine(2);
        let gate = Arc::new(std::sync::Barrier::new(3));
        let started = Arc::new(AtomicUsize::new(0));
        for i in 0..1024u16 {
            let gate = Arc::clone(&gate);
            let started = Arc::clone(&started);
            e.spawn(i, Some(i), Cancel::new(), move || {
                len_of(offload(move || {
                    // The first two jobs hold both workers until the test
                    // has seen all 1024 requests in flight.
                    if started.fetch_add(1, Ordering::SeqCst) < 2 {
                        gate.wait();
                    }
                    Ok(1)
                }))
            })
            .unwrap();
        }
        assert_eq!(e.in_flight(), 1024);
        assert_eq!(e.stats().peak_in_flight, 1024);
        gate.wait();
        assert_eq!(drive(&mut e, 1024).len(), 1024);
        assert_eq!(e.in_flight(), 0);
    }

    #[test]
    fn test_flush_resumes_a_queued_request_with_cancelled() {
        let mut e = engine(1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = Arc::new(Mutex::new(rx));
        // Tag 1 occupies the only worker; tag 2 waits in the queue.
        let r = Arc::clone(&rx);
        e.spawn(10, Some(1), Cancel::new(), move || {
            len_of(offload(move || {
                r.lock().unwrap().recv().unwrap();
                Ok(11)
            }))
        })
        .unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (ran2, dropped2) = (Arc::clone(&ran), Arc::clone(&dropped));
        e.spawn(20, Some(2), Cancel::new(), move || {
            let _local = Dropped(dropped2);
            len_of(offload(move || {
                ran2.fetch_add(1, Ordering::SeqCst);
                Ok(22)
            })) + 5
        })
        .unwrap();
        // Tflush of tag 2: the old request returns (EINTR) before Rflush.
        assert_eq!(flush_now(&mut e, 30, 2), vec![(20, 5), (30, 7)]);
        assert_eq!(
            ran.load(Ordering::SeqCst),
            0,
            "a flushed queued call never runs"
        );
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "its locals were dropped");
        tx.send(()).unwrap();
        assert_eq!(drive(&mut e, 1), vec![(10, 11)]);
        let st = e.stats();
        assert_eq!((st.cancelled, st.cancel_resumes, st.unwound), (1, 1, 0));
    }

    #[test]
    fn test_flush_waits_for_a_running_request() {
        let mut e = engine(1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        let cancel = Cancel::new();
        let seen = cancel.clone();
        e.spawn(1, Some(5), cancel, move || {
            len_of(offload(move || {
                started_tx.send(()).unwrap();
                rx.recv().unwrap();
                Ok(if seen.is_cancelled() { 0 } else { 99 })
            }))
        })
        .unwrap();
        started_rx.recv().unwrap();
        let out = flush_now(&mut e, 2, 5);
        assert!(out.is_empty(), "Rflush must wait for the running request");
        tx.send(()).unwrap();
        assert_eq!(drive(&mut e, 2), vec![(1, 0), (2, 7)]);
    }

    #[test]
    fn test_flush_of_a_flush_waits_for_the_first_target() {
        let mut e = engine(1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        e.spawn(1, Some(5), Cancel::new(), move || {
            len_of(offload(move || {
                started_tx.send(()).unwrap();
                rx.recv().unwrap();
                Ok(99)
            }))
        })
        .unwrap();
        started_rx.recv().unwrap();
        // Tflush (tag 6) of tag 5, then Tflush (tag 7) of tag 6.
        e.spawn(2, Some(6), Cancel::new(), || {
            flush(5);
            7
        })
        .unwrap();
        e.spawn(3, Some(7), Cancel::new(), || {
            flush(6);
            8
        })
        .unwrap();
        let mut out = Vec::new();
        e.take_completed(&mut out);
        assert!(
            out.is_empty(),
            "no Rflush before the running request: {out:?}"
        );
        tx.send(()).unwrap();
        assert_eq!(drive(&mut e, 3), vec![(1, 99), (2, 7), (3, 8)]);
        assert_eq!(e.stats().unwound, 0);
    }

    #[test]
    fn test_flush_of_unknown_tag_answers_at_once() {
        let mut e = engine(1);
        assert_eq!(flush_now(&mut e, 1, 1234), vec![(1, 7)]);
    }

    #[test]
    fn test_flush_of_a_sleeper_resumes_it() {
        let mut e = engine(1);
        let dropped = Arc::new(AtomicUsize::new(0));
        let d = Arc::clone(&dropped);
        e.spawn(1, Some(9), Cancel::new(), move || {
            let _local = Dropped(d);
            sleep(Duration::from_secs(3600));
            // A cancelled request gets "cancelled" at every later yield.
            let again = offload(|| Ok(5));
            sleep(Duration::from_secs(3600));
            len_of(again) + 3
        })
        .unwrap();
        assert_eq!(flush_now(&mut e, 2, 9), vec![(1, 3), (2, 7)]);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
        assert_eq!(e.stats().offloaded, 0);
        assert_eq!(e.stats().unwound, 0);
    }

    #[test]
    fn test_sleep_yields_to_the_timer() {
        let mut e = engine(1);
        let t0 = Instant::now();
        e.spawn(1, None, Cancel::new(), || {
            sleep(Duration::from_millis(30));
            5
        })
        .unwrap();
        e.spawn(2, None, Cancel::new(), || 6).unwrap();
        let mut out = Vec::new();
        e.take_completed(&mut out);
        assert_eq!(out, vec![(2, 6)], "the sleeper must not block the thread");
        assert_eq!(drive(&mut e, 1), vec![(1, 5)]);
        assert!(t0.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn test_panicking_call_returns_the_chain_empty() {
        let mut e = engine(1);
        e.spawn(1, None, Cancel::new(), || {
            len_of(offload(|| panic!("boom")));
            9
        })
        .unwrap();
        assert_eq!(drive(&mut e, 1), vec![(1, 0)]);
        // The engine keeps working.
        e.spawn(2, None, Cancel::new(), || len_of(offload(|| Ok(3))))
            .unwrap();
        assert_eq!(drive(&mut e, 1), vec![(2, 3)]);
    }

    #[test]
    fn test_quiesce_resumes_waiting_requests_and_drops_their_locals() {
        let mut e = engine(1);
        let dropped = Arc::new(AtomicUsize::new(0));
        for i in 0..4u16 {
            let d = Arc::clone(&dropped);
            e.spawn(i, Some(i), Cancel::new(), move || {
                let _local = Dropped(d);
                sleep(Duration::from_secs(3600));
                1
            })
            .unwrap();
        }
        assert_eq!(e.quiesce(Duration::from_secs(1)), 0);
        let mut out = Vec::new();
        e.take_completed(&mut out);
        assert_eq!(out.len(), 4);
        assert_eq!(dropped.load(Ordering::SeqCst), 4);
        let st = e.stats();
        assert_eq!((st.cancelled, st.unwound), (4, 0));
    }

    #[test]
    fn test_drain_ends_waits_and_waits_for_running_calls() {
        let mut e = engine(1);
        // A waiter that would sleep for an hour at a time until its waits
        // are ended.
        let waiter = Cancel::new();
        let token = waiter.clone();
        e.spawn(1, Some(1), waiter, move || loop {
            if token.waits_ended() {
                return 7;
            }
            sleep(Duration::from_secs(3600));
        })
        .unwrap();
        // A call running on the worker for a while.
        e.spawn(2, Some(2), Cancel::new(), || {
            let r: io::Result<u32> = offload(|| {
                std::thread::sleep(Duration::from_millis(200));
                Ok(9)
            });
            r.unwrap_or(0)
        })
        .unwrap();
        assert_eq!(e.in_flight(), 2);
        assert_eq!(e.drain(|| false), 0);
        let mut out = Vec::new();
        e.take_completed(&mut out);
        out.sort_unstable();
        assert_eq!(out, vec![(1, 7), (2, 9)]);
        let st = e.stats();
        assert_eq!((st.cancelled, st.completed, st.leaked), (0, 2, 0));
    }

    #[test]
    fn test_drain_gives_up_when_told() {
        let (mut e, gate) = stuck_engine();
        assert_eq!(e.drain(|| true), 1);
        drop(gate);
    }

    #[test]
    fn test_reset_abandons_the_requests_it_leaks() {
        let (mut e, gate) = stuck_engine();
        let token = e
            .slots
            .iter()
            .flatten()
            .map(|s| s.cancel.clone())
            .next()
            .unwrap();
        assert!(!token.is_abandoned());
        assert_eq!(e.reset(), 1);
        assert!(token.is_abandoned());
        assert_eq!(token.guest_access(|| ()), None);
        drop(gate);
    }

    #[test]
    fn test_offload_outside_a_coroutine_runs_inline() {
        assert!(!on_coroutine());
        assert_eq!(offload(|| Ok::<_, u32>(5)), Ok(5));
        assert_eq!(
            EngineExec::new(OffloadPolicy::Always)
                .run(TREAD, || Ok::<_, u32>(6))
                .unwrap(),
            6
        );
        assert_eq!(
            EngineExec::new(OffloadPolicy::Auto).read_at(|| false, || Ok::<_, u32>(7)),
            Ok(7)
        );
    }

    #[test]
    fn test_auto_runs_short_metadata_calls_inline_only_for_a_local_filesystem() {
        // (op, the filesystem's hint, whether the call must hop).
        let cases = [
            (TGETATTR, true, false),
            (TWALK, true, false),
            (TCLUNK, true, false),
            (TSTATFS, true, false),
            (TREADLINK, true, false),
            (TXATTRWALK, true, false),
            (TGETATTR, false, true),
            (TWALK, false, true),
            (TCLUNK, false, true),
            (MsgType::Tsetattr, true, true),
            (MsgType::Treaddir, true, true),
            (MsgType::Tfsync, true, true),
            (MsgType::Tlcreate, true, true),
            (TLOCK, true, true),
        ];
        let mut e = engine(2);
        let me = std::thread::current().id();
        for (i, (op, local, hops)) in cases.into_iter().enumerate() {
            let before = e.stats().offloaded;
            let token = i as u16;
            e.spawn(token, Some(token), Cancel::new(), move || {
                let exec = EngineExec::new(OffloadPolicy::Auto);
                len_of(exec.run_hinted(op, local, move || {
                    Ok(u32::from(std::thread::current().id() != me))
                }))
            })
            .unwrap();
            assert_eq!(drive(&mut e, 1), vec![(token, u32::from(hops))], "{op:?}");
            assert_eq!(e.stats().offloaded - before, u64::from(hops), "{op:?}");
        }
        // Always and Never ignore the hint.
        for (policy, hops) in [(OffloadPolicy::Always, 1), (OffloadPolicy::Never, 0)] {
            let before = e.stats().offloaded;
            e.spawn(99, None, Cancel::new(), move || {
                let exec = EngineExec::new(policy);
                len_of(exec.run_hinted(TGETATTR, true, move || {
                    Ok(u32::from(std::thread::current().id() != me))
                }))
            })
            .unwrap();
            assert_eq!(drive(&mut e, 1), vec![(99, hops)], "{policy:?}");
            assert_eq!(e.stats().offloaded - before, u64::from(hops));
        }
    }

    #[test]
    fn test_too_many_requests_is_an_error() {
        let cfg = EngineConfig {
            workers: 1,
            max_in_flight: 1,
            ..EngineConfig::default()
        };
        let mut e = engine_with(&cfg);
        e.spawn(1, None, Cancel::new(), || {
            sleep(Duration::from_secs(3600));
            1
        })
        .unwrap();
        assert!(matches!(
            e.spawn(2, None, Cancel::new(), || 1),
            Err(Error::TooManyRequests(1))
        ));
    }

    #[test]
    fn test_zero_workers_run_every_call_inline() {
        let mut e = engine(0);
        let me = std::thread::current().id();
        e.spawn(1, None, Cancel::new(), move || {
            len_of(offload(move || {
                Ok(u32::from(std::thread::current().id() == me))
            }))
        })
        .unwrap();
        let mut out = Vec::new();
        e.take_completed(&mut out);
        assert_eq!(out, vec![(1, 1)], "done without a poll, on this thread");
        assert_eq!((e.stats().offloaded, e.stats().inline_calls), (0, 1));
    }

    /// An executor that runs every job on a fresh thread, or drops it.
    struct Spawner {
        ran: AtomicUsize,
        drop_jobs: bool,
    }

    impl Executor for Spawner {
        fn execute(&self, job: Job) {
            self.ran.fetch_add(1, Ordering::SeqCst);
            if self.drop_jobs {
                drop(job);
            } else {
                std::thread::spawn(move || job.run());
            }
        }
    }

    #[test]
    fn test_embedder_executor_runs_the_jobs() {
        let exec = Arc::new(Spawner {
            ran: AtomicUsize::new(0),
            drop_jobs: false,
        });
        let mut e = engine_with(&EngineConfig {
            workers: 0,
            executor: Some(exec.clone()),
            ..EngineConfig::default()
        });
        let me = std::thread::current().id();
        for i in 0..8 {
            e.spawn(i, Some(i), Cancel::new(), move || {
                len_of(offload(move || {
                    Ok(u32::from(std::thread::current().id() != me))
                }))
            })
            .unwrap();
        }
        let out = drive(&mut e, 8);
        assert_eq!(out.len(), 8);
        assert!(out.iter().all(|(_, len)| *len == 1));
        assert_eq!(exec.ran.load(Ordering::SeqCst), 8);
    }

    #[test]
    fn test_dropped_job_finishes_its_request_as_cancelled() {
        let exec = Arc::new(Spawner {
            ran: AtomicUsize::new(0),
            drop_jobs: true,
        });
        let mut e = engine_with(&EngineConfig {
            executor: Some(exec),
            ..EngineConfig::default()
        });
        e.spawn(1, None, Cancel::new(), || len_of(offload(|| Ok(5))) + 1)
            .unwrap();
        assert_eq!(drive(&mut e, 1), vec![(1, 1)]);
        assert_eq!(e.stats().unwound, 0);
    }

    #[test]
    fn test_start_hook_runs_on_every_worker() {
        let started = Arc::new(AtomicUsize::new(0));
        let s = Arc::clone(&started);
        let e = engine_with(&EngineConfig {
            workers: 3,
            on_worker_start: Some(Arc::new(move || {
                s.fetch_add(1, Ordering::SeqCst);
            })),
            ..EngineConfig::default()
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while started.load(Ordering::SeqCst) < 6 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Two pools of three.
        assert_eq!(started.load(Ordering::SeqCst), 6);
        drop(e);
    }

    /// Spawns a request whose call blocks until `gate`'s sender is
    /// dropped (never, in the tests that leak it), and returns once a
    /// worker runs it.
    fn spawn_stuck(e: &mut Engine, token: u16, gate: &Arc<Mutex<std::sync::mpsc::Receiver<()>>>) {
        let g = Arc::clone(gate);
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        e.spawn(token, Some(token), Cancel::new(), move || {
            len_of(offload(move || {
                let _ = started_tx.send(());
                let _ = g.lock().unwrap().recv();
                Ok(1)
            }))
        })
        .unwrap();
        started_rx.recv().unwrap();
    }

    /// How long the teardown tests let a reset wait.
    const STUCK_TIMEOUT: Duration = Duration::from_millis(300);

    /// An engine with one worker whose request 1 is stuck in a call until
    /// the returned sender is dropped.
    fn stuck_engine() -> (Engine, std::sync::mpsc::Sender<()>) {
        let mut e = engine_with(&EngineConfig {
            workers: 1,
            quiesce_timeout: STUCK_TIMEOUT,
            ..EngineConfig::default()
        });
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        spawn_stuck(&mut e, 1, &Arc::new(Mutex::new(rx)));
        (e, tx)
    }

    #[test]
    fn test_reset_leaks_a_stuck_call_within_the_bound() {
        let timeout = STUCK_TIMEOUT;
        let (mut e, tx) = stuck_engine();
        // A sleeper and a queued call behind the stuck one are cancelled.
        e.spawn(2, Some(2), Cancel::new(), || {
            sleep(Duration::from_secs(3600));
            2
        })
        .unwrap();
        e.spawn(3, Some(3), Cancel::new(), || len_of(offload(|| Ok(3))) + 30)
            .unwrap();
        let t0 = Instant::now();
        assert_eq!(e.reset(), 1);
        let took = t0.elapsed();
        assert!(
            took >= timeout && took < timeout + Duration::from_secs(3),
            "{took:?}"
        );
        let mut out = Vec::new();
        e.take_completed(&mut out);
        out.sort_unstable();
        assert_eq!(out, vec![(1, 0), (2, 2), (3, 30)]);
        assert_eq!(e.in_flight(), 0);
        assert_eq!((e.stats().leaked, e.stats().unwound), (1, 0));
        // The late completion of the leaked call is ignored, and the engine
        // keeps serving (on the other pool: the general one is stuck).
        drop(tx);
        e.spawn(4, None, Cancel::new(), || {
            sleep(Duration::from_millis(1));
            4
        })
        .unwrap();
        let out = drive(&mut e, 1);
        assert_eq!(out, vec![(4, 4)]);
    }

    #[test]
    fn test_drop_with_a_call_that_never_returns_is_bounded() {
        let timeout = STUCK_TIMEOUT;
        let (mut e, tx) = stuck_engine();
        // Never answered: the sender lives past the test (leaked).
        std::mem::forget(tx);
        let t0 = Instant::now();
        let stats = e.shutdown();
        drop(e);
        let took = t0.elapsed();
        assert_eq!(stats.leaked, 1);
        assert!(
            took < timeout + WORKER_JOIN_TIMEOUT + Duration::from_secs(2),
            "{took:?}"
        );
    }
}
