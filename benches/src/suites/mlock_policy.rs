//! Suite `mlock-policy`: RSS under off/on/on-fault vs QEMU
//!
//! Not implemented yet: issue #5 adds it.

use crate::harness::{Ctx, SuiteResult};

/// One-line description.
pub const ABOUT: &str = "RSS under off/on/on-fault vs QEMU (issue #5, not implemented yet)";
/// The suite is still a placeholder.
pub const READY: bool = false;

/// Refuses to run until issue #5 lands.
pub fn run(_ctx: &Ctx) -> SuiteResult {
    Err("suite mlock-policy is not implemented yet (issue #5)".into())
}
