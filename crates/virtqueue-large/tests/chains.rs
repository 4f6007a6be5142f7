// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Valid chains: direct, indirect, 32768 descriptors, random layouts, the
//! Reader/Writer API and event-idx.

use std::io::{Read, Write};
use std::sync::Arc;

use proptest::prelude::*;
use virtio_queue::{Queue, QueueT};
use virtqueue_large::mock::{guest_memory, Buf, Layout, MockDriver, UsedEntry};
use virtqueue_large::{ChainLimits, ChainWalker, Error, ErrorKind, MAX_POOLED_SEGMENTS};
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{GuestAddress, GuestMemoryMmap};

#[test]
fn test_direct_chain_reader_and_writer() {
    let mem = guest_memory(1 << 20);
    let mut driver = MockDriver::new(&mem, 16);
    let mut queue = driver.create_queue();
    let layout = driver
        .add_chain_with_data(Layout::Direct, &[b"hello ", b"world"], &[4, 4])
        .unwrap();
    let mut walker = ChainWalker::new(ChainLimits::strict()).unwrap();
    let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
    assert_eq!(chain.head_index(), layout.head);
    assert_eq!(chain.readable_len(), 11);
    assert_eq!(chain.writable_len(), 8);
    assert_eq!(chain.descriptor_count(), 4);
    let mut r = chain.reader();
    let mut s = String::new();
    r.read_to_string(&mut s).unwrap();
    assert_eq!(s, "hello world");
    assert_eq!(r.bytes_read(), 11);
    let mut w = chain.writer();
    w.write_obj(0x0102_0304u32.to_le()).unwrap();
    w.write_all(b"abcd").unwrap();
    assert_eq!(w.available_bytes(), 0);
    assert!(w.write_all(b"x").is_err(), "no room left");
    assert_eq!(
        driver.read_writable(&layout).unwrap(),
        b"\x04\x03\x02\x01abcd"
    );
    queue
        .add_used(&mem, chain.head_index(), w.bytes_written() as u32)
        .unwrap();
    assert_eq!(
        driver.take_used(),
        vec![UsedEntry {
            id: u32::from(layout.head),
            len: 8
        }]
    );
    assert!(walker.pop(&mut queue, &mem).unwrap().is_none());
}

#[test]
fn test_read_obj_and_split_at() {
    let mem = guest_memory(1 << 20);
    let mut driver = MockDriver::new(&mem, 16);
    let mut queue = driver.create_queue();
    // A u32 split over two descriptors, then a tail.
    driver
        .add_chain_with_data(Layout::Indirect, &[&[1, 2], &[3, 4, 5, 6], &[7]], &[3, 6])
        .unwrap();
    let mut walker = ChainWalker::new(ChainLimits::strict()).unwrap();
    let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
    let mut r = chain.reader();
    let mut tail = r.split_at(3).unwrap();
    assert_eq!(r.available_bytes(), 3);
    assert_eq!(tail.available_bytes(), 4);
    assert_eq!(
        tail.read_obj::<u32>().unwrap(),
        u32::from_le_bytes([4, 5, 6, 7])
    );
    let mut head = [0u8; 3];
    r.read_exact(&mut head).unwrap();
    assert_eq!(head, [1, 2, 3]);
    assert!(r.read_obj::<u8>().is_err());
    let err = r.split_at(1).unwrap_err();
    assert!(matches!(
        err,
        Error::SplitOutOfBounds {
            offset: 1,
            available: 0
        }
    ));
    assert_eq!(
        err.to_string(),
        "split offset 1 beyond the 0 bytes available"
    );

    // Writer: fill the payload first, then the header that carries its size.
    let mut header = chain.writer();
    let mut payload = header.split_at(2).unwrap();
    payload.write_all(b"payload").unwrap();
    header
        .write_all(&(payload.bytes_written() as u16).to_le_bytes())
        .unwrap();
    let total = header.bytes_written() + payload.bytes_written();
    assert_eq!(total, 9);
}

#[test]
fn test_32768_descriptor_indirect_chain_on_256_ring() {
    let mem = guest_memory(160 << 20);
    let mut driver = MockDriver::new(&mem, 256);
    let mut queue = driver.create_queue();
    let bufs = vec![Buf::w(4096); 32768];
    let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
    let mut strict = ChainWalker::new(ChainLimits::strict()).unwrap();

    driver.add_chain(Layout::Indirect, &bufs).unwrap();
    let err = strict.pop(&mut queue, &mem).unwrap_err();
    assert!(
        matches!(err, Error::TooManyDescriptors { max: 256 }),
        "{err}"
    );
    assert_eq!(driver.take_used().len(), 1);

    let layout = driver.add_chain(Layout::Indirect, &bufs).unwrap();
    let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
    assert_eq!(chain.descriptor_count(), 32768);
    assert_eq!(chain.writable_len(), 128 << 20);
    assert_eq!(chain.writable_segments().len(), 32768);
    let mut w = chain.writer();
    let pattern: Vec<u8> = (0..(128u32 << 20)).map(|i| (i % 251) as u8).collect();
    w.write_all(&pattern).unwrap();
    assert_eq!(driver.read_writable(&layout).unwrap(), pattern);
}

#[test]
fn test_scattered_layout_places_no_buffer_after_its_predecessor() {
    let mem = guest_memory(8 << 20);
    let mut driver = MockDriver::new(&mem, 16);
    let mut queue = driver.create_queue();
    let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
    let bufs: Vec<Buf> = (0..300u32)
        .map(|i| {
            if i < 100 {
                Buf::r(16 + 16 * (i % 5))
            } else {
                Buf::w(4096)
            }
        })
        .collect();
    for (seed, layout) in [(1, Layout::Indirect), (2, Layout::Direct)] {
        let bufs = if layout == Layout::Direct {
            &bufs[..8]
        } else {
            &bufs[..]
        };
        let chain_layout = driver.add_chain_scattered(layout, bufs, seed).unwrap();
        let b = &chain_layout.buffers;
        assert_eq!(b.len(), bufs.len());
        for w in b.windows(2) {
            assert_ne!(w[0].0 .0 + u64::from(w[0].1), w[1].0 .0, "adjacent buffers");
        }
        // Disjoint, and the chain order is not the memory order.
        let mut sorted = b.clone();
        sorted.sort();
        assert!(sorted
            .windows(2)
            .all(|w| w[0].0 .0 + u64::from(w[0].1) <= w[1].0 .0));
        assert_ne!(&sorted, b);
        let readable: Vec<u8> = (0..b.iter().filter(|x| !x.2).map(|x| x.1).sum::<u32>())
            .map(|i| i as u8)
            .collect();
        driver.fill_readable(&chain_layout, &readable).unwrap();
        let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
        assert_eq!(chain.descriptor_count() as usize, bufs.len());
        let mut got = Vec::new();
        chain.reader().read_to_end(&mut got).unwrap();
        assert_eq!(got, readable);
        let fill: Vec<u8> = (0..chain.writable_len()).map(|i| (i % 7) as u8).collect();
        chain.writer().write_all(&fill).unwrap();
        assert_eq!(driver.read_writable(&chain_layout).unwrap(), fill);
        drop(chain);
        driver.take_used();
    }
    assert!(matches!(
        driver.add_chain_scattered(Layout::Direct, &[], 1),
        Err(virtqueue_large::mock::MockError::EmptyChain)
    ));
}

#[test]
fn test_32769_descriptors_refused_under_large() {
    let mem = guest_memory(16 << 20);
    let mut driver = MockDriver::new(&mem, 256);
    let mut queue = driver.create_queue();
    driver
        .add_chain(Layout::Indirect, &vec![Buf::r(1); 32769])
        .unwrap();
    let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
    let err = walker.pop(&mut queue, &mem).unwrap_err();
    assert!(matches!(err, Error::TooManyDescriptors { max: 32768 }));
    // The limit can be raised to what one table can address.
    driver.take_used();
    driver
        .add_chain(Layout::Indirect, &vec![Buf::r(1); 65535])
        .unwrap();
    let mut walker = ChainWalker::new(ChainLimits::large().with_max_descriptors(65535)).unwrap();
    assert_eq!(
        walker
            .pop(&mut queue, &mem)
            .unwrap()
            .unwrap()
            .descriptor_count(),
        65535
    );
}

#[test]
fn test_event_idx_notification() {
    let mem = guest_memory(1 << 20);
    let mut driver = MockDriver::new(&mem, 16);
    let mut queue = driver.create_queue();
    queue.set_event_idx(true);
    let mut walker = ChainWalker::new(ChainLimits::strict()).unwrap();
    // The driver wants an interrupt only after the second used entry.
    driver.set_used_event(1).unwrap();
    for _ in 0..3 {
        driver
            .add_chain_with_data(Layout::Direct, &[b"x"], &[])
            .unwrap();
    }
    let mut signals = Vec::new();
    for _ in 0..3 {
        let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
        queue.add_used(&mem, chain.head_index(), 0).unwrap();
        signals.push(queue.needs_notification(&mem).unwrap());
    }
    assert_eq!(signals, vec![false, true, false]);
    // Re-enabling notifications publishes avail_event = next_avail.
    assert!(!queue.enable_notification(&mem).unwrap());
    assert_eq!(driver.avail_event(), 3);
}

#[test]
fn test_chain_outlives_queue_borrow_and_moves_to_another_thread() {
    let mem = Arc::new(guest_memory(1 << 20));
    let mut driver = MockDriver::new(&*mem, 16);
    let mut queue: Queue = driver.create_queue();
    let a = driver
        .add_chain_with_data(Layout::Direct, &[b"first"], &[8])
        .unwrap();
    let b = driver
        .add_chain_with_data(Layout::Indirect, &[b"second"], &[8])
        .unwrap();
    let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
    let c1 = walker.pop(&mut queue, Arc::clone(&mem)).unwrap().unwrap();
    let c2 = walker.pop(&mut queue, Arc::clone(&mem)).unwrap().unwrap();
    let (r1, mut w1) = (c1.reader(), c1.writer());
    drop(c1);
    let worker = std::thread::spawn(move || {
        let mut r = r1;
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        w1.write_all(s.to_uppercase().as_bytes()).unwrap();
        w1.bytes_written()
    });
    let mut w2 = c2.writer();
    w2.write_all(b"2").unwrap();
    queue.add_used(&*mem, c2.head_index(), 1).unwrap();
    let n = worker.join().unwrap();
    queue.add_used(&*mem, a.head, n as u32).unwrap();
    assert_eq!(&driver.read_writable(&a).unwrap()[..5], b"FIRST");
    assert_eq!(
        driver.take_used(),
        vec![
            UsedEntry {
                id: u32::from(b.head),
                len: 1
            },
            UsedEntry {
                id: u32::from(a.head),
                len: 5
            },
        ]
    );
}

#[test]
fn test_segment_buffers_are_recycled() {
    let mem = guest_memory(1 << 20);
    let mut driver = MockDriver::new(&mem, 16);
    let mut queue = driver.create_queue();
    let mut walker = ChainWalker::with_pool_size(ChainLimits::strict(), 2).unwrap();
    for _ in 0..4 {
        driver
            .add_chain_with_data(Layout::Direct, &[b"x"], &[1])
            .unwrap();
    }
    let chains: Vec<_> = (0..4)
        .map(|_| walker.pop(&mut queue, &mem).unwrap().unwrap())
        .collect();
    assert_eq!(walker.pooled_buffers(), 0);
    let readers: Vec<_> = chains.iter().map(|c| c.reader()).collect();
    drop(chains);
    assert_eq!(walker.pooled_buffers(), 0, "readers still hold the buffers");
    drop(readers);
    assert_eq!(walker.pooled_buffers(), 2, "capped at the pool size");
}

#[test]
fn test_huge_segment_buffers_are_not_pooled() {
    let mem = guest_memory(8 << 20);
    let mut driver = MockDriver::new(&mem, 16);
    let mut queue = driver.create_queue();
    let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
    let big = MAX_POOLED_SEGMENTS + 1;
    driver
        .add_chain(Layout::Indirect, &vec![Buf::w(16); big])
        .unwrap();
    driver.add_chain(Layout::Direct, &[Buf::w(16)]).unwrap();
    let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
    assert_eq!(chain.writable_segments().len(), big);
    drop(chain);
    // 16 KiB of segments per pooled buffer at most: the big one is freed.
    assert_eq!(walker.pooled_buffers(), 0);
    let small = walker.pop(&mut queue, &mem).unwrap().unwrap();
    drop(small);
    assert_eq!(walker.pooled_buffers(), 1);
}

#[test]
fn test_writes_mark_the_dirty_bitmap() {
    let mem = GuestMemoryMmap::<AtomicBitmap>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let mut driver = MockDriver::new(&mem, 16);
    let mut queue = driver.create_queue();
    let layout = driver
        .add_chain(Layout::Direct, &[Buf::w(3 * 4096)])
        .unwrap();
    let (addr, _, _) = layout.buffers[0];
    let mut walker = ChainWalker::new(ChainLimits::strict()).unwrap();
    let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
    use vm_memory::bitmap::Bitmap;
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
    let region = mem.find_region(addr).unwrap();
    let off = (addr.0 - region.start_addr().0) as usize;
    // The mock never touched the writable buffer.
    assert!(!region.bitmap().dirty_at(off));
    chain.writer().write_all(&[1u8; 10]).unwrap();
    assert!(region.bitmap().dirty_at(off));
    assert!(!region.bitmap().dirty_at(off + 4096));
    let file = tempfile::tempfile().unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[7u8; 8192], 0).unwrap();
    let mut w = chain.writer();
    assert_eq!(w.read_from_file_at(&file, 8192, 0).unwrap(), 8192);
    assert!(
        region.bitmap().dirty_at(off + 4096),
        "preadv marks the bitmap"
    );
    assert!(!region.bitmap().dirty_at(off + 8192));
}

#[test]
fn test_strict_chain_length_equals_queue_size() {
    let mem = guest_memory(1 << 20);
    let mut driver = MockDriver::new(&mem, 16);
    let mut queue = driver.create_queue();
    driver.add_chain(Layout::Direct, &[Buf::r(1); 16]).unwrap();
    let mut walker = ChainWalker::new(ChainLimits::strict()).unwrap();
    let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
    assert_eq!(chain.descriptor_count(), 16);
    queue.add_used(&mem, chain.head_index(), 0).unwrap();
    assert_eq!(driver.take_used().len(), 1);
    driver
        .add_chain(Layout::Indirect, &[Buf::r(1); 17])
        .unwrap();
    let err = walker.pop(&mut queue, &mem).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TooManyDescriptors);
}

fn layout_strategy() -> impl Strategy<Value = (bool, Vec<u32>, Vec<u32>, usize)> {
    (
        any::<bool>(),
        prop::collection::vec(0u32..3000, 0..40),
        prop::collection::vec(0u32..3000, 0..40),
        any::<usize>(),
    )
        .prop_filter("at least one buffer", |(_, r, w, _)| {
            !r.is_empty() || !w.is_empty()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn test_random_valid_chains_yield_exact_bytes((indirect, rlens, wlens, seed) in layout_strategy()) {
        let mem = guest_memory(4 << 20);
        let mut driver = MockDriver::new(&mem, 128);
        let mut queue = driver.create_queue();
        let layout_kind = if indirect { Layout::Indirect } else { Layout::Direct };
        let bufs: Vec<Buf> = rlens.iter().map(|l| Buf::r(*l)).chain(wlens.iter().map(|l| Buf::w(*l))).collect();
        let layout = driver.add_chain(layout_kind, &bufs).unwrap();
        let rtotal: u32 = rlens.iter().sum();
        let wtotal: u32 = wlens.iter().sum();
        let data: Vec<u8> = (0..rtotal).map(|i| (i as usize ^ seed) as u8).collect();
        driver.fill_readable(&layout, &data).unwrap();

        let mut walker = ChainWalker::new(ChainLimits::strict()).unwrap();
        let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
        prop_assert_eq!(chain.readable_len(), rtotal);
        prop_assert_eq!(chain.writable_len(), wtotal);

        // Read in two parts split at a random point.
        let mut r = chain.reader();
        let cut = seed % (rtotal as usize + 1);
        let mut tail = r.split_at(cut).unwrap();
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        tail.read_to_end(&mut got).unwrap();
        prop_assert_eq!(&got, &data);

        // Write a pattern in odd-sized pieces.
        let pattern: Vec<u8> = (0..wtotal).map(|i| (i as usize).wrapping_mul(31).wrapping_add(seed) as u8).collect();
        let mut w = chain.writer();
        for piece in pattern.chunks(1 + seed % 97) {
            w.write_all(piece).unwrap();
        }
        prop_assert_eq!(w.bytes_written(), wtotal as usize);
        prop_assert_eq!(driver.read_writable(&layout).unwrap(), pattern);
    }
}
