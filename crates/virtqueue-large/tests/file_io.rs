// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Zero-copy file I/O: preadv/pwritev chunked at IOV_MAX, short reads and
//! writes, pipes.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use virtio_queue::Queue;
use virtqueue_large::mock::{guest_memory, take_io_trace, Buf, ChainLayout, Layout, MockDriver};
use virtqueue_large::{Chain, ChainLimits, ChainWalker, IOV_MAX};
use vm_memory::GuestMemoryMmap;

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut x = seed | 1;
    while out.len() < len {
        // xorshift64
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn pipe(nonblocking_write: bool) -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    if nonblocking_write {
        // SAFETY: fds[1] is the write end just created and owned here.
        let rc = unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) };
        assert_eq!(rc, 0);
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    unsafe {
        (
            File::from(OwnedFd::from_raw_fd(fds[0])),
            File::from(OwnedFd::from_raw_fd(fds[1])),
        )
    }
}

type OneChain<'m> = (
    MockDriver<'m, GuestMemoryMmap>,
    ChainLayout,
    Chain<&'m GuestMemoryMmap>,
);

/// One chain whose buffers follow each other in guest memory.
fn one_chain<'m>(mem: &'m GuestMemoryMmap, layout: Layout, bufs: &[Buf]) -> OneChain<'m> {
    chain_with(mem, layout, bufs, None)
}

/// One chain whose buffers sit at shuffled places (no two adjacent), as a
/// guest's scattered pages do.
fn scattered_chain<'m>(mem: &'m GuestMemoryMmap, layout: Layout, bufs: &[Buf]) -> OneChain<'m> {
    chain_with(mem, layout, bufs, Some(0x5eed))
}

fn chain_with<'m>(
    mem: &'m GuestMemoryMmap,
    layout: Layout,
    bufs: &[Buf],
    scatter: Option<u64>,
) -> OneChain<'m> {
    let mut driver = MockDriver::new(mem, 256);
    let mut queue: Queue = driver.create_queue();
    let layout = match scatter {
        Some(seed) => driver.add_chain_scattered(layout, bufs, seed).unwrap(),
        None => driver.add_chain(layout, bufs).unwrap(),
    };
    let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
    let chain = walker.pop(&mut queue, mem).unwrap().unwrap();
    (driver, layout, chain)
}

#[test]
fn test_128mib_chain_through_preadv_and_pwritev_chunked_at_iov_max() {
    const SIZE: usize = 128 << 20;
    let data = pattern(SIZE, 0x9e37_79b9_7f4a_7c15);
    let src = tempfile::tempfile().unwrap();
    src.write_all_at(&data, 0).unwrap();

    let mem = guest_memory(SIZE + (16 << 20));
    let bufs = vec![Buf::w(4096); 32768];
    // Scattered pages: one iovec per descriptor, 1024 per call.
    let (driver, layout, chain) = scattered_chain(&mem, Layout::Indirect, &bufs);
    let mut w = chain.writer();
    take_io_trace();
    assert_eq!(w.read_from_file_at(&src, SIZE, 0).unwrap(), SIZE);
    let trace = take_io_trace();
    assert_eq!(trace.len(), 32768 / IOV_MAX);
    assert!(trace
        .iter()
        .all(|c| c.iovecs == IOV_MAX && c.transferred == c.requested));
    assert_eq!(w.available_bytes(), 0);
    assert!(
        driver.read_writable(&layout).unwrap() == data,
        "preadv data"
    );
    drop(driver);

    // The other direction: a readable chain written to a file.
    let bufs = vec![Buf::r(4096); 32768];
    let (driver, layout, chain) = scattered_chain(&mem, Layout::Indirect, &bufs);
    driver.fill_readable(&layout, &data).unwrap();
    let dst = tempfile::tempfile().unwrap();
    let mut r = chain.reader();
    assert_eq!(r.write_to_file_at(&dst, SIZE, 0).unwrap(), SIZE);
    let trace = take_io_trace();
    assert_eq!(trace.len(), 32);
    assert!(trace.iter().all(|c| c.iovecs <= IOV_MAX));
    let mut back = Vec::with_capacity(SIZE);
    (&dst).read_to_end(&mut back).unwrap();
    assert!(back == data, "pwritev data");
}

#[test]
fn test_adjacent_buffers_share_one_iovec() {
    const SIZE: usize = 128 << 20;
    let data = pattern(SIZE, 0x2545_f491_4f6c_dd1d);
    let src = tempfile::tempfile().unwrap();
    src.write_all_at(&data, 0).unwrap();
    let mem = guest_memory(SIZE + (16 << 20));
    // 32768 descriptors over consecutive pages: one iovec, one call.
    let (driver, layout, chain) = one_chain(&mem, Layout::Indirect, &[Buf::w(4096); 32768]);
    let mut w = chain.writer();
    take_io_trace();
    assert_eq!(w.read_from_file_at(&src, SIZE, 0).unwrap(), SIZE);
    let trace = take_io_trace();
    assert_eq!(
        trace
            .iter()
            .map(|c| (c.iovecs, c.requested, c.transferred))
            .collect::<Vec<_>>(),
        [(1, SIZE, SIZE)]
    );
    assert!(driver.read_writable(&layout).unwrap() == data, "data");
    drop(driver);

    // Mixed: 4096 then 10 bytes are adjacent, the 16-byte aligned third
    // buffer is not; the split point inside the merged iovec still works.
    let data = pattern(4096 + 10 + 4096, 21);
    src.write_all_at(&data, 0).unwrap();
    let bufs = [Buf::w(4096), Buf::w(10), Buf::w(4096)];
    let (driver, layout, chain) = one_chain(&mem, Layout::Direct, &bufs);
    assert_eq!(layout.buffers[1].0 .0, layout.buffers[0].0 .0 + 4096);
    assert_ne!(layout.buffers[2].0 .0, layout.buffers[1].0 .0 + 10);
    let mut w = chain.writer();
    assert_eq!(w.read_from_file_at(&src, 100, 0).unwrap(), 100);
    assert_eq!(
        w.read_from_file_at(&src, 1 << 20, 100).unwrap(),
        data.len() - 100
    );
    let trace = take_io_trace();
    assert_eq!(
        trace.iter().map(|c| c.iovecs).collect::<Vec<_>>(),
        [1, 2],
        "the rest of buffer 0 and buffer 1 share an iovec"
    );
    assert_eq!(driver.read_writable(&layout).unwrap(), data);

    // The other direction merges too.
    let bufs = [Buf::r(4096), Buf::r(4096), Buf::r(4096)];
    let (driver, layout, chain) = one_chain(&mem, Layout::Indirect, &bufs);
    let data = pattern(3 * 4096, 33);
    driver.fill_readable(&layout, &data).unwrap();
    let dst = tempfile::tempfile().unwrap();
    assert_eq!(
        chain.reader().write_to_file_at(&dst, 1 << 20, 0).unwrap(),
        data.len()
    );
    assert_eq!(take_io_trace()[0].iovecs, 1);
    let mut back = Vec::new();
    (&dst).read_to_end(&mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn test_short_read_at_end_of_small_file() {
    let data = pattern(10_000, 7);
    let src = tempfile::tempfile().unwrap();
    src.write_all_at(&data, 0).unwrap();
    let mem = guest_memory(8 << 20);
    let (driver, layout, chain) = one_chain(&mem, Layout::Direct, &[Buf::w(4096); 8]);
    let mut w = chain.writer();
    take_io_trace();
    assert_eq!(w.read_from_file_at(&src, 32768, 0).unwrap(), 10_000);
    let trace = take_io_trace();
    assert_eq!(trace.len(), 1, "stops at the short read");
    // The eight adjacent pages share one iovec.
    assert_eq!(
        (trace[0].iovecs, trace[0].requested, trace[0].transferred),
        (1, 32768, 10_000)
    );
    assert_eq!(w.bytes_written(), 10_000);
    assert_eq!(
        w.read_from_file_at(&src, 32768, 10_000).unwrap(),
        0,
        "end of file"
    );
    assert_eq!(&driver.read_writable(&layout).unwrap()[..10_000], &data[..]);
}

#[test]
fn test_partial_transfers_resume_inside_a_segment() {
    let data = pattern(3 * 4096, 11);
    let src = tempfile::tempfile().unwrap();
    src.write_all_at(&data, 0).unwrap();
    let mem = guest_memory(8 << 20);
    let (driver, layout, chain) = one_chain(&mem, Layout::Indirect, &[Buf::w(4096); 3]);
    let mut w = chain.writer();
    let mut done = 0;
    for step in [5000usize, 1, 4095, 3000] {
        done += w.read_from_file_at(&src, step, done as u64).unwrap();
    }
    done += w.read_from_file_at(&src, 1 << 20, done as u64).unwrap();
    assert_eq!(done, 3 * 4096);
    assert_eq!(driver.read_writable(&layout).unwrap(), data);
}

#[test]
fn test_short_io_across_a_chunk_boundary() {
    // 2048 segments: the first call fills 1024 iovecs, the second is short.
    let len = IOV_MAX * 4096 + 100;
    let data = pattern(len, 3);
    let src = tempfile::tempfile().unwrap();
    src.write_all_at(&data, 0).unwrap();
    let mem = guest_memory(16 << 20);
    let (driver, layout, chain) = scattered_chain(&mem, Layout::Indirect, &[Buf::w(4096); 2048]);
    let mut w = chain.writer();
    take_io_trace();
    assert_eq!(w.read_from_file_at(&src, 2048 * 4096, 0).unwrap(), len);
    let trace = take_io_trace();
    assert_eq!(trace.len(), 2);
    assert_eq!(
        (trace[0].iovecs, trace[0].transferred),
        (IOV_MAX, IOV_MAX * 4096)
    );
    assert_eq!((trace[1].iovecs, trace[1].transferred), (IOV_MAX, 100));
    assert_eq!(&driver.read_writable(&layout).unwrap()[..len], &data[..]);
}

#[test]
fn test_short_reads_from_a_pipe() {
    let data = pattern(300 * 1024, 5);
    let (rd, mut wr) = pipe(false);
    let feeder = {
        let data = data.clone();
        std::thread::spawn(move || {
            for piece in data.chunks(7000) {
                wr.write_all(piece).unwrap();
            }
        })
    };
    let mem = guest_memory(8 << 20);
    let (driver, layout, chain) = one_chain(&mem, Layout::Indirect, &[Buf::w(1000); 308]);
    let mut w = chain.writer();
    take_io_trace();
    let mut total = 0;
    loop {
        let n = w.read_from(&rd, usize::MAX).unwrap();
        if n == 0 {
            break;
        }
        total += n;
    }
    feeder.join().unwrap();
    assert_eq!(total, data.len());
    let trace = take_io_trace();
    assert!(
        trace.iter().any(|c| c.transferred < c.requested),
        "no short read seen"
    );
    assert_eq!(
        &driver.read_writable(&layout).unwrap()[..data.len()],
        &data[..]
    );
}

#[test]
fn test_short_writes_to_a_nonblocking_pipe() {
    let data = pattern(1 << 20, 9);
    let mem = guest_memory(8 << 20);
    let (driver, layout, chain) = one_chain(&mem, Layout::Indirect, &[Buf::r(4096); 256]);
    driver.fill_readable(&layout, &data).unwrap();
    let (mut rd, wr) = pipe(true);
    let mut r = chain.reader();
    let mut out = Vec::new();
    let mut short = 0;
    while r.available_bytes() > 0 {
        match r.write_to(&wr, usize::MAX) {
            Ok(n) => {
                assert!(n > 0);
                if n < 1 << 20 {
                    short += 1;
                }
            }
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock),
        }
        // Drain what the pipe holds.
        let mut buf = vec![0u8; 1 << 20];
        let pending = data.len() - r.available_bytes() - out.len();
        if pending > 0 {
            let n = rd.read(&mut buf[..pending]).unwrap();
            out.extend_from_slice(&buf[..n]);
        }
    }
    drop(wr);
    rd.read_to_end(&mut out).unwrap();
    assert!(short > 0);
    assert_eq!(r.bytes_read(), data.len());
    assert!(out == data);
}

#[test]
fn test_file_io_errors() {
    let mem = guest_memory(8 << 20);
    let (_driver, _layout, chain) = one_chain(&mem, Layout::Direct, &[Buf::r(16), Buf::w(16)]);
    let file = tempfile::tempfile().unwrap();
    let err = chain
        .writer()
        .read_from_file_at(&file, 16, u64::MAX - 4)
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    // A read-only descriptor refuses writes; the cursor does not move.
    let ro = File::open("/dev/null").unwrap();
    let mut r = chain.reader();
    assert!(r.write_to_file_at(&ro, 16, 0).is_err());
    assert_eq!(r.available_bytes(), 16);
}
