// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Stackful coroutines on pooled, guard-paged stacks that never exhaust
//! `vm.max_map_count`.
//!
//! Every coroutine stack is an `mmap` with a guard page below it: two VMAs
//! with `mprotect`, one with `MADV_GUARD_INSTALL` (Linux 6.13+, probed once,
//! `mprotect` otherwise). A server that keeps thousands of requests in flight
//! needs a pool of such stacks, and a pool that grows without bound per
//! thread runs into the kernel's mapping limit, where QEMU used to abort.
//! This crate bounds the pool by demand and by the mapping budget, gives
//! memory back after bursts, and reports every failure as an [`Error`].
//!
//! - [`StackPool`] / [`PoolConfig`]: per-thread local pools of at most two
//!   batches (default 128 stacks each), a global pool of batches behind one
//!   lock, batch moves in both directions (QEMU's 2024 design). The global
//!   maximum is `min(base + reserved, budget)`: [`StackPool::reserve`]
//!   returns a [`Reservation`] that raises it while it lives (and frees the
//!   global stacks above the lowered maximum when it ends).
//! - [`ProcessBudget`]: one mapping budget for the whole process, shared by
//!   every pool (the crate's one deliberate global, made lazily:
//!   `vm.max_map_count` is a per-process limit). It comes from
//!   `/proc/sys/vm/max_map_count` (read lazily, 5000 VMAs kept for the rest
//!   of the process, a documented fallback when the file is unreadable),
//!   counts what the pools actually map (1 or 2 VMAs per stack) and, from
//!   `/proc/self/maps`, what the rest of the process maps. A sandboxed
//!   process hands both in before `/proc` goes ([`MapsSource`],
//!   [`ProcessBudget::with_maps`], [`ProcessBudget::set_process`]). It caps the
//!   stacks in use, so creation fails with [`Error::BudgetExhausted`] in
//!   every pool before the kernel refuses; a pool may have a share of its
//!   own ([`PoolConfig::budget_share`]); [`MapBudget`] is one pool's view.
//! - [`StackPool::trim`] and an optional background trimmer
//!   ([`PoolConfig::trim_interval`]; [`DEFAULT_TRIM_INTERVAL`] for servers
//!   with bursts) free idle stacks above the recent peak of demand (the
//!   2021 resize-to-demand idea); [`IdlePages::Release`]
//!   drops the pages of stacks parked in the global pool.
//! - [`Coroutine`]: resume/yield with a return value, built on `corosensei`.
//!   Its stack goes back to the pool when it returns or is dropped.
//! - [`Stats`]: live coroutines, pooled stacks (local and global), stacks
//!   created, reused and freed, VMAs held by the pool and by all pools of
//!   the process, the budget's limit, trim passes.
//! - `Policy::UnboundedPerThread` (QEMU before 2024) and `Policy::NoPool`
//!   (one `mmap` per coroutine) for comparison, with the `bench-policies`
//!   feature (meant for benchmarks, not for production).
//!
//! # Example
//!
//! ```
//! use coro_pool::{Coroutine, CoroutineResult, PoolConfig, StackPool};
//!
//! let pool = StackPool::new(PoolConfig::default().stack_size(64 << 10))?;
//! // Up to 1024 requests in flight: keep that many stacks pooled.
//! let _demand = pool.reserve(1024);
//!
//! let mut co = Coroutine::new_in(&pool, |yielder, first: u32| {
//!     // Hand a blocking call to a worker, wait for its result.
//!     let reply: u32 = yielder.suspend(first * 2);
//!     reply + 1
//! })?;
//! assert!(matches!(co.resume(21), CoroutineResult::Yield(42)));
//! assert!(matches!(co.resume(99), CoroutineResult::Return(100)));
//!
//! // The finished coroutine's stack is back in this thread's local pool.
//! let stats = pool.stats();
//! assert_eq!(stats.live_coroutines, 0);
//! assert_eq!(stats.pooled_local, 1);
//! # Ok::<(), coro_pool::Error>(())
//! ```
//!
//! # Stack overflow
//!
//! Overflowing a coroutine stack touches its guard region and raises
//! `SIGSEGV`, which kills the process as a thread-stack overflow would.
//! Memory next to the stack is never written: Rust's stack probes make large
//! frames touch the guard first. See [`Coroutine`].
//!
//! # Platforms
//!
//! Linux on x86_64 and aarch64 (any architecture `corosensei` supports
//! should work). Other Unix systems build with `mprotect` guards and the
//! fallback budget.

#![cfg(unix)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod budget;
mod config;
mod coroutine;
mod pool;
mod stack;

use std::io;

// The README is the crate's crates.io page: its example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme_doctest {}

pub use budget::{
    BudgetCheck, BudgetOrigin, BudgetStats, MapBudget, MapsSource, MaxMapCount, ProcessBudget,
    DEFAULT_VMA_RESERVE, FALLBACK_MAX_MAP_COUNT, MAX_MAP_COUNT_PATH,
};
pub use config::{
    GuardMode, IdlePages, Policy, PoolConfig, DEFAULT_BATCH_SIZE, DEFAULT_STACK_SIZE,
    DEFAULT_TRIM_INTERVAL, MAX_BATCH_SIZE, MAX_GUARD_PAGES, MAX_STACK_SIZE,
};
// corosensei's own types, re-exported on purpose: a coroutine body receives
// corosensei's `Yielder` (wrapping it would add a call to every suspend, the
// hot path this crate is measured on) and `resume` returns its
// `CoroutineResult`. corosensei is thus a public dependency: a breaking
// release of it is a breaking release of this crate.
pub use corosensei::{CoroutineResult, Yielder};
pub use coroutine::Coroutine;
pub use pool::{PooledStack, Reservation, StackId, StackPool, Stats};
pub use stack::{guard_install_supported, GuardKind};

/// Errors of this crate. Stack exhaustion is always reported, never an abort.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `mmap` of a stack failed (typically `ENOMEM`: `vm.max_map_count`,
    /// `RLIMIT_AS` or overcommit limits).
    #[error("failed to map a {size}-byte coroutine stack: {source}")]
    Mmap {
        /// Bytes requested, guard included.
        size: usize,
        /// The OS error.
        source: io::Error,
    },
    /// The guard page could not be set up (`ENOMEM` when splitting the
    /// mapping would exceed `vm.max_map_count`).
    #[error("failed to set up the coroutine stack guard page with {method}: {source}")]
    Guard {
        /// The mechanism that failed.
        method: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The pool already holds as many stacks as the process-wide mapping
    /// budget (shared by every pool) or its own share allows.
    #[error(
        "coroutine stack budget exhausted: {held} stacks held, at most {max_stacks} allowed \
         (vm.max_map_count {max_map_count}, {reserved_vmas} VMAs reserved, \
         {vmas_per_stack} per stack; all pools hold {pool_vmas} of {limit_vmas} VMAs, \
         {foreign_vmas} other mappings)"
    )]
    BudgetExhausted {
        /// Stacks this pool held when the request came.
        held: usize,
        /// Stacks this pool could hold at that moment: its share, or what
        /// it held plus what the shared budget had left.
        max_stacks: usize,
        /// VMAs all pools of the budget held.
        pool_vmas: u64,
        /// VMAs all pools of the budget may hold together.
        limit_vmas: u64,
        /// Mappings of the process no pool holds, as last measured.
        foreign_vmas: u64,
        /// VMAs per stack.
        vmas_per_stack: usize,
        /// The `vm.max_map_count` used.
        max_map_count: u64,
        /// VMAs kept free for the rest of the process.
        reserved_vmas: u64,
    },
    /// A [`PoolConfig`] value is out of range.
    #[error("invalid coroutine pool configuration: {0}")]
    InvalidConfig(String),
    /// [`GuardMode::GuardInstall`] was required but the kernel lacks it.
    #[error("MADV_GUARD_INSTALL is not supported by this kernel (Linux 6.13 or later needed)")]
    GuardInstallUnsupported,
    /// The background trimmer thread could not be started.
    #[error("failed to start the coroutine pool trimmer thread: {0}")]
    Trimmer(#[source] io::Error),
    /// [`Coroutine::try_resume`] on a coroutine that has already returned.
    #[error("the coroutine has already returned")]
    Finished,
}

impl Error {
    /// The OS error number behind the error, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Mmap { source, .. } | Error::Guard { source, .. } | Error::Trimmer(source) => {
                source.raw_os_error()
            }
            _ => None,
        }
    }
}

/// This crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
