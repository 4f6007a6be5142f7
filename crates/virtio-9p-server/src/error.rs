// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The crate's error type: one enum for the server, the filesystem, the
//! engine, the virtio device and the vhost-user backend, which wraps the
//! errors of the layers that keep their own: the id options'
//! ([`IdError`], [`Error::Id`]), saved state's
//! ([`StateProblem`], [`Error::State`]), the coroutine stack pool's, the
//! descriptor chain walker's and vhost's. The 9P codec's
//! [`DecodeError`](crate::protocol::DecodeError) stays apart: it never
//! reaches an embedder as a failure, it becomes an Rlerror reply.
//!
//! This module imports nothing from the modules that return its `Error`
//! (the server, the engine, the transports, the passthrough), so there is
//! no import circle: a limit a message names is spelled out here and
//! pinned by a test beside its constant.

use std::io;
use std::path::PathBuf;

use crate::fs::ids::IdError;

/// Errors of the server, the passthrough filesystem, the transports, the
/// engine, the virtio device and the vhost-user backend. Request-level
/// failures never appear here: they become Rlerror replies.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The transport handed over fewer bytes than a 9P header.
    #[error("request of {0} bytes is shorter than the 7-byte 9P header")]
    ShortRequest(usize),
    /// The reply buffer cannot even hold an Rlerror.
    #[error("reply buffer of {0} bytes cannot hold an 11-byte error reply")]
    ReplyTooSmall(usize),
    /// Reading the request or writing the reply failed.
    #[error("transport i/o failed: {0}")]
    Transport(#[source] io::Error),
    /// The shared directory cannot be opened or is not a directory.
    #[error("cannot open shared directory {path}: {source}")]
    SharedDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `/proc/self/fd` is needed to reopen `O_PATH` fds.
    #[error("cannot open /proc/self/fd (is /proc mounted?): {0}")]
    Proc(#[source] io::Error),
    /// The fd given to [`PassthroughFs::from_fd`](crate::PassthroughFs::from_fd)
    /// is not an open directory (closed, or not a directory).
    #[error("shared directory fd {fd} is not an open directory: {source}")]
    SharedDirFd {
        /// The fd given.
        fd: std::os::fd::RawFd,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The fd given to [`PassthroughFs::from_fd`](crate::PassthroughFs::from_fd)
    /// as `/proc/self/fd` is not this process's `/proc/self/fd` directory.
    #[error("fd {fd} is not this process's /proc/self/fd: {source}")]
    ProcFd {
        /// The fd given.
        fd: std::os::fd::RawFd,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Saved session state that cannot be used: not state at all, cut
    /// short, damaged, from another format version or for another export.
    #[error("saved session state refused: {0}")]
    State(StateProblem),
    /// The state directory of a crash-safe session cannot be read or
    /// written.
    #[error("state directory: {0}")]
    StateDir(#[source] io::Error),
    /// A saved fid could not be brought back (its file is gone, or the
    /// filesystem cannot restore fids).
    #[error("cannot restore fid {fid}: {source}")]
    RestoreFid {
        /// The fid.
        fid: u32,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A `--listen` address that is neither `unix:PATH` nor `tcp:HOST:PORT`.
    #[error("invalid listen address {0:?}: expected unix:PATH or tcp:HOST:PORT")]
    ListenAddress(String),
    /// Binding the listening socket failed.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// An id map, translation rule or set of rules was refused (the id
    /// options' own [`IdError`]).
    #[error(transparent)]
    Id(#[from] IdError),
    /// A configured msize outside `MIN_MSIZE..=MAX_MSIZE`.
    #[error("msize {0} is outside the supported range 4096..=134217728")]
    InvalidMsize(u32),
    /// A security model other than `passthrough`, `mapped-xattr`, `none`.
    #[error("unknown security model {0:?}: expected passthrough, mapped-xattr or none")]
    SecurityModel(String),
    /// A migration mode other than `file-handles` or `find-paths`.
    #[error("unknown migration mode {0:?}: expected file-handles or find-paths")]
    MigrationMode(String),
    /// The engine's worker pool or its eventfd could not be created.
    #[error("cannot start the engine's workers: {0}")]
    Workers(#[source] io::Error),
    /// The engine's timer fd could not be created or armed.
    #[error("engine timer failed: {0}")]
    Timer(#[source] io::Error),
    /// No coroutine stack could be had for a new request.
    #[error("no coroutine stack for a new request: {0}")]
    Stack(#[source] coro_pool::Error),
    /// The coroutine stack pool could not be created.
    #[error("cannot create the coroutine stack pool: {0}")]
    StackPool(#[source] coro_pool::Error),
    /// More requests than the engine's `max_in_flight`.
    #[error("more than {0} requests in flight")]
    TooManyRequests(usize),
    /// The mount tag is empty or longer than the virtio device's
    /// `MAX_TAG_LEN` (254; its tests pin the number in this message).
    #[error("mount tag must be 1 to 254 bytes, got {0}")]
    TagLength(usize),
    /// The mount tag contains a NUL byte.
    #[error("mount tag must not contain NUL bytes")]
    TagNul,
    /// The queue size is zero, above the virtio device's
    /// `MAX_QUEUE_SIZE` (32768; its tests pin the number in this message)
    /// or not a power of two.
    #[error("queue size {0} must be a power of two from 1 to 32768")]
    QueueSize(u32),
    /// The driver (or the VMM) asked the virtio device
    /// for something its state does not allow: features acked twice or
    /// after activation, activation without acked features or with a ring
    /// that is not set up, a snapshot of a running device, a damaged
    /// snapshot.
    #[error("virtio device: {0}")]
    DeviceState(&'static str),
    /// The descriptor chain policy is invalid.
    #[error("chain policy: {0}")]
    ChainLimits(#[source] virtqueue_large::Error),
    /// The ring itself is broken (bad available index, unreadable ring);
    /// the queue stops until the driver resets it.
    #[error("virtqueue is broken: {0}")]
    Ring(#[source] virtqueue_large::Error),
    /// Writing the used ring failed.
    #[error("cannot add to the used ring: {0}")]
    Used(#[source] virtqueue_large::Error),
    /// The eventfd that resumes a queue left with work could not be made.
    #[error("cannot create the queue's resume eventfd: {0}")]
    ResumeFd(#[source] io::Error),
    /// The vhost-user backend's event fds could not be created or
    /// registered.
    #[cfg(feature = "vhost-user")]
    #[error("cannot set up the backend's event fds: {0}")]
    BackendEvent(#[source] io::Error),
    /// The vhost-user socket could not be bound or used.
    #[cfg(feature = "vhost-user")]
    #[error("cannot listen on {what}: {source}")]
    VhostListen {
        /// The socket.
        what: String,
        /// Why.
        #[source]
        source: vhost::vhost_user::Error,
    },
    /// A `--fd` that is not an open socket.
    #[cfg(feature = "vhost-user")]
    #[error("--fd {0} is not an open socket")]
    BadFd(std::os::fd::RawFd),
    /// vhost-user-backend could not set up its handler (vrings, epoll).
    #[cfg(feature = "vhost-user")]
    #[error("vhost-user: {0}")]
    VhostUserHandler(#[source] vhost_user_backend::VhostUserHandlerError),
    /// A vhost-user protocol step (listener, request handler) failed.
    #[cfg(feature = "vhost-user")]
    #[error("vhost-user: {0}")]
    VhostUserProtocol(#[source] vhost::vhost_user::Error),
    /// A vhost-user-backend thread panicked.
    #[cfg(feature = "vhost-user")]
    #[error("vhost-user: a daemon thread panicked")]
    VhostUserPanicked,
    /// An eventfd or poll of the vhost-user daemon loop failed.
    #[cfg(feature = "vhost-user")]
    #[error("daemon i/o: {0}")]
    DaemonIo(#[source] io::Error),
}

#[cfg(feature = "vhost-user")]
impl From<vhost_user_backend::Error> for Error {
    fn from(e: vhost_user_backend::Error) -> Self {
        use vhost_user_backend::Error as E;
        match e {
            E::NewVhostUserHandler(h) => Error::VhostUserHandler(h),
            E::CreateBackendListener(v)
            | E::CreateBackendReqHandler(v)
            | E::CreateVhostUserListener(v)
            | E::HandleRequest(v) => Error::VhostUserProtocol(v),
            E::StartDaemon(io) => Error::DaemonIo(io),
            // The panic payload is neither `Sync` nor printable.
            E::WaitDaemon(_) => Error::VhostUserPanicked,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Why saved session state was refused ([`Error::State`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateProblem {
    /// It does not start with the state's magic bytes.
    #[error("not a virtio-9p-server state file")]
    NotState,
    /// It was written by another format version.
    #[error("format version {found}, this build reads version {expected}")]
    Version {
        /// The version found.
        found: u32,
        /// The version this build reads.
        expected: u32,
    },
    /// It ends before its declared length (a crash while writing it, or a
    /// copy cut short).
    #[error("truncated: {len} bytes, {needed} needed")]
    Truncated {
        /// Bytes present.
        len: usize,
        /// Bytes needed.
        needed: usize,
    },
    /// Its checksum does not match its contents.
    #[error("checksum mismatch (damaged)")]
    Checksum,
    /// It was saved for another export (another directory or security
    /// model).
    #[error("saved for another export")]
    Foreign,
    /// A field is out of range or the body does not parse.
    #[error("malformed: {0}")]
    Malformed(&'static str),
    /// A fid's saved file names something no honest save recorded: a
    /// handle that opens another file or a file of another type, a path
    /// with a name no walk gives. Nothing of the state is restored.
    #[error("fid {fid}: {why}")]
    Forged {
        /// The fid.
        fid: u32,
        /// What does not fit.
        why: String,
    },
}
