// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The syscalls the library makes while it serves, for a VMM that writes
//! its own seccomp filter.
//!
//! Two thread kinds run library code once a device is built:
//!
//! - **Worker threads** (the engine's own, `EngineConfig::workers`, or the
//!   embedder's [`Executor`](crate::engine::Executor)): filesystem calls of
//!   [`PassthroughFs`](crate::PassthroughFs), then the eventfd that wakes
//!   the engine. Allow [`WORKER_THREAD`]. The engine runs
//!   [`EngineConfig::on_worker_start`](crate::engine::EngineConfig) on each
//!   of its workers first: that is where a filter goes.
//! - **The device thread** (the embedder's: the one that calls
//!   `RequestQueue::process`, `poll`, `complete` and drops the queue):
//!   the engine, its coroutines, the ring and guest-memory I/O, and the
//!   filesystem calls that run inline: cached Treads (`preadv`,
//!   `cachestat`), the short metadata calls of a local export under
//!   [`OffloadPolicy::Auto`](crate::engine::OffloadPolicy::Auto)
//!   (`openat`/`openat2`, `newfstatat`/`fstat`/`statx`, `fstatfs`,
//!   `readlinkat`, `getxattr`/`listxattr` or their `*at` forms, `close`),
//!   and with zero workers or `OffloadPolicy::Never` every call. Allow
//!   [`WORKER_THREAD`] and [`DEVICE_THREAD`].
//! - **Socket threads** of [`transport::socket`](crate::transport::socket)
//!   (`9p-sock-N`, each an epoll loop and an engine, and the thread that
//!   accepts) are the device threads of their connections: the engine on
//!   sockets instead of a ring, and the pipes of spliced Rreads. Allow
//!   [`WORKER_THREAD`] and [`DEVICE_THREAD`] (whose last part, marked
//!   "socket transport", only they need). Workers of the socket transport
//!   splice uncached Rread ranges into those pipes (`splice` is in
//!   [`WORKER_THREAD`]).
//!
//! The lists cover serving and teardown: every 9P2000.L request, Tflush,
//! blocking Tlock waits, reset and the engine's shutdown (workers exit).
//! `tests/syscalls.rs` runs a workload of every request kind under a
//! filter of exactly these lists, with calls on workers and inline, and
//! with the passthrough built from a path and from fds; a call outside
//! the lists fails that test. The daemon's seccomp filters are built
//! from these lists plus its own extras, and the same workload runs
//! under them. It also runs a socket session (spliced and
//! copied Rreads, cached and not, a client that reads its replies late, a
//! streamed Twrite, Tflush, a hang-up) with every thread of the process
//! under [`WORKER_THREAD`] and [`DEVICE_THREAD`]. Not covered: building the
//! device or the listener (`Engine::new` creates eventfds, a timerfd and
//! the worker threads: `eventfd2`, `timerfd_create`, `epoll_create1`,
//! `clone3`/`clone`, `set_robust_list`, `rseq`, `prctl(PR_SET_NAME)`,
//! `sched_getaffinity`; it returns once every worker has started and run
//! its hook, so a filter applied after it meets only serving calls;
//! `PassthroughFs::new` and `from_fd` open the export and `/proc/self/fd`
//! and read the export's filesystem type with `fstatfs`; `Listener::bind`
//! makes its socket).
//!
//! Which xattr calls run depends on the constructor:
//! [`PassthroughFs::new`](crate::PassthroughFs::new) uses the path forms
//! (`getxattr` on `/proc/self/fd/N`),
//! [`PassthroughFs::from_fd`](crate::PassthroughFs::from_fd) the
//! `*xattrat` forms of Linux 6.13 (falling back to the path forms on
//! `ENOSYS`). Both are listed.

use crate::fs::passthrough::sys;

/// One syscall: its name and its number on the target architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Syscall {
    /// The name, as in `man 2`.
    pub name: &'static str,
    /// The number (`libc::SYS_*` of this architecture).
    pub nr: i64,
}

/// `Syscall { name, nr }`.
macro_rules! s {
    ($name:ident, $nr:expr) => {
        Syscall {
            name: stringify!($name),
            nr: $nr as i64,
        }
    };
}

/// What a worker thread makes: the passthrough's calls on the export (and
/// the guest-memory `preadv`/`pwritev` of Tread/Twrite), the eventfd write
/// that wakes the engine, and what any thread needs to live (the
/// allocator, futexes, time, its own end).
#[rustfmt::skip]
pub const WORKER_THREAD: &[Syscall] = &[
    // Memory (the allocator; coroutine stacks and their guard pages).
    s!(brk, libc::SYS_brk),
    s!(mmap, libc::SYS_mmap),
    s!(munmap, libc::SYS_munmap),
    s!(mremap, libc::SYS_mremap),
    s!(mprotect, libc::SYS_mprotect),
    s!(madvise, libc::SYS_madvise),
    // Synchronisation, randomness (std's hash seeds), time, the thread's end.
    s!(futex, libc::SYS_futex),
    s!(sched_yield, libc::SYS_sched_yield),
    s!(getrandom, libc::SYS_getrandom),
    s!(rt_sigprocmask, libc::SYS_rt_sigprocmask),
    s!(sigaltstack, libc::SYS_sigaltstack),
    s!(clock_gettime, libc::SYS_clock_gettime),
    s!(clock_nanosleep, libc::SYS_clock_nanosleep),
    s!(nanosleep, libc::SYS_nanosleep),
    s!(exit, libc::SYS_exit),
    // I/O on fds: files, guest memory, the engine's eventfd.
    s!(read, libc::SYS_read),
    s!(write, libc::SYS_write),
    s!(readv, libc::SYS_readv),
    s!(writev, libc::SYS_writev),
    s!(pread64, libc::SYS_pread64),
    s!(pwrite64, libc::SYS_pwrite64),
    s!(preadv, libc::SYS_preadv),
    s!(pwritev, libc::SYS_pwritev),
    s!(close, libc::SYS_close),
    s!(fcntl, libc::SYS_fcntl),
    s!(lseek, libc::SYS_lseek),
    s!(fsync, libc::SYS_fsync),
    // The passthrough filesystem: resolution beneath the export, metadata.
    s!(fdatasync, libc::SYS_fdatasync),
    s!(ftruncate, libc::SYS_ftruncate),
    s!(openat, libc::SYS_openat),
    s!(openat2, libc::SYS_openat2),
    s!(newfstatat, libc::SYS_newfstatat),
    s!(fstat, libc::SYS_fstat),
    s!(statx, libc::SYS_statx),
    s!(fstatfs, libc::SYS_fstatfs),
    s!(getdents64, libc::SYS_getdents64),
    s!(readlinkat, libc::SYS_readlinkat),
    s!(mkdirat, libc::SYS_mkdirat),
    s!(mknodat, libc::SYS_mknodat),
    s!(symlinkat, libc::SYS_symlinkat),
    s!(linkat, libc::SYS_linkat),
    s!(renameat2, libc::SYS_renameat2),
    s!(unlinkat, libc::SYS_unlinkat),
    s!(fchownat, libc::SYS_fchownat),
    s!(fchmodat, libc::SYS_fchmodat),
    s!(utimensat, libc::SYS_utimensat),
    // Idle walked files' fds closed and reopened (`max_path_fds`), and a
    // restored session's files: by file handle.
    s!(name_to_handle_at, libc::SYS_name_to_handle_at),
    s!(open_by_handle_at, libc::SYS_open_by_handle_at),
    // Xattrs: path forms (`PassthroughFs::new`), `*xattrat` forms (`from_fd`).
    s!(getxattr, libc::SYS_getxattr),
    s!(setxattr, libc::SYS_setxattr),
    s!(listxattr, libc::SYS_listxattr),
    s!(removexattr, libc::SYS_removexattr),
    s!(setxattrat, sys::SYS_SETXATTRAT),
    s!(getxattrat, sys::SYS_GETXATTRAT),
    s!(listxattrat, sys::SYS_LISTXATTRAT),
    s!(removexattrat, sys::SYS_REMOVEXATTRAT),
    // The page-cache hint of Tread (Linux 6.5).
    s!(cachestat, 451), // not yet in every libc; sys.rs calls it by number
    // Uncached Rread ranges of the socket transport, file -> pipe.
    s!(splice, libc::SYS_splice),
    // x86_64 has older forms that glibc and std still use there (Tattach
    // canonicalizes the export path: `readlink`). glibc's `rename` and
    // `renameat` use `renameat` where the kernel has it: x86_64 and
    // aarch64, not the newer architectures (riscv64), which only have
    // `renameat2`.
    #[cfg(target_arch = "x86_64")]
    s!(readlink, libc::SYS_readlink),
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    s!(renameat, libc::SYS_renameat),
];

/// What the device thread makes beyond [`WORKER_THREAD`]: reading the
/// engine's completion eventfd and timer, arming the timer (blocking
/// Tlock waits), and waiting for running calls at reset and teardown.
///
/// The socket transport's threads also make the calls of the last part:
/// their epoll loop, reading requests and sending replies, accepting
/// connections, cached Rreads (`preadv2(RWF_NOWAIT)`, also the probe
/// before a splice), the pipes of spliced Rreads (created with `pipe2`,
/// sized with `fcntl(F_SETPIPE_SZ)`, filled and drained with `splice`,
/// checked with `ioctl(FIONREAD)`; the file's fd kept with
/// `fcntl(F_DUPFD_CLOEXEC)`, its size checked with `statx` before the
/// header goes out), and the `SIGPIPE` that a splice into
/// a hung-up socket raises (blocked on the thread, then taken with
/// `rt_sigtimedwait`). A virtio device's thread needs none of them.
#[rustfmt::skip]
pub const DEVICE_THREAD: &[Syscall] = &[
    s!(timerfd_settime, libc::SYS_timerfd_settime),
    s!(timerfd_gettime, libc::SYS_timerfd_gettime),
    s!(ppoll, libc::SYS_ppoll),
    #[cfg(target_arch = "x86_64")]
    s!(poll, libc::SYS_poll),
    // The socket transport.
    s!(epoll_ctl, libc::SYS_epoll_ctl),
    s!(epoll_pwait, libc::SYS_epoll_pwait),
    #[cfg(target_arch = "x86_64")]
    s!(epoll_wait, libc::SYS_epoll_wait),
    s!(accept4, libc::SYS_accept4),
    s!(sendto, libc::SYS_sendto),
    s!(recvfrom, libc::SYS_recvfrom),
    s!(setsockopt, libc::SYS_setsockopt),
    s!(preadv2, libc::SYS_preadv2),
    s!(pipe2, libc::SYS_pipe2),
    s!(ioctl, libc::SYS_ioctl),
    s!(rt_sigtimedwait, libc::SYS_rt_sigtimedwait),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_lists_have_no_duplicates_and_match_libc_names() {
        let mut all: Vec<&Syscall> = WORKER_THREAD.iter().chain(DEVICE_THREAD).collect();
        all.sort_by_key(|s| s.nr);
        for w in all.windows(2) {
            assert_ne!(w[0].nr, w[1].nr, "{} listed twice", w[0].name);
        }
        assert!(WORKER_THREAD
            .iter()
            .any(|s| s.name == "openat2" && s.nr == libc::SYS_openat2));
    }
}
