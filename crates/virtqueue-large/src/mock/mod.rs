// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A driver-side mock: lays out split rings, direct, indirect and malicious
//! chains in a real guest memory, and reads back the used ring.
//!
//! It extends virtio-queue's `mock::MockSplitQueue` with what large chains
//! need: a data area allocator, indirect tables of up to 65535 entries,
//! chained tables, descriptor reclaim from the used ring, event-idx fields,
//! and every malicious pattern the walker must refuse ([`Malicious`]). It
//! lays out the rings itself: in virtio-queue 0.18 `MockSplitQueue` places
//! the used ring right after the first `size` *bytes* of the available ring
//! entries (`SplitQueueRing::end` counts entries, not bytes), so for queues
//! of 8 entries or more the used ring overwrites the upper available ring
//! entries and `used_event`.
//!
//! Memory layout: the descriptor table at guest address 0, the available
//! ring after it, the used ring on the next 4 KiB page; buffers and indirect
//! tables are bump-allocated from [`MockDriver::data_start`] and the area is
//! reused once every chain has been returned through the used ring.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use virtio_bindings::bindings::virtio_ring::{
    VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

mod packed;
mod ring;

pub use self::packed::{avail_bits, pdesc, MockPackedDriver, PackedMalicious};
pub use self::ring::{MockRing, UsedEntry};
pub use crate::io::IoCall;
use crate::limits::{ChainLimits, LARGE_MAX_BYTES, LARGE_MAX_DESCRIPTORS};
use crate::ErrorKind;

/// `VIRTQ_DESC_F_NEXT` as the descriptor field type.
pub const F_NEXT: u16 = VRING_DESC_F_NEXT as u16;
/// `VIRTQ_DESC_F_WRITE` as the descriptor field type.
pub const F_WRITE: u16 = VRING_DESC_F_WRITE as u16;
/// `VIRTQ_DESC_F_INDIRECT` as the descriptor field type.
pub const F_INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;

/// Guest memory of `size` bytes at guest address 0, in one region.
pub fn guest_memory(size: usize) -> GuestMemoryMmap<()> {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size)]).expect("mock guest memory")
}

/// The file I/O system calls that [`Reader`](crate::Reader) and
/// [`Writer`](crate::Writer) made on this thread since the last call (what
/// they passed to `preadv`/`pwritev`/`readv`/`writev`). The first call turns
/// tracing on for the thread and returns nothing.
pub fn take_io_trace() -> Vec<IoCall> {
    crate::io::IO_TRACE.with(|t| t.borrow_mut().replace(Vec::new()).unwrap_or_default())
}

/// A split descriptor.
pub fn desc(addr: u64, len: u32, flags: u16, next: u16) -> Descriptor {
    Descriptor::new(addr, len, flags, next)
}

/// Mock errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MockError {
    /// Not enough free descriptors in the ring.
    #[error("ring full: {wanted} descriptors wanted, {free} free")]
    RingFull {
        /// Descriptors requested.
        wanted: usize,
        /// Descriptors free.
        free: usize,
    },
    /// The data area is exhausted.
    #[error("mock data area exhausted: {0} bytes wanted")]
    OutOfMemory(u64),
    /// A chain needs at least one buffer.
    #[error("empty chain")]
    EmptyChain,
    /// The layout cannot hold that many descriptors.
    #[error("{0} descriptors do not fit this layout")]
    TooLong(usize),
    /// No shuffled placement without adjacent buffers was found.
    #[error("cannot scatter {0} buffers")]
    CannotScatter(usize),
    /// Guest memory access failed.
    #[error("guest memory: {0}")]
    Memory(String),
    /// A placed chain got a different number of addresses than buffers.
    #[error("{0} buffers but {1} addresses")]
    AddressCount(usize, usize),
}

/// One buffer of a chain to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buf {
    /// Length in bytes.
    pub len: u32,
    /// Device-writable.
    pub writable: bool,
}

impl Buf {
    /// A device-readable buffer.
    pub fn r(len: u32) -> Self {
        Buf {
            len,
            writable: false,
        }
    }

    /// A device-writable buffer.
    pub fn w(len: u32) -> Self {
        Buf {
            len,
            writable: true,
        }
    }
}

/// Where the descriptors of a chain go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// In the ring's descriptor table.
    Direct,
    /// In one indirect table (up to 65535 entries) behind one ring descriptor.
    Indirect,
    /// In indirect tables of `per_table` entries, each table's last entry
    /// linking to the next (the proposed `chained-indirect` extension).
    ChainedIndirect {
        /// Entries per table, at least 2.
        per_table: u16,
    },
}

/// What [`MockDriver::add_chain`] laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainLayout {
    /// The head index published in the available ring.
    pub head: u16,
    /// Every buffer: address, length, writable.
    pub buffers: Vec<(GuestAddress, u32, bool)>,
    /// Indirect tables, in walk order.
    pub tables: Vec<GuestAddress>,
}

/// The malicious chain patterns. Each one is refused with
/// [`expected`](Self::expected) under [`limits`](Self::limits), on a ring of
/// at least [`Malicious::MIN_QUEUE_SIZE`] entries in a memory of at least
/// [`Malicious::MIN_MEMORY`] bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Malicious {
    /// Two ring descriptors pointing at each other.
    RingLoop,
    /// A ring descriptor pointing at itself.
    RingSelfLoop,
    /// A loop inside an indirect table.
    IndirectLoop,
    /// A ring `next` equal to the queue size.
    RingNextOutOfRange,
    /// A table `next` past the end of the table.
    IndirectNextOutOfRange,
    /// An available ring entry naming a head past the queue size.
    HeadOutOfRange,
    /// A buffer starting at the end of guest memory.
    BufferPastEnd,
    /// A buffer that starts inside guest memory and ends past it.
    BufferCrossesEnd,
    /// A buffer whose end wraps around the 64-bit address space.
    BufferAddressWraps,
    /// An indirect table outside guest memory.
    TableOutsideMemory,
    /// An indirect table that crosses the end of guest memory.
    TableCrossesEnd,
    /// 17 overlapping 256 MiB buffers: more than 2^32 - 1 bytes in total.
    LengthOverflow,
    /// One buffer one byte over the large byte cap.
    TooManyBytes,
    /// An indirect table one entry longer than the queue size (strict policy).
    TooManyDescriptorsStrict,
    /// A direct descriptor followed by a 32768-entry table (large policy).
    TooManyDescriptorsLarge,
    /// A readable ring descriptor after a writable one.
    ReadableAfterWritable,
    /// A readable table entry after a writable one.
    ReadableAfterWritableIndirect,
    /// An indirect table entry pointing at another table.
    NestedIndirect,
    /// An indirect table length that is not a multiple of 16.
    IndirectTableMisaligned,
    /// An indirect table of length 0.
    IndirectTableEmpty,
    /// An indirect table of 65536 entries.
    IndirectTableTooLong,
    /// A ring descriptor with both INDIRECT and NEXT.
    IndirectWithNext,
    /// A table entry with both INDIRECT and NEXT.
    IndirectWithNextInTable,
    /// An indirect chain on a device that did not offer indirect descriptors.
    IndirectNotNegotiated,
    /// The available index more than a queue size ahead (a ring-level fault:
    /// nothing is published and nothing is consumed).
    BadAvailIndex,
}

impl Malicious {
    /// Every pattern.
    pub const ALL: &'static [Malicious] = &[
        Malicious::RingLoop,
        Malicious::RingSelfLoop,
        Malicious::IndirectLoop,
        Malicious::RingNextOutOfRange,
        Malicious::IndirectNextOutOfRange,
        Malicious::HeadOutOfRange,
        Malicious::BufferPastEnd,
        Malicious::BufferCrossesEnd,
        Malicious::BufferAddressWraps,
        Malicious::TableOutsideMemory,
        Malicious::TableCrossesEnd,
        Malicious::LengthOverflow,
        Malicious::TooManyBytes,
        Malicious::TooManyDescriptorsStrict,
        Malicious::TooManyDescriptorsLarge,
        Malicious::ReadableAfterWritable,
        Malicious::ReadableAfterWritableIndirect,
        Malicious::NestedIndirect,
        Malicious::IndirectTableMisaligned,
        Malicious::IndirectTableEmpty,
        Malicious::IndirectTableTooLong,
        Malicious::IndirectWithNext,
        Malicious::IndirectWithNextInTable,
        Malicious::IndirectNotNegotiated,
        Malicious::BadAvailIndex,
    ];

    /// The smallest ring the patterns assume.
    pub const MIN_QUEUE_SIZE: u16 = 32;

    /// The smallest guest memory the patterns assume (the overflow pattern
    /// needs 256 MiB of data area).
    pub const MIN_MEMORY: usize = 320 << 20;

    /// The error the pattern triggers under [`limits`](Self::limits).
    pub fn expected(&self) -> ErrorKind {
        use Malicious::*;
        match self {
            RingLoop | RingSelfLoop | IndirectLoop => ErrorKind::DescriptorLoop,
            RingNextOutOfRange | IndirectNextOutOfRange => ErrorKind::NextIndexOutOfRange,
            HeadOutOfRange => ErrorKind::HeadIndexOutOfRange,
            BufferPastEnd | BufferCrossesEnd | BufferAddressWraps => ErrorKind::BufferOutsideMemory,
            TableOutsideMemory | TableCrossesEnd => ErrorKind::TableOutsideMemory,
            LengthOverflow => ErrorKind::LengthOverflow,
            TooManyBytes => ErrorKind::TooManyBytes,
            TooManyDescriptorsStrict | TooManyDescriptorsLarge => ErrorKind::TooManyDescriptors,
            ReadableAfterWritable | ReadableAfterWritableIndirect => {
                ErrorKind::ReadableAfterWritable
            }
            NestedIndirect => ErrorKind::NestedIndirect,
            IndirectTableMisaligned => ErrorKind::IndirectTableMisaligned,
            IndirectTableEmpty => ErrorKind::IndirectTableEmpty,
            IndirectTableTooLong => ErrorKind::IndirectTableTooLong,
            IndirectWithNext | IndirectWithNextInTable => ErrorKind::IndirectWithNext,
            IndirectNotNegotiated => ErrorKind::IndirectNotNegotiated,
            BadAvailIndex => ErrorKind::InvalidAvailIndex,
        }
    }

    /// The policy under which the pattern shows its fault.
    pub fn limits(&self) -> ChainLimits {
        match self {
            Malicious::LengthOverflow | Malicious::TooManyDescriptorsStrict => {
                ChainLimits::strict()
            }
            Malicious::IndirectNotNegotiated => ChainLimits::large().with_indirect(false),
            _ => ChainLimits::large(),
        }
    }
}

/// The driver side of one split queue in guest memory.
pub struct MockDriver<'a, M: GuestMemoryBackend> {
    mem: MemRef<'a, M>,
    desc_table: GuestAddress,
    avail: GuestAddress,
    used: GuestAddress,
    size: u16,
    free: Vec<u16>,
    outstanding: HashMap<u16, Vec<u16>>,
    avail_idx: u16,
    used_seen: u16,
    data_start: u64,
    data_next: u64,
    data_end: u64,
}

impl<M: GuestMemoryBackend> MockDriver<'static, M> {
    /// Like [`new`](MockDriver::new), but the driver owns the memory (for
    /// a driver that lives beside its memory, as a fake VMM's does).
    pub fn new_owned(mem: M, size: u16) -> Self {
        Self::with_memory(MemRef::Owned(mem), size)
    }
}

impl<'a, M: GuestMemoryBackend> MockDriver<'a, M> {
    /// A queue of `size` entries (a power of two up to 32768) with its rings
    /// at guest address 0.
    pub fn new(mem: &'a M, size: u16) -> Self {
        Self::with_memory(MemRef::Borrowed(mem), size)
    }

    fn with_memory(mem: MemRef<'a, M>, size: u16) -> Self {
        assert!(size.is_power_of_two() && size <= 32768, "queue size {size}");
        let n = u64::from(size);
        let desc_table = GuestAddress(0);
        let avail = GuestAddress(16 * n);
        let used = GuestAddress((16 * n + 6 + 2 * n + 0xfff) & !0xfff);
        let used_end = used.0 + 6 + 8 * n;
        let data_start = (used_end + 0xfff) & !0xfff;
        let data_end = mem.last_addr().0.saturating_add(1);
        // Zero the ring headers and event fields.
        for addr in [avail, used] {
            mem.write_slice(&[0u8; 4], addr).expect("mock ring memory");
        }
        let driver = MockDriver {
            mem,
            desc_table,
            avail,
            used,
            size,
            free: (0..size).rev().collect(),
            outstanding: HashMap::new(),
            avail_idx: 0,
            used_seen: 0,
            data_start,
            data_next: data_start,
            data_end,
        };
        driver.set_used_event(0).expect("mock ring memory");
        driver
    }

    /// The guest memory.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// The queue size.
    pub fn queue_size(&self) -> u16 {
        self.size
    }

    /// The used ring index the driver has read up to (what
    /// [`take_used`](Self::take_used) returned last); the value a driver
    /// writes as `used_event` to be told of the next used entry.
    pub fn used_seen(&self) -> u16 {
        self.used_seen
    }

    /// The first guest address of the data area.
    pub fn data_start(&self) -> GuestAddress {
        GuestAddress(self.data_start)
    }

    /// One past the last guest address.
    pub fn memory_end(&self) -> u64 {
        self.data_end
    }

    /// Guest addresses of the descriptor table, available ring and used ring.
    pub fn ring_addresses(&self) -> (GuestAddress, GuestAddress, GuestAddress) {
        (self.desc_table, self.avail, self.used)
    }

    /// A ready `Queue` pointing at the rings (event-idx off; enable it with
    /// `set_event_idx(true)`).
    pub fn create_queue(&self) -> Queue {
        let mut q = Queue::new(self.size).expect("mock queue size is valid");
        q.set_size(self.size);
        for (addr, set) in [
            (
                self.desc_table,
                Queue::set_desc_table_address as fn(&mut Queue, Option<u32>, Option<u32>),
            ),
            (self.avail, Queue::set_avail_ring_address),
            (self.used, Queue::set_used_ring_address),
        ] {
            set(&mut q, Some(addr.0 as u32), Some((addr.0 >> 32) as u32));
        }
        q.set_ready(true);
        q
    }

    /// Allocates `len` bytes (16-byte aligned) in the data area.
    pub fn alloc_data(&mut self, len: u64) -> Result<GuestAddress, MockError> {
        bump_alloc(&mut self.data_next, self.data_end, len)
    }

    /// Writes bytes to guest memory.
    pub fn write(&self, addr: GuestAddress, data: &[u8]) -> Result<(), MockError> {
        write_bytes(&*self.mem, addr, data)
    }

    /// Reads bytes from guest memory.
    pub fn read(&self, addr: GuestAddress, len: usize) -> Result<Vec<u8>, MockError> {
        read_bytes(&*self.mem, addr, len)
    }

    /// Takes `n` free descriptor indices of the ring.
    pub fn alloc_ring(&mut self, n: usize) -> Result<Vec<u16>, MockError> {
        if n > self.free.len() {
            return Err(MockError::RingFull {
                wanted: n,
                free: self.free.len(),
            });
        }
        let at = self.free.len() - n;
        let mut v = self.free.split_off(at);
        v.reverse();
        Ok(v)
    }

    /// Writes one descriptor of the ring's table.
    pub fn write_desc(&self, index: u16, d: Descriptor) -> Result<(), MockError> {
        let addr = self.desc_table.unchecked_add(16 * u64::from(index));
        self.mem
            .write_obj(d, addr)
            .map_err(|e| MockError::Memory(e.to_string()))
    }

    /// Writes descriptors at `addr` (an indirect table).
    pub fn write_table_at(
        &self,
        addr: GuestAddress,
        descs: &[Descriptor],
    ) -> Result<(), MockError> {
        for (i, d) in descs.iter().enumerate() {
            self.mem
                .write_obj(*d, addr.unchecked_add(16 * i as u64))
                .map_err(|e| MockError::Memory(e.to_string()))?;
        }
        Ok(())
    }

    /// Allocates and writes an indirect table.
    pub fn write_table(&mut self, descs: &[Descriptor]) -> Result<GuestAddress, MockError> {
        let addr = self.alloc_data(16 * descs.len() as u64)?;
        self.write_table_at(addr, descs)?;
        Ok(addr)
    }

    /// Publishes `head` in the available ring; `ring` lists the ring
    /// descriptors the chain uses, reclaimed when the device returns it.
    pub fn publish(&mut self, head: u16, ring: Vec<u16>) -> Result<(), MockError> {
        let slot = u64::from(self.avail_idx % self.size);
        let avail = self.avail;
        self.mem
            .write_obj(u16::to_le(head), avail.unchecked_add(4 + 2 * slot))
            .map_err(|e| MockError::Memory(e.to_string()))?;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.store_avail_idx(self.avail_idx)?;
        if !ring.is_empty() {
            self.outstanding.insert(head, ring);
        }
        Ok(())
    }

    fn store_avail_idx(&self, idx: u16) -> Result<(), MockError> {
        self.mem
            .store(
                u16::to_le(idx),
                self.avail.unchecked_add(2),
                Ordering::Release,
            )
            .map_err(|e| MockError::Memory(e.to_string()))
    }

    /// Writes a raw available index (to fake a misbehaving driver); the
    /// mock's own index is unchanged, see [`restore_avail_idx`](Self::restore_avail_idx).
    pub fn set_avail_idx(&self, idx: u16) -> Result<(), MockError> {
        self.store_avail_idx(idx)
    }

    /// Writes back the mock's own available index.
    pub fn restore_avail_idx(&self) -> Result<(), MockError> {
        self.store_avail_idx(self.avail_idx)
    }

    /// The mock's available index.
    pub fn avail_idx(&self) -> u16 {
        self.avail_idx
    }

    /// Lays out a chain of `bufs` (readable ones first, normally) and
    /// publishes it. The buffers follow each other in guest memory, in chain
    /// order (16-byte aligned).
    pub fn add_chain(&mut self, layout: Layout, bufs: &[Buf]) -> Result<ChainLayout, MockError> {
        if bufs.is_empty() {
            return Err(MockError::EmptyChain);
        }
        let mut addrs = Vec::with_capacity(bufs.len());
        for b in bufs {
            addrs.push(self.alloc_data(u64::from(b.len))?);
        }
        self.add_chain_at(layout, bufs, &addrs)
    }

    /// Like [`add_chain`](Self::add_chain), but the buffers are placed in
    /// a shuffled order (a permutation drawn from `seed`), the way a guest's
    /// page allocator hands out scattered pages. No buffer directly follows
    /// its predecessor in the chain, so file I/O gets one iovec per buffer.
    pub fn add_chain_scattered(
        &mut self,
        layout: Layout,
        bufs: &[Buf],
        seed: u64,
    ) -> Result<ChainLayout, MockError> {
        if bufs.is_empty() {
            return Err(MockError::EmptyChain);
        }
        let slot = |len: u32| (u64::from(len) + 15) & !15;
        let total: u64 = bufs.iter().map(|b| slot(b.len)).sum();
        let mut x = seed | 1;
        let mut next = move || {
            // xorshift64
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut order: Vec<usize> = (0..bufs.len()).collect();
        let mut offsets = vec![0u64; bufs.len()];
        // At least a third of random permutations put no buffer right
        // after its predecessor; draw until one does (64 draws all fail
        // with a probability below 1e-11).
        for _ in 0..64 {
            for i in (1..order.len()).rev() {
                order.swap(i, (next() % (i as u64 + 1)) as usize);
            }
            let mut at = 0;
            for &i in &order {
                offsets[i] = at;
                at += slot(bufs[i].len);
            }
            let adjacent = offsets
                .windows(2)
                .zip(bufs)
                .any(|(w, b)| w[0] + u64::from(b.len) == w[1]);
            if !adjacent {
                let base = self.alloc_data(total)?;
                let addrs: Vec<GuestAddress> =
                    offsets.iter().map(|o| base.unchecked_add(*o)).collect();
                return self.add_chain_at(layout, bufs, &addrs);
            }
        }
        Err(MockError::CannotScatter(bufs.len()))
    }

    fn add_chain_at(
        &mut self,
        layout: Layout,
        bufs: &[Buf],
        addrs: &[GuestAddress],
    ) -> Result<ChainLayout, MockError> {
        self.add_chain_placed(layout, bufs, addrs, None)
    }

    /// Lays out and publishes a chain of `bufs` at the guest addresses
    /// `addrs` (one per buffer, which the caller owns), as a VMM's driver
    /// reusing its buffers does. With [`Layout::Indirect`], the table goes
    /// to `table` if given (room for 16 bytes per buffer), else it is
    /// allocated in the data area; [`Layout::ChainedIndirect`] always
    /// allocates its tables.
    pub fn add_chain_placed(
        &mut self,
        layout: Layout,
        bufs: &[Buf],
        addrs: &[GuestAddress],
        table: Option<GuestAddress>,
    ) -> Result<ChainLayout, MockError> {
        check_placed(bufs, addrs)?;
        let mut buffers = Vec::with_capacity(bufs.len());
        let mut descs = Vec::with_capacity(bufs.len());
        for (b, &addr) in bufs.iter().zip(addrs) {
            buffers.push((addr, b.len, b.writable));
            let flags = if b.writable { F_WRITE } else { 0 };
            descs.push(desc(addr.0, b.len, flags, 0));
        }
        let mut tables = Vec::new();
        match layout {
            Layout::Direct => {
                let ring = self.alloc_ring(descs.len())?;
                for (i, d) in descs.iter_mut().enumerate() {
                    if i + 1 < ring.len() {
                        d.set_flags(d.flags() | F_NEXT);
                        d.set_next(ring[i + 1]);
                    }
                    self.write_desc(ring[i], *d)?;
                }
                let head = ring[0];
                self.publish(head, ring)?;
                Ok(ChainLayout {
                    head,
                    buffers,
                    tables,
                })
            }
            Layout::Indirect => {
                if descs.len() > usize::from(u16::MAX) {
                    return Err(MockError::TooLong(descs.len()));
                }
                link_in_order(&mut descs);
                let table = match table {
                    Some(at) => {
                        self.write_table_at(at, &descs)?;
                        at
                    }
                    None => self.write_table(&descs)?,
                };
                tables.push(table);
                let head = self.publish_indirect(table, descs.len())?;
                Ok(ChainLayout {
                    head,
                    buffers,
                    tables,
                })
            }
            Layout::ChainedIndirect { per_table } => {
                let per = usize::from(per_table);
                if per < 2 {
                    return Err(MockError::TooLong(descs.len()));
                }
                // Split into tables of per-1 entries plus a link, the last
                // table holding up to `per` entries.
                let mut chunks: Vec<Vec<Descriptor>> = Vec::new();
                let mut rest = &descs[..];
                while rest.len() > per {
                    chunks.push(rest[..per - 1].to_vec());
                    rest = &rest[per - 1..];
                }
                chunks.push(rest.to_vec());
                for c in chunks.iter_mut() {
                    link_in_order(c);
                }
                // Write from the last table backwards so links know their target.
                let mut next_table: Option<(GuestAddress, usize)> = None;
                let mut addrs = Vec::with_capacity(chunks.len());
                for c in chunks.iter_mut().rev() {
                    if let Some((addr, n)) = next_table {
                        let last = c.len() - 1;
                        let flags = c[last].flags();
                        c[last].set_flags(flags | F_NEXT);
                        c[last].set_next(last as u16 + 1);
                        c.push(desc(addr.0, 16 * n as u32, F_INDIRECT, 0));
                    }
                    let addr = self.write_table(c)?;
                    next_table = Some((addr, c.len()));
                    addrs.push(addr);
                }
                addrs.reverse();
                let (first, n) = next_table.expect("at least one table");
                let head = self.publish_indirect(first, n)?;
                Ok(ChainLayout {
                    head,
                    buffers,
                    tables: addrs,
                })
            }
        }
    }

    fn publish_indirect(&mut self, table: GuestAddress, entries: usize) -> Result<u16, MockError> {
        let ring = self.alloc_ring(1)?;
        let head = ring[0];
        self.write_desc(head, desc(table.0, 16 * entries as u32, F_INDIRECT, 0))?;
        self.publish(head, ring)?;
        Ok(head)
    }

    /// Lays out a chain with readable buffers holding `readable` and
    /// writable buffers of `writable` lengths.
    pub fn add_chain_with_data(
        &mut self,
        layout: Layout,
        readable: &[&[u8]],
        writable: &[u32],
    ) -> Result<ChainLayout, MockError> {
        let bufs: Vec<Buf> = readable
            .iter()
            .map(|r| Buf::r(r.len() as u32))
            .chain(writable.iter().map(|w| Buf::w(*w)))
            .collect();
        let chain = self.add_chain(layout, &bufs)?;
        for ((addr, _, _), data) in chain.buffers.iter().zip(readable) {
            self.write(*addr, data)?;
        }
        Ok(chain)
    }

    /// Spreads `data` over the readable buffers of `chain`, in order.
    pub fn fill_readable(&self, chain: &ChainLayout, data: &[u8]) -> Result<(), MockError> {
        fill_readable(&*self.mem, chain, data)
    }

    /// The concatenated contents of the writable buffers of `chain`.
    pub fn read_writable(&self, chain: &ChainLayout) -> Result<Vec<u8>, MockError> {
        read_writable(&*self.mem, chain)
    }

    /// The used ring index written by the device.
    pub fn used_idx(&self) -> u16 {
        self.mem
            .load::<u16>(self.used.unchecked_add(2), Ordering::Acquire)
            .map(u16::from_le)
            .unwrap_or(0)
    }

    /// Returns the used entries added since the last call, and reclaims
    /// their ring descriptors. Once nothing is outstanding the data area is
    /// reused from its start.
    pub fn take_used(&mut self) -> Vec<UsedEntry> {
        let used_idx = self.used_idx();
        let mut out = Vec::new();
        while self.used_seen != used_idx {
            let slot = u64::from(self.used_seen % self.size);
            let addr = self.used.unchecked_add(4 + 8 * slot);
            let id = self
                .mem
                .read_obj::<u32>(addr)
                .map(u32::from_le)
                .unwrap_or(u32::MAX);
            let len = self
                .mem
                .read_obj::<u32>(addr.unchecked_add(4))
                .map(u32::from_le)
                .unwrap_or(0);
            out.push(UsedEntry { id, len });
            if let Ok(head) = u16::try_from(id) {
                if let Some(ring) = self.outstanding.remove(&head) {
                    self.free.extend(ring.into_iter().rev());
                }
            }
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        if self.outstanding.is_empty() {
            self.data_next = self.data_start;
        }
        out
    }

    /// Writes `used_event` (the driver's event-idx threshold).
    pub fn set_used_event(&self, idx: u16) -> Result<(), MockError> {
        let addr = self.avail.unchecked_add(4 + 2 * u64::from(self.size));
        self.mem
            .store(u16::to_le(idx), addr, Ordering::Release)
            .map_err(|e| MockError::Memory(e.to_string()))
    }

    /// Reads `avail_event` (the device's event-idx threshold).
    pub fn avail_event(&self) -> u16 {
        let addr = self.used.unchecked_add(4 + 8 * u64::from(self.size));
        self.mem
            .load::<u16>(addr, Ordering::Acquire)
            .map(u16::from_le)
            .unwrap_or(0)
    }

    fn publish_ring_chain(&mut self, descs: &[Descriptor], link: bool) -> Result<u16, MockError> {
        let ring = self.alloc_ring(descs.len())?;
        for (i, d) in descs.iter().enumerate() {
            let mut d = *d;
            if link && i + 1 < ring.len() {
                d.set_flags(d.flags() | F_NEXT);
                d.set_next(ring[i + 1]);
            }
            self.write_desc(ring[i], d)?;
        }
        let head = ring[0];
        self.publish(head, ring)?;
        Ok(head)
    }

    /// Lays out `pattern` and publishes it. Returns the head, or `None` for
    /// [`Malicious::BadAvailIndex`], which only corrupts the available
    /// index (undo it with [`restore_avail_idx`](Self::restore_avail_idx)).
    pub fn add_malicious(&mut self, pattern: Malicious) -> Result<Option<u16>, MockError> {
        use Malicious::*;
        let page = self.alloc_data(4096)?.0;
        let end = self.data_end;
        let r = |len| desc(page, len, 0, 0);
        let w = |len| desc(page, len, F_WRITE, 0);
        let head = match pattern {
            RingLoop => {
                let ring = self.alloc_ring(2)?;
                self.write_desc(ring[0], desc(page, 8, F_NEXT, ring[1]))?;
                self.write_desc(ring[1], desc(page, 8, F_NEXT, ring[0]))?;
                self.publish(ring[0], ring.clone())?;
                ring[0]
            }
            RingSelfLoop => {
                let ring = self.alloc_ring(1)?;
                self.write_desc(ring[0], desc(page, 8, F_NEXT, ring[0]))?;
                self.publish(ring[0], ring.clone())?;
                ring[0]
            }
            IndirectLoop => {
                let t = self.write_table(&[
                    desc(page, 8, F_NEXT, 1),
                    desc(page, 8, F_NEXT, 2),
                    desc(page, 8, F_NEXT, 0),
                ])?;
                self.publish_indirect(t, 3)?
            }
            RingNextOutOfRange => {
                let ring = self.alloc_ring(1)?;
                self.write_desc(ring[0], desc(page, 8, F_NEXT, self.size))?;
                self.publish(ring[0], ring.clone())?;
                ring[0]
            }
            IndirectNextOutOfRange => {
                let t = self.write_table(&[desc(page, 8, F_NEXT, 2), r(8)])?;
                self.publish_indirect(t, 2)?
            }
            HeadOutOfRange => {
                self.publish(self.size, Vec::new())?;
                self.size
            }
            BufferPastEnd => self.publish_ring_chain(&[desc(end, 8, 0, 0)], false)?,
            BufferCrossesEnd => self.publish_ring_chain(&[desc(end - 16, 32, 0, 0)], false)?,
            BufferAddressWraps => {
                self.publish_ring_chain(&[desc(u64::MAX - 8, 16, 0, 0)], false)?
            }
            TableOutsideMemory => self.publish_indirect(GuestAddress(end + 4096), 4)?,
            TableCrossesEnd => self.publish_indirect(GuestAddress(end - 32), 4)?,
            LengthOverflow => {
                let big = self.alloc_data(1 << 28)?.0;
                let mut t = vec![desc(big, 1 << 28, 0, 0); 16];
                t.push(desc(big, 16, 0, 0));
                link_in_order(&mut t);
                let t_addr = self.write_table(&t)?;
                self.publish_indirect(t_addr, t.len())?
            }
            TooManyBytes => {
                self.publish_ring_chain(&[desc(page, LARGE_MAX_BYTES + 1, 0, 0)], false)?
            }
            TooManyDescriptorsStrict => {
                let mut t = vec![r(8); usize::from(self.size) + 1];
                link_in_order(&mut t);
                let t_addr = self.write_table(&t)?;
                self.publish_indirect(t_addr, t.len())?
            }
            TooManyDescriptorsLarge => {
                let n = LARGE_MAX_DESCRIPTORS as usize;
                let mut t = vec![r(8); n];
                link_in_order(&mut t);
                let t_addr = self.write_table(&t)?;
                let ring = self.alloc_ring(2)?;
                self.write_desc(ring[0], desc(page, 8, F_NEXT, ring[1]))?;
                self.write_desc(ring[1], desc(t_addr.0, 16 * n as u32, F_INDIRECT, 0))?;
                self.publish(ring[0], ring.clone())?;
                ring[0]
            }
            ReadableAfterWritable => self.publish_ring_chain(&[w(8), r(8)], true)?,
            ReadableAfterWritableIndirect => {
                let mut t = vec![r(8), w(8), r(8)];
                link_in_order(&mut t);
                let t_addr = self.write_table(&t)?;
                self.publish_indirect(t_addr, 3)?
            }
            NestedIndirect => {
                let inner = self.write_table(&[r(8)])?;
                let t_addr = self
                    .write_table(&[desc(page, 8, F_NEXT, 1), desc(inner.0, 16, F_INDIRECT, 0)])?;
                self.publish_indirect(t_addr, 2)?
            }
            IndirectTableMisaligned => {
                self.publish_ring_chain(&[desc(page, 17, F_INDIRECT, 0)], false)?
            }
            IndirectTableEmpty => {
                self.publish_ring_chain(&[desc(page, 0, F_INDIRECT, 0)], false)?
            }
            IndirectTableTooLong => {
                self.publish_ring_chain(&[desc(page, 16 * 65536, F_INDIRECT, 0)], false)?
            }
            IndirectWithNext => {
                let t = self.write_table(&[r(8)])?;
                let ring = self.alloc_ring(2)?;
                self.write_desc(ring[0], desc(t.0, 16, F_INDIRECT | F_NEXT, ring[1]))?;
                self.write_desc(ring[1], r(8))?;
                self.publish(ring[0], ring.clone())?;
                ring[0]
            }
            IndirectWithNextInTable => {
                let inner = self.write_table(&[r(8)])?;
                let t_addr =
                    self.write_table(&[desc(inner.0, 16, F_INDIRECT | F_NEXT, 1), r(8)])?;
                self.publish_indirect(t_addr, 2)?
            }
            IndirectNotNegotiated => {
                let t = self.write_table(&[r(8)])?;
                self.publish_indirect(t, 1)?
            }
            BadAvailIndex => {
                let bad = self.avail_idx.wrapping_add(self.size).wrapping_add(1);
                self.set_avail_idx(bad)?;
                return Ok(None);
            }
        };
        Ok(Some(head))
    }
}

/// A chain to place needs buffers, and one address for each.
fn check_placed(bufs: &[Buf], addrs: &[GuestAddress]) -> Result<(), MockError> {
    if bufs.is_empty() {
        return Err(MockError::EmptyChain);
    }
    if bufs.len() != addrs.len() {
        return Err(MockError::AddressCount(bufs.len(), addrs.len()));
    }
    Ok(())
}

/// The guest memory of a mock driver: borrowed, or owned by the driver.
enum MemRef<'a, M> {
    Borrowed(&'a M),
    Owned(M),
}

impl<M> std::ops::Deref for MemRef<'_, M> {
    type Target = M;

    fn deref(&self) -> &M {
        match self {
            MemRef::Borrowed(m) => m,
            MemRef::Owned(m) => m,
        }
    }
}

/// Allocates `len` bytes, 16-byte aligned, from a bump area ending at `end`.
fn bump_alloc(next: &mut u64, end: u64, len: u64) -> Result<GuestAddress, MockError> {
    let start = (*next + 15) & !15;
    let stop = start
        .checked_add(len)
        .filter(|e| *e <= end)
        .ok_or(MockError::OutOfMemory(len))?;
    *next = stop;
    Ok(GuestAddress(start))
}

fn write_bytes<M: GuestMemoryBackend>(
    mem: &M,
    addr: GuestAddress,
    data: &[u8],
) -> Result<(), MockError> {
    mem.write_slice(data, addr)
        .map_err(|e| MockError::Memory(e.to_string()))
}

fn read_bytes<M: GuestMemoryBackend>(
    mem: &M,
    addr: GuestAddress,
    len: usize,
) -> Result<Vec<u8>, MockError> {
    let mut buf = vec![0u8; len];
    mem.read_slice(&mut buf, addr)
        .map_err(|e| MockError::Memory(e.to_string()))?;
    Ok(buf)
}

/// Spreads `data` over the readable buffers of `chain`, in order.
fn fill_readable<M: GuestMemoryBackend>(
    mem: &M,
    chain: &ChainLayout,
    data: &[u8],
) -> Result<(), MockError> {
    let mut rest = data;
    for (addr, len, writable) in &chain.buffers {
        if *writable || rest.is_empty() {
            continue;
        }
        let n = (*len as usize).min(rest.len());
        write_bytes(mem, *addr, &rest[..n])?;
        rest = &rest[n..];
    }
    Ok(())
}

/// The concatenated contents of the writable buffers of `chain`.
fn read_writable<M: GuestMemoryBackend>(
    mem: &M,
    chain: &ChainLayout,
) -> Result<Vec<u8>, MockError> {
    let mut out = Vec::new();
    for (addr, len, writable) in &chain.buffers {
        if *writable {
            out.extend(read_bytes(mem, *addr, *len as usize)?);
        }
    }
    Ok(out)
}

/// Sets NEXT on every descriptor but the last, each pointing at the
/// following entry (table-relative indices).
pub fn link_in_order(descs: &mut [Descriptor]) {
    let n = descs.len();
    for (i, d) in descs.iter_mut().enumerate() {
        if i + 1 < n {
            d.set_flags(d.flags() | F_NEXT);
            d.set_next(i as u16 + 1);
        } else {
            d.set_flags(d.flags() & !F_NEXT);
        }
    }
}
