// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Namespace mode: unshare, fork into the new pid namespace, mount a fresh
//! `subset=pid` `/proc`, keep only a detached `/proc/self/fd` of it,
//! `pivot_root` into the export.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};

use log::{debug, info, warn};

use super::{cpath, procfd, sys_err, Error, IdMap, Result, SandboxConfig, PROC_FD_CWD};

/// The child the supervising parent forwards signals to.
static CHILD: AtomicI32 = AtomicI32::new(0);

/// The signals the supervisor forwards to the daemon.
const FORWARDED: [libc::c_int; 5] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
];

/// [`FORWARDED`] as a signal set.
fn forwarded_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, filled by sigemptyset/sigaddset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in FORWARDED {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Lets the forwarded signals in on the calling thread, once the daemon
/// has its handlers. Until then the namespace's pid 1 keeps them blocked:
/// pid 1 drops a signal it has no handler for, so a stop sent during
/// setup would be lost; blocked, it waits for the handler.
pub(crate) fn unblock_stop_signals() {
    let set = forwarded_set();
    // SAFETY: a valid sigset_t.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
}

/// Blocks [`FORWARDED`] on the calling thread; returns the mask before.
fn block_forwarded() -> libc::sigset_t {
    let set = forwarded_set();
    // SAFETY: sigset_t is plain data; pthread_sigmask gets valid pointers.
    unsafe {
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    }
}

/// Puts back the signal mask `old` (from [`block_forwarded`]).
fn restore_mask(old: &libc::sigset_t) {
    // SAFETY: a valid sigset_t.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Acquire);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

fn write_file(path: &str, data: &str) -> Result<()> {
    std::fs::write(path, data).map_err(|source| Error::SysPath {
        step: "write",
        path: path.into(),
        source,
    })
}

fn map_text(maps: &[IdMap], own: u32) -> String {
    if maps.is_empty() {
        return format!("{own} {own} 1\n");
    }
    maps.iter()
        .map(|m| format!("{} {} {}\n", m.inside, m.outside, m.count))
        .collect()
}

pub(super) fn enter<T>(
    cfg: &SandboxConfig,
    prepare: impl FnOnce() -> virtio_9p_server::Result<T>,
) -> Result<T> {
    // SAFETY: plain getters.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let user_ns = euid != 0;
    // The supervisor only joins the new pid (and user) namespace, so that
    // the child's pivot_root leaves its view of the host intact.
    let mut flags = libc::CLONE_NEWPID;
    if user_ns {
        flags |= libc::CLONE_NEWUSER;
    } else if !cfg.uid_map.is_empty() || !cfg.gid_map.is_empty() {
        return Err(Error::IdMapsNeedUserNs);
    }
    // SAFETY: unshare(2) with namespace flags only.
    if unsafe { libc::unshare(flags) } != 0 {
        return Err(Error::NoNamespaces(std::io::Error::last_os_error()));
    }
    if user_ns {
        write_file("/proc/self/setgroups", "deny")?;
        write_file("/proc/self/uid_map", &map_text(&cfg.uid_map, euid))?;
        write_file("/proc/self/gid_map", &map_text(&cfg.gid_map, egid))?;
    }
    // A SIGTERM between the fork and the supervisor's handlers would kill
    // the supervisor (and, through PDEATHSIG, the daemon) without cleanup:
    // the signals wait, blocked, until the handlers are in place. The
    // child keeps them blocked until it has its own handlers
    // ([`unblock_stop_signals`]).
    let old_mask = block_forwarded();
    // SAFETY: the process is single-threaded (checked by the caller), so
    // the child may run arbitrary code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        restore_mask(&old_mask);
        return Err(sys_err("fork into the pid namespace"));
    }
    if pid > 0 {
        supervise(pid, cfg, &old_mask);
    }
    // SAFETY: unshare(2) with namespace flags only.
    if unsafe { libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWNET) } != 0 {
        return Err(Error::NoNamespaces(std::io::Error::last_os_error()));
    }
    child_setup(cfg, prepare)
}

/// The parent: forward signals, wait, clean up, exit like the child.
fn supervise(pid: libc::pid_t, cfg: &SandboxConfig, old_mask: &libc::sigset_t) -> ! {
    CHILD.store(pid, Ordering::Release);
    for sig in FORWARDED {
        // SAFETY: a zeroed sigaction is valid; the handler only calls kill(2).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = forward as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    // Signals that came meanwhile are forwarded now.
    restore_mask(old_mask);
    debug!("sandbox: daemon runs as pid {pid} (pid 1 of its namespace)");
    // The supervisor only waits, signals its own child and removes the
    // socket file: it keeps dac_override (for that removal) and nothing else.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if let Err(e) = super::caps::drop_to(super::caps::CapSet::of(&[1])) {
        warn!("sandbox: the supervisor keeps its capabilities: {e}");
    }
    let mut status = 0;
    let code = loop {
        // SAFETY: `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            if libc::WIFEXITED(status) {
                break libc::WEXITSTATUS(status);
            }
            if libc::WIFSIGNALED(status) {
                let sig = libc::WTERMSIG(status);
                eprintln!("virtio-9p-server: the sandboxed daemon was killed by signal {sig}");
                break 128 + sig;
            }
            continue;
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break 1;
        }
    };
    for file in cfg.cleanup_socket.iter().chain(&cfg.cleanup_files) {
        let _ = std::fs::remove_file(file);
    }
    std::process::exit(code)
}

/// The child, pid 1 of the new pid namespace.
fn child_setup<T>(
    cfg: &SandboxConfig,
    prepare: impl FnOnce() -> virtio_9p_server::Result<T>,
) -> Result<T> {
    // Die with the supervisor rather than linger unsupervised.
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
        return Err(sys_err("PR_SET_PDEATHSIG"));
    }
    // Mounts made here must not propagate back to the host, while host
    // mounts under the export still show up (slave).
    procfd::make_root_slave()?;
    // A /proc of the new pid namespace, holding pid directories only.
    procfd::mount_proc()?;
    let dir = cpath(&cfg.shared_dir)?;
    // The export becomes a mount point of its own, so it can be the root.
    procfd::mount(Some(&dir), &dir, None, libc::MS_BIND | libc::MS_REC, None).map_err(
        |source| Error::Sys {
            step: "bind-mount the shared dir",
            source,
        },
    )?;
    // Open the filesystem now: its root fd is on the bind mount that
    // becomes `/`, its /proc/self/fd fd (and ours, the future current
    // directory) on a detached mount of /proc/self/fd alone.
    let (value, proc_fd) = procfd::open_confined(prepare)?;
    // SAFETY: valid C string.
    if unsafe { libc::chdir(dir.as_ptr()) } != 0 {
        return Err(sys_err("chdir to the shared dir"));
    }
    // pivot_root(".", "."): the old root ends up stacked on the new one and
    // is then detached, so nothing of the host stays reachable by path.
    // SAFETY: pivot_root with two valid C strings.
    if unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) } != 0 {
        return Err(sys_err("pivot_root into the shared dir"));
    }
    // SAFETY: valid C string.
    if unsafe { libc::umount2(c".".as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(sys_err("detach the old root"));
    }
    // The xattr calls reach /proc/self/fd/N as the relative path N; from
    // the detached fd directory ".." leads nowhere (see `procfd`).
    // SAFETY: fchdir on an fd we own.
    if unsafe { libc::fchdir(proc_fd.as_raw_fd()) } != 0 {
        return Err(sys_err("fchdir to /proc/self/fd"));
    }
    PROC_FD_CWD.store(true, std::sync::atomic::Ordering::Release);
    info!(
        "sandbox: namespace mode, / is {} (mount, pid and net namespaces)",
        cfg.shared_dir.display()
    );
    Ok(value)
}
