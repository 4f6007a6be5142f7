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

/// `cachestat(2)` (Linux 6.5), which the Rread path uses to decide whether
/// a read can run without a thread hop; not yet in every libc.
const SYS_CACHESTAT: i64 = 451;
/// `fchmodat2(2)` (Linux 6.6).
const SYS_FCHMODAT2: i64 = 452;

/// What every thread of the daemon needs to live, whatever its kind: the
/// allocator's memory calls, futexes, its signal mask and stack, time,
/// randomness and its own end.
const THREAD_SYSCALLS: &[i64] = &[
    // Memory (the allocator; thread exit frees the signal stack).
    libc::SYS_brk,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    // Synchronisation, time, the thread's own end.
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_tgkill,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    libc::SYS_getrandom,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
];

/// The x86_64 forms of file calls that newer architectures only have as
/// `*at` calls (std and glibc still use some of them there).
#[cfg(target_arch = "x86_64")]
const LEGACY_FILE_SYSCALLS: &[i64] = &[
    libc::SYS_open,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_renameat,
    libc::SYS_readlink,
    libc::SYS_access,
    libc::SYS_getdents,
    libc::SYS_time,
];

/// The calls on files and the export that every thread kind makes: I/O
/// on fds, the passthrough filesystem, and the ids it checks.
const FILE_SYSCALLS: &[i64] = &[
    // I/O on fds.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_close,
    libc::SYS_fcntl,
    libc::SYS_lseek,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_fallocate,
    libc::SYS_ftruncate,
    libc::SYS_flock,
    // The passthrough filesystem.
    libc::SYS_openat,
    libc::SYS_openat2,
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_statx,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_getdents64,
    libc::SYS_readlinkat,
    libc::SYS_mkdirat,
    libc::SYS_mknodat,
    libc::SYS_symlinkat,
    libc::SYS_linkat,
    libc::SYS_renameat2,
    libc::SYS_unlinkat,
    libc::SYS_fchownat,
    libc::SYS_fchown,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    SYS_FCHMODAT2,
    libc::SYS_utimensat,
    // Saving and restoring a session (`--state-dir`): file handles.
    libc::SYS_name_to_handle_at,
    libc::SYS_open_by_handle_at,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_getxattr,
    libc::SYS_lgetxattr,
    libc::SYS_fgetxattr,
    libc::SYS_setxattr,
    libc::SYS_lsetxattr,
    libc::SYS_fsetxattr,
    libc::SYS_listxattr,
    libc::SYS_llistxattr,
    libc::SYS_flistxattr,
    libc::SYS_removexattr,
    libc::SYS_lremovexattr,
    libc::SYS_fremovexattr,
    SYS_CACHESTAT,
    // Zero-copy Rread: file -> pipe (socket threads, or workers for
    // uncached ranges) and pipe -> socket (socket threads).
    libc::SYS_splice,
    libc::SYS_getcwd,
    // Identity (read-only).
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
];

/// The syscalls every thread of the daemon may make without an argument
/// check, by area. Nothing here creates processes, loads code, changes
/// namespaces, mounts, traces, or opens network sockets: a compromised
/// daemon keeps its view of the export. `clone`, `ioctl`, `prctl` and
/// `seccomp` are allowed only with the arguments of [`argument_rules`].
pub fn allowed_syscalls() -> Vec<i64> {
    use libc::*;
    let mut v: Vec<i64> = vec![
        // Memory beyond the allocator's (THREAD_SYSCALLS): coroutine stack
        // guards use mprotect/madvise from there, the mlock policy these.
        SYS_mlock,
        SYS_mlock2,
        SYS_munlock,
        SYS_mlockall,
        SYS_munlockall,
        SYS_membarrier,
        // Threads and synchronisation (std, the worker pool, vhost-user-backend).
        // clone3 is answered with ENOSYS by the filter before this one
        // (glibc then uses clone, which `argument_rules` checks); it is
        // listed so that this filter does not kill it first.
        SYS_clone3,
        SYS_set_robust_list,
        SYS_get_robust_list,
        SYS_rseq,
        SYS_set_tid_address,
        SYS_getrlimit,
        SYS_prlimit64,
        // Signal handlers; a socket thread takes the SIGPIPE that a splice
        // into a hung-up socket raises.
        SYS_rt_sigaction,
        SYS_rt_sigtimedwait,
        // Time and timers.
        SYS_clock_getres,
        SYS_gettimeofday,
        SYS_timerfd_create,
        SYS_timerfd_settime,
        SYS_timerfd_gettime,
        // Event loops: epoll, eventfds, poll.
        SYS_epoll_create1,
        SYS_epoll_ctl,
        SYS_epoll_pwait,
        SYS_epoll_pwait2,
        SYS_eventfd2,
        SYS_ppoll,
        SYS_pselect6,
        // The sockets (vhost-user frontend with its fds, 9P clients).
        SYS_accept4,
        SYS_recvfrom,
        SYS_recvmsg,
        SYS_sendmsg,
        SYS_sendto,
        SYS_shutdown,
        SYS_getsockopt,
        SYS_setsockopt,
        SYS_getsockname,
        SYS_getpeername,
        // fds (read, write and the like are in FILE_SYSCALLS).
        SYS_close_range,
        SYS_dup,
        SYS_dup3,
        SYS_memfd_create,
        // Identity (read-only; the ids are in FILE_SYSCALLS).
        SYS_uname,
        // mlock-policy asks whether CAP_IPC_LOCK is held.
        SYS_capget,
        // vmm-sys-util's event notifier fallback; the socket threads'
        // pipes of spliced Rreads (sized with fcntl(F_SETPIPE_SZ)).
        SYS_pipe2,
    ];
    v.extend_from_slice(THREAD_SYSCALLS);
    v.extend_from_slice(FILE_SYSCALLS);
    #[cfg(target_arch = "x86_64")]
    {
        v.extend_from_slice(LEGACY_FILE_SYSCALLS);
        v.extend_from_slice(&[
            SYS_arch_prctl,
            SYS_poll,
            SYS_epoll_wait,
            SYS_dup2,
            SYS_accept,
        ]);
    }
    v.sort_unstable();
    v.dedup();
    v
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

/// The syscalls of a [`ThreadKind::Worker`] thread: the passthrough
/// filesystem, memory, futexes and its own exit. A subset of
/// [`allowed_syscalls`]; everything that reaches beyond the export's files
/// (sockets, new threads, event loops, timers, memory locking, `prctl`,
/// `ioctl`, `seccomp`) is left out.
pub fn worker_syscalls() -> Vec<i64> {
    // I/O on the fds the thread is handed (files, the wake eventfd,
    // logging) and the passthrough filesystem.
    let mut v = [THREAD_SYSCALLS, FILE_SYSCALLS].concat();
    #[cfg(target_arch = "x86_64")]
    v.extend_from_slice(LEGACY_FILE_SYSCALLS);
    v.sort_unstable();
    v.dedup();
    v
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
            libc::SYS_unlink,
            libc::SYS_kill,
        ] {
            assert!(!v.contains(&nr), "syscall {nr} must not be allowed");
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
