// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Error paths and stack overflow, each in a child process: the test binary
//! re-runs itself filtered to one test with `CORO_POOL_CHILD` set, the child
//! lowers its own limits, and the parent checks how it ended.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};

use coro_pool::{Coroutine, CoroutineResult, Error, GuardMode, PoolConfig, StackPool};

const CHILD_ENV: &str = "CORO_POOL_CHILD";
const CHILD_OK: &str = "CORO_POOL_CHILD_OK";

/// True in the child, where the test body does the risky part.
fn in_child(name: &str) -> bool {
    std::env::var(CHILD_ENV).is_ok_and(|v| v == name)
}

/// Re-runs this test binary on test `name` with the child marker set.
fn run_child(name: &str, mode: &str) -> Output {
    let exe = std::env::current_exe().unwrap();
    Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .env("CORO_POOL_CHILD_MODE", mode)
        .output()
        .expect("spawn the test binary")
}

fn describe(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn expect_child_ok(out: &Output) {
    assert!(out.status.success(), "{}", describe(out));
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if line.contains(CHILD_OK) {
            eprintln!("child: {line}");
        }
    }
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(CHILD_OK),
        "{}",
        describe(out)
    );
}

fn vm_size_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

#[test]
fn test_rlimit_as_makes_creation_fail_and_process_survives() {
    const NAME: &str = "test_rlimit_as_makes_creation_fail_and_process_survives";
    if !in_child(NAME) {
        expect_child_ok(&run_child(NAME, ""));
        return;
    }
    let pool = StackPool::new(PoolConfig::default()).unwrap();
    let mut live = Vec::with_capacity(4096);
    // Room for about 48 one-MiB stacks beyond what the process maps now.
    let limit = vm_size_bytes() + (48 << 20);
    let rl = libc::rlimit {
        rlim_cur: limit,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit only reads the struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) }, 0);
    let err = loop {
        match Coroutine::<u32, u32, u32>::new_in(&pool, |y, x| y.suspend(x) + 1) {
            Ok(mut co) => {
                assert!(matches!(co.resume(1), CoroutineResult::Yield(1)));
                live.push(co);
                assert!(live.len() < 4096, "RLIMIT_AS had no effect");
            }
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::Mmap { .. }), "{err}");
    assert_eq!(err.errno(), Some(libc::ENOMEM));
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let expected = format!(
        "failed to map a {}-byte coroutine stack: ",
        (1 << 20) + page
    );
    assert!(err.to_string().starts_with(&expected), "{err}");
    assert!(
        live.len() > 4,
        "only {} stacks before the limit",
        live.len()
    );
    // Everything still works: finish the coroutines, reuse their stacks.
    for co in &mut live {
        assert!(matches!(co.resume(1), CoroutineResult::Return(2)));
    }
    let n = live.len();
    live.clear();
    let mut again = Coroutine::<u32, u32, u32>::new_in(&pool, |_, x| x * 3).unwrap();
    assert!(matches!(again.resume(5), CoroutineResult::Return(15)));
    println!("{CHILD_OK} {n} stacks before ENOMEM");
}

// Needs the comparison policies: runs with `--all-features` (as CI does).
#[cfg(feature = "bench-policies")]
#[test]
fn test_unbounded_policy_hits_max_map_count_and_recovers() {
    const NAME: &str = "test_unbounded_policy_hits_max_map_count_and_recovers";
    let max = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    match max {
        Some(m) if m <= 262_144 => {}
        other => {
            eprintln!(
                "notice: vm.max_map_count is {other:?}; too large to exhaust quickly, skipped"
            );
            return;
        }
    }
    if !in_child(NAME) {
        expect_child_ok(&run_child(NAME, ""));
        return;
    }
    // QEMU's old behaviour: no budget, two VMAs per stack.
    let pool = StackPool::new(
        PoolConfig::default()
            .stack_size(16 << 10)
            .policy(coro_pool::Policy::UnboundedPerThread)
            .guard(GuardMode::Mprotect),
    )
    .unwrap();
    let mut held = Vec::with_capacity(300_000);
    let err = loop {
        match pool.take_stack() {
            Ok(s) => held.push(s),
            Err(e) => break e,
        }
    };
    assert_eq!(err.errno(), Some(libc::ENOMEM), "{err}");
    assert!(
        matches!(err, Error::Mmap { .. } | Error::Guard { .. }),
        "{err}"
    );
    let n = held.len();
    assert!(n as u64 > max.unwrap() / 2 - 2_000, "only {n} stacks");
    drop(held);
    pool.flush_local();
    assert_eq!(pool.stats().stacks_held, 0);
    let s = pool.take_stack().unwrap();
    drop(s);
    println!("{CHILD_OK} {n} stacks before ENOMEM: {err}");
}

#[test]
fn test_default_policy_stops_at_budget_before_kernel_limit() {
    const NAME: &str = "test_default_policy_stops_at_budget_before_kernel_limit";
    if !in_child(NAME) {
        expect_child_ok(&run_child(NAME, ""));
        return;
    }
    // A tiny injected mapping budget: 40 VMAs, 20 reserved, 2 per stack.
    let pool = StackPool::new(
        PoolConfig::default()
            .stack_size(16 << 10)
            .guard(GuardMode::Mprotect)
            .max_map_count(coro_pool::MaxMapCount::Fixed(40)),
    )
    .unwrap();
    let mut live = Vec::new();
    let err = loop {
        match Coroutine::<(), (), ()>::new_in(&pool, |y, ()| y.suspend(())) {
            Ok(mut co) => {
                co.resume(());
                live.push(co);
            }
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, Error::BudgetExhausted { max_stacks: 10, .. }),
        "{err}"
    );
    assert_eq!(live.len(), 10);
    live.clear();
    assert!(Coroutine::<(), (), ()>::new_in(&pool, |_, ()| ()).is_ok());
    println!("{CHILD_OK}");
}

#[inline(never)]
fn recurse(depth: u64) -> u64 {
    let frame = std::hint::black_box([depth; 32]);
    if std::hint::black_box(true) {
        recurse(depth + 1).wrapping_add(frame[3])
    } else {
        frame[0]
    }
}

fn overflow_child(guard: GuardMode) {
    let pool = StackPool::new(PoolConfig::default().stack_size(64 << 10).guard(guard)).unwrap();
    let mut co: Coroutine<(), (), u64> = Coroutine::new_in(&pool, |_, ()| recurse(0)).unwrap();
    println!("overflowing");
    co.resume(());
    println!("{CHILD_OK} (unreachable: no fault)");
}

fn expect_overflow_fault(mode: &str, name: &str) {
    let out = run_child(name, mode);
    let signal = out.status.signal();
    assert!(
        signal == Some(libc::SIGSEGV) || signal == Some(libc::SIGBUS),
        "expected a fault on the guard page; {}",
        describe(&out)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("overflowing"));
    assert!(!String::from_utf8_lossy(&out.stdout).contains(CHILD_OK));
}

#[test]
fn test_stack_overflow_faults_on_mprotect_guard() {
    const NAME: &str = "test_stack_overflow_faults_on_mprotect_guard";
    if in_child(NAME) {
        overflow_child(GuardMode::Mprotect);
        return;
    }
    expect_overflow_fault("mprotect", NAME);
}

#[test]
fn test_stack_overflow_faults_on_installed_guard() {
    const NAME: &str = "test_stack_overflow_faults_on_installed_guard";
    if !coro_pool::guard_install_supported() {
        eprintln!("notice: MADV_GUARD_INSTALL unsupported here; skipped");
        return;
    }
    if in_child(NAME) {
        overflow_child(GuardMode::GuardInstall);
        return;
    }
    expect_overflow_fault("guard-install", NAME);
}

#[test]
fn test_second_pool_meets_exhausted_process_budget() {
    const NAME: &str = "test_second_pool_meets_exhausted_process_budget";
    if !in_child(NAME) {
        expect_child_ok(&run_child(NAME, ""));
        return;
    }
    // The real process budget: vm.max_map_count minus the default reserve.
    // A pool of its own takes stacks until that budget refuses one.
    let own = StackPool::new(
        PoolConfig::default()
            .stack_size(16 << 10)
            .guard(GuardMode::Mprotect),
    )
    .unwrap();
    let mut held = Vec::new();
    let err = loop {
        match own.take_stack() {
            Ok(s) => held.push(s),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::BudgetExhausted { .. }), "{err}");
    let budget = own.budget();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let process_vmas = maps.lines().count() as u64;
    assert!(
        process_vmas <= budget.max_map_count - budget.reserved_vmas / 2,
        "{process_vmas} VMAs, {budget:?}"
    );
    // The global pool (Coroutine::new) and a third pool meet the same
    // exhausted budget: an error, not an abort.
    let err = Coroutine::<(), (), ()>::new(|_, ()| ()).unwrap_err();
    assert!(
        matches!(err, Error::BudgetExhausted { held: 0, .. }),
        "{err}"
    );
    let third = StackPool::new(PoolConfig::default().stack_size(16 << 10)).unwrap();
    assert!(matches!(
        third.take_stack(),
        Err(Error::BudgetExhausted { .. })
    ));
    println!(
        "{CHILD_OK}: {} stacks, {process_vmas} process VMAs, first error: {err}",
        held.len()
    );
    // Freeing the first pool's stacks lets the others create again.
    drop(held);
    drop(own);
    let mut co = Coroutine::<(), (), u32>::new(|_, ()| 7).unwrap();
    assert!(matches!(co.resume(()), CoroutineResult::Return(7)));
    assert!(third.take_stack().is_ok());
}
