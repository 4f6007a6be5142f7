// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Confinement of the daemon (feature `daemon`; the binary's, not part of
//! the embeddable core), in the manner of virtiofsd: namespaces and
//! `pivot_root` (or `chroot`), a seccomp allow-list, capability dropping
//! and resource limits.
//!
//! The binary applies the layers in this order (see `SECURITY.md`):
//!
//! 1. bind the listening socket (it lives outside the export) and raise
//!    `RLIMIT_NOFILE` ([`limits`]);
//! 2. [`enter`]: in [`SandboxMode::Namespace`] unshare the mount, pid and
//!    net namespaces (and the user namespace when unprivileged), fork so
//!    that the daemon is pid 1 of the new pid namespace while the parent
//!    forwards signals and the exit status, mount a fresh `/proc` with
//!    `subset=pid`, open the export and a `/proc/self/fd` detached from
//!    the rest of procfs, and `pivot_root` into the export; in
//!    [`SandboxMode::Chroot`] unshare the mount namespace only, confine
//!    `/proc/self/fd` the same way, open the export and `chroot` into it;
//! 3. drop capabilities ([`caps`]);
//! 4. install the seccomp filters on every thread ([`seccomp`]), before any
//!    worker thread starts; each worker thread then adds a narrower filter
//!    of its own ([`seccomp::enter_thread`]).
//!
//! ```no_run
//! use virtio_9p_server::sandbox::{self, SandboxConfig, SandboxMode};
//!
//! let cfg = SandboxConfig::new(SandboxMode::Namespace, "/srv/share");
//! // Runs in the sandboxed child; the parent waits and exits with its status.
//! let fs = sandbox::enter(&cfg, || {
//!     virtio_9p_server::PassthroughFs::new(virtio_9p_server::PassthroughConfig::new("/srv/share"))
//! })
//! .unwrap();
//! // `/` is now the export.
//! # drop(fs);
//! ```

pub mod caps;
pub mod limits;
mod namespace;

pub(crate) use namespace::unblock_stop_signals;
mod procfd;
pub mod seccomp;

use std::ffi::CString;
use std::fmt;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

pub use virtio_9p_server::fs::ids::IdMap;

// The daemon's one error type (`../error.rs`); its sandbox variants are
// `Sys`, `SysPath`, `NoNamespaces`, `Threads` and those that follow.
pub(crate) use super::error::{Error, Result};

pub(crate) fn sys_err(step: &'static str) -> Error {
    Error::Sys {
        step,
        source: std::io::Error::last_os_error(),
    }
}

/// How the daemon confines its view of the filesystem (`--sandbox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxMode {
    /// New mount, pid and net namespaces (and user namespace when
    /// unprivileged), a fresh `/proc`, `pivot_root` into the export.
    #[default]
    Namespace,
    /// `chroot` into the export, in a private mount namespace that only
    /// serves to confine `/proc/self/fd` (needs `CAP_SYS_CHROOT` and
    /// `CAP_SYS_ADMIN`). Weaker: the process still sees the host's pids
    /// and network.
    Chroot,
    /// No confinement of paths (the passthrough code's own checks only).
    None,
}

impl FromStr for SandboxMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "namespace" => Ok(SandboxMode::Namespace),
            "chroot" => Ok(SandboxMode::Chroot),
            "none" => Ok(SandboxMode::None),
            _ => Err(Error::SandboxMode(s.to_owned())),
        }
    }
}

impl fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SandboxMode::Namespace => "namespace",
            SandboxMode::Chroot => "chroot",
            SandboxMode::None => "none",
        })
    }
}

/// What [`enter`] does.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// The mode.
    pub mode: SandboxMode,
    /// The export: the new root in the namespace and chroot modes.
    pub shared_dir: PathBuf,
    /// uid mappings of the user namespace (unprivileged namespace mode);
    /// empty maps the current uid to itself.
    pub uid_map: Vec<IdMap>,
    /// gid mappings, as `uid_map`.
    pub gid_map: Vec<IdMap>,
    /// A socket file outside the export that the supervising parent (in
    /// namespace mode) removes when the daemon exits.
    pub cleanup_socket: Option<PathBuf>,
    /// Further files outside the export (the locked pid file) that the
    /// supervising parent removes when the daemon exits.
    pub cleanup_files: Vec<PathBuf>,
}

impl SandboxConfig {
    /// A configuration with no id maps and no socket to remove.
    pub fn new(mode: SandboxMode, shared_dir: impl Into<PathBuf>) -> Self {
        SandboxConfig {
            mode,
            shared_dir: shared_dir.into(),
            uid_map: Vec::new(),
            gid_map: Vec::new(),
            cleanup_socket: None,
            cleanup_files: Vec::new(),
        }
    }
}

/// Set once the current directory is the sandbox's `/proc/self/fd`.
static PROC_FD_CWD: AtomicBool = AtomicBool::new(false);

/// Whether `/proc/self/fd/N` must be reached as the relative path `N`:
/// true after [`enter`] in the namespace and chroot modes, where `/proc` is
/// no longer under `/` and the current directory is a detached
/// `/proc/self/fd` instead.
pub fn proc_fd_is_cwd() -> bool {
    PROC_FD_CWD.load(Ordering::Acquire)
}

/// Number of threads of the calling process.
pub(crate) fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(1)
}

/// Chroot mode: a private mount namespace (no pid or net namespace) only
/// to confine the `/proc/self/fd` fds, then `chroot` into the export with
/// the current directory on that detached fd directory.
fn chroot<T>(
    cfg: &SandboxConfig,
    prepare: impl FnOnce() -> virtio_9p_server::Result<T>,
) -> Result<T> {
    // Without its own mount namespace the daemon would hold an fd on the
    // host's /proc, from which `../../..` is the host's `/`.
    // SAFETY: unshare(2) with a namespace flag only.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(sys_err(
            "chroot mode: unshare the mount namespace (needs CAP_SYS_ADMIN) \
             to confine /proc/self/fd",
        ));
    }
    procfd::make_root_slave()?;
    procfd::mount_proc()?;
    let (value, proc_fd) = procfd::open_confined(prepare)?;
    let dir = cpath(&cfg.shared_dir)?;
    // SAFETY: valid C string.
    if unsafe { libc::chroot(dir.as_ptr()) } != 0 {
        return Err(Error::SysPath {
            step: "chroot",
            path: cfg.shared_dir.clone(),
            source: std::io::Error::last_os_error(),
        });
    }
    // The current directory is the detached fd directory: outside the new
    // root, but ".." from it leads nowhere (the classic escape through a
    // current directory outside the chroot needs a parent to climb to).
    // SAFETY: fchdir on an fd we own.
    if unsafe { libc::fchdir(proc_fd.as_raw_fd()) } != 0 {
        return Err(sys_err("fchdir to /proc/self/fd"));
    }
    PROC_FD_CWD.store(true, Ordering::Release);
    log::info!(
        "sandbox: chroot mode, / is {} (private mount namespace, host pids and network visible)",
        cfg.shared_dir.display()
    );
    Ok(value)
}

pub(crate) fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Error::NulInPath(p.to_path_buf()))
}

/// Enters the sandbox and runs `prepare` at the point where the export and
/// a `/proc` matching the process are both reachable by their host paths
/// (open the filesystem there), then confines the process.
///
/// In [`SandboxMode::Namespace`] this forks: the parent never returns (it
/// forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT and SIGUSR1 (handover) to the child, removes
/// [`SandboxConfig::cleanup_socket`] and exits with the child's status, or
/// 128 + signal); the child, pid 1 of the new pid namespace, returns. Call
/// it while the process is single-threaded, after binding the sockets.
pub fn enter<T>(
    cfg: &SandboxConfig,
    prepare: impl FnOnce() -> virtio_9p_server::Result<T>,
) -> Result<T> {
    let meta = std::fs::metadata(&cfg.shared_dir).map_err(|source| Error::SysPath {
        step: "shared dir",
        path: cfg.shared_dir.clone(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(Error::NotADirectory(cfg.shared_dir.clone()));
    }
    match cfg.mode {
        SandboxMode::None => Ok(prepare()?),
        SandboxMode::Chroot => {
            let n = thread_count();
            if n > 1 {
                return Err(Error::Threads(n));
            }
            chroot(cfg, prepare)
        }
        SandboxMode::Namespace => {
            let n = thread_count();
            if n > 1 {
                return Err(Error::Threads(n));
            }
            namespace::enter(cfg, prepare)
        }
    }
}
