// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
#![allow(missing_docs)]
//! Costs of the locking operations: lock and unlock of a region under each
//! policy, a temporary unlock, the pre-flight check and the status read.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use mlock_policy::{LockBudget, LockStatus, MlockPolicy};

/// An anonymous private mapping for the benchmarks, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> Mapping {
        // SAFETY: a fresh anonymous mapping with no address hint; checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        let ptr = ptr.cast::<u8>();
        for off in (0..len).step_by(4096) {
            // SAFETY: inside the writable mapping made above.
            unsafe { ptr.add(off).write_volatile(1) };
        }
        Mapping { ptr, len }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; nothing refers to it any more.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// 64 MiB where the limits allow it, else what fits in a default 8 MiB
/// RLIMIT_MEMLOCK.
fn region_len() -> usize {
    let budget = LockBudget::current().expect("lock budget");
    if budget.allows(64 << 20) {
        64 << 20
    } else {
        4 << 20
    }
}

fn bench_region(c: &mut Criterion) {
    let len = region_len();
    let ram = Mapping::new(len);
    let mut group = c.benchmark_group(format!("region_lock_unlock_{}MiB_resident", len >> 20));
    for policy in [MlockPolicy::Off, MlockPolicy::On, MlockPolicy::OnFault] {
        group.bench_function(policy.as_str(), |b| {
            b.iter(|| {
                // SAFETY: the bench owns the mapping and keeps it while the job or guard lives.
                let lock = unsafe { policy.lock_region(black_box(ram.ptr), ram.len) }.unwrap();
                drop(black_box(lock));
            })
        });
    }
    group.finish();

    // SAFETY: the bench owns the mapping and keeps it while the job or guard lives.
    let mut lock = unsafe { MlockPolicy::OnFault.lock_region(ram.ptr, ram.len) }.unwrap();
    c.bench_function(
        &format!("region_with_unlocked_{}MiB_on_fault", len >> 20),
        |b| b.iter(|| lock.with_unlocked(|| black_box(1)).unwrap()),
    );
    drop(lock);
}

fn bench_checks(c: &mut Criterion) {
    c.bench_function("preflight_regions_on_fault", |b| {
        b.iter(|| black_box(MlockPolicy::OnFault.preflight_regions(black_box(1 << 20))))
    });
    c.bench_function("lock_budget_current", |b| {
        b.iter(|| black_box(LockBudget::current().unwrap()))
    });
    c.bench_function("lock_status_current", |b| {
        b.iter(|| black_box(LockStatus::current().unwrap()))
    });
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    c.bench_function("lock_status_parse", |b| {
        b.iter(|| black_box(LockStatus::parse(black_box(&text)).unwrap()))
    });
    c.bench_function("policy_from_str", |b| {
        b.iter(|| black_box(black_box("on-fault").parse::<MlockPolicy>().unwrap()))
    });
}

criterion_group!(benches, bench_region, bench_checks);
criterion_main!(benches);
