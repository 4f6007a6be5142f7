// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Every malicious chain is refused with its own error, consumed, and the
//! next valid chain on the same queue is still served.

use std::io::Read;

use virtio_queue::{Queue, QueueT};
use virtqueue_large::mock::{
    desc, guest_memory, Layout, Malicious, MockDriver, UsedEntry, F_INDIRECT, F_NEXT, F_WRITE,
};
use virtqueue_large::{ChainLimits, ChainWalker, Error, ErrorKind, LOG_BURST};
use vm_memory::{GuestAddress, GuestMemoryMmap};

const QSIZE: u16 = 256;

fn setup(mem: &GuestMemoryMmap) -> (MockDriver<'_, GuestMemoryMmap>, Queue) {
    let driver = MockDriver::new(mem, QSIZE);
    let queue = driver.create_queue();
    (driver, queue)
}

/// Pops the valid chain that follows a bad one and checks its payload.
fn assert_next_valid_served(
    walker: &mut ChainWalker,
    driver: &mut MockDriver<'_, GuestMemoryMmap>,
    queue: &mut Queue,
    mem: &GuestMemoryMmap,
) {
    let good = driver
        .add_chain_with_data(Layout::Direct, &[b"still alive"], &[8])
        .unwrap();
    let chain = walker
        .pop(queue, mem)
        .expect("valid chain after a bad one")
        .expect("a chain is available");
    assert_eq!(chain.head_index(), good.head);
    let mut got = Vec::new();
    chain.reader().read_to_end(&mut got).unwrap();
    assert_eq!(got, b"still alive");
    queue.add_used(mem, chain.head_index(), 0).unwrap();
}

#[test]
fn test_every_malicious_pattern_is_refused_and_queue_keeps_serving() {
    let mem = guest_memory(Malicious::MIN_MEMORY);
    let mut cases = 0;
    for pattern in Malicious::ALL {
        let (mut driver, mut queue) = setup(&mem);
        let mut walker = ChainWalker::new(pattern.limits()).unwrap();
        let head = driver.add_malicious(*pattern).unwrap();
        let err = walker.pop(&mut queue, &mem).unwrap_err();
        assert_eq!(err.kind(), pattern.expected(), "{pattern:?}: {err}");
        cases += 1;

        if *pattern == Malicious::BadAvailIndex {
            assert!(!err.is_chain_fault());
            // Nothing consumed; the queue works again once the driver fixes the index.
            assert_eq!(queue.next_avail(), 0);
            driver.restore_avail_idx().unwrap();
            assert_next_valid_served(&mut walker, &mut driver, &mut queue, &mem);
            continue;
        }
        assert!(err.is_chain_fault(), "{pattern:?}");
        let used = driver.take_used();
        if *pattern == Malicious::HeadOutOfRange {
            assert!(used.is_empty(), "an out-of-range head cannot be returned");
        } else {
            assert_eq!(
                used,
                vec![UsedEntry {
                    id: u32::from(head.unwrap()),
                    len: 0
                }],
                "{pattern:?}"
            );
        }
        assert_next_valid_served(&mut walker, &mut driver, &mut queue, &mem);
        assert_eq!(walker.stats().faults, 1);
        assert_eq!(walker.stats().chains, 1);
    }
    assert!(cases >= 20);
}

#[test]
fn test_all_malicious_patterns_back_to_back_on_one_queue() {
    let mem = guest_memory(Malicious::MIN_MEMORY);
    let (mut driver, mut queue) = setup(&mem);
    for pattern in Malicious::ALL {
        if pattern.limits() != ChainLimits::large() || *pattern == Malicious::BadAvailIndex {
            continue;
        }
        driver.add_malicious(*pattern).unwrap();
    }
    let good = driver
        .add_chain_with_data(Layout::Indirect, &[b"ok"], &[])
        .unwrap();
    let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
    let mut faults = 0;
    let chain = loop {
        match walker.pop(&mut queue, &mem) {
            Ok(Some(chain)) => break chain,
            Ok(None) => panic!("the valid chain was lost"),
            Err(e) => {
                assert!(e.is_chain_fault(), "{e}");
                faults += 1;
            }
        }
    };
    assert_eq!(chain.head_index(), good.head);
    assert!(faults >= 20, "{faults}");
    // The log is rate-limited: only LOG_BURST lines in this window.
    assert_eq!(
        walker.stats().logs_suppressed,
        faults - u64::from(LOG_BURST)
    );
}

fn pop_err(limits: ChainLimits, build: impl FnOnce(&mut MockDriver<'_, GuestMemoryMmap>)) -> Error {
    let mem = guest_memory(16 << 20);
    let (mut driver, mut queue) = setup(&mem);
    build(&mut driver);
    let mut walker = ChainWalker::new(limits).unwrap();
    let err = walker.pop(&mut queue, &mem).unwrap_err();
    assert_next_valid_served(&mut walker, &mut driver, &mut queue, &mem);
    err
}

#[test]
fn test_error_messages_are_pinned() {
    let e = pop_err(ChainLimits::large(), |d| {
        d.add_malicious(Malicious::RingSelfLoop).unwrap();
    });
    assert_eq!(
        e.to_string(),
        "descriptor loop: more than 256 descriptors visited in a table of 256"
    );
    let e = pop_err(ChainLimits::large(), |d| {
        d.add_malicious(Malicious::IndirectTableMisaligned).unwrap();
    });
    assert_eq!(
        e.to_string(),
        "indirect table length 17 is not a multiple of 16"
    );
    let e = pop_err(ChainLimits::strict(), |d| {
        d.add_malicious(Malicious::TooManyDescriptorsStrict)
            .unwrap();
    });
    assert_eq!(
        e.to_string(),
        "chain has more than the 256 descriptors allowed"
    );
}

#[test]
fn test_loop_in_table_hits_descriptor_limit_first_under_small_limit() {
    let e = pop_err(ChainLimits::large().with_max_descriptors(2), |d| {
        d.add_malicious(Malicious::IndirectLoop).unwrap();
    });
    assert!(matches!(e, Error::TooManyDescriptors { max: 2 }), "{e}");
}

#[test]
fn test_writable_indirect_pointer_flag_is_ignored() {
    let mem = guest_memory(16 << 20);
    let (mut driver, mut queue) = setup(&mem);
    let buf = driver.alloc_data(8).unwrap();
    driver.write(buf, b"abcdefgh").unwrap();
    let table = driver.write_table(&[desc(buf.0, 8, 0, 0)]).unwrap();
    let ring = driver.alloc_ring(1).unwrap();
    driver
        .write_desc(ring[0], desc(table.0, 16, F_INDIRECT | F_WRITE, 0))
        .unwrap();
    driver.publish(ring[0], ring).unwrap();
    let mut walker = ChainWalker::new(ChainLimits::strict()).unwrap();
    let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
    assert_eq!(chain.readable_len(), 8);
    assert_eq!(chain.writable_len(), 0);
}

#[test]
fn test_direct_descriptors_before_indirect_table() {
    let mem = guest_memory(16 << 20);
    let (mut driver, mut queue) = setup(&mem);
    let a = driver.alloc_data(4).unwrap();
    let b = driver.alloc_data(4).unwrap();
    driver.write(a, b"head").unwrap();
    driver.write(b, b"tail").unwrap();
    let table = driver.write_table(&[desc(b.0, 4, 0, 0)]).unwrap();
    let ring = driver.alloc_ring(2).unwrap();
    driver
        .write_desc(ring[0], desc(a.0, 4, F_NEXT, ring[1]))
        .unwrap();
    driver
        .write_desc(ring[1], desc(table.0, 16, F_INDIRECT, 0))
        .unwrap();
    driver.publish(ring[0], ring).unwrap();
    let mut walker = ChainWalker::new(ChainLimits::strict()).unwrap();
    let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
    let mut got = Vec::new();
    chain.reader().read_to_end(&mut got).unwrap();
    assert_eq!(got, b"headtail");
    assert_eq!(chain.descriptor_count(), 2);
}

#[test]
fn test_zero_length_descriptors_are_counted_but_add_no_segment() {
    let mem = guest_memory(16 << 20);
    let (mut driver, mut queue) = setup(&mem);
    let a = driver.alloc_data(3).unwrap();
    driver.write(a, b"xyz").unwrap();
    let table = driver
        .write_table(&[
            desc(0, 0, F_NEXT, 1),
            desc(a.0, 3, F_NEXT, 2),
            desc(u64::MAX, 0, 0, 0),
        ])
        .unwrap();
    let ring = driver.alloc_ring(1).unwrap();
    driver
        .write_desc(ring[0], desc(table.0, 48, F_INDIRECT, 0))
        .unwrap();
    driver.publish(ring[0], ring).unwrap();
    let mut walker = ChainWalker::new(ChainLimits::strict()).unwrap();
    let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
    assert_eq!(chain.descriptor_count(), 3);
    assert_eq!(chain.readable_segments().len(), 1);
    assert_eq!(chain.readable_len(), 3);
}

#[test]
fn test_unaligned_indirect_table_is_read_correctly() {
    let mem = guest_memory(16 << 20);
    let (mut driver, mut queue) = setup(&mem);
    let a = driver.alloc_data(64).unwrap();
    driver.write(a, b"unaligned table").unwrap();
    let t = driver.alloc_data(64).unwrap();
    let table = GuestAddress(t.0 + 3);
    driver
        .write_table_at(table, &[desc(a.0, 15, 0, 0)])
        .unwrap();
    let ring = driver.alloc_ring(1).unwrap();
    driver
        .write_desc(ring[0], desc(table.0, 16, F_INDIRECT, 0))
        .unwrap();
    driver.publish(ring[0], ring).unwrap();
    let mut walker = ChainWalker::new(ChainLimits::strict()).unwrap();
    let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
    let mut got = Vec::new();
    chain.reader().read_to_end(&mut got).unwrap();
    assert_eq!(got, b"unaligned table");
}

#[test]
fn test_buffer_and_table_spanning_two_regions() {
    // Three adjacent regions of 8 MiB.
    let mem = GuestMemoryMmap::<()>::from_ranges(&[
        (GuestAddress(0), 8 << 20),
        (GuestAddress(8 << 20), 8 << 20),
        (GuestAddress(16 << 20), 8 << 20),
    ])
    .unwrap();
    let (mut driver, mut queue) = setup(&mem);
    let boundary = 8u64 << 20;
    let data: Vec<u8> = (0..64u8).collect();
    driver.write(GuestAddress(boundary - 32), &data).unwrap();
    // A table straddling the next boundary.
    let table = GuestAddress(2 * boundary - 8);
    driver
        .write_table_at(table, &[desc(boundary - 32, 64, 0, 0)])
        .unwrap();
    let ring = driver.alloc_ring(1).unwrap();
    driver
        .write_desc(ring[0], desc(table.0, 16, F_INDIRECT, 0))
        .unwrap();
    driver.publish(ring[0], ring).unwrap();
    let mut walker = ChainWalker::new(ChainLimits::strict()).unwrap();
    let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
    assert_eq!(
        chain.readable_segments().len(),
        2,
        "split at the region boundary"
    );
    let mut got = Vec::new();
    chain.reader().read_to_end(&mut got).unwrap();
    assert_eq!(got, data);
}

#[test]
fn test_buffer_in_memory_hole_is_refused() {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[
        (GuestAddress(0), 8 << 20),
        (GuestAddress(16 << 20), 8 << 20),
    ])
    .unwrap();
    let (mut driver, mut queue) = setup(&mem);
    let ring = driver.alloc_ring(1).unwrap();
    driver
        .write_desc(ring[0], desc((8 << 20) - 16, 32, 0, 0))
        .unwrap();
    driver.publish(ring[0], ring).unwrap();
    let mut walker = ChainWalker::new(ChainLimits::strict()).unwrap();
    let err = walker.pop(&mut queue, &mem).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BufferOutsideMemory);
    assert_next_valid_served(&mut walker, &mut driver, &mut queue, &mem);
}

#[test]
fn test_queue_not_ready_is_a_ring_error() {
    let mem = guest_memory(1 << 20);
    let (_driver, mut queue) = setup(&mem);
    queue.set_ready(false);
    let mut walker = ChainWalker::new(ChainLimits::strict()).unwrap();
    let err = walker.pop(&mut queue, &mem).unwrap_err();
    assert!(matches!(err, Error::QueueNotReady));
    assert!(!err.is_chain_fault());
}

#[cfg(feature = "chained-indirect")]
#[test]
fn test_chained_indirect_tables_extension() {
    let mem = guest_memory(64 << 20);
    let (mut driver, mut queue) = setup(&mem);
    let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    let bufs: Vec<_> = data
        .chunks(10)
        .map(|_| virtqueue_large::mock::Buf::r(10))
        .collect();
    let layout = driver
        .add_chain(Layout::ChainedIndirect { per_table: 16 }, &bufs)
        .unwrap();
    assert!(layout.tables.len() > 1);
    driver.fill_readable(&layout, &data).unwrap();
    // Refused unless the policy opts in.
    let mut strict = ChainWalker::new(ChainLimits::large()).unwrap();
    let err = strict.pop(&mut queue, &mem).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NestedIndirect);

    let layout = driver
        .add_chain(Layout::ChainedIndirect { per_table: 16 }, &bufs)
        .unwrap();
    driver.fill_readable(&layout, &data).unwrap();
    let mut walker = ChainWalker::new(ChainLimits::large().with_chained_indirect(true)).unwrap();
    let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
    let mut got = Vec::new();
    chain.reader().read_to_end(&mut got).unwrap();
    assert_eq!(got, data);
    // 100 buffers plus one link per extra table.
    assert_eq!(
        chain.descriptor_count() as usize,
        100 + layout.tables.len() - 1
    );
}

#[cfg(feature = "chained-indirect")]
#[test]
fn test_chained_indirect_self_link_is_bounded() {
    let mem = guest_memory(16 << 20);
    let (mut driver, mut queue) = setup(&mem);
    let t = driver.alloc_data(32).unwrap();
    let buf = driver.alloc_data(8).unwrap();
    // Table: one buffer, then a link back to the same table.
    driver
        .write_table_at(
            t,
            &[desc(buf.0, 8, F_NEXT, 1), desc(t.0, 32, F_INDIRECT, 0)],
        )
        .unwrap();
    let ring = driver.alloc_ring(1).unwrap();
    driver
        .write_desc(ring[0], desc(t.0, 32, F_INDIRECT, 0))
        .unwrap();
    driver.publish(ring[0], ring).unwrap();
    let mut walker = ChainWalker::new(ChainLimits::large().with_chained_indirect(true)).unwrap();
    let err = walker.pop(&mut queue, &mem).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooManyDescriptors);
    assert_next_valid_served(&mut walker, &mut driver, &mut queue, &mem);
}
