// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The stack pool: per-thread local pools of at most two batches, a global
//! pool of batches behind one lock, demand reservations, the mapping budget,
//! trimming and statistics.

use std::cell::{Cell, RefCell, UnsafeCell};
use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::budget::{BudgetStats, MapBudget, ProcessBudget};
use crate::config::{
    GuardMode, IdlePages, Policy, PoolConfig, MAX_BATCH_SIZE, MAX_GUARD_PAGES, MAX_STACK_SIZE,
};
use crate::stack::{self, GuardKind, GuardOutcome, Layout, StackList};
use crate::{Error, Result};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // No code panics while holding these locks; recover the data if a
    // foreign panic ever poisons one.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counters of one thread's local pool, and its batch capacity. Only the
/// owning thread writes the counters (a relaxed load and a relaxed store,
/// no read-modify-write, so no locked instruction); `stats()` reads them
/// from any thread and derives the rest. Aligned to its own cache lines so
/// that two threads' counters never share one (the allocations of two
/// threads could otherwise be neighbours).
#[derive(Debug, Default)]
#[repr(align(128))]
struct ThreadStats {
    /// Stacks the thread has taken (reused or newly mapped).
    takes: AtomicU64,
    /// Stacks the thread has given back (pooled or freed).
    puts: AtomicU64,
    /// Stacks the current batch may hold before a put takes the slow path:
    /// the batch size, unlimited for `Policy::UnboundedPerThread`, 0 for
    /// `Policy::NoPool` and once the pool is closed (set by
    /// [`Shared::close`] from the dropping thread). It sits next to `puts`
    /// so that a put reads a single line of per-thread data besides the
    /// list head.
    cap: AtomicUsize,
}

impl ThreadStats {
    /// Adds one to a counter only the calling (owning) thread writes.
    #[inline(always)]
    fn bump(counter: &AtomicU64) {
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// How many of the most recently returned global batches a refill looks
/// through for one its own thread returned (see [`Shared::take_global_batch`]).
const AFFINITY_SCAN: usize = 4;

/// A batch in the global pool, tagged with the local pool that returned it.
#[derive(Debug)]
struct GlobalBatch {
    stacks: StackList,
    /// Address of the returning thread's `ThreadStats` (0 for none); only
    /// compared, never dereferenced.
    owner: usize,
}

/// The global pool: batches of idle stacks. New batches go to the back;
/// refills take from the back (the warmest), trims free from the front.
#[derive(Debug, Default)]
struct Global {
    batches: VecDeque<GlobalBatch>,
    size: usize,
}

/// The counters and locks of a pool that change while it runs, kept on
/// cache lines of their own: the configuration read on every get/put (in
/// [`Shared`]) never shares a line with them, so batch moves and stack
/// creation on one thread do not slow down other threads' fast paths.
#[repr(align(128))]
struct Hot {
    global: Mutex<Global>,
    global_len: AtomicUsize,
    reserved: AtomicUsize,
    held: AtomicUsize,
    created: AtomicU64,
    freed: AtomicU64,
    unmap_failures: AtomicU64,
    retired_takes: AtomicU64,
    retired_puts: AtomicU64,
    /// High-water mark of stacks outside the global pool (in use or in
    /// local pools) since the last trim; raised where that number grows.
    peak_outside: AtomicUsize,
    /// VMAs this pool has charged to its budget for the stacks it holds.
    vmas: AtomicU64,
    /// Trim passes run (explicit and by the trimmer thread).
    trims: AtomicU64,
    threads: Mutex<Vec<Arc<ThreadStats>>>,
}

/// State shared by every handle, thread-local pool and stack of one pool.
pub(crate) struct Shared {
    layout: Layout,
    policy: Policy,
    batch_size: usize,
    base_max: usize,
    idle_pages: IdlePages,
    budget: Arc<ProcessBudget>,
    share: Option<usize>,
    /// Whether this pool's stacks are charged exactly (`mprotect` guards
    /// from the start) or as an upper bound (guard install, which may
    /// merge and may fall back later).
    exact: bool,
    guard: AtomicU8,
    closed: AtomicBool,
    hot: Hot,
}

impl Shared {
    fn guard_kind(&self) -> GuardKind {
        GuardKind::from_u8(self.guard.load(Ordering::Relaxed))
    }

    fn budget(&self) -> MapBudget {
        let (max_map_count, origin) = self.budget.max_map_count();
        let vmas_per_stack = self.guard_kind().vmas_per_stack();
        let limit_vmas = self.budget.limit_vmas();
        let stacks = usize::try_from(limit_vmas / vmas_per_stack as u64).unwrap_or(usize::MAX);
        MapBudget {
            max_map_count,
            origin,
            reserved_vmas: self.budget.reserved_vmas(),
            vmas_per_stack,
            max_stacks: self.share.map_or(stacks, |share| share.min(stacks)),
            limit_vmas,
            share: self.share,
        }
    }

    /// The error for a refused stack, with the figures of this moment.
    fn exhausted(&self, held: usize) -> Error {
        let budget = self.budget();
        let stats = self.budget.stats();
        let left = budget.limit_vmas.saturating_sub(stats.pool_vmas) / budget.vmas_per_stack as u64;
        let room = held.saturating_add(usize::try_from(left).unwrap_or(usize::MAX));
        Error::BudgetExhausted {
            held,
            max_stacks: self.share.map_or(room, |share| share.min(room)),
            pool_vmas: stats.pool_vmas,
            limit_vmas: budget.limit_vmas,
            foreign_vmas: stats.foreign_vmas,
            vmas_per_stack: budget.vmas_per_stack,
            max_map_count: budget.max_map_count,
            reserved_vmas: budget.reserved_vmas,
        }
    }

    fn max_pooled(&self) -> usize {
        match self.policy {
            Policy::Bounded => {
                let demand = self
                    .base_max
                    .saturating_add(self.hot.reserved.load(Ordering::Relaxed));
                demand.min(self.budget().max_stacks)
            }
            #[cfg(feature = "bench-policies")]
            Policy::UnboundedPerThread => usize::MAX,
            #[cfg(feature = "bench-policies")]
            Policy::NoPool => 0,
        }
    }

    /// Maps a new stack, within the pool's share and the process-wide
    /// budget (shared with every other pool of the budget). Under
    /// `Policy::UnboundedPerThread` the stack is charged but never
    /// refused: the kernel's limit is what stops that policy.
    fn create(&self) -> Result<NonNull<u8>> {
        let enforce = !self.policy.is_unbounded_per_thread();
        let held = self.hot.held.fetch_add(1, Ordering::Relaxed);
        let kind = self.guard_kind();
        let vmas = kind.vmas_per_stack() as u64;
        let within_share = !enforce || self.share.is_none_or(|share| held < share);
        if !within_share || !self.budget.charge(vmas, self.exact, enforce) {
            self.hot.held.fetch_sub(1, Ordering::Relaxed);
            return Err(self.exhausted(held));
        }
        self.hot.vmas.fetch_add(vmas, Ordering::Relaxed);
        match stack::map_stack(&self.layout, kind) {
            Ok((top, outcome)) => {
                if let GuardOutcome::FellBack = outcome {
                    self.fell_back();
                }
                self.hot.created.fetch_add(1, Ordering::Relaxed);
                self.note_outside(held + 1, self.hot.global_len.load(Ordering::Relaxed));
                Ok(top)
            }
            Err(e) => {
                self.uncharge(vmas);
                self.hot.held.fetch_sub(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// A guard install was refused and the stack got an `mprotect` guard:
    /// from now on every stack of this pool counts 2 VMAs, the ones already
    /// held included (they are charged the difference, so that what is
    /// released later matches what was charged; an upper bound for them).
    #[cold]
    fn fell_back(&self) {
        if self
            .guard
            .swap(GuardKind::Mprotect.to_u8(), Ordering::Relaxed)
            != GuardKind::Mprotect.to_u8()
        {
            let extra = self.hot.held.load(Ordering::Relaxed) as u64;
            self.budget.charge(extra, self.exact, false);
            self.hot.vmas.fetch_add(extra, Ordering::Relaxed);
            log::warn!(
                "coro-pool: MADV_GUARD_INSTALL refused on a stack (EINVAL, \
                 mlock'd memory?); this pool now uses mprotect guards"
            );
        } else {
            // A stack created with guard install in mind while another
            // thread switched the pool over: charge its second VMA.
            self.budget.charge(1, self.exact, false);
            self.hot.vmas.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Gives `vmas` back to the budget (never more than this pool holds).
    fn uncharge(&self, vmas: u64) {
        let mut released = 0;
        let _ = self
            .hot
            .vmas
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                released = v.min(vmas);
                Some(v - released)
            });
        self.budget.release(released, self.exact);
    }

    fn free_one(&self, top: NonNull<u8>) {
        // SAFETY: every stack handed to free_one was mapped by this pool with
        // self.layout and is idle (no coroutine runs on it any more).
        match unsafe { stack::unmap_stack(top, &self.layout) } {
            Ok(()) => {
                self.hot.freed.fetch_add(1, Ordering::Relaxed);
                self.hot.held.fetch_sub(1, Ordering::Relaxed);
                self.uncharge(self.guard_kind().vmas_per_stack() as u64);
            }
            Err(e) => {
                self.hot.unmap_failures.fetch_add(1, Ordering::Relaxed);
                log::error!("coro-pool: munmap of an idle coroutine stack failed: {e}");
            }
        }
    }

    fn free_list(&self, mut list: StackList) {
        while let Some(top) = list.pop() {
            self.free_one(top);
        }
    }

    /// Moves a batch into the global pool, keeping what fits under the
    /// maximum and freeing the rest. `owner` tags the batch with the local
    /// pool that returns it (0 for none).
    fn put_global(&self, mut batch: StackList, owner: usize) {
        if batch.is_empty() {
            return;
        }
        if self.closed.load(Ordering::Relaxed) {
            self.free_list(batch);
            return;
        }
        if self.idle_pages == IdlePages::Release {
            // SAFETY: the batch holds idle stacks of this pool's layout.
            batch.for_each(|top| unsafe { stack::release_pages(top, &self.layout) });
        }
        let excess = {
            let mut g = lock(&self.hot.global);
            // Read under the lock: a reservation that ends concurrently
            // either sees this batch when it shrinks the pool, or has
            // lowered the maximum before it is read here. (The budget was
            // resolved when these stacks were created, so this reads no
            // file.)
            let max = self.max_pooled();
            let room = max.saturating_sub(g.size);
            let excess = if batch.len() <= room {
                None
            } else {
                let keep = batch.split_off(room);
                Some(std::mem::replace(&mut batch, keep))
            };
            if !batch.is_empty() {
                g.size += batch.len();
                g.batches.push_back(GlobalBatch {
                    stacks: batch,
                    owner,
                });
            }
            self.hot.global_len.store(g.size, Ordering::Relaxed);
            excess
        };
        if let Some(excess) = excess {
            self.free_list(excess);
        }
    }

    /// Takes a batch from the global pool for the local pool `owner`:
    /// among the [`AFFINITY_SCAN`] most recently returned batches, the
    /// newest one this thread returned itself, else the newest. Stacks that
    /// go back to the thread that used them last are still in its CPU's
    /// caches (the link words, the stack tops); a batch another thread
    /// wrote costs a cache-line transfer per stack when it is popped.
    fn take_global_batch(&self, owner: usize) -> Option<StackList> {
        if self.hot.global_len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut g = lock(&self.hot.global);
        let len = g.batches.len();
        let pick = (len.saturating_sub(AFFINITY_SCAN)..len)
            .rev()
            .find(|&i| g.batches[i].owner == owner)
            .unwrap_or(len.checked_sub(1)?);
        let batch = g.batches.remove(pick)?.stacks;
        g.size -= batch.len();
        self.hot.global_len.store(g.size, Ordering::Relaxed);
        self.note_outside(self.hot.held.load(Ordering::Relaxed), g.size);
        Some(batch)
    }

    /// Raises the high-water mark of stacks outside the global pool. Only
    /// the slow paths (mapping a stack, refilling a local pool from the
    /// global one) can raise that number, so the fast paths never call this.
    fn note_outside(&self, held: usize, global: usize) {
        self.hot
            .peak_outside
            .fetch_max(held.saturating_sub(global), Ordering::Relaxed);
    }

    /// Frees idle global stacks above `min(max, peak - now)`, where `now`
    /// is the number of stacks outside the global pool (in use or cached in
    /// thread-local pools) and `peak` its high-water mark since the previous
    /// trim, then starts a new window. Returns the number freed.
    fn trim(&self) -> usize {
        let freed = self.trim_global();
        // Check the accounting against the kernel's list and refresh the
        // count of mappings the pools do not own.
        self.budget.check();
        self.hot.trims.fetch_add(1, Ordering::Relaxed);
        freed
    }

    fn trim_global(&self) -> usize {
        if self.policy != Policy::Bounded {
            return 0;
        }
        let now = self
            .hot
            .held
            .load(Ordering::Relaxed)
            .saturating_sub(self.hot.global_len.load(Ordering::Relaxed));
        let peak = self.hot.peak_outside.swap(now, Ordering::Relaxed).max(now);
        let keep = self.max_pooled().min(peak - now);
        let freed = self.shrink_global(keep);
        if freed > 0 {
            log::debug!("coro-pool: trim freed {freed} idle stacks (kept {keep})");
        }
        freed
    }

    /// Frees the oldest global batches (splitting one if needed) until at
    /// most `keep` stacks are left in the global pool. Returns the number
    /// freed. The lock is held only to unlink the batches.
    fn shrink_global(&self, keep: usize) -> usize {
        if self.hot.global_len.load(Ordering::Relaxed) <= keep {
            return 0;
        }
        let mut doomed = Vec::new();
        {
            let mut g = lock(&self.hot.global);
            while g.size > keep {
                let Some(GlobalBatch {
                    stacks: mut batch,
                    owner,
                }) = g.batches.pop_front()
                else {
                    break;
                };
                let excess = g.size - keep;
                if batch.len() <= excess {
                    g.size -= batch.len();
                    doomed.push(batch);
                } else {
                    let part = batch.split_off(excess);
                    g.size -= part.len();
                    doomed.push(part);
                    g.batches.push_front(GlobalBatch {
                        stacks: batch,
                        owner,
                    });
                }
            }
            self.hot.global_len.store(g.size, Ordering::Relaxed);
        }
        let mut freed = 0;
        for batch in doomed {
            freed += batch.len();
            self.free_list(batch);
        }
        freed
    }

    /// A reservation ended and the maximum dropped: free the global stacks
    /// above the new maximum now, not at the next trim, so that the VMAs and
    /// memory of a finished burst go back as soon as its demand is gone.
    fn shrink_to_max(&self) -> usize {
        if self.policy != Policy::Bounded {
            return 0;
        }
        let max = self.max_pooled();
        let freed = self.shrink_global(max);
        if freed > 0 {
            log::debug!(
                "coro-pool: reservation dropped, freed {freed} idle stacks above the maximum {max}"
            );
        }
        freed
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        // Every thread's next put takes the slow path, which frees.
        for t in lock(&self.hot.threads).iter() {
            t.cap.store(0, Ordering::Relaxed);
        }
        let batches = {
            let mut g = lock(&self.hot.global);
            g.size = 0;
            self.hot.global_len.store(0, Ordering::Relaxed);
            std::mem::take(&mut g.batches)
        };
        for batch in batches {
            self.free_list(batch.stacks);
        }
    }
}

/// A thread's idle stacks: the current batch (`hot` and `cur` together,
/// at most one batch) and a full spare batch.
#[derive(Debug, Default)]
struct LocalState {
    /// A stack handed out before the list: a put that finds it empty puts
    /// the stack here. A coroutine that is created, run and dropped over
    /// and over thus takes and gives back the same stack without touching a
    /// link word inside it, so no take waits for the previous put's store
    /// to be forwarded through the stack's memory.
    hot: Option<NonNull<u8>>,
    cur: StackList,
    spare: StackList,
}

impl LocalState {
    /// The current batch as one list, leaving it empty.
    fn take_current(&mut self) -> StackList {
        let mut list = self.cur.take();
        if let Some(top) = self.hot.take() {
            // SAFETY: an idle stack of this local pool, in no list.
            unsafe { list.push(top) };
        }
        list
    }
}

/// One thread's cache of a pool's stacks.
///
/// It lives on the heap and is reached through raw pointers from its
/// thread only: the thread's registry and the [`PooledStack`]s taken from it
/// (which are `!Send`), so its state is touched by one thread only. Its
/// lifetime, without a reference count on the fast path: it is freed when
/// the registry has let go of it (`registered` is false) and every stack
/// taken from it has come back (its take and put counters are equal). The
/// registry lets go with [`LocalPool::retire`], which frees it at once if
/// no stack is out and otherwise sets its capacity to 0, so that every
/// later put takes the slow path, which frees it with the last stack.
///
/// Every get and put writes it (the list head), so it is aligned to its own
/// cache lines: two threads' local pools never share one, whatever the
/// allocator places next to each other.
#[repr(align(128))]
pub(crate) struct LocalPool {
    shared: Arc<Shared>,
    stats: Arc<ThreadStats>,
    state: UnsafeCell<LocalState>,
    registered: Cell<bool>,
}

impl LocalPool {
    /// Allocates a local pool; `registered` says whether a registry owns it.
    fn alloc(shared: &Arc<Shared>, registered: bool) -> NonNull<LocalPool> {
        let local = Box::new(LocalPool::new(Arc::clone(shared)));
        local.registered.set(registered);
        if !registered {
            local.stats.cap.store(0, Ordering::Relaxed);
        }
        NonNull::from(Box::leak(local))
    }

    fn new(shared: Arc<Shared>) -> LocalPool {
        let stats = Arc::new(ThreadStats::default());
        {
            let mut threads = lock(&shared.hot.threads);
            // Checked under the lock close() takes to zero every cap.
            let cap = match shared.policy {
                _ if shared.closed.load(Ordering::Relaxed) => 0,
                Policy::Bounded => shared.batch_size,
                #[cfg(feature = "bench-policies")]
                Policy::UnboundedPerThread => usize::MAX,
                #[cfg(feature = "bench-policies")]
                Policy::NoPool => 0,
            };
            stats.cap.store(cap, Ordering::Relaxed);
            threads.push(Arc::clone(&stats));
        }
        LocalPool {
            shared,
            stats,
            state: UnsafeCell::new(LocalState::default()),
            registered: Cell::new(true),
        }
    }

    /// Stacks taken from this local pool and not yet given back. Read by
    /// the owning thread, the only writer.
    fn outstanding(&self) -> u64 {
        self.stats.takes.load(Ordering::Relaxed) - self.stats.puts.load(Ordering::Relaxed)
    }

    /// The registry lets go of `ptr`: its idle stacks go to the global pool
    /// (or are freed), and it is freed now if no stack taken from it is
    /// out, else by the put of the last one.
    ///
    /// # Safety
    ///
    /// `ptr` must be a live local pool of the calling thread that its
    /// registry owned and no longer lists (so it is retired only once).
    unsafe fn retire(ptr: NonNull<LocalPool>) {
        {
            // SAFETY: live per the caller's contract.
            let local = unsafe { ptr.as_ref() };
            local.registered.set(false);
            local.stats.cap.store(0, Ordering::Relaxed);
            local.flush();
            if local.outstanding() != 0 {
                return;
            }
        }
        // SAFETY: allocated by alloc() (Box::leak), no longer registered,
        // and no PooledStack points at it; no reference to it is live.
        drop(unsafe { Box::from_raw(ptr.as_ptr()) });
    }

    /// The tag of this local pool's batches in the global pool.
    fn owner(&self) -> usize {
        Arc::as_ptr(&self.stats) as usize
    }

    /// Runs `f` on the local state. Callers never nest these calls and `f`
    /// never calls out of this module (no logging, no locks, no user code).
    #[inline(always)]
    fn with_state<R>(&self, f: impl FnOnce(&mut LocalState) -> R) -> R {
        // SAFETY: LocalPool is !Sync and only its own thread reaches it
        // (through its registry and its !Send PooledStacks), so only that
        // thread holds a reference; with_state is never re-entered (every closure passed
        // here only touches LocalState and the thread's stat atomics), so
        // this is the only live reference to the state.
        f(unsafe { &mut *self.state.get() })
    }

    /// The fast path of a get: the hot slot, else a pop from the current
    /// batch. Under `Policy::NoPool` both are always empty.
    ///
    /// # Safety
    ///
    /// `ptr` must be a live local pool of the calling thread.
    #[inline(always)]
    unsafe fn take(ptr: NonNull<LocalPool>) -> Result<PooledStack> {
        // SAFETY: live per the caller's contract.
        let local = unsafe { ptr.as_ref() };
        let top = match local.with_state(|st| st.hot.take().or_else(|| st.cur.pop())) {
            Some(top) => top,
            None => local.take_slow()?,
        };
        // From here the stack counts as out: the local pool stays alive at
        // least until it comes back.
        ThreadStats::bump(&local.stats.takes);
        Ok(PooledStack { top, local: ptr })
    }

    /// The current batch is empty: switch to the spare batch, refill from
    /// the global pool, or map a new stack.
    #[cold]
    #[inline(never)]
    fn take_slow(&self) -> Result<NonNull<u8>> {
        let sh = &*self.shared;
        if sh.policy == Policy::Bounded {
            let spare = self.with_state(|st| {
                if st.cur.is_empty() && !st.spare.is_empty() {
                    st.cur = st.spare.take();
                }
                st.cur.pop()
            });
            if let Some(top) = spare {
                return Ok(top);
            }
            if let Some(mut batch) = sh.take_global_batch(self.owner()) {
                if let Some(top) = batch.pop() {
                    let displaced = self.with_state(|st| std::mem::replace(&mut st.cur, batch));
                    // Empty in practice: the batch was refilled because the
                    // current one ran dry.
                    sh.put_global(displaced, self.owner());
                    return Ok(top);
                }
            }
        }
        sh.create()
    }

    /// The fast path of a put: into the hot slot if it is empty, else onto
    /// the current batch's list.
    ///
    /// # Safety
    ///
    /// `ptr` must be the live local pool `top` was taken from, on the
    /// calling thread, and `top` must be out (taken and not yet put).
    #[inline(always)]
    unsafe fn put(ptr: NonNull<LocalPool>, top: NonNull<u8>) {
        // SAFETY: live per the caller's contract (a stack is out, so a
        // retired local pool has not been freed yet).
        let local = unsafe { ptr.as_ref() };
        let stats = &*local.stats;
        ThreadStats::bump(&stats.puts);
        let cap = stats.cap.load(Ordering::Relaxed);
        let pushed = local.with_state(|st| {
            if st.hot.is_none() {
                let fits = st.cur.len() < cap;
                if fits {
                    st.hot = Some(top);
                }
                fits
            } else {
                let fits = st.cur.len() + 1 < cap;
                if fits {
                    // SAFETY: the stack was handed out by this pool, its
                    // coroutine is gone, and it is in no list.
                    unsafe { st.cur.push(top) };
                }
                fits
            }
        });
        if !pushed {
            // SAFETY: as for this call.
            unsafe { Self::put_slow(ptr, top) };
        }
    }

    /// The current batch is full, the pool is closed, nothing is pooled, or
    /// the local pool is retired.
    ///
    /// # Safety
    ///
    /// As for [`LocalPool::put`], with the put already counted.
    #[cold]
    #[inline(never)]
    unsafe fn put_slow(ptr: NonNull<LocalPool>, top: NonNull<u8>) {
        {
            // SAFETY: live per the caller's contract.
            let local = unsafe { ptr.as_ref() };
            if local.registered.get() {
                local.put_full(top);
                return;
            }
            // Retired: hand the stack over (or free it), and the local pool
            // goes with its last stack.
            let sh = &*local.shared;
            if sh.policy == Policy::Bounded {
                let mut one = StackList::new();
                // SAFETY: the stack is idle now and in no list.
                unsafe { one.push(top) };
                sh.put_global(one, 0);
            } else {
                sh.free_one(top);
            }
            if local.outstanding() != 0 {
                return;
            }
        }
        // SAFETY: allocated by alloc(), retired (no registry lists it), and
        // this was its last stack out; no reference to it is live.
        drop(unsafe { Box::from_raw(ptr.as_ptr()) });
    }

    /// A put on a registered local pool whose current batch is full (or
    /// whose pool is closed or pools nothing).
    fn put_full(&self, top: NonNull<u8>) {
        let sh = &*self.shared;
        if sh.policy.is_no_pool() || sh.closed.load(Ordering::Relaxed) {
            sh.free_one(top);
            return;
        }
        // The current batch is full: it becomes the spare, and the old
        // spare (full too, if any) moves to the global pool. A thread that
        // swings between empty and full thus moves one batch per batch-size
        // operations at most, never one per operation.
        let spill = self.with_state(|st| {
            let spill = st.spare.take();
            st.spare = st.take_current();
            st.hot = Some(top);
            spill
        });
        sh.put_global(spill, self.owner());
    }

    fn flush(&self) {
        let (cur, spare) = self.with_state(|st| (st.take_current(), st.spare.take()));
        self.release_lists(cur, spare);
    }

    fn release_lists(&self, cur: StackList, spare: StackList) {
        if self.shared.policy == Policy::Bounded {
            // Untagged: the thread is leaving or going idle.
            self.shared.put_global(spare, 0);
            self.shared.put_global(cur, 0);
        } else {
            self.shared.free_list(cur);
            self.shared.free_list(spare);
        }
    }
}

impl Drop for LocalPool {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        let (cur, spare) = (st.take_current(), st.spare.take());
        self.release_lists(cur, spare);
        // Stacks in use keep their LocalPool alive, so every take has been
        // matched by a put by now; keep the totals for stats().
        let hot = &self.shared.hot;
        hot.retired_takes
            .fetch_add(self.stats.takes.load(Ordering::Relaxed), Ordering::Relaxed);
        hot.retired_puts
            .fetch_add(self.stats.puts.load(Ordering::Relaxed), Ordering::Relaxed);
        lock(&hot.threads).retain(|t| !Arc::ptr_eq(t, &self.stats));
    }
}

/// This thread's local pools, one per pool it has used. It owns them:
/// each is retired when it leaves the registry.
struct Registry(Vec<NonNull<LocalPool>>);

impl Registry {
    fn find(&self, shared: &Arc<Shared>) -> Option<NonNull<LocalPool>> {
        // SAFETY: the registry's entries are live local pools of this thread.
        self.0
            .iter()
            .copied()
            .find(|l| Arc::ptr_eq(&unsafe { l.as_ref() }.shared, shared))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // The cache must never point at a LocalPool the registry no longer
        // keeps.
        forget_last();
        for local in self.0.drain(..) {
            // SAFETY: a live local pool of this thread that the registry
            // owned and no longer lists.
            unsafe { LocalPool::retire(local) };
        }
    }
}

thread_local! {
    static REGISTRY: RefCell<Registry> = const { RefCell::new(Registry(Vec::new())) };
    /// A one-entry cache of REGISTRY: the pool (`Shared`) used last and its
    /// local pool. `const`-initialised `Cell`s without destructors, so a
    /// read is one thread-pointer-relative load with no lazy-init or
    /// liveness check. Invariant: when LAST_SHARED is non-null, LAST_LOCAL
    /// points at a LocalPool for that pool that REGISTRY owns; both are
    /// nulled before any entry leaves the registry.
    static LAST_SHARED: Cell<*const Shared> = const { Cell::new(std::ptr::null()) };
    static LAST_LOCAL: Cell<*mut LocalPool> = const { Cell::new(std::ptr::null_mut()) };
}

fn forget_last() {
    LAST_SHARED.with(|last| last.set(std::ptr::null()));
    LAST_LOCAL.with(|last| last.set(std::ptr::null_mut()));
}

/// Removes the entries matching `pred` from this thread's registry and
/// retires them (outside the registry's borrow).
fn unregister(pred: impl Fn(&LocalPool) -> bool) {
    let gone = REGISTRY
        .try_with(|reg| {
            let Ok(mut reg) = reg.try_borrow_mut() else {
                return Vec::new();
            };
            forget_last();
            let mut out = Vec::new();
            let mut i = 0;
            while i < reg.0.len() {
                // SAFETY: the registry's entries are live local pools.
                if pred(unsafe { reg.0[i].as_ref() }) {
                    out.push(reg.0.swap_remove(i));
                } else {
                    i += 1;
                }
            }
            out
        })
        .unwrap_or_default();
    for local in gone {
        // SAFETY: live local pools of this thread that the registry owned
        // and no longer lists.
        unsafe { LocalPool::retire(local) };
    }
}

/// Takes a stack from this thread's local pool for `shared`, registering
/// one on first use. During thread teardown (registry gone) a retired one
/// is made for the stack; it is freed when the stack comes back.
#[inline(always)]
fn take_local(shared: &Arc<Shared>) -> Result<PooledStack> {
    // A live Shared is never at address 0, so a null cache never matches.
    if LAST_SHARED.with(Cell::get) == Arc::as_ptr(shared) {
        let last = LAST_LOCAL.with(Cell::get);
        // SAFETY: per the cache's invariant, LAST_LOCAL is a live local pool
        // of this thread (owned by its registry), not null.
        return unsafe { LocalPool::take(NonNull::new_unchecked(last)) };
    }
    take_registering(shared)
}

#[cold]
#[inline(never)]
fn take_registering(shared: &Arc<Shared>) -> Result<PooledStack> {
    unregister(|l| l.shared.closed.load(Ordering::Relaxed));
    let found = REGISTRY.try_with(|reg| {
        let mut reg = reg.try_borrow_mut().ok()?;
        let local = match reg.find(shared) {
            Some(local) => local,
            None => {
                let local = LocalPool::alloc(shared, true);
                reg.0.push(local);
                local
            }
        };
        LAST_SHARED.with(|last| last.set(Arc::as_ptr(shared)));
        LAST_LOCAL.with(|last| last.set(local.as_ptr()));
        Some(local)
    });
    if let Ok(Some(local)) = found {
        // SAFETY: a live local pool the registry owns.
        return unsafe { LocalPool::take(local) };
    }
    // Thread teardown: a retired local pool that lives as long as its stack.
    let local = LocalPool::alloc(shared, false);
    // SAFETY: live; nothing else points at it.
    let taken = unsafe { LocalPool::take(local) };
    if taken.is_err() {
        // SAFETY: allocated above, unregistered, and no stack is out.
        drop(unsafe { Box::from_raw(local.as_ptr()) });
    }
    taken
}

/// The identity of a stack (its top address), for checking reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(pub usize);

/// A stack taken from a [`StackPool`]. Dropping it returns it to the pool
/// (to this thread's local pool, or unmaps it under `Policy::NoPool`).
///
/// It implements [`corosensei::stack::Stack`], so it can also back a
/// `corosensei::Coroutine` directly. It is neither `Send` nor `Sync`: it
/// belongs to the thread's local pool.
pub struct PooledStack {
    top: NonNull<u8>,
    /// The local pool it was taken from, kept alive while the stack is out.
    local: NonNull<LocalPool>,
}

impl std::fmt::Debug for PooledStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledStack")
            .field("id", &self.id())
            .field("usable_size", &self.usable_size())
            .finish()
    }
}

impl PooledStack {
    /// The stack's identity (its top address).
    #[inline]
    pub fn id(&self) -> StackId {
        StackId(self.top.as_ptr() as usize)
    }

    /// Usable bytes (above the guard).
    pub fn usable_size(&self) -> usize {
        self.layout().usable_len
    }

    /// Bytes of the guard region below the usable part.
    pub fn guard_size(&self) -> usize {
        self.layout().guard_len
    }

    #[inline(always)]
    fn layout(&self) -> &Layout {
        // SAFETY: a local pool outlives every stack taken from it.
        &unsafe { self.local.as_ref() }.shared.layout
    }
}

impl Drop for PooledStack {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: the local pool the stack was taken from, on this thread
        // (PooledStack is !Send); the stack is out until this put.
        unsafe { LocalPool::put(self.local, self.top) };
    }
}

impl PooledStack {
    /// Gives back the stack held in `slot`, leaving `None`. Same as
    /// `drop(slot.take())`, but it reads the two words one at a time: moved
    /// as a whole, the pair is copied with one 16-byte load of two 8-byte
    /// stores made a moment before, which the CPU cannot forward (a stall
    /// of a dozen cycles per coroutine).
    #[inline(always)]
    pub(crate) fn give_back(slot: &mut Option<PooledStack>) {
        if let Some(stack) = slot.as_ref() {
            let (local, top) = (stack.local, stack.top);
            // SAFETY: overwrites the PooledStack without dropping it; its
            // stack is put back right below, exactly once.
            unsafe { std::ptr::write(slot, None) };
            // SAFETY: as in PooledStack::drop.
            unsafe { LocalPool::put(local, top) };
        }
    }

    /// The bounds of this stack, for a coroutine that runs on it while the
    /// `PooledStack` itself is kept next to the coroutine.
    #[inline(always)]
    pub(crate) fn bounds(&self) -> StackBounds {
        StackBounds {
            top: self.top,
            local: self.local,
        }
    }
}

// SAFETY: the bounds are those of the stack this PooledStack owns (see
// StackBounds), and the mapping stays valid until it is dropped.
unsafe impl corosensei::stack::Stack for PooledStack {
    #[inline]
    fn base(&self) -> corosensei::stack::StackPointer {
        self.bounds().base()
    }

    #[inline]
    fn limit(&self) -> corosensei::stack::StackPointer {
        self.bounds().limit()
    }
}

/// The bounds of a [`PooledStack`] without its ownership: what a
/// [`Coroutine`](crate::Coroutine) runs on while it holds the
/// `PooledStack` itself, so that it can give the stack back the moment the
/// coroutine returns.
#[derive(Clone, Copy)]
pub(crate) struct StackBounds {
    top: NonNull<u8>,
    local: NonNull<LocalPool>,
}

// SAFETY: base() is the top of a mapping of mmap_len bytes whose lowest
// guard_len bytes are inaccessible (MADV_GUARD_INSTALL or PROT_NONE), limit()
// is the start of that mapping, both are page aligned (so aligned to
// STACK_ALIGNMENT), and the usable part is at least MIN_STACK_SIZE bytes
// (checked when the pool is built). The holder of the bounds keeps the
// PooledStack, and with it the mapping and its local pool, alive for as long
// as a coroutine may run on them.
unsafe impl corosensei::stack::Stack for StackBounds {
    #[inline]
    fn base(&self) -> corosensei::stack::StackPointer {
        // SAFETY: the top of a mapping is never address 0.
        unsafe { NonZeroUsize::new_unchecked(self.top.as_ptr() as usize) }
    }

    #[inline]
    fn limit(&self) -> corosensei::stack::StackPointer {
        // SAFETY: the local pool outlives the stack (see above).
        let layout = &unsafe { self.local.as_ref() }.shared.layout;
        let start = self.top.as_ptr() as usize - layout.mmap_len();
        // SAFETY: a mapping never starts at address 0 (mmap_min_addr).
        unsafe { NonZeroUsize::new_unchecked(start) }
    }
}

/// A demand reservation: while it lives, the pool's global maximum is
/// raised by its size (within the mapping budget). Dropping it lowers the
/// maximum again and frees, right away and on the dropping thread, the
/// idle stacks of the global pool above the lowered maximum (oldest batches
/// first), so the memory and VMAs of a burst go back as soon as its demand
/// ends, without waiting for [`StackPool::trim`]. Stacks in use and
/// thread-local pools are not touched.
#[must_use = "the reservation ends when the handle is dropped"]
#[derive(Debug)]
pub struct Reservation {
    shared: Arc<Shared>,
    stacks: usize,
}

impl Reservation {
    /// Stacks this reservation adds to the pool's maximum.
    pub fn stacks(&self) -> usize {
        self.stacks
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.stacks == 0 {
            return;
        }
        self.shared
            .hot
            .reserved
            .fetch_sub(self.stacks, Ordering::Relaxed);
        self.shared.shrink_to_max();
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("policy", &self.policy)
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

/// A snapshot of a pool's counters. Per-thread figures are read without
/// stopping the threads, so a snapshot taken while other threads work is
/// approximate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Stacks in use: live coroutines (and [`PooledStack`]s held directly),
    /// computed as stacks taken minus stacks given back, summed over the
    /// per-thread counters.
    pub live_coroutines: usize,
    /// Idle stacks in thread-local pools, all threads together, computed as
    /// held minus global minus in use.
    pub pooled_local: usize,
    /// Idle stacks in the global pool.
    pub pooled_global: usize,
    /// Stacks mapped since the pool was created.
    pub stacks_created: u64,
    /// Stacks handed out again from a pool instead of being mapped.
    pub stacks_reused: u64,
    /// Stacks unmapped.
    pub stacks_freed: u64,
    /// Stacks currently mapped (in use or idle).
    pub stacks_held: usize,
    /// VMAs those stacks hold, as charged to the budget: exact for
    /// `mprotect` guards (2 per stack), an upper bound for guard-installed
    /// stacks (1 per stack; adjacent ones merge into fewer).
    pub vmas_held: usize,
    /// VMAs all pools of this pool's budget hold (the process-wide total
    /// for the default budget).
    pub process_pool_vmas: u64,
    /// VMAs all those pools may hold together now.
    pub process_vmas_limit: u64,
    /// Mappings of the process no pool holds, as last measured in
    /// `/proc/self/maps`.
    pub foreign_vmas: u64,
    /// Trim passes run so far (explicit and by the trimmer thread).
    pub trims: u64,
    /// The global pool's current maximum.
    pub max_pooled: usize,
    /// Stacks reserved by live [`Reservation`]s.
    pub reserved: usize,
    /// `munmap` calls that failed (the stacks stay counted as held).
    pub unmap_failures: u64,
}

/// A pool of guard-paged coroutine stacks. See the [crate docs](crate).
///
/// Dropping the pool frees its global pool and the calling thread's local
/// pool; other threads' local pools (two batches at most) are freed when
/// those threads exit or next register a pool, and stacks still in use are
/// freed when their coroutines end.
#[derive(Debug)]
pub struct StackPool {
    shared: Arc<Shared>,
    trimmer: Option<Trimmer>,
    trim_interval: Option<Duration>,
}

#[derive(Debug)]
struct Trimmer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl StackPool {
    /// Builds a pool. Fails on an invalid configuration, when
    /// [`GuardMode::GuardInstall`] is required but unsupported, or when the
    /// background trimmer cannot be started. No stack is mapped and
    /// `vm.max_map_count` is not read until needed.
    pub fn new(config: PoolConfig) -> Result<StackPool> {
        let page = stack::page_size();
        if config.stack_size < corosensei::stack::MIN_STACK_SIZE
            || config.stack_size > MAX_STACK_SIZE
        {
            return Err(Error::InvalidConfig(format!(
                "stack size {} is outside {}..={MAX_STACK_SIZE}",
                config.stack_size,
                corosensei::stack::MIN_STACK_SIZE
            )));
        }
        if config.guard_pages == 0 || config.guard_pages > MAX_GUARD_PAGES {
            return Err(Error::InvalidConfig(format!(
                "guard pages {} is outside 1..={MAX_GUARD_PAGES}",
                config.guard_pages
            )));
        }
        if config.batch_size == 0 || config.batch_size > MAX_BATCH_SIZE {
            return Err(Error::InvalidConfig(format!(
                "batch size {} is outside 1..={MAX_BATCH_SIZE}",
                config.batch_size
            )));
        }
        if config.trim_interval == Some(Duration::ZERO) {
            return Err(Error::InvalidConfig(
                "trim interval must not be zero".to_string(),
            ));
        }
        let guard = match config.guard {
            GuardMode::Auto if stack::guard_install_supported() => GuardKind::GuardInstall,
            GuardMode::Auto | GuardMode::Mprotect => GuardKind::Mprotect,
            GuardMode::GuardInstall if stack::guard_install_supported() => GuardKind::GuardInstall,
            GuardMode::GuardInstall => return Err(Error::GuardInstallUnsupported),
        };
        let usable = config.stack_size.div_ceil(page) * page;
        let mut pool = Self::from_parts(&config, guard, usable, page);
        if let Some(interval) = config.trim_interval {
            pool.trimmer = Some(Self::spawn_trimmer(&pool.shared, interval)?);
            pool.trim_interval = Some(interval);
        }
        Ok(pool)
    }

    fn from_parts(config: &PoolConfig, guard: GuardKind, usable: usize, page: usize) -> StackPool {
        let shared = Shared {
            layout: Layout {
                guard_len: config.guard_pages * page,
                usable_len: usable,
            },
            policy: config.policy,
            batch_size: config.batch_size,
            base_max: config.base_max,
            idle_pages: config.idle_pages,
            budget: config.resolve_budget(),
            share: config.budget_share,
            exact: guard == GuardKind::Mprotect,
            guard: AtomicU8::new(guard.to_u8()),
            closed: AtomicBool::new(false),
            hot: Hot {
                global: Mutex::new(Global::default()),
                global_len: AtomicUsize::new(0),
                reserved: AtomicUsize::new(0),
                held: AtomicUsize::new(0),
                created: AtomicU64::new(0),
                freed: AtomicU64::new(0),
                unmap_failures: AtomicU64::new(0),
                retired_takes: AtomicU64::new(0),
                retired_puts: AtomicU64::new(0),
                peak_outside: AtomicUsize::new(0),
                vmas: AtomicU64::new(0),
                trims: AtomicU64::new(0),
                threads: Mutex::new(Vec::new()),
            },
        };
        // Check the accounting against /proc/self/maps and count what the
        // process maps besides the pools' stacks.
        shared.budget.check();
        StackPool {
            shared: Arc::new(shared),
            trimmer: None,
            trim_interval: None,
        }
    }

    fn spawn_trimmer(shared: &Arc<Shared>, interval: Duration) -> Result<Trimmer> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let weak: Weak<Shared> = Arc::downgrade(shared);
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("coro-pool-trim".to_string())
            .spawn(move || {
                let (flag, cv) = &*stop2;
                let mut stopped = lock(flag);
                loop {
                    let (guard, _) = cv
                        .wait_timeout(stopped, interval)
                        .unwrap_or_else(|e| e.into_inner());
                    stopped = guard;
                    if *stopped {
                        return;
                    }
                    match weak.upgrade() {
                        Some(shared) => {
                            drop(stopped);
                            shared.trim();
                            stopped = lock(flag);
                        }
                        None => return,
                    }
                }
            })
            .map_err(Error::Trimmer)?;
        Ok(Trimmer {
            stop,
            thread: Some(thread),
        })
    }

    /// The process-wide default pool (default [`PoolConfig`]), used by
    /// [`Coroutine::new`](crate::Coroutine::new).
    pub fn global() -> &'static StackPool {
        static GLOBAL: OnceLock<StackPool> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let config = PoolConfig::default();
            let guard = if stack::guard_install_supported() {
                GuardKind::GuardInstall
            } else {
                GuardKind::Mprotect
            };
            let page = stack::page_size();
            let usable = config.stack_size.div_ceil(page) * page;
            Self::from_parts(&config, guard, usable, page)
        })
    }

    /// Takes a stack: from this thread's local pool, else a batch from the
    /// global pool, else a new mapping. Fails when the mapping budget is
    /// exhausted or `mmap`/the guard setup fails; never aborts.
    #[inline]
    pub fn take_stack(&self) -> Result<PooledStack> {
        take_local(&self.shared)
    }

    /// Raises the global pool's maximum by `stacks` until the returned
    /// handle is dropped; dropping it frees the global stacks above the
    /// lowered maximum at once (see [`Reservation`]). Under
    /// `Policy::UnboundedPerThread` and `Policy::NoPool` it is recorded
    /// but changes nothing.
    pub fn reserve(&self, stacks: usize) -> Reservation {
        let mut added = 0;
        let _ = self
            .shared
            .hot
            .reserved
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                let next = r.saturating_add(stacks);
                added = next - r;
                Some(next)
            });
        Reservation {
            shared: Arc::clone(&self.shared),
            stacks: added,
        }
    }

    /// Frees idle stacks of the global pool above the demand seen since the
    /// previous trim: it keeps `min(max_pooled, peak - now)` stacks, where
    /// `now` counts the stacks outside the global pool (in use or cached by
    /// threads) and `peak` is the high-water mark of that count during the
    /// window, then starts a new window. Thread-local pools are left alone
    /// (at most two batches each). Returns the number of stacks freed. A
    /// no-op for the non-default policies.
    pub fn trim(&self) -> usize {
        self.shared.trim()
    }

    /// Moves the calling thread's local stacks to the global pool (freeing
    /// what does not fit), for a thread about to go idle for a long time.
    /// Under `Policy::UnboundedPerThread` they are freed.
    pub fn flush_local(&self) {
        let found = REGISTRY.try_with(|reg| reg.try_borrow().ok()?.find(&self.shared));
        if let Ok(Some(local)) = found {
            // SAFETY: a live local pool the registry owns; flush() neither
            // reaches the registry nor frees the local pool.
            unsafe { local.as_ref() }.flush();
        }
    }

    /// A snapshot of the pool's counters.
    pub fn stats(&self) -> Stats {
        let sh = &*self.shared;
        // Per-thread counters are summed only here: the get/put fast paths
        // write nothing another thread reads often. Stacks in use are
        // takes minus puts; the rest of the held stacks that are not in the
        // global pool sit in thread-local pools.
        let (takes, puts) = {
            let threads = lock(&sh.hot.threads);
            threads.iter().fold((0u64, 0u64), |(t, p), s| {
                (
                    t + s.takes.load(Ordering::Relaxed),
                    p + s.puts.load(Ordering::Relaxed),
                )
            })
        };
        let takes = takes + sh.hot.retired_takes.load(Ordering::Relaxed);
        let puts = puts + sh.hot.retired_puts.load(Ordering::Relaxed);
        let held = sh.hot.held.load(Ordering::Relaxed);
        let global = sh.hot.global_len.load(Ordering::Relaxed);
        let created = sh.hot.created.load(Ordering::Relaxed);
        let budget = sh.budget.stats();
        let live = usize::try_from(takes.saturating_sub(puts)).unwrap_or(usize::MAX);
        let local = held.saturating_sub(global).saturating_sub(live);
        Stats {
            live_coroutines: live,
            pooled_local: local,
            pooled_global: global,
            stacks_created: created,
            stacks_reused: takes.saturating_sub(created),
            stacks_freed: sh.hot.freed.load(Ordering::Relaxed),
            stacks_held: held,
            vmas_held: usize::try_from(sh.hot.vmas.load(Ordering::Relaxed)).unwrap_or(usize::MAX),
            process_pool_vmas: budget.pool_vmas,
            process_vmas_limit: budget.limit_vmas,
            foreign_vmas: budget.foreign_vmas,
            trims: sh.hot.trims.load(Ordering::Relaxed),
            max_pooled: sh.max_pooled(),
            reserved: sh.hot.reserved.load(Ordering::Relaxed),
            unmap_failures: sh.hot.unmap_failures.load(Ordering::Relaxed),
        }
    }

    /// The global pool's current maximum: `min(base + reserved, budget)`
    /// for [`Policy::Bounded`], `usize::MAX` for
    /// `Policy::UnboundedPerThread`, 0 for `Policy::NoPool`.
    pub fn max_pooled(&self) -> usize {
        self.shared.max_pooled()
    }

    /// The mapping budget as this pool sees it (reads `vm.max_map_count`
    /// on first use).
    pub fn budget(&self) -> MapBudget {
        self.shared.budget()
    }

    /// The process-wide budget this pool draws from, shared with every
    /// other pool that uses it.
    pub fn process_budget(&self) -> &Arc<ProcessBudget> {
        &self.shared.budget
    }

    /// A snapshot of the shared budget's counters.
    pub fn budget_stats(&self) -> BudgetStats {
        self.shared.budget.stats()
    }

    /// The background trimmer's period, if the pool runs one.
    pub fn trim_interval(&self) -> Option<Duration> {
        self.trim_interval
    }

    /// The guard mechanism new stacks use.
    pub fn guard_kind(&self) -> GuardKind {
        self.shared.guard_kind()
    }

    /// Usable bytes per stack (page rounded).
    pub fn stack_size(&self) -> usize {
        self.shared.layout.usable_len
    }

    /// The pooling policy.
    pub fn policy(&self) -> Policy {
        self.shared.policy
    }

    /// Stacks per batch.
    pub fn batch_size(&self) -> usize {
        self.shared.batch_size
    }
}

impl Drop for StackPool {
    fn drop(&mut self) {
        if let Some(mut trimmer) = self.trimmer.take() {
            *lock(&trimmer.stop.0) = true;
            trimmer.stop.1.notify_all();
            if let Some(thread) = trimmer.thread.take() {
                let _ = thread.join();
            }
        }
        self.shared.close();
        // This thread's local pool gives its idle stacks back (the pool is
        // closed, so they are freed); it is freed with its last stack out.
        let shared = &self.shared;
        unregister(|l| Arc::ptr_eq(&l.shared, shared));
    }
}
