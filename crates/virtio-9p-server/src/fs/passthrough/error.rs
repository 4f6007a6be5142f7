// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The passthrough's own errors: opening the export and parsing its
//! options. The crate's [`Error`](crate::Error) wraps them
//! ([`Error::Passthrough`](crate::Error::Passthrough)); nothing here
//! imports it back.

use std::io;
use std::os::fd::RawFd;
use std::path::PathBuf;

/// Why a [`PassthroughFs`](super::PassthroughFs) could not be opened, or
/// one of its options parsed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PassthroughError {
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
    /// The fd given to [`PassthroughFs::from_fd`](super::PassthroughFs::from_fd)
    /// is not an open directory (closed, or not a directory).
    #[error("shared directory fd {fd} is not an open directory: {source}")]
    SharedDirFd {
        /// The fd given.
        fd: RawFd,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The fd given to [`PassthroughFs::from_fd`](super::PassthroughFs::from_fd)
    /// as `/proc/self/fd` is not this process's `/proc/self/fd` directory.
    #[error("fd {fd} is not this process's /proc/self/fd: {source}")]
    ProcFd {
        /// The fd given.
        fd: RawFd,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A security model other than `passthrough`, `mapped-xattr`, `none`.
    #[error("unknown security model {0:?}: expected passthrough, mapped-xattr or none")]
    SecurityModel(String),
    /// A migration mode other than `file-handles` or `find-paths`.
    #[error("unknown migration mode {0:?}: expected file-handles or find-paths")]
    MigrationMode(String),
}
