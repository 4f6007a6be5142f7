// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A stack taken from a pool, and its bounds.

use std::num::NonZeroUsize;
use std::ptr::NonNull;

use super::local::LocalPool;
use crate::stack::Layout;

/// The identity of a stack (its top address), for checking reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(pub usize);

/// A stack taken from a [`StackPool`]. Dropping it returns it to the pool
/// (to this thread's local pool, or unmaps it under `Policy::NoPool`).
///
/// It implements [`corosensei::stack::Stack`], so it can also back a
/// `corosensei::Coroutine` directly. It is neither `Send` nor `Sync`: it
/// belongs to the thread's local pool.
///
/// [`StackPool`]: crate::StackPool
pub struct PooledStack {
    pub(super) top: NonNull<u8>,
    /// The local pool it was taken from, kept alive while the stack is out.
    pub(super) local: NonNull<LocalPool>,
}

impl std::fmt::Debug for PooledStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledStack")
            .field("id", &self.id())
            .field("usable_size", &self.usable_size())
            .finish()
    }
}

impl PooledStack {
    /// The stack's identity (its top address).
    #[inline]
    pub fn id(&self) -> StackId {
        StackId(self.top.as_ptr() as usize)
    }

    /// Usable bytes (above the guard).
    pub fn usable_size(&self) -> usize {
        self.layout().usable_len
    }

    /// Bytes of the guard region below the usable part.
    pub fn guard_size(&self) -> usize {
        self.layout().guard_len
    }

    #[inline(always)]
    pub(super) fn layout(&self) -> &Layout {
        // SAFETY: a local pool outlives every stack taken from it.
        &unsafe { self.local.as_ref() }.shared.layout
    }
}

impl Drop for PooledStack {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: the local pool the stack was taken from, on this thread
        // (PooledStack is !Send); the stack is out until this put.
        unsafe { LocalPool::put(self.local, self.top) };
    }
}

impl PooledStack {
    /// Gives back the stack held in `slot`, leaving `None`. Same as
    /// `drop(slot.take())`, but it reads the two words one at a time: moved
    /// as a whole, the pair is copied with one 16-byte load of two 8-byte
    /// stores made a moment before, which the CPU cannot forward (a stall
    /// of a dozen cycles per coroutine).
    #[inline(always)]
    pub(crate) fn give_back(slot: &mut Option<PooledStack>) {
        if let Some(stack) = slot.as_ref() {
            let (local, top) = (stack.local, stack.top);
            // SAFETY: overwrites the PooledStack without dropping it; its
            // stack is put back right below, exactly once.
            unsafe { std::ptr::write(slot, None) };
            // SAFETY: as in PooledStack::drop.
            unsafe { LocalPool::put(local, top) };
        }
    }

    /// The bounds of this stack, for a coroutine that runs on it while the
    /// `PooledStack` itself is kept next to the coroutine.
    #[inline(always)]
    pub(crate) fn bounds(&self) -> StackBounds {
        StackBounds {
            top: self.top,
            local: self.local,
        }
    }
}

// SAFETY: the bounds are those of the stack this PooledStack owns (see
// StackBounds), and the mapping stays valid until it is dropped.
unsafe impl corosensei::stack::Stack for PooledStack {
    #[inline]
    fn base(&self) -> corosensei::stack::StackPointer {
        self.bounds().base()
    }

    #[inline]
    fn limit(&self) -> corosensei::stack::StackPointer {
        self.bounds().limit()
    }
}

/// The bounds of a [`PooledStack`] without its ownership: what a
/// [`Coroutine`](crate::Coroutine) runs on while it holds the
/// `PooledStack` itself, so that it can give the stack back the moment the
/// coroutine returns.
#[derive(Clone, Copy)]
pub(crate) struct StackBounds {
    pub(super) top: NonNull<u8>,
    pub(super) local: NonNull<LocalPool>,
}

// SAFETY: base() is the top of a mapping of mmap_len bytes whose lowest
// guard_len bytes are inaccessible (MADV_GUARD_INSTALL or PROT_NONE), limit()
// is the start of that mapping, both are page aligned (so aligned to
// STACK_ALIGNMENT), and the usable part is at least MIN_STACK_SIZE bytes
// (checked when the pool is built). The holder of the bounds keeps the
// PooledStack, and with it the mapping and its local pool, alive for as long
// as a coroutine may run on them.
unsafe impl corosensei::stack::Stack for StackBounds {
    #[inline]
    fn base(&self) -> corosensei::stack::StackPointer {
        // SAFETY: the top of a mapping is never address 0.
        unsafe { NonZeroUsize::new_unchecked(self.top.as_ptr() as usize) }
    }

    #[inline]
    fn limit(&self) -> corosensei::stack::StackPointer {
        // SAFETY: the local pool outlives the stack (see above).
        let layout = &unsafe { self.local.as_ref() }.shared.layout;
        let start = self.top.as_ptr() as usize - layout.mmap_len();
        // SAFETY: a mapping never starts at address 0 (mmap_min_addr).
        unsafe { NonZeroUsize::new_unchecked(start) }
    }
}
