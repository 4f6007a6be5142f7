// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
#![allow(missing_docs)]
//! Criterion benches: coroutine lifecycle on pooled, per-coroutine mmap and
//! bare corosensei stacks, a yield round trip, and pool get/put.

use std::hint::black_box;

use coro_pool::{Coroutine, CoroutineResult, PoolConfig, StackPool};
use corosensei::stack::DefaultStack;
use criterion::{criterion_group, criterion_main, Criterion};

const STACK: usize = 64 << 10;

fn lifecycle(c: &mut Criterion) {
    let mut g = c.benchmark_group("lifecycle");
    let pooled = StackPool::new(PoolConfig::default().stack_size(STACK)).unwrap();
    g.bench_function("pooled", |b| {
        b.iter(|| {
            let mut co: Coroutine<u64, (), u64> = Coroutine::new_in(&pooled, |_, x| x + 1).unwrap();
            black_box(co.resume(black_box(1)));
        })
    });
    // One mmap per coroutine: `cargo bench -p coro-pool --features bench-policies`.
    #[cfg(feature = "bench-policies")]
    {
        let mmap = StackPool::new(
            PoolConfig::default()
                .stack_size(STACK)
                .policy(coro_pool::Policy::NoPool),
        )
        .unwrap();
        g.bench_function("mmap", |b| {
            b.iter(|| {
                let mut co: Coroutine<u64, (), u64> =
                    Coroutine::new_in(&mmap, |_, x| x + 1).unwrap();
                black_box(co.resume(black_box(1)));
            })
        });
    }
    let borrowed: *mut DefaultStack = Box::into_raw(Box::new(DefaultStack::new(STACK).unwrap()));
    g.bench_function("bare_borrowed", |b| {
        b.iter(|| {
            // SAFETY: the stack is leaked (never freed), and each coroutine
            // borrowing it runs to completion and is dropped before the next
            // one is made.
            let s: &'static mut DefaultStack = unsafe { &mut *borrowed };
            let mut co: corosensei::Coroutine<u64, (), u64, &mut DefaultStack> =
                corosensei::Coroutine::with_stack(s, |_, x| x + 1);
            black_box(co.resume(black_box(1)));
        })
    });
    let mut stack = Some(DefaultStack::new(STACK).unwrap());
    g.bench_function("bare_moved", |b| {
        b.iter(|| {
            let s = stack.take().unwrap();
            let mut co: corosensei::Coroutine<u64, (), u64, DefaultStack> =
                corosensei::Coroutine::with_stack(s, |_, x| x + 1);
            black_box(co.resume(black_box(1)));
            stack = Some(co.into_stack());
        })
    });
    g.finish();
}

fn yield_roundtrip(c: &mut Criterion) {
    let pool = StackPool::new(PoolConfig::default().stack_size(STACK)).unwrap();
    let mut co: Coroutine<u64, u64, ()> = Coroutine::new_in(&pool, |y, mut x| loop {
        x = y.suspend(x + 1);
    })
    .unwrap();
    c.bench_function("yield_roundtrip", |b| {
        b.iter(|| match co.resume(black_box(1)) {
            CoroutineResult::Yield(v) => black_box(v),
            CoroutineResult::Return(()) => unreachable!(),
        })
    });
}

fn getput(c: &mut Criterion) {
    let pool = StackPool::new(PoolConfig::default().stack_size(STACK)).unwrap();
    let _r = pool.reserve(1024);
    let mut held = Vec::with_capacity(512);
    c.bench_function("getput_burst_512", |b| {
        b.iter(|| {
            for _ in 0..512 {
                held.push(pool.take_stack().unwrap());
            }
            held.clear();
        })
    });
}

criterion_group!(benches, lifecycle, yield_roundtrip, getput);
criterion_main!(benches);
