// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The jobs the engine hands to other threads, the [`Executor`] that runs
//! them, and the engine's own worker threads (the default executor).
//!
//! A coroutine that must block hands a [`Job`] to the executor and yields;
//! a thread runs the job and posts the request's slot to the completion
//! list, then wakes the engine's thread through an eventfd (one write per
//! batch: only when the list was empty).
//!
//! A job is claimed exactly once: either a thread starts it
//! ([`Job::run`]) or the engine cancels it while it is still queued
//! (Tflush, reset). The loser of that race does nothing, so a cancelled
//! job never touches the coroutine it came from, and the engine resumes
//! that coroutine with "cancelled" at once.

use std::collections::VecDeque;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::error;
use vmm_sys_util::eventfd::EventFd;

/// Most worker threads a pool may have.
pub const MAX_WORKERS: usize = 1024;

/// How long dropping the engine's own worker pool waits for its threads to
/// exit. A thread still running a call then (a call that never returns) is
/// detached, never joined.
pub const WORKER_JOIN_TIMEOUT: Duration = Duration::from_secs(1);

/// A hook the embedder runs on each worker thread as it starts
/// ([`EngineConfig::on_worker_start`](super::EngineConfig::on_worker_start)).
pub(crate) type StartHook = Arc<dyn Fn() + Send + Sync>;

/// Runs the engine's blocking jobs on threads the embedder owns.
///
/// [`EngineConfig::executor`](super::EngineConfig::executor) replaces the
/// engine's own worker threads with it. `execute` should hand the job to
/// another thread and return: running it right there works, but blocks
/// the engine's thread (and every request of the queue) for the call.
/// Dropping a job instead of running it is allowed; the request then
/// finishes as cancelled. The engine's fds tell it when results are in, so
/// the executor needs no way back.
pub trait Executor: Send + Sync {
    /// Queues `job`; some thread calls [`Job::run`] later.
    fn execute(&self, job: Job);
}

const QUEUED: u8 = 0;
const RUNNING: u8 = 1;
const CANCELLED: u8 = 2;
const FINISHED: u8 = 3;

/// Identifies a job: the engine slot of its request and that slot's
/// generation (so a stale completion can never resume a reused slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct JobId {
    pub slot: usize,
    pub generation: u64,
}

/// A type-erased pointer to a closure living on a suspended coroutine's
/// stack.
pub(crate) struct JobFn(pub *mut (dyn FnMut() + Send + 'static));

// SAFETY: the closure behind the pointer is `Send`; the engine guarantees
// that the coroutine owning it stays suspended, and is neither resumed nor
// dropped, until the job is either cancelled before it started or has
// posted its completion, so the pointee is alive and accessed by exactly
// one thread at a time.
unsafe impl Send for JobFn {}

/// The claim word of one job, shared by the job and the engine.
#[derive(Debug)]
pub(crate) struct JobCell {
    state: AtomicU8,
}

impl JobCell {
    /// Cancels the job if no thread has started it. Returns true if it
    /// will never run.
    pub fn try_cancel(&self) -> bool {
        matches!(
            self.state
                .compare_exchange(QUEUED, CANCELLED, Ordering::AcqRel, Ordering::Acquire),
            Ok(_) | Err(CANCELLED)
        )
    }
}

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It ran; `true` if it panicked (the panic was caught).
    Ran(bool),
    /// The executor dropped it unrun.
    NotRun,
}

/// One finished job.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Done {
    pub id: JobId,
    pub outcome: Outcome,
}

/// Where jobs post their completions; shared by the engine and its jobs.
#[derive(Debug)]
pub(crate) struct Completions {
    done: Mutex<Vec<Done>>,
    wake: EventFd,
}

impl Completions {
    pub fn new(wake: EventFd) -> Completions {
        Completions {
            done: Mutex::new(Vec::new()),
            wake,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Done>> {
        self.done.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn post(&self, d: Done) {
        let mut done = self.lock();
        let first = done.is_empty();
        done.push(d);
        drop(done);
        if first {
            // A failed write only delays the wake-up to the next one; the
            // counter cannot overflow with one write per batch.
            let _ = self.wake.write(1);
        }
    }

    /// Takes the completions posted so far.
    pub fn take(&self, out: &mut Vec<Done>) {
        out.append(&mut self.lock());
    }
}

/// One blocking call of a request, to be run on a thread other than the
/// engine's. Run it with [`Job::run`] (exactly once) or drop it.
pub struct Job {
    id: JobId,
    func: JobFn,
    wait: bool,
    cell: Arc<JobCell>,
    done: Arc<Completions>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("id", &self.id)
            .field("may_wait", &self.wait)
            .finish()
    }
}

impl Job {
    pub(crate) fn new(id: JobId, func: JobFn, wait: bool, done: Arc<Completions>) -> Job {
        Job {
            id,
            func,
            wait,
            cell: Arc::new(JobCell {
                state: AtomicU8::new(QUEUED),
            }),
            done,
        }
    }

    pub(crate) fn cell(&self) -> Arc<JobCell> {
        Arc::clone(&self.cell)
    }

    /// Whether the call may wait a long time for someone else (a blocking
    /// Tlock attempt): keep such jobs apart from reads and writes so a pile
    /// of them cannot starve the rest.
    pub fn may_wait(&self) -> bool {
        self.wait
    }

    /// Runs the call on this thread (unless the engine cancelled it
    /// meanwhile) and posts its completion to the engine.
    pub fn run(self) {
        if self
            .cell
            .state
            .compare_exchange(QUEUED, RUNNING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // Cancelled while queued: the coroutine has moved on.
            return;
        }
        let func = self.func.0;
        // SAFETY: see `JobFn`: we won the claim, so the coroutine stays
        // suspended and its closure alive, and nobody else touches it until
        // the completion below is posted.
        let result = catch_unwind(AssertUnwindSafe(|| unsafe { (*func)() }));
        if result.is_err() {
            error!("virtio-9p: a filesystem call panicked on a worker thread");
        }
        self.cell.state.store(FINISHED, Ordering::Release);
        self.done.post(Done {
            id: self.id,
            outcome: Outcome::Ran(result.is_err()),
        });
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // Dropped unrun by an executor: the request finishes as cancelled.
        if self
            .cell
            .state
            .compare_exchange(QUEUED, CANCELLED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.done.post(Done {
                id: self.id,
                outcome: Outcome::NotRun,
            });
        }
    }
}

struct State {
    queue: VecDeque<Job>,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A fixed pool of worker threads (`--thread-pool-size`).
struct Workers {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts `n` workers named `name-i`, each running `hook` first.
    fn new(n: usize, name: &str, hook: Option<&StartHook>) -> io::Result<Workers> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                stop: false,
            }),
            work: Condvar::new(),
        });
        let mut workers = Workers {
            shared,
            threads: Vec::with_capacity(n),
        };
        // Each worker reports once it has started and run the hook, so
        // that a seccomp filter the embedder applies after this returns
        // meets no thread still starting (clone, set_robust_list, rseq,
        // prctl and sched_getaffinity are not serving calls).
        let (started, ready) = std::sync::mpsc::channel();
        for i in 0..n {
            let shared = Arc::clone(&workers.shared);
            let hook = hook.cloned();
            let started = started.clone();
            let t = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    if let Some(hook) = hook {
                        hook();
                    }
                    let _ = started.send(());
                    worker_loop(&shared)
                })?;
            workers.threads.push(t);
        }
        drop(started);
        if (0..n).any(|_| ready.recv().is_err()) {
            // A hook panicked: stop the others rather than leave them idle.
            workers.stop(Instant::now());
            return Err(io::Error::other("a worker thread died while starting"));
        }
        Ok(workers)
    }

    fn submit(&self, job: Job) {
        let mut st = self.shared.lock();
        st.queue.push_back(job);
        drop(st);
        self.shared.work.notify_one();
    }

    /// Stops the threads; returns how many did not exit by `deadline`
    /// (they are detached).
    fn stop(&mut self, deadline: Instant) -> usize {
        self.shared.lock().stop = true;
        self.shared.work.notify_all();
        let mut detached = 0;
        for t in self.threads.drain(..) {
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                // Stuck in a call that never returns: it keeps its own
                // reference to the pool state, and is never joined.
                detached += 1;
            }
        }
        detached
    }
}

fn worker_loop(shared: &Shared) {
    let mut st = shared.lock();
    loop {
        if let Some(job) = st.queue.pop_front() {
            drop(st);
            job.run();
            st = shared.lock();
            continue;
        }
        if st.stop {
            return;
        }
        st = shared.work.wait(st).unwrap_or_else(|e| e.into_inner());
    }
}

/// The engine's own executor: a pool for filesystem calls and a second one
/// for calls that may wait (blocking Tlock attempts).
pub(crate) struct ThreadPool {
    general: Workers,
    wait: Workers,
}

impl ThreadPool {
    /// `n` threads per pool (1 to [`MAX_WORKERS`]).
    pub fn new(n: usize, hook: Option<&StartHook>) -> io::Result<ThreadPool> {
        if n == 0 || n > MAX_WORKERS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("thread pool size {n} outside 1..={MAX_WORKERS}"),
            ));
        }
        Ok(ThreadPool {
            general: Workers::new(n, "9p-worker", hook)?,
            wait: Workers::new(n, "9p-lock-wait", hook)?,
        })
    }

    /// Stops both pools within `timeout`; returns the threads detached.
    pub fn shutdown(&mut self, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        self.general.stop(deadline) + self.wait.stop(deadline)
    }
}

impl Executor for ThreadPool {
    fn execute(&self, job: Job) {
        if job.may_wait() {
            self.wait.submit(job);
        } else {
            self.general.submit(job);
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let detached = self.shutdown(WORKER_JOIN_TIMEOUT);
        if detached > 0 {
            error!("virtio-9p: {detached} worker threads stuck in filesystem calls were detached");
        }
    }
}
