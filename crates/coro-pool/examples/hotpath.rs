//! A driver for instruction counting of the hot paths with callgrind:
//!
//! ```text
//! valgrind --tool=callgrind target/release/examples/hotpath pooled 1000
//! valgrind --tool=callgrind target/release/examples/hotpath pooled 101000
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
use std::hint::black_box;

use coro_pool::{Coroutine, PoolConfig, StackPool};
use corosensei::stack::DefaultStack;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "pooled".to_string());
    let iters: usize = args.next().as_deref().unwrap_or("1000000").parse()?;
    let pool = StackPool::new(PoolConfig::default())?;
    match mode.as_str() {
        "pooled" => {
            for i in 0..iters {
                let mut co: Coroutine<u64, (), u64> = Coroutine::new_in(&pool, |_, x| x + 1)?;
                black_box(co.resume(black_box(i as u64)));
            }
        }
        "bare" => {
            let mut stack = Some(DefaultStack::new(coro_pool::DEFAULT_STACK_SIZE)?);
            for i in 0..iters {
                let s = stack.take().ok_or("bare stack missing")?;
                let mut co: corosensei::Coroutine<u64, (), u64, DefaultStack> =
                    corosensei::Coroutine::with_stack(s, |_, x| x + 1);
                black_box(co.resume(black_box(i as u64)));
                stack = Some(co.into_stack());
            }
        }
        "bareref" => {
            let stack: *mut DefaultStack =
                Box::into_raw(Box::new(DefaultStack::new(coro_pool::DEFAULT_STACK_SIZE)?));
            for i in 0..iters {
                // SAFETY: the stack is leaked (never freed) and each
                // coroutine borrowing it is dropped before the next one.
                let s: &'static mut DefaultStack = unsafe { &mut *stack };
                let mut co: corosensei::Coroutine<u64, (), u64, &mut DefaultStack> =
                    corosensei::Coroutine::with_stack(s, |_, x| x + 1);
                black_box(co.resume(black_box(i as u64)));
            }
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
            let mut stack = Some(DefaultStack::new(coro_pool::DEFAULT_STACK_SIZE)?);
            let stack2: *mut DefaultStack =
                Box::into_raw(Box::new(DefaultStack::new(coro_pool::DEFAULT_STACK_SIZE)?));
            for _ in 0..5 {
                let start = std::time::Instant::now();
                for i in 0..iters {
                    let mut co: Coroutine<u64, (), u64> = Coroutine::new_in(&pool, |_, x| x + 1)?;
                    black_box(co.resume(black_box(i as u64)));
                }
                let pooled = start.elapsed().as_secs_f64() * 1e9 / iters as f64;
                let start = std::time::Instant::now();
                for i in 0..iters {
                    let s = stack.take().ok_or("bare stack missing")?;
                    let mut co: corosensei::Coroutine<u64, (), u64, DefaultStack> =
                        corosensei::Coroutine::with_stack(s, |_, x| x + 1);
                    black_box(co.resume(black_box(i as u64)));
                    stack = Some(co.into_stack());
                }
                let bare = start.elapsed().as_secs_f64() * 1e9 / iters as f64;
                let start = std::time::Instant::now();
                for i in 0..iters {
                    // SAFETY: as in `bareref`.
                    let s: &'static mut DefaultStack = unsafe { &mut *stack2 };
                    let mut co: corosensei::Coroutine<u64, (), u64, &mut DefaultStack> =
                        corosensei::Coroutine::with_stack(s, |_, x| x + 1);
                    black_box(co.resume(black_box(i as u64)));
                }
                let bare_ref = start.elapsed().as_secs_f64() * 1e9 / iters as f64;
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
