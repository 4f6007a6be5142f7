// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The mock drivers as a fake VMM uses them: owning their memory and
//! placing chains at addresses the caller owns, with the indirect table
//! where the caller says, on both ring layouts.

use virtqueue_large::mock::{
    guest_memory, Buf, Layout, MockDriver, MockError, MockPackedDriver, UsedEntry,
};
use virtqueue_large::{AnyRing, ChainLimits, ChainWalker, DeviceRing, Segment};
use vm_memory::{GuestAddress, GuestMemoryMmap};

const REQ: u64 = 0x10_0000;
const REPLY: u64 = 0x20_0000;
const TABLE: u64 = 0x30_0000;

fn placed() -> (Vec<Buf>, Vec<GuestAddress>) {
    (
        vec![Buf::r(64), Buf::w(4096), Buf::w(4096)],
        vec![
            GuestAddress(REQ),
            GuestAddress(REPLY),
            GuestAddress(REPLY + 4096),
        ],
    )
}

fn spans(segs: &[Segment]) -> Vec<(u64, u32)> {
    segs.iter().map(|s| (s.addr().0, s.len())).collect()
}

/// Pops the chain through `ring`, checks it is the placed one, returns it
/// used, and returns the head the device saw.
fn pop_and_return(ring: &mut impl DeviceRing, mem: &GuestMemoryMmap) -> u16 {
    let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
    let chain = ring.pop_chain(&mut walker, mem).unwrap().expect("a chain");
    assert_eq!(spans(chain.readable_segments()), vec![(REQ, 64)]);
    assert_eq!(
        spans(chain.writable_segments()),
        vec![(REPLY, 4096), (REPLY + 4096, 4096)]
    );
    let head = chain.head_index();
    drop(chain);
    ring.push_used(mem, head, 11).unwrap();
    head
}

#[test]
fn test_split_chain_placed_with_table_where_asked() {
    let mut driver = MockDriver::new_owned(guest_memory(4 << 20), 16);
    let mem = driver.memory().clone();
    let mut queue = driver.create_queue();
    let (bufs, addrs) = placed();
    for (layout, table) in [
        (Layout::Direct, None),
        (Layout::Indirect, Some(GuestAddress(TABLE))),
        (Layout::Indirect, None),
    ] {
        let chain = driver
            .add_chain_placed(layout, &bufs, &addrs, table)
            .unwrap();
        if let Some(t) = table {
            assert_eq!(chain.tables, vec![t]);
        }
        let head = pop_and_return(&mut AnyRing::Split(&mut queue), &mem);
        assert_eq!(head, chain.head);
        assert_eq!(
            driver.take_used(),
            vec![UsedEntry {
                id: u32::from(head),
                len: 11
            }]
        );
        assert_eq!(driver.used_seen(), driver.used_idx());
    }
    assert_eq!(driver.used_seen(), 3);
}

#[test]
fn test_packed_chain_placed_with_table_where_asked() {
    let mut driver = MockPackedDriver::new_owned(guest_memory(4 << 20), 4);
    let mem = driver.memory().clone();
    let mut queue = driver.create_queue();
    let (bufs, addrs) = placed();
    // Three slots (direct), then one (indirect) each: past the end of a
    // 4-entry ring, so the used position wraps.
    for (layout, table) in [
        (Layout::Direct, None),
        (Layout::Indirect, Some(GuestAddress(TABLE))),
        (Layout::Indirect, None),
    ] {
        let chain = driver
            .add_chain_placed(layout, &bufs, &addrs, table)
            .unwrap();
        if let Some(t) = table {
            assert_eq!(chain.tables, vec![t]);
        }
        let head = pop_and_return(
            &mut AnyRing::<virtio_queue::Queue>::Packed(&mut queue),
            &mem,
        );
        assert_eq!(head, chain.head);
        assert_eq!(
            driver.take_used(),
            vec![UsedEntry {
                id: u32::from(head),
                len: 11
            }]
        );
    }
    assert_eq!(driver.used_position(), (1, false));
}

#[test]
fn test_placed_chain_needs_an_address_per_buffer() {
    let mut split = MockDriver::new_owned(guest_memory(4 << 20), 16);
    let mut packed = MockPackedDriver::new_owned(guest_memory(4 << 20), 16);
    let (bufs, addrs) = placed();
    let want = MockError::AddressCount(3, 2);
    assert_eq!(
        split.add_chain_placed(Layout::Direct, &bufs, &addrs[..2], None),
        Err(want.clone())
    );
    assert_eq!(
        packed.add_chain_placed(Layout::Direct, &bufs, &addrs[..2], None),
        Err(want)
    );
    assert_eq!(
        packed.add_chain_placed(Layout::Direct, &[], &[], None),
        Err(MockError::EmptyChain)
    );
    assert_eq!(
        MockError::AddressCount(3, 2).to_string(),
        "3 buffers but 2 addresses"
    );
}
