// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! How close can any stack pool get to bare corosensei? Builds the pool's
//! costs up one at a time on the same lifecycle (create a coroutine, run it
//! to completion, give the stack back) and prints each step against bare
//! corosensei borrowing one stack:
//!
//! 1. `slot`: the smallest possible pool, one stack in a slot reached
//!    through a handle, given back when the coroutine returns; no counters,
//!    and nothing kept to unwind a coroutine dropped before it returns (the
//!    loops never drop one; a real pool must handle it);
//! 2. `slot+tls+counters`: the slot found through a thread-local lookup as
//!    `StackPool` does, and counting takes and puts as `Stats` needs;
//! 3. `slot+tls+counters+unwind`: also keeps what a dropped suspended
//!    coroutine needs to be unwound (the corosensei state, handed to a cold
//!    path by reference), as every correct wrapper must;
//! 4. `coro-pool`: `Coroutine::new_in`.
//!
//! ```text
//! cargo run --release -p vmm-benches --example coro_pool_overhead_floor
//! ```
//!
//! Each timing is the median over 8 copies of its loop (separate machine
//! code; see the `coro-pool` suite of `vmm-benches`), 1M iterations each,
//! after an untimed pass; each step's ratio is the median over 5 rounds.
// Shared with coro_pool_hotpath.rs, which also times the moved-stack peer.
#[allow(dead_code)]
#[path = "coro_pool_lifecycle/mod.rs"]
mod lifecycle;

use std::cell::Cell;
use std::hint::black_box;
use std::mem::ManuallyDrop;
use std::num::NonZeroUsize;
use std::time::Instant;

use coro_pool::{PoolConfig, StackPool};
use corosensei::stack::{DefaultStack, Stack, StackPointer};
use corosensei::CoroutineResult;

/// The one-slot pool: the idle stack's top (0 when taken) and counters.
struct Slot {
    top: Cell<usize>,
    limit: usize,
    takes: Cell<u64>,
    puts: Cell<u64>,
}

thread_local! {
    static SLOT_KEY: Cell<usize> = const { Cell::new(0) };
    static SLOT: Cell<*const Slot> = const { Cell::new(std::ptr::null()) };
}

/// A stack's bounds while a coroutine runs on it.
#[derive(Clone, Copy)]
struct Bounds {
    top: usize,
    slot: *const Slot,
}

// SAFETY: the bounds are those of the `DefaultStack` leaked in main(),
// which outlives every coroutine, and only one coroutine runs on it at a
// time (the slot hands it out once until it is given back).
unsafe impl Stack for Bounds {
    fn base(&self) -> StackPointer {
        NonZeroUsize::new(self.top).expect("stack top is not 0")
    }

    fn limit(&self) -> StackPointer {
        // SAFETY: the slot is leaked in main() and outlives the stack.
        NonZeroUsize::new(unsafe { &*self.slot }.limit).expect("stack limit is not 0")
    }
}

#[inline(always)]
fn take<const COUNT: bool>(slot: *const Slot) -> Bounds {
    // SAFETY: the slot is leaked in main() and only this thread uses it.
    let s = unsafe { &*slot };
    let top = s.top.replace(0);
    if top == 0 {
        impossible("the one-slot pool has one stack");
    }
    if COUNT {
        s.takes.set(s.takes.get() + 1);
    }
    Bounds { top, slot }
}

#[inline(always)]
fn put<const COUNT: bool>(b: Bounds) {
    // SAFETY: as in take().
    let s = unsafe { &*b.slot };
    if COUNT {
        s.puts.set(s.puts.get() + 1);
    }
    s.top.set(b.top);
}

#[inline(always)]
fn find_slot(key: usize) -> *const Slot {
    if SLOT_KEY.with(Cell::get) == key {
        SLOT.with(Cell::get)
    } else {
        impossible("no slot registered for this key")
    }
}

#[cold]
#[inline(never)]
fn impossible(what: &str) -> ! {
    panic!("{what}")
}

/// A coroutine on the slot's stack that gives it back when it returns.
/// `UNWIND`: a dropped unfinished coroutine is unwound (what a real pool
/// must do); otherwise that path panics, and with no cold path taking the
/// corosensei state by reference the compiler keeps it in registers.
struct SlotCoroutine<const COUNT: bool, const UNWIND: bool> {
    inner: ManuallyDrop<corosensei::Coroutine<u64, (), u64, Bounds>>,
    bounds: Bounds,
}

#[cold]
#[inline(never)]
fn unwind(inner: &mut ManuallyDrop<corosensei::Coroutine<u64, (), u64, Bounds>>) {
    // SAFETY: called once, from Drop, for a coroutine that has not returned.
    unsafe { ManuallyDrop::drop(inner) }
}

impl<const COUNT: bool, const UNWIND: bool> Drop for SlotCoroutine<COUNT, UNWIND> {
    #[inline(always)]
    fn drop(&mut self) {
        if !self.inner.done() {
            if UNWIND {
                unwind(&mut self.inner);
                put::<COUNT>(self.bounds);
            } else {
                impossible("a coroutine dropped before it returned");
            }
        }
    }
}

struct Ctx {
    bare: *mut DefaultStack,
    slot: *const Slot,
    pool: StackPool,
}

type Loop = fn(&Ctx, usize) -> f64;

fn bare<const K: u64>(ctx: &Ctx, iters: usize) -> f64 {
    // SAFETY: the stack is leaked in main() and only these loops use it,
    // one at a time.
    unsafe { lifecycle::bare_borrowed::<K>(ctx.bare, iters) }
}

#[inline(never)]
fn slot_loop<const K: u64, const TLS: bool, const COUNT: bool, const UNWIND: bool>(
    ctx: &Ctx,
    iters: usize,
) -> f64 {
    let start = Instant::now();
    for i in 0..iters {
        let slot = if TLS {
            find_slot(black_box(ctx.slot as usize))
        } else {
            ctx.slot
        };
        let bounds = take::<COUNT>(slot);
        let mut co = SlotCoroutine::<COUNT, UNWIND> {
            inner: ManuallyDrop::new(corosensei::Coroutine::with_stack(bounds, |_, x| x + K)),
            bounds,
        };
        let result = co.inner.resume(black_box(i as u64));
        if let CoroutineResult::Return(_) = result {
            put::<COUNT>(co.bounds);
        }
        black_box(result);
    }
    start.elapsed().as_secs_f64() * 1e9 / iters as f64
}

fn pooled<const K: u64>(ctx: &Ctx, iters: usize) -> f64 {
    lifecycle::pooled::<K>(&ctx.pool, iters).expect("pooled stack")
}

macro_rules! copies {
    ($f:ident $(, $arg:tt)*) => {
        [
            $f::<1 $(, $arg)*> as Loop,
            $f::<2 $(, $arg)*>,
            $f::<3 $(, $arg)*>,
            $f::<4 $(, $arg)*>,
            $f::<5 $(, $arg)*>,
            $f::<6 $(, $arg)*>,
            $f::<7 $(, $arg)*>,
            $f::<8 $(, $arg)*>,
        ]
    };
}

fn median_ns(copies: &[Loop; 8], ctx: &Ctx, iters: usize) -> f64 {
    let mut ns: Vec<f64> = copies.iter().map(|run| run(ctx, iters)).collect();
    ns.sort_by(f64::total_cmp);
    (ns[3] + ns[4]) / 2.0
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stack_size = coro_pool::DEFAULT_STACK_SIZE;
    let bare_stack = Box::into_raw(Box::new(DefaultStack::new(stack_size)?));
    let slot_stack: &'static DefaultStack = Box::leak(Box::new(DefaultStack::new(stack_size)?));
    let slot: &'static Slot = Box::leak(Box::new(Slot {
        top: Cell::new(slot_stack.base().get()),
        limit: slot_stack.limit().get(),
        takes: Cell::new(0),
        puts: Cell::new(0),
    }));
    SLOT_KEY.with(|k| k.set(slot as *const Slot as usize));
    SLOT.with(|s| s.set(slot));
    let ctx = Ctx {
        bare: bare_stack,
        slot,
        pool: StackPool::new(PoolConfig::default())?,
    };
    let steps: [(&str, [Loop; 8]); 5] = [
        ("bare corosensei (borrowed stack)", copies!(bare)),
        ("slot", copies!(slot_loop, false, false, false)),
        ("slot+tls+counters", copies!(slot_loop, true, true, false)),
        (
            "slot+tls+counters+unwind",
            copies!(slot_loop, true, true, true),
        ),
        ("coro-pool Coroutine::new_in", copies!(pooled)),
    ];
    let iters = 1_000_000;
    // One untimed pass: first use of the stacks faults their pages in.
    for (_, copies) in &steps {
        median_ns(copies, &ctx, iters / 10);
    }
    // Each round times every step once; a step's figure is its median
    // ratio to bare over the rounds.
    let rounds = 5;
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); steps.len()];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); steps.len()];
    for _ in 0..rounds {
        let ns: Vec<f64> = steps
            .iter()
            .map(|(_, copies)| median_ns(copies, &ctx, iters))
            .collect();
        for (i, t) in ns.iter().enumerate() {
            ratios[i].push(t / ns[0]);
            times[i].push(*t);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("medians of {rounds} rounds:");
    for (i, (name, _)) in steps.iter().enumerate() {
        println!(
            "  {name:<34} {:6.2} ns  {:5.2} x bare",
            median(&mut times[i]),
            median(&mut ratios[i])
        );
    }
    println!(
        "slot counters: {} takes, {} puts",
        slot.takes.get(),
        slot.puts.get()
    );
    Ok(())
}
