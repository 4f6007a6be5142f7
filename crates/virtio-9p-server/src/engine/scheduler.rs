// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The scheduler: the [`Engine`] that runs each request on a coroutine,
//! resumes it when its call, timer or flush target is done, and stops,
//! drains and tears down (see the engine's docs). It knows requests by
//! token and tag only: nothing of 9P or of the server.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coro_pool::{Coroutine, CoroutineResult, Reservation, StackPool, Yielder};
use log::{debug, error, warn};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use crate::exec::Cancel;
use crate::sys::{set_nonblocking, wait_readable};

use super::coroutine::{Context, CurrentGuard, Resume, Suspend, CURRENT};
use super::error::EngineError;
use super::policy::OffloadPolicy;
use super::workers::{Completions, Done, JobCell, JobFn, JobId, Outcome, ThreadPool};
use super::workers::{Executor, Job, WORKER_JOIN_TIMEOUT};

/// Worker threads per pool of the daemon (`--thread-pool-size`) and of
/// [`EngineConfig::sized_to_process`]; there are two pools, so 16 threads.
pub const DEFAULT_WORKERS: usize = 8;
/// Worker threads per pool of [`EngineConfig::default`], the embedded
/// default: 2 per pool, 4 threads per device.
const EMBEDDED_WORKERS: usize = 2;
/// Default usable stack size of a request coroutine.
pub const DEFAULT_STACK_SIZE: usize = 256 << 10;
/// Default of [`EngineConfig::quiesce_timeout`]: how long a reset,
/// disconnect or drop waits for requests running on workers before it
/// leaks them.
pub(crate) const QUIESCE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often [`Engine::drain`] says what it still waits for.
pub(crate) const DRAIN_LOG_EVERY: Duration = Duration::from_secs(5);

/// Engine settings.
#[derive(Clone)]
#[non_exhaustive]
pub struct EngineConfig {
    /// The engine's own worker threads for blocking calls (0 to
    /// [`MAX_WORKERS`](super::MAX_WORKERS) per pool; there are two pools, see [`Job::may_wait`]).
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
    pub on_worker_start: Option<Arc<dyn Fn() + Send + Sync>>,
    /// How long [`Engine::reset`] and [`Engine::shutdown`] wait for calls
    /// running on workers before they leak those requests (default 5 s).
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

impl EngineConfig {
    /// The daemon's sizing, for a process that serves nothing else:
    /// [`DEFAULT_WORKERS`] per pool (16 threads), the rest as
    /// [`Default`].
    pub fn sized_to_process() -> Self {
        EngineConfig {
            workers: DEFAULT_WORKERS,
            ..EngineConfig::default()
        }
    }
}

/// Bounded for a device embedded in a VMM's process: 2 workers per pool
/// (4 threads per device), 1024 requests in flight.
impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            workers: EMBEDDED_WORKERS,
            max_in_flight: 1024,
            offload: OffloadPolicy::Auto,
            executor: None,
            on_worker_start: None,
            quiesce_timeout: QUIESCE_TIMEOUT,
        }
    }
}

pub(super) type Co = Coroutine<Resume, Suspend, u32>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Being resumed, or about to be.
    Runnable,
    /// Its job is queued or running on a worker.
    OnWorker(JobId),
    /// Sleeping until a deadline.
    Sleeping,
    /// A Tflush waiting for its target.
    Flushing,
}

pub(super) struct Slot {
    pub(super) co: Co,
    pub(super) generation: u64,
    pub(super) token: u16,
    /// The tag space (one per 9P connection; 0 for [`Engine::spawn`]).
    pub(super) group: u32,
    pub(super) tag: Option<u16>,
    pub(super) cancel: Cancel,
    pub(super) state: State,
    /// The claim word of the job while `state` is `OnWorker`.
    pub(super) job: Option<Arc<JobCell>>,
    /// Resumed with "cancelled": every later suspension is answered the
    /// same way at once.
    pub(super) cancelled: bool,
    /// Tflush coroutines (slot, generation) waiting for this request.
    pub(super) waiters: Vec<(usize, u64)>,
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
    pub(super) pool: Arc<StackPool>,
    pub(super) _reservation: Reservation,
    pub(super) completions: Arc<Completions>,
    pub(super) wake: EventFd,
    pub(super) own_pool: Option<ThreadPool>,
    pub(super) executor: Option<Arc<dyn Executor>>,
    pub(super) timer: TimerFd,
    pub(super) timer_deadline: Option<Instant>,
    pub(super) sleepers: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    pub(super) slots: Vec<Option<Slot>>,
    pub(super) free: Vec<usize>,
    pub(super) next_generation: u64,
    pub(super) tags: HashMap<(u32, u16), usize>,
    pub(super) runq: VecDeque<(usize, Resume)>,
    pub(super) completed: Vec<(u16, u32)>,
    pub(super) done_scratch: Vec<Done>,
    pub(super) max_in_flight: usize,
    pub(super) quiesce_timeout: Duration,
    pub(super) live: usize,
    pub(super) stats: EngineStats,
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
        let completions = Arc::new(Completions::new(
            wake.try_clone().map_err(EngineError::Workers)?,
        ));
        let own_pool = if config.executor.is_none() && config.workers > 0 {
            Some(
                ThreadPool::new(config.workers, config.on_worker_start.as_ref())
                    .map_err(EngineError::Workers)?,
            )
        } else {
            None
        };
        let timer = TimerFd::new()
            .map_err(|e| EngineError::Timer(io::Error::from_raw_os_error(e.errno())))?;
        set_nonblocking(timer.as_raw_fd()).map_err(EngineError::Timer)?;
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
    ) -> Result<(), EngineError>
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
        .map_err(EngineError::Stack)?;
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

    /// Pauses the engine as a device that stops with its lock waiters kept
    /// in flight: every request finishes as in [`Engine::drain`], except
    /// those waiting (a blocking Tlock sleeping between attempts), whose
    /// waits are held ([`Cancel::hold_waits`]): they make no attempt, so
    /// they neither finish nor write anything, until
    /// [`Engine::resume_waits`]. Returns the requests still in flight:
    /// the held waiters, once every other request finished (or earlier,
    /// when `give_up` says so).
    pub fn pause(&mut self, give_up: impl Fn() -> bool) -> usize {
        let started = Instant::now();
        let mut next_log = started + DRAIN_LOG_EVERY;
        loop {
            for s in self.slots.iter().flatten() {
                s.cancel.hold_waits();
            }
            self.run();
            let busy = self
                .slots
                .iter()
                .flatten()
                .filter(|s| s.state != State::Sleeping)
                .count();
            if busy == 0 || give_up() {
                return self.live;
            }
            let now = Instant::now();
            if now >= next_log {
                next_log = now + DRAIN_LOG_EVERY;
                warn!(
                    "virtio-9p: pausing the device: still waiting after {:?} for {busy} requests",
                    now - started
                );
            }
            wait_readable(self.wake.as_raw_fd(), Duration::from_millis(50));
            self.poll();
        }
    }

    /// Ends a [`pause`](Engine::pause): the held waiters try again at
    /// once.
    pub fn resume_waits(&mut self) {
        for idx in 0..self.slots.len() {
            if let Some(s) = self.slots[idx].as_mut() {
                s.cancel.release_waits();
                if s.state == State::Sleeping {
                    s.state = State::Runnable;
                    self.runq.push_back((idx, Resume::Go));
                }
            }
        }
        self.run();
    }

    /// Ends every request without letting any of them touch guest memory
    /// again: each is abandoned ([`Cancel::abandon`]) before it is
    /// cancelled, so the error it answers goes nowhere, then
    /// [`reset`](Engine::reset). For requests of a guest that is gone (the
    /// device was reset, or the ring came back for another guest).
    pub fn discard(&mut self) -> usize {
        for s in self.slots.iter().flatten() {
            s.cancel.abandon();
        }
        self.reset()
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
    pub(super) fn try_cancel(&mut self, idx: usize) -> bool {
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
    pub(super) fn flush_target(&mut self, idx: usize) {
        match self.slots[idx].as_mut() {
            Some(s) if s.state == State::Flushing => s.cancelled = true,
            Some(_) => {
                self.try_cancel(idx);
            }
            None => {}
        }
    }

    pub(super) fn wake_waiter(&mut self, w: usize, generation: u64) {
        if let Some(ws) = self.slots.get_mut(w).and_then(|s| s.as_mut()) {
            if ws.generation == generation && ws.state == State::Flushing {
                ws.state = State::Runnable;
                self.runq.push_back((w, Resume::Go));
            }
        }
    }

    /// Removes a request whose coroutine returned and wakes its waiters.
    pub(super) fn finish(&mut self, idx: usize, len: u32) {
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
    pub(super) fn dispatch(&mut self, idx: usize, func: JobFn, may_wait: bool) {
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

    pub(super) fn run(&mut self) {
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

    pub(super) fn arm_timer(&mut self) {
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
