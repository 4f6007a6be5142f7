// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The validating chain walk: split chains and the split pop, packed
//! descriptors and indirect tables, and the pieces both layouts share
//! ([`Acc`], [`Table`], [`RawDesc`]).
//!
//! Dependencies run one way: `packed::walk` pops packed chains with these
//! pieces, and nothing here names the packed ring (cargo-modules charges
//! every `ChainWalker` method to this module, whichever file holds it).

use std::mem::size_of;
use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::error;
use virtio_bindings::bindings::virtio_ring::{
    VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::QueueT;
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress,
    VolatileMemory, VolatileSlice,
};

use crate::io::{Reader, Writer};
use crate::limits::{ChainLimits, MAX_TABLE_ENTRIES};
use crate::segments::{Pool, SegBuf, Segment, Shared};
use crate::{Error, Result};

pub(crate) const DESC_SIZE: u64 = size_of::<Descriptor>() as u64;
// Packed descriptors are read with the same 16-byte table reads.
const _: () = assert!(size_of::<virtio_queue::desc::packed::Descriptor>() as u64 == DESC_SIZE);
pub(crate) const F_NEXT: u16 = VRING_DESC_F_NEXT as u16;
pub(crate) const F_WRITE: u16 = VRING_DESC_F_WRITE as u16;
pub(crate) const F_INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;

/// Segment buffers kept for reuse by default (see [`ChainWalker::with_pool_size`]).
pub const DEFAULT_POOL_SIZE: usize = 64;

/// Error lines logged per [`LOG_WINDOW`] before further chain errors are
/// only counted.
pub const LOG_BURST: u32 = 10;

/// The rate-limiting window for chain error logs.
pub const LOG_WINDOW: Duration = Duration::from_secs(1);

/// Counters kept by a [`ChainWalker`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WalkerStats {
    /// Chains popped and validated.
    pub chains: u64,
    /// Chains refused (chain faults).
    pub faults: u64,
    /// Ring-level errors (bad available index, ring access).
    pub ring_errors: u64,
    /// Error log lines suppressed by rate limiting.
    pub logs_suppressed: u64,
}

#[derive(Debug)]
struct RateLimit {
    window_start: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

impl RateLimit {
    fn allow(&mut self) -> bool {
        let now = Instant::now();
        let expired = self
            .window_start
            .is_none_or(|start| now.duration_since(start) >= LOG_WINDOW);
        if expired {
            if self.suppressed > 0 {
                error!(
                    "virtqueue-large: {} further chain errors not logged in the last window",
                    self.suppressed
                );
            }
            self.window_start = Some(now);
            self.logged = 0;
            self.suppressed = 0;
        }
        if self.logged < LOG_BURST {
            self.logged += 1;
            true
        } else {
            self.suppressed += 1;
            false
        }
    }
}

/// Pops chains from a virtio split queue and validates them against a
/// [`ChainLimits`] policy.
///
/// The walker owns the policy, a pool of segment buffers (so that steady
/// state needs no allocation per chain) and the rate limiter for error logs.
/// It borrows the queue for each call, so it works with a bare
/// `virtio_queue::Queue` as well as with the queue inside a
/// vhost-user-backend vring.
#[derive(Debug)]
pub struct ChainWalker {
    limits: ChainLimits,
    pool: Arc<Pool>,
    log: RateLimit,
    stats: WalkerStats,
}

impl ChainWalker {
    /// A walker for `limits`, keeping up to [`DEFAULT_POOL_SIZE`] buffers.
    pub fn new(limits: ChainLimits) -> Result<Self> {
        Self::with_pool_size(limits, DEFAULT_POOL_SIZE)
    }

    /// A walker that keeps at most `max_pooled` segment buffers for reuse.
    /// Each holds 16 bytes per segment of the largest chain it served, so
    /// the retained memory is at most `max_pooled * 16 * max_descriptors`
    /// (8 MiB for 16 buffers under [`ChainLimits::large`]). Chains in
    /// flight beyond that number allocate and free their buffer.
    pub fn with_pool_size(limits: ChainLimits, max_pooled: usize) -> Result<Self> {
        limits.validate()?;
        Ok(ChainWalker {
            limits,
            pool: Pool::new(max_pooled),
            log: RateLimit {
                window_start: None,
                logged: 0,
                suppressed: 0,
            },
            stats: WalkerStats::default(),
        })
    }

    /// The policy in force.
    pub fn limits(&self) -> &ChainLimits {
        &self.limits
    }

    /// Counters since creation.
    pub fn stats(&self) -> WalkerStats {
        WalkerStats {
            logs_suppressed: self.stats.logs_suppressed + self.log.suppressed,
            ..self.stats
        }
    }

    /// Buffers currently waiting in the pool.
    pub fn pooled_buffers(&self) -> usize {
        self.pool.pooled()
    }

    /// Pops the next available chain and validates it.
    ///
    /// - `Ok(Some(chain))`: a valid chain. Hand its [`Reader`]/[`Writer`] to
    ///   the request, then `queue.add_used(head, len)` and signal if
    ///   `queue.needs_notification()` says so.
    /// - `Ok(None)`: nothing available.
    /// - `Err(e)` with [`Error::is_chain_fault`]: the chain was invalid. It
    ///   has been logged (rate-limited) and consumed: returned to the used
    ///   ring with length 0 so the driver gets its buffers back (a head index
    ///   out of range cannot be returned and is skipped). Keep popping; the
    ///   caller still signals the used ring as usual.
    /// - `Err(e)` otherwise: the ring itself is broken (bad available index,
    ///   inaccessible rings, queue not ready). Nothing was consumed.
    pub fn pop<Q, M>(&mut self, queue: &mut Q, mem: M) -> Result<Option<Chain<M>>>
    where
        Q: QueueT,
        M: Deref + Clone,
        M::Target: GuestMemoryBackend + Sized,
    {
        let res = self.pop_inner(queue, mem);
        self.account(res)
    }

    /// Counts and logs (rate-limited) the outcome of one pop; `id` in the
    /// error names the chain (head index or buffer id) when known.
    pub(crate) fn account<T>(
        &mut self,
        res: std::result::Result<Option<T>, (Error, Option<u16>)>,
    ) -> Result<Option<T>> {
        match res {
            Ok(chain) => {
                if chain.is_some() {
                    self.stats.chains += 1;
                }
                Ok(chain)
            }
            Err((e, head)) => {
                if e.is_chain_fault() {
                    self.stats.faults += 1;
                } else {
                    self.stats.ring_errors += 1;
                }
                if self.log.allow() {
                    match head {
                        Some(h) => error!("virtqueue-large: refused chain {h}: {e}"),
                        None => error!("virtqueue-large: {e}"),
                    }
                }
                Err(e)
            }
        }
    }

    /// A segment buffer from the pool, for a walk.
    pub(crate) fn take_buffer(&self) -> Shared {
        self.pool.take()
    }

    fn pop_inner<Q, M>(
        &mut self,
        queue: &mut Q,
        mem: M,
    ) -> std::result::Result<Option<Chain<M>>, (Error, Option<u16>)>
    where
        Q: QueueT,
        M: Deref + Clone,
        M::Target: GuestMemoryBackend + Sized,
    {
        let avail_ring = GuestAddress(queue.avail_ring());
        if !queue.ready() || avail_ring.0 == 0 {
            return Err((Error::QueueNotReady, None));
        }
        let size = queue.size();
        let avail_idx = queue
            .avail_idx(mem.deref(), Ordering::Acquire)
            .map_err(|e| (Error::Ring(e), None))?
            .0;
        let next_avail = queue.next_avail();
        let pending = avail_idx.wrapping_sub(next_avail);
        if pending == 0 {
            return Ok(None);
        }
        if pending > size {
            return Err((
                Error::InvalidAvailIndex {
                    avail_idx,
                    next_avail,
                    pending,
                    queue_size: size,
                },
                None,
            ));
        }
        // 4-byte ring header, then 2 bytes per entry.
        let slot = u64::from(next_avail % size);
        let head_addr = avail_ring
            .checked_add(4 + 2 * slot)
            .ok_or((Error::Ring(virtio_queue::Error::AddressOverflow), None))?;
        let head = mem
            .load::<u16>(head_addr, Ordering::Acquire)
            .map(u16::from_le)
            .map_err(|e| (Error::Ring(virtio_queue::Error::GuestMemory(e)), None))?;
        queue.set_next_avail(next_avail.wrapping_add(1));

        match self.walk(mem.clone(), GuestAddress(queue.desc_table()), size, head) {
            Ok(chain) => Ok(Some(chain)),
            Err(e) => {
                if !matches!(e, Error::HeadIndexOutOfRange { .. }) {
                    queue
                        .add_used(mem.deref(), head, 0)
                        .map_err(|re| (Error::Ring(re), Some(head)))?;
                }
                Err((e, Some(head)))
            }
        }
    }

    /// Builds a [`Chain`] from a `virtio_queue::DescriptorChain` that a VMM
    /// already popped from `queue` with virtio-queue's own `pop_descriptor_chain`
    /// or `iter`. The chain is walked again from its head under this
    /// walker's policy, so faults that virtio-queue's iterator only ends
    /// the chain on (loops, indices out of range, buffers outside memory,
    /// readable after writable, nested tables) are reported. `mem` is the
    /// memory handle the chain keeps (the one the VMM popped with). Nothing
    /// is written to the rings: on an error, return the head to the driver
    /// with `queue.add_used(head, 0)` as usual.
    pub fn adopt<Q, M, N>(
        &mut self,
        queue: &Q,
        chain: &virtio_queue::DescriptorChain<N>,
        mem: M,
    ) -> Result<Chain<M>>
    where
        Q: QueueT,
        M: Deref,
        M::Target: GuestMemoryBackend + Sized,
        N: Deref,
        N::Target: GuestMemoryBackend,
    {
        self.walk(
            mem,
            GuestAddress(queue.desc_table()),
            queue.size(),
            chain.head_index(),
        )
    }

    /// Validates the chain starting at `head` in the descriptor table at
    /// `desc_table` of a queue of `queue_size` entries, without touching any
    /// ring. This is the walk [`pop`](Self::pop) uses; it does not log.
    pub fn walk<M>(
        &mut self,
        mem: M,
        desc_table: GuestAddress,
        queue_size: u16,
        head: u16,
    ) -> Result<Chain<M>>
    where
        M: Deref,
        M::Target: GuestMemoryBackend + Sized,
    {
        if head >= queue_size {
            return Err(Error::HeadIndexOutOfRange { head, queue_size });
        }
        let mut shared = self.pool.take();
        let summary = walk_into(
            mem.deref(),
            &self.limits,
            desc_table,
            queue_size,
            head,
            shared.get_mut(),
        )?;
        Ok(Chain {
            mem,
            head,
            segs: shared,
            split: summary.split,
            readable_bytes: summary.readable_bytes,
            writable_bytes: summary.writable_bytes,
            descriptors: summary.descriptors,
        })
    }

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
}

impl<M> Chain<M> {
    /// A chain from a finished walk.
    pub(crate) fn from_walk(mem: M, head: u16, segs: Shared, summary: Summary) -> Self {
        Chain {
            mem,
            head,
            segs,
            split: summary.split,
            readable_bytes: summary.readable_bytes,
            writable_bytes: summary.writable_bytes,
            descriptors: summary.descriptors,
        }
    }
}

/// A validated descriptor chain. It owns its memory handle (a clone of the
/// `M` given to [`ChainWalker::pop`]), so it can outlive the borrow of the
/// queue and travel to another coroutine or thread with its
/// [`Reader`]/[`Writer`]. Dropping the chain and everything derived from it
/// returns its segment buffer to the walker's pool.
#[derive(Debug)]
pub struct Chain<M> {
    mem: M,
    head: u16,
    segs: Shared,
    split: usize,
    readable_bytes: u32,
    writable_bytes: u32,
    descriptors: u32,
}

impl<M> Chain<M>
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    /// What `add_used` takes: the head index of a split chain, the buffer
    /// id of a packed one.
    pub fn head_index(&self) -> u16 {
        self.head
    }

    /// Total bytes of the device-readable part.
    pub fn readable_len(&self) -> u32 {
        self.readable_bytes
    }

    /// Total bytes of the device-writable part (the most `add_used` may report).
    pub fn writable_len(&self) -> u32 {
        self.writable_bytes
    }

    /// Descriptors counted against the policy.
    pub fn descriptor_count(&self) -> u32 {
        self.descriptors
    }

    /// The device-readable segments, in chain order.
    pub fn readable_segments(&self) -> &[Segment] {
        &self.segs.segs()[..self.split]
    }

    /// The device-writable segments, in chain order.
    pub fn writable_segments(&self) -> &[Segment] {
        &self.segs.segs()[self.split..]
    }

    /// The guest memory the chain refers to.
    pub fn memory(&self) -> &M::Target {
        self.mem.deref()
    }

    /// A reader over the device-readable part.
    pub fn reader(&self) -> Reader<M> {
        Reader::new(
            self.mem.clone(),
            self.segs.clone(),
            0,
            self.readable_bytes as usize,
        )
    }

    /// A writer over the device-writable part.
    pub fn writer(&self) -> Writer<M> {
        Writer::new(
            self.mem.clone(),
            self.segs.clone(),
            self.split,
            self.writable_bytes as usize,
        )
    }
}

pub(crate) struct Summary {
    split: usize,
    readable_bytes: u32,
    writable_bytes: u32,
    descriptors: u32,
}

/// One 16-byte descriptor, split or packed, as plain fields. The table
/// reads it with one 16-byte volatile load and splits it in registers:
/// reading it as `virtio_queue`'s descriptor types made the compiler store
/// the fields one by one and load them back wider, a store-forwarding stall
/// on every descriptor (the packed indirect walk spent 40 % of its
/// time on that reload).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawDesc {
    /// Bytes 0-7: the buffer address.
    pub(crate) addr: u64,
    /// Bytes 8-11: the buffer length.
    pub(crate) len: u32,
    /// Bytes 12-13: `flags` of a split descriptor, `id` of a packed one.
    pub(crate) word12: u16,
    /// Bytes 14-15: `next` of a split descriptor, `flags` of a packed one.
    pub(crate) word14: u16,
}

impl RawDesc {
    /// A descriptor from its 16 bytes as they lie in guest memory.
    pub(crate) fn from_bytes(b: [u8; 16]) -> Self {
        Self::from_le(u128::from_ne_bytes(b))
    }

    #[inline(always)]
    fn from_le(raw: u128) -> Self {
        let raw = u128::from_le(raw);
        RawDesc {
            addr: raw as u64,
            len: (raw >> 64) as u32,
            word12: (raw >> 96) as u16,
            word14: (raw >> 112) as u16,
        }
    }
}

/// Where descriptors of the current table are read from.
pub(crate) enum Table<'a, B> {
    /// The whole table is one slice of one region.
    Slice {
        slice: VolatileSlice<'a, B>,
        base: GuestAddress,
    },
    /// The table straddles regions: read each descriptor through the memory.
    Scattered(GuestAddress),
}

pub(crate) fn open_table<'a, G>(
    mem: &'a G,
    addr: GuestAddress,
    entries: u32,
) -> Result<Table<'a, vm_memory::bitmap::BS<'a, <G::R as GuestMemoryRegion>::B>>>
where
    G: GuestMemoryBackend,
{
    let len = u64::from(entries) * DESC_SIZE;
    let err = || Error::TableOutsideMemory { addr, len };
    let end = addr.0.checked_add(len).ok_or_else(err)?;
    if let Some(region) = mem.find_region(addr) {
        let start = region.start_addr().0;
        let region_end = start.saturating_add(region.len());
        if end <= region_end {
            if let Ok(slice) = region.get_slice(MemoryRegionAddress(addr.0 - start), len as usize) {
                return Ok(Table::Slice { slice, base: addr });
            }
        }
    }
    if mem.check_range(addr, len as usize) {
        Ok(Table::Scattered(addr))
    } else {
        Err(err())
    }
}

impl<B: BitmapSlice> Table<'_, B> {
    /// Reads entry `index` (a split or a packed descriptor, both 16 bytes)
    /// with one volatile load (`VolatileRef` loads need no alignment).
    #[inline(always)]
    pub(crate) fn read<G: GuestMemoryBackend>(&self, mem: &G, index: u16) -> Result<RawDesc> {
        let off = u64::from(index) * DESC_SIZE;
        match self {
            Table::Slice { slice, base } => slice
                .get_ref::<u128>(off as usize)
                .map(|r| RawDesc::from_le(r.load()))
                .map_err(|_| Error::TableOutsideMemory {
                    addr: base.unchecked_add(off),
                    len: DESC_SIZE,
                }),
            Table::Scattered(base) => {
                let addr = base.unchecked_add(off);
                mem.read_obj::<u128>(addr)
                    .map(RawDesc::from_le)
                    .map_err(|_| Error::TableOutsideMemory {
                        addr,
                        len: DESC_SIZE,
                    })
            }
        }
    }
}

/// Pushes the segments of one buffer, split at region boundaries. The
/// common case, a buffer inside the region of the previous one, is inlined
/// into the walks; the region lookup is not (a call per descriptor cost the
/// packed direct walk a third of its time).
#[inline(always)]
fn push_buffer<G: GuestMemoryBackend>(
    mem: &G,
    addr: u64,
    len: u32,
    cache: &mut (u64, u64),
    out: &mut Vec<Segment>,
) -> Result<()> {
    if let Some(end) = addr.checked_add(u64::from(len)) {
        if addr >= cache.0 && end <= cache.1 {
            out.push(Segment::new(addr, len));
            return Ok(());
        }
    }
    push_buffer_lookup(mem, addr, len, cache, out)
}

/// [`push_buffer`] for a buffer outside the cached region: finds its
/// region(s) and updates the cache.
#[inline(never)]
fn push_buffer_lookup<G: GuestMemoryBackend>(
    mem: &G,
    addr: u64,
    len: u32,
    cache: &mut (u64, u64),
    out: &mut Vec<Segment>,
) -> Result<()> {
    let err = || Error::BufferOutsideMemory {
        addr: GuestAddress(addr),
        len,
    };
    let end = addr.checked_add(u64::from(len)).ok_or_else(err)?;
    let mut cur = addr;
    while cur < end {
        let region = mem.find_region(GuestAddress(cur)).ok_or_else(err)?;
        let start = region.start_addr().0;
        let region_end = start.saturating_add(region.len());
        let piece_end = end.min(region_end);
        // piece_end - cur <= len, which fits in u32.
        out.push(Segment::new(cur, (piece_end - cur) as u32));
        *cache = (start, region_end);
        cur = piece_end;
    }
    Ok(())
}

/// The running validation of one chain's buffers, shared by the split and
/// the packed walk: descriptor and byte limits, readable before writable,
/// the 32-bit total, and the segment list.
pub(crate) struct Acc<'l> {
    limits: &'l ChainLimits,
    max_desc: u32,
    count: u32,
    total: u64,
    readable_bytes: u32,
    writable_bytes: u32,
    split: Option<usize>,
    cache: (u64, u64),
}

impl<'l> Acc<'l> {
    pub(crate) fn new(limits: &'l ChainLimits, queue_size: u16) -> Self {
        Acc {
            limits,
            max_desc: limits.descriptors_for(queue_size),
            count: 0,
            total: 0,
            readable_bytes: 0,
            writable_bytes: 0,
            split: None,
            cache: (0, 0),
        }
    }

    /// Counts one descriptor that is not a buffer (a link to a further table).
    #[inline(always)]
    pub(crate) fn count_link(&mut self) -> Result<()> {
        self.count += 1;
        if self.count > self.max_desc {
            return Err(Error::TooManyDescriptors { max: self.max_desc });
        }
        Ok(())
    }

    /// Validates one buffer descriptor and appends its segments to `out`.
    #[inline(always)]
    pub(crate) fn buffer<G: GuestMemoryBackend>(
        &mut self,
        mem: &G,
        addr: u64,
        len: u32,
        writable: bool,
        out: &mut Vec<Segment>,
    ) -> Result<()> {
        self.count_link()?;
        if writable {
            if self.split.is_none() {
                self.split = Some(out.len());
            }
        } else if self.split.is_some() {
            return Err(Error::ReadableAfterWritable {
                position: self.count - 1,
            });
        }
        self.total += u64::from(len);
        if self.total > u64::from(u32::MAX) {
            return Err(Error::LengthOverflow);
        }
        if self.total > u64::from(self.limits.max_bytes) {
            return Err(Error::TooManyBytes {
                max: self.limits.max_bytes,
            });
        }
        // The running total fits in u32, so neither part can overflow.
        if writable {
            self.writable_bytes += len;
        } else {
            self.readable_bytes += len;
        }
        if len != 0 {
            push_buffer(mem, addr, len, &mut self.cache, out)?;
        }
        Ok(())
    }

    pub(crate) fn finish(self, segs: usize) -> Summary {
        Summary {
            split: self.split.unwrap_or(segs),
            readable_bytes: self.readable_bytes,
            writable_bytes: self.writable_bytes,
            descriptors: self.count,
        }
    }
}

/// Checks the length of an indirect table (in bytes) and returns its entries.
pub(crate) fn indirect_entries(len: u32) -> Result<u32> {
    if !len.is_multiple_of(DESC_SIZE as u32) {
        return Err(Error::IndirectTableMisaligned { len });
    }
    if len == 0 {
        return Err(Error::IndirectTableEmpty);
    }
    let entries = len / DESC_SIZE as u32;
    if entries > MAX_TABLE_ENTRIES {
        return Err(Error::IndirectTableTooLong {
            entries,
            max: MAX_TABLE_ENTRIES,
        });
    }
    Ok(entries)
}

fn walk_into<G: GuestMemoryBackend>(
    mem: &G,
    limits: &ChainLimits,
    desc_table: GuestAddress,
    queue_size: u16,
    head: u16,
    buf: &mut SegBuf,
) -> Result<Summary> {
    let out = &mut buf.segs;
    out.clear();
    let mut acc = Acc::new(limits, queue_size);

    let mut table = open_table(mem, desc_table, u32::from(queue_size))?;
    let mut table_len = u32::from(queue_size);
    let mut index = head;
    let mut visits = 0u32;
    let mut in_indirect = false;

    loop {
        if u32::from(index) >= table_len {
            return Err(Error::NextIndexOutOfRange { index, table_len });
        }
        visits += 1;
        if visits > table_len {
            return Err(Error::DescriptorLoop { table_len });
        }
        // Split layout: flags at byte 12, next at byte 14.
        let desc = table.read(mem, index)?;
        let flags = desc.word12;

        if flags & F_INDIRECT != 0 {
            if !limits.indirect {
                return Err(Error::IndirectNotNegotiated);
            }
            if flags & F_NEXT != 0 {
                return Err(Error::IndirectWithNext);
            }
            if in_indirect {
                if !limits.chained() {
                    return Err(Error::NestedIndirect);
                }
                // A link to a further table counts as a descriptor, which
                // bounds chains of tables that loop back on themselves.
                acc.count_link()?;
            }
            let entries = indirect_entries(desc.len)?;
            table = open_table(mem, GuestAddress(desc.addr), entries)?;
            table_len = entries;
            index = 0;
            visits = 0;
            in_indirect = true;
            continue;
        }

        acc.buffer(mem, desc.addr, desc.len, flags & F_WRITE != 0, out)?;
        if flags & F_NEXT == 0 {
            break;
        }
        index = desc.word14;
    }

    Ok(acc.finish(out.len()))
}

/// Walks a packed indirect table: every entry in order, WRITE the only
/// flag that counts (NEXT and the buffer id are ignored, as the
/// specification says), INDIRECT refused.
pub(crate) fn walk_packed_table<G: GuestMemoryBackend>(
    mem: &G,
    acc: &mut Acc<'_>,
    desc: RawDesc,
    out: &mut Vec<Segment>,
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
