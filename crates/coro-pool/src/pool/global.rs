// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The state every handle, local pool and stack of one pool shares: the
//! global pool of batches behind one lock, its counters, the mapping
//! budget, stack creation, freeing and trimming. The bottom of the pool:
//! it imports none of the other files.

use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::budget::{MapBudget, ProcessBudget};
use crate::config::{IdlePages, Policy};
use crate::stack::{self, GuardKind, GuardOutcome, Layout, StackList};
use crate::{Error, Result};

/// Locks `m`, recovering the data if the lock is poisoned.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
pub(super) struct ThreadStats {
    /// Stacks the thread has taken (reused or newly mapped).
    pub(super) takes: AtomicU64,
    /// Stacks the thread has given back (pooled or freed).
    pub(super) puts: AtomicU64,
    /// Stacks the current batch may hold before a put takes the slow path:
    /// the batch size, unlimited for `Policy::UnboundedPerThread`, 0 for
    /// `Policy::NoPool` and once the pool is closed (set by
    /// [`Shared::close`] from the dropping thread). It sits next to `puts`
    /// so that a put reads a single line of per-thread data besides the
    /// list head.
    pub(super) cap: AtomicUsize,
}

impl ThreadStats {
    /// Adds one to a counter only the calling (owning) thread writes.
    #[inline(always)]
    pub(super) fn bump(counter: &AtomicU64) {
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// How many of the most recently returned global batches a refill looks
/// through for one its own thread returned (see [`Shared::take_global_batch`]).
pub(super) const AFFINITY_SCAN: usize = 4;

/// A batch in the global pool, tagged with the local pool that returned it.
#[derive(Debug)]
pub(super) struct GlobalBatch {
    pub(super) stacks: StackList,
    /// Address of the returning thread's `ThreadStats` (0 for none); only
    /// compared, never dereferenced.
    pub(super) owner: usize,
}

/// The global pool: batches of idle stacks. New batches go to the back;
/// refills take from the back (the warmest), trims free from the front.
#[derive(Debug, Default)]
pub(super) struct Global {
    pub(super) batches: VecDeque<GlobalBatch>,
    pub(super) size: usize,
}

/// The counters and locks of a pool that change while it runs, kept on
/// cache lines of their own: the configuration read on every get/put (in
/// [`Shared`]) never shares a line with them, so batch moves and stack
/// creation on one thread do not slow down other threads' fast paths.
#[repr(align(128))]
pub(super) struct Hot {
    pub(super) global: Mutex<Global>,
    pub(super) global_len: AtomicUsize,
    pub(super) reserved: AtomicUsize,
    pub(super) held: AtomicUsize,
    pub(super) created: AtomicU64,
    pub(super) freed: AtomicU64,
    pub(super) unmap_failures: AtomicU64,
    pub(super) retired_takes: AtomicU64,
    pub(super) retired_puts: AtomicU64,
    /// High-water mark of stacks outside the global pool (in use or in
    /// local pools) since the last trim; raised where that number grows.
    pub(super) peak_outside: AtomicUsize,
    /// VMAs this pool has charged to its budget for the stacks it holds.
    pub(super) vmas: AtomicU64,
    /// Trim passes run (explicit and by the trimmer thread).
    pub(super) trims: AtomicU64,
    pub(super) threads: Mutex<Vec<Arc<ThreadStats>>>,
}

/// State shared by every handle, thread-local pool and stack of one pool.
pub(crate) struct Shared {
    pub(super) layout: Layout,
    pub(super) policy: Policy,
    pub(super) batch_size: usize,
    pub(super) base_max: usize,
    pub(super) idle_pages: IdlePages,
    pub(super) budget: Arc<ProcessBudget>,
    pub(super) share: Option<usize>,
    /// Whether this pool's stacks are charged exactly (`mprotect` guards
    /// from the start) or as an upper bound (guard install, which may
    /// merge and may fall back later).
    pub(super) exact: bool,
    pub(super) guard: AtomicU8,
    pub(super) closed: AtomicBool,
    pub(super) hot: Hot,
}

impl Shared {
    pub(super) fn guard_kind(&self) -> GuardKind {
        GuardKind::from_u8(self.guard.load(Ordering::Relaxed))
    }

    pub(super) fn budget(&self) -> MapBudget {
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
    pub(super) fn exhausted(&self, held: usize) -> Error {
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

    pub(super) fn max_pooled(&self) -> usize {
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
    pub(super) fn create(&self) -> Result<NonNull<u8>> {
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
    pub(super) fn fell_back(&self) {
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
    pub(super) fn uncharge(&self, vmas: u64) {
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

    pub(super) fn free_one(&self, top: NonNull<u8>) {
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

    pub(super) fn free_list(&self, mut list: StackList) {
        while let Some(top) = list.pop() {
            self.free_one(top);
        }
    }

    /// Moves a batch into the global pool, keeping what fits under the
    /// maximum and freeing the rest. `owner` tags the batch with the local
    /// pool that returns it (0 for none).
    pub(super) fn put_global(&self, mut batch: StackList, owner: usize) {
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
    pub(super) fn take_global_batch(&self, owner: usize) -> Option<StackList> {
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
    pub(super) fn note_outside(&self, held: usize, global: usize) {
        self.hot
            .peak_outside
            .fetch_max(held.saturating_sub(global), Ordering::Relaxed);
    }

    /// Frees idle global stacks above `min(max, peak - now)`, where `now`
    /// is the number of stacks outside the global pool (in use or cached in
    /// thread-local pools) and `peak` its high-water mark since the previous
    /// trim, then starts a new window. Returns the number freed.
    pub(super) fn trim(&self) -> usize {
        let freed = self.trim_global();
        // Check the accounting against the kernel's list and refresh the
        // count of mappings the pools do not own.
        self.budget.check();
        self.hot.trims.fetch_add(1, Ordering::Relaxed);
        freed
    }

    pub(super) fn trim_global(&self) -> usize {
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
    pub(super) fn shrink_global(&self, keep: usize) -> usize {
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
    pub(super) fn shrink_to_max(&self) -> usize {
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

    pub(super) fn close(&self) {
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

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("policy", &self.policy)
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}
