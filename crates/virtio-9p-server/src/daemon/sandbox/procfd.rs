// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon's only window into procfs: its own `/proc/self/fd`, on a
//! detached mount that has nothing above it.
//!
//! The passthrough server needs `/proc/self/fd/N` to reopen its `O_PATH`
//! fds and for the path-only xattr calls. An fd on an ordinary procfs is
//! also a way to all of `/proc`: `openat(fd, "../../sys/kernel/core_pattern")`
//! climbs from `/proc/self/fd` to the procfs root, and from a host procfs
//! `..` goes on to the host's `/`. So, in a private mount namespace:
//!
//! 1. a procfs is mounted on `/proc` with `subset=pid` (Linux 5.8 and
//!    later): no `sys`, `sysrq-trigger`, `kcore` or any other kernel knob,
//!    only pid directories (defence in depth; see [`mount_proc`]);
//! 2. `/proc/self/fd` is bind-mounted onto itself, the filesystem is opened
//!    (its `/proc/self/fd` fd lands on that bind mount) together with the
//!    fd that becomes the current directory;
//! 3. the bind mount is detached (`MNT_DETACH`). The fds keep it alive,
//!    but it is no longer connected to any parent, so `..` from its root
//!    stays where it is: the only names reachable are the daemon's own fd
//!    numbers, whose magic links lead to files the daemon already holds.
//!
//! [`check`] verifies 3 at startup, so a kernel that behaved otherwise
//! would stop the daemon instead of leaving the hole open.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use log::{debug, warn};

use super::{sys_err, Error, Result};

/// Where the passthrough code and the sandbox open the fd directory.
const PROC_SELF_FD: &CStr = c"/proc/self/fd";

/// mount(2); `None` passes NULL.
pub(super) fn mount(
    src: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> std::io::Result<()> {
    let p = |s: Option<&CStr>| s.map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: valid C strings or NULL where mount(2) accepts NULL.
    let r = unsafe {
        libc::mount(
            p(src),
            target.as_ptr(),
            p(fstype),
            flags,
            p(data).cast::<libc::c_void>(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Makes `/` a slave mount (recursively), so that mounts made here never
/// propagate back to the host while host mounts still show up.
pub(super) fn make_root_slave() -> Result<()> {
    mount(None, c"/", None, libc::MS_REC | libc::MS_SLAVE, None).map_err(|source| Error::Sys {
        step: "make / a slave mount",
        source,
    })
}

/// Mounts a procfs of the current pid namespace on `/proc` (in a private
/// mount namespace), with `subset=pid` where the kernel has it.
///
/// Kernels before 5.8 reject `subset=pid` with `EINVAL`; there the full
/// procfs is mounted instead and a warning is logged. That costs only the
/// defence in depth: the daemon's fds still reach nothing but the detached
/// `/proc/self/fd` ([`open_confined`]), and [`check`] refuses to start if
/// they do.
pub(super) fn mount_proc() -> Result<()> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RELATIME;
    match mount(
        Some(c"proc"),
        c"/proc",
        Some(c"proc"),
        flags,
        Some(c"subset=pid"),
    ) {
        Ok(()) => {
            debug!("sandbox: /proc mounted with subset=pid");
            Ok(())
        }
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            warn!(
                "sandbox: this kernel has no procfs subset=pid (Linux 5.8); mounting a full /proc \
                 (the daemon still reaches only its detached /proc/self/fd)"
            );
            mount(Some(c"proc"), c"/proc", Some(c"proc"), flags, None).map_err(|source| {
                Error::Sys {
                    step: "mount a fresh /proc",
                    source,
                }
            })
        }
        Err(source) => Err(Error::Sys {
            step: "mount a fresh /proc with subset=pid",
            source,
        }),
    }
}

/// Runs `prepare` while `/proc/self/fd` is a bind mount of itself, opens
/// that directory once more for the caller (the future current
/// directory), then detaches the bind mount. Every `/proc/self/fd` fd
/// opened meanwhile is confined to the detached mount. The mount namespace
/// must be private to the process.
pub(super) fn open_confined<T>(
    prepare: impl FnOnce() -> virtio_9p_server::Result<T>,
) -> Result<(T, OwnedFd)> {
    mount(Some(PROC_SELF_FD), PROC_SELF_FD, None, libc::MS_BIND, None).map_err(|source| {
        Error::Sys {
            step: "bind-mount /proc/self/fd onto itself",
            source,
        }
    })?;
    let opened = prepare().map_err(Error::from).and_then(|value| {
        // SAFETY: valid C string; the result is checked.
        let fd = unsafe {
            libc::open(
                PROC_SELF_FD.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(sys_err("open /proc/self/fd"));
        }
        // SAFETY: a fresh fd we own.
        Ok((value, unsafe { OwnedFd::from_raw_fd(fd) }))
    });
    // Detach even when prepare failed, so nothing is left mounted.
    // SAFETY: valid C string.
    if unsafe { libc::umount2(PROC_SELF_FD.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(sys_err("detach the /proc/self/fd bind mount"));
    }
    let (value, fd) = opened?;
    check(&fd)?;
    Ok((value, fd))
}

fn stat_at(dir: &OwnedFd, path: &CStr) -> std::io::Result<(u64, u64)> {
    // SAFETY: a zeroed stat is a valid out buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid dirfd, C string and out pointer.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            path.as_ptr(),
            &mut st,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

/// Verifies that `..` from the confined fd directory is the directory
/// itself and that no procfs entry above it can be named.
pub(super) fn check(fd: &OwnedFd) -> Result<()> {
    fn io(step: &'static str) -> impl FnOnce(std::io::Error) -> Error {
        move |source| Error::Sys { step, source }
    }
    let own = stat_at(fd, c"").map_err(io("stat the confined /proc/self/fd"))?;
    let up = stat_at(fd, c"../..").map_err(io("stat ../.. of /proc/self/fd"))?;
    // Names of the procfs root: none may resolve ("1" would be fd 1 here).
    let escapes = [
        c"../../sys",
        c"../../self",
        c"../../thread-self",
        c"../../sysrq-trigger",
    ];
    let reached = escapes
        .iter()
        .find(|p| stat_at(fd, p).is_ok())
        .map(|p| p.to_string_lossy());
    if own != up || reached.is_some() {
        return Err(Error::ProcFdNotConfined {
            reached: reached.map(|r| r.into_owned()),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_check_refuses_an_ordinary_proc_fd() {
        // The fd the daemon used to keep: "../../sys" climbs out of it.
        // SAFETY: valid C string; the result is checked.
        let fd = unsafe {
            libc::open(
                PROC_SELF_FD.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        assert!(fd >= 0);
        // SAFETY: a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let e = check(&fd).unwrap_err();
        assert_eq!(
            e.to_string(),
            "sandbox: /proc/self/fd is not confined: ../../sys is reachable from it; refusing to run"
        );
    }
}
