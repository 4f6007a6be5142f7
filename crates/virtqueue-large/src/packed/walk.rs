// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Popping a packed chain: its slots in the ring (or its indirect table)
//! through the same [`Acc`] as split chains, then the ring moves on. The
//! entry point is `DeviceRing::pop_chain` on [`PackedQueue`].
//!
//! Dependencies run one way: this module uses the walk's pieces
//! (`crate::walk`) and its parent's ring state; the walk names neither.

use std::ops::Deref;

use vm_memory::GuestMemoryBackend;

use super::{advance, is_avail, PackedQueue, DESC_SIZE};
use crate::walk::{
    open_table, walk_packed_table, Acc, Summary, Table, F_INDIRECT, F_NEXT, F_WRITE,
};
use crate::{Chain, ChainWalker, Error, Result};

/// How a packed chain sits in the ring: slots occupied and the buffer id
/// of its last descriptor.
#[derive(Debug, Clone, Copy)]
struct Extent {
    slots: u16,
    id: u16,
}

#[cold]
fn not_available(slot: u16, position: u32, wrap: bool) -> Error {
    Error::DescriptorNotAvailable {
        slot,
        position,
        wrap,
    }
}

/// The outcome of a content fault: the fault with the chain's extent, or
/// the structure error that hides the extent.
#[cold]
#[inline(never)]
fn with_extent<G, B>(
    e: Error,
    mem: &G,
    ring: &Table<'_, B>,
    q: &PackedQueue,
) -> (Error, Option<Extent>)
where
    G: GuestMemoryBackend,
    B: vm_memory::bitmap::BitmapSlice,
{
    match chain_extent(mem, ring, q) {
        Ok(extent) => (e, Some(extent)),
        Err(structure) => (structure, None),
    }
}

/// Follows the NEXT flags from the head to find where a chain ends,
/// checking only availability: where a faulty chain must be skipped to.
fn chain_extent<G, B>(mem: &G, ring: &Table<'_, B>, q: &PackedQueue) -> Result<Extent>
where
    G: GuestMemoryBackend,
    B: vm_memory::bitmap::BitmapSlice,
{
    let size = q.size();
    let (mut slot, mut wrap) = q.next_avail();
    for position in 0..u32::from(size) {
        let desc = ring.read(mem, slot)?;
        let flags = desc.word14;
        if position > 0 && !is_avail(flags, wrap) {
            return Err(Error::DescriptorNotAvailable {
                slot,
                position,
                wrap,
            });
        }
        if flags & F_NEXT == 0 {
            return Ok(Extent {
                slots: position as u16 + 1,
                id: desc.word12,
            });
        }
        (slot, wrap) = advance(slot, wrap, 1, size);
    }
    Err(Error::ChainUnterminated { queue_size: size })
}

/// The validating walk of the packed chain at the queue's next available
/// slot. `Err((e, None))`: the ring structure is broken (nothing to
/// consume); `Err((e, Some(extent)))`: the chain is faulty, skip `extent`.
fn walk_packed<G, B>(
    mem: &G,
    limits: &crate::ChainLimits,
    ring: &Table<'_, B>,
    q: &PackedQueue,
    out: &mut Vec<crate::Segment>,
) -> std::result::Result<(Extent, Summary), (Error, Option<Extent>)>
where
    G: GuestMemoryBackend,
    B: vm_memory::bitmap::BitmapSlice,
{
    out.clear();
    let size = q.size();
    let mut acc = Acc::new(limits, size);
    let (mut slot, mut wrap) = q.next_avail();
    // Content errors need the chain's extent; structure errors end the walk.
    let content = |e: Error| with_extent(e, mem, ring, q);
    for position in 0..u32::from(size) {
        // Packed layout: id at byte 12, flags at byte 14.
        let desc = match ring.read(mem, slot) {
            Ok(d) => d,
            Err(e) => return Err((e, None)),
        };
        let flags = desc.word14;
        if position > 0 && !is_avail(flags, wrap) {
            return Err((not_available(slot, position, wrap), None));
        }
        slot += 1;
        if slot == size {
            slot = 0;
            wrap = !wrap;
        }
        // At most `size` (<= 32768) slots, so this fits.
        let slots = position as u16 + 1;

        if flags & F_INDIRECT != 0 {
            if flags & F_NEXT != 0 {
                return Err(content(Error::IndirectWithNext));
            }
            let extent = Extent {
                slots,
                id: desc.word12,
            };
            let fault = |e| (e, Some(extent));
            if !limits.indirect {
                return Err(fault(Error::IndirectNotNegotiated));
            }
            walk_packed_table(mem, &mut acc, desc, out).map_err(fault)?;
            return Ok((extent, acc.finish(out.len())));
        }
        if let Err(e) = acc.buffer(mem, desc.addr, desc.len, flags & F_WRITE != 0, out) {
            return Err(content(e));
        }
        if flags & F_NEXT == 0 {
            let extent = Extent {
                slots,
                id: desc.word12,
            };
            return Ok((extent, acc.finish(out.len())));
        }
    }
    Err((Error::ChainUnterminated { queue_size: size }, None))
}

/// Pops and validates the next chain of `queue`: `DeviceRing::pop_chain`
/// for [`PackedQueue`], whose documentation lists the outcomes.
pub(crate) fn pop<M>(
    queue: &mut PackedQueue,
    walker: &mut ChainWalker,
    mem: M,
) -> Result<Option<Chain<M>>>
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    let res = pop_inner(queue, walker, mem);
    walker.account(res)
}

fn pop_inner<M>(
    q: &mut PackedQueue,
    walker: &mut ChainWalker,
    mem: M,
) -> std::result::Result<Option<Chain<M>>, (Error, Option<u16>)>
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    if !q.ready() {
        return Err((Error::QueueNotReady, None));
    }
    let mut segs = walker.take_buffer();
    let (extent, outcome) = {
        let g = mem.deref();
        if !q.has_available(g).map_err(|e| (e, None))? {
            return Ok(None);
        }
        let (desc_ring, _, _) = q.addresses();
        let len = u64::from(q.size()) * DESC_SIZE;
        let ring = open_table(g, desc_ring, u32::from(q.size())).map_err(|_| {
            (
                Error::RingOutsideMemory {
                    addr: desc_ring,
                    len,
                },
                None,
            )
        })?;
        match walk_packed(g, walker.limits(), &ring, q, &mut segs.get_mut().segs) {
            Ok((extent, summary)) => (extent, Ok(summary)),
            Err((e, Some(extent))) => (extent, Err(e)),
            Err((e, None)) => return Err((e, None)),
        }
    };
    let id = extent.id;
    q.consume(id, extent.slots).map_err(|e| (e, Some(id)))?;
    match outcome {
        Ok(summary) => Ok(Some(Chain::from_walk(mem, id, segs, summary))),
        Err(e) => {
            q.add_used(mem.deref(), id, 0)
                .map_err(|re| (re, Some(id)))?;
            Err((e, Some(id)))
        }
    }
}
