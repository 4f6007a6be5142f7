// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The vhost-user transport (feature `vhost-user`): a `VhostUserBackend`
//! for the virtio-9p device and the daemon loop the `virtio-9p-server`
//! binary runs.
//!
//! # Disconnects
//!
//! By default [`Daemon::run`] **waits for a new connection** when the
//! frontend hangs up (the binary instead exits, as virtiofsd does, unless
//! `--keep-serving`; see [`Daemon::set_exit_on_disconnect`]): each
//! connection gets a fresh device (new vring thread, engine and 9P
//! session, so no state of the old guest leaks into the next), while the
//! listening socket, the filesystem and the coroutine stack pool stay. A
//! restarted or reconnecting VMM (QEMU's `reconnect=` chardev option) finds
//! the daemon ready. It returns on [`StopHandle::stop`] (or a write to
//! [`StopHandle::wake_fd`], which a signal handler may do: the binary's
//! handlers for SIGTERM, SIGINT and SIGHUP do), removing the socket it
//! created. The library installs no signal handler. A stale socket
//! left by a killed daemon (nothing listens on it) is replaced at start,
//! so `--socket-path` can be reused; anything else at the path is refused
//! ([`crate::transport::unix::bind`]).
//!
//! # Example
//!
//! Serve a directory on a vhost-user socket until another thread calls
//! [`StopHandle::stop`]:
//!
//! ```no_run
//! use std::sync::Arc;
//! use virtio_9p_server::engine::EngineConfig;
//! use virtio_9p_server::vhost_user::{Daemon, DaemonConfig, Listen};
//! use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server};
//!
//! let fs = PassthroughFs::new(PassthroughConfig::new("/srv/share")).unwrap();
//! let server = Arc::new(Server::new(fs, Config::default()).unwrap());
//! // `#[non_exhaustive]`: start from the defaults, set what differs.
//! let mut config = DaemonConfig::default();
//! config.listen = Listen::Path("/run/virtio-9p.sock".into());
//! config.backend.tag = "share".into();
//! config.backend.engine = EngineConfig::default();
//! let mut daemon = Daemon::new(server, config).unwrap();
//! let stop = daemon.stop_handle();
//! std::thread::spawn(move || {
//!     std::thread::sleep(std::time::Duration::from_secs(60));
//!     stop.stop();
//! });
//! daemon.run().unwrap();
//! ```

mod accept;
mod backend;
mod dirty_log;
mod error;
mod migrate;
#[cfg(any(test, feature = "test-utils"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-utils")))]
pub mod mock;

pub use accept::{Daemon, DaemonConfig, Listen, StopHandle, DEFAULT_SOCKET_PATH};
pub use backend::{
    protocol_features, BackendConfig, Virtio9pBackend, CONTROL_EVENT, QUEUE_EVENT, TIMER_EVENT,
    WAKE_EVENT,
};
pub use dirty_log::DirtyLog;
pub use error::VhostUserError;
