//! The seccomp allow-list (`--seccomp kill|log|trap|none`), built with
//! rust-vmm's `seccompiler`.
//!
//! One filter covers every thread of the daemon: the vring thread, the
//! coroutine engine (whose stacks need `mmap`/`mprotect`/`madvise`), the
//! worker pool (`futex`, `clone3`), the socket connection threads and
//! logging. It is installed with `SECCOMP_FILTER_FLAG_TSYNC` once the
//! setup is done, before the worker threads start, and every thread
//! created later inherits it. A syscall outside the list:
//! - `kill`: kills the whole process (`SECCOMP_RET_KILL_PROCESS`);
//! - `log`: is allowed and logged by the kernel (audit, `dmesg`);
//! - `trap`: raises SIGSYS; the handler installed here prints the syscall
//!   number on stderr and exits with status 159 (128 + SIGSYS);
//! - `none`: no filter.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, SeccompRule, TargetArch};

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
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "kill" => Ok(SeccompMode::Kill),
            "log" => Ok(SeccompMode::Log),
            "trap" => Ok(SeccompMode::Trap),
            "none" => Ok(SeccompMode::None),
            _ => Err(format!(
                "unknown seccomp mode {s:?} (kill, log, trap or none)"
            )),
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

/// The syscalls the daemon needs, by area. Nothing here creates
/// processes, loads code, changes namespaces, mounts, traces, or opens
/// network sockets: a compromised daemon keeps its view of the export.
pub fn allowed_syscalls() -> Vec<i64> {
    use libc::*;
    #[allow(unused_mut)]
    let mut v: Vec<i64> = vec![
        // Memory: allocator, coroutine stacks (guard pages), mlock policy.
        SYS_brk,
        SYS_mmap,
        SYS_munmap,
        SYS_mremap,
        SYS_mprotect,
        SYS_madvise,
        SYS_mlock,
        SYS_mlock2,
        SYS_munlock,
        SYS_mlockall,
        SYS_munlockall,
        SYS_membarrier,
        // Threads and synchronisation (std, the worker pool, vhost-user-backend).
        SYS_clone,
        SYS_clone3,
        SYS_futex,
        SYS_set_robust_list,
        SYS_get_robust_list,
        SYS_rseq,
        SYS_set_tid_address,
        SYS_gettid,
        SYS_getpid,
        SYS_tgkill,
        SYS_exit,
        SYS_exit_group,
        SYS_sched_yield,
        SYS_sched_getaffinity,
        SYS_prctl,
        SYS_getrlimit,
        SYS_prlimit64,
        SYS_getrandom,
        SYS_restart_syscall,
        // Signals.
        SYS_rt_sigaction,
        SYS_rt_sigprocmask,
        SYS_rt_sigreturn,
        SYS_sigaltstack,
        // Time.
        SYS_clock_gettime,
        SYS_clock_getres,
        SYS_clock_nanosleep,
        SYS_nanosleep,
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
        // fds and file I/O.
        SYS_read,
        SYS_write,
        SYS_readv,
        SYS_writev,
        SYS_pread64,
        SYS_pwrite64,
        SYS_preadv,
        SYS_pwritev,
        SYS_preadv2,
        SYS_pwritev2,
        SYS_close,
        SYS_close_range,
        SYS_dup,
        SYS_dup3,
        SYS_fcntl,
        SYS_ioctl,
        SYS_lseek,
        SYS_fsync,
        SYS_fdatasync,
        SYS_fallocate,
        SYS_ftruncate,
        SYS_flock,
        SYS_memfd_create,
        // The passthrough filesystem.
        SYS_openat,
        SYS_openat2,
        SYS_newfstatat,
        SYS_fstat,
        SYS_statx,
        SYS_statfs,
        SYS_fstatfs,
        SYS_getdents64,
        SYS_readlinkat,
        SYS_mkdirat,
        SYS_mknodat,
        SYS_symlinkat,
        SYS_linkat,
        SYS_renameat2,
        SYS_unlinkat,
        SYS_fchownat,
        SYS_fchown,
        SYS_fchmod,
        SYS_fchmodat,
        SYS_FCHMODAT2,
        SYS_utimensat,
        SYS_faccessat,
        SYS_faccessat2,
        SYS_getxattr,
        SYS_lgetxattr,
        SYS_fgetxattr,
        SYS_setxattr,
        SYS_lsetxattr,
        SYS_fsetxattr,
        SYS_listxattr,
        SYS_llistxattr,
        SYS_flistxattr,
        SYS_removexattr,
        SYS_lremovexattr,
        SYS_fremovexattr,
        SYS_CACHESTAT,
        SYS_getcwd,
        // Identity (read-only).
        SYS_getuid,
        SYS_geteuid,
        SYS_getgid,
        SYS_getegid,
        SYS_uname,
        // mlock-policy asks whether CAP_IPC_LOCK is held.
        SYS_capget,
        // vmm-sys-util's event notifier fallback.
        SYS_pipe2,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend_from_slice(&[
        SYS_arch_prctl,
        SYS_open,
        SYS_stat,
        SYS_lstat,
        SYS_poll,
        SYS_epoll_wait,
        SYS_dup2,
        SYS_renameat,
        SYS_accept,
        SYS_readlink,
        SYS_access,
        SYS_getdents,
        SYS_time,
    ]);
    v.sort_unstable();
    v.dedup();
    v
}

/// Compiles the allow-list for `mode` on this architecture (`None` for
/// [`SeccompMode::None`]).
pub fn build(mode: SeccompMode) -> Result<Option<BpfProgram>> {
    let mismatch = match mode {
        SeccompMode::None => return Ok(None),
        SeccompMode::Kill => SeccompAction::KillProcess,
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::Trap => SeccompAction::Trap,
    };
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| Error::Seccomp(format!("unsupported architecture: {e}")))?;
    let rules: BTreeMap<i64, Vec<SeccompRule>> = allowed_syscalls()
        .into_iter()
        .map(|nr| (nr, Vec::new()))
        .collect();
    let filter = SeccompFilter::new(rules, mismatch, SeccompAction::Allow, arch)
        .map_err(|e| Error::Seccomp(e.to_string()))?;
    let prog: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| Error::Seccomp(e.to_string()))?;
    Ok(Some(prog))
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

/// Installs the filter of `mode` on every thread of the process (with
/// the SIGSYS reporter for [`SeccompMode::Trap`]); sets `no_new_privs`.
pub fn apply(mode: SeccompMode) -> Result<()> {
    let Some(prog) = build(mode)? else {
        return Ok(());
    };
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
    seccompiler::apply_filter_all_threads(&prog).map_err(|e| Error::Seccomp(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_filters_compile_for_every_mode() {
        for m in [SeccompMode::Kill, SeccompMode::Log, SeccompMode::Trap] {
            assert!(!build(m).unwrap().unwrap().is_empty());
        }
        assert!(build(SeccompMode::None).unwrap().is_none());
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
