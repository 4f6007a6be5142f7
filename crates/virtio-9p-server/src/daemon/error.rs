// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The binary's one error type.
//!
//! Why a `daemon::Error` and not `daemon`-gated variants of the library's
//! [`virtio_9p_server::Error`]: the `virtio-9p-server` binary is a crate of
//! its own (it links the library like any embedder), and everything here
//! is binary-only: the command line, the pid file, the sandbox, seccompiler
//! and mlock errors. Kept out of the library, they leave its public
//! `Error` the same with and without the `daemon` feature, so turning the
//! feature on (as `cargo test --all-features` does) does not change the
//! API an embedder matches on. Library errors pass through unchanged in
//! [`Error::Library`]. Every variant carries typed sources and the user's
//! input as data; `main` prints the `Display` as one line and exits 1.

use std::io;
use std::path::PathBuf;

use virtio_9p_server::transport::socket::SocketError;
use virtio_9p_server::{PassthroughError, SecurityModel};

/// Errors of the daemon's startup: command line, pid file, sandbox,
/// capabilities, seccomp, logging. Each message names what failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An error of the library (shared directory, listener, server, vhost-user).
    #[error(transparent)]
    Library(#[from] virtio_9p_server::Error),
    /// `--state-dir` or its state file cannot be opened, read or written.
    #[error("state {path}: {source}")]
    StateDir {
        /// The directory or file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `--state-dir` is not a directory only this daemon can reach: inside
    /// or below the shared directory, a symlink, owned by another user,
    /// writable by group or others, not on a tmpfs, or in use by another
    /// daemon.
    #[error("state directory {path} refused: {reason}")]
    StateDirUnsafe {
        /// The directory, as given.
        path: PathBuf,
        /// Why, in words.
        reason: String,
    },
    /// The saved state cannot be taken over.
    #[error("cannot take over {path}: {source} (move it away, or pass --discard-bad-state to start without it)")]
    StateRefused {
        /// The state file.
        path: PathBuf,
        /// Why.
        #[source]
        source: virtio_9p_server::Error,
    },
    /// An option of the other mode (socket or vhost-user) was given.
    #[error("{flag} does not apply to {mode}")]
    WrongMode {
        /// The option given.
        flag: String,
        /// The mode chosen.
        mode: &'static str,
    },
    /// `--rlimit-nofile` is neither 0 nor at least 64.
    #[error("expected 0 (leave the limit alone) or a number of at least 64")]
    RlimitNofile(String),
    /// `--thread-pool-size` is not a number up to the engine's maximum.
    #[error(
        "expected 0 (requests run on the vring thread) or a number up to {max}",
        max = virtio_9p_server::engine::MAX_WORKERS
    )]
    ThreadPoolSize(String),
    /// `--queue-size` is not a power of two.
    #[error(
        "--queue-size {0} must be a power of two from 1 to {max}",
        max = virtio_9p_server::virtio::MAX_QUEUE_SIZE
    )]
    QueueSize(u16),
    /// `--translate-uid` or `--translate-gid` rules that overlap.
    #[error("{flag}: {source}")]
    Translation {
        /// `--translate-uid` or `--translate-gid`.
        flag: &'static str,
        /// What is wrong with them.
        #[source]
        source: virtio_9p_server::Error,
    },
    /// The file descriptor limit leaves too few fids per session.
    #[error(
        "RLIMIT_NOFILE {nofile} leaves only {max_fids} open fids per session for {sessions} session(s); raise --rlimit-nofile"
    )]
    FidBudget {
        /// The limit in effect.
        nofile: u64,
        /// The fids it leaves each session.
        max_fids: usize,
        /// The sessions budgeted for.
        sessions: usize,
    },
    /// `--socket-group` names no group.
    #[error("--socket-group {group}: {source}")]
    SocketGroup {
        /// The group given.
        group: String,
        /// Why it cannot be used.
        #[source]
        source: io::Error,
    },
    /// `--socket-group` with a TCP `--listen`.
    #[error("--socket-group applies to unix sockets only")]
    SocketGroupNotUnix,
    /// A writable export with host ownership over TCP, without the opt-in.
    #[error(
        "refusing a writable --security-model {0} export over TCP, which has no \
         authentication (anyone who can connect acts as the guest on the host files); \
         use --security-model mapped-xattr, --readonly or a unix socket (--listen unix:PATH), \
         or pass --allow-unauthenticated-tcp-passthrough to accept the risk"
    )]
    TcpPassthrough(SecurityModel),
    /// The pid file could not be opened, checked, locked or written.
    #[error("cannot {action} the pid file {}: {source}", path.display())]
    PidFile {
        /// `open`, `stat`, `lock` or `write`.
        action: &'static str,
        /// The pid file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The pid file path is a directory, fifo or device.
    #[error("the pid file {} is not a regular file", .0.display())]
    PidFileNotRegular(PathBuf),
    /// Another daemon holds the pid file's lock.
    #[error(
        "another instance is already serving {}{}: its pid file {} is locked",
        socket.display(),
        holder.map(|p| format!(" (pid {p})")).unwrap_or_default(),
        pid_file.display()
    )]
    AlreadyRunning {
        /// The socket it serves.
        socket: PathBuf,
        /// Its pid file.
        pid_file: PathBuf,
        /// Its pid, if the file holds one.
        holder: Option<u32>,
    },
    /// `--mlock` could not be applied.
    #[error("--mlock {policy}: {source}")]
    Mlock {
        /// The policy asked for.
        policy: mlock_policy::MlockPolicy,
        /// Why it failed.
        #[source]
        source: mlock_policy::Error,
    },
    /// The signal handlers of the vhost-user daemon could not be installed.
    #[error("cannot install signal handlers: {0}")]
    Signals(#[source] io::Error),
    /// The lock keeper's thread could not be started.
    #[error("cannot start the lock keeper: {0}")]
    LockKeeper(#[source] io::Error),
    /// `--syslog` and `/dev/log` cannot be reached.
    #[error("--syslog: cannot connect to {path}: {source}")]
    SyslogConnect {
        /// The socket (`/dev/log`).
        path: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `--syslog` and another logger is installed already.
    #[error("--syslog: {0}")]
    SyslogInstall(#[source] log::SetLoggerError),
    /// `--sandbox` names no mode.
    #[error("unknown sandbox mode {0:?} (namespace, chroot or none)")]
    SandboxMode(String),
    /// `--seccomp` names no mode.
    #[error("unknown seccomp mode {0:?} (kill, log, trap or none)")]
    SeccompMode(String),
    /// A system call of the sandbox setup failed.
    #[error("sandbox: {step}: {source}")]
    Sys {
        /// What was being done.
        step: &'static str,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// A capability could not be dropped from the bounding set.
    #[error("sandbox: drop {cap} from the bounding set: {source}")]
    BoundingSet {
        /// Its name.
        cap: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `RLIMIT_NOFILE` could not be set.
    #[error(
        "sandbox: setrlimit(RLIMIT_NOFILE, {want}) (the hard limit is {hard}; raising it needs CAP_SYS_RESOURCE): {source}"
    )]
    SetNofile {
        /// The limit asked for.
        want: u64,
        /// The hard limit in effect.
        hard: u64,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A system call of the sandbox setup on a path failed.
    #[error("sandbox: {step} {}: {source}", path.display())]
    SysPath {
        /// What was being done.
        step: &'static str,
        /// On what.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// Namespaces cannot be created here.
    #[error(
        "sandbox: cannot create namespaces: {0}\n\
         hint: run as root, allow unprivileged user namespaces \
         (sysctl kernel.unprivileged_userns_clone=1), or choose --sandbox chroot or --sandbox none"
    )]
    NoNamespaces(#[source] io::Error),
    /// The process already runs several threads (namespaces need one).
    #[error("sandbox: the process already runs {0} threads; the sandbox must be entered before any thread starts")]
    Threads(usize),
    /// `--uid-map`/`--gid-map` without a user namespace (running as root).
    #[error("sandbox: --uid-map/--gid-map only apply to an unprivileged (user namespace) sandbox")]
    IdMapsNeedUserNs,
    /// The shared directory is not a directory.
    #[error("sandbox: shared dir {} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// A path with a NUL byte.
    #[error("sandbox: {} contains a NUL byte", .0.display())]
    NulInPath(PathBuf),
    /// A `--modcaps` item without `+` or `-`.
    #[error("sandbox: --modcaps {0:?}: expected +name or -name")]
    ModcapsSyntax(String),
    /// A `--modcaps` capability name that does not exist.
    #[error("sandbox: --modcaps: unknown capability {0:?}")]
    UnknownCapability(String),
    /// A procfs entry above the confined `/proc/self/fd` can be reached.
    #[error(
        "sandbox: /proc/self/fd is not confined: {} is reachable from it; refusing to run",
        reached.as_deref().unwrap_or("its parent")
    )]
    ProcFdNotConfined {
        /// The path that resolved, or `None` when `..` climbs out.
        reached: Option<String>,
    },
    /// Building a seccomp filter failed (also: an unknown architecture).
    #[error("seccomp: {0}")]
    SeccompBuild(#[from] seccompiler::BackendError),
    /// Installing a seccomp filter failed.
    #[error("seccomp: {0}")]
    Seccomp(#[from] seccompiler::Error),
    /// The filters were installed once already.
    #[error("seccomp: the filters are already installed")]
    SeccompInstalled,
}

// The library layers the binary calls directly, wrapped as the library
// wraps them.
impl From<PassthroughError> for Error {
    fn from(e: PassthroughError) -> Self {
        Error::Library(e.into())
    }
}

impl From<SocketError> for Error {
    fn from(e: SocketError) -> Self {
        Error::Library(e.into())
    }
}

/// `Result` with the daemon's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
