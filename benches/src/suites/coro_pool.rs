//! Suite `coro-pool`: coroutine lifecycle and pool VMAs vs mmap-per-coroutine, bare corosensei and QEMU's unbounded pool
//!
//! Not implemented yet: issue #3 adds it.

use crate::harness::{Ctx, SuiteResult};

/// One-line description.
pub const ABOUT: &str = "coroutine lifecycle and pool VMAs vs mmap-per-coroutine, bare corosensei and QEMU's unbounded pool (issue #3, not implemented yet)";
/// The suite is still a placeholder.
pub const READY: bool = false;

/// Refuses to run until issue #3 lands.
pub fn run(_ctx: &Ctx) -> SuiteResult {
    Err("suite coro-pool is not implemented yet (issue #3)".into())
}
