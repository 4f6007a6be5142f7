// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The driver side of a packed ring: [`MockPackedDriver`] lays out direct
//! and indirect chains with driver-chosen buffer ids (reused in any
//! order), reads back used descriptors with the driver's wrap counter,
//! writes the driver event suppression area, and lays out every
//! [`PackedMalicious`] pattern.
//!
//! Memory layout: the descriptor ring at guest address 0, the driver event
//! suppression area right after it, the device area 4 bytes later, and the
//! data area (buffers and indirect tables, bump-allocated) from the next
//! 4 KiB page. The data area is reused once every buffer has come back.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use virtio_queue::desc::packed::Descriptor;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend};

use super::{
    bump_alloc, check_placed, fill_readable, read_bytes, read_writable, write_bytes, Buf,
    ChainLayout, Layout, MemRef, MockError, MockRing, UsedEntry, F_INDIRECT, F_NEXT, F_WRITE,
};
use crate::limits::{ChainLimits, LARGE_MAX_BYTES, LARGE_MAX_DESCRIPTORS};
use crate::packed::{
    encode_position, EventSuppression, PackedQueue, EVENT_FLAG_DESC, F_AVAIL, F_USED, WRAP_BIT,
};
use crate::ErrorKind;

/// A packed descriptor.
pub fn pdesc(addr: u64, len: u32, id: u16, flags: u16) -> Descriptor {
    Descriptor::new(addr, len, id, flags)
}

/// The AVAIL/USED bits that make a descriptor available in lap `wrap`.
pub fn avail_bits(wrap: bool) -> u16 {
    if wrap {
        F_AVAIL
    } else {
        F_USED
    }
}

/// The malicious packed-ring patterns. Each is refused with
/// [`expected`](Self::expected) under [`limits`](Self::limits), on a ring
/// of at least [`MIN_QUEUE_SIZE`](Self::MIN_QUEUE_SIZE) entries with
/// nothing outstanding, in at least [`MIN_MEMORY`](Self::MIN_MEMORY) bytes
/// of guest memory. Chain patterns show at the pop that follows
/// [`valid_before`](Self::valid_before) good pops; event patterns
/// ([`is_event`](Self::is_event)) at `needs_notification`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PackedMalicious {
    /// The second descriptor of a chain carries the previous lap's AVAIL/USED bits.
    MidChainWrongWrap,
    /// The second descriptor of a chain is marked used (AVAIL = USED = wrap).
    MidChainUsed,
    /// The last available descriptor sets NEXT into a slot never made available.
    NextIntoUnavailable,
    /// Every descriptor of the ring sets NEXT: the chain never ends.
    ChainNeverEnds,
    /// A direct chain whose buffer id is the queue size.
    IdOutOfRange,
    /// An indirect chain whose buffer id is 0xffff.
    IdOutOfRangeIndirect,
    /// Two chains with the same buffer id, the first still in flight.
    IdInFlight,
    /// An indirect table entry with INDIRECT.
    NestedIndirect,
    /// An indirect table length that is not a multiple of 16.
    IndirectTableMisaligned,
    /// An indirect table of length 0.
    IndirectTableEmpty,
    /// An indirect table of 65536 entries.
    IndirectTableTooLong,
    /// A ring descriptor with INDIRECT and NEXT.
    IndirectWithNext,
    /// An indirect chain on a device that did not offer indirect descriptors.
    IndirectNotNegotiated,
    /// A readable ring descriptor after a writable one.
    ReadableAfterWritable,
    /// A readable table entry after a writable one.
    ReadableAfterWritableIndirect,
    /// 4097 overlapping 1 MiB buffers: more than 2^32 - 1 bytes.
    LengthOverflow,
    /// One buffer one byte over the large byte cap.
    TooManyBytes,
    /// An indirect table one entry longer than the queue size (strict policy).
    TooManyDescriptorsStrict,
    /// An indirect table of 32769 entries (large policy).
    TooManyDescriptorsLarge,
    /// A buffer starting at the end of guest memory.
    BufferPastEnd,
    /// A buffer whose end wraps around the 64-bit address space.
    BufferAddressWraps,
    /// An indirect table outside guest memory.
    TableOutsideMemory,
    /// An indirect table that crosses the end of guest memory.
    TableCrossesEnd,
    /// Driver event suppression flags 3 (reserved).
    EventFlagsReserved,
    /// Driver event suppression in descriptor mode without event-idx.
    EventDescWithoutEventIdx,
    /// Driver event offset equal to the queue size (event-idx on).
    EventOffsetOutOfRange,
}

impl PackedMalicious {
    /// Every pattern.
    pub const ALL: &'static [PackedMalicious] = &[
        PackedMalicious::MidChainWrongWrap,
        PackedMalicious::MidChainUsed,
        PackedMalicious::NextIntoUnavailable,
        PackedMalicious::ChainNeverEnds,
        PackedMalicious::IdOutOfRange,
        PackedMalicious::IdOutOfRangeIndirect,
        PackedMalicious::IdInFlight,
        PackedMalicious::NestedIndirect,
        PackedMalicious::IndirectTableMisaligned,
        PackedMalicious::IndirectTableEmpty,
        PackedMalicious::IndirectTableTooLong,
        PackedMalicious::IndirectWithNext,
        PackedMalicious::IndirectNotNegotiated,
        PackedMalicious::ReadableAfterWritable,
        PackedMalicious::ReadableAfterWritableIndirect,
        PackedMalicious::LengthOverflow,
        PackedMalicious::TooManyBytes,
        PackedMalicious::TooManyDescriptorsStrict,
        PackedMalicious::TooManyDescriptorsLarge,
        PackedMalicious::BufferPastEnd,
        PackedMalicious::BufferAddressWraps,
        PackedMalicious::TableOutsideMemory,
        PackedMalicious::TableCrossesEnd,
        PackedMalicious::EventFlagsReserved,
        PackedMalicious::EventDescWithoutEventIdx,
        PackedMalicious::EventOffsetOutOfRange,
    ];

    /// The smallest ring the patterns assume.
    pub const MIN_QUEUE_SIZE: u16 = 4;

    /// The smallest guest memory the patterns assume.
    pub const MIN_MEMORY: usize = 4 << 20;

    /// The error the pattern triggers.
    pub fn expected(&self) -> ErrorKind {
        use PackedMalicious::*;
        match self {
            MidChainWrongWrap | MidChainUsed | NextIntoUnavailable => {
                ErrorKind::DescriptorNotAvailable
            }
            ChainNeverEnds => ErrorKind::ChainUnterminated,
            IdOutOfRange | IdOutOfRangeIndirect => ErrorKind::BufferIdOutOfRange,
            IdInFlight => ErrorKind::BufferIdInFlight,
            NestedIndirect => ErrorKind::NestedIndirect,
            IndirectTableMisaligned => ErrorKind::IndirectTableMisaligned,
            IndirectTableEmpty => ErrorKind::IndirectTableEmpty,
            IndirectTableTooLong => ErrorKind::IndirectTableTooLong,
            IndirectWithNext => ErrorKind::IndirectWithNext,
            IndirectNotNegotiated => ErrorKind::IndirectNotNegotiated,
            ReadableAfterWritable | ReadableAfterWritableIndirect => {
                ErrorKind::ReadableAfterWritable
            }
            LengthOverflow => ErrorKind::LengthOverflow,
            TooManyBytes => ErrorKind::TooManyBytes,
            TooManyDescriptorsStrict | TooManyDescriptorsLarge => ErrorKind::TooManyDescriptors,
            BufferPastEnd | BufferAddressWraps => ErrorKind::BufferOutsideMemory,
            TableOutsideMemory | TableCrossesEnd => ErrorKind::TableOutsideMemory,
            EventFlagsReserved | EventDescWithoutEventIdx => ErrorKind::EventFlagsInvalid,
            EventOffsetOutOfRange => ErrorKind::EventOffsetOutOfRange,
        }
    }

    /// The policy under which the pattern shows its fault.
    pub fn limits(&self) -> ChainLimits {
        match self {
            PackedMalicious::TooManyDescriptorsStrict => ChainLimits::strict(),
            PackedMalicious::LengthOverflow => ChainLimits::large().with_max_bytes(u32::MAX),
            PackedMalicious::IndirectNotNegotiated => ChainLimits::large().with_indirect(false),
            _ => ChainLimits::large(),
        }
    }

    /// Valid chains the pattern publishes (and the device pops) before the bad one.
    pub fn valid_before(&self) -> usize {
        usize::from(*self == PackedMalicious::IdInFlight)
    }

    /// Whether the pattern is in the driver event suppression area (shown
    /// by `needs_notification`) rather than in a chain.
    pub fn is_event(&self) -> bool {
        matches!(
            self,
            PackedMalicious::EventFlagsReserved
                | PackedMalicious::EventDescWithoutEventIdx
                | PackedMalicious::EventOffsetOutOfRange
        )
    }

    /// Whether the queue must have event-idx on for the pattern.
    pub fn needs_event_idx(&self) -> bool {
        *self == PackedMalicious::EventOffsetOutOfRange
    }

    /// Whether the fault leaves the ring unusable until it is reset (the
    /// chain's end is unknown), rather than consuming one chain.
    pub fn breaks_ring(&self) -> bool {
        matches!(
            self.expected(),
            ErrorKind::DescriptorNotAvailable | ErrorKind::ChainUnterminated
        )
    }
}

/// The driver side of one packed queue in guest memory.
pub struct MockPackedDriver<'a, M: GuestMemoryBackend> {
    mem: MemRef<'a, M>,
    ring: GuestAddress,
    driver_area: GuestAddress,
    device_area: GuestAddress,
    size: u16,
    avail_pos: u16,
    avail_wrap: bool,
    used_pos: u16,
    used_wrap: bool,
    free_slots: u16,
    free_ids: Vec<u16>,
    /// Ring slots of the outstanding chains of each id, oldest first (a
    /// driver may publish an id again before it came back; the device
    /// then refuses the chain or, if it returned the first meanwhile,
    /// serves it).
    outstanding: HashMap<u16, Vec<u16>>,
    data_start: u64,
    data_next: u64,
    data_end: u64,
}

impl<M: GuestMemoryBackend> MockPackedDriver<'static, M> {
    /// Like [`new`](MockPackedDriver::new), but the driver owns the memory.
    pub fn new_owned(mem: M, size: u16) -> Self {
        Self::with_memory(MemRef::Owned(mem), size)
    }
}

impl<'a, M: GuestMemoryBackend> MockPackedDriver<'a, M> {
    /// A packed queue of `size` entries (1 to 32768) with its ring at guest address 0.
    pub fn new(mem: &'a M, size: u16) -> Self {
        Self::with_memory(MemRef::Borrowed(mem), size)
    }

    fn with_memory(mem: MemRef<'a, M>, size: u16) -> Self {
        assert!((1..=32768).contains(&size), "queue size {size}");
        let ring = GuestAddress(0);
        let ring_len = 16 * u64::from(size);
        let driver_area = GuestAddress(ring_len);
        let device_area = GuestAddress(ring_len + 4);
        let data_start = (ring_len + 8 + 0xfff) & !0xfff;
        write_bytes(&*mem, ring, &vec![0u8; ring_len as usize + 8]).expect("mock ring memory");
        let data_end = mem.last_addr().0.saturating_add(1);
        MockPackedDriver {
            mem,
            ring,
            driver_area,
            device_area,
            size,
            avail_pos: 0,
            avail_wrap: true,
            used_pos: 0,
            used_wrap: true,
            free_slots: size,
            free_ids: (0..size).rev().collect(),
            outstanding: HashMap::new(),
            data_start,
            data_next: data_start,
            data_end,
        }
    }

    /// The guest memory.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// The queue size.
    pub fn queue_size(&self) -> u16 {
        self.size
    }

    /// One past the last guest address.
    pub fn memory_end(&self) -> u64 {
        self.data_end
    }

    /// The driver's next available slot and wrap counter.
    pub fn avail_position(&self) -> (u16, bool) {
        (self.avail_pos, self.avail_wrap)
    }

    /// The driver's next used slot to read and its wrap counter (what a
    /// driver passes to [`set_used_event`](Self::set_used_event) to be
    /// told of the next used descriptor).
    pub fn used_position(&self) -> (u16, bool) {
        (self.used_pos, self.used_wrap)
    }

    /// Ring slots not occupied by outstanding chains.
    pub fn free_slots(&self) -> u16 {
        self.free_slots
    }

    /// Buffer ids not outstanding, the next one handed out last.
    pub fn free_ids(&self) -> &[u16] {
        &self.free_ids
    }

    /// Whether buffer `id` was published and has not come back yet.
    pub fn is_outstanding(&self, id: u16) -> bool {
        self.outstanding.contains_key(&id)
    }

    /// A ready [`PackedQueue`] over the rings (event-idx off).
    pub fn create_queue(&self) -> PackedQueue {
        let mut q = PackedQueue::new(self.size, self.ring, self.driver_area, self.device_area)
            .expect("mock packed queue layout is valid");
        q.set_ready(true);
        q
    }

    /// The ring configuration as a VMM's virtio transport holds it, in a
    /// ready `virtio_queue::Queue`: size, and the descriptor ring, driver
    /// area and device area as the descriptor table, available ring and
    /// used ring addresses (what the driver writes to the common config of
    /// virtio-pci; a device model builds its [`PackedQueue`] from it).
    pub fn create_config_queue(&self) -> virtio_queue::Queue {
        use virtio_queue::QueueT;
        let mut q = virtio_queue::Queue::new(self.size).expect("mock queue size is valid");
        q.set_size(self.size);
        let split = |a: GuestAddress| (Some(a.0 as u32), Some((a.0 >> 32) as u32));
        let (lo, hi) = split(self.ring);
        q.set_desc_table_address(lo, hi);
        let (lo, hi) = split(self.driver_area);
        q.set_avail_ring_address(lo, hi);
        let (lo, hi) = split(self.device_area);
        q.set_used_ring_address(lo, hi);
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

    /// Writes one ring descriptor as is (flags included).
    pub fn write_slot(&self, slot: u16, d: Descriptor) -> Result<(), MockError> {
        let addr = self.ring.unchecked_add(16 * u64::from(slot % self.size));
        self.mem
            .write_obj(d, addr)
            .map_err(|e| MockError::Memory(e.to_string()))
    }

    /// Reads one ring descriptor.
    pub fn read_slot(&self, slot: u16) -> Result<Descriptor, MockError> {
        let addr = self.ring.unchecked_add(16 * u64::from(slot % self.size));
        self.mem
            .read_obj(addr)
            .map_err(|e| MockError::Memory(e.to_string()))
    }

    /// Allocates and writes an indirect table of packed descriptors.
    pub fn write_table(&mut self, descs: &[Descriptor]) -> Result<GuestAddress, MockError> {
        let addr = self.alloc_data(16 * descs.len() as u64)?;
        // One copy instead of one write per descriptor: a 32769-entry
        // table is laid out per fuzz input.
        self.write(addr, descriptor_bytes(descs))?;
        Ok(addr)
    }

    /// Publishes `descs` at the next available slots: each gets the
    /// AVAIL/USED bits of its slot's lap added to its flags (pass
    /// `raw_bits` to keep the given bits as they are), and the head's flags
    /// are stored last with release ordering, as a driver does. Records
    /// `id` as outstanding with `descs.len()` slots unless `track` is false.
    pub fn publish(
        &mut self,
        descs: &[Descriptor],
        id: u16,
        raw_bits: bool,
        track: bool,
    ) -> Result<u16, MockError> {
        let n = descs.len();
        if n == 0 {
            return Err(MockError::EmptyChain);
        }
        if n > usize::from(self.free_slots) {
            return Err(MockError::RingFull {
                wanted: n,
                free: usize::from(self.free_slots),
            });
        }
        let head = self.avail_pos;
        let head_wrap = self.avail_wrap;
        let mut head_flags = 0;
        for (i, d) in descs.iter().enumerate() {
            let mut d = *d;
            if !raw_bits {
                d.set_flags(d.flags() | avail_bits(self.avail_wrap));
            }
            if i == 0 {
                head_flags = d.flags();
                d.set_flags(avail_bits(!head_wrap));
            }
            self.write_slot(self.avail_pos, d)?;
            self.avail_pos += 1;
            if self.avail_pos == self.size {
                self.avail_pos = 0;
                self.avail_wrap = !self.avail_wrap;
            }
        }
        let flags_addr = self.ring.unchecked_add(16 * u64::from(head) + 14);
        self.mem
            .store(u16::to_le(head_flags), flags_addr, Ordering::Release)
            .map_err(|e| MockError::Memory(e.to_string()))?;
        self.free_slots -= n as u16;
        if track {
            self.outstanding.entry(id).or_default().push(n as u16);
        }
        Ok(head)
    }

    fn take_id(&mut self) -> Result<u16, MockError> {
        self.free_ids
            .pop()
            .ok_or(MockError::RingFull { wanted: 1, free: 0 })
    }

    /// Lays out a chain of fresh buffers with the next free buffer id.
    /// Returns the layout; its `head` is the buffer id.
    pub fn add_chain(&mut self, layout: Layout, bufs: &[Buf]) -> Result<ChainLayout, MockError> {
        let id = *self
            .free_ids
            .last()
            .ok_or(MockError::RingFull { wanted: 1, free: 0 })?;
        self.add_chain_with_id(layout, bufs, id)
    }

    /// Lays out a chain with buffer id `id`, which need not be the next
    /// free one (ids come back in any order); the id is taken from the
    /// free list if it is there.
    pub fn add_chain_with_id(
        &mut self,
        layout: Layout,
        bufs: &[Buf],
        id: u16,
    ) -> Result<ChainLayout, MockError> {
        if bufs.is_empty() {
            return Err(MockError::EmptyChain);
        }
        let mut addrs = Vec::with_capacity(bufs.len());
        for b in bufs {
            addrs.push(self.alloc_data(u64::from(b.len))?);
        }
        self.add_chain_placed_with_id(layout, bufs, &addrs, None, id)
    }

    /// Lays out and publishes a chain of `bufs` at the guest addresses
    /// `addrs` (one per buffer, which the caller owns) with the next free
    /// buffer id. With [`Layout::Indirect`], the table goes to `table` if
    /// given (room for 16 bytes per buffer), else to the data area.
    pub fn add_chain_placed(
        &mut self,
        layout: Layout,
        bufs: &[Buf],
        addrs: &[GuestAddress],
        table: Option<GuestAddress>,
    ) -> Result<ChainLayout, MockError> {
        let id = *self
            .free_ids
            .last()
            .ok_or(MockError::RingFull { wanted: 1, free: 0 })?;
        self.add_chain_placed_with_id(layout, bufs, addrs, table, id)
    }

    fn add_chain_placed_with_id(
        &mut self,
        layout: Layout,
        bufs: &[Buf],
        addrs: &[GuestAddress],
        table: Option<GuestAddress>,
        id: u16,
    ) -> Result<ChainLayout, MockError> {
        check_placed(bufs, addrs)?;
        let mut buffers = Vec::with_capacity(bufs.len());
        let mut descs = Vec::with_capacity(bufs.len());
        for (b, &addr) in bufs.iter().zip(addrs) {
            buffers.push((addr, b.len, b.writable));
            let flags = if b.writable { F_WRITE } else { 0 };
            descs.push(pdesc(addr.0, b.len, id, flags));
        }
        let mut tables = Vec::new();
        match layout {
            Layout::Direct => {
                let n = descs.len();
                for d in &mut descs[..n - 1] {
                    d.set_flags(d.flags() | F_NEXT);
                }
            }
            Layout::Indirect => {
                if descs.len() > usize::from(u16::MAX) {
                    return Err(MockError::TooLong(descs.len()));
                }
                let table = match table {
                    Some(at) => {
                        self.write(at, descriptor_bytes(&descs))?;
                        at
                    }
                    None => self.write_table(&descs)?,
                };
                tables.push(table);
                descs = vec![pdesc(table.0, 16 * descs.len() as u32, id, F_INDIRECT)];
            }
            Layout::ChainedIndirect { .. } => return Err(MockError::TooLong(descs.len())),
        }
        // An id out of range is refused by the device and never comes back.
        self.publish(&descs, id, false, id < self.size)?;
        if let Some(pos) = self.free_ids.iter().rposition(|&i| i == id) {
            self.free_ids.remove(pos);
        }
        Ok(ChainLayout {
            head: id,
            buffers,
            tables,
        })
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
        fill_readable(&*self.mem, &chain, &readable.concat())?;
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

    /// Returns the used descriptors the device wrote since the last call, following the driver's used wrap counter and advancing
    /// by the slots of each returned id (of its oldest outstanding chain),
    /// and frees their ids and slots. A used descriptor naming an id that
    /// is not outstanding stops the scan (the driver cannot know how far to
    /// advance) and is returned last, again at every call.
    pub fn take_used(&mut self) -> Vec<UsedEntry> {
        let mut out = Vec::new();
        while let Ok(d) = self.read_slot(self.used_pos) {
            let flags = d.flags();
            let used = (flags & F_USED != 0) == self.used_wrap;
            let avail = (flags & F_AVAIL != 0) == self.used_wrap;
            if !(used && avail) {
                break;
            }
            out.push(UsedEntry {
                id: u32::from(d.id()),
                len: d.len(),
            });
            let Some(chains) = self.outstanding.get_mut(&d.id()) else {
                break;
            };
            let slots = chains.remove(0);
            if chains.is_empty() {
                self.outstanding.remove(&d.id());
                self.free_ids.push(d.id());
            }
            self.free_slots = self.free_slots.saturating_add(slots).min(self.size);
            let next = u32::from(self.used_pos) + u32::from(slots);
            if next >= u32::from(self.size) {
                self.used_pos = (next - u32::from(self.size)) as u16;
                self.used_wrap = !self.used_wrap;
            } else {
                self.used_pos = next as u16;
            }
        }
        if self.outstanding.is_empty() {
            self.data_next = self.data_start;
        }
        out
    }

    /// Writes the driver event suppression area (`off_wrap`, then `flags`).
    pub fn set_driver_event(&self, off_wrap: u16, flags: u16) -> Result<(), MockError> {
        self.mem
            .write_obj(EventSuppression::new(off_wrap, flags), self.driver_area)
            .map_err(|e| MockError::Memory(e.to_string()))
    }

    /// Asks for a notification once the used position reaches `slot` in lap `wrap`.
    pub fn set_used_event(&self, slot: u16, wrap: bool) -> Result<(), MockError> {
        let wrap_bit = if wrap { WRAP_BIT } else { 0 };
        self.set_driver_event(slot | wrap_bit, EVENT_FLAG_DESC)
    }

    /// Reads the device event suppression area.
    pub fn device_event(&self) -> EventSuppression {
        self.mem.read_obj(self.device_area).unwrap_or_default()
    }

    /// Lays out `pattern` (see [`PackedMalicious`]); returns the bad
    /// chain's buffer id, or `None` for event patterns and those without one.
    pub fn add_malicious(&mut self, pattern: PackedMalicious) -> Result<Option<u16>, MockError> {
        use PackedMalicious::*;
        let page = self.alloc_data(4096)?.0;
        let end = self.data_end;
        let size = self.size;
        let id = self.take_id()?;
        let r = |len| pdesc(page, len, id, 0);
        let w = |len| pdesc(page, len, id, F_WRITE);
        let ind = |addr: GuestAddress, n: usize| pdesc(addr.0, 16 * n as u32, id, F_INDIRECT);
        let descs: Vec<Descriptor> = match pattern {
            MidChainWrongWrap | MidChainUsed => {
                let (head, wrap) = (self.avail_pos, self.avail_wrap);
                let (second, wrap) = if head + 1 == size {
                    (0, !wrap)
                } else {
                    (head + 1, wrap)
                };
                self.publish(&[pdesc(page, 8, id, F_NEXT), r(8)], id, false, false)?;
                let bits = match (pattern, wrap) {
                    (MidChainWrongWrap, _) => avail_bits(!wrap),
                    (_, true) => F_AVAIL | F_USED,
                    (_, false) => 0,
                };
                self.write_slot(second, pdesc(page, 8, id, bits))?;
                return Ok(Some(id));
            }
            NextIntoUnavailable => {
                // Leave the slot after the chain as it is (not available
                // in this lap): the ring must have a free slot beyond.
                if self.free_slots < 2 {
                    return Err(MockError::RingFull {
                        wanted: 2,
                        free: usize::from(self.free_slots),
                    });
                }
                vec![pdesc(page, 8, id, F_NEXT)]
            }
            ChainNeverEnds => vec![pdesc(page, 8, id, F_NEXT); usize::from(self.free_slots)],
            IdOutOfRange => {
                self.publish(&[pdesc(page, 8, size, 0)], size, false, false)?;
                return Ok(Some(size));
            }
            IdOutOfRangeIndirect => {
                let t = self.write_table(&[r(8)])?;
                self.publish(
                    &[pdesc(t.0, 16, u16::MAX, F_INDIRECT)],
                    u16::MAX,
                    false,
                    false,
                )?;
                return Ok(Some(u16::MAX));
            }
            IdInFlight => {
                // Both tracked: the second comes back only if the device
                // returned the first before it popped the second.
                self.publish(&[r(8)], id, false, true)?;
                self.publish(&[w(8)], id, false, true)?;
                return Ok(Some(id));
            }
            NestedIndirect => {
                let inner = self.write_table(&[r(8)])?;
                let t = self.write_table(&[r(8), ind(inner, 1)])?;
                vec![ind(t, 2)]
            }
            IndirectTableMisaligned => vec![pdesc(page, 17, id, F_INDIRECT)],
            IndirectTableEmpty => vec![pdesc(page, 0, id, F_INDIRECT)],
            IndirectTableTooLong => vec![pdesc(page, 16 * 65536, id, F_INDIRECT)],
            IndirectWithNext => {
                let t = self.write_table(&[r(8)])?;
                vec![pdesc(t.0, 16, id, F_INDIRECT | F_NEXT), r(8)]
            }
            IndirectNotNegotiated => {
                let t = self.write_table(&[r(8)])?;
                vec![ind(t, 1)]
            }
            ReadableAfterWritable => vec![pdesc(page, 8, id, F_WRITE | F_NEXT), r(8)],
            ReadableAfterWritableIndirect => {
                let t = self.write_table(&[r(8), w(8), r(8)])?;
                vec![ind(t, 3)]
            }
            LengthOverflow => {
                let big = self.alloc_data(1 << 20)?.0;
                let n = 4097;
                let t = self.write_table(&vec![pdesc(big, 1 << 20, id, 0); n])?;
                vec![ind(t, n)]
            }
            TooManyBytes => vec![r(LARGE_MAX_BYTES + 1)],
            TooManyDescriptorsStrict => {
                let n = usize::from(size) + 1;
                let t = self.write_table(&vec![r(8); n])?;
                vec![ind(t, n)]
            }
            TooManyDescriptorsLarge => {
                let n = LARGE_MAX_DESCRIPTORS as usize + 1;
                let t = self.write_table(&vec![r(8); n])?;
                vec![ind(t, n)]
            }
            BufferPastEnd => vec![pdesc(end, 8, id, 0)],
            BufferAddressWraps => vec![pdesc(u64::MAX - 8, 16, id, 0)],
            TableOutsideMemory => vec![ind(GuestAddress(end + 4096), 4)],
            TableCrossesEnd => vec![ind(GuestAddress(end - 32), 4)],
            EventFlagsReserved => {
                self.free_ids.push(id);
                self.set_driver_event(0, 3)?;
                return Ok(None);
            }
            EventDescWithoutEventIdx => {
                self.free_ids.push(id);
                self.set_driver_event(0, EVENT_FLAG_DESC)?;
                return Ok(None);
            }
            EventOffsetOutOfRange => {
                self.free_ids.push(id);
                self.set_driver_event(size, EVENT_FLAG_DESC)?;
                return Ok(None);
            }
        };
        // Chains that break the ring are never returned: do not track them.
        let track = !pattern.breaks_ring();
        self.publish(&descs, id, false, track)?;
        Ok(Some(id))
    }
}

/// The bytes of a descriptor table.
fn descriptor_bytes(descs: &[Descriptor]) -> &[u8] {
    // SAFETY: `Descriptor` is `repr(C)` plain data of 16 bytes with no
    // padding (`ByteValued`), so the slice is `16 * len` initialized bytes,
    // borrowed as long as `descs`.
    unsafe { std::slice::from_raw_parts(descs.as_ptr().cast::<u8>(), std::mem::size_of_val(descs)) }
}

// The packed layout's side of the one driver API (ring.rs).
impl<M: GuestMemoryBackend> MockRing for MockPackedDriver<'_, M> {
    type Memory = M;

    fn memory(&self) -> &M {
        MockPackedDriver::memory(self)
    }

    fn queue_size(&self) -> u16 {
        MockPackedDriver::queue_size(self)
    }

    fn is_packed(&self) -> bool {
        true
    }

    fn ring_addresses(&self) -> (GuestAddress, GuestAddress, GuestAddress) {
        self.create_queue().addresses()
    }

    fn avail_base(&self) -> u16 {
        let (slot, wrap) = self.avail_position();
        encode_position(slot, wrap)
    }

    fn used_base(&self) -> u16 {
        let (slot, wrap) = self.used_position();
        encode_position(slot, wrap)
    }

    fn add_chain_placed(
        &mut self,
        layout: Layout,
        bufs: &[Buf],
        addrs: &[GuestAddress],
        table: Option<GuestAddress>,
    ) -> Result<ChainLayout, MockError> {
        MockPackedDriver::add_chain_placed(self, layout, bufs, addrs, table)
    }

    fn take_used(&mut self) -> Vec<UsedEntry> {
        MockPackedDriver::take_used(self)
    }

    fn notify_at_next_used(&mut self) -> Result<(), MockError> {
        let (slot, wrap) = self.used_position();
        self.set_used_event(slot, wrap)
    }

    fn add_chain_with_data(
        &mut self,
        layout: Layout,
        readable: &[&[u8]],
        writable: &[u32],
    ) -> Result<ChainLayout, MockError> {
        MockPackedDriver::add_chain_with_data(self, layout, readable, writable)
    }

    fn read_writable(&self, chain: &ChainLayout) -> Result<Vec<u8>, MockError> {
        MockPackedDriver::read_writable(self, chain)
    }

    fn config_queue(&self) -> virtio_queue::Queue {
        self.create_config_queue()
    }
}
