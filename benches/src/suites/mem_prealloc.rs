//! Suite `mem-prealloc`: preallocation GiB/s by threads vs MAP_POPULATE and QEMU
//!
//! Not implemented yet: issue #4 adds it.

use crate::harness::{Ctx, SuiteResult};

/// One-line description.
pub const ABOUT: &str =
    "preallocation GiB/s by threads vs MAP_POPULATE and QEMU (issue #4, not implemented yet)";
/// The suite is still a placeholder.
pub const READY: bool = false;

/// Refuses to run until issue #4 lands.
pub fn run(_ctx: &Ctx) -> SuiteResult {
    Err("suite mem-prealloc is not implemented yet (issue #4)".into())
}
