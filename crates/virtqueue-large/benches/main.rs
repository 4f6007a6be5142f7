// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
#![allow(missing_docs)]
//! Criterion benches: the validating walk against virtio-queue's iterator,
//! small Reader/Writer copies, and preadv into a large chain.

use std::hint::black_box;
use std::io::Write;
use std::os::unix::fs::FileExt;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use virtio_queue::{Queue, QueueT};
use virtqueue_large::mock::{guest_memory, Buf, Layout, MockDriver};
use virtqueue_large::{ChainLimits, ChainWalker};

fn walk(c: &mut Criterion) {
    let mut group = c.benchmark_group("walk");
    for descs in [256usize, 32768] {
        let mem = guest_memory(descs * 4096 + (16 << 20));
        let mut driver = MockDriver::new(&mem, 256);
        let mut queue: Queue = driver.create_queue();
        driver
            .add_chain(Layout::Indirect, &vec![Buf::w(4096); descs])
            .unwrap();
        let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
        group.throughput(Throughput::Elements(descs as u64));
        group.bench_function(format!("virtqueue_large_{descs}"), |b| {
            b.iter(|| {
                queue.set_next_avail(0);
                let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
                black_box(chain.writable_len())
            })
        });
        group.bench_function(format!("virtio_queue_{descs}"), |b| {
            b.iter(|| {
                queue.set_next_avail(0);
                let chain = queue.pop_descriptor_chain(&mem).unwrap();
                chain.map(|d| u64::from(d.len())).sum::<u64>()
            })
        });
    }
    group.finish();
}

fn small_request(c: &mut Criterion) {
    let mem = guest_memory(1 << 20);
    let mut driver = MockDriver::new(&mem, 256);
    let mut queue: Queue = driver.create_queue();
    driver
        .add_chain_with_data(Layout::Direct, &[&[7u8; 23]], &[4096])
        .unwrap();
    let mut walker = ChainWalker::new(ChainLimits::strict()).unwrap();
    c.bench_function("pop_read_header_write_reply", |b| {
        b.iter(|| {
            queue.set_next_avail(0);
            let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
            let mut r = chain.reader();
            let hdr: [u8; 7] = r.read_obj().unwrap();
            let mut w = chain.writer();
            w.write_all(&hdr).unwrap();
            w.write_all(&[0u8; 64]).unwrap();
            black_box(w.bytes_written())
        })
    });
}

fn preadv(c: &mut Criterion) {
    let descs = 4096usize;
    let bytes = descs * 4096;
    let mem = guest_memory(2 * bytes + (16 << 20));
    let mut driver = MockDriver::new(&mem, 256);
    let mut queue: Queue = driver.create_queue();
    let bufs = vec![Buf::w(4096); descs];
    // Scattered pages: one iovec each; adjacent pages: merged into one.
    driver
        .add_chain_scattered(Layout::Indirect, &bufs, 0x5eed)
        .unwrap();
    driver.add_chain(Layout::Indirect, &bufs).unwrap();
    let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
    let scattered = walker.pop(&mut queue, &mem).unwrap().unwrap();
    let adjacent = walker.pop(&mut queue, &mem).unwrap().unwrap();
    let file = tempfile::tempfile().unwrap();
    file.write_all_at(&vec![1u8; bytes], 0).unwrap();
    let mut group = c.benchmark_group("file");
    group.throughput(Throughput::Bytes(bytes as u64));
    for (name, chain) in [("scattered", &scattered), ("adjacent", &adjacent)] {
        group.bench_function(format!("preadv_16m_into_4096_{name}_pages"), |b| {
            b.iter(|| chain.writer().read_from_file_at(&file, bytes, 0).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, walk, small_request, preadv);
criterion_main!(benches);
