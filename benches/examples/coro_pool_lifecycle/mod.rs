// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The lifecycle loops the coro-pool profiling examples time or count: create a coroutine, run
//! it to completion, recycle its stack. Each returns wall-clock ns per
//! lifecycle. `K` is the closure's constant: every value is separate
//! machine code at its own address, so a caller can time several copies of
//! one loop.
use std::hint::black_box;
use std::time::Instant;

use coro_pool::{Coroutine, StackPool};
use corosensei::stack::DefaultStack;

/// On pooled stacks, through `Coroutine::new_in`.
#[inline(never)]
pub fn pooled<const K: u64>(pool: &StackPool, iters: usize) -> coro_pool::Result<f64> {
    let start = Instant::now();
    for i in 0..iters {
        let mut co: Coroutine<u64, (), u64> = Coroutine::new_in(pool, |_, x| x + K)?;
        black_box(co.resume(black_box(i as u64)));
    }
    Ok(per_iteration(start, iters))
}

/// Bare corosensei on one stack that each coroutine borrows.
///
/// # Safety
///
/// `stack` points to a live stack that nothing else uses during the call.
#[inline(never)]
pub unsafe fn bare_borrowed<const K: u64>(stack: *mut DefaultStack, iters: usize) -> f64 {
    let start = Instant::now();
    for i in 0..iters {
        // SAFETY: live and unshared per the contract; each coroutine
        // borrowing it is dropped before the next one borrows it.
        let s: &'static mut DefaultStack = unsafe { &mut *stack };
        let mut co: corosensei::Coroutine<u64, (), u64, &mut DefaultStack> =
            corosensei::Coroutine::with_stack(s, |_, x| x + K);
        black_box(co.resume(black_box(i as u64)));
    }
    per_iteration(start, iters)
}

/// Bare corosensei with one owned stack moved in and out of each coroutine.
#[inline(never)]
pub fn bare_moved<const K: u64>(
    stack: &mut Option<DefaultStack>,
    iters: usize,
) -> Result<f64, &'static str> {
    let start = Instant::now();
    for i in 0..iters {
        let s = stack.take().ok_or("bare stack missing")?;
        let mut co: corosensei::Coroutine<u64, (), u64, DefaultStack> =
            corosensei::Coroutine::with_stack(s, |_, x| x + K);
        black_box(co.resume(black_box(i as u64)));
        *stack = Some(co.into_stack());
    }
    Ok(per_iteration(start, iters))
}

fn per_iteration(start: Instant, iters: usize) -> f64 {
    start.elapsed().as_secs_f64() * 1e9 / iters as f64
}
