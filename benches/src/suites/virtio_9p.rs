//! Suite `virtio-9p`: 9P request costs vs crosvm p9 and diod, msize vs throughput
//!
//! Not implemented yet: issue #7 and #8 adds it.

use crate::harness::{Ctx, SuiteResult};

/// One-line description.
pub const ABOUT: &str = "9P request costs vs crosvm p9 and diod, msize vs throughput (issue #7 and #8, not implemented yet)";
/// The suite is still a placeholder.
pub const READY: bool = false;

/// Refuses to run until issue #7 and #8 lands.
pub fn run(_ctx: &Ctx) -> SuiteResult {
    Err("suite virtio-9p is not implemented yet (issue #7 and #8)".into())
}
