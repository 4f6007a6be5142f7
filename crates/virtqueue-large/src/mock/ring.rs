// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! [`MockRing`]: what a driver of either ring layout does (each layout
//! implements it beside its driver; the split one below), so that a test
//! harness (a fake VMM, a bench) drives [`MockDriver`] and
//! [`MockPackedDriver`] through one API and reads used entries back as one
//! type ([`UsedEntry`]).

use vm_memory::{GuestAddress, GuestMemoryBackend};

use super::{Buf, ChainLayout, Layout, MockDriver, MockError};

/// One used entry as the driver reads it back: the chain's id (the head
/// index of a split ring, the buffer id of a packed ring) and the bytes
/// the device wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsedEntry {
    /// The head index (split; the 32-bit field of the used element) or the
    /// buffer id (packed).
    pub id: u32,
    /// Bytes written into the chain's device-writable part.
    pub len: u32,
}

/// The driver side of a ring, split or packed, laid out in the guest
/// memory it owns or borrows.
pub trait MockRing {
    /// The guest memory the rings and buffers live in.
    type Memory: GuestMemoryBackend;

    /// The guest memory.
    fn memory(&self) -> &Self::Memory;

    /// Entries in the ring.
    fn queue_size(&self) -> u16;

    /// Whether the layout is packed.
    fn is_packed(&self) -> bool;

    /// Guest addresses of the descriptor table (ring), the available
    /// (driver) area and the used (device) area, as vhost-user carries
    /// them.
    fn ring_addresses(&self) -> (GuestAddress, GuestAddress, GuestAddress);

    /// Where the driver makes its next chain available, as a vhost-user
    /// ring base: the available index (split), or the next slot with the
    /// wrap counter in bit 15 (packed).
    fn avail_base(&self) -> u16;

    /// Where the driver reads its next used entry, encoded as
    /// [`MockRing::avail_base`].
    fn used_base(&self) -> u16;

    /// Lays out and publishes a chain of `bufs` at `addrs` (one per buffer,
    /// which the caller owns); an indirect table goes to `table` if given.
    fn add_chain_placed(
        &mut self,
        layout: Layout,
        bufs: &[Buf],
        addrs: &[GuestAddress],
        table: Option<GuestAddress>,
    ) -> Result<ChainLayout, MockError>;

    /// The used entries added since the last call; their descriptors go
    /// back to the driver.
    fn take_used(&mut self) -> Vec<UsedEntry>;

    /// With event-idx negotiated: asks the device to notify at the next
    /// used entry.
    fn notify_at_next_used(&mut self) -> Result<(), MockError>;

    /// Lays out a chain with readable buffers holding `readable` and
    /// writable buffers of `writable` lengths, in the driver's data area.
    fn add_chain_with_data(
        &mut self,
        layout: Layout,
        readable: &[&[u8]],
        writable: &[u32],
    ) -> Result<ChainLayout, MockError>;

    /// The concatenated contents of the writable buffers of `chain`.
    fn read_writable(&self, chain: &ChainLayout) -> Result<Vec<u8>, MockError>;

    /// The ring configuration as a VMM's virtio transport holds it, in a
    /// ready `virtio_queue::Queue` (for a packed ring, its three
    /// addresses are the descriptor ring and the two event areas).
    fn config_queue(&self) -> virtio_queue::Queue;
}

impl<M: GuestMemoryBackend> MockRing for MockDriver<'_, M> {
    type Memory = M;

    fn memory(&self) -> &M {
        MockDriver::memory(self)
    }

    fn queue_size(&self) -> u16 {
        MockDriver::queue_size(self)
    }

    fn is_packed(&self) -> bool {
        false
    }

    fn ring_addresses(&self) -> (GuestAddress, GuestAddress, GuestAddress) {
        MockDriver::ring_addresses(self)
    }

    fn avail_base(&self) -> u16 {
        self.avail_idx()
    }

    fn used_base(&self) -> u16 {
        self.used_idx()
    }

    fn add_chain_placed(
        &mut self,
        layout: Layout,
        bufs: &[Buf],
        addrs: &[GuestAddress],
        table: Option<GuestAddress>,
    ) -> Result<ChainLayout, MockError> {
        MockDriver::add_chain_placed(self, layout, bufs, addrs, table)
    }

    fn take_used(&mut self) -> Vec<UsedEntry> {
        MockDriver::take_used(self)
    }

    fn notify_at_next_used(&mut self) -> Result<(), MockError> {
        self.set_used_event(self.used_seen())
    }

    fn add_chain_with_data(
        &mut self,
        layout: Layout,
        readable: &[&[u8]],
        writable: &[u32],
    ) -> Result<ChainLayout, MockError> {
        MockDriver::add_chain_with_data(self, layout, readable, writable)
    }

    fn read_writable(&self, chain: &ChainLayout) -> Result<Vec<u8>, MockError> {
        MockDriver::read_writable(self, chain)
    }

    fn config_queue(&self) -> virtio_queue::Queue {
        self.create_queue()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::{guest_memory, MockPackedDriver};
    use vm_memory::Address;

    /// One chain through each layout, read back as the same entry type.
    fn round_trip(ring: &mut dyn MockRing<Memory = vm_memory::GuestMemoryMmap<()>>) {
        let base = ring.avail_base();
        let data = GuestAddress(0x10_0000);
        let chain = ring
            .add_chain_placed(
                Layout::Direct,
                &[Buf::r(16), Buf::w(32)],
                &[data, data.unchecked_add(16)],
                None,
            )
            .unwrap();
        assert_ne!(ring.avail_base(), base);
        assert!(ring.take_used().is_empty());
        let _ = chain;
    }

    #[test]
    fn test_both_drivers_are_mock_rings() {
        let mut split = MockDriver::new_owned(guest_memory(4 << 20), 16);
        let mut packed = MockPackedDriver::new_owned(guest_memory(4 << 20), 16);
        assert!(!MockRing::is_packed(&split) && MockRing::is_packed(&packed));
        round_trip(&mut split);
        round_trip(&mut packed);
    }
}
