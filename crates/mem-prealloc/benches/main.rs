// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
#![allow(missing_docs)]
//! Criterion benches: preallocating a small memfd by method and thread count,
//! and the kernel's MAP_POPULATE of the same size. The cross-peer comparison
//! (4 GiB, QEMU) lives in the `mem-prealloc` suite of `vmm-benches`.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use mem_prealloc::{preallocate, Method, PreallocOptions};

const LEN: usize = 32 << 20;

fn memfd(len: usize) -> File {
    let name = CString::new("bench").unwrap();
    // SAFETY: a NUL-terminated name; the fd is owned by the File.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh descriptor nobody else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len as u64).unwrap();
    file
}

struct Mapping(*mut libc::c_void, usize, #[allow(dead_code)] File);

impl Mapping {
    fn new(len: usize, extra_flags: i32) -> Self {
        let file = memfd(len);
        // SAFETY: a new shared mapping of our memfd.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | extra_flags,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        Mapping(addr, len, file)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly this mapping.
        unsafe { libc::munmap(self.0, self.1) };
    }
}

fn bench_prealloc(c: &mut Criterion) {
    let mut group = c.benchmark_group("prealloc_32mib");
    group.throughput(Throughput::Bytes(LEN as u64));
    group.sample_size(20);
    for (name, method, threads) in [
        ("populate_write_1t", Method::PopulateWrite, 1),
        ("populate_write_2t", Method::PopulateWrite, 2),
        ("touch_1t", Method::Touch, 1),
        ("touch_2t", Method::Touch, 2),
    ] {
        let opts = PreallocOptions::new().method(method).threads(threads);
        group.bench_function(name, |b| {
            b.iter_batched(
                || Mapping::new(LEN, 0),
                |map| {
                    // SAFETY: the bench owns the mapping and keeps it while the job or guard lives.
                    unsafe { preallocate(map.0.cast(), LEN, &opts) }.unwrap();
                    map
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.bench_function("map_populate", |b| {
        b.iter_batched(
            || memfd(LEN),
            |file| {
                // SAFETY: a new shared mapping of our memfd, unmapped below
                // (outside the timed part, when the output is dropped).
                let addr = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        LEN,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED | libc::MAP_POPULATE,
                        file.as_raw_fd(),
                        0,
                    )
                };
                assert_ne!(addr, libc::MAP_FAILED);
                Mapping(addr, LEN, file)
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, bench_prealloc);
criterion_main!(benches);
