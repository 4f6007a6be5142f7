// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The crate's error type.

use std::io;
use std::path::PathBuf;

/// Errors of the server, the passthrough filesystem and the transports.
/// Request-level failures never appear here: they become Rlerror replies.
#[derive(Debug, thiserror::Error)]
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
    /// A malformed user-namespace id map ([`IdMap`](crate::fs::ids::IdMap)).
    #[error("bad id map {input:?}: {reason}")]
    IdMap {
        /// The text given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A malformed id translation rule ([`IdRule`](crate::fs::ids::IdRule)).
    #[error("bad id translation {input:?}: {reason}")]
    IdRule {
        /// The text given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Two id translation rules translate the same ids in the same
    /// direction ([`IdRules::new`](crate::fs::ids::IdRules::new)).
    #[error("id translations {first} and {second} overlap on {side} ids")]
    IdOverlap {
        /// The earlier rule.
        first: crate::fs::ids::IdRule,
        /// The later rule.
        second: crate::fs::ids::IdRule,
        /// `guest` or `host`.
        side: &'static str,
    },
    /// A configured msize outside `MIN_MSIZE..=MAX_MSIZE`.
    #[error("msize {0} is outside the supported range 4096..=134217728")]
    InvalidMsize(u32),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
