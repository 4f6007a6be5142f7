// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The crate's error type.

use vm_memory::GuestAddress;

/// Everything that can go wrong while popping, walking or using a chain.
///
/// Variants for which [`Error::is_chain_fault`] is true concern one chain
/// only: [`ChainWalker::pop`](crate::ChainWalker::pop) has already logged
/// them and handed the chain back to the driver, and the caller simply pops
/// the next one. The others concern the ring itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The chain visits more descriptors than its table holds, so it loops.
    #[error(
        "descriptor loop: more than {table_len} descriptors visited in a table of {table_len}"
    )]
    DescriptorLoop {
        /// Entries in the table being walked (the ring or an indirect table).
        table_len: u32,
    },
    /// A `next` field points past the end of its table.
    #[error("next descriptor index {index} out of range for a table of {table_len}")]
    NextIndexOutOfRange {
        /// The offending index.
        index: u16,
        /// Entries in the table.
        table_len: u32,
    },
    /// The available ring names a head index past the end of the descriptor table.
    #[error("chain head index {head} out of range for a queue of {queue_size}")]
    HeadIndexOutOfRange {
        /// The offending head index.
        head: u16,
        /// The queue size.
        queue_size: u16,
    },
    /// A buffer is not entirely inside guest memory (or its end overflows).
    #[error("buffer {:#x}+{len:#x} is outside guest memory", addr.0)]
    BufferOutsideMemory {
        /// Guest address of the buffer.
        addr: GuestAddress,
        /// Length of the buffer.
        len: u32,
    },
    /// A descriptor table (the ring's or an indirect one) is not readable guest memory.
    #[error("descriptor table {:#x}+{len:#x} is outside guest memory", addr.0)]
    TableOutsideMemory {
        /// Guest address of the table.
        addr: GuestAddress,
        /// Length of the table in bytes.
        len: u64,
    },
    /// The chain adds up to more than the 2^32 - 1 bytes virtio allows.
    #[error("total chain length overflows 32 bits")]
    LengthOverflow,
    /// The chain carries more bytes than [`ChainLimits::max_bytes`](crate::ChainLimits::max_bytes).
    #[error("chain carries more than the {max} bytes allowed")]
    TooManyBytes {
        /// The limit in force.
        max: u32,
    },
    /// The chain has more descriptors than the policy allows.
    #[error("chain has more than the {max} descriptors allowed")]
    TooManyDescriptors {
        /// The limit in force.
        max: u32,
    },
    /// A device-readable descriptor follows a device-writable one.
    #[error("device-readable descriptor after a device-writable one (descriptor {position} of the chain)")]
    ReadableAfterWritable {
        /// Zero-based position of the offending descriptor in the chain.
        position: u32,
    },
    /// An indirect table contains a descriptor that points at another table.
    #[error("nested indirect descriptor")]
    NestedIndirect,
    /// An indirect descriptor was used although the policy does not accept them.
    #[error("indirect descriptor not negotiated")]
    IndirectNotNegotiated,
    /// An indirect table length is not a multiple of 16 bytes.
    #[error("indirect table length {len} is not a multiple of 16")]
    IndirectTableMisaligned {
        /// The length in bytes.
        len: u32,
    },
    /// An indirect table length is zero.
    #[error("indirect table is empty")]
    IndirectTableEmpty,
    /// An indirect table has more entries than allowed.
    #[error("indirect table of {entries} entries is longer than the {max} allowed")]
    IndirectTableTooLong {
        /// Entries in the table.
        entries: u32,
        /// The most entries allowed.
        max: u32,
    },
    /// A descriptor sets both INDIRECT and NEXT.
    #[error("indirect descriptor with the NEXT flag set")]
    IndirectWithNext,
    /// The available index runs ahead of the device by more than the queue size.
    #[error("bad available index {avail_idx}: {pending} chains pending on a queue of {queue_size} (next_avail {next_avail})")]
    InvalidAvailIndex {
        /// The driver's available index.
        avail_idx: u16,
        /// The device's next available position.
        next_avail: u16,
        /// The number of entries that would be pending.
        pending: u16,
        /// The queue size.
        queue_size: u16,
    },
    /// Packed ring: a descriptor after the head of a chain is not marked
    /// available for the current wrap counter (its AVAIL/USED flags belong
    /// to another lap, or the chain runs into descriptors not yet made
    /// available). Where the chain ends is unknown, so nothing is consumed.
    #[error("packed ring: descriptor {slot} ({position} of the chain) is not available for wrap counter {wrap}")]
    DescriptorNotAvailable {
        /// Ring slot of the descriptor.
        slot: u16,
        /// Zero-based position in the chain.
        position: u32,
        /// The device's available wrap counter at that slot.
        wrap: bool,
    },
    /// Packed ring: a chain sets NEXT on every descriptor of the ring.
    #[error("packed ring: chain does not end within the {queue_size} descriptors of the ring")]
    ChainUnterminated {
        /// The queue size.
        queue_size: u16,
    },
    /// Packed ring: the buffer id of a chain is not below the queue size.
    #[error("packed ring: buffer id {id} out of range for a queue of {queue_size}")]
    BufferIdOutOfRange {
        /// The offending id.
        id: u16,
        /// The queue size.
        queue_size: u16,
    },
    /// Packed ring: the buffer id of a chain is already in flight.
    #[error("packed ring: buffer id {id} is already in flight")]
    BufferIdInFlight {
        /// The offending id.
        id: u16,
    },
    /// Packed ring: the device returned an id that is not in flight.
    #[error("packed ring: used buffer id {id} is not in flight")]
    UsedIdNotInFlight {
        /// The id passed to `add_used`.
        id: u16,
    },
    /// Packed ring: the driver event suppression flags hold a reserved
    /// value, or ask for descriptor mode without `VIRTIO_F_EVENT_IDX`.
    #[error(
        "packed ring: invalid driver event suppression flags {flags:#x} (event-idx {event_idx})"
    )]
    EventFlagsInvalid {
        /// The flags field.
        flags: u16,
        /// Whether event-idx was negotiated.
        event_idx: bool,
    },
    /// Packed ring: the driver event suppression offset is not below the
    /// queue size.
    #[error("packed ring: driver event offset {off} out of range for a queue of {queue_size}")]
    EventOffsetOutOfRange {
        /// The offset (bits 0 to 14 of `off_wrap`).
        off: u16,
        /// The queue size.
        queue_size: u16,
    },
    /// Packed ring: a vhost-user ring base names a position past the ring.
    #[error("packed ring: ring base {base:#x} out of range for a queue of {queue_size}")]
    InvalidRingBase {
        /// The encoded base.
        base: u32,
        /// The queue size.
        queue_size: u16,
    },
    /// A queue configuration the ring layout does not allow.
    #[error("invalid queue configuration: {0}")]
    InvalidQueueConfig(&'static str),
    /// Packed ring: the descriptor ring is not entirely inside guest memory.
    #[error("descriptor ring {:#x}+{len:#x} is outside guest memory", addr.0)]
    RingOutsideMemory {
        /// Guest address of the ring.
        addr: GuestAddress,
        /// Length in bytes.
        len: u64,
    },
    /// The queue is not ready or not configured.
    #[error("queue is not ready")]
    QueueNotReady,
    /// An access to the rings failed.
    #[error("virtqueue ring access failed: {0}")]
    Ring(virtio_queue::Error),
    /// The limits are not valid.
    #[error("invalid chain limits: {0}")]
    InvalidLimits(&'static str),
    /// A split offset lies beyond the bytes available.
    #[error("split offset {offset} beyond the {available} bytes available")]
    SplitOutOfBounds {
        /// The requested offset.
        offset: usize,
        /// Bytes available.
        available: usize,
    },
}

impl Error {
    /// True for faults of a single chain, which
    /// [`ChainWalker::pop`](crate::ChainWalker::pop) has already consumed
    /// (logged, and returned to the used ring with length 0 when its head is
    /// in range). The caller keeps popping. False for ring-level errors,
    /// after which the device should stop using the queue (for example set
    /// `DEVICE_NEEDS_RESET`) until the driver fixes or resets it. The
    /// event-suppression errors ([`Error::EventFlagsInvalid`],
    /// [`Error::EventOffsetOutOfRange`]) are not chain faults either, but
    /// the queue keeps working: signal the driver anyway (a spurious
    /// notification is harmless) and go on.
    pub fn is_chain_fault(&self) -> bool {
        !matches!(
            self,
            Error::InvalidAvailIndex { .. }
                | Error::QueueNotReady
                | Error::Ring(_)
                | Error::InvalidLimits(_)
                | Error::SplitOutOfBounds { .. }
                | Error::DescriptorNotAvailable { .. }
                | Error::ChainUnterminated { .. }
                | Error::UsedIdNotInFlight { .. }
                | Error::EventFlagsInvalid { .. }
                | Error::EventOffsetOutOfRange { .. }
                | Error::InvalidRingBase { .. }
                | Error::InvalidQueueConfig(_)
                | Error::RingOutsideMemory { .. }
        )
    }

    /// The variant without its fields, for counting and matching.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::DescriptorLoop { .. } => ErrorKind::DescriptorLoop,
            Error::NextIndexOutOfRange { .. } => ErrorKind::NextIndexOutOfRange,
            Error::HeadIndexOutOfRange { .. } => ErrorKind::HeadIndexOutOfRange,
            Error::BufferOutsideMemory { .. } => ErrorKind::BufferOutsideMemory,
            Error::TableOutsideMemory { .. } => ErrorKind::TableOutsideMemory,
            Error::LengthOverflow => ErrorKind::LengthOverflow,
            Error::TooManyBytes { .. } => ErrorKind::TooManyBytes,
            Error::TooManyDescriptors { .. } => ErrorKind::TooManyDescriptors,
            Error::ReadableAfterWritable { .. } => ErrorKind::ReadableAfterWritable,
            Error::NestedIndirect => ErrorKind::NestedIndirect,
            Error::IndirectNotNegotiated => ErrorKind::IndirectNotNegotiated,
            Error::IndirectTableMisaligned { .. } => ErrorKind::IndirectTableMisaligned,
            Error::IndirectTableEmpty => ErrorKind::IndirectTableEmpty,
            Error::IndirectTableTooLong { .. } => ErrorKind::IndirectTableTooLong,
            Error::IndirectWithNext => ErrorKind::IndirectWithNext,
            Error::InvalidAvailIndex { .. } => ErrorKind::InvalidAvailIndex,
            Error::DescriptorNotAvailable { .. } => ErrorKind::DescriptorNotAvailable,
            Error::ChainUnterminated { .. } => ErrorKind::ChainUnterminated,
            Error::BufferIdOutOfRange { .. } => ErrorKind::BufferIdOutOfRange,
            Error::BufferIdInFlight { .. } => ErrorKind::BufferIdInFlight,
            Error::UsedIdNotInFlight { .. } => ErrorKind::UsedIdNotInFlight,
            Error::EventFlagsInvalid { .. } => ErrorKind::EventFlagsInvalid,
            Error::EventOffsetOutOfRange { .. } => ErrorKind::EventOffsetOutOfRange,
            Error::InvalidRingBase { .. } => ErrorKind::InvalidRingBase,
            Error::InvalidQueueConfig(_) => ErrorKind::InvalidQueueConfig,
            Error::RingOutsideMemory { .. } => ErrorKind::RingOutsideMemory,
            Error::QueueNotReady => ErrorKind::QueueNotReady,
            Error::Ring(_) => ErrorKind::Ring,
            Error::InvalidLimits(_) => ErrorKind::InvalidLimits,
            Error::SplitOutOfBounds { .. } => ErrorKind::SplitOutOfBounds,
        }
    }
}

/// [`Error`] without its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// See [`Error::DescriptorLoop`].
    DescriptorLoop,
    /// See [`Error::NextIndexOutOfRange`].
    NextIndexOutOfRange,
    /// See [`Error::HeadIndexOutOfRange`].
    HeadIndexOutOfRange,
    /// See [`Error::BufferOutsideMemory`].
    BufferOutsideMemory,
    /// See [`Error::TableOutsideMemory`].
    TableOutsideMemory,
    /// See [`Error::LengthOverflow`].
    LengthOverflow,
    /// See [`Error::TooManyBytes`].
    TooManyBytes,
    /// See [`Error::TooManyDescriptors`].
    TooManyDescriptors,
    /// See [`Error::ReadableAfterWritable`].
    ReadableAfterWritable,
    /// See [`Error::NestedIndirect`].
    NestedIndirect,
    /// See [`Error::IndirectNotNegotiated`].
    IndirectNotNegotiated,
    /// See [`Error::IndirectTableMisaligned`].
    IndirectTableMisaligned,
    /// See [`Error::IndirectTableEmpty`].
    IndirectTableEmpty,
    /// See [`Error::IndirectTableTooLong`].
    IndirectTableTooLong,
    /// See [`Error::IndirectWithNext`].
    IndirectWithNext,
    /// See [`Error::InvalidAvailIndex`].
    InvalidAvailIndex,
    /// See [`Error::DescriptorNotAvailable`].
    DescriptorNotAvailable,
    /// See [`Error::ChainUnterminated`].
    ChainUnterminated,
    /// See [`Error::BufferIdOutOfRange`].
    BufferIdOutOfRange,
    /// See [`Error::BufferIdInFlight`].
    BufferIdInFlight,
    /// See [`Error::UsedIdNotInFlight`].
    UsedIdNotInFlight,
    /// See [`Error::EventFlagsInvalid`].
    EventFlagsInvalid,
    /// See [`Error::EventOffsetOutOfRange`].
    EventOffsetOutOfRange,
    /// See [`Error::InvalidRingBase`].
    InvalidRingBase,
    /// See [`Error::InvalidQueueConfig`].
    InvalidQueueConfig,
    /// See [`Error::RingOutsideMemory`].
    RingOutsideMemory,
    /// See [`Error::QueueNotReady`].
    QueueNotReady,
    /// See [`Error::Ring`].
    Ring,
    /// See [`Error::InvalidLimits`].
    InvalidLimits,
    /// See [`Error::SplitOutOfBounds`].
    SplitOutOfBounds,
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;
