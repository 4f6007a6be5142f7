// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Suite `coro-pool`: coroutine lifecycle and pool VMAs vs mmap-per-coroutine,
//! bare corosensei and QEMU's unbounded per-thread pool.
//!
//! - Lifecycle (create + run to completion + recycle) on pooled stacks, on a
//!   fresh mmap per coroutine (`Policy::NoPool`) and on bare corosensei with
//!   one reused stack, alternated, medians.
//! - A yield round trip, and pool get/put throughput with two threads over
//!   one thread.
//! - The cost of `IdlePages::Release` against `IdlePages::Keep`.
//! - The burst scenario: 4 threads take turns bursting to 15,000 live
//!   coroutines each (64 KiB stacks), then go idle; then trim. QEMU's old
//!   unbounded per-thread pool runs into `vm.max_map_count` and gets an
//!   error (the process lives on); the default policy must not.

use std::error::Error;
use std::hint::black_box;
use std::io::Read;
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use coro_pool::{
    Coroutine, CoroutineResult, GuardKind, GuardMode, IdlePages, Policy, PoolConfig, StackPool,
};
use corosensei::stack::DefaultStack;

use crate::harness::{alternate, format_value, Ctx, SuiteReport, SuiteResult, Table};

/// One-line description.
pub const ABOUT: &str = "coroutine lifecycle and pool VMAs vs mmap-per-coroutine, bare corosensei and QEMU's unbounded pool";
/// Ready to run.
pub const READY: bool = true;

type BoxResult<T> = Result<T, Box<dyn Error>>;

/// Lines of /proc/self/maps, read through a fixed buffer so that counting
/// allocates nothing even when the process is at its mapping limit.
fn count_vmas() -> usize {
    let Ok(mut file) = std::fs::File::open("/proc/self/maps") else {
        return 0;
    };
    let mut buf = [0u8; 32 << 10];
    let mut lines = 0;
    loop {
        match file.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => lines += buf[..n].iter().filter(|b| **b == b'\n').count(),
        }
    }
    lines
}

/// CPU time of the calling thread, in nanoseconds. Single-thread timings
/// use it rather than wall time: on a loaded machine it leaves out the time
/// the thread waits for a CPU.
fn thread_cpu_ns() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

/// Resident set size in MiB.
fn rss_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
    pages * page / (1024.0 * 1024.0)
}

/// Copies of each nanosecond-scale lifecycle loop. A loop of a few dozen
/// instructions runs up to 30% faster or slower depending on where its code
/// lands (this was seen for the same bare loop in two builds: 3.4 and
/// 5.1 ns). Each copy is instantiated with its own closure constant, so it is
/// separate machine code at its own address, and a contender's figure is the
/// median over its copies: both sides of a ratio get the same spread of
/// placements.
const LOOP_COPIES: usize = 8;

/// `LOOP_COPIES` instantiations of a loop generic over `const K: u64`.
macro_rules! loop_copies {
    ($f:ident) => {
        [
            $f::<1>, $f::<2>, $f::<3>, $f::<4>, $f::<5>, $f::<6>, $f::<7>, $f::<8>,
        ]
    };
}

/// The median over every copy of a loop, each run for `iters` iterations.
fn median_over_copies<A: ?Sized>(
    copies: &[fn(&mut A, usize) -> BoxResult<f64>; LOOP_COPIES],
    arg: &mut A,
    iters: usize,
) -> BoxResult<f64> {
    let mut ns = Vec::with_capacity(LOOP_COPIES);
    for run in copies {
        ns.push(run(arg, iters)?);
    }
    Ok(crate::harness::median(&ns))
}

#[inline(never)]
fn lifecycle_pooled<const K: u64>(pool: &mut &StackPool, iters: usize) -> BoxResult<f64> {
    let start = thread_cpu_ns();
    for i in 0..iters {
        let mut co: Coroutine<u64, (), u64> = Coroutine::new_in(pool, |_, x| x + K)?;
        black_box(co.resume(black_box(i as u64)));
    }
    Ok((thread_cpu_ns() - start) / iters as f64)
}

/// Bare corosensei on one reused stack, the way corosensei reuses a stack:
/// each coroutine borrows it (`Stack` is implemented for `&mut S`), so
/// nothing but the coroutine itself is built per iteration.
#[inline(never)]
fn lifecycle_bare<const K: u64>(stack: &mut DefaultStack, iters: usize) -> BoxResult<f64> {
    let raw: *mut DefaultStack = stack;
    let start = thread_cpu_ns();
    for i in 0..iters {
        // SAFETY: corosensei wants a `'static` stack. `raw` comes from a
        // `&mut` that outlives this loop, and the reference made here is the
        // only use of the stack while it lives: the coroutine holding it
        // runs to completion and is dropped at the end of the iteration,
        // before the next one borrows the stack again.
        let s: &'static mut DefaultStack = unsafe { &mut *raw };
        let mut co: corosensei::Coroutine<u64, (), u64, &mut DefaultStack> =
            corosensei::Coroutine::with_stack(s, |_, x| x + K);
        black_box(co.resume(black_box(i as u64)));
    }
    Ok((thread_cpu_ns() - start) / iters as f64)
}

/// Bare corosensei moving one owned stack in and out of each coroutine
/// (`with_stack(stack)` ... `into_stack()`), the peer of earlier runs. The
/// moves through an `Option` cost store-forwarding stalls on x86, so this
/// peer is slower than [`lifecycle_bare`]; it is kept for comparison with
/// older figures only.
#[inline(never)]
fn lifecycle_bare_moved<const K: u64>(
    stack: &mut Option<DefaultStack>,
    iters: usize,
) -> BoxResult<f64> {
    let start = thread_cpu_ns();
    for i in 0..iters {
        let s = stack.take().ok_or("bare stack missing")?;
        let mut co: corosensei::Coroutine<u64, (), u64, DefaultStack> =
            corosensei::Coroutine::with_stack(s, |_, x| x + K);
        black_box(co.resume(black_box(i as u64)));
        *stack = Some(co.into_stack());
    }
    Ok((thread_cpu_ns() - start) / iters as f64)
}

fn yield_roundtrip(pool: &StackPool, iters: usize) -> BoxResult<f64> {
    let mut co: Coroutine<u64, u64, ()> = Coroutine::new_in(pool, |y, mut x| loop {
        x = y.suspend(x + 1);
    })?;
    let start = thread_cpu_ns();
    for i in 0..iters {
        if let CoroutineResult::Yield(v) = co.resume(black_box(i as u64)) {
            black_box(v);
        }
    }
    Ok((thread_cpu_ns() - start) / iters as f64)
}

/// get/put throughput with `threads` threads, each repeatedly taking a
/// burst of 512 stacks and giving them back. A thread's local pool holds
/// two batches (256 stacks), so every burst also moves two batches out to
/// the global pool and two back: the shared path is exercised, once per
/// 256 operations. All threads are released together by a barrier after a
/// warm-up burst. Returns operations per second of wall time (from the
/// release to the last thread's end), and the sum over threads of
/// operations per second of thread CPU time (what the threads would reach
/// with a core each; contention still counts, waiting for a CPU does not).
fn getput_rate(pool: &Arc<StackPool>, threads: usize, cycles: usize) -> BoxResult<(f64, f64)> {
    const BURST: usize = 512;
    let barrier = Arc::new(Barrier::new(threads + 1));
    let done = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let pool = Arc::clone(pool);
            let barrier = Arc::clone(&barrier);
            let done = Arc::clone(&done);
            std::thread::spawn(move || -> Result<f64, String> {
                let mut held = Vec::with_capacity(BURST);
                let cycle = |held: &mut Vec<_>| -> Result<(), String> {
                    for _ in 0..BURST {
                        held.push(pool.take_stack().map_err(|e| e.to_string())?);
                    }
                    held.clear();
                    Ok(())
                };
                let warm = cycle(&mut held);
                barrier.wait();
                let cpu_start = thread_cpu_ns();
                let mut result = warm;
                for _ in 0..cycles {
                    if result.is_err() {
                        break;
                    }
                    result = cycle(&mut held);
                }
                let cpu = (thread_cpu_ns() - cpu_start) / 1e9;
                done.wait();
                result.map(|()| (cycles * BURST * 2) as f64 / cpu)
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    done.wait();
    let elapsed = start.elapsed().as_secs_f64();
    let mut cpu_rate = 0.0;
    for h in handles {
        cpu_rate += h.join().map_err(|_| "getput thread panicked")??;
    }
    Ok(((threads * cycles * BURST * 2) as f64 / elapsed, cpu_rate))
}

/// ns per coroutine for bursts of `live` coroutines that each touch about
/// 16 KiB of stack, with a given idle-page policy; and the RSS growth.
fn idle_pages_cost(idle: IdlePages, live: usize, rounds: usize) -> BoxResult<(f64, f64)> {
    let rss_before = rss_mib();
    let pool = StackPool::new(PoolConfig::default().stack_size(256 << 10).idle_pages(idle))?;
    let _demand = pool.reserve(live);
    let mut cos = Vec::with_capacity(live);
    let run = |cos: &mut Vec<Coroutine<(), (), u8>>| -> BoxResult<()> {
        for _ in 0..live {
            let mut co: Coroutine<(), (), u8> = Coroutine::new_in(&pool, |y, ()| {
                let buf = black_box([7u8; 16 << 10]);
                y.suspend(());
                buf[100]
            })?;
            co.resume(());
            cos.push(co);
        }
        for co in cos.iter_mut() {
            co.resume(());
        }
        cos.clear();
        Ok(())
    };
    run(&mut cos)?; // warm: map every stack once
    let start = thread_cpu_ns();
    for _ in 0..rounds {
        run(&mut cos)?;
    }
    let ns = (thread_cpu_ns() - start) / (rounds * live) as f64;
    let rss_growth = rss_mib() - rss_before;
    Ok((ns, rss_growth))
}

/// What one burst scenario run observed.
#[derive(Debug, Default)]
struct BurstOutcome {
    failed: bool,
    first_error: Option<String>,
    /// Turns refused by the mapping budget.
    budget_refusals: usize,
    /// Turns that failed in the kernel (mmap or mprotect).
    kernel_failures: usize,
    stacks_at_failure: usize,
    peak_process_vmas: usize,
    peak_pool_vmas: usize,
    /// Pool VMAs once every thread is idle and its reservation dropped,
    /// before any explicit trim.
    pool_vmas_before_trim: usize,
    pool_vmas_after_trim: usize,
    process_vmas_after_trim: usize,
    rss_mib_after_trim: f64,
    vmas_per_stack: usize,
    elapsed_ms: f64,
    /// Pool VMAs over the run: (step, VMAs). A step is 1,000 coroutines
    /// created, a thread going idle, or the trim.
    vma_samples: Vec<(f64, f64)>,
}

/// Per-thread report after its turn.
struct TurnReport {
    live_peak: usize,
    error: Option<String>,
    /// The error was the budget's refusal (`BudgetExhausted`), not a
    /// failed mmap or mprotect.
    budget_refused: bool,
    pool_vmas: usize,
    process_vmas: usize,
    stacks_held: usize,
    /// Pool VMAs every 1,000 coroutines created, then once idle.
    vma_samples: Vec<usize>,
}

enum Cmd {
    Burst,
    /// In hold mode: end the burst that is being held.
    Release,
    Exit,
}

/// The seed scenario: `threads` threads take turns; each bursts to
/// `per_thread` live coroutines (with a reservation), runs them to
/// completion and goes idle. Then trim.
fn burst_scenario(
    policy: Policy,
    guard: GuardMode,
    threads: usize,
    per_thread: usize,
) -> BoxResult<BurstOutcome> {
    let pool = Arc::new(StackPool::new(burst_config(policy, guard))?);
    burst_pools(&[pool], policy, threads, per_thread, false)
}

fn burst_config(policy: Policy, guard: GuardMode) -> PoolConfig {
    PoolConfig::default()
        .stack_size(64 << 10)
        .policy(policy)
        .guard(guard)
}

/// VMAs held by every pool of the process (the shared budget's count).
fn all_pool_vmas(pool: &StackPool) -> usize {
    pool.stats().process_pool_vmas as usize
}

/// The burst scenario over several pools in one process: thread `i` uses
/// `pools[i % pools.len()]`, so with two pools the turns alternate between
/// their thread groups. Pool VMAs are those of all pools together. With
/// `hold`, each thread keeps its burst alive until every thread has burst
/// (the bursts overlap), instead of ending it before the next turn.
fn burst_pools(
    pools: &[Arc<StackPool>],
    policy: Policy,
    threads: usize,
    per_thread: usize,
    hold: bool,
) -> BoxResult<BurstOutcome> {
    let first = Arc::clone(pools.first().ok_or("no pool")?);
    let start = Instant::now();
    let mut senders = Vec::new();
    let (report_tx, report_rx) = mpsc::channel::<TurnReport>();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let mut handles = Vec::new();
    // All threads and buffers exist before the first burst: nothing needs
    // a new mapping while the unbounded policy sits at the kernel's limit.
    for t in 0..threads {
        let (tx, rx) = mpsc::channel::<Cmd>();
        senders.push(tx);
        let pool = Arc::clone(&pools[t % pools.len()]);
        let report_tx = report_tx.clone();
        let ready_tx = ready_tx.clone();
        handles.push(std::thread::spawn(move || {
            let mut live: Vec<Coroutine<(), (), u64>> = Vec::with_capacity(per_thread);
            // Allocated up front, like every other buffer of the scenario.
            let mut vma_samples: Vec<usize> = Vec::with_capacity(per_thread / 1000 + 2);
            // Register this thread's local pool and malloc arena now.
            let warm = pool.take_stack().map(drop).map_err(|e| e.to_string());
            let _ = ready_tx.send(warm);
            while let Ok(Cmd::Burst) = rx.recv() {
                let reservation = (policy == Policy::Bounded).then(|| pool.reserve(per_thread));
                let mut error = None;
                let mut budget_refused = false;
                vma_samples.clear();
                for i in 0..per_thread {
                    match Coroutine::new_in(&pool, move |y, ()| {
                        // A request in flight: some stack in use across a yield.
                        let frame = black_box([i as u64; 256]);
                        y.suspend(());
                        frame[7]
                    }) {
                        Ok(mut co) => {
                            co.resume(());
                            live.push(co);
                            if (i + 1) % 1000 == 0 {
                                vma_samples.push(all_pool_vmas(&pool));
                            }
                        }
                        Err(e) => {
                            budget_refused = matches!(e, coro_pool::Error::BudgetExhausted { .. });
                            error = Some(e.to_string());
                            break;
                        }
                    }
                }
                let live_peak = live.len();
                let stats = pool.stats();
                let process_vmas = count_vmas();
                let mut report = TurnReport {
                    live_peak,
                    error,
                    budget_refused,
                    pool_vmas: stats.process_pool_vmas as usize,
                    process_vmas,
                    stacks_held: stats.stacks_held,
                    vma_samples: Vec::new(),
                };
                if hold {
                    // Report at the peak, keep the burst until released.
                    report.vma_samples = std::mem::take(&mut vma_samples);
                    let _ = report_tx.send(report);
                    let released = matches!(rx.recv(), Ok(Cmd::Release));
                    for co in live.iter_mut() {
                        co.resume(());
                    }
                    live.clear();
                    drop(reservation);
                    let _ = ready_tx.send(Ok(()));
                    if released {
                        continue;
                    }
                    break;
                }
                for co in live.iter_mut() {
                    co.resume(());
                }
                live.clear();
                drop(reservation);
                vma_samples.push(all_pool_vmas(&pool));
                // Moved out: no allocation near the mapping limit.
                report.vma_samples = std::mem::take(&mut vma_samples);
                let _ = report_tx.send(report);
            }
        }));
    }
    drop(report_tx);
    // Each thread keeps a clone of ready_tx: in hold mode it acknowledges
    // each release on it.
    drop(ready_tx);
    for _ in 0..threads {
        ready_rx.recv()??;
    }
    let mut out = BurstOutcome::default();
    out.vma_samples
        .reserve(threads * (per_thread / 1000 + 2) + 2);
    out.vma_samples.push((0.0, all_pool_vmas(&first) as f64));
    for tx in &senders {
        tx.send(Cmd::Burst)?;
        let turn = report_rx.recv()?;
        out.peak_pool_vmas = out.peak_pool_vmas.max(turn.pool_vmas);
        out.peak_process_vmas = out.peak_process_vmas.max(turn.process_vmas);
        if turn.error.is_some() {
            if turn.budget_refused {
                out.budget_refusals += 1;
            } else {
                out.kernel_failures += 1;
            }
        }
        if let Some(e) = turn.error {
            if !out.failed {
                out.failed = true;
                out.stacks_at_failure = turn.stacks_held;
                out.first_error = Some(e);
            }
        }
        let _ = turn.live_peak;
        for v in turn.vma_samples {
            let step = out.vma_samples.len() as f64;
            out.vma_samples.push((step, v as f64));
        }
    }
    if hold {
        for tx in &senders {
            tx.send(Cmd::Release)?;
            ready_rx.recv()??;
        }
    }
    // Every thread is idle now (and still alive, holding its local pool),
    // and every reservation has been dropped.
    out.pool_vmas_before_trim = all_pool_vmas(&first);
    for pool in pools {
        pool.trim();
    }
    out.pool_vmas_after_trim = all_pool_vmas(&first);
    let step = out.vma_samples.len() as f64;
    out.vma_samples
        .push((step, out.pool_vmas_after_trim as f64));
    out.process_vmas_after_trim = count_vmas();
    out.rss_mib_after_trim = rss_mib();
    out.vmas_per_stack = first.budget().vmas_per_stack;
    out.elapsed_ms = start.elapsed().as_secs_f64() * 1e3;
    for tx in &senders {
        let _ = tx.send(Cmd::Exit);
    }
    for h in handles {
        h.join().map_err(|_| "burst thread panicked")?;
    }
    Ok(out)
}

/// Runs the suite.
pub fn run(ctx: &Ctx) -> SuiteResult {
    let mut report = SuiteReport::default();
    let iters = ctx.pick(1_000_000, 20_000);
    let mmap_iters = ctx.pick(100_000, 2_000);

    // Lifecycle: pooled vs mmap per coroutine vs bare corosensei.
    let pooled = StackPool::new(PoolConfig::default())?;
    let nopool = StackPool::new(PoolConfig::default().policy(Policy::NoPool))?;
    let mut bare_stack = DefaultStack::new(coro_pool::DEFAULT_STACK_SIZE)?;
    let mut moved_stack = Some(DefaultStack::new(coro_pool::DEFAULT_STACK_SIZE)?);
    let copy_iters = iters / LOOP_COPIES;
    let pooled_copies = loop_copies!(lifecycle_pooled);
    let bare_copies = loop_copies!(lifecycle_bare);
    let moved_copies = loop_copies!(lifecycle_bare_moved);
    median_over_copies(&pooled_copies, &mut &pooled, 1000)?;
    let mut run_pooled = || median_over_copies(&pooled_copies, &mut &pooled, copy_iters);
    // At microseconds per coroutine, code placement does not matter.
    let mut run_mmap = || lifecycle_pooled::<1>(&mut &nopool, mmap_iters);
    let mut run_bare = || median_over_copies(&bare_copies, &mut bare_stack, copy_iters);
    let mut run_moved = || median_over_copies(&moved_copies, &mut moved_stack, copy_iters);
    // QEMU's own pooled lifecycle, built from the QEMU build on this
    // machine (see coro_pool_qemu.rs), timed in the same alternation.
    let qemu = super::coro_pool_qemu::QemuLifecycle::build();
    let mut run_qemu = || match &qemu {
        Ok(q) => q.run(iters, 1),
        // Not reported (see below): the alternation just skips this slot.
        Err(_) => Ok(0.0),
    };
    let [pooled_ns, mmap_ns, bare_ns, moved_ns, qemu_ns] = alternate(
        ctx.reps(),
        &mut [
            &mut run_pooled,
            &mut run_mmap,
            &mut run_bare,
            &mut run_moved,
            &mut run_qemu,
        ],
    )?;
    let mut lifecycle = Table::new(
        "lifecycle: create + run to completion + recycle (1 MiB stacks)",
        &["contender", "ns per coroutine", "iterations"],
    );
    lifecycle
        .row(&[
            "pooled (default policy)",
            &format_value(pooled_ns),
            &iters.to_string(),
        ])
        .row(&[
            "mmap per coroutine (NoPool)",
            &format_value(mmap_ns),
            &mmap_iters.to_string(),
        ])
        .row(&[
            "bare corosensei, one reused stack (borrowed)",
            &format_value(bare_ns),
            &iters.to_string(),
        ])
        .row(&[
            "bare corosensei, one reused stack (moved in and out)",
            &format_value(moved_ns),
            &iters.to_string(),
        ]);
    if qemu.is_ok() {
        lifecycle.row(&[
            "QEMU 10 pooled coroutine (libqemuutil, ucontext backend)",
            &format_value(qemu_ns),
            &iters.to_string(),
        ]);
    }
    report
        .table(lifecycle)
        .metric("lifecycle_ns_pooled", pooled_ns)
        .metric("lifecycle_ns_mmap", mmap_ns)
        .metric("lifecycle_ns_bare", bare_ns)
        .metric("lifecycle_ns_bare_moved", moved_ns)
        .metric("speedup_vs_mmap", mmap_ns / pooled_ns)
        .metric("overhead_vs_bare", pooled_ns / bare_ns)
        .metric("overhead_vs_bare_moved", pooled_ns / moved_ns);
    let qemu_note = match &qemu {
        Ok(q) => {
            report
                .metric("lifecycle_ns_qemu", qemu_ns)
                .metric("overhead_vs_qemu", pooled_ns / qemu_ns);
            format!(
                "QEMU peer: tests/unit/test-coroutine.c's perf_lifecycle loop (benches/src/suites/\
                 coro_pool_qemu.c) linked against {}/libqemuutil.a (util/qemu-coroutine.c with its \
                 pools, util/coroutine-ucontext.c, -O2 as QEMU builds them), thread CPU time, \
                 {iters} iterations per run.",
                q.build.display()
            )
        }
        Err(e) => format!("QEMU peer not measured: {e}."),
    };
    drop(qemu);

    let mut run_yield = || yield_roundtrip(&pooled, iters);
    let [yield_ns] = alternate(ctx.reps(), &mut [&mut run_yield])?;
    report.metric("yield_ns", yield_ns);
    drop(pooled);
    drop(nopool);

    // Pool get/put scaling.
    let cycles = ctx.pick(10_000, 50);
    let gp_pool = Arc::new(StackPool::new(PoolConfig::default().stack_size(64 << 10))?);
    let _gp_demand = gp_pool.reserve(2048);
    // Both figures of a run come from the same run: the wall-clock rate is
    // what alternate() takes the median of, the CPU-time rate is kept aside.
    let cpu1 = std::cell::RefCell::new(Vec::new());
    let cpu2 = std::cell::RefCell::new(Vec::new());
    let mut one = || {
        let (wall, cpu) = getput_rate(&gp_pool, 1, cycles)?;
        cpu1.borrow_mut().push(cpu);
        Ok(wall)
    };
    let mut two = || {
        let (wall, cpu) = getput_rate(&gp_pool, 2, cycles)?;
        cpu2.borrow_mut().push(cpu);
        Ok(wall)
    };
    let [wall1, wall2] = alternate(ctx.reps(), &mut [&mut one, &mut two])?;
    let rate1 = crate::harness::median(&cpu1.borrow());
    let rate2 = crate::harness::median(&cpu2.borrow());
    report
        .metric("getput_mops_1t", rate1 / 1e6)
        .metric("getput_mops_2t", rate2 / 1e6)
        .metric("getput_2t_vs_1t", rate2 / rate1)
        .metric("getput_mops_1t_wall", wall1 / 1e6)
        .metric("getput_mops_2t_wall", wall2 / 1e6)
        .metric("getput_2t_vs_1t_wall", wall2 / wall1);
    drop(_gp_demand);
    drop(gp_pool);

    // Idle page policy cost.
    let live = ctx.pick(1024, 512);
    let rounds = ctx.pick(50, 3);
    let mut keep = || idle_pages_cost(IdlePages::Keep, live, rounds).map(|r| r.0);
    let mut release = || idle_pages_cost(IdlePages::Release, live, rounds).map(|r| r.0);
    let [keep_ns, release_ns] = alternate(ctx.reps(), &mut [&mut keep, &mut release])?;
    let (_, keep_rss) = idle_pages_cost(IdlePages::Keep, live, 1)?;
    let (_, release_rss) = idle_pages_cost(IdlePages::Release, live, 1)?;
    report
        .metric("burst_cycle_ns_keep_pages", keep_ns)
        .metric("burst_cycle_ns_release_pages", release_ns)
        .metric("release_pages_cost_ratio", release_ns / keep_ns)
        .metric("idle_rss_mib_keep_pages", keep_rss)
        .metric("idle_rss_mib_release_pages", release_rss);

    // The burst scenario. Its size is the same in quick mode: reaching
    // vm.max_map_count is the point, and it takes well under a second.
    let threads = 4;
    let per_thread = 15_000;
    let default_qemu_layout =
        burst_scenario(Policy::Bounded, GuardMode::Mprotect, threads, per_thread)?;
    let default_auto = burst_scenario(Policy::Bounded, GuardMode::Auto, threads, per_thread)?;
    // Two pools in one process, each with its own thread group (two
    // threads each), taking turns: both draw on the one process budget.
    let two_pools = [
        Arc::new(StackPool::new(burst_config(
            Policy::Bounded,
            GuardMode::Mprotect,
        ))?),
        Arc::new(StackPool::new(burst_config(
            Policy::Bounded,
            GuardMode::Mprotect,
        ))?),
    ];
    let budget = two_pools[0].budget();
    let vma_ceiling = budget.max_map_count - budget.reserved_vmas;
    let two = burst_pools(&two_pools, Policy::Bounded, threads, per_thread, false)?;
    // The same two pools with overlapping bursts: four bursts of 15,000
    // held at once want 120,000 VMAs, twice what the process may map. The
    // shared budget must refuse them (BudgetExhausted) before the kernel
    // does (ENOMEM from mmap or mprotect).
    let overlap = burst_pools(&two_pools, Policy::Bounded, threads, per_thread, true)?;
    drop(two_pools);
    // Last, since it drives the process to its mapping limit.
    let unbounded = burst_scenario(
        Policy::UnboundedPerThread,
        GuardMode::Mprotect,
        threads,
        per_thread,
    )?;

    let mut burst = Table::new(
        "burst: 4 threads take turns, 15,000 live coroutines each (64 KiB stacks), then trim",
        &[
            "policy (guard)",
            "failed",
            "peak VMAs (process)",
            "peak VMAs (pool)",
            "pool VMAs idle, before trim",
            "pool VMAs after trim",
            "process VMAs after trim",
            "RSS MiB after trim",
            "ms",
        ],
    );
    for (name, o) in [
        ("unbounded per thread (mprotect)", &unbounded),
        ("default (mprotect)", &default_qemu_layout),
        ("default (auto: guard install if available)", &default_auto),
        ("default, two pools taking turns (mprotect)", &two),
        (
            "default, two pools, bursts held at once (mprotect)",
            &overlap,
        ),
    ] {
        burst.row(&[
            name.to_string(),
            (o.failed as u8).to_string(),
            o.peak_process_vmas.to_string(),
            o.peak_pool_vmas.to_string(),
            o.pool_vmas_before_trim.to_string(),
            o.pool_vmas_after_trim.to_string(),
            o.process_vmas_after_trim.to_string(),
            format_value(o.rss_mib_after_trim),
            format_value(o.elapsed_ms),
        ]);
    }
    let batch = coro_pool::DEFAULT_BATCH_SIZE;
    report
        .series(
            "burst_vmas",
            "unbounded per thread (mprotect)",
            unbounded.vma_samples.clone(),
        )
        .series(
            "burst_vmas",
            "default (mprotect)",
            default_qemu_layout.vma_samples.clone(),
        )
        .series(
            "burst_vmas",
            "default (auto guard)",
            default_auto.vma_samples.clone(),
        );
    report
        .table(burst)
        .metric("burst_unbounded_failed", unbounded.failed as u8 as f64)
        .metric(
            "burst_unbounded_stacks_at_failure",
            unbounded.stacks_at_failure as f64,
        )
        .metric(
            "burst_default_failed",
            default_qemu_layout.failed as u8 as f64,
        )
        .metric(
            "burst_default_peak_vmas",
            default_qemu_layout.peak_process_vmas as f64,
        )
        .metric(
            "burst_default_peak_pool_vmas",
            default_qemu_layout.peak_pool_vmas as f64,
        )
        .metric(
            "vmas_before_trim",
            default_qemu_layout.pool_vmas_before_trim as f64,
        )
        .metric(
            "vmas_after_trim",
            default_qemu_layout.pool_vmas_after_trim as f64,
        )
        .metric(
            "vmas_after_trim_two_batches_per_thread",
            (threads * 2 * batch * default_qemu_layout.vmas_per_stack) as f64,
        )
        .metric(
            "process_vmas_after_trim",
            default_qemu_layout.process_vmas_after_trim as f64,
        )
        .metric("rss_mib_after_trim", default_qemu_layout.rss_mib_after_trim)
        .metric(
            "burst_default_auto_failed",
            default_auto.failed as u8 as f64,
        )
        .metric(
            "burst_default_auto_peak_vmas",
            default_auto.peak_process_vmas as f64,
        )
        .metric(
            "vmas_after_trim_auto",
            default_auto.pool_vmas_after_trim as f64,
        )
        .metric("burst_two_pools_failed", two.failed as u8 as f64)
        .metric("burst_two_pools_peak_vmas", two.peak_process_vmas as f64)
        .metric("burst_two_pools_peak_pool_vmas", two.peak_pool_vmas as f64)
        .metric("burst_vma_ceiling", vma_ceiling as f64)
        .metric(
            "burst_overlap_budget_refusals",
            overlap.budget_refusals as f64,
        )
        .metric(
            "burst_overlap_kernel_failures",
            overlap.kernel_failures as f64,
        )
        .metric("burst_overlap_peak_vmas", overlap.peak_process_vmas as f64)
        .metric(
            "burst_two_pools_vmas_before_trim",
            two.pool_vmas_before_trim as f64,
        )
        .metric(
            "burst_two_pools_vmas_after_trim",
            two.pool_vmas_after_trim as f64,
        )
        .metric(
            "burst_two_pools_process_vmas_after_trim",
            two.process_vmas_after_trim as f64,
        );

    let guard_note = if coro_pool::guard_install_supported() {
        GuardKind::GuardInstall.name()
    } else {
        GuardKind::Mprotect.name()
    };
    report.note(format!(
        "Medians of {} alternating runs. Single-thread timings use thread CPU time \
         (the machine is shared); getput_2t_vs_1t sums per-thread CPU-time rates, \
         getput_2t_vs_1t_wall is the wall-clock ratio of the same runs. Lifecycle: {iters} iterations pooled and bare, \
         spread over {LOOP_COPIES} copies of each loop (separate machine code, median over the copies; see \
         LOOP_COPIES) (overhead_vs_bare: against corosensei borrowing one stack; overhead_vs_bare_moved: against moving \
         one owned stack in and out, the peer of earlier runs), \
         {mmap_iters} with a fresh mmap per coroutine. getput: bursts of 512 stacks per thread, \
         {cycles} cycles. Idle pages: bursts of {live} coroutines touching 16 KiB each, {rounds} \
         rounds; RSS growth of the whole process. Burst scenario: the main figures use QEMU's \
         layout (mprotect guards, 2 VMAs per stack) for both policies; the auto run uses {guard_note}. \
         vmas_before_trim: pool VMAs once every burst is over and its reservation dropped (the pool \
         frees global stacks above the lowered maximum at once), before the explicit trim. \
         Pool VMAs are those of all pools of the process (the shared budget's count: stacks x \
         VMAs per stack); process VMAs are lines of /proc/self/maps. \
         Two pools: two pools in one process drawing on the one process-wide budget, threads \
         0 and 2 on the first, 1 and 3 on the second, so the turns alternate; burst_vma_ceiling \
         is vm.max_map_count minus the reserve. Held at once: every thread keeps its burst until \
         all four have burst, so the bursts (120,000 VMAs wanted) overlap; the budget's refusals \
         (BudgetExhausted) and kernel failures (ENOMEM) are counted separately. {qemu_note} \
         vm.max_map_count here: {}. Unbounded first error: {}.",
        ctx.reps(),
        std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unreadable".to_string()),
        unbounded.first_error.as_deref().unwrap_or("none"),
    ));
    Ok(report)
}
