// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The seccomp allow-lists (`--seccomp kill|log|trap|none`), built with
//! rust-vmm's `seccompiler`.
//!
//! Three filters, stacked (the kernel runs every filter of a thread and the
//! most restrictive answer wins):
//!
//! 1. **`clone3` → `ENOSYS`** (every thread). seccomp cannot inspect the
//!    flags of `clone3`, which sit in a user-memory struct, so the call is
//!    answered with `ENOSYS` and glibc's `pthread_create` falls back to
//!    `clone`, whose flags the next filter checks.
//! 2. **The process-wide allow-list** (every thread, installed with
//!    `SECCOMP_FILTER_FLAG_TSYNC` before any worker thread starts): the
//!    syscalls of [`allowed_syscalls`] unconditionally, plus argument
//!    filters: `clone` only with [`THREAD_CLONE_FLAGS`] (a thread, never a
//!    process), `ioctl` only with `FIONBIO`/`FIOCLEX`, `prctl` only with
//!    `PR_SET_NAME` and `PR_SET_NO_NEW_PRIVS`, and `seccomp` only to add a
//!    filter to the calling thread (which can only narrow it further).
//! 3. **The worker filter** ([`ThreadKind::Worker`]): each thread of the
//!    engine's worker pools (`9p-worker-N`, `9p-lock-wait-N`), which only
//!    run filesystem calls handed over by the coroutines, installs
//!    [`worker_syscalls`] on itself when it starts ([`enter_thread`]): no
//!    sockets, no thread creation, no event loops, no memory locking, no
//!    `prctl`/`ioctl`/`seccomp`.
//!
//! The lists start from the library's own
//! ([`virtio_9p_server::syscalls`]: [`WORKER_THREAD`] for workers, plus
//! [`DEVICE_THREAD`] process-wide) and add only what the daemon itself
//! makes beyond serving; `tests/syscalls.rs` runs its workload under the
//! filters built here as well as under the library's lists alone.
//!
//! A syscall outside the lists:
//! - `kill`: kills the whole process (`SECCOMP_RET_KILL_PROCESS`);
//! - `log`: is allowed and logged by the kernel (audit, `dmesg`);
//! - `trap`: raises SIGSYS; the handler installed here prints the syscall
//!   number on stderr and exits with status 159 (128 + SIGSYS);
//! - `none`: no filter.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use log::error;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use virtio_9p_server::syscalls::{Syscall, DEVICE_THREAD, WORKER_THREAD};

use super::{Error, Result};

/// What happens on a syscall outside the allow-list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SeccompMode {
    /// Kill the process.
    #[default]
    Kill,
    /// Allow and log.
    Log,
    /// SIGSYS with a diagnostic, then exit status 159.
    Trap,
    /// No filter.
    None,
}

impl FromStr for SeccompMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "kill" => Ok(SeccompMode::Kill),
            "log" => Ok(SeccompMode::Log),
            "trap" => Ok(SeccompMode::Trap),
            "none" => Ok(SeccompMode::None),
            _ => Err(Error::SeccompMode(s.to_owned())),
        }
    }
}

impl fmt::Display for SeccompMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SeccompMode::Kill => "kill",
            SeccompMode::Log => "log",
            SeccompMode::Trap => "trap",
            SeccompMode::None => "none",
        })
    }
}

/// `fchmodat2(2)` (Linux 6.6); not yet in every libc.
const SYS_FCHMODAT2: i64 = 452;

/// The numbers of one of the library's lists.
fn numbers(list: &[Syscall]) -> impl Iterator<Item = i64> + '_ {
    list.iter().map(|s| s.nr)
}

/// What every thread of the daemon makes beyond the library's
/// [`WORKER_THREAD`]: thread ids and signals (std's panic and thread
/// machinery), the process's own end.
const THREAD_EXTRAS: &[i64] = &[
    libc::SYS_sched_getaffinity,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_tgkill,
    libc::SYS_exit_group,
    libc::SYS_rt_sigreturn,
    libc::SYS_restart_syscall,
];

/// The calls on files the daemon's threads make beyond the library's
/// [`WORKER_THREAD`]: the `l*`/`f*` xattr forms and the other variants that
/// glibc and std pick, and the ids the sandbox checks.
const FILE_EXTRAS: &[i64] = &[
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_fallocate,
    libc::SYS_flock,
    libc::SYS_statfs,
    libc::SYS_fchown,
    libc::SYS_fchmod,
    SYS_FCHMODAT2,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_lgetxattr,
    libc::SYS_fgetxattr,
    libc::SYS_lsetxattr,
    libc::SYS_fsetxattr,
    libc::SYS_llistxattr,
    libc::SYS_flistxattr,
    libc::SYS_lremovexattr,
    libc::SYS_fremovexattr,
    libc::SYS_getcwd,
    // Identity (read-only).
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
];

/// The x86_64 forms of file calls that newer architectures only have as
/// `*at` calls (std and glibc still use some of them there), beyond those
/// the library lists. aarch64 has none of them: its glibc and std make
/// `openat`, `newfstatat`/`statx`, `faccessat`, `getdents64` and the vDSO's
/// `clock_gettime` instead, all listed.
#[cfg(target_arch = "x86_64")]
const LEGACY_FILE_EXTRAS: &[i64] = &[
    libc::SYS_open,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_access,
    libc::SYS_getdents,
    libc::SYS_time,
];

/// What the daemon's other threads (main, vhost-user, vring, socket
/// threads) make beyond the library's [`WORKER_THREAD`] and
/// [`DEVICE_THREAD`] and the extras above. Nothing here creates
/// processes, loads code, changes namespaces, mounts, traces, or opens
/// network sockets.
const PROCESS_EXTRAS: &[i64] = &[
    // Memory beyond the allocator's: the mlock policy.
    libc::SYS_mlock,
    libc::SYS_mlock2,
    libc::SYS_munlock,
    libc::SYS_mlockall,
    libc::SYS_munlockall,
    libc::SYS_membarrier,
    // Threads and synchronisation (std, the worker pool, vhost-user-backend).
    // clone3 is answered with ENOSYS by the filter before this one
    // (glibc then uses clone, which `argument_rules` checks); it is
    // listed so that this filter does not kill it first.
    libc::SYS_clone3,
    libc::SYS_set_robust_list,
    libc::SYS_get_robust_list,
    libc::SYS_rseq,
    libc::SYS_set_tid_address,
    libc::SYS_getrlimit,
    libc::SYS_prlimit64,
    // Signal handlers.
    libc::SYS_rt_sigaction,
    // Time and timers.
    libc::SYS_clock_getres,
    libc::SYS_gettimeofday,
    libc::SYS_timerfd_create,
    // Event loops: epoll, eventfds, select.
    libc::SYS_epoll_create1,
    libc::SYS_epoll_pwait2,
    libc::SYS_eventfd2,
    libc::SYS_pselect6,
    // The vhost-user frontend's socket with its fds, and 9P clients.
    libc::SYS_accept,
    libc::SYS_recvmsg,
    libc::SYS_sendmsg,
    libc::SYS_shutdown,
    libc::SYS_getsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    // fds.
    libc::SYS_close_range,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_memfd_create,
    // Identity (read-only).
    libc::SYS_uname,
    // mlock-policy asks whether CAP_IPC_LOCK is held.
    libc::SYS_capget,
];

/// The x86_64-only calls of the daemon's other threads: glibc's TLS setup
/// (`arch_prctl`) and `dup2`, which aarch64 glibc makes as `dup3` (listed
/// in [`PROCESS_EXTRAS`]).
#[cfg(target_arch = "x86_64")]
const LEGACY_PROCESS_EXTRAS: &[i64] = &[libc::SYS_arch_prctl, libc::SYS_dup2];

/// The calls allowed only with the arguments of [`argument_rules`]; the
/// library's lists name some of them (`ioctl`), so they are taken out of
/// the unconditional lists.
const ARGUMENT_CHECKED: [i64; 4] = [
    libc::SYS_clone,
    libc::SYS_ioctl,
    libc::SYS_prctl,
    libc::SYS_seccomp,
];

/// Sorted, without duplicates and without the argument-checked calls.
fn finish(mut v: Vec<i64>) -> Vec<i64> {
    v.retain(|nr| !ARGUMENT_CHECKED.contains(nr));
    v.sort_unstable();
    v.dedup();
    v
}

/// The syscalls every thread of the daemon may make without an argument
/// check: the library's [`WORKER_THREAD`] and [`DEVICE_THREAD`] (what
/// serving makes) plus the daemon's own extras (the vhost-user sockets,
/// thread creation, the mlock policy, saving a session). Nothing here
/// creates processes, loads code, changes namespaces, mounts, traces, or
/// opens network sockets: a compromised daemon keeps its view of the
/// export. `clone`, `ioctl`, `prctl` and `seccomp` are allowed only with
/// the arguments of [`argument_rules`].
pub fn allowed_syscalls() -> Vec<i64> {
    let mut v = worker_syscalls();
    v.extend(numbers(DEVICE_THREAD));
    v.extend_from_slice(PROCESS_EXTRAS);
    #[cfg(target_arch = "x86_64")]
    v.extend_from_slice(LEGACY_PROCESS_EXTRAS);
    finish(v)
}

/// The `clone` flags of glibc's `pthread_create` (and so of
/// `std::thread::spawn`): a thread sharing everything, never a process.
pub const THREAD_CLONE_FLAGS: u64 = (libc::CLONE_VM
    | libc::CLONE_FS
    | libc::CLONE_FILES
    | libc::CLONE_SIGHAND
    | libc::CLONE_THREAD
    | libc::CLONE_SYSVSEM
    | libc::CLONE_SETTLS
    | libc::CLONE_PARENT_SETTID
    | libc::CLONE_CHILD_CLEARTID) as u64;

/// The `ioctl` requests allowed: std's `set_nonblocking` on sockets
/// (`FIONBIO`) and `set_cloexec` (`FIOCLEX`), which the vhost-user socket
/// code may reach; they change nothing `fcntl` could not. `FIONREAD`
/// (read-only) tells a socket thread how much of a spliced Rread is still
/// in its pipe when the socket is full. No other request
/// was seen under `strace -f` over the integration suite, a socket session
/// and the guest conformance run.
// The request type differs between libcs (`c_ulong` on glibc, `c_int` on musl).
#[allow(clippy::unnecessary_cast)]
pub const IOCTL_REQUESTS: [u64; 3] = [
    libc::FIONBIO as u64,
    libc::FIOCLEX as u64,
    libc::FIONREAD as u64,
];

/// The `prctl` options allowed: `PR_SET_NAME` (std names each thread it
/// starts) and `PR_SET_NO_NEW_PRIVS` (set by `seccompiler` before a worker
/// thread stacks its own filter; it cannot be cleared).
pub const PRCTL_OPTIONS: [u64; 2] = [libc::PR_SET_NAME as u64, libc::PR_SET_NO_NEW_PRIVS as u64];

fn cond(arg: u8, len: SeccompCmpArgLen, value: u64) -> Result<SeccompCondition> {
    Ok(SeccompCondition::new(arg, len, SeccompCmpOp::Eq, value)?)
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule> {
    Ok(SeccompRule::new(conditions)?)
}

/// The argument-checked entries of the process-wide list: syscall number
/// and the rules of which one must match. `ioctl`'s request and `prctl`'s
/// option are compared on their low 32 bits, the part the kernel reads
/// (`unsigned int cmd`, `int option`); `clone`'s flags on all 64.
pub fn argument_rules() -> Result<Vec<(i64, Vec<SeccompRule>)>> {
    use SeccompCmpArgLen::{Dword, Qword};
    let clone = vec![rule(vec![cond(0, Qword, THREAD_CLONE_FLAGS)?])?];
    let ioctl = IOCTL_REQUESTS
        .iter()
        .map(|&r| rule(vec![cond(1, Dword, r)?]))
        .collect::<Result<Vec<_>>>()?;
    let prctl = PRCTL_OPTIONS
        .iter()
        .map(|&o| rule(vec![cond(0, Dword, o)?]))
        .collect::<Result<Vec<_>>>()?;
    // SECCOMP_SET_MODE_FILTER with no flags: a filter for the calling
    // thread only (no TSYNC, no listener fd), which can only narrow it.
    let seccomp = vec![rule(vec![
        cond(0, Dword, u64::from(libc::SECCOMP_SET_MODE_FILTER))?,
        cond(1, Dword, 0)?,
    ])?];
    Ok(vec![
        (libc::SYS_clone, clone),
        (libc::SYS_ioctl, ioctl),
        (libc::SYS_prctl, prctl),
        (libc::SYS_seccomp, seccomp),
    ])
}

/// The kinds of threads that narrow the process-wide filter when they
/// start ([`enter_thread`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// A thread of the engine's worker pools: runs filesystem calls (and
    /// blocking lock waits) for the coroutines and wakes the engine
    /// through an eventfd it already holds.
    Worker,
}

/// The syscalls of a [`ThreadKind::Worker`] thread: the library's
/// [`WORKER_THREAD`] (the passthrough filesystem, memory, futexes and its
/// own exit) plus the daemon's thread and file extras. A subset of
/// [`allowed_syscalls`]; everything that reaches beyond the export's files
/// (sockets, new threads, event loops, timers, memory locking, `prctl`,
/// `ioctl`, `seccomp`) is left out.
pub fn worker_syscalls() -> Vec<i64> {
    let mut v: Vec<i64> = numbers(WORKER_THREAD).collect();
    v.extend_from_slice(THREAD_EXTRAS);
    v.extend_from_slice(FILE_EXTRAS);
    #[cfg(target_arch = "x86_64")]
    v.extend_from_slice(LEGACY_FILE_EXTRAS);
    finish(v)
}

fn mismatch_action(mode: SeccompMode) -> Option<SeccompAction> {
    match mode {
        SeccompMode::None => None,
        SeccompMode::Kill => Some(SeccompAction::KillProcess),
        SeccompMode::Log => Some(SeccompAction::Log),
        SeccompMode::Trap => Some(SeccompAction::Trap),
    }
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)?;
    let filter = SeccompFilter::new(rules, mismatch, matched, arch)?;
    Ok(filter.try_into()?)
}

fn unconditional(list: Vec<i64>) -> BTreeMap<i64, Vec<SeccompRule>> {
    list.into_iter().map(|nr| (nr, Vec::new())).collect()
}

/// Compiles the process-wide allow-list for `mode` on this architecture
/// (`None` for [`SeccompMode::None`]).
pub fn build(mode: SeccompMode) -> Result<Option<BpfProgram>> {
    let Some(mismatch) = mismatch_action(mode) else {
        return Ok(None);
    };
    let mut rules = unconditional(allowed_syscalls());
    rules.extend(argument_rules()?);
    compile(rules, mismatch, SeccompAction::Allow).map(Some)
}

/// Compiles the filter that answers `clone3` with `ENOSYS` and lets every
/// other syscall through to the allow-list.
pub fn build_clone3_enosys() -> Result<BpfProgram> {
    compile(
        unconditional(vec![libc::SYS_clone3]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
    )
}

/// Compiles the filter a thread of `kind` adds to the process-wide one,
/// for `mode` (`None` for [`SeccompMode::None`]).
pub fn build_thread(kind: ThreadKind, mode: SeccompMode) -> Result<Option<BpfProgram>> {
    let Some(mismatch) = mismatch_action(mode) else {
        return Ok(None);
    };
    let list = match kind {
        ThreadKind::Worker => worker_syscalls(),
    };
    compile(unconditional(list), mismatch, SeccompAction::Allow).map(Some)
}

/// The compiled worker filter, set by [`apply`].
static WORKER_FILTER: OnceLock<BpfProgram> = OnceLock::new();

/// Narrows the calling thread to the filter of `kind`, if [`apply`] has
/// installed a process-wide filter; does nothing otherwise (library use
/// without the binary's sandbox, `--seccomp none`). Called by the engine's
/// worker threads as they start. Installing a filter that `apply` already
/// compiled only fails if the kernel runs out of memory; the thread then
/// must not run unconfined, so the process exits with status 1.
pub fn enter_thread(kind: ThreadKind) {
    let prog = match kind {
        ThreadKind::Worker => WORKER_FILTER.get(),
    };
    let Some(prog) = prog else {
        return;
    };
    if let Err(e) = seccompiler::apply_filter(prog) {
        error!("seccomp: cannot install the {kind:?} thread filter: {e}; exiting");
        std::process::exit(1);
    }
}

/// Writes `n` in decimal into `buf`, returning the used tail.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

extern "C" fn on_sigsys(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // siginfo's _sigsys member: call address (pointer), then the syscall
    // number (int), after the 16-byte signo/errno/code header on 64-bit.
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers;
    // the offset is inside the 128-byte structure.
    let nr = unsafe {
        *(info
            .cast::<u8>()
            .add(16 + std::mem::size_of::<usize>())
            .cast::<i32>())
    };
    let mut buf = [0u8; 20];
    let digits = decimal(u64::from(nr as u32), &mut buf);
    let head = b"virtio-9p-server: seccomp: forbidden syscall ";
    // SAFETY: write(2) on stderr with valid buffers is async-signal-safe.
    unsafe {
        libc::write(2, head.as_ptr().cast(), head.len());
        libc::write(2, digits.as_ptr().cast(), digits.len());
        libc::write(2, b"\n".as_ptr().cast(), 1);
    }
    // Exit like a shell reports a SIGSYS death. Raising SIGSYS instead
    // would be ignored when the daemon is pid 1 of its namespace.
    // SAFETY: _exit(2) is async-signal-safe.
    unsafe { libc::_exit(128 + libc::SIGSYS) }
}

/// Installs the filters of `mode` on every thread of the process (with
/// the SIGSYS reporter for [`SeccompMode::Trap`]) and arms the per-thread
/// filters that [`enter_thread`] adds; sets `no_new_privs`. Call it before
/// any worker thread starts.
pub fn apply(mode: SeccompMode) -> Result<()> {
    let Some(prog) = build(mode)? else {
        return Ok(());
    };
    let clone3 = build_clone3_enosys()?;
    if let Some(worker) = build_thread(ThreadKind::Worker, mode)? {
        if WORKER_FILTER.set(worker).is_err() {
            return Err(Error::SeccompInstalled);
        }
    }
    if mode == SeccompMode::Trap {
        // SAFETY: a zeroed sigaction is valid; the handler only calls
        // async-signal-safe functions.
        let r = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigsys
                as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
                as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(super::sys_err("install the SIGSYS handler"));
        }
    }
    // The clone3 filter first: the allow-list lets `seccomp` through only
    // without TSYNC.
    seccompiler::apply_filter_all_threads(&clone3)?;
    Ok(seccompiler::apply_filter_all_threads(&prog)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_filters_compile_for_every_mode() {
        for m in [SeccompMode::Kill, SeccompMode::Log, SeccompMode::Trap] {
            assert!(!build(m).unwrap().unwrap().is_empty());
            assert!(!build_thread(ThreadKind::Worker, m)
                .unwrap()
                .unwrap()
                .is_empty());
        }
        assert!(build(SeccompMode::None).unwrap().is_none());
        assert!(build_thread(ThreadKind::Worker, SeccompMode::None)
            .unwrap()
            .is_none());
        assert!(!build_clone3_enosys().unwrap().is_empty());
    }

    #[test]
    fn test_worker_list_is_a_subset_of_the_process_list() {
        let all = allowed_syscalls();
        for nr in worker_syscalls() {
            assert!(
                all.contains(&nr),
                "worker syscall {nr} is not allowed process-wide"
            );
        }
    }

    #[test]
    fn test_worker_list_leaves_out_threads_sockets_and_event_loops() {
        let w = worker_syscalls();
        for nr in [
            libc::SYS_clone,
            libc::SYS_clone3,
            libc::SYS_accept4,
            libc::SYS_recvmsg,
            libc::SYS_sendmsg,
            libc::SYS_recvfrom,
            libc::SYS_sendto,
            libc::SYS_epoll_ctl,
            libc::SYS_epoll_create1,
            libc::SYS_eventfd2,
            libc::SYS_timerfd_create,
            libc::SYS_memfd_create,
            libc::SYS_mlockall,
            libc::SYS_prctl,
            libc::SYS_ioctl,
            libc::SYS_seccomp,
            libc::SYS_pipe2,
            libc::SYS_prlimit64,
        ] {
            assert!(!w.contains(&nr), "worker filter allows syscall {nr}");
        }
    }

    #[test]
    fn test_argument_checked_calls_are_not_unconditional() {
        let all = allowed_syscalls();
        let checked: Vec<i64> = argument_rules()
            .unwrap()
            .into_iter()
            .map(|(nr, _)| nr)
            .collect();
        assert_eq!(
            checked,
            [
                libc::SYS_clone,
                libc::SYS_ioctl,
                libc::SYS_prctl,
                libc::SYS_seccomp
            ]
        );
        for nr in checked {
            assert!(
                !all.contains(&nr),
                "syscall {nr} is allowed without its argument check"
            );
        }
        // pthread_create's flags: a thread, never a new process or namespace.
        assert_eq!(THREAD_CLONE_FLAGS, 0x3d_0f00);
    }

    #[test]
    fn test_dangerous_syscalls_are_not_allowed() {
        let v = allowed_syscalls();
        for nr in [
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_ptrace,
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_pivot_root,
            libc::SYS_chroot,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_socket,
            libc::SYS_connect,
            libc::SYS_bind,
            libc::SYS_init_module,
            libc::SYS_bpf,
            libc::SYS_personality,
            libc::SYS_capset,
            libc::SYS_kill,
        ] {
            assert!(!v.contains(&nr), "syscall {nr} must not be allowed");
        }
        // Only x86_64 has the path form (aarch64 has `unlinkat` alone).
        #[cfg(target_arch = "x86_64")]
        assert!(!v.contains(&libc::SYS_unlink));
    }

    #[test]
    fn test_filters_are_for_this_architecture() {
        // The lists hold this architecture's numbers (`libc::SYS_*`), and
        // the filter checks `seccomp_data.arch` against the same target:
        // a call from another ABI (x32, compat) is refused, not mistaken
        // for a listed one.
        let arch = TargetArch::try_from(std::env::consts::ARCH).unwrap();
        assert!(matches!(arch, TargetArch::x86_64 | TargetArch::aarch64));
        let v = allowed_syscalls();
        for nr in [libc::SYS_openat, libc::SYS_newfstatat, libc::SYS_renameat2] {
            assert!(v.contains(&nr), "syscall {nr} is missing");
        }
        #[cfg(target_arch = "aarch64")]
        {
            // glibc's rename()/renameat() and accept() on aarch64.
            assert!(v.contains(&libc::SYS_renameat));
            assert!(v.contains(&libc::SYS_accept));
            assert!(v.contains(&libc::SYS_epoll_pwait));
            assert!(v.contains(&libc::SYS_dup3));
        }
    }

    #[test]
    fn test_mode_parsing() {
        for s in ["kill", "log", "trap", "none"] {
            assert_eq!(s.parse::<SeccompMode>().unwrap().to_string(), s);
        }
        assert!("allow".parse::<SeccompMode>().is_err());
    }
}
