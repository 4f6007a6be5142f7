//! The worker threads that run blocking filesystem calls for coroutines.
//!
//! A coroutine that must block hands a job to the pool and yields; a worker
//! runs the job and posts the request's slot to the completion list, then
//! wakes the engine's thread through an eventfd (one write per batch: only
//! when the list was empty).

use std::collections::VecDeque;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use log::error;
use vmm_sys_util::eventfd::EventFd;

/// Most worker threads a pool may have.
pub const MAX_WORKERS: usize = 1024;

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
// dropped, until the worker has posted the job's completion, so the pointee
// is alive and accessed by exactly one thread at a time.
unsafe impl Send for JobFn {}

pub(crate) struct Job {
    pub id: JobId,
    pub func: JobFn,
}

/// One finished job.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Done {
    pub id: JobId,
    /// The job panicked (the panic was caught on the worker).
    pub panicked: bool,
}

struct State {
    queue: VecDeque<Job>,
    done: Vec<Done>,
    running: usize,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    idle: Condvar,
    wake: EventFd,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A fixed pool of worker threads (`--thread-pool-size`).
pub(crate) struct Workers {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts `n` workers (1 to [`MAX_WORKERS`]) named `name-i`; they
    /// write `wake` when completions are waiting.
    pub fn new(n: usize, name: &str, wake: EventFd) -> io::Result<Workers> {
        if n == 0 || n > MAX_WORKERS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("thread pool size {n} outside 1..={MAX_WORKERS}"),
            ));
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                done: Vec::new(),
                running: 0,
                stop: false,
            }),
            work: Condvar::new(),
            idle: Condvar::new(),
            wake,
        });
        let mut workers = Workers {
            shared,
            threads: Vec::with_capacity(n),
        };
        for i in 0..n {
            let shared = Arc::clone(&workers.shared);
            let t = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    // Narrow this thread's seccomp filter (a no-op unless
                    // the binary's sandbox installed one).
                    crate::sandbox::seccomp::enter_thread(
                        crate::sandbox::seccomp::ThreadKind::Worker,
                    );
                    worker_loop(&shared)
                })?;
            workers.threads.push(t);
        }
        Ok(workers)
    }

    /// Queues a job.
    pub fn submit(&self, job: Job) {
        let mut st = self.shared.lock();
        st.queue.push_back(job);
        drop(st);
        self.shared.work.notify_one();
    }

    /// Removes a job that no worker has started yet. Returns false when a
    /// worker already runs it (or it has finished).
    pub fn cancel(&self, id: JobId) -> bool {
        let mut st = self.shared.lock();
        if let Some(pos) = st.queue.iter().position(|j| j.id == id) {
            st.queue.remove(pos);
            return true;
        }
        false
    }

    /// Takes the completions posted so far. Read the wake eventfd first.
    pub fn take_done(&self, out: &mut Vec<Done>) {
        let mut st = self.shared.lock();
        out.append(&mut st.done);
    }

    /// Waits until no job is queued or running, or `timeout` passes.
    /// Returns true when idle.
    pub fn wait_idle(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut st = self.shared.lock();
        while !st.queue.is_empty() || st.running > 0 {
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            st = self
                .shared
                .idle
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.work.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn worker_loop(shared: &Shared) {
    let mut st = shared.lock();
    loop {
        if let Some(job) = st.queue.pop_front() {
            st.running += 1;
            drop(st);
            let func = job.func.0;
            // SAFETY: see `JobFn`: the closure is alive and nobody else
            // touches it until the completion below is posted.
            let result = catch_unwind(AssertUnwindSafe(|| unsafe { (*func)() }));
            if result.is_err() {
                error!("virtio-9p: a filesystem call panicked on a worker thread");
            }
            st = shared.lock();
            st.running -= 1;
            let first = st.done.is_empty();
            st.done.push(Done {
                id: job.id,
                panicked: result.is_err(),
            });
            if st.queue.is_empty() && st.running == 0 {
                shared.idle.notify_all();
            }
            if first {
                // A failed write only delays the wake-up to the next one;
                // the counter cannot overflow with one write per batch.
                let _ = shared.wake.write(1);
            }
            continue;
        }
        if st.stop {
            return;
        }
        st = shared.work.wait(st).unwrap_or_else(|e| e.into_inner());
    }
}
