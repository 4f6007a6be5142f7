//! The coroutine request engine.
//!
//! Every in-flight request runs on its own stackful coroutine (from
//! `coro-pool`), on the engine's thread (the vring thread). A request that
//! must block hands the call to a [worker pool](EngineConfig::workers) and
//! yields ([`offload`]); the thread goes on serving other requests and
//! resumes the coroutine when the worker posts the result. So a handful of
//! OS threads keeps a whole queue of requests in flight, and the engine's
//! thread itself never blocks.
//!
//! What runs where (the inline-vs-offload line, measured in the
//! `virtio-9p` benchmark suite and documented in the crate README):
//!
//! - Tread whose range is already in the page cache (checked with
//!   `cachestat(2)`) runs inline: the `preadv` into guest memory costs
//!   less than a thread hop. Uncached ranges go to a worker.
//! - A blocking Tlock waits between its attempts in [`sleep`] (a timer:
//!   the coroutine yields and holds no thread), and its attempts run on a
//!   second worker pool, so a pile of blocked locks never starves reads
//!   and writes.
//! - Every other filesystem call goes through [`Blocking::run`], which
//!   offloads it unless the [`OffloadPolicy`] says otherwise.
//!
//! Tflush: the engine finds the request with `oldtag`, sets its
//! [`Cancel`] token, and then either drops it (when it is queued for a
//! worker, sleeping, or waiting: its stack is unwound and its chain goes
//! back with no reply) or waits for it to finish (when a worker is running
//! it). Only then does the Tflush complete, so the guest sees the old
//! request's buffers before the Rflush, as the protocol requires.

mod workers;

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io;
use std::os::fd::AsRawFd;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coro_pool::{Coroutine, CoroutineResult, Reservation, StackPool, Yielder};
use log::{debug, error};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use crate::protocol::{TLOCK, TREAD, TVERSION};
use crate::server::{Blocking, Cancel};

pub use workers::MAX_WORKERS;
use workers::{Done, Job, JobFn, JobId, Workers};

/// Default number of worker threads (`--thread-pool-size`).
pub const DEFAULT_WORKERS: usize = 8;
/// Default usable stack size of a request coroutine.
pub const DEFAULT_STACK_SIZE: usize = 256 << 10;
/// How long [`Engine::quiesce`] waits for requests running on workers.
pub const QUIESCE_TIMEOUT: Duration = Duration::from_secs(5);

/// Which filesystem calls leave the engine's thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OffloadPolicy {
    /// Tread of cached data inline, everything else on a worker (default).
    #[default]
    Auto,
    /// Every call on a worker, including cached reads.
    Always,
    /// Every call inline on the engine's thread (no worker hop; a slow
    /// filesystem call stalls every request of the queue). For measurements.
    Never,
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Worker threads for blocking calls (1 to [`MAX_WORKERS`]).
    pub workers: usize,
    /// Requests the engine must keep in flight at once: the pool reservation
    /// (queue size × queues).
    pub max_in_flight: usize,
    /// Where the calls run.
    pub offload: OffloadPolicy,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            workers: DEFAULT_WORKERS,
            max_in_flight: 1024,
            offload: OffloadPolicy::Auto,
        }
    }
}

/// Errors of the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The worker pool or its eventfd could not be created.
    #[error("cannot start the engine's workers: {0}")]
    Workers(#[source] io::Error),
    /// The timer fd could not be created or armed.
    #[error("engine timer failed: {0}")]
    Timer(#[source] io::Error),
    /// No coroutine stack could be had for a new request.
    #[error("no coroutine stack for a new request: {0}")]
    Stack(#[source] coro_pool::Error),
    /// More requests than `max_in_flight`.
    #[error("more than {0} requests in flight")]
    TooManyRequests(usize),
}

/// Input of a resumed coroutine.
enum Resume {
    /// First run, a sleep ended, or a flush target finished.
    Go,
    /// The offloaded job finished; `true` if it panicked.
    JobDone(bool),
}

/// Which worker pool runs a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// Filesystem calls.
    General,
    /// Calls that may wait a long time for someone else (blocking Tlock):
    /// kept apart so a pile of blocked locks cannot starve reads and writes.
    Wait,
}

/// Why a coroutine yielded.
enum Suspend {
    /// Run this job on a worker.
    Offload(JobFn, Lane),
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
    OnWorker(JobId, Lane),
    /// Sleeping until a deadline.
    Sleeping,
    /// A Tflush waiting for its target.
    Flushing,
}

struct Slot {
    co: Co,
    generation: u64,
    token: u16,
    tag: Option<u16>,
    cancel: Cancel,
    state: State,
    /// Tflush coroutines waiting for this request to finish.
    waiters: Vec<usize>,
}

thread_local! {
    /// The yielder of the coroutine currently running on this thread.
    static CURRENT: Cell<Option<NonNull<Yielder<Resume, Suspend>>>> = const { Cell::new(None) };
}

/// Restores [`CURRENT`] on scope exit, also when a coroutine is unwound.
struct CurrentGuard(Option<NonNull<Yielder<Resume, Suspend>>>);

impl Drop for CurrentGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

fn suspend(s: Suspend) -> Option<Resume> {
    let y = CURRENT.with(|c| c.get())?;
    // SAFETY: CURRENT only holds the yielder of the coroutine running on
    // this thread right now (set when it starts, restored after every
    // suspension, cleared when the engine's resume returns), and a yielder
    // lives as long as its coroutine.
    let yielder = unsafe { y.as_ref() };
    let input = yielder.suspend(s);
    CURRENT.with(|c| c.set(Some(y)));
    Some(input)
}

/// Whether the caller runs on an engine coroutine.
pub fn on_coroutine() -> bool {
    CURRENT.with(|c| c.get().is_some())
}

/// Runs `f` on a worker thread while the calling coroutine yields, and
/// returns its result. Outside an engine coroutine it simply calls `f`.
/// A panic in `f` is propagated to the caller.
pub fn offload<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    offload_in(Lane::General, f)
}

fn offload_in<R: Send>(lane: Lane, f: impl FnOnce() -> R + Send) -> R {
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
    // suspended, and never drops it, until the worker has finished calling
    // the closure (see `Engine::run`), so the borrow outlives every use.
    let ptr: *mut (dyn FnMut() + Send + 'static) = unsafe { std::mem::transmute(dyn_call) };
    match suspend(Suspend::Offload(JobFn(ptr), lane)) {
        Some(Resume::JobDone(false)) => {}
        Some(Resume::JobDone(true)) => resume_unwind(Box::new("filesystem call panicked")),
        _ => resume_unwind(Box::new("engine resumed an offloaded request early")),
    }
    match out {
        Some(r) => r,
        None => resume_unwind(Box::new("offloaded call did not run")),
    }
}

/// Sleeps `d`: on an engine coroutine by yielding to a timer (the thread
/// keeps serving), elsewhere with `std::thread::sleep`.
pub fn sleep(d: Duration) {
    if !on_coroutine() {
        std::thread::sleep(d);
        return;
    }
    let _ = suspend(Suspend::Sleep(Instant::now() + d));
}

/// Cancels the in-flight request with `tag` (see the module docs) and
/// returns once it has finished or been dropped. Must run on an engine
/// coroutine; elsewhere it returns at once.
pub fn flush(tag: u16) {
    let _ = suspend(Suspend::Flush(tag));
}

/// The [`Blocking`] executor the engine hands to the server.
#[derive(Debug, Clone, Copy)]
pub struct EngineExec {
    policy: OffloadPolicy,
}

impl EngineExec {
    /// An executor with `policy`.
    pub fn new(policy: OffloadPolicy) -> Self {
        EngineExec { policy }
    }
}

thread_local! {
    /// Set while an inline Tread runs, so the reply writer checks the page
    /// cache and offloads only the uncached part.
    static READ_INLINE: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current Tread runs inline and must offload blocking I/O
/// itself (the reply writer asks; see the module docs).
pub(crate) fn read_runs_inline() -> bool {
    READ_INLINE.with(|r| r.get())
}

impl Blocking for EngineExec {
    fn run<R: Send>(&self, op: u8, f: impl FnOnce() -> R + Send) -> R {
        match self.policy {
            OffloadPolicy::Never => f(),
            OffloadPolicy::Always => offload(f),
            OffloadPolicy::Auto if op == TREAD && on_coroutine() => {
                struct Reset;
                impl Drop for Reset {
                    fn drop(&mut self) {
                        READ_INLINE.with(|r| r.set(false));
                    }
                }
                READ_INLINE.with(|r| r.set(true));
                let _reset = Reset;
                f()
            }
            OffloadPolicy::Auto if op == TVERSION => f(),
            OffloadPolicy::Auto if op == TLOCK => offload_in(Lane::Wait, f),
            OffloadPolicy::Auto => offload(f),
        }
    }

    fn sleep(&self, d: Duration) {
        // On a coroutine: a timer, no thread held (a waiting Tlock).
        sleep(d);
    }
}

/// Counters of an engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Requests started.
    pub started: u64,
    /// Requests finished with a reply.
    pub completed: u64,
    /// Requests cancelled by Tflush or quiesce.
    pub cancelled: u64,
    /// Jobs handed to workers.
    pub offloaded: u64,
    /// Most requests in flight at once.
    pub peak_in_flight: usize,
}

/// The engine of one queue. It is not `Send`: create, drive and drop it on
/// one thread.
pub struct Engine {
    pool: Arc<StackPool>,
    _reservation: Reservation,
    wake: EventFd,
    workers: Workers,
    wait_workers: Workers,
    timer: TimerFd,
    timer_deadline: Option<Instant>,
    sleepers: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    next_generation: u64,
    tags: HashMap<u16, usize>,
    runq: VecDeque<(usize, Resume)>,
    completed: Vec<(u16, u32)>,
    done_scratch: Vec<Done>,
    max_in_flight: usize,
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
    pub fn new(pool: Arc<StackPool>, config: &EngineConfig) -> Result<Engine, EngineError> {
        let wake = EventFd::new(EFD_NONBLOCK).map_err(EngineError::Workers)?;
        let clone = || wake.try_clone().map_err(EngineError::Workers);
        let workers =
            Workers::new(config.workers, "9p-worker", clone()?).map_err(EngineError::Workers)?;
        let wait_workers =
            Workers::new(config.workers, "9p-lock-wait", clone()?).map_err(EngineError::Workers)?;
        let timer = TimerFd::new()
            .map_err(|e| EngineError::Timer(io::Error::from_raw_os_error(e.errno())))?;
        set_nonblocking(timer.as_raw_fd()).map_err(EngineError::Timer)?;
        let reservation = pool.reserve(config.max_in_flight);
        Ok(Engine {
            pool,
            _reservation: reservation,
            wake,
            workers,
            wait_workers,
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
            live: 0,
            stats: EngineStats::default(),
        })
    }

    /// The fd that becomes readable when workers have finished jobs; call
    /// [`Engine::poll`] then.
    pub fn wake_fd(&self) -> std::os::fd::RawFd {
        self.wake.as_raw_fd()
    }

    /// The timer fd that becomes readable when a sleeping request is due;
    /// call [`Engine::poll`] then.
    pub fn timer_fd(&self) -> std::os::fd::RawFd {
        self.timer.as_raw_fd()
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
    ) -> Result<(), EngineError>
    where
        F: FnOnce() -> u32 + 'static,
    {
        if self.live >= self.max_in_flight {
            return Err(EngineError::TooManyRequests(self.max_in_flight));
        }
        let co = Coroutine::new_in(
            &self.pool,
            move |yielder: &Yielder<Resume, Suspend>, _input| {
                let _guard = CurrentGuard(None);
                CURRENT.with(|c| c.set(Some(NonNull::from(yielder))));
                match catch_unwind(AssertUnwindSafe(task)) {
                    Ok(len) => len,
                    Err(_) => {
                        error!("virtio-9p: request handler panicked; returning its buffers empty");
                        0
                    }
                }
            },
        )
        .map_err(EngineError::Stack)?;
        let generation = self.next_generation;
        self.next_generation += 1;
        let slot = Slot {
            co,
            generation,
            token,
            tag,
            cancel,
            state: State::Runnable,
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
            self.tags.insert(tag, idx);
        }
        self.live += 1;
        self.stats.started += 1;
        self.stats.peak_in_flight = self.stats.peak_in_flight.max(self.live);
        self.runq.push_back((idx, Resume::Go));
        self.run();
        Ok(())
    }

    /// Collects finished jobs and due sleepers and resumes their requests.
    pub fn poll(&mut self) {
        let mut done = std::mem::take(&mut self.done_scratch);
        let _ = self.wake.read();
        self.workers.take_done(&mut done);
        self.wait_workers.take_done(&mut done);
        for d in done.drain(..) {
            match self.slots.get(d.id.slot).and_then(|s| s.as_ref()) {
                Some(s)
                    if s.generation == d.id.generation
                        && matches!(s.state, State::OnWorker(id, _) if id == d.id) =>
                {
                    self.runq
                        .push_back((d.id.slot, Resume::JobDone(d.panicked)));
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
            if let Some(s) = self.slots.get(idx).and_then(|s| s.as_ref()) {
                if s.generation == generation && s.state == State::Sleeping {
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

    /// Cancels every request that is not running on a worker, then waits up
    /// to `timeout` for the others and resumes them (they are cancelled at
    /// their next yield). Returns the requests still in flight afterwards.
    pub fn quiesce(&mut self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let live: Vec<usize> = (0..self.slots.len())
                .filter(|i| self.slots[*i].is_some())
                .collect();
            for idx in live {
                if let Some(s) = self.slots[idx].as_ref() {
                    s.cancel.cancel();
                }
                self.try_cancel(idx);
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
            if self.workers.wait_idle(step) {
                self.wait_workers.wait_idle(step);
            }
            self.poll();
        }
    }

    /// Cancels `idx` if it is not running: drops its coroutine and reports
    /// its token with length 0. Returns true if it was cancelled.
    fn try_cancel(&mut self, idx: usize) -> bool {
        let Some(s) = self.slots[idx].as_ref() else {
            return false;
        };
        let cancellable = match s.state {
            State::OnWorker(id, lane) => self.pool_of(lane).cancel(id),
            State::Sleeping | State::Flushing => true,
            State::Runnable => false,
        };
        if cancellable {
            self.finish(idx, 0, true);
        }
        cancellable
    }

    /// Removes a finished or cancelled request and wakes its waiters.
    fn finish(&mut self, idx: usize, len: u32, cancelled: bool) {
        let Some(slot) = self.slots[idx].take() else {
            return;
        };
        self.free.push(idx);
        self.live -= 1;
        if let Some(tag) = slot.tag {
            if self.tags.get(&tag) == Some(&idx) {
                self.tags.remove(&tag);
            }
        }
        if cancelled {
            self.stats.cancelled += 1;
        } else {
            self.stats.completed += 1;
        }
        let Slot {
            co, token, waiters, ..
        } = slot;
        // Dropping a suspended coroutine unwinds its stack: the request's
        // reader, writer and fid references are released here. A coroutine
        // in `OnWorker` state never reaches this point (see try_cancel).
        drop(co);
        self.completed.push((token, len));
        for w in waiters {
            if let Some(ws) = self.slots.get(w).and_then(|s| s.as_ref()) {
                if ws.state == State::Flushing {
                    self.runq.push_back((w, Resume::Go));
                }
            }
        }
    }

    fn run(&mut self) {
        while let Some((idx, input)) = self.runq.pop_front() {
            let Some(slot) = self.slots.get_mut(idx).and_then(|s| s.as_mut()) else {
                continue;
            };
            slot.state = State::Runnable;
            let result = slot.co.try_resume(input);
            CURRENT.with(|c| c.set(None));
            match result {
                Ok(CoroutineResult::Return(len)) => self.finish(idx, len, false),
                Ok(CoroutineResult::Yield(Suspend::Offload(func, lane))) => {
                    let slot = self.slots[idx].as_mut().expect("slot is live");
                    if slot.cancel.is_cancelled() {
                        // Flushed before the call started: drop it unrun.
                        self.finish(idx, 0, true);
                        continue;
                    }
                    let id = JobId {
                        slot: idx,
                        generation: slot.generation,
                    };
                    slot.state = State::OnWorker(id, lane);
                    self.stats.offloaded += 1;
                    self.pool_of(lane).submit(Job { id, func });
                }
                Ok(CoroutineResult::Yield(Suspend::Sleep(when))) => {
                    let slot = self.slots[idx].as_mut().expect("slot is live");
                    if slot.cancel.is_cancelled() {
                        self.finish(idx, 0, true);
                        continue;
                    }
                    slot.state = State::Sleeping;
                    let generation = slot.generation;
                    self.sleepers.push(Reverse((when, idx, generation)));
                    self.arm_timer();
                }
                Ok(CoroutineResult::Yield(Suspend::Flush(oldtag))) => {
                    self.slots[idx].as_mut().expect("slot is live").state = State::Flushing;
                    let target = self.tags.get(&oldtag).copied().filter(|t| *t != idx);
                    match target {
                        None => self.runq.push_back((idx, Resume::Go)),
                        Some(t) => {
                            if let Some(ts) = self.slots[t].as_mut() {
                                ts.cancel.cancel();
                                ts.waiters.push(idx);
                            }
                            // Cancelled now (its waiters, us included, are
                            // queued) or later when it finishes.
                            self.try_cancel(t);
                        }
                    }
                }
                Err(e) => {
                    error!("virtio-9p: cannot resume request: {e}");
                    self.finish(idx, 0, true);
                }
            }
        }
    }

    fn pool_of(&self, lane: Lane) -> &Workers {
        match lane {
            Lane::General => &self.workers,
            Lane::Wait => &self.wait_workers,
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
        // A coroutine whose call runs on a worker must outlive the call:
        // cancel what can be cancelled and wait for the rest.
        if self.live > 0 {
            let left = self.quiesce(QUIESCE_TIMEOUT);
            if left > 0 {
                loop {
                    if self.workers.wait_idle(Duration::from_secs(1))
                        && self.wait_workers.wait_idle(Duration::from_secs(1))
                    {
                        break;
                    }
                    error!("virtio-9p: waiting for {left} filesystem calls to finish before dropping the engine");
                }
                self.poll();
                let _ = self.quiesce(Duration::ZERO);
            }
        }
        // Whatever is left is suspended off-worker and can be unwound; a
        // request still on a worker (a call that never returned) is leaked
        // rather than freed under the worker's feet.
        for idx in 0..self.slots.len() {
            match self.slots[idx].as_ref().map(|s| s.state) {
                Some(State::OnWorker(id, lane)) if !self.pool_of(lane).cancel(id) => {
                    if let Some(slot) = self.slots[idx].take() {
                        error!("virtio-9p: leaking a request whose filesystem call never returned");
                        std::mem::forget(slot);
                    }
                }
                Some(_) => self.finish(idx, 0, true),
                None => {}
            }
        }
    }
}

fn set_nonblocking(fd: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on an fd we own; no memory is involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    fn engine(workers: usize) -> Engine {
        let pool = Arc::new(
            StackPool::new(coro_pool::PoolConfig::default().stack_size(DEFAULT_STACK_SIZE))
                .unwrap(),
        );
        Engine::new(
            pool,
            &EngineConfig {
                workers,
                max_in_flight: 1024,
                offload: OffloadPolicy::Auto,
            },
        )
        .unwrap()
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

    #[test]
    fn test_offload_runs_off_thread_and_returns() {
        let mut e = engine(2);
        let me = std::thread::current().id();
        e.spawn(1, Some(1), Cancel::new(), move || {
            let other = offload(move || std::thread::current().id() != me);
            assert!(other);
            42
        })
        .unwrap();
        assert_eq!(e.in_flight(), 1);
        assert_eq!(drive(&mut e, 1), vec![(1, 42)]);
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
                offload(move || {
                    // The first two jobs hold both workers until the test
                    // has seen all 1024 requests in flight.
                    if started.fetch_add(1, Ordering::SeqCst) < 2 {
                        gate.wait();
                    }
                });
                1
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
    fn test_flush_drops_a_queued_request_before_rflush() {
        let mut e = engine(1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = Arc::new(Mutex::new(rx));
        // Tag 1 occupies the only worker; tag 2 waits in the queue.
        let r = Arc::clone(&rx);
        e.spawn(10, Some(1), Cancel::new(), move || {
            offload(move || r.lock().unwrap().recv().unwrap());
            11
        })
        .unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let ran2 = Arc::clone(&ran);
        e.spawn(20, Some(2), Cancel::new(), move || {
            offload(move || ran2.fetch_add(1, Ordering::SeqCst));
            22
        })
        .unwrap();
        // Tflush of tag 2: completes the old request (length 0) first.
        e.spawn(30, None, Cancel::new(), || {
            flush(2);
            7
        })
        .unwrap();
        let mut out = Vec::new();
        e.take_completed(&mut out);
        assert_eq!(out, vec![(20, 0), (30, 7)]);
        assert_eq!(
            ran.load(Ordering::SeqCst),
            0,
            "a flushed queued call never runs"
        );
        tx.send(()).unwrap();
        assert_eq!(drive(&mut e, 1), vec![(10, 11)]);
        assert_eq!(e.stats().cancelled, 1);
    }

    #[test]
    fn test_flush_waits_for_a_running_request() {
        let mut e = engine(1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let cancel = Cancel::new();
        let seen = cancel.clone();
        e.spawn(1, Some(5), cancel, move || {
            let interrupted = offload(move || {
                rx.recv().unwrap();
                seen.is_cancelled()
            });
            if interrupted {
                0
            } else {
                99
            }
        })
        .unwrap();
        // Give the worker time to start the call.
        std::thread::sleep(Duration::from_millis(50));
        e.spawn(2, None, Cancel::new(), || {
            flush(5);
            7
        })
        .unwrap();
        let mut out = Vec::new();
        e.take_completed(&mut out);
        assert!(out.is_empty(), "Rflush must wait for the running request");
        tx.send(()).unwrap();
        assert_eq!(drive(&mut e, 2), vec![(1, 0), (2, 7)]);
    }

    #[test]
    fn test_flush_of_unknown_tag_answers_at_once() {
        let mut e = engine(1);
        e.spawn(1, None, Cancel::new(), || {
            flush(1234);
            7
        })
        .unwrap();
        let mut out = Vec::new();
        e.take_completed(&mut out);
        assert_eq!(out, vec![(1, 7)]);
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
            offload(|| panic!("boom"));
            9
        })
        .unwrap();
        assert_eq!(drive(&mut e, 1), vec![(1, 0)]);
        // The engine keeps working.
        e.spawn(2, None, Cancel::new(), || offload(|| 3)).unwrap();
        assert_eq!(drive(&mut e, 1), vec![(2, 3)]);
    }

    #[test]
    fn test_quiesce_cancels_waiting_requests() {
        let mut e = engine(1);
        for i in 0..4u16 {
            e.spawn(i, Some(i), Cancel::new(), || {
                sleep(Duration::from_secs(3600));
                1
            })
            .unwrap();
        }
        assert_eq!(e.quiesce(Duration::from_secs(1)), 0);
        let mut out = Vec::new();
        e.take_completed(&mut out);
        assert_eq!(out.len(), 4);
        assert!(out.iter().all(|(_, len)| *len == 0));
    }

    #[test]
    fn test_offload_outside_a_coroutine_runs_inline() {
        assert!(!on_coroutine());
        assert_eq!(offload(|| 5), 5);
        assert_eq!(EngineExec::new(OffloadPolicy::Always).run(TREAD, || 6), 6);
    }

    #[test]
    fn test_too_many_requests_is_an_error() {
        let pool = Arc::new(StackPool::new(coro_pool::PoolConfig::default()).unwrap());
        let cfg = EngineConfig {
            workers: 1,
            max_in_flight: 1,
            offload: OffloadPolicy::Auto,
        };
        let mut e = Engine::new(pool, &cfg).unwrap();
        e.spawn(1, None, Cancel::new(), || {
            sleep(Duration::from_secs(3600));
            1
        })
        .unwrap();
        assert!(matches!(
            e.spawn(2, None, Cancel::new(), || 1),
            Err(EngineError::TooManyRequests(1))
        ));
    }
}
