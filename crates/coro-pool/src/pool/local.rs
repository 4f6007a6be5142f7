// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The per-thread local pools (at most two batches each) and each
//! thread's registry of them.

use std::cell::{Cell, RefCell, UnsafeCell};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::global::{lock, Shared, ThreadStats};
use crate::config::Policy;
use crate::stack::StackList;
use crate::Result;

/// A thread's idle stacks: the current batch (`hot` and `cur` together,
/// at most one batch) and a full spare batch.
#[derive(Debug, Default)]
pub(super) struct LocalState {
    /// A stack handed out before the list: a put that finds it empty puts
    /// the stack here. A coroutine that is created, run and dropped over
    /// and over thus takes and gives back the same stack without touching a
    /// link word inside it, so no take waits for the previous put's store
    /// to be forwarded through the stack's memory.
    pub(super) hot: Option<NonNull<u8>>,
    pub(super) cur: StackList,
    pub(super) spare: StackList,
}

impl LocalState {
    /// The current batch as one list, leaving it empty.
    pub(super) fn take_current(&mut self) -> StackList {
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
/// thread only: the thread's registry and the [`PooledStack`](super::PooledStack)s taken from it
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
    pub(super) shared: Arc<Shared>,
    pub(super) stats: Arc<ThreadStats>,
    pub(super) state: UnsafeCell<LocalState>,
    pub(super) registered: Cell<bool>,
}

impl LocalPool {
    /// Allocates a local pool; `registered` says whether a registry owns it.
    pub(super) fn alloc(shared: &Arc<Shared>, registered: bool) -> NonNull<LocalPool> {
        let local = Box::new(LocalPool::new(Arc::clone(shared)));
        local.registered.set(registered);
        if !registered {
            local.stats.cap.store(0, Ordering::Relaxed);
        }
        NonNull::from(Box::leak(local))
    }

    pub(super) fn new(shared: Arc<Shared>) -> LocalPool {
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
    pub(super) fn outstanding(&self) -> u64 {
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
    pub(super) unsafe fn retire(ptr: NonNull<LocalPool>) {
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
    pub(super) fn owner(&self) -> usize {
        Arc::as_ptr(&self.stats) as usize
    }

    /// Runs `f` on the local state. Callers never nest these calls and `f`
    /// never calls out of this module (no logging, no locks, no user code).
    #[inline(always)]
    pub(super) fn with_state<R>(&self, f: impl FnOnce(&mut LocalState) -> R) -> R {
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
    pub(super) unsafe fn take(ptr: NonNull<LocalPool>) -> Result<NonNull<u8>> {
        // SAFETY: live per the caller's contract.
        let local = unsafe { ptr.as_ref() };
        let top = match local.with_state(|st| st.hot.take().or_else(|| st.cur.pop())) {
            Some(top) => top,
            None => local.take_slow()?,
        };
        // From here the stack counts as out: the local pool stays alive at
        // least until it comes back.
        ThreadStats::bump(&local.stats.takes);
        Ok(top)
    }

    /// The current batch is empty: switch to the spare batch, refill from
    /// the global pool, or map a new stack.
    #[cold]
    #[inline(never)]
    pub(super) fn take_slow(&self) -> Result<NonNull<u8>> {
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
    pub(super) unsafe fn put(ptr: NonNull<LocalPool>, top: NonNull<u8>) {
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
    pub(super) unsafe fn put_slow(ptr: NonNull<LocalPool>, top: NonNull<u8>) {
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
    pub(super) fn put_full(&self, top: NonNull<u8>) {
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

    pub(super) fn flush(&self) {
        let (cur, spare) = self.with_state(|st| (st.take_current(), st.spare.take()));
        self.release_lists(cur, spare);
    }

    pub(super) fn release_lists(&self, cur: StackList, spare: StackList) {
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
pub(super) struct Registry(Vec<NonNull<LocalPool>>);

impl Registry {
    pub(super) fn find(&self, shared: &Arc<Shared>) -> Option<NonNull<LocalPool>> {
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
    pub(super) static REGISTRY: RefCell<Registry> = const { RefCell::new(Registry(Vec::new())) };
    /// A one-entry cache of REGISTRY: the pool (`Shared`) used last and its
    /// local pool. `const`-initialised `Cell`s without destructors, so a
    /// read is one thread-pointer-relative load with no lazy-init or
    /// liveness check. Invariant: when LAST_SHARED is non-null, LAST_LOCAL
    /// points at a LocalPool for that pool that REGISTRY owns; both are
    /// nulled before any entry leaves the registry.
    static LAST_SHARED: Cell<*const Shared> = const { Cell::new(std::ptr::null()) };
    static LAST_LOCAL: Cell<*mut LocalPool> = const { Cell::new(std::ptr::null_mut()) };
}

pub(super) fn forget_last() {
    LAST_SHARED.with(|last| last.set(std::ptr::null()));
    LAST_LOCAL.with(|last| last.set(std::ptr::null_mut()));
}

/// Removes the entries matching `pred` from this thread's registry and
/// retires them (outside the registry's borrow).
pub(super) fn unregister(pred: impl Fn(&LocalPool) -> bool) {
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
/// is made for the stack; it is freed when the stack comes back. Returns
/// the local pool and the stack's top, which the pool pairs into a
/// `PooledStack` (this file sits below that type and does not name it).
#[inline(always)]
pub(super) fn take_local(shared: &Arc<Shared>) -> Result<(NonNull<LocalPool>, NonNull<u8>)> {
    // A live Shared is never at address 0, so a null cache never matches.
    if LAST_SHARED.with(Cell::get) == Arc::as_ptr(shared) {
        let last = LAST_LOCAL.with(Cell::get);
        // SAFETY: per the cache's invariant, LAST_LOCAL is a live local pool
        // of this thread (owned by its registry), not null.
        let last = unsafe { NonNull::new_unchecked(last) };
        // SAFETY: live, per the same invariant.
        return unsafe { LocalPool::take(last) }.map(|top| (last, top));
    }
    take_registering(shared)
}

#[cold]
#[inline(never)]
pub(super) fn take_registering(shared: &Arc<Shared>) -> Result<(NonNull<LocalPool>, NonNull<u8>)> {
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
        return unsafe { LocalPool::take(local) }.map(|top| (local, top));
    }
    // Thread teardown: a retired local pool that lives as long as its stack.
    let local = LocalPool::alloc(shared, false);
    // SAFETY: live; nothing else points at it.
    let taken = unsafe { LocalPool::take(local) };
    if taken.is_err() {
        // SAFETY: allocated above, unregistered, and no stack is out.
        drop(unsafe { Box::from_raw(local.as_ptr()) });
    }
    taken.map(|top| (local, top))
}
