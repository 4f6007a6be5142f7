// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The packed half of the walk: a packed chain's slots in the ring (or its
//! indirect table) through the same [`Acc`] as split chains. The ring's
//! own state and used write-back stay in [`crate::packed`], which this
//! module drives and which never imports the walk.

use std::ops::Deref;

use vm_memory::{GuestAddress, GuestMemoryBackend};

use super::{
    indirect_entries, open_table, Acc, Chain, ChainWalker, RawDesc, Summary, Table, DESC_SIZE,
    F_INDIRECT, F_NEXT, F_WRITE,
};
use crate::packed::{advance, is_avail, PackedQueue};
use crate::{Error, Result};

// The walk reads packed descriptors with the split walk's 16-byte table reads.
const _: () =
    assert!(std::mem::size_of::<virtio_queue::desc::packed::Descriptor>() as u64 == DESC_SIZE);

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

/// Walks a packed indirect table: every entry in order, WRITE the only
/// flag that counts (NEXT and the buffer id are ignored, as the
/// specification says), INDIRECT refused.
fn walk_packed_table<G: GuestMemoryBackend>(
    mem: &G,
    acc: &mut Acc<'_>,
    desc: RawDesc,
    out: &mut Vec<crate::Segment>,
) -> Result<()> {
    let entries = indirect_entries(desc.len)?;
    let table = open_table(mem, GuestAddress(desc.addr), entries)?;
    for i in 0..entries {
        let d = table.read(mem, i as u16)?;
        let flags = d.word14;
        if flags & F_INDIRECT != 0 {
            return Err(Error::NestedIndirect);
        }
        acc.buffer(mem, d.addr, d.len, flags & F_WRITE != 0, out)?;
    }
    Ok(())
}

impl ChainWalker {
    /// Validates the packed chain that starts with the 16-byte descriptor
    /// `desc` (as it was in the ring when popped), for a queue of
    /// `queue_size` entries: an indirect descriptor's table is walked from
    /// guest memory (it stays the device's until the chain is used); a
    /// descriptor without `NEXT` is a one-buffer chain. [`Chain::head_index`]
    /// is the buffer id in `desc`. Nothing is read from the ring and
    /// nothing is written: for a device that recorded a chain it popped
    /// and must serve again after a crash, when the ring slot may hold a
    /// used descriptor by now. A descriptor with `NEXT` (a chain spread
    /// over several slots) is refused: only its slots described it.
    pub fn walk_packed_descriptor<M>(
        &mut self,
        mem: M,
        desc: [u8; 16],
        queue_size: u16,
    ) -> Result<Chain<M>>
    where
        M: Deref,
        M::Target: GuestMemoryBackend + Sized,
    {
        let raw = RawDesc::from_bytes(desc);
        let flags = raw.word14;
        if flags & F_NEXT != 0 {
            return Err(Error::InvalidQueueConfig(
                "a recorded packed chain must fit one slot",
            ));
        }
        let mut segs = self.take_buffer();
        let summary = {
            let out = &mut segs.get_mut().segs;
            out.clear();
            let limits = *self.limits();
            let mut acc = Acc::new(&limits, queue_size);
            if flags & F_INDIRECT != 0 {
                if !limits.indirect {
                    return Err(Error::IndirectNotNegotiated);
                }
                walk_packed_table(mem.deref(), &mut acc, raw, out)?;
            } else {
                acc.buffer(mem.deref(), raw.addr, raw.len, flags & F_WRITE != 0, out)?;
            }
            acc.finish(out.len())
        };
        Ok(Chain::from_walk(mem, raw.word12, segs, summary))
    }

    /// Pops the next available chain of a packed queue and validates it,
    /// with the same outcomes as [`pop`](Self::pop):
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
    pub fn pop_packed<M>(&mut self, queue: &mut PackedQueue, mem: M) -> Result<Option<Chain<M>>>
    where
        M: Deref + Clone,
        M::Target: GuestMemoryBackend + Sized,
    {
        let res = self.pop_packed_inner(queue, mem);
        self.account(res)
    }

    fn pop_packed_inner<M>(
        &mut self,
        q: &mut PackedQueue,
        mem: M,
    ) -> std::result::Result<Option<Chain<M>>, (Error, Option<u16>)>
    where
        M: Deref + Clone,
        M::Target: GuestMemoryBackend + Sized,
    {
        if !q.ready() {
            return Err((Error::QueueNotReady, None));
        }
        let mut segs = self.take_buffer();
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
            match walk_packed(g, self.limits(), &ring, q, &mut segs.get_mut().segs) {
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
}
