// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Packed virtqueues (`VIRTIO_F_RING_PACKED`, virtio 1.1 section 2.8):
//! the device side of the ring, used write-back and event suppression.
//! Chains are popped and validated through [`DeviceRing::pop_chain`], in
//! the child module `walk`. Dependencies run one way: packed uses
//! `crate::walk`, which never names the packed ring.
//!
//! A packed ring is one array of 16-byte descriptors
//! ([`virtio_queue::desc::packed::Descriptor`]) that the driver and the
//! device both write, plus two 4-byte [`EventSuppression`] areas. The
//! driver makes a descriptor available by setting its AVAIL flag to its
//! wrap counter and its USED flag to the inverse; the device returns a
//! buffer by writing one used descriptor (AVAIL = USED = the device's wrap
//! counter) with the buffer id of the chain's last descriptor. Chains
//! occupy consecutive slots, may wrap around the end of the ring, and say
//! where they end only through the NEXT flag; buffers are returned in any
//! order, each advancing the used position by the number of slots its
//! chain occupied.
//!
//! [`DeviceRing::pop_chain`]: crate::DeviceRing::pop_chain

use std::sync::atomic::{fence, Ordering};

use virtio_bindings::bindings::virtio_ring::{
    VRING_PACKED_DESC_F_AVAIL, VRING_PACKED_DESC_F_USED, VRING_PACKED_EVENT_FLAG_DESC,
    VRING_PACKED_EVENT_FLAG_DISABLE, VRING_PACKED_EVENT_FLAG_ENABLE, VRING_PACKED_EVENT_F_WRAP_CTR,
};
use virtio_queue::QueueT;
use vm_memory::{Address, ByteValued, Bytes, GuestAddress, GuestMemoryBackend, Le16};

use crate::walk::F_WRITE;
use crate::{Error, Result};

pub(crate) mod walk;

/// The largest packed queue (virtio 1.1, 2.8.10: the queue size is at most 2^15).
pub const PACKED_MAX_SIZE: u16 = 1 << 15;

/// `VIRTQ_DESC_F_AVAIL` as the descriptor flag bit.
pub const F_AVAIL: u16 = 1 << VRING_PACKED_DESC_F_AVAIL;
/// `VIRTQ_DESC_F_USED` as the descriptor flag bit.
pub const F_USED: u16 = 1 << VRING_PACKED_DESC_F_USED;
/// The wrap counter bit of `off_wrap` and of the vhost-user ring base halves.
pub const WRAP_BIT: u16 = 1 << VRING_PACKED_EVENT_F_WRAP_CTR;
/// Event suppression flags: notifications enabled.
pub const EVENT_FLAG_ENABLE: u16 = VRING_PACKED_EVENT_FLAG_ENABLE as u16;
/// Event suppression flags: notifications disabled.
pub const EVENT_FLAG_DISABLE: u16 = VRING_PACKED_EVENT_FLAG_DISABLE as u16;
/// Event suppression flags: notify at the descriptor `off_wrap` names
/// (needs `VIRTIO_F_EVENT_IDX`).
pub const EVENT_FLAG_DESC: u16 = VRING_PACKED_EVENT_FLAG_DESC as u16;

/// Size of a packed descriptor, one ring slot.
const DESC_SIZE: u64 = std::mem::size_of::<virtio_queue::desc::packed::Descriptor>() as u64;

/// Offset of `flags` in a packed descriptor.
const FLAGS_OFFSET: u64 = 14;

/// The event suppression structure (`struct pvirtq_event_suppress`): the
/// driver area (written by the driver, read by the device before a used
/// buffer notification) and the device area (written by the device, read
/// by the driver before a kick). virtio-queue 0.18 has the layout
/// (`PackedDescEvent`) but no public constructor or accessors.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EventSuppression {
    off_wrap: Le16,
    flags: Le16,
}

// SAFETY: two little-endian u16 fields with no padding; every bit pattern
// is a valid value.
unsafe impl ByteValued for EventSuppression {}

impl EventSuppression {
    /// A structure with `off_wrap` (offset in bits 0-14, wrap counter in bit 15) and `flags`.
    pub fn new(off_wrap: u16, flags: u16) -> Self {
        EventSuppression {
            off_wrap: off_wrap.into(),
            flags: flags.into(),
        }
    }

    /// The raw `off_wrap` field.
    pub fn off_wrap(&self) -> u16 {
        self.off_wrap.into()
    }

    /// The raw `flags` field.
    pub fn flags(&self) -> u16 {
        self.flags.into()
    }
}

/// What a validated driver event suppression structure asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventMode {
    /// Notify after every used buffer.
    Enable,
    /// Do not notify.
    Disable,
    /// Notify once the used position passes `off` in lap `wrap` (event-idx).
    Desc {
        /// Ring slot.
        off: u16,
        /// Wrap counter of that slot.
        wrap: bool,
    },
}

impl EventMode {
    /// Validates a driver event suppression structure for a queue of
    /// `queue_size` with or without event-idx.
    pub fn parse(ev: EventSuppression, queue_size: u16, event_idx: bool) -> Result<Self> {
        match ev.flags() {
            EVENT_FLAG_ENABLE => Ok(EventMode::Enable),
            EVENT_FLAG_DISABLE => Ok(EventMode::Disable),
            EVENT_FLAG_DESC if event_idx => {
                let off = ev.off_wrap() & !WRAP_BIT;
                if off >= queue_size {
                    return Err(Error::EventOffsetOutOfRange { off, queue_size });
                }
                Ok(EventMode::Desc {
                    off,
                    wrap: ev.off_wrap() & WRAP_BIT != 0,
                })
            }
            flags => Err(Error::EventFlagsInvalid { flags, event_idx }),
        }
    }
}

/// Encodes a ring position and its wrap counter as vhost-user does
/// (position in bits 0-14, wrap counter in bit 15).
pub fn encode_position(pos: u16, wrap: bool) -> u16 {
    pos | if wrap { WRAP_BIT } else { 0 }
}

/// Whether a descriptor with `flags` is available to the device in lap
/// `wrap`: AVAIL equal to the wrap counter and USED not.
#[inline]
pub(crate) fn is_avail(flags: u16, wrap: bool) -> bool {
    let want = if wrap { F_AVAIL } else { F_USED };
    flags & (F_AVAIL | F_USED) == want
}

/// The device side of one packed virtqueue.
///
/// It keeps what the packed layout needs beyond a split queue's state: both
/// wrap counters, the buffer ids in flight with the ring slots each chain
/// occupied (so buffers can be returned in any order), and the used
/// positions since the last notification (for event-idx). Chains are popped
/// through [`DeviceRing::pop_chain`], under the same [`ChainLimits`]
/// as split chains.
///
/// [`DeviceRing::pop_chain`]: crate::DeviceRing::pop_chain
/// [`ChainLimits`]: crate::ChainLimits
#[derive(Debug, Clone)]
pub struct PackedQueue {
    size: u16,
    desc_ring: GuestAddress,
    driver_area: GuestAddress,
    device_area: GuestAddress,
    ready: bool,
    event_idx: bool,
    next_avail: u16,
    avail_wrap: bool,
    next_used: u16,
    used_wrap: bool,
    /// Ring slots per buffer id; 0 when the id is not in flight.
    in_flight: Vec<u16>,
    in_flight_count: u16,
    /// Used slots written since the last `needs_notification`.
    used_since_signal: u16,
}

impl PackedQueue {
    /// A queue of `size` entries (1 to [`PACKED_MAX_SIZE`]; packed queues
    /// need not be a power of two), with its descriptor ring (16-byte
    /// aligned), driver and device event suppression areas (4-byte
    /// aligned). Both wrap counters start at 1, as the specification
    /// requires; the queue starts not ready, without event-idx.
    pub fn new(
        size: u16,
        desc_ring: GuestAddress,
        driver_area: GuestAddress,
        device_area: GuestAddress,
    ) -> Result<Self> {
        if size == 0 || size > PACKED_MAX_SIZE {
            return Err(Error::InvalidQueueConfig(
                "packed queue size must be 1 to 32768",
            ));
        }
        if !desc_ring.0.is_multiple_of(16) {
            return Err(Error::InvalidQueueConfig(
                "packed descriptor ring must be 16-byte aligned",
            ));
        }
        if !driver_area.0.is_multiple_of(4) || !device_area.0.is_multiple_of(4) {
            return Err(Error::InvalidQueueConfig(
                "event suppression areas must be 4-byte aligned",
            ));
        }
        Ok(PackedQueue {
            size,
            desc_ring,
            driver_area,
            device_area,
            ready: false,
            event_idx: false,
            next_avail: 0,
            avail_wrap: true,
            next_used: 0,
            used_wrap: true,
            in_flight: vec![0; usize::from(size)],
            in_flight_count: 0,
            used_since_signal: 0,
        })
    }

    /// A packed queue over the configuration a VMM (or vhost-user-backend)
    /// stored in a split `QueueT`: size, ready, event-idx, and the three
    /// addresses (descriptor ring = `desc_table`, driver area =
    /// `avail_ring`, device area = `used_ring`). The queue's `next_avail`
    /// is read as the vhost-user packed encoding (position and wrap counter
    /// in bit 15, what vhost-user-backend stores from `SET_VRING_BASE`);
    /// the used position starts equal to it (nothing in flight).
    pub fn from_queue<Q: QueueT>(queue: &Q) -> Result<Self> {
        let mut q = PackedQueue::new(
            queue.size(),
            GuestAddress(queue.desc_table()),
            GuestAddress(queue.avail_ring()),
            GuestAddress(queue.used_ring()),
        )?;
        q.set_ready(queue.ready());
        q.set_event_idx(queue.event_idx_enabled());
        let avail = u32::from(queue.next_avail());
        q.set_ring_base(avail | (avail << 16))?;
        Ok(q)
    }

    /// The queue size.
    #[inline]
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Guest addresses of the descriptor ring, driver area and device area.
    #[inline]
    pub fn addresses(&self) -> (GuestAddress, GuestAddress, GuestAddress) {
        (self.desc_ring, self.driver_area, self.device_area)
    }

    /// Whether the queue is ready.
    #[inline]
    pub fn ready(&self) -> bool {
        self.ready
    }

    /// Marks the queue ready or not.
    pub fn set_ready(&mut self, ready: bool) {
        self.ready = ready;
    }

    /// Whether `VIRTIO_F_EVENT_IDX` was negotiated.
    pub fn event_idx_enabled(&self) -> bool {
        self.event_idx
    }

    /// Sets whether `VIRTIO_F_EVENT_IDX` was negotiated.
    pub fn set_event_idx(&mut self, enabled: bool) {
        self.event_idx = enabled;
    }

    /// The next slot the device reads and its wrap counter.
    #[inline]
    pub fn next_avail(&self) -> (u16, bool) {
        (self.next_avail, self.avail_wrap)
    }

    /// The next slot the device writes a used descriptor to and its wrap counter.
    pub fn next_used(&self) -> (u16, bool) {
        (self.next_used, self.used_wrap)
    }

    /// Buffer ids popped and not yet returned.
    pub fn in_flight(&self) -> u16 {
        self.in_flight_count
    }

    /// The vhost-user ring base for `GET_VRING_BASE`: bits 0-14 the next
    /// available slot, bit 15 its wrap counter, bits 16-30 the next used
    /// slot, bit 31 its wrap counter (the encoding QEMU sends and expects).
    pub fn ring_base(&self) -> u32 {
        u32::from(encode_position(self.next_avail, self.avail_wrap))
            | (u32::from(encode_position(self.next_used, self.used_wrap)) << 16)
    }

    /// The avail half of [`ring_base`](Self::ring_base): the next available
    /// slot with its wrap counter in bit 15.
    pub fn avail_base(&self) -> u16 {
        encode_position(self.next_avail, self.avail_wrap)
    }

    /// Stores [`avail_base`](Self::avail_base) as `queue`'s `next_avail`,
    /// where vhost-user-backend 0.24 reads the `GET_VRING_BASE` reply
    /// (call it from `VhostUserBackend::stop_vring`). That reply carries
    /// 16 bits only, so the used half is lost; the frontend resets the
    /// ring before it starts it again.
    pub fn sync_to<Q: QueueT>(&self, queue: &mut Q) {
        queue.set_next_avail(self.avail_base());
    }

    /// Sets the ring state from a vhost-user `SET_VRING_BASE` value (see
    /// [`ring_base`](Self::ring_base)). It is sent while the ring is
    /// stopped, so buffers in flight are forgotten. A position past the
    /// ring is refused and changes nothing.
    pub fn set_ring_base(&mut self, base: u32) -> Result<()> {
        let avail = base as u16;
        let used = (base >> 16) as u16;
        if avail & !WRAP_BIT >= self.size || used & !WRAP_BIT >= self.size {
            return Err(Error::InvalidRingBase {
                base,
                queue_size: self.size,
            });
        }
        self.next_avail = avail & !WRAP_BIT;
        self.avail_wrap = avail & WRAP_BIT != 0;
        self.next_used = used & !WRAP_BIT;
        self.used_wrap = used & WRAP_BIT != 0;
        self.in_flight.iter_mut().for_each(|s| *s = 0);
        self.in_flight_count = 0;
        self.used_since_signal = 0;
        Ok(())
    }

    /// Back to the reset state (both positions 0, wrap counters 1, nothing
    /// in flight, not ready); the configuration is kept.
    pub fn reset(&mut self) {
        // Position 0 with both wrap counters set is always in range.
        let _ = self.set_ring_base(u32::from(WRAP_BIT) | (u32::from(WRAP_BIT) << 16));
        self.ready = false;
    }

    fn slot_addr(&self, slot: u16) -> GuestAddress {
        self.desc_ring.unchecked_add(u64::from(slot) * DESC_SIZE)
    }

    /// Whether the descriptor at the next available slot is available.
    pub fn has_available<G: GuestMemoryBackend>(&self, mem: &G) -> Result<bool> {
        let flags = self.load_flags(mem, self.next_avail)?;
        Ok(is_avail(flags, self.avail_wrap))
    }

    fn load_flags<G: GuestMemoryBackend>(&self, mem: &G, slot: u16) -> Result<u16> {
        let addr = self.slot_addr(slot).unchecked_add(FLAGS_OFFSET);
        mem.load::<u16>(addr, Ordering::Acquire)
            .map(u16::from_le)
            .map_err(|e| Error::Ring(virtio_queue::Error::GuestMemory(e)))
    }

    /// Returns buffer `id` to the driver with `len` bytes written: one used
    /// descriptor at the next used slot (its flags stored last, with
    /// release ordering), then the used position advances by the slots the
    /// chain occupied, flipping the wrap counter when it passes the end.
    /// Buffers may be returned in any order. An id not in flight is refused
    /// and nothing is written.
    pub fn add_used<G: GuestMemoryBackend>(&mut self, mem: &G, id: u16, len: u32) -> Result<()> {
        let slots = self.in_flight.get(usize::from(id)).copied().unwrap_or(0);
        if slots == 0 {
            return Err(Error::UsedIdNotInFlight { id });
        }
        let addr = self.slot_addr(self.next_used);
        let ring = |e| Error::Ring(virtio_queue::Error::GuestMemory(e));
        mem.write_obj(u32::to_le(len), addr.unchecked_add(8))
            .map_err(ring)?;
        mem.write_obj(u16::to_le(id), addr.unchecked_add(12))
            .map_err(ring)?;
        let mut flags = if self.used_wrap { F_AVAIL | F_USED } else { 0 };
        if len > 0 {
            flags |= F_WRITE;
        }
        mem.store(
            u16::to_le(flags),
            addr.unchecked_add(FLAGS_OFFSET),
            Ordering::Release,
        )
        .map_err(ring)?;
        self.in_flight[usize::from(id)] = 0;
        self.in_flight_count -= 1;
        let (pos, wrap) = advance(self.next_used, self.used_wrap, slots, self.size);
        self.next_used = pos;
        self.used_wrap = wrap;
        self.used_since_signal = self.used_since_signal.saturating_add(slots);
        Ok(())
    }

    /// Passes over the chain at the next available slot without taking
    /// it: the next available position moves on by `slots` (the slots
    /// that chain occupies), nothing is written and no buffer id goes in
    /// flight. For a device that knows from its own records that the
    /// driver already got this chain back (a daemon restarted after a
    /// crash, whose frontend offers completed chains again). Returns false
    /// (and does nothing) when the next slot is not available; `slots`
    /// must be 1 to the queue size.
    pub fn skip_available<G: GuestMemoryBackend>(&mut self, mem: &G, slots: u16) -> Result<bool> {
        if slots == 0 || slots > self.size {
            return Err(Error::InvalidQueueConfig("skipped slots out of range"));
        }
        if !self.has_available(mem)? {
            return Ok(false);
        }
        let (pos, wrap) = advance(self.next_avail, self.avail_wrap, slots, self.size);
        self.next_avail = pos;
        self.avail_wrap = wrap;
        Ok(true)
    }

    /// Puts buffer id `id`, occupying `slots` ring slots, in flight
    /// without popping it: a chain a previous instance of the device
    /// popped and did not return, which this one will return with
    /// [`add_used`](Self::add_used) (a daemon restarted after a crash).
    /// Refused for an id out of range or already in flight.
    pub fn adopt(&mut self, id: u16, slots: u16) -> Result<()> {
        if id >= self.size {
            return Err(Error::BufferIdOutOfRange {
                id,
                queue_size: self.size,
            });
        }
        if slots == 0 || slots > self.size {
            return Err(Error::InvalidQueueConfig("adopted slots out of range"));
        }
        if self.in_flight[usize::from(id)] != 0 {
            return Err(Error::BufferIdInFlight { id });
        }
        self.in_flight[usize::from(id)] = slots;
        self.in_flight_count += 1;
        Ok(())
    }

    /// Takes the chain just walked at the next available slot: the
    /// position moves on by its `slots` whatever happens (the chain is
    /// consumed), then buffer `id` goes in flight as with
    /// [`adopt`](Self::adopt).
    #[inline]
    pub(crate) fn consume(&mut self, id: u16, slots: u16) -> Result<()> {
        let (pos, wrap) = advance(self.next_avail, self.avail_wrap, slots, self.size);
        self.next_avail = pos;
        self.avail_wrap = wrap;
        self.adopt(id, slots)
    }

    /// Reads and validates the driver event suppression structure.
    pub fn driver_event<G: GuestMemoryBackend>(&self, mem: &G) -> Result<EventMode> {
        let ev = mem
            .read_obj::<EventSuppression>(self.driver_area)
            .map_err(|e| Error::Ring(virtio_queue::Error::GuestMemory(e)))?;
        EventMode::parse(ev, self.size, self.event_idx)
    }

    /// Whether the driver wants a used buffer notification for what was
    /// returned since the last call (which this call forgets). With
    /// event-idx: whether the used position passed the driver's
    /// `off_wrap` since then. Invalid event suppression values are
    /// reported ([`Error::EventFlagsInvalid`],
    /// [`Error::EventOffsetOutOfRange`]): notify anyway and keep serving.
    pub fn needs_notification<G: GuestMemoryBackend>(&mut self, mem: &G) -> Result<bool> {
        fence(Ordering::SeqCst);
        let used = std::mem::take(&mut self.used_since_signal);
        match self.driver_event(mem)? {
            EventMode::Enable => Ok(true),
            EventMode::Disable => Ok(false),
            EventMode::Desc { off, wrap } => {
                // As Linux's vring_need_event, with an event of the
                // previous lap shifted back by the queue size.
                let new = self.next_used;
                let old = new.wrapping_sub(used);
                let event = if wrap == self.used_wrap {
                    off
                } else {
                    off.wrapping_sub(self.size)
                };
                // A whole lap or more since the last call passes every event.
                Ok(used >= self.size
                    || (used > 0
                        && new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)))
            }
        }
    }

    fn write_device_event<G: GuestMemoryBackend>(
        &self,
        mem: &G,
        ev: EventSuppression,
    ) -> Result<()> {
        let ring = |e| Error::Ring(virtio_queue::Error::GuestMemory(e));
        mem.write_obj(Le16::from(ev.off_wrap()), self.device_area)
            .map_err(ring)?;
        mem.store(
            u16::to_le(ev.flags()),
            self.device_area.unchecked_add(2),
            Ordering::Release,
        )
        .map_err(ring)
    }

    /// Asks the driver for available buffer notifications (kicks): in
    /// event-idx mode at the next available slot, otherwise for every
    /// buffer. Returns whether a chain became available meanwhile (then
    /// pop again instead of waiting).
    pub fn enable_notification<G: GuestMemoryBackend>(&mut self, mem: &G) -> Result<bool> {
        let ev = if self.event_idx {
            EventSuppression::new(
                encode_position(self.next_avail, self.avail_wrap),
                EVENT_FLAG_DESC,
            )
        } else {
            EventSuppression::new(0, EVENT_FLAG_ENABLE)
        };
        self.write_device_event(mem, ev)?;
        fence(Ordering::SeqCst);
        self.has_available(mem)
    }

    /// Asks the driver not to send available buffer notifications.
    pub fn disable_notification<G: GuestMemoryBackend>(&mut self, mem: &G) -> Result<()> {
        self.write_device_event(mem, EventSuppression::new(0, EVENT_FLAG_DISABLE))
    }
}

/// `pos` advanced by `n` slots on a ring of `size`, with its wrap counter.
#[inline]
pub(crate) fn advance(pos: u16, wrap: bool, n: u16, size: u16) -> (u16, bool) {
    let next = u32::from(pos) + u32::from(n);
    if next >= u32::from(size) {
        ((next - u32::from(size)) as u16, !wrap)
    } else {
        (next as u16, wrap)
    }
}
