// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The stack pool: per-thread local pools of at most two batches, a global
//! pool of batches behind one lock, demand reservations, the mapping budget,
//! trimming and statistics.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::budget::{BudgetStats, MapBudget, ProcessBudget};
use crate::config::{
    GuardMode, Policy, PoolConfig, MAX_BATCH_SIZE, MAX_GUARD_PAGES, MAX_STACK_SIZE,
};
use crate::stack::{self, GuardKind, Layout};
use crate::{Error, Result};

mod global;
mod local;
mod pooled_stack;
mod reservation;

pub(crate) use global::Shared;
use global::{lock, Global, Hot};
use local::{take_local, unregister, REGISTRY};
pub(crate) use pooled_stack::StackBounds;
pub use pooled_stack::{PooledStack, StackId};
pub use reservation::Reservation;

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
        let (local, top) = take_local(&self.shared)?;
        Ok(PooledStack { top, local })
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
