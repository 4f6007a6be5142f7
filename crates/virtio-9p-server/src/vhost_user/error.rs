// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The vhost-user daemon's own errors, with vhost-user-backend's folded
//! in. The crate's [`Error`](crate::Error) wraps them
//! ([`Error::VhostUser`](crate::Error::VhostUser)); nothing here imports
//! it back.

use std::io;
use std::os::fd::RawFd;

/// Why the vhost-user daemon could not listen, set up or go on serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VhostUserError {
    /// The backend's event fds could not be created or registered.
    #[error("cannot set up the backend's event fds: {0}")]
    BackendEvent(#[source] io::Error),
    /// The vhost-user socket could not be bound or used.
    #[error("cannot listen on {what}: {source}")]
    Listen {
        /// The socket.
        what: String,
        /// Why.
        #[source]
        source: vhost::vhost_user::Error,
    },
    /// A `--fd` that is not an open socket.
    #[error("--fd {0} is not an open socket")]
    BadFd(RawFd),
    /// vhost-user-backend could not set up its handler (vrings, epoll).
    #[error("vhost-user: {0}")]
    Handler(#[source] vhost_user_backend::VhostUserHandlerError),
    /// A vhost-user protocol step (listener, request handler) failed.
    #[error("vhost-user: {0}")]
    Protocol(#[source] vhost::vhost_user::Error),
    /// A vhost-user-backend thread panicked.
    #[error("vhost-user: a daemon thread panicked")]
    Panicked,
    /// An eventfd or poll of the daemon loop failed.
    #[error("daemon i/o: {0}")]
    DaemonIo(#[source] io::Error),
}

impl From<vhost_user_backend::Error> for VhostUserError {
    fn from(e: vhost_user_backend::Error) -> Self {
        use vhost_user_backend::Error as E;
        match e {
            E::NewVhostUserHandler(h) => VhostUserError::Handler(h),
            E::CreateBackendListener(v)
            | E::CreateBackendReqHandler(v)
            | E::CreateVhostUserListener(v)
            | E::HandleRequest(v) => VhostUserError::Protocol(v),
            E::StartDaemon(io) => VhostUserError::DaemonIo(io),
            // The panic payload is neither `Sync` nor printable.
            E::WaitDaemon(_) => VhostUserError::Panicked,
        }
    }
}
