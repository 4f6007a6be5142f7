// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Demand reservations: the pool's global maximum is raised while one
//! lives.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::global::Shared;

/// A demand reservation: while it lives, the pool's global maximum is
/// raised by its size (within the mapping budget). Dropping it lowers the
/// maximum again and frees, right away and on the dropping thread, the
/// idle stacks of the global pool above the lowered maximum (oldest batches
/// first), so the memory and VMAs of a burst go back as soon as its demand
/// ends, without waiting for [`StackPool::trim`]. Stacks in use and
/// thread-local pools are not touched.
///
/// [`StackPool::trim`]: crate::StackPool::trim
#[must_use = "the reservation ends when the handle is dropped"]
#[derive(Debug)]
pub struct Reservation {
    pub(super) shared: Arc<Shared>,
    pub(super) stacks: usize,
}

impl Reservation {
    /// Stacks this reservation adds to the pool's maximum.
    pub fn stacks(&self) -> usize {
        self.stacks
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.stacks == 0 {
            return;
        }
        self.shared
            .hot
            .reserved
            .fetch_sub(self.stacks, Ordering::Relaxed);
        self.shared.shrink_to_max();
    }
}
