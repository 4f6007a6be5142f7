// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The socket transport's own errors. The crate's [`Error`](crate::Error)
//! wraps them ([`Error::Socket`](crate::Error::Socket)); nothing here
//! imports it back.

use std::io;

/// Why the socket transport could not listen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketError {
    /// A listen address that is neither `unix:PATH` nor `tcp:HOST:PORT`.
    #[error("invalid listen address {0:?}: expected unix:PATH or tcp:HOST:PORT")]
    ListenAddress(String),
    /// Binding the listening socket, or starting its threads, failed.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}
