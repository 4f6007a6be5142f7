// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Pool behaviour: reuse, caps, reservations, budget, trimming, policies,
//! thread exit and a multithreaded stress test.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coro_pool::{
    BudgetOrigin, Coroutine, CoroutineResult, Error, GuardKind, GuardMode, IdlePages, MapBudget,
    MaxMapCount, PoolConfig, PooledStack, StackId, StackPool, FALLBACK_MAX_MAP_COUNT,
};

/// A fresh scratch directory under the system temp dir, removed on drop.
struct ScratchDir(std::path::PathBuf);

impl ScratchDir {
    fn new(tag: &str) -> ScratchDir {
        let path = std::env::temp_dir().join(format!(
            "coro-pool-test-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        ScratchDir(path)
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn small() -> PoolConfig {
    PoolConfig::default().stack_size(64 << 10)
}

/// A coroutine that yields once and then returns its input plus one.
fn one_yield(pool: &StackPool) -> Coroutine<u32, u32, u32> {
    Coroutine::new_in(pool, |y, x: u32| {
        let z = y.suspend(x);
        z + 1
    })
    .unwrap()
}

#[test]
fn test_resume_yield_and_return_value() {
    let pool = StackPool::new(small()).unwrap();
    let mut co = Coroutine::new_in(&pool, |y, mut acc: u64| {
        for i in 0..10u64 {
            acc += y.suspend(acc * i);
        }
        format!("sum {acc}")
    })
    .unwrap();
    assert!(!co.started());
    let mut out = co.resume(1);
    let mut steps = 0;
    while let CoroutineResult::Yield(v) = out {
        assert_eq!(v, (1 + 2 * steps) * steps);
        steps += 1;
        out = co.resume(2);
    }
    assert_eq!(steps, 10);
    match out {
        CoroutineResult::Return(s) => assert_eq!(s, "sum 21"),
        CoroutineResult::Yield(_) => unreachable!(),
    }
    assert!(co.done());
}

#[test]
fn test_stack_reused_by_identity() {
    let pool = StackPool::new(small()).unwrap();
    let mut a = one_yield(&pool);
    let id = a.stack_id().unwrap();
    a.resume(1);
    assert!(matches!(a.resume(2), CoroutineResult::Return(3)));
    assert_eq!(a.stack_id(), None, "stack given back on return");
    let b = one_yield(&pool);
    assert_eq!(b.stack_id(), Some(id), "the same stack is handed out again");
    let s = pool.stats();
    assert_eq!(s.stacks_created, 1);
    assert_eq!(s.stacks_reused, 1);
    assert_eq!(s.live_coroutines, 1);
}

#[test]
fn test_one_stack_serves_a_create_run_drop_loop() {
    let pool = StackPool::new(small()).unwrap();
    let stacks: Vec<_> = (0..3).map(|_| pool.take_stack().unwrap()).collect();
    let mut ids: Vec<StackId> = stacks.iter().map(PooledStack::id).collect();
    drop(stacks);
    assert_eq!(pool.stats().pooled_local, 3);
    // Each take gives its stack back before the next one: the same stack
    // every time (the local pool's hot slot).
    let first = pool.take_stack().unwrap().id();
    for _ in 0..10 {
        let mut co: Coroutine<(), (), ()> = Coroutine::new_in(&pool, |_, ()| ()).unwrap();
        assert_eq!(co.stack_id(), Some(first));
        co.resume(());
    }
    // Held together, the three stacks are handed out once each.
    let held: Vec<_> = (0..3).map(|_| pool.take_stack().unwrap()).collect();
    let mut again: Vec<StackId> = held.iter().map(PooledStack::id).collect();
    ids.sort();
    again.sort();
    assert_eq!(again, ids);
    let s = pool.stats();
    assert_eq!(s.stacks_created, 3);
    assert_eq!(s.stacks_reused, 14);
    assert_eq!((s.live_coroutines, s.pooled_local), (3, 0));
}

#[test]
fn test_dropped_suspended_coroutine_unwinds_and_returns_stack() {
    struct Flag(Rc<Cell<bool>>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.set(true);
        }
    }
    let pool = StackPool::new(small()).unwrap();
    let dropped = Rc::new(Cell::new(false));
    let flag = Flag(dropped.clone());
    let mut co: Coroutine<(), (), ()> = Coroutine::new_in(&pool, move |y, ()| {
        let _flag = flag;
        y.suspend(());
        unreachable!("never resumed again");
    })
    .unwrap();
    co.resume(());
    assert_eq!(pool.stats().live_coroutines, 1);
    drop(co);
    assert!(dropped.get(), "locals on the coroutine stack were dropped");
    let s = pool.stats();
    assert_eq!(s.live_coroutines, 0);
    assert_eq!(s.pooled_local, 1);
}

#[test]
fn test_never_started_coroutine_drop_returns_stack() {
    let pool = StackPool::new(small()).unwrap();
    let co = one_yield(&pool);
    drop(co);
    assert_eq!(pool.stats().live_coroutines, 0);
    assert_eq!(pool.stats().pooled_local, 1);
}

#[test]
fn test_try_resume_after_return_is_error() {
    let pool = StackPool::new(small()).unwrap();
    let mut co: Coroutine<(), (), u8> = Coroutine::new_in(&pool, |_, ()| 7).unwrap();
    assert!(matches!(co.try_resume(()), Ok(CoroutineResult::Return(7))));
    let err = co.try_resume(()).unwrap_err();
    assert!(matches!(err, Error::Finished));
    assert_eq!(err.to_string(), "the coroutine has already returned");
}

#[test]
fn test_panic_in_coroutine_propagates_and_stack_returns() {
    let pool = StackPool::new(small()).unwrap();
    let mut co: Coroutine<(), (), ()> =
        Coroutine::new_in(&pool, |_, ()| panic!("boom in coroutine")).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| co.resume(())));
    assert!(r.is_err());
    assert!(co.done());
    assert!(matches!(co.try_resume(()), Err(Error::Finished)));
    drop(co);
    let s = pool.stats();
    assert_eq!(s.live_coroutines, 0);
    assert_eq!(s.pooled_local, 1);
    // The stack is fine for the next coroutine.
    let mut again: Coroutine<(), (), u8> = Coroutine::new_in(&pool, |_, ()| 1).unwrap();
    assert!(matches!(again.resume(()), CoroutineResult::Return(1)));
}

#[test]
fn test_local_pool_never_exceeds_two_batches() {
    let pool = StackPool::new(small().batch_size(4).base_max(1000)).unwrap();
    for round in 0..5 {
        let live: Vec<_> = (0..37 + round).map(|_| one_yield(&pool)).collect();
        assert!(pool.stats().pooled_local <= 8);
        drop(live);
        let s = pool.stats();
        assert!(s.pooled_local <= 8, "local {} > 2 batches", s.pooled_local);
        assert_eq!(s.stacks_held, s.pooled_local + s.pooled_global);
    }
}

#[test]
fn test_global_pool_stays_within_max() {
    let pool = StackPool::new(small().batch_size(4).base_max(8)).unwrap();
    let live: Vec<_> = (0..100).map(|_| one_yield(&pool)).collect();
    drop(live);
    let s = pool.stats();
    assert_eq!(s.max_pooled, 8);
    assert_eq!(s.pooled_global, 8);
    assert_eq!(s.pooled_local, 8);
    assert_eq!(s.stacks_freed, 84);
    assert_eq!(s.stacks_held, 16);

    let r = pool.reserve(40);
    let live: Vec<_> = (0..100).map(|_| one_yield(&pool)).collect();
    drop(live);
    let s = pool.stats();
    assert_eq!(s.max_pooled, 48);
    assert_eq!(s.pooled_global, 48, "{s:?}");
    drop(r);
    assert_eq!(pool.max_pooled(), 8);
    // The stacks above the lowered maximum went at once, without a trim.
    assert_eq!(pool.stats().pooled_global, 8);
    // Returning more stacks never pushes the global pool above its max.
    let live: Vec<_> = (0..100).map(|_| one_yield(&pool)).collect();
    drop(live);
    assert!(pool.stats().pooled_global <= 48);
}

#[test]
fn test_reservations_raise_and_lower_max() {
    let pool = StackPool::new(small()).unwrap();
    assert_eq!(pool.max_pooled(), 128);
    let a = pool.reserve(1000);
    assert_eq!(a.stacks(), 1000);
    assert_eq!(pool.max_pooled(), 1128);
    let b = pool.reserve(500);
    assert_eq!(pool.max_pooled(), 1628);
    assert_eq!(pool.stats().reserved, 1500);
    drop(a);
    assert_eq!(pool.max_pooled(), 628);
    drop(b);
    assert_eq!(pool.max_pooled(), 128);
    assert_eq!(pool.stats().reserved, 0);
}

#[test]
fn test_reservation_capped_by_hard_cap() {
    let pool = StackPool::new(
        small()
            .guard(GuardMode::Mprotect)
            .max_map_count(MaxMapCount::Fixed(10_000)),
    )
    .unwrap();
    let budget = pool.budget();
    assert_eq!(budget.max_stacks, 2_500);
    let _r = pool.reserve(1_000_000);
    assert_eq!(pool.max_pooled(), 2_500);
    let _r2 = pool.reserve(usize::MAX);
    assert_eq!(pool.max_pooled(), 2_500);
}

#[test]
fn test_hard_cap_from_injected_max_map_count() {
    let b = MapBudget::compute(Some(65_530), 5_000, GuardKind::Mprotect);
    assert_eq!(b.max_stacks, 30_265, "QEMU's (max - 5000) / 2");
    assert_eq!(b.origin, BudgetOrigin::Read);
    let b = MapBudget::compute(Some(65_530), 5_000, GuardKind::GuardInstall);
    assert_eq!(b.max_stacks, 60_530, "one VMA per stack with guard install");
    assert_eq!(b.vmas_per_stack, 1);
    // Unreadable: the documented fallback, never unbounded.
    let b = MapBudget::compute(None, 5_000, GuardKind::Mprotect);
    assert_eq!(b.origin, BudgetOrigin::Fallback);
    assert_eq!(b.max_map_count, FALLBACK_MAX_MAP_COUNT);
    assert_eq!(b.max_stacks, 30_265);
    // A tiny limit keeps half of it for the rest of the process.
    let b = MapBudget::compute(Some(100), 5_000, GuardKind::Mprotect);
    assert_eq!(b.reserved_vmas, 50);
    assert_eq!(b.max_stacks, 25);
    let b = MapBudget::compute(Some(0), 5_000, GuardKind::Mprotect);
    assert_eq!(b.max_stacks, 0);
    let b = MapBudget::compute(Some(u64::MAX), 5_000, GuardKind::GuardInstall);
    assert!(b.max_stacks > 1 << 40);
}

#[test]
fn test_hard_cap_from_files_and_unreadable_fallback() {
    let dir = ScratchDir::new("files");
    let good = dir.path().join("max_map_count");
    std::fs::write(&good, "100000\n").unwrap();
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, "lots\n").unwrap();
    let missing = dir.path().join("missing");

    let with = |src: MaxMapCount| {
        StackPool::new(small().guard(GuardMode::Mprotect).max_map_count(src))
            .unwrap()
            .budget()
    };
    let b = with(MaxMapCount::File(good));
    assert_eq!((b.origin, b.max_stacks), (BudgetOrigin::Read, 47_500));
    let b = with(MaxMapCount::File(garbage));
    assert_eq!((b.origin, b.max_stacks), (BudgetOrigin::Fallback, 30_265));
    let b = with(MaxMapCount::File(missing));
    assert_eq!((b.origin, b.max_stacks), (BudgetOrigin::Fallback, 30_265));
    let b = with(MaxMapCount::Fixed(7_000));
    assert_eq!((b.origin, b.max_stacks), (BudgetOrigin::Injected, 1_750));
    let b = with(MaxMapCount::Proc);
    assert_ne!(b.origin, BudgetOrigin::Injected);
}

#[test]
fn test_max_map_count_read_lazily() {
    let dir = ScratchDir::new("lazy");
    let path = dir.path().join("late");
    let pool = StackPool::new(
        small()
            .guard(GuardMode::Mprotect)
            .max_map_count(MaxMapCount::File(path.clone())),
    )
    .unwrap();
    // The file appears after the pool is built, before first use.
    std::fs::write(&path, "20000").unwrap();
    let _co = one_yield(&pool);
    let b = pool.budget();
    assert_eq!((b.origin, b.max_map_count), (BudgetOrigin::Read, 20_000));
    assert_eq!(b.max_stacks, 7_500);
}

#[test]
fn test_budget_exhausted_returns_error() {
    let pool = StackPool::new(
        small()
            .guard(GuardMode::Mprotect)
            .max_map_count(MaxMapCount::Fixed(20)),
    )
    .unwrap();
    let mut live: Vec<_> = (0..5).map(|_| one_yield(&pool)).collect();
    let err = Coroutine::<u32, u32, u32>::new_in(&pool, |_, x| x).unwrap_err();
    assert!(matches!(
        err,
        Error::BudgetExhausted {
            held: 5,
            max_stacks: 5,
            ..
        }
    ));
    // The number of other mappings is this test process's, measured.
    let msg = err.to_string();
    assert!(
        msg.starts_with(
            "coroutine stack budget exhausted: 5 stacks held, at most 5 allowed \
             (vm.max_map_count 20, 10 VMAs reserved, 2 per stack; \
             all pools hold 10 of 10 VMAs, "
        ) && msg.ends_with(" other mappings)"),
        "{msg}"
    );
    assert_eq!(err.errno(), None);
    live.pop();
    assert!(Coroutine::<u32, u32, u32>::new_in(&pool, |_, x| x).is_ok());
    // NoPool enforces the budget as well (with `bench-policies`).
    #[cfg(feature = "bench-policies")]
    {
        let nopool = StackPool::new(
            small()
                .policy(coro_pool::Policy::NoPool)
                .guard(GuardMode::Mprotect)
                .max_map_count(MaxMapCount::Fixed(20)),
        )
        .unwrap();
        let _held: Vec<_> = (0..5).map(|_| nopool.take_stack().unwrap()).collect();
        assert!(matches!(
            nopool.take_stack(),
            Err(Error::BudgetExhausted { .. })
        ));
    }
}

#[test]
fn test_thread_exit_returns_batches_to_global() {
    let pool = Arc::new(StackPool::new(small().batch_size(8)).unwrap());
    let p = pool.clone();
    std::thread::spawn(move || {
        let live: Vec<_> = (0..12).map(|_| one_yield(&p)).collect();
        drop(live);
        let s = p.stats();
        assert_eq!(s.pooled_local, 12);
        assert_eq!(s.pooled_global, 0);
    })
    .join()
    .unwrap();
    let s = pool.stats();
    assert_eq!(s.pooled_local, 0, "the exited thread's local pool is gone");
    assert_eq!(s.pooled_global, 12, "its batches went to the global pool");
    assert_eq!(s.stacks_held, 12);
    // Another thread reuses them.
    let p = pool.clone();
    std::thread::spawn(move || {
        let live: Vec<_> = (0..12).map(|_| one_yield(&p)).collect();
        assert_eq!(p.stats().stacks_created, 12);
        drop(live);
    })
    .join()
    .unwrap();
    assert_eq!(pool.stats().stacks_reused, 12);
}

#[test]
fn test_thread_exit_frees_what_exceeds_max() {
    let pool = Arc::new(StackPool::new(small().batch_size(8).base_max(4)).unwrap());
    let p = pool.clone();
    std::thread::spawn(move || {
        let live: Vec<_> = (0..16).map(|_| one_yield(&p)).collect();
        drop(live);
    })
    .join()
    .unwrap();
    let s = pool.stats();
    assert_eq!(s.pooled_global, 4);
    assert_eq!(s.stacks_held, 4);
    assert_eq!(s.stacks_freed, 12);
}

#[test]
fn test_trim_frees_idle_stacks_above_recent_peak() {
    let pool = StackPool::new(small().batch_size(4)).unwrap();
    let r = pool.reserve(1000);
    let live: Vec<_> = (0..300).map(|_| one_yield(&pool)).collect();
    drop(live);
    assert_eq!(pool.stats().pooled_global, 292);
    // The window saw 300 in use: all idle stacks may be needed again.
    assert_eq!(pool.trim(), 0);
    // A window where 50 are taken (8 from the local pool, 44 in 11 batches
    // from the global pool: 52 stacks outside it at the peak), then 40 of
    // them end: 10 in use and 6 cached locally remain outside.
    let mut live: Vec<_> = (0..50).map(|_| one_yield(&pool)).collect();
    live.truncate(10);
    let s = pool.stats();
    assert_eq!(
        (s.live_coroutines, s.pooled_local, s.pooled_global),
        (10, 6, 284)
    );
    let freed = pool.trim();
    let after = pool.stats();
    assert_eq!(after.pooled_global, 36, "keep peak - now = 52 - 16 ({s:?})");
    assert_eq!(freed, 284 - 36);
    drop(live);
    // The window opened with 16 stacks outside the global pool; after it,
    // an idle window: nothing needed, everything global goes.
    assert_eq!(pool.trim(), 36);
    assert_eq!(pool.stats().pooled_global, 8);
    pool.trim();
    let s = pool.stats();
    assert_eq!(s.pooled_global, 0);
    assert_eq!(s.stacks_held, s.pooled_local);
    // Without the reservation the max bounds what trim keeps.
    drop(r);
    let live: Vec<_> = (0..300).map(|_| one_yield(&pool)).collect();
    drop(live);
    pool.trim();
    assert!(pool.stats().pooled_global <= 128);
}

#[test]
fn test_background_trimmer_frees_idle_stacks() {
    let pool = StackPool::new(
        small()
            .batch_size(4)
            .trim_interval(Some(Duration::from_millis(20))),
    )
    .unwrap();
    let live: Vec<_> = (0..100).map(|_| one_yield(&pool)).collect();
    drop(live);
    // The trimmer unlinks the global batches first and unmaps them after,
    // so wait for both: an empty global pool and this thread's 8 left.
    let deadline = Instant::now() + Duration::from_secs(20);
    while pool.stats().pooled_global > 0 || pool.stats().stacks_held > 8 {
        assert!(Instant::now() < deadline, "trimmer did not run");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(pool.stats().stacks_held, 8);
    drop(pool); // stops and joins the trimmer thread
}

/// Waits until the pool's trimmer has run `passes` more trim passes (a
/// hang guard of a minute, not a timing assertion).
fn wait_for_trims(pool: &StackPool, passes: u64) {
    let target = pool.stats().trims + passes;
    let deadline = Instant::now() + Duration::from_secs(60);
    while pool.stats().trims < target {
        assert!(Instant::now() < deadline, "the trimmer did not run");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn test_burst_of_1024_falls_back_within_two_trim_intervals() {
    let pool = StackPool::new(small().trim_interval(Some(Duration::from_millis(50)))).unwrap();
    assert_eq!(pool.trim_interval(), Some(Duration::from_millis(50)));
    // As a server does: its in-flight limit reserved for its lifetime.
    let _in_flight = pool.reserve(1024);
    let vps = pool.budget().vmas_per_stack;
    let mut live: Vec<_> = (0..1024).map(|_| one_yield(&pool)).collect();
    let peak = pool.stats();
    assert_eq!(peak.live_coroutines, 1024);
    assert!(peak.vmas_held >= 1024 * vps);
    let trims = peak.trims;
    for co in &mut live {
        co.resume(1);
    }
    drop(live);
    // Idle: every stack is back, and the reservation keeps them pooled
    // (unless trim passes already ran while the burst ended, on a loaded
    // machine).
    let idle = pool.stats();
    assert_eq!(idle.live_coroutines, 0);
    if idle.trims == trims {
        assert!(idle.pooled_global > 0, "{idle:?}");
    }
    // The first pass after the burst keeps its recent demand, the second
    // frees the global pool; this thread's local pool (two batches) stays.
    wait_for_trims(&pool, 2);
    let after = pool.stats();
    assert_eq!(after.pooled_global, 0, "{after:?}");
    assert!(after.vmas_held <= 2 * pool.batch_size() * vps, "{after:?}");
}

// Needs the comparison policies: runs with `--all-features` (as CI does).
#[cfg(feature = "bench-policies")]
#[test]
fn test_policy_no_pool_maps_per_coroutine() {
    let pool = StackPool::new(small().policy(coro_pool::Policy::NoPool)).unwrap();
    for _ in 0..3 {
        let mut co = one_yield(&pool);
        co.resume(1);
        co.resume(2);
    }
    let s = pool.stats();
    assert_eq!(
        (s.stacks_created, s.stacks_freed, s.stacks_reused),
        (3, 3, 0)
    );
    assert_eq!(s.stacks_held, 0);
    assert_eq!(s.max_pooled, 0);
}

// Needs the comparison policies: runs with `--all-features` (as CI does).
#[cfg(feature = "bench-policies")]
#[test]
fn test_policy_unbounded_keeps_every_stack_locally() {
    let pool = StackPool::new(
        small()
            .policy(coro_pool::Policy::UnboundedPerThread)
            .batch_size(4),
    )
    .unwrap();
    let _r = pool.reserve(10);
    let live: Vec<_> = (0..100).map(|_| one_yield(&pool)).collect();
    drop(live);
    let s = pool.stats();
    assert_eq!((s.pooled_local, s.pooled_global), (100, 0));
    assert_eq!(pool.trim(), 0);
    pool.flush_local();
    assert_eq!(pool.stats().stacks_held, 0);
}

#[test]
fn test_flush_local_moves_stacks_to_global() {
    let pool = StackPool::new(small().batch_size(4)).unwrap();
    let live: Vec<_> = (0..6).map(|_| one_yield(&pool)).collect();
    drop(live);
    assert_eq!(pool.stats().pooled_local, 6);
    pool.flush_local();
    let s = pool.stats();
    assert_eq!((s.pooled_local, s.pooled_global), (0, 6));
}

#[test]
fn test_pool_drop_frees_global_and_local_stacks() {
    // An unusual stack size, so that the exact address ranges checked below
    // cannot belong to a stack of a test running in parallel.
    let stack = 72usize << 10;
    let pool = StackPool::new(
        PoolConfig::default()
            .stack_size(stack)
            .batch_size(4)
            .guard(GuardMode::Mprotect),
    )
    .unwrap();
    let live: Vec<_> = (0..20).map(|_| one_yield(&pool)).collect();
    let tops: Vec<usize> = live.iter().map(|c| c.stack_id().unwrap().0).collect();
    let keep_one = one_yield(&pool);
    let kept_top = keep_one.stack_id().unwrap().0;
    drop(live);
    // Mapped: one VMA covers the stack's usable range. (Not an exact
    // line: a guard-installed stack of a test running in parallel, one rw
    // VMA, may be mapped right above and merge with it.)
    let mapped = |top: usize| {
        maps_overlapping(top - stack, top).iter().any(|l| {
            let range = l.split_whitespace().next().unwrap();
            let (a, b) = range.split_once('-').unwrap();
            let a = usize::from_str_radix(a, 16).unwrap();
            let b = usize::from_str_radix(b, 16).unwrap();
            a <= top - stack && top <= b && l.contains("rw-p")
        })
    };
    // Unmapped: no VMA is exactly the stack's range (a parallel test may
    // map something else at the freed addresses, but not of this size).
    let unmapped = |top: usize| {
        !maps_overlapping(top - stack, top)
            .iter()
            .any(|l| l.starts_with(&format!("{:x}-{:x} ", top - stack, top)))
    };
    assert!(tops.iter().all(|t| mapped(*t)), "idle stacks are pooled");
    drop(pool);
    assert!(
        tops.iter().all(|t| unmapped(*t)),
        "idle stacks (global and local) were unmapped"
    );
    assert!(mapped(kept_top), "a stack in use stays mapped");
    // A coroutine that outlives its pool still works and frees its stack.
    let mut keep_one = keep_one;
    keep_one.resume(1);
    assert!(matches!(keep_one.resume(1), CoroutineResult::Return(2)));
    assert!(unmapped(kept_top));
}

#[test]
fn test_invalid_config_is_rejected() {
    let cases = [
        (
            small().stack_size(0),
            "stack size 0 is outside 4096..=1073741824",
        ),
        (small().batch_size(0), "batch size 0 is outside 1..=65536"),
        (small().guard_pages(0), "guard pages 0 is outside 1..=64"),
        (
            small().trim_interval(Some(Duration::ZERO)),
            "trim interval must not be zero",
        ),
    ];
    for (config, msg) in cases {
        let err = StackPool::new(config).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("invalid coroutine pool configuration: {msg}")
        );
    }
}

#[test]
fn test_guard_install_mode_follows_kernel_support() {
    let r = StackPool::new(small().guard(GuardMode::GuardInstall));
    if coro_pool::guard_install_supported() {
        let pool = r.unwrap();
        assert_eq!(pool.guard_kind(), GuardKind::GuardInstall);
        assert_eq!(pool.budget().vmas_per_stack, 1);
    } else {
        eprintln!("notice: MADV_GUARD_INSTALL unsupported here; checking the error");
        let err = r.unwrap_err();
        assert!(matches!(err, Error::GuardInstallUnsupported));
        assert!(err.to_string().contains("MADV_GUARD_INSTALL"));
    }
    let pool = StackPool::new(small().guard(GuardMode::Mprotect)).unwrap();
    assert_eq!(pool.guard_kind(), GuardKind::Mprotect);
    assert_eq!(pool.budget().vmas_per_stack, 2);
}

/// The maps lines overlapping [lo, hi).
fn maps_overlapping(lo: usize, hi: usize) -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|l| {
            let range = l.split_whitespace().next().unwrap();
            let (a, b) = range.split_once('-').unwrap();
            let a = usize::from_str_radix(a, 16).unwrap();
            let b = usize::from_str_radix(b, 16).unwrap();
            a < hi && lo < b
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn test_guard_region_layout_in_maps() {
    let page = page_size();
    let stack = 64usize << 10;
    // mprotect: a ---p guard VMA right below a rw-p stack VMA.
    let pool = StackPool::new(small().guard(GuardMode::Mprotect)).unwrap();
    let s = pool.take_stack().unwrap();
    let top = s.id().0;
    let lines = maps_overlapping(top - stack - s.guard_size(), top);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains("---p"), "{lines:?}");
    assert!(lines[1].contains("rw-p"), "{lines:?}");
    assert_eq!(pool.stats().vmas_held, 2);
    if coro_pool::guard_install_supported() {
        let pool = StackPool::new(small().guard(GuardMode::GuardInstall)).unwrap();
        let s = pool.take_stack().unwrap();
        let top = s.id().0;
        let lines = maps_overlapping(top - stack - page, top);
        assert_eq!(lines.len(), 1, "one VMA with guard install: {lines:?}");
        assert!(lines[0].contains("rw-p"));
        assert_eq!(pool.stats().vmas_held, 1);
    } else {
        eprintln!("notice: MADV_GUARD_INSTALL unsupported; guard-install layout not checked");
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

fn resident_pages(lo: usize, len: usize) -> usize {
    let page = page_size();
    let mut vec = vec![0u8; len / page];
    // SAFETY: mincore only reads the page tables of [lo, lo + len), which is
    // mapped (an idle pooled stack), and writes len / page bytes into vec.
    let r = unsafe { libc::mincore(lo as *mut libc::c_void, len, vec.as_mut_ptr()) };
    assert_eq!(r, 0);
    vec.iter().filter(|v| **v & 1 == 1).count()
}

#[test]
fn test_idle_pages_release_drops_pages_in_global_pool() {
    let stack = 1usize << 20;
    for (idle, expect_resident) in [(IdlePages::Keep, true), (IdlePages::Release, false)] {
        let pool = StackPool::new(
            PoolConfig::default()
                .stack_size(stack)
                .batch_size(1)
                .idle_pages(idle),
        )
        .unwrap();
        // With batches of one, returning C, A, B in that order leaves B and A
        // in the local pool and moves C's batch to the global pool.
        let (c, top) = touch_stack_hold(&pool);
        let a = one_yield(&pool);
        let b = one_yield(&pool);
        drop(c);
        drop(a);
        drop(b);
        let s = pool.stats();
        assert_eq!((s.pooled_local, s.pooled_global), (2, 1), "{s:?}");
        let resident = resident_pages(top - stack, stack - page_size());
        if expect_resident {
            assert!(resident * page_size() >= 64 << 10, "kept pages: {resident}");
        } else {
            assert_eq!(resident, 0, "released pages");
        }
    }
}

/// Runs a coroutine that touches 128 KiB of stack and stays suspended.
fn touch_stack_hold(pool: &StackPool) -> (Coroutine<(), (), ()>, usize) {
    let mut co: Coroutine<(), (), ()> = Coroutine::new_in(pool, |y, ()| {
        fn deep(y: &coro_pool::Yielder<(), ()>, n: usize) -> u8 {
            let mut a = [1u8; 1024];
            a[n % 1024] = n as u8;
            let a = std::hint::black_box(a);
            if n == 0 {
                y.suspend(());
                a[0]
            } else {
                deep(y, n - 1).wrapping_add(a[1])
            }
        }
        deep(y, 128);
    })
    .unwrap();
    let id = co.stack_id().unwrap().0;
    co.resume(());
    (co, id)
}

#[test]
fn test_global_default_pool() {
    let mut co: Coroutine<u8, u8, u8> = Coroutine::new(|y, a| y.suspend(a) + 1).unwrap();
    assert!(matches!(co.resume(4), CoroutineResult::Yield(4)));
    assert!(matches!(co.resume(4), CoroutineResult::Return(5)));
    assert!(StackPool::global().stats().stacks_created >= 1);
    assert_eq!(StackPool::global().stack_size(), 1 << 20);
}

#[test]
fn test_multithreaded_stress() {
    let pool = Arc::new(StackPool::new(small().batch_size(8).base_max(16)).unwrap());
    let _r = pool.reserve(32);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                let mut live: Vec<(Coroutine<u64, u64, u64>, u64)> = Vec::new();
                for i in 0..3000u64 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    if live.len() < 64 && (!rng.is_multiple_of(3) || live.is_empty()) {
                        let tag = (t << 32) | i;
                        let mut co = Coroutine::new_in(&pool, move |y, seed: u64| {
                            // Private data on this stack must survive a yield.
                            let mut buf = [0u64; 64];
                            for (k, v) in buf.iter_mut().enumerate() {
                                *v = seed ^ k as u64;
                            }
                            let next = y.suspend(seed);
                            for (k, v) in buf.iter().enumerate() {
                                assert_eq!(*v, seed ^ k as u64, "stack corrupted");
                            }
                            next ^ seed
                        })
                        .unwrap();
                        assert!(matches!(co.resume(tag), CoroutineResult::Yield(x) if x == tag));
                        live.push((co, tag));
                    } else {
                        let idx = (rng as usize / 3) % live.len();
                        let (mut co, tag) = live.swap_remove(idx);
                        if rng.is_multiple_of(5) {
                            drop(co); // dropped while suspended
                        } else {
                            match co.resume(7) {
                                CoroutineResult::Return(v) => assert_eq!(v, 7 ^ tag),
                                CoroutineResult::Yield(_) => panic!("unexpected yield"),
                            }
                        }
                    }
                    if i % 1000 == 999 && t == 0 {
                        pool.trim();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = pool.stats();
    assert_eq!(s.live_coroutines, 0);
    assert_eq!(s.pooled_local, 0, "exited threads hold nothing");
    assert!(s.pooled_global <= s.max_pooled);
    assert_eq!(s.stacks_held, s.pooled_global);
    assert_eq!(s.stacks_created - s.stacks_freed, s.stacks_held as u64);
    assert!(s.stacks_reused > 0);
    assert_eq!(s.unmap_failures, 0);
}

#[test]
fn test_reservation_drop_frees_global_stacks_above_new_max() {
    let pool = StackPool::new(small().batch_size(4).base_max(8)).unwrap();
    let r = pool.reserve(100);
    let live: Vec<_> = (0..100).map(|_| one_yield(&pool)).collect();
    drop(live);
    let s = pool.stats();
    assert_eq!((s.pooled_local, s.pooled_global), (8, 92));
    assert_eq!(s.stacks_freed, 0);
    drop(r);
    // No trim: dropping the reservation freed what the maximum no longer
    // covers, oldest batches first.
    let s = pool.stats();
    assert_eq!(s.max_pooled, 8);
    assert_eq!((s.pooled_local, s.pooled_global), (8, 8));
    assert_eq!(s.stacks_freed, 84);
    assert_eq!(s.stacks_held, 16);
    assert_eq!(s.vmas_held, 16 * pool.budget().vmas_per_stack);
    // trim() still works afterwards: its first window saw the burst and
    // keeps up to the maximum, an idle window frees the rest.
    assert_eq!(pool.trim(), 0);
    assert_eq!(pool.trim(), 8);
    assert_eq!(pool.stats().pooled_global, 0);
}

#[test]
fn test_reservation_drop_keeps_what_other_reservations_cover() {
    let pool = StackPool::new(small().batch_size(4).base_max(8)).unwrap();
    let a = pool.reserve(60);
    let b = pool.reserve(30);
    let live: Vec<_> = (0..100).map(|_| one_yield(&pool)).collect();
    drop(live);
    assert_eq!(pool.stats().pooled_global, 92);
    drop(a);
    let s = pool.stats();
    assert_eq!(s.max_pooled, 38);
    assert_eq!(s.pooled_global, 38, "{s:?}");
    // A zero-sized reservation changes nothing when it ends.
    drop(pool.reserve(0));
    assert_eq!(pool.stats().pooled_global, 38);
    drop(b);
    assert_eq!(pool.stats().pooled_global, 8);
}

#[test]
fn test_reservation_drop_leaves_stacks_in_use_alone() {
    let pool = StackPool::new(small().batch_size(4).base_max(0)).unwrap();
    let r = pool.reserve(50);
    let mut live: Vec<_> = (0..50).map(|_| one_yield(&pool)).collect();
    live.drain(..20);
    let before = pool.stats();
    assert_eq!(before.live_coroutines, 30);
    drop(r);
    let s = pool.stats();
    assert_eq!(s.live_coroutines, 30);
    assert_eq!(s.pooled_global, 0);
    assert_eq!(s.stacks_held, 30 + s.pooled_local);
    // The coroutines still run on their (mapped) stacks.
    for co in live.iter_mut() {
        assert!(matches!(co.resume(1), CoroutineResult::Yield(1)));
        assert!(matches!(co.resume(2), CoroutineResult::Return(3)));
    }
}

#[test]
fn test_burst_turns_bounded_without_trim_after_reservations_drop() {
    // The seed scenario in small: threads take turns bursting with a
    // reservation each, then stay alive and idle. Without any trim, the
    // pool holds at most two batches per thread plus the base maximum.
    const THREADS: usize = 4;
    const BURST: usize = 600;
    const BATCH: usize = 8;
    let pool = Arc::new(
        StackPool::new(
            PoolConfig::default()
                .stack_size(16 << 10)
                .batch_size(BATCH)
                .base_max(BATCH),
        )
        .unwrap(),
    );
    let turn = Arc::new(std::sync::Mutex::new(()));
    let idle = Arc::new(std::sync::Barrier::new(THREADS + 1));
    let exit = Arc::new(std::sync::Barrier::new(THREADS + 1));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (pool, turn, idle, exit) = (pool.clone(), turn.clone(), idle.clone(), exit.clone());
            std::thread::spawn(move || {
                {
                    let _turn = turn.lock().unwrap();
                    let demand = pool.reserve(BURST);
                    let live: Vec<_> = (0..BURST).map(|_| one_yield(&pool)).collect();
                    assert!(pool.stats().stacks_held >= BURST);
                    drop(live);
                    drop(demand);
                }
                idle.wait();
                exit.wait();
            })
        })
        .collect();
    idle.wait();
    let s = pool.stats();
    assert_eq!(s.live_coroutines, 0);
    assert!(s.pooled_global <= BATCH, "{s:?}");
    assert!(s.pooled_local <= THREADS * 2 * BATCH, "{s:?}");
    assert!(s.stacks_held <= THREADS * 2 * BATCH + BATCH, "{s:?}");
    assert!(s.stacks_created >= BURST as u64);
    exit.wait();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn test_refill_prefers_batches_this_thread_returned() {
    use std::sync::mpsc::channel;
    let pool = Arc::new(StackPool::new(small().batch_size(4).base_max(100)).unwrap());
    // Another thread takes twelve stacks while the global pool is empty.
    let (taken_tx, taken_rx) = channel();
    let (release_tx, release_rx) = channel::<()>();
    let p = pool.clone();
    let other = std::thread::spawn(move || {
        let theirs: Vec<_> = (0..12).map(|_| p.take_stack().unwrap()).collect();
        taken_tx.send(()).unwrap();
        release_rx.recv().unwrap();
        // Twelve puts: one batch spills (tagged with that thread), then
        // thread exit returns its two local batches.
        drop(theirs);
    });
    taken_rx.recv().unwrap();
    // Twelve puts on this thread: the first four spill to the global pool
    // as a batch tagged with this thread; eight stay local.
    let mine: Vec<_> = (0..12).map(|_| pool.take_stack().unwrap()).collect();
    let spilled: Vec<_> = mine[..4].iter().map(|s| s.id()).collect();
    drop(mine);
    assert_eq!(pool.stats().pooled_global, 4);
    release_tx.send(()).unwrap();
    other.join().unwrap();
    // This thread's batch is now the oldest of four.
    assert_eq!(pool.stats().pooled_global, 16);
    // Drain the local pool, then the refill: it takes back the batch this
    // thread returned (still warm in its caches), not the newest one.
    let local: Vec<_> = (0..8).map(|_| pool.take_stack().unwrap()).collect();
    let refill = pool.take_stack().unwrap();
    assert!(
        spilled.contains(&refill.id()),
        "refill took another thread's batch"
    );
    drop((local, refill));
}

/// Takes and returns a stack when dropped, from a thread-local destructor.
struct TakesOnDrop(Arc<StackPool>);

impl Drop for TakesOnDrop {
    fn drop(&mut self) {
        let stack = self.0.take_stack().unwrap();
        assert!(stack.usable_size() >= 64 << 10);
        drop(stack);
    }
}

thread_local! {
    static HELD: std::cell::RefCell<Option<coro_pool::PooledStack>> =
        const { std::cell::RefCell::new(None) };
    static LATE: std::cell::RefCell<Option<TakesOnDrop>> = const { std::cell::RefCell::new(None) };
}

#[test]
fn test_stacks_used_from_thread_local_destructors() {
    // Thread-local destructors run in some order around the pool's own
    // per-thread registry: a stack held in one may come back after the
    // thread's local pool was retired, and one may be taken after that.
    // Two threads register their thread-locals in opposite orders so both
    // cases occur whatever the order is.
    let pool = Arc::new(StackPool::new(small().batch_size(4)).unwrap());
    for held_first in [false, true] {
        let p = pool.clone();
        std::thread::spawn(move || {
            if held_first {
                HELD.with(|_| ());
            } else {
                LATE.with(|l| *l.borrow_mut() = Some(TakesOnDrop(p.clone())));
            }
            let live: Vec<_> = (0..10).map(|_| one_yield(&p)).collect();
            drop(live);
            if held_first {
                LATE.with(|l| *l.borrow_mut() = Some(TakesOnDrop(p.clone())));
            }
            HELD.with(|h| *h.borrow_mut() = Some(p.take_stack().unwrap()));
        })
        .join()
        .unwrap();
    }
    let s = pool.stats();
    assert_eq!(s.live_coroutines, 0, "{s:?}");
    assert_eq!(
        s.pooled_local, 0,
        "no local pool outlived its thread: {s:?}"
    );
    assert_eq!(s.stacks_held, s.pooled_global, "{s:?}");
    assert_eq!(s.stacks_created, s.stacks_freed + s.stacks_held as u64);
}
