// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! One request path for both ring layouts: [`DeviceRing`], implemented by
//! the split ring (through [`SplitRing`]) and by [`PackedQueue`], and
//! [`AnyRing`], the enum a device keeps when the layout is only known once
//! the driver has acked its features.

use std::ops::Deref;

use virtio_queue::QueueT;
use vm_memory::GuestMemoryBackend;

use crate::packed::PackedQueue;
use crate::{Chain, ChainWalker, Error, Result};

/// The device's view of one virtqueue, whatever its layout: pop a
/// validated chain, return it, decide on notifications, save and restore
/// the ring position. A device written against this trait (or against
/// [`AnyRing`]) serves split and packed rings with one request path; the
/// [`Chain`], [`Reader`](crate::Reader) and [`Writer`](crate::Writer) are
/// the same types for both.
///
/// The method names differ from `virtio_queue::QueueT`'s so that both
/// traits can be in scope at once.
pub trait DeviceRing {
    /// Pops and validates the next chain; the outcomes are those of
    /// [`ChainWalker::pop`] (split) and of the packed implementation on
    /// [`PackedQueue`].
    fn pop_chain<M>(&mut self, walker: &mut ChainWalker, mem: M) -> Result<Option<Chain<M>>>
    where
        M: Deref + Clone,
        M::Target: GuestMemoryBackend + Sized;

    /// Returns the chain named `id` ([`Chain::head_index`]) with `len`
    /// bytes written.
    fn push_used<G: GuestMemoryBackend>(&mut self, mem: &G, id: u16, len: u32) -> Result<()>;

    /// Whether the driver wants a used buffer notification now.
    fn notify_needed<G: GuestMemoryBackend>(&mut self, mem: &G) -> Result<bool>;

    /// Asks for kicks; true if a chain became available meanwhile.
    fn enable_kicks<G: GuestMemoryBackend>(&mut self, mem: &G) -> Result<bool>;

    /// Asks the driver not to kick.
    fn disable_kicks<G: GuestMemoryBackend>(&mut self, mem: &G) -> Result<()>;

    /// The vhost-user `GET_VRING_BASE` value.
    fn ring_base(&self) -> u32;

    /// Applies a vhost-user `SET_VRING_BASE` value.
    fn set_ring_base(&mut self, base: u32) -> Result<()>;

    /// The next used position: the split ring's next used index, or the
    /// packed ring's next used slot with its wrap counter in bit 15.
    fn used_position(&self) -> u16;

    /// Passes over the next available chain without taking it (nothing
    /// is written, nothing goes in flight); `slots` is the ring slots it
    /// occupies (packed; the split ring ignores it). For a device that
    /// knows from its own records that the driver already got this chain
    /// back. False when no chain is available.
    fn skip_available<G: GuestMemoryBackend>(&mut self, mem: &G, slots: u16) -> Result<bool>;

    /// Puts chain `id` (head index or buffer id), occupying `slots` ring
    /// slots, in flight without popping it, for a device that will return
    /// a chain a previous instance popped ([`PackedQueue::adopt`]; the
    /// split ring keeps no such state and accepts any head).
    fn adopt_in_flight(&mut self, id: u16, slots: u16) -> Result<()>;
}

/// A split queue (any `virtio_queue::QueueT`, borrowed) as a [`DeviceRing`].
#[derive(Debug)]
pub struct SplitRing<'q, Q>(pub &'q mut Q);

impl<Q: QueueT> DeviceRing for SplitRing<'_, Q> {
    fn pop_chain<M>(&mut self, walker: &mut ChainWalker, mem: M) -> Result<Option<Chain<M>>>
    where
        M: Deref + Clone,
        M::Target: GuestMemoryBackend + Sized,
    {
        walker.pop(self.0, mem)
    }

    fn push_used<G: GuestMemoryBackend>(&mut self, mem: &G, id: u16, len: u32) -> Result<()> {
        self.0.add_used(mem, id, len).map_err(Error::Ring)
    }

    fn notify_needed<G: GuestMemoryBackend>(&mut self, mem: &G) -> Result<bool> {
        self.0.needs_notification(mem).map_err(Error::Ring)
    }

    fn enable_kicks<G: GuestMemoryBackend>(&mut self, mem: &G) -> Result<bool> {
        self.0.enable_notification(mem).map_err(Error::Ring)
    }

    fn disable_kicks<G: GuestMemoryBackend>(&mut self, mem: &G) -> Result<()> {
        self.0.disable_notification(mem).map_err(Error::Ring)
    }

    /// The next available index (the split ring's vhost-user encoding).
    fn ring_base(&self) -> u32 {
        u32::from(self.0.next_avail())
    }

    /// Sets the next available index (the low 16 bits), as
    /// vhost-user-backend does.
    fn set_ring_base(&mut self, base: u32) -> Result<()> {
        self.0.set_next_avail(base as u16);
        Ok(())
    }

    fn used_position(&self) -> u16 {
        self.0.next_used()
    }

    fn skip_available<G: GuestMemoryBackend>(&mut self, mem: &G, _slots: u16) -> Result<bool> {
        let avail = self
            .0
            .avail_idx(mem, std::sync::atomic::Ordering::Acquire)
            .map_err(Error::Ring)?
            .0;
        let next = self.0.next_avail();
        if avail == next {
            return Ok(false);
        }
        self.0.set_next_avail(next.wrapping_add(1));
        Ok(true)
    }

    fn adopt_in_flight(&mut self, _id: u16, _slots: u16) -> Result<()> {
        Ok(())
    }
}

impl DeviceRing for PackedQueue {
    /// Pops the next available chain of the packed queue and validates it,
    /// with the same outcomes as [`ChainWalker::pop`]:
    ///
    /// - `Ok(Some(chain))`: a valid chain; [`Chain::head_index`] is its
    ///   buffer id, for [`PackedQueue::add_used`].
    /// - `Ok(None)`: the next slot is not available (for this wrap counter).
    /// - `Err(e)` with [`Error::is_chain_fault`]: the chain was invalid,
    ///   logged (rate-limited) and its slots consumed. With a valid buffer
    ///   id it was returned with length 0; with an id out of range or
    ///   already in flight it cannot be returned (that would free another
    ///   chain) and is only skipped.
    /// - `Err(e)` otherwise: the ring is broken (a chain running into
    ///   descriptors that are not available, or never ending, or the ring
    ///   outside guest memory). Where the chain ends is unknown, so
    ///   nothing was consumed; stop using the queue until it is reset.
    fn pop_chain<M>(&mut self, walker: &mut ChainWalker, mem: M) -> Result<Option<Chain<M>>>
    where
        M: Deref + Clone,
        M::Target: GuestMemoryBackend + Sized,
    {
        crate::packed::walk::pop(self, walker, mem)
    }

    fn push_used<G: GuestMemoryBackend>(&mut self, mem: &G, id: u16, len: u32) -> Result<()> {
        self.add_used(mem, id, len)
    }

    fn notify_needed<G: GuestMemoryBackend>(&mut self, mem: &G) -> Result<bool> {
        self.needs_notification(mem)
    }

    fn enable_kicks<G: GuestMemoryBackend>(&mut self, mem: &G) -> Result<bool> {
        self.enable_notification(mem)
    }

    fn disable_kicks<G: GuestMemoryBackend>(&mut self, mem: &G) -> Result<()> {
        self.disable_notification(mem)
    }

    fn ring_base(&self) -> u32 {
        PackedQueue::ring_base(self)
    }

    fn set_ring_base(&mut self, base: u32) -> Result<()> {
        PackedQueue::set_ring_base(self, base)
    }

    fn used_position(&self) -> u16 {
        let (slot, wrap) = self.next_used();
        crate::packed::encode_position(slot, wrap)
    }

    fn skip_available<G: GuestMemoryBackend>(&mut self, mem: &G, slots: u16) -> Result<bool> {
        PackedQueue::skip_available(self, mem, slots)
    }

    fn adopt_in_flight(&mut self, id: u16, slots: u16) -> Result<()> {
        self.adopt(id, slots)
    }
}

/// A borrowed queue of either layout, chosen at run time (from
/// `VIRTIO_F_RING_PACKED` in the acked features).
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyRing<'q, Q> {
    /// A split ring.
    Split(&'q mut Q),
    /// A packed ring.
    Packed(&'q mut PackedQueue),
}

macro_rules! each {
    ($self:ident, $r:ident => $e:expr) => {
        match $self {
            AnyRing::Split(q) => {
                let mut $r = SplitRing(&mut **q);
                $e
            }
            AnyRing::Packed($r) => $e,
        }
    };
}

impl<Q: QueueT> DeviceRing for AnyRing<'_, Q> {
    fn pop_chain<M>(&mut self, walker: &mut ChainWalker, mem: M) -> Result<Option<Chain<M>>>
    where
        M: Deref + Clone,
        M::Target: GuestMemoryBackend + Sized,
    {
        each!(self, r => r.pop_chain(walker, mem))
    }

    fn push_used<G: GuestMemoryBackend>(&mut self, mem: &G, id: u16, len: u32) -> Result<()> {
        each!(self, r => r.push_used(mem, id, len))
    }

    fn notify_needed<G: GuestMemoryBackend>(&mut self, mem: &G) -> Result<bool> {
        each!(self, r => r.notify_needed(mem))
    }

    fn enable_kicks<G: GuestMemoryBackend>(&mut self, mem: &G) -> Result<bool> {
        each!(self, r => r.enable_kicks(mem))
    }

    fn disable_kicks<G: GuestMemoryBackend>(&mut self, mem: &G) -> Result<()> {
        each!(self, r => r.disable_kicks(mem))
    }

    fn ring_base(&self) -> u32 {
        match self {
            AnyRing::Split(q) => u32::from(q.next_avail()),
            AnyRing::Packed(q) => q.ring_base(),
        }
    }

    fn set_ring_base(&mut self, base: u32) -> Result<()> {
        each!(self, r => r.set_ring_base(base))
    }

    fn used_position(&self) -> u16 {
        match self {
            AnyRing::Split(q) => q.next_used(),
            AnyRing::Packed(q) => DeviceRing::used_position(&**q),
        }
    }

    fn skip_available<G: GuestMemoryBackend>(&mut self, mem: &G, slots: u16) -> Result<bool> {
        each!(self, r => r.skip_available(mem, slots))
    }

    fn adopt_in_flight(&mut self, id: u16, slots: u16) -> Result<()> {
        each!(self, r => r.adopt_in_flight(id, slots))
    }
}
