// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! How a server uses coro-pool: one coroutine per request in flight, a
//! worker thread for the blocking calls, a reservation for the in-flight
//! limit and a background trimmer that gives a burst's stacks back.
//!
//! ```text
//! cargo run -p coro-pool --example request_server
//! ```
//!
//! The "requests" here are numbers to square on a worker thread; a real
//! server would read a request from a queue and do a filesystem call.

use std::sync::mpsc;
use std::time::Duration;

use coro_pool::{Coroutine, CoroutineResult, PoolConfig, StackPool, DEFAULT_TRIM_INTERVAL};

/// What a request coroutine hands to the event loop when it has to wait.
struct Blocking(u64);

/// The most requests in flight at once (a virtqueue's size, say).
const MAX_IN_FLIGHT: usize = 1024;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 64 KiB stacks, trimmed every DEFAULT_TRIM_INTERVAL (one second).
    let pool = StackPool::new(
        PoolConfig::default()
            .stack_size(64 << 10)
            .trim_interval(Some(DEFAULT_TRIM_INTERVAL)),
    )?;
    // Keep up to MAX_IN_FLIGHT stacks pooled between bursts while serving.
    let _in_flight = pool.reserve(MAX_IN_FLIGHT);

    // A worker thread runs the blocking calls.
    let (to_worker, jobs) = mpsc::channel::<(usize, u64)>();
    let (to_loop, done) = mpsc::channel::<(usize, u64)>();
    let worker = std::thread::spawn(move || {
        for (slot, x) in jobs {
            let _ = to_loop.send((slot, x * x));
        }
    });

    // A burst: every request starts, runs until it blocks, and waits.
    let mut waiting: Vec<Option<Coroutine<u64, Blocking, u64>>> = Vec::new();
    for (slot, request) in (0..MAX_IN_FLIGHT as u64).enumerate() {
        let mut co = match Coroutine::new_in(&pool, move |y, request: u64| {
            let squared = y.suspend(Blocking(request));
            squared + 1
        }) {
            Ok(co) => co,
            // No stack to be had (budget spent, mmap failed): answer this
            // request with an error and carry on; nothing aborts.
            Err(e) => {
                eprintln!("request {request}: {e}");
                continue;
            }
        };
        if let CoroutineResult::Yield(Blocking(x)) = co.resume(request) {
            to_worker.send((slot, x))?;
        }
        waiting.push(Some(co));
    }
    let burst = pool.stats();
    println!(
        "burst: {} requests in flight, {} stacks, {} VMAs (all pools in the process: {} of {})",
        burst.live_coroutines,
        burst.stacks_held,
        burst.vmas_held,
        burst.process_pool_vmas,
        burst.process_vmas_limit
    );

    // Completions: resume each request with its worker's result.
    let mut sum = 0;
    for _ in 0..waiting.len() {
        let (slot, squared) = done.recv()?;
        if let Some(mut co) = waiting[slot].take() {
            if let CoroutineResult::Return(reply) = co.resume(squared) {
                sum += reply;
            }
        }
    }
    drop(to_worker);
    let _ = worker.join();
    println!("replies summed: {sum}");

    // Idle: two trim passes later the burst's stacks are gone, except this
    // thread's local pool (two batches).
    let trims = pool.stats().trims;
    while pool.stats().trims < trims + 2 {
        std::thread::sleep(Duration::from_millis(50));
    }
    let idle = pool.stats();
    println!(
        "idle after two trims: {} stacks, {} VMAs ({} pooled globally)",
        idle.stacks_held, idle.vmas_held, idle.pooled_global
    );
    Ok(())
}
