// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Pool configuration.

use std::sync::Arc;
use std::time::Duration;

use crate::budget::{MaxMapCount, ProcessBudget, DEFAULT_VMA_RESERVE};

/// Default usable stack size: 1 MiB, as QEMU.
pub const DEFAULT_STACK_SIZE: usize = 1 << 20;
/// Default number of stacks moved between a thread and the global pool at once.
pub const DEFAULT_BATCH_SIZE: usize = 128;
/// Largest accepted stack size (1 GiB).
pub const MAX_STACK_SIZE: usize = 1 << 30;
/// Largest accepted batch size.
pub const MAX_BATCH_SIZE: usize = 1 << 16;
/// Largest accepted guard region, in pages.
pub const MAX_GUARD_PAGES: usize = 64;
/// The trim interval for servers whose demand comes in bursts (what the
/// 9p daemon uses): one second. A trim pass with nothing to free costs a
/// few atomic loads and one count of `/proc/self/maps`, and a burst's idle
/// stacks are gone two passes after it ends. [`PoolConfig`]'s own default is
/// no trimmer thread: a library spawns no thread unless asked.
pub const DEFAULT_TRIM_INTERVAL: Duration = Duration::from_secs(1);

/// How a pool keeps idle stacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Policy {
    /// The default: per-thread local pools of at most two batches, a global
    /// pool bounded by demand and by the mapping budget, and trimming.
    #[default]
    Bounded,
    /// QEMU before 2024, for comparison (feature `bench-policies`, for
    /// benchmarks only): every thread keeps every stack it
    /// ever released, without limit and without a global pool, until the
    /// thread exits. No mapping budget is enforced, so the kernel's limit is
    /// what stops it.
    #[cfg(feature = "bench-policies")]
    #[cfg_attr(docsrs, doc(cfg(feature = "bench-policies")))]
    UnboundedPerThread,
    /// No pooling: each coroutine maps its stack and unmaps it when done.
    /// The mapping budget is still enforced. For comparison (feature
    /// `bench-policies`, for benchmarks only).
    #[cfg(feature = "bench-policies")]
    #[cfg_attr(docsrs, doc(cfg(feature = "bench-policies")))]
    NoPool,
}

impl Policy {
    /// `UnboundedPerThread`, which exists only with `bench-policies`.
    pub(crate) fn is_unbounded_per_thread(self) -> bool {
        #[cfg(feature = "bench-policies")]
        if self == Policy::UnboundedPerThread {
            return true;
        }
        false
    }

    /// `NoPool`, which exists only with `bench-policies`.
    pub(crate) fn is_no_pool(self) -> bool {
        #[cfg(feature = "bench-policies")]
        if self == Policy::NoPool {
            return true;
        }
        false
    }
}

/// Which guard mechanism new stacks use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum GuardMode {
    /// `MADV_GUARD_INSTALL` when the kernel supports it (probed once),
    /// `mprotect` otherwise.
    #[default]
    Auto,
    /// Require `MADV_GUARD_INSTALL`; creating the pool fails without it.
    GuardInstall,
    /// Always `mprotect`: two VMAs per stack, as QEMU.
    Mprotect,
}

/// What happens to the memory of idle stacks in the global pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum IdlePages {
    /// Keep the pages: reuse is free of page faults.
    #[default]
    Keep,
    /// `MADV_DONTNEED` a stack's pages (all but its top page) when its batch
    /// moves to the global pool, so idle stacks cost address space and VMAs
    /// but little memory. Stacks in thread-local pools keep their pages.
    Release,
}

/// Settings of a [`StackPool`](crate::StackPool). Build it with the setters:
///
/// ```
/// use coro_pool::{PoolConfig, Policy};
/// let config = PoolConfig::default()
///     .stack_size(256 << 10)
///     .batch_size(64)
///     .policy(Policy::Bounded);
/// assert_eq!(config.get_stack_size(), 256 << 10);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PoolConfig {
    pub(crate) stack_size: usize,
    pub(crate) guard_pages: usize,
    pub(crate) batch_size: usize,
    pub(crate) base_max: usize,
    pub(crate) policy: Policy,
    pub(crate) guard: GuardMode,
    pub(crate) idle_pages: IdlePages,
    pub(crate) max_map_count: MaxMapCount,
    pub(crate) vma_reserve: u64,
    pub(crate) trim_interval: Option<Duration>,
    pub(crate) budget: Option<Arc<ProcessBudget>>,
    pub(crate) budget_share: Option<usize>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            stack_size: DEFAULT_STACK_SIZE,
            guard_pages: 1,
            batch_size: DEFAULT_BATCH_SIZE,
            base_max: DEFAULT_BATCH_SIZE,
            policy: Policy::Bounded,
            guard: GuardMode::Auto,
            idle_pages: IdlePages::Keep,
            max_map_count: MaxMapCount::Proc,
            vma_reserve: DEFAULT_VMA_RESERVE,
            trim_interval: None,
            budget: None,
            budget_share: None,
        }
    }
}

impl PoolConfig {
    /// Usable bytes per stack, rounded up to whole pages (default 1 MiB,
    /// at least 4 KiB, at most [`MAX_STACK_SIZE`]).
    pub fn stack_size(mut self, bytes: usize) -> Self {
        self.stack_size = bytes;
        self
    }

    /// Guard pages below each stack (default 1, at most [`MAX_GUARD_PAGES`]).
    /// Rust inserts stack probes for frames larger than a page, so one page
    /// is enough to catch every overflow.
    pub fn guard_pages(mut self, pages: usize) -> Self {
        self.guard_pages = pages;
        self
    }

    /// Stacks per batch (default 128, as QEMU). A thread keeps at most two
    /// batches locally.
    pub fn batch_size(mut self, stacks: usize) -> Self {
        self.batch_size = stacks;
        self
    }

    /// The global pool's maximum before any reservation (default: one batch,
    /// as QEMU). Reservations add to it.
    pub fn base_max(mut self, stacks: usize) -> Self {
        self.base_max = stacks;
        self
    }

    /// The pooling policy (default [`Policy::Bounded`]).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// The guard mechanism (default [`GuardMode::Auto`]).
    pub fn guard(mut self, guard: GuardMode) -> Self {
        self.guard = guard;
        self
    }

    /// What idle stacks in the global pool do with their pages (default
    /// [`IdlePages::Keep`]).
    pub fn idle_pages(mut self, idle: IdlePages) -> Self {
        self.idle_pages = idle;
        self
    }

    /// The mapping budget the pool draws from (default: the process-wide
    /// [`ProcessBudget::process`], shared by every pool that names no
    /// other). Pass one `Arc` to several pools to make them share a budget
    /// of their own.
    pub fn budget(mut self, budget: Arc<ProcessBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// A cap of the pool's own, in stacks, inside the shared budget
    /// (default: none, the pool may take whatever the budget has left).
    /// Creation beyond it fails with
    /// [`Error::BudgetExhausted`](crate::Error::BudgetExhausted) even while
    /// the budget has room for other pools.
    pub fn budget_share(mut self, stacks: Option<usize>) -> Self {
        self.budget_share = stacks;
        self
    }

    /// Where `vm.max_map_count` comes from (default: read `/proc` lazily).
    /// Setting this or [`PoolConfig::vma_reserve`] (without
    /// [`PoolConfig::budget`]) gives the pool a **private**
    /// [`ProcessBudget`] of its own, not shared with other pools: meant for
    /// tests and for simulating a limit.
    pub fn max_map_count(mut self, source: MaxMapCount) -> Self {
        self.max_map_count = source;
        self
    }

    /// VMAs kept free for the rest of the process (default 5000). Like
    /// [`PoolConfig::max_map_count`], a value other than the default gives
    /// the pool a private budget.
    pub fn vma_reserve(mut self, vmas: u64) -> Self {
        self.vma_reserve = vmas;
        self
    }

    /// The budget a pool built from this configuration draws from.
    pub(crate) fn resolve_budget(&self) -> Arc<ProcessBudget> {
        match &self.budget {
            Some(b) => Arc::clone(b),
            None if self.max_map_count != MaxMapCount::Proc
                || self.vma_reserve != DEFAULT_VMA_RESERVE =>
            {
                ProcessBudget::new(self.max_map_count.clone(), self.vma_reserve)
            }
            None => Arc::clone(ProcessBudget::process()),
        }
    }

    /// Runs a background thread that calls [`StackPool::trim`](crate::StackPool::trim)
    /// at this interval (default: none; [`DEFAULT_TRIM_INTERVAL`] is the
    /// recommended period for servers with bursts).
    pub fn trim_interval(mut self, interval: Option<Duration>) -> Self {
        self.trim_interval = interval;
        self
    }

    /// The configured usable stack size, before page rounding.
    pub fn get_stack_size(&self) -> usize {
        self.stack_size
    }

    /// The configured policy.
    pub fn get_policy(&self) -> Policy {
        self.policy
    }

    /// The configured batch size.
    pub fn get_batch_size(&self) -> usize {
        self.batch_size
    }
}
