// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The workers: spawning, the start gate, chunk distribution over one or
//! several regions, the per-mapping touch fallback, progress, cancellation
//! and the background job handles.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{debug, info};

use crate::error::{Error, Result};
use crate::options::{thread_count, CancelToken, Method, PreallocOptions, ProgressFn};
use crate::sys::{self, MappingState};

/// One region of a multi-region job ([`start_regions`]): a range and,
/// optionally, its own page size (otherwise the options' page size is used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    addr: usize,
    len: usize,
    page_size: Option<usize>,
}

impl Region {
    /// `[addr, addr + len)`.
    ///
    /// # Safety
    ///
    /// `[addr, addr + len)` must be memory of this process that may be
    /// faulted in and written with its own contents (private or shared
    /// writable RAM the caller owns), for as long as a job over the region
    /// runs: until it is joined or dropped. Within that time the range must
    /// not be unmapped and its addresses reused by a mapping that must not
    /// be touched (another owner's buffer, device memory mapped with
    /// `MAP_FIXED`): the workers would fault that mapping in. A range that
    /// is only unmapped, or read-only, makes the job fail with an error.
    pub unsafe fn new(addr: *mut u8, len: usize) -> Self {
        Region {
            addr: addr as usize,
            len,
            page_size: None,
        }
    }

    /// The page size of this region's mapping (the hugepage size on
    /// hugetlbfs); see [`PreallocOptions::page_size`].
    pub fn page_size(mut self, page_size: usize) -> Self {
        self.page_size = Some(page_size);
        self
    }
}

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
    /// [`Method::Touch`] when `MADV_POPULATE_WRITE` was refused with
    /// `EINVAL` on (part of) this mapping and the job fell back to touching.
    pub method: Method,
    /// The page size used.
    pub page_size: usize,
    /// From the call to [`start`] until the last page of this region was
    /// resident.
    pub elapsed: Duration,
    /// Bytes at the end of the range that were left out because the length
    /// was not a whole number of pages and
    /// [`PreallocOptions::round_down_length`] was set; 0 otherwise.
    pub tail: u64,
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

/// The state of one region of a job.
struct RegionState {
    addr: usize,
    len: usize,
    page_size: usize,
    chunk: usize,
    /// The resolved method the job started with.
    method: Method,
    /// `Method::Auto` was asked for: `EINVAL` from `MADV_POPULATE_WRITE`
    /// may switch the region to touching.
    may_fall_back: bool,
    /// Set once the region fell back to touching.
    touching: AtomicBool,
    hugetlb: bool,
    tail: u64,
    next_chunk: AtomicUsize,
    done: AtomicU64,
    /// Set on the first error in this region; the other regions go on.
    stop: AtomicBool,
    failure: Mutex<Option<Error>>,
    finished: Mutex<Option<Instant>>,
}

impl RegionState {
    fn fail(&self, err: Error) {
        let mut failure = lock(&self.failure);
        if failure.is_none() {
            *failure = Some(err);
        }
        self.stop.store(true, Ordering::Relaxed);
    }

    fn method_in_use(&self) -> Method {
        if self.touching.load(Ordering::Relaxed) {
            Method::Touch
        } else {
            self.method
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
                } else if self.may_fall_back {
                    "not writable, or an I/O mapping (VM_IO) that touching could disturb"
                } else {
                    "not writable, or an I/O or PFN mapping (Method::Auto would touch a \
                     writable non-I/O one)"
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
}

/// State shared by the workers of one job.
struct Shared {
    regions: Vec<RegionState>,
    /// Round-robin ticket: which region a worker tries first for its next
    /// chunk, so that chunks of all regions are interleaved.
    ticket: AtomicUsize,
    /// Bytes done over all regions (what progress reports).
    total_done: AtomicU64,
    /// Set by [`PreallocJobs::cancel`] and when the progress callback panics.
    stop: AtomicBool,
    cancel: CancelToken,
    progress: Option<Mutex<Progress>>,
    gate: Gate,
}

impl Shared {
    fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.cancel.is_cancelled()
    }

    /// Counts `bytes` of `region` as done and reports progress.
    fn advance(&self, region: &RegionState, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let mine = region.done.fetch_add(bytes as u64, Ordering::AcqRel) + bytes as u64;
        if mine == region.len as u64 {
            *lock(&region.finished) = Some(Instant::now());
        }
        let now = self.total_done.fetch_add(bytes as u64, Ordering::AcqRel) + bytes as u64;
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

    /// `MADV_POPULATE_WRITE` on `[start, end)` of `region`; on `EINVAL` the
    /// touch fallback where it is correct, on other failures page by page to
    /// find the first page that fails. Huge pages go one at a time, from
    /// their end ([`populate_huge`](Self::populate_huge)).
    fn populate(&self, region: &RegionState, start: usize, end: usize) -> Result<()> {
        if region.page_size > sys::base_page_size() {
            return self.populate_huge(region, start, end);
        }
        let errno = match sys::populate_write(region.addr + start, end - start) {
            Ok(()) => {
                self.advance(region, end - start);
                return Ok(());
            }
            Err(errno) => errno,
        };
        if self.falls_back(region, start, errno) {
            return self.touch(region, start, end);
        }
        for offset in (start..end).step_by(region.page_size) {
            if let Err(errno) = sys::populate_write(region.addr + offset, region.page_size) {
                return Err(region.classify("madvise(MADV_POPULATE_WRITE)", errno, offset));
            }
            self.advance(region, region.page_size);
        }
        Ok(())
    }

    /// `MADV_POPULATE_WRITE` on the huge pages of `[start, end)`, each
    /// faulted first at its last base page, then over its whole length.
    ///
    /// The kernel clears a huge page towards the faulting address
    /// (`process_huge_page` in mm/memory.c): faulted at its first byte, as
    /// one `madvise` over the range does, it clears the 4 KiB subpages in
    /// descending order; faulted at its last subpage, in ascending order.
    /// On the machine of the benchmarks the descending clear took 2.5
    /// times the CPU of the ascending one (`clear_page_erms` was 91 % of
    /// the profile either way), which is the whole gap between the fault
    /// path and zeroing resident memory (docs/mem-prealloc-design.md). The
    /// second call finds the page present and costs little; it also keeps
    /// every base page populated should the mapping not be huge after all.
    fn populate_huge(&self, region: &RegionState, start: usize, end: usize) -> Result<()> {
        let base = sys::base_page_size();
        let mut done = 0;
        for offset in (start..end).step_by(region.page_size) {
            let addr = region.addr + offset;
            let len = region.page_size.min(end - offset);
            let res = sys::populate_write(addr + len - base, base)
                .and_then(|()| sys::populate_write(addr, len));
            if let Err(errno) = res {
                self.advance(region, done);
                if self.falls_back(region, offset, errno) {
                    return self.touch(region, offset, end);
                }
                return Err(region.classify("madvise(MADV_POPULATE_WRITE)", errno, offset));
            }
            done += len;
        }
        self.advance(region, done);
        Ok(())
    }

    /// Whether `errno` from `MADV_POPULATE_WRITE` at `offset` of `region`
    /// switches it to touching: `EINVAL` on a kernel that has the advice,
    /// under `Method::Auto`, where touching is correct.
    fn falls_back(&self, region: &RegionState, offset: usize, errno: i32) -> bool {
        if errno == libc::EINVAL
            && region.may_fall_back
            && sys::kernel_has_populate_write()
            && sys::touch_is_correct(region.addr + offset)
        {
            if !region.touching.swap(true, Ordering::Relaxed) {
                info!(
                    "MADV_POPULATE_WRITE refused (EINVAL) at {:#x}: a writable mapping \
                     without VM_IO, falling back to touching",
                    region.addr + offset
                );
            }
            return true;
        }
        false
    }

    /// One kernel-side write fault per page of `[start, end)` of `region`.
    /// Each page is touched at its last 4-byte word, so that a huge page
    /// is cleared in ascending order (see [`populate_huge`](Self::populate_huge)).
    fn touch(&self, region: &RegionState, start: usize, end: usize) -> Result<()> {
        for offset in (start..end).step_by(region.page_size) {
            let last_word = region.page_size.min(end - offset) - 4;
            if let Err(errno) = sys::touch_page(region.addr + offset + last_word) {
                self.advance(region, offset - start);
                return Err(region.classify("futex(FUTEX_WAKE_OP)", errno, offset));
            }
        }
        self.advance(region, end - start);
        Ok(())
    }

    /// The next chunk to do: the regions are tried round-robin from a shared
    /// ticket, skipping finished and failed ones.
    fn claim(&self) -> Option<(&RegionState, usize, usize)> {
        let n = self.regions.len();
        let first = self.ticket.fetch_add(1, Ordering::Relaxed);
        for k in 0..n {
            let region = &self.regions[(first.wrapping_add(k)) % n];
            if region.stop.load(Ordering::Relaxed)
                || region
                    .next_chunk
                    .load(Ordering::Relaxed)
                    .saturating_mul(region.chunk)
                    >= region.len
            {
                continue;
            }
            let index = region.next_chunk.fetch_add(1, Ordering::Relaxed);
            let start = index.saturating_mul(region.chunk);
            if start < region.len {
                return Some((
                    region,
                    start,
                    start.saturating_add(region.chunk).min(region.len),
                ));
            }
        }
        None
    }

    /// Claims chunks until every region is done or failed, or the job is
    /// cancelled.
    fn run(&self) {
        while !self.should_stop() {
            let Some((region, start, end)) = self.claim() else {
                break;
            };
            let result = match region.method_in_use() {
                Method::Touch => self.touch(region, start, end),
                _ => self.populate(region, start, end),
            };
            if let Err(err) = result {
                region.fail(err);
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

/// Preallocation of several regions running in the background with one pool
/// of workers ([`start_regions`]). [`join`](Self::join) returns one result
/// per region; dropping the job cancels and joins it.
pub struct PreallocJobs {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<Instant>>,
    started: Instant,
    threads: usize,
}

impl std::fmt::Debug for PreallocJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreallocJobs")
            .field("regions", &self.shared.regions.len())
            .field("threads", &self.threads)
            .field("done", &self.bytes_done())
            .field("total", &self.total_bytes())
            .finish()
    }
}

impl PreallocJobs {
    /// Waits for the workers and returns one outcome per region, in the
    /// order the regions were given. A failed region does not stop the
    /// others. An error wins over a cancellation; a region that was complete
    /// when the job was cancelled still succeeds.
    pub fn join(mut self) -> Vec<Result<PreallocReport>> {
        self.wait()
    }

    fn wait(&mut self) -> Vec<Result<PreallocReport>> {
        let mut panicked = false;
        for handle in self.handles.drain(..) {
            panicked |= handle.join().is_err();
        }
        self.shared
            .regions
            .iter()
            .map(|region| {
                if panicked {
                    return Err(Error::WorkerPanicked);
                }
                if let Some(err) = lock(&region.failure).take() {
                    return Err(err);
                }
                let done = region.done.load(Ordering::Acquire);
                let total = region.len as u64;
                if done < total {
                    return Err(Error::Cancelled { done, total });
                }
                let finished = lock(&region.finished).unwrap_or(self.started);
                Ok(PreallocReport {
                    bytes: done,
                    threads: self.threads,
                    method: region.method_in_use(),
                    page_size: region.page_size,
                    elapsed: finished.max(self.started).duration_since(self.started),
                    tail: region.tail,
                })
            })
            .collect()
    }

    /// Stops every region at the next chunk boundary; unfinished regions
    /// then return [`Error::Cancelled`]. Other jobs sharing a
    /// [`CancelToken`] are not affected.
    pub fn cancel(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }

    /// Whether every worker has exited, so that [`join`](Self::join) will
    /// not block.
    pub fn is_finished(&self) -> bool {
        self.handles.iter().all(JoinHandle::is_finished)
    }

    /// Bytes faulted in so far, over all regions.
    pub fn bytes_done(&self) -> u64 {
        self.shared.total_done.load(Ordering::Acquire)
    }

    /// Bytes in all regions (without rounded-down tails).
    pub fn total_bytes(&self) -> u64 {
        self.shared.regions.iter().map(|r| r.len as u64).sum()
    }

    /// Worker threads of this job (shared by all regions).
    pub fn threads(&self) -> usize {
        self.threads
    }
}

impl Drop for PreallocJobs {
    fn drop(&mut self) {
        if !self.handles.is_empty() {
            self.cancel();
            for handle in self.handles.drain(..) {
                let _ = handle.join();
            }
        }
    }
}

/// A preallocation of one region running in the background
/// ([`start`]). [`join`](Self::join) waits for it and returns its result;
/// dropping the job cancels and joins it.
pub struct PreallocJob(PreallocJobs);

impl std::fmt::Debug for PreallocJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let region = &self.0.shared.regions[0];
        f.debug_struct("PreallocJob")
            .field("addr", &format_args!("{:#x}", region.addr))
            .field("len", &region.len)
            .field("threads", &self.0.threads)
            .field("method", &region.method_in_use())
            .field("done", &self.bytes_done())
            .finish()
    }
}

impl PreallocJob {
    /// Waits for the workers and returns the outcome. An error of a worker
    /// wins over a cancellation; a cancelled job that had already finished
    /// every page still succeeds.
    pub fn join(self) -> Result<PreallocReport> {
        self.0.join().pop().unwrap_or(Err(Error::WorkerPanicked))
    }

    /// Stops this job at the next chunk boundary; [`join`](Self::join) then
    /// returns [`Error::Cancelled`]. Other jobs sharing a [`CancelToken`] are
    /// not affected.
    pub fn cancel(&self) {
        self.0.cancel();
    }

    /// Whether every worker has exited, so that [`join`](Self::join) will
    /// not block.
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }

    /// Bytes faulted in so far.
    pub fn bytes_done(&self) -> u64 {
        self.0.bytes_done()
    }

    /// Bytes in the region.
    pub fn total_bytes(&self) -> u64 {
        self.0.total_bytes()
    }

    /// Worker threads of this job.
    pub fn threads(&self) -> usize {
        self.0.threads
    }

    /// The method in use ([`Method::Auto`] already resolved; `Touch` once
    /// the job fell back to touching).
    pub fn method(&self) -> Method {
        self.0.shared.regions[0].method_in_use()
    }
}

/// Checks one region against the options and builds its state.
fn region_state(
    region: &Region,
    options: &PreallocOptions,
    method: Method,
    threads_hint: usize,
) -> Result<RegionState> {
    let page_size = region
        .page_size
        .unwrap_or_else(|| options.effective_page_size());
    if region.page_size.is_some()
        && (!page_size.is_power_of_two() || page_size < sys::base_page_size())
    {
        return Err(Error::InvalidOption(format!(
            "page size {page_size:#x} is not a power of two of at least {:#x}",
            sys::base_page_size()
        )));
    }
    let base = region.addr;
    let mut len = region.len;
    if (len > 0 && base == 0) || base.checked_add(len).is_none() {
        return Err(Error::InvalidRange {
            addr: base as u64,
            len: len as u64,
        });
    }
    if !base.is_multiple_of(page_size) {
        return Err(Error::Misaligned {
            what: "address",
            value: base as u64,
            page_size,
        });
    }
    let tail = len % page_size;
    if tail != 0 {
        if !options.round_down {
            return Err(Error::Misaligned {
                what: "length",
                value: len as u64,
                page_size,
            });
        }
        len -= tail;
    }
    let chunk = chunk_size(len, page_size, threads_hint);
    Ok(RegionState {
        addr: base,
        len,
        page_size,
        chunk,
        method,
        may_fall_back: options.method == Method::Auto && method == Method::PopulateWrite,
        touching: AtomicBool::new(false),
        hugetlb: page_size > sys::base_page_size(),
        tail: tail as u64,
        next_chunk: AtomicUsize::new(0),
        done: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        failure: Mutex::new(None),
        finished: Mutex::new(None),
    })
}

/// Starts preallocating several regions at once with one pool of workers and
/// returns once every worker is running (pinned, if asked).
///
/// The thread budget of `options` is spread over all the regions: the thread
/// count is [`thread_count`] of their total size, and the workers take
/// chunks from the regions in turn, so the regions fill up side by side and
/// the job takes about the time of their sum divided by the threads, not the
/// sum of one job per region. Each region gets its own result; an error in
/// one (say, the hugetlbfs pool running out) ends that region only.
///
/// Every region is checked (alignment, range) and, with
/// [`PreallocOptions::numa`], bound to its nodes before any page is touched;
/// any failure there returns `Err` with nothing populated.
pub fn start_regions(regions: &[Region], options: &PreallocOptions) -> Result<PreallocJobs> {
    let started = Instant::now();
    options.validate()?;
    let method = resolve_method(options.method);
    let cpus = options.worker_cpus()?;
    let available = options.available_cpus_of(&cpus);
    // The chunk size depends on the thread count and vice versa; size the
    // chunks for the thread count of the whole job.
    let total: usize = regions.iter().map(|r| r.len).fold(0, usize::saturating_add);
    let min_page = regions
        .iter()
        .map(|r| r.page_size.unwrap_or_else(|| options.effective_page_size()))
        .min()
        .unwrap_or_else(|| options.effective_page_size());
    let budget = thread_count(
        total,
        min_page,
        available,
        options.threads,
        options.max_threads,
    );
    let states = regions
        .iter()
        .map(|region| region_state(region, options, method, budget))
        .collect::<Result<Vec<_>>>()?;
    if let Some(numa) = &options.numa {
        for state in states.iter().filter(|s| s.len > 0) {
            sys::mbind(state.addr, state.len, numa.mode(), &numa.nodes).map_err(|source| {
                Error::NumaBind {
                    addr: state.addr as u64,
                    len: state.len as u64,
                    source,
                }
            })?;
        }
    }
    let total: usize = states.iter().map(|s| s.len).sum();
    let threads = if total == 0 { 0 } else { budget };
    debug!(
        "preallocating {} regions, {total:#x} bytes: {threads} threads, {method}, cpus {cpus:?}",
        states.len()
    );
    let shared = Arc::new(Shared {
        regions: states,
        ticket: AtomicUsize::new(0),
        total_done: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        cancel: options.cancel.clone().unwrap_or_default(),
        progress: options
            .progress
            .clone()
            .map(|callback| Mutex::new(Progress { last: 0, callback })),
        gate: Gate::default(),
    });

    let mut handles = Vec::with_capacity(threads);
    for i in 0..threads {
        let cpu = (!cpus.is_empty()).then(|| cpus[i % cpus.len()]);
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
    Ok(PreallocJobs {
        shared,
        handles,
        started,
        threads,
    })
}

/// Preallocates several regions at once and waits: one result per region.
/// See [`start_regions`].
pub fn preallocate_regions(
    regions: &[Region],
    options: &PreallocOptions,
) -> Result<Vec<Result<PreallocReport>>> {
    Ok(start_regions(regions, options)?.join())
}

/// Starts preallocating `[addr, addr + len)` in the background and returns
/// once every worker is running (pinned, if asked).
///
/// `addr` and `len` must be multiples of the page size in force (see
/// [`PreallocOptions::round_down_length`] for a length that is not). The
/// range is normally a shared or private writable mapping owned by the
/// caller. This function is safe: the kernel never changes a byte of the
/// range, and a range that is unmapped, read-only or unmapped while the job
/// runs yields an error, never a signal (see the crate docs).
///
/// # Safety
///
/// `[addr, addr + len)` must be memory of this process that may be
/// faulted in and written with its own contents (private or shared
/// writable RAM the caller owns) until the job is joined or dropped.
/// Within that time the range must not be unmapped and its addresses
/// reused by a mapping that must not be touched (another owner's buffer,
/// device memory mapped with `MAP_FIXED`): the workers would fault that
/// mapping in. A range that is only unmapped, or read-only, makes the job
/// fail with an error. For vm-memory regions, the safe
/// [`preallocate_region`](crate::guest_memory::preallocate_region) and
/// [`preallocate_guest_memory`](crate::guest_memory::preallocate_guest_memory) hold the
/// borrow until the job ends.
pub unsafe fn start(addr: *mut u8, len: usize, options: &PreallocOptions) -> Result<PreallocJob> {
    // SAFETY: the caller's contract covers the job's whole life.
    let region = unsafe { Region::new(addr, len) };
    start_regions(&[region], options).map(PreallocJob)
}

/// Preallocates `[addr, addr + len)` and waits for the result:
/// `start(addr, len, options)?.join()`. See [`start`].
///
/// # Safety
///
/// As for [`start`], until this call returns.
pub unsafe fn preallocate(
    addr: *mut u8,
    len: usize,
    options: &PreallocOptions,
) -> Result<PreallocReport> {
    // SAFETY: the caller's contract; the job is joined before returning.
    unsafe { start(addr, len, options) }?.join()
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
