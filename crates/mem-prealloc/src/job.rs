//! The workers: spawning, the start gate, chunk distribution, progress,
//! cancellation and the background job handle.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::debug;

use crate::error::{Error, Result};
use crate::options::{thread_count, CancelToken, Method, PreallocOptions, ProgressFn};
use crate::sys::{self, MappingState};

/// Smallest chunk a worker claims at a time (rounded up to one page).
pub const MIN_CHUNK_BYTES: usize = 2 << 20;
/// Largest chunk a worker claims at a time: bounds how long cancellation
/// and progress wait (a few milliseconds of work).
pub const MAX_CHUNK_BYTES: usize = 32 << 20;

/// What a finished preallocation did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PreallocReport {
    /// Bytes faulted in (the whole region on success).
    pub bytes: u64,
    /// Worker threads used.
    pub threads: usize,
    /// The method used ([`Method::Auto`] resolved to a concrete one).
    pub method: Method,
    /// The page size used.
    pub page_size: usize,
    /// From the call to [`start`] until the last worker finished.
    pub elapsed: Duration,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The start barrier: workers check in (after pinning themselves) and wait
/// until the spawner opens the gate, so that thread creation, which takes
/// `mmap_lock` for writing to map the stacks, is over before any worker
/// starts faulting pages under the same lock.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Default)]
struct GateState {
    arrived: usize,
    failure: Option<Error>,
    open: Option<bool>,
}

impl Gate {
    /// Checks in and waits; returns whether to run.
    fn arrive(&self, failure: Option<Error>) -> bool {
        let mut st = lock(&self.state);
        st.arrived += 1;
        if st.failure.is_none() {
            st.failure = failure;
        }
        self.cv.notify_all();
        while st.open.is_none() {
            st = self.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        st.open == Some(true)
    }

    /// Waits for `n` workers; returns the first set-up failure.
    fn wait_for(&self, n: usize) -> Option<Error> {
        let mut st = lock(&self.state);
        while st.arrived < n {
            st = self.cv.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
        st.failure.take()
    }

    fn open(&self, run: bool) {
        lock(&self.state).open = Some(run);
        self.cv.notify_all();
    }
}

struct Progress {
    last: u64,
    callback: ProgressFn,
}

/// State shared by the workers of one job.
struct Shared {
    addr: usize,
    len: usize,
    page_size: usize,
    chunk: usize,
    method: Method,
    hugetlb: bool,
    next_chunk: AtomicUsize,
    done: AtomicU64,
    /// Set on the first error and by [`PreallocJob::cancel`].
    stop: AtomicBool,
    cancel: CancelToken,
    progress: Option<Mutex<Progress>>,
    failure: Mutex<Option<Error>>,
    gate: Gate,
}

impl Shared {
    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.cancel.is_cancelled()
    }

    fn fail(&self, err: Error) {
        let mut failure = lock(&self.failure);
        if failure.is_none() {
            *failure = Some(err);
        }
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Counts `bytes` as done and reports progress.
    fn advance(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let now = self.done.fetch_add(bytes as u64, Ordering::AcqRel) + bytes as u64;
        if let Some(progress) = &self.progress {
            // A poisoned lock means the callback panicked in another worker,
            // which fails the job; stop rather than call it again.
            let Ok(mut p) = progress.lock() else {
                self.stop.store(true, Ordering::Relaxed);
                return;
            };
            // Serialised and strictly increasing: a worker whose count was
            // overtaken while it waited for the lock skips its call.
            if now > p.last {
                p.last = now;
                (p.callback)(now);
            }
        }
    }

    /// Turns an errno for the page at `offset` into an [`Error`].
    fn classify(&self, call: &'static str, errno: i32, offset: usize) -> Error {
        let offset64 = offset as u64;
        let source = io::Error::from_raw_os_error(errno);
        match errno {
            libc::EINVAL => Error::UnsupportedMapping {
                offset: offset64,
                reason: if self.method == Method::PopulateWrite && !sys::kernel_has_populate_write()
                {
                    "the kernel has no MADV_POPULATE_WRITE; use Method::Auto or Method::Touch"
                } else {
                    "not writable, or an I/O or PFN mapping"
                },
                source,
            },
            libc::EFAULT | libc::ENOMEM | libc::EHWPOISON | libc::EPERM | libc::EACCES => {
                match sys::mapping_state(self.addr + offset) {
                    MappingState::Unmapped => Error::NotMapped {
                        offset: offset64,
                        source,
                    },
                    MappingState::ReadOnly => Error::UnsupportedMapping {
                        offset: offset64,
                        reason: "mapping is not writable",
                        source,
                    },
                    MappingState::Writable | MappingState::Unknown => match errno {
                        libc::EPERM | libc::EACCES => Error::UnsupportedMapping {
                            offset: offset64,
                            reason: "write access denied (sealed file?)",
                            source,
                        },
                        _ if self.hugetlb && errno != libc::EHWPOISON => {
                            Error::HugepagesExhausted {
                                offset: offset64,
                                source,
                            }
                        }
                        libc::ENOMEM => Error::OutOfMemory {
                            offset: offset64,
                            source,
                        },
                        _ => Error::Fault {
                            offset: offset64,
                            source,
                        },
                    },
                }
            }
            _ => Error::Os {
                call,
                offset: offset64,
                source,
            },
        }
    }

    /// `MADV_POPULATE_WRITE` on `[start, end)`; on failure, page by page to
    /// find the first page that fails.
    fn populate(&self, start: usize, end: usize) -> Result<()> {
        if sys::populate_write(self.addr + start, end - start).is_ok() {
            self.advance(end - start);
            return Ok(());
        }
        for offset in (start..end).step_by(self.page_size) {
            if let Err(errno) = sys::populate_write(self.addr + offset, self.page_size) {
                return Err(self.classify("madvise(MADV_POPULATE_WRITE)", errno, offset));
            }
            self.advance(self.page_size);
        }
        Ok(())
    }

    /// One kernel-side write fault per page of `[start, end)`.
    fn touch(&self, start: usize, end: usize) -> Result<()> {
        for offset in (start..end).step_by(self.page_size) {
            if let Err(errno) = sys::touch_page(self.addr + offset) {
                self.advance(offset - start);
                return Err(self.classify("futex(FUTEX_WAKE_OP)", errno, offset));
            }
        }
        self.advance(end - start);
        Ok(())
    }

    /// Claims chunks until the region is done, an error occurs or the job is
    /// cancelled.
    fn run(&self) {
        while !self.should_stop() {
            let index = self.next_chunk.fetch_add(1, Ordering::Relaxed);
            let start = index.saturating_mul(self.chunk);
            if start >= self.len {
                break;
            }
            let end = start.saturating_add(self.chunk).min(self.len);
            let result = match self.method {
                Method::Touch => self.touch(start, end),
                _ => self.populate(start, end),
            };
            if let Err(err) = result {
                self.fail(err);
                break;
            }
        }
    }
}

fn worker(shared: Arc<Shared>, cpu: Option<usize>) -> Instant {
    let pin_failure = cpu.and_then(|cpu| {
        sys::pin_current_thread(cpu)
            .err()
            .map(|source| Error::Affinity { cpu, source })
    });
    if shared.gate.arrive(pin_failure) {
        shared.run();
    }
    Instant::now()
}

/// The size of the chunks the workers claim: about eight per thread,
/// between [`MIN_CHUNK_BYTES`] and [`MAX_CHUNK_BYTES`], in whole pages.
fn chunk_size(len: usize, page_size: usize, threads: usize) -> usize {
    let target = (len / threads.max(1) / 8).clamp(MIN_CHUNK_BYTES, MAX_CHUNK_BYTES);
    (target / page_size * page_size).max(page_size)
}

fn resolve_method(method: Method) -> Method {
    match method {
        Method::Auto if sys::kernel_has_populate_write() => Method::PopulateWrite,
        Method::Auto => Method::Touch,
        other => other,
    }
}

/// A preallocation running in the background. [`join`](Self::join) waits for
/// it and returns its result; dropping the job cancels and joins it.
pub struct PreallocJob {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<Instant>>,
    started: Instant,
    threads: usize,
}

impl std::fmt::Debug for PreallocJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreallocJob")
            .field("addr", &format_args!("{:#x}", self.shared.addr))
            .field("len", &self.shared.len)
            .field("threads", &self.threads)
            .field("method", &self.shared.method)
            .field("done", &self.bytes_done())
            .finish()
    }
}

impl PreallocJob {
    /// Waits for the workers and returns the outcome. An error of a worker
    /// wins over a cancellation; a cancelled job that had already finished
    /// every page still succeeds.
    pub fn join(mut self) -> Result<PreallocReport> {
        self.wait()
    }

    fn wait(&mut self) -> Result<PreallocReport> {
        let mut last = self.started;
        let mut panicked = false;
        for handle in self.handles.drain(..) {
            match handle.join() {
                Ok(finished) => last = last.max(finished),
                Err(_) => panicked = true,
            }
        }
        if self.threads == 0 {
            last = Instant::now();
        }
        if panicked {
            return Err(Error::WorkerPanicked);
        }
        if let Some(err) = lock(&self.shared.failure).take() {
            return Err(err);
        }
        let done = self.shared.done.load(Ordering::Acquire);
        let total = self.shared.len as u64;
        if done < total {
            return Err(Error::Cancelled { done, total });
        }
        Ok(PreallocReport {
            bytes: done,
            threads: self.threads,
            method: self.shared.method,
            page_size: self.shared.page_size,
            elapsed: last.duration_since(self.started),
        })
    }

    /// Stops this job at the next chunk boundary; [`join`](Self::join) then
    /// returns [`Error::Cancelled`]. Other jobs sharing a [`CancelToken`] are
    /// not affected.
    pub fn cancel(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }

    /// Whether every worker has exited, so that [`join`](Self::join) will
    /// not block.
    pub fn is_finished(&self) -> bool {
        self.handles.iter().all(JoinHandle::is_finished)
    }

    /// Bytes faulted in so far.
    pub fn bytes_done(&self) -> u64 {
        self.shared.done.load(Ordering::Acquire)
    }

    /// Bytes in the region.
    pub fn total_bytes(&self) -> u64 {
        self.shared.len as u64
    }

    /// Worker threads of this job.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The method in use ([`Method::Auto`] already resolved).
    pub fn method(&self) -> Method {
        self.shared.method
    }
}

impl Drop for PreallocJob {
    fn drop(&mut self) {
        if !self.handles.is_empty() {
            self.cancel();
            for handle in self.handles.drain(..) {
                let _ = handle.join();
            }
        }
    }
}

/// Starts preallocating `[addr, addr + len)` in the background and returns
/// once every worker is running (pinned, if asked).
///
/// `addr` and `len` must be multiples of the page size in force. The range is
/// normally a shared or private writable mapping owned by the caller. This
/// function is safe: the kernel never changes a byte of the range, and a range
/// that is unmapped, read-only or unmapped while the job runs yields an error,
/// never a signal (see the crate docs).
pub fn start(addr: *mut u8, len: usize, options: &PreallocOptions) -> Result<PreallocJob> {
    let started = Instant::now();
    options.validate()?;
    let page_size = options.effective_page_size();
    let base = addr as usize;
    if (len > 0 && base == 0) || base.checked_add(len).is_none() {
        return Err(Error::InvalidRange {
            addr: base as u64,
            len: len as u64,
        });
    }
    if base % page_size != 0 {
        return Err(Error::Misaligned {
            what: "address",
            value: base as u64,
            page_size,
        });
    }
    if len % page_size != 0 {
        return Err(Error::Misaligned {
            what: "length",
            value: len as u64,
            page_size,
        });
    }

    let method = resolve_method(options.method);
    let threads = if len == 0 {
        0
    } else {
        thread_count(
            len,
            page_size,
            options.available_cpus(),
            options.threads,
            options.max_threads,
        )
    };
    let chunk = chunk_size(len, page_size, threads);
    debug!(
        "preallocating {len:#x} bytes at {base:#x}: {threads} threads, {method}, \
         page size {page_size:#x}, chunk {chunk:#x}"
    );
    let shared = Arc::new(Shared {
        addr: base,
        len,
        page_size,
        chunk,
        method,
        hugetlb: page_size > sys::base_page_size(),
        next_chunk: AtomicUsize::new(0),
        done: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        cancel: options.cancel.clone().unwrap_or_default(),
        progress: options
            .progress
            .clone()
            .map(|callback| Mutex::new(Progress { last: 0, callback })),
        failure: Mutex::new(None),
        gate: Gate::default(),
    });

    let mut handles = Vec::with_capacity(threads);
    for i in 0..threads {
        let cpu = (!options.cpus.is_empty()).then(|| options.cpus[i % options.cpus.len()]);
        let worker_shared = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name(format!("prealloc-{i}"))
            .spawn(move || worker(worker_shared, cpu));
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(err) => {
                shared.gate.open(false);
                for handle in handles {
                    let _ = handle.join();
                }
                return Err(Error::Spawn(err));
            }
        }
    }
    if let Some(err) = shared.gate.wait_for(threads) {
        shared.gate.open(false);
        for handle in handles {
            let _ = handle.join();
        }
        return Err(err);
    }
    shared.gate.open(true);
    Ok(PreallocJob {
        shared,
        handles,
        started,
        threads,
    })
}

/// Preallocates `[addr, addr + len)` and waits for the result:
/// `start(addr, len, options)?.join()`. See [`start`].
pub fn preallocate(addr: *mut u8, len: usize, options: &PreallocOptions) -> Result<PreallocReport> {
    start(addr, len, options)?.join()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_chunk_size_bounds() {
        let page = 4096;
        assert_eq!(chunk_size(4096, page, 1), MIN_CHUNK_BYTES);
        assert_eq!(chunk_size(4 << 30, page, 2), MAX_CHUNK_BYTES);
        assert_eq!(chunk_size(256 << 20, page, 2), 16 << 20);
        // Gigantic pages: one page per chunk.
        assert_eq!(chunk_size(4 << 30, 1 << 30, 2), 1 << 30);
    }

    #[test]
    fn test_auto_resolves_to_a_concrete_method() {
        assert_ne!(resolve_method(Method::Auto), Method::Auto);
        assert_eq!(resolve_method(Method::Touch), Method::Touch);
    }
}
