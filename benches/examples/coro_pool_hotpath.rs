// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A profiling driver for coro-pool (moved here from the crate's
//! `examples/`, which now show how to use the crate): instruction counting
//! of the hot paths with callgrind, after
//! `cargo build --release -p vmm-benches --example coro_pool_hotpath`:
//!
//! ```text
//! valgrind --tool=callgrind target/release/examples/coro_pool_hotpath pooled 1000
//! valgrind --tool=callgrind target/release/examples/coro_pool_hotpath pooled 101000
//! ```
//!
//! The difference of the two totals divided by 100,000 is the cost of one
//! iteration. Modes (the second argument is the iteration count):
//!
//! - `pooled`: create a coroutine on a pooled stack, run it to completion,
//!   recycle the stack;
//! - `bare`: corosensei with one owned stack moved in and out of each
//!   coroutine; `bareref`: corosensei with one stack each coroutine borrows;
//! - `getput`: take a stack and give it back; `burst`: 512 takes, then 512
//!   puts (counted per take + put);
//! - `time`: wall-clock ns per lifecycle, pooled and both bare forms, five
//!   alternating rounds;
//! - `scale`: wall-clock get/put rate of `burst` cycles on one thread and on
//!   two (run it under `chrt -f` on a busy machine so that both threads get
//!   a core).
#[path = "coro_pool_lifecycle/mod.rs"]
mod lifecycle;

use std::hint::black_box;

use coro_pool::{PoolConfig, StackPool};
use corosensei::stack::DefaultStack;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "pooled".to_string());
    let iters: usize = args.next().as_deref().unwrap_or("1000000").parse()?;
    let pool = StackPool::new(PoolConfig::default())?;
    match mode.as_str() {
        "pooled" => {
            lifecycle::pooled::<1>(&pool, iters)?;
        }
        "bare" => {
            let mut stack = Some(DefaultStack::new(coro_pool::DEFAULT_STACK_SIZE)?);
            lifecycle::bare_moved::<1>(&mut stack, iters)?;
        }
        "bareref" => {
            let mut stack = DefaultStack::new(coro_pool::DEFAULT_STACK_SIZE)?;
            // SAFETY: the stack lives through the call and nothing else uses it.
            unsafe { lifecycle::bare_borrowed::<1>(&mut stack, iters) };
        }
        "getput" => {
            for _ in 0..iters {
                black_box(pool.take_stack()?);
            }
        }
        "burst" => {
            let _demand = pool.reserve(1024);
            let mut held = Vec::with_capacity(512);
            for _ in 0..iters.div_ceil(512) {
                for _ in 0..512 {
                    held.push(pool.take_stack()?);
                }
                held.clear();
            }
        }
        "scale" => {
            // Wall-clock rate of `burst` cycles on 1 and on 2 threads.
            let pool =
                std::sync::Arc::new(StackPool::new(PoolConfig::default().stack_size(64 << 10))?);
            let _demand = pool.reserve(2048);
            for threads in [1usize, 2, 1, 2] {
                let start = std::time::Instant::now();
                std::thread::scope(|s| {
                    for _ in 0..threads {
                        let pool = &pool;
                        s.spawn(move || {
                            let mut held = Vec::with_capacity(512);
                            for _ in 0..iters.div_ceil(512) {
                                for _ in 0..512 {
                                    held.push(pool.take_stack().unwrap());
                                }
                                held.clear();
                            }
                        });
                    }
                });
                let secs = start.elapsed().as_secs_f64();
                println!(
                    "{threads} threads: {:.1} Mops/s",
                    (threads * iters * 2) as f64 / secs / 1e6
                );
            }
        }
        "time" => {
            // ns per lifecycle, pooled and bare alternated, 5 rounds.
            let mut moved = Some(DefaultStack::new(coro_pool::DEFAULT_STACK_SIZE)?);
            let mut borrowed = DefaultStack::new(coro_pool::DEFAULT_STACK_SIZE)?;
            for _ in 0..5 {
                let pooled = lifecycle::pooled::<1>(&pool, iters)?;
                let bare = lifecycle::bare_moved::<1>(&mut moved, iters)?;
                // SAFETY: the stack lives through the call and nothing else
                // uses it.
                let bare_ref = unsafe { lifecycle::bare_borrowed::<1>(&mut borrowed, iters) };
                println!(
                    "pooled {pooled:.2} ns, bare (moved stack) {bare:.2} ns, bare (borrowed stack) {bare_ref:.2} ns, ratio {:.3} / {:.3}",
                    pooled / bare,
                    pooled / bare_ref
                );
            }
        }
        other => return Err(format!("unknown mode {other}").into()),
    }
    Ok(())
}
