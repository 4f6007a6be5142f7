// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! For devices other than 9p: adopting a chain that virtio-queue popped,
//! and iovec views for asynchronous backends.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use virtio_queue::{Queue, QueueT};
use virtqueue_large::mock::{guest_memory, Buf, Layout, Malicious, MockDriver, MockPackedDriver};
use virtqueue_large::{ChainLimits, ChainWalker, DeviceRing, Error, ErrorKind};

#[test]
fn test_adopt_a_chain_popped_by_virtio_queue() {
    let mem = guest_memory(1 << 20);
    let mut driver = MockDriver::new(&mem, 16);
    let mut queue: Queue = driver.create_queue();
    let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
    let laid = driver
        .add_chain_with_data(Layout::Indirect, &[b"adopted"], &[8])
        .unwrap();
    let popped = queue
        .pop_descriptor_chain(&mem)
        .expect("virtio-queue pops it");
    let chain = walker.adopt(&queue, &popped, &mem).unwrap();
    assert_eq!(chain.head_index(), laid.head);
    let mut got = Vec::new();
    chain.reader().read_to_end(&mut got).unwrap();
    assert_eq!(got, b"adopted");
    assert_eq!(chain.writable_len(), 8);
}

#[test]
fn test_adopt_reports_what_virtio_queue_ends_silently() {
    let mem = guest_memory(Malicious::MIN_MEMORY);
    for (pattern, kind) in [
        (Malicious::RingLoop, ErrorKind::DescriptorLoop),
        (
            Malicious::ReadableAfterWritable,
            ErrorKind::ReadableAfterWritable,
        ),
        (Malicious::BufferPastEnd, ErrorKind::BufferOutsideMemory),
    ] {
        let mut driver = MockDriver::new(&mem, 32);
        let mut queue: Queue = driver.create_queue();
        let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
        driver.add_malicious(pattern).unwrap();
        let popped = queue
            .pop_descriptor_chain(&mem)
            .expect("virtio-queue pops it");
        // virtio-queue's iterator yields something and then just stops.
        let _ = popped.clone().count();
        let err = walker.adopt(&queue, &popped, &mem).unwrap_err();
        assert_eq!(err.kind(), kind, "{pattern:?}: {err}");
    }
}

#[test]
fn test_writer_iovecs_filled_by_the_kernel_then_advanced() {
    let mem = guest_memory(1 << 20);
    let mut driver = MockDriver::new(&mem, 16);
    let mut queue: Queue = driver.create_queue();
    let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
    // Scattered buffers: one iovec each.
    let laid = driver
        .add_chain_scattered(
            Layout::Indirect,
            &[Buf::w(100), Buf::w(200), Buf::w(300)],
            7,
        )
        .unwrap();
    let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
    let file = tempfile::tempfile().unwrap();
    let data: Vec<u8> = (0..600u32).map(|i| (i % 251) as u8).collect();
    file.write_all_at(&data, 0).unwrap();

    let mut w = chain.writer();
    // At most two iovecs: the first two buffers.
    let view = w.iovecs(usize::MAX, 2).unwrap();
    assert_eq!(view.as_slice().len(), 2);
    assert_eq!(view.byte_len(), 300);
    // SAFETY: the view is alive across the call, so its iovecs point into
    // mapped guest memory; they describe device-writable buffers, which
    // the kernel writes.
    let n = unsafe {
        libc::preadv(
            file.as_raw_fd(),
            view.as_slice().as_ptr(),
            view.as_slice().len() as libc::c_int,
            0,
        )
    };
    assert_eq!(n, 300);
    view.advance(n as usize).unwrap();
    assert_eq!(w.bytes_written(), 300);
    // A view dropped without advancing moves nothing.
    drop(w.iovecs(usize::MAX, 8).unwrap());
    assert_eq!(w.available_bytes(), 300);
    // Advancing past the view is refused.
    let view = w.iovecs(50, 8).unwrap();
    assert!(matches!(
        view.advance(51),
        Err(Error::SplitOutOfBounds {
            offset: 51,
            available: 50
        })
    ));
    w.write_all(&data[300..]).unwrap();
    assert!(w.iovecs(usize::MAX, 8).unwrap().is_empty());
    assert_eq!(driver.read_writable(&laid).unwrap(), data);
}

#[test]
fn test_reader_iovecs_merge_adjacent_buffers_on_a_packed_chain() {
    let mem = guest_memory(1 << 20);
    let mut driver = MockPackedDriver::new(&mem, 8);
    let mut queue = driver.create_queue();
    let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
    // 16-byte buffers laid out back to back: one iovec.
    let laid = driver
        .add_chain(Layout::Direct, &[Buf::r(16), Buf::r(16), Buf::r(16)])
        .unwrap();
    let payload: Vec<u8> = (0..48u8).collect();
    driver.fill_readable(&laid, &payload).unwrap();
    let chain = queue.pop_chain(&mut walker, &mem).unwrap().unwrap();
    let mut r = chain.reader();
    let view = r.iovecs(40, 8).unwrap();
    assert_eq!(view.as_slice().len(), 1);
    assert_eq!(view.byte_len(), 40);
    let file = tempfile::tempfile().unwrap();
    // SAFETY: the view is alive across the call; the kernel only reads the
    // device-readable buffers it describes.
    let n = unsafe {
        libc::pwritev(
            file.as_raw_fd(),
            view.as_slice().as_ptr(),
            view.as_slice().len() as libc::c_int,
            0,
        )
    };
    assert_eq!(n, 40);
    view.advance(40).unwrap();
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, &payload[40..]);
    let mut back = vec![0u8; 40];
    file.read_exact_at(&mut back, 0).unwrap();
    assert_eq!(back, &payload[..40]);
}
