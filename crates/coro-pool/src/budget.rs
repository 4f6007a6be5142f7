//! The mapping budget: how many stacks a pool may hold before it would push
//! the process towards `vm.max_map_count`.

use std::path::{Path, PathBuf};

use crate::stack::GuardKind;

/// The kernel's default `vm.max_map_count` (`DEFAULT_MAX_MAP_COUNT`), assumed
/// when `/proc/sys/vm/max_map_count` cannot be read (for example under an
/// AppArmor profile that hides it). Assuming the default is safe: raising the
/// sysctl is the only common change, and it only makes the real limit larger.
pub const FALLBACK_MAX_MAP_COUNT: u64 = 65_530;

/// VMAs left for everything else in the process (libraries, thread stacks,
/// malloc arenas, guest memory regions, vhost-user mappings), as in QEMU.
pub const DEFAULT_VMA_RESERVE: u64 = 5_000;

/// Where `/proc/sys/vm/max_map_count` lives.
pub const MAX_MAP_COUNT_PATH: &str = "/proc/sys/vm/max_map_count";

/// Where a pool learns `vm.max_map_count`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaxMapCount {
    /// Read [`MAX_MAP_COUNT_PATH`] the first time the budget is needed.
    Proc,
    /// Read this file instead (tests, containers with a different layout).
    File(PathBuf),
    /// Use this value; nothing is read.
    Fixed(u64),
}

/// Where a budget's `max_map_count` came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetOrigin {
    /// Read from the sysctl file.
    Read,
    /// Given in the configuration.
    Injected,
    /// The file could not be read or parsed: [`FALLBACK_MAX_MAP_COUNT`].
    Fallback,
}

/// The mapping budget of one pool.
///
/// `max_stacks = (max_map_count - reserve) / vmas_per_stack`, where the
/// reserve is the configured one (5000 by default, as QEMU) but at most half
/// of `max_map_count`, so that a tiny limit still leaves some stacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapBudget {
    /// The `vm.max_map_count` the budget is based on.
    pub max_map_count: u64,
    /// Where that value came from.
    pub origin: BudgetOrigin,
    /// VMAs kept free for the rest of the process.
    pub reserved_vmas: u64,
    /// VMAs one stack costs (1 with `MADV_GUARD_INSTALL`, 2 with `mprotect`).
    pub vmas_per_stack: usize,
    /// Stacks the pool may hold in total (running and idle).
    pub max_stacks: usize,
}

impl MapBudget {
    /// Computes a budget. `max_map_count` is `None` when it could not be
    /// read; the documented fallback is used then, never "unbounded".
    pub fn compute(max_map_count: Option<u64>, reserve: u64, guard: GuardKind) -> MapBudget {
        Self::compute_with_origin(
            max_map_count.map(|v| (v, BudgetOrigin::Read)),
            reserve,
            guard,
        )
    }

    pub(crate) fn compute_with_origin(
        value: Option<(u64, BudgetOrigin)>,
        reserve: u64,
        guard: GuardKind,
    ) -> MapBudget {
        let (max_map_count, origin) =
            value.unwrap_or((FALLBACK_MAX_MAP_COUNT, BudgetOrigin::Fallback));
        let reserved_vmas = reserve.min(max_map_count / 2);
        let vmas_per_stack = guard.vmas_per_stack();
        let stacks = (max_map_count - reserved_vmas) / vmas_per_stack as u64;
        MapBudget {
            max_map_count,
            origin,
            reserved_vmas,
            vmas_per_stack,
            max_stacks: usize::try_from(stacks).unwrap_or(usize::MAX),
        }
    }
}

/// Resolves a [`MaxMapCount`] source to a value and its origin, or `None`
/// when a file cannot be read or parsed (logged as a warning).
pub(crate) fn resolve(source: &MaxMapCount) -> Option<(u64, BudgetOrigin)> {
    match source {
        MaxMapCount::Fixed(v) => Some((*v, BudgetOrigin::Injected)),
        MaxMapCount::Proc => read_file(Path::new(MAX_MAP_COUNT_PATH)),
        MaxMapCount::File(path) => read_file(path),
    }
}

fn read_file(path: &Path) -> Option<(u64, BudgetOrigin)> {
    match std::fs::read_to_string(path) {
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(v) => Some((v, BudgetOrigin::Read)),
            Err(e) => {
                log::warn!(
                    "coro-pool: cannot parse {}: {e}; assuming vm.max_map_count = {FALLBACK_MAX_MAP_COUNT}",
                    path.display()
                );
                None
            }
        },
        Err(e) => {
            log::warn!(
                "coro-pool: cannot read {}: {e}; assuming vm.max_map_count = {FALLBACK_MAX_MAP_COUNT}",
                path.display()
            );
            None
        }
    }
}
