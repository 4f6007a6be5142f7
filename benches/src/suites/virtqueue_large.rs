//! Suite `virtqueue-large`: 32768-descriptor chain walk vs virtio-queue, preadv into a chain vs memcpy
//!
//! Not implemented yet: issue #6 adds it.

use crate::harness::{Ctx, SuiteResult};

/// One-line description.
pub const ABOUT: &str = "32768-descriptor chain walk vs virtio-queue, preadv into a chain vs memcpy (issue #6, not implemented yet)";
/// The suite is still a placeholder.
pub const READY: bool = false;

/// Refuses to run until issue #6 lands.
pub fn run(_ctx: &Ctx) -> SuiteResult {
    Err("suite virtqueue-large is not implemented yet (issue #6)".into())
}
