// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The crate's error type. Each layer that fails on its own keeps its own
//! error, and [`Error`] wraps it with `#[from]`: the id options'
//! ([`IdError`]), the passthrough's ([`PassthroughError`]), the engine's
//! ([`EngineError`]), the socket transport's ([`SocketError`]), the
//! virtio device's ([`VirtioError`]) and the vhost-user daemon's
//! (`VhostUserError`, feature `vhost-user`). What is left here is the
//! server's own: a request the transport could not frame, and saved
//! state ([`StateProblem`]). The 9P codec's
//! [`DecodeError`](crate::protocol::DecodeError) stays apart: it never
//! reaches an embedder as a failure, it becomes an Rlerror reply.
//!
//! The imports run one way: this module names the layers' errors, and
//! no layer error imports this module back, so fs/ and transport/ never
//! import it at all.

use std::io;

use crate::engine::EngineError;
use crate::fs::ids::IdError;
use crate::fs::passthrough::PassthroughError;
use crate::transport::socket::SocketError;
#[cfg(feature = "vhost-user")]
use crate::vhost_user::VhostUserError;
use crate::virtio::VirtioError;

/// Errors of the server and saved state, and those of the layers below
/// and beside it, wrapped. Request-level failures never appear here:
/// they become Rlerror replies.
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
    /// A configured msize outside `MIN_MSIZE..=MAX_MSIZE`.
    #[error("msize {0} is outside the supported range 4096..=134217728")]
    InvalidMsize(u32),
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
    /// An id map, translation rule or set of rules was refused.
    #[error(transparent)]
    Id(#[from] IdError),
    /// The shared directory or a passthrough option was refused.
    #[error(transparent)]
    Passthrough(#[from] PassthroughError),
    /// The engine could not start or take a request.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The socket transport could not listen.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The virtio device refused a setting or a driver step, or its ring
    /// broke.
    #[error(transparent)]
    Virtio(#[from] VirtioError),
    /// The vhost-user daemon could not listen, set up or go on serving.
    #[cfg(feature = "vhost-user")]
    #[error(transparent)]
    VhostUser(#[from] VhostUserError),
}

#[cfg(feature = "vhost-user")]
impl From<vhost_user_backend::Error> for Error {
    fn from(e: vhost_user_backend::Error) -> Self {
        Error::VhostUser(e.into())
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
