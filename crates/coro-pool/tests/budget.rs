// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The process-wide mapping budget: pools sharing one budget, a pool's own
//! share, the global pool next to a pool of its own, mappings the pools do
//! not own, and the accounting against `/proc/self/maps`.
//!
//! The tests run one at a time (`SERIAL`) and use budgets of their own
//! where they exhaust one; the process default is exhausted only in a
//! child process (tests/child.rs). Where a test checks VMAs exactly, it
//! counts only those of the stacks it holds: libtest starts threads (2
//! VMAs each) for other tests at any time, so a count of the whole
//! process is exact only in a child process of its own.

use std::sync::{Arc, Mutex, MutexGuard};

use coro_pool::{Coroutine, Error, GuardMode, MaxMapCount, PoolConfig, ProcessBudget, StackPool};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lines of /proc/self/maps.
fn count_vmas() -> u64 {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count() as u64
}

/// Lines of /proc/self/maps that overlap one of `stacks`: the VMAs this
/// test owns, whatever other threads of the process map meanwhile.
fn owned_vmas(stacks: &[coro_pool::PooledStack]) -> u64 {
    let mut ranges: Vec<(usize, usize)> = stacks
        .iter()
        .map(|s| {
            let top = s.id().0;
            (top - s.usable_size() - s.guard_size(), top)
        })
        .collect();
    ranges.sort_unstable();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|l| {
            let range = l.split_whitespace().next().unwrap();
            let (a, b) = range.split_once('-').unwrap();
            let lo = usize::from_str_radix(a, 16).unwrap();
            let hi = usize::from_str_radix(b, 16).unwrap();
            // The first stack that ends above lo overlaps if it starts below hi.
            let i = ranges.partition_point(|r| r.1 <= lo);
            ranges.get(i).is_some_and(|r| r.0 < hi)
        })
        .count() as u64
}

fn mprotect_pool(budget: &Arc<ProcessBudget>) -> PoolConfig {
    PoolConfig::default()
        .stack_size(16 << 10)
        .guard(GuardMode::Mprotect)
        .budget(Arc::clone(budget))
}

/// Takes stacks until the pool refuses one; returns them and the error.
fn take_until_refused(pool: &StackPool) -> (Vec<coro_pool::PooledStack>, Error) {
    let mut held = Vec::new();
    loop {
        match pool.take_stack() {
            Ok(s) => held.push(s),
            Err(e) => return (held, e),
        }
    }
}

#[test]
fn test_two_pools_draw_from_one_budget() {
    let _serial = serial();
    // 60 VMAs, 20 reserved: 40 VMAs for all pools, 20 mprotect stacks.
    let budget = ProcessBudget::new(MaxMapCount::Fixed(60), 20);
    let a = StackPool::new(mprotect_pool(&budget)).unwrap();
    let b = StackPool::new(mprotect_pool(&budget)).unwrap();
    let a_held: Vec<_> = (0..15).map(|_| a.take_stack().unwrap()).collect();
    assert_eq!(a.stats().vmas_held, 30);
    assert_eq!(b.stats().process_pool_vmas, 30);
    let (b_held, err) = take_until_refused(&b);
    assert_eq!(b_held.len(), 5, "the second pool gets what the first left");
    assert!(
        matches!(
            err,
            Error::BudgetExhausted {
                held: 5,
                max_stacks: 5,
                pool_vmas: 40,
                limit_vmas: 40,
                ..
            }
        ),
        "{err}"
    );
    // The first pool meets the same exhausted budget.
    assert!(matches!(
        a.take_stack(),
        Err(Error::BudgetExhausted { held: 15, .. })
    ));
    assert_eq!(budget.stats().pool_vmas, 40);
    // Dropping the first pool (and its stacks) gives its share back.
    drop(a_held);
    drop(a);
    assert_eq!(budget.stats().pool_vmas, 10);
    let more: Vec<_> = (0..15).map(|_| b.take_stack().unwrap()).collect();
    assert_eq!(b.stats().stacks_held, 20);
    drop((more, b_held));
}

#[test]
fn test_share_caps_a_pool_inside_the_budget() {
    let _serial = serial();
    let budget = ProcessBudget::new(MaxMapCount::Fixed(60), 20);
    let capped = StackPool::new(mprotect_pool(&budget).budget_share(Some(4))).unwrap();
    assert_eq!(capped.budget().max_stacks, 4);
    assert_eq!(capped.budget().share, Some(4));
    let (held, err) = take_until_refused(&capped);
    assert_eq!(held.len(), 4);
    assert!(
        matches!(
            err,
            Error::BudgetExhausted {
                held: 4,
                max_stacks: 4,
                ..
            }
        ),
        "{err}"
    );
    // The rest of the budget is still there for another pool.
    let other = StackPool::new(mprotect_pool(&budget)).unwrap();
    let (rest, _) = take_until_refused(&other);
    assert_eq!(rest.len(), 16);
    // A share larger than the budget is capped by it.
    let big = StackPool::new(mprotect_pool(&budget).budget_share(Some(1000))).unwrap();
    assert_eq!(big.budget().max_stacks, 20);
    assert!(matches!(
        big.take_stack(),
        Err(Error::BudgetExhausted {
            held: 0,
            max_stacks: 0,
            ..
        })
    ));
}

#[test]
fn test_global_pool_and_own_pool_share_the_process_budget() {
    let _serial = serial();
    let own = StackPool::new(PoolConfig::default().stack_size(16 << 10)).unwrap();
    let global = StackPool::global();
    assert!(Arc::ptr_eq(own.process_budget(), ProcessBudget::process()));
    assert!(Arc::ptr_eq(
        global.process_budget(),
        ProcessBudget::process()
    ));
    let before = global.stats().process_pool_vmas;
    let held: Vec<_> = (0..100).map(|_| own.take_stack().unwrap()).collect();
    let vps = own.budget().vmas_per_stack as u64;
    // The global pool sees the other pool's stacks in the shared total.
    assert_eq!(global.stats().process_pool_vmas, before + 100 * vps);
    // A stack of the global pool counts in the same total, seen from the
    // other pool.
    let created = global.stats().stacks_created;
    let total = own.stats().process_pool_vmas;
    let co = Coroutine::<(), (), ()>::new(|_, ()| ()).unwrap();
    let with_global = own.stats().process_pool_vmas;
    let mapped = global.stats().stacks_created - created;
    assert_eq!(
        with_global - total,
        mapped * global.budget().vmas_per_stack as u64
    );
    drop(co);
    // A pool given a private budget is not part of the process total.
    let private = StackPool::new(
        PoolConfig::default()
            .stack_size(16 << 10)
            .max_map_count(MaxMapCount::Fixed(1000)),
    )
    .unwrap();
    assert!(!Arc::ptr_eq(
        private.process_budget(),
        ProcessBudget::process()
    ));
    let p = private.take_stack().unwrap();
    assert_eq!(own.stats().process_pool_vmas, with_global);
    drop((p, held));
}

#[test]
fn test_accounting_matches_proc_self_maps() {
    let _serial = serial();
    let budget = ProcessBudget::new(MaxMapCount::Fixed(100_000), 5_000);
    let pool = StackPool::new(mprotect_pool(&budget)).unwrap();
    let first = budget.check().expect("/proc/self/maps is readable");
    assert!(!first.drifted);
    let held: Vec<_> = (0..200).map(|_| pool.take_stack().unwrap()).collect();
    // mprotect guards: 2 VMAs per stack, exactly what is accounted.
    assert_eq!(owned_vmas(&held), 400);
    assert_eq!(pool.stats().vmas_held, 400);
    let check = budget.check().unwrap();
    assert_eq!(check.pool_vmas, 400);
    assert_eq!(check.exact_pool_vmas, 400);
    assert!(!check.drifted, "{check:?}");
    assert!(check.process_vmas >= 400);
    assert_eq!(check.foreign_vmas, check.process_vmas - 400);
    assert!(budget.stats().measurements >= 3);
    assert_eq!(budget.stats().drift_warnings, 0);
    // A trim checks again.
    let n = budget.stats().measurements;
    drop(held);
    pool.trim();
    assert!(budget.stats().measurements > n);
    // Guard-installed stacks are charged 1 VMA each, an upper bound.
    if coro_pool::guard_install_supported() {
        let auto = StackPool::new(
            PoolConfig::default()
                .stack_size(16 << 10)
                .budget(Arc::clone(&budget)),
        )
        .unwrap();
        let held: Vec<_> = (0..100).map(|_| auto.take_stack().unwrap()).collect();
        let owned = owned_vmas(&held);
        assert!((1..=100).contains(&owned), "{owned} VMAs");
        assert_eq!(auto.stats().vmas_held, 100);
        assert!(!budget.check().unwrap().drifted);
        drop(held);
    } else {
        eprintln!("notice: MADV_GUARD_INSTALL unsupported here, guard-install part skipped");
    }
}

/// `count` VMAs that are not coroutine stacks: one region whose pages
/// alternate between read-write and no access, so none merge.
struct Foreign {
    addr: *mut libc::c_void,
    len: usize,
}

impl Foreign {
    fn map(count: usize) -> Foreign {
        let page = 4096;
        let len = count * page;
        // SAFETY: a fresh anonymous mapping nothing else references.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED);
        for i in (1..count).step_by(2) {
            // SAFETY: page i lies inside the mapping made above.
            let r = unsafe { libc::mprotect(addr.cast::<u8>().add(i * page).cast(), page, 0) };
            assert_eq!(r, 0);
        }
        Foreign { addr, len }
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the region mapped in Foreign::map.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

#[test]
fn test_foreign_mappings_shrink_the_budget() {
    let _serial = serial();
    // A simulated limit 4000 VMAs above what the process maps now, with a
    // reserve of 1000, and foreign mappings counted against it.
    let base = count_vmas();
    let mmc = base + 4000;
    let budget = ProcessBudget::measure_foreign(MaxMapCount::Fixed(mmc), 1000, true);
    let pool = StackPool::new(mprotect_pool(&budget)).unwrap();
    // Creating the pool measured the process: what it counted (base, give
    // or take the threads libtest started meanwhile) beyond half the
    // reserve comes off the limit.
    let measured = budget.stats().foreign_vmas;
    assert!(measured.abs_diff(base) <= 16, "{measured} vs {base}");
    assert_eq!(
        budget.limit_vmas(),
        mmc - 1000 - measured.saturating_sub(500)
    );
    // The rest of the process maps 1500 more VMAs, more than the reserve.
    let foreign = Foreign::map(1500);
    let (held, err) = take_until_refused(&pool);
    assert!(matches!(err, Error::BudgetExhausted { .. }), "{err}");
    let process = count_vmas();
    // Ignoring them, the pool would have taken mmc - 1000 VMAs and the
    // process would be 1500 + base past the limit. Counted, half the
    // reserve stays free, give or take what the process mapped since the
    // last count (at most one measurement step, 1000 / 16 VMAs).
    assert!(
        process <= mmc - 500 + 62,
        "process {process} VMAs, limit {mmc}, pool {}",
        pool.stats().vmas_held
    );
    assert!(!held.is_empty());
    assert!(budget.stats().foreign_vmas >= 1500);
    // When the foreign mappings go, a trim measures again and the budget
    // grows back.
    drop(foreign);
    pool.trim();
    assert!(budget.limit_vmas() >= mmc - 1000 - base.saturating_sub(500) - 50);
    assert!(pool.take_stack().is_ok());
    drop(held);
}
