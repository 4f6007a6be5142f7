// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Error paths and stack overflow, each in a child process: the test binary
//! re-runs itself filtered to one test with `CORO_POOL_CHILD` set, the child
//! lowers its own limits, and the parent checks how it ended.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};
use std::sync::Arc;

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

/// Lines of `/proc/<pid>/maps`: the VMAs of another process.
fn vmas_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .count() as u64
}

#[test]
fn test_budget_stays_exact_after_chroot_hides_proc() {
    const NAME: &str = "test_budget_stays_exact_after_chroot_hides_proc";
    // SAFETY: a plain getter.
    if unsafe { libc::geteuid() } != 0 {
        // chroot needs CAP_SYS_CHROOT, and a user namespace cannot be
        // entered by the (multi-threaded) test binary.
        eprintln!("notice: not root, cannot chroot; skipped");
        return;
    }
    if !in_child(NAME) {
        use std::io::{BufRead, BufReader, Write};
        let root = std::env::temp_dir().join(format!("coro-pool-chroot-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, NAME)
            .env("CORO_POOL_CHROOT", &root)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn the test binary");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut seen = String::new();
        let counted = loop {
            let mut line = String::new();
            if stdout.read_line(&mut line).unwrap() == 0 {
                break None;
            }
            seen.push_str(&line);
            // (libtest may have printed the test's name on the same line.)
            if let Some((_, n)) = line.trim().split_once("VMAS ") {
                break Some(n.parse::<u64>().unwrap());
            }
        };
        // The child waits on its stdin: its mappings hold still while they
        // are counted from outside.
        let outside = counted.map(|_| vmas_of(child.id()));
        let mut stdin = child.stdin.take().unwrap();
        let _ = stdin.write_all(b"go\n");
        drop(stdin);
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut rest);
        let out = child.wait_with_output().unwrap();
        let _ = std::fs::remove_dir(&root);
        let out = Output {
            stdout: (seen + &rest).into_bytes(),
            ..out
        };
        expect_child_ok(&out);
        let counted = counted.expect("the child counted its VMAs");
        assert_eq!(
            counted,
            outside.unwrap(),
            "the count inside the chroot is the process's real one: {}",
            describe(&out)
        );
        return;
    }
    use coro_pool::{BudgetOrigin, MapsSource, MaxMapCount, ProcessBudget, DEFAULT_VMA_RESERVE};
    // What the daemon does before its sandbox: read the limit and open the
    // maps while /proc is there.
    let real = MaxMapCount::Proc.read().unwrap();
    let maps = MapsSource::open().unwrap();
    let root = std::env::var("CORO_POOL_CHROOT").unwrap();
    let root = std::ffi::CString::new(root).unwrap();
    // SAFETY: valid C strings.
    unsafe {
        assert_eq!(libc::chroot(root.as_ptr()), 0);
        assert_eq!(libc::chdir(c"/".as_ptr()), 0);
    }
    assert!(std::fs::metadata("/proc/self/maps").is_err());
    // A budget that reads /proc itself is blind here: the fallback limit,
    // no count of the process's mappings.
    let blind = ProcessBudget::new(MaxMapCount::Proc, DEFAULT_VMA_RESERVE);
    assert!(blind.check().is_none());
    let b = StackPool::new(PoolConfig::default().budget(Arc::clone(&blind)))
        .unwrap()
        .budget();
    assert_eq!(b.origin, BudgetOrigin::Fallback);
    // The one handed the limit and the open maps stays exact.
    let budget = ProcessBudget::with_maps(MaxMapCount::Fixed(real), DEFAULT_VMA_RESERVE, maps);
    assert!(ProcessBudget::set_process(Arc::clone(&budget)).is_ok());
    // A pool that names no budget draws from the one installed.
    let pool = StackPool::new(
        PoolConfig::default()
            .stack_size(16 << 10)
            .guard(GuardMode::Mprotect),
    )
    .unwrap();
    assert!(Arc::ptr_eq(pool.process_budget(), &budget));
    assert!(ProcessBudget::set_process(Arc::clone(&budget)).is_err());
    let first = budget.check().expect("counts through the kept fd");
    let held: Vec<_> = (0..100).map(|_| pool.take_stack().unwrap()).collect();
    let check = budget.check().expect("counts through the kept fd");
    assert_eq!(check.pool_vmas, 200);
    assert!(!check.drifted, "{check:?}");
    // The count follows the process: the 100 stacks (2 VMAs each) are in it.
    assert!(
        check.process_vmas >= first.process_vmas + 200,
        "{first:?} {check:?}"
    );
    let stats = budget.stats();
    assert_eq!(stats.max_map_count, real);
    assert_eq!(
        stats.limit_vmas,
        real - DEFAULT_VMA_RESERVE - check.foreign_vmas.saturating_sub(DEFAULT_VMA_RESERVE / 2)
    );
    // Measure again and let the parent count from outside while this
    // process waits; nothing here maps or allocates in between.
    let last = budget.check().unwrap();
    let mut line = [0u8; 64];
    let len = {
        use std::io::Write;
        let mut cur = std::io::Cursor::new(&mut line[..]);
        writeln!(cur, "VMAS {}", last.process_vmas).unwrap();
        cur.position() as usize
    };
    // SAFETY: writes `len` initialized bytes of `line`, then reads into a
    // buffer we own.
    unsafe {
        assert_eq!(libc::write(1, line.as_ptr().cast(), len), len as isize);
        let mut go = [0u8; 8];
        assert!(libc::read(0, go.as_mut_ptr().cast(), go.len()) > 0);
    }
    drop(held);
    println!(
        "{CHILD_OK}: {} VMAs counted inside the chroot",
        last.process_vmas
    );
}
