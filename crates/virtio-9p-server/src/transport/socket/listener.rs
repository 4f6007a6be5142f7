// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The listening socket, its accept loop, and the limits of its
//! connections.

use std::io;
use std::net::{TcpListener, ToSocketAddrs};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use log::{error, warn};

use super::hub::Hub;
use crate::engine::DEFAULT_WORKERS;
use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::server::Server;

/// Most client connections served at once; further ones are closed at
/// accept.
pub const MAX_CONNECTIONS: usize = 256;

/// Where to listen.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListenAddr {
    /// A unix socket path.
    Unix(PathBuf),
    /// A TCP `host:port`.
    Tcp(String),
}

impl FromStr for ListenAddr {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        if let Some(path) = s.strip_prefix("unix:") {
            if !path.is_empty() {
                return Ok(ListenAddr::Unix(PathBuf::from(path)));
            }
        } else if let Some(hp) = s.strip_prefix("tcp:") {
            if hp
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
            {
                return Ok(ListenAddr::Tcp(hp.to_string()));
            }
        }
        Err(Error::ListenAddress(s.to_string()))
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// A bound listening socket.
#[derive(Debug)]
#[non_exhaustive]
pub enum Listener {
    /// Unix.
    Unix(UnixListener),
    /// TCP.
    Tcp(TcpListener),
}

impl Listener {
    /// Binds `addr`. A unix socket is owner-only and replaces only a stale
    /// socket ([`crate::transport::unix::bind`]).
    pub fn bind(addr: &ListenAddr) -> Result<Self> {
        let listen_err = |source| Error::Listen {
            addr: addr.to_string(),
            source,
        };
        match addr {
            ListenAddr::Unix(path) => {
                crate::transport::unix::bind(path, crate::transport::unix::SocketPerms::default())
                    .map(Listener::Unix)
                    .map_err(listen_err)
            }
            ListenAddr::Tcp(hp) => {
                let addrs: Vec<_> = hp.to_socket_addrs().map_err(listen_err)?.collect();
                if addrs.iter().any(|a| !a.ip().is_loopback()) {
                    warn!("9p: listening on {hp}, which is not loopback; 9P has no authentication");
                }
                TcpListener::bind(&addrs[..])
                    .map(Listener::Tcp)
                    .map_err(listen_err)
            }
        }
    }

    /// The bound address (with the real port for `tcp:…:0`).
    pub fn local_addr(&self) -> io::Result<ListenAddr> {
        Ok(match self {
            Listener::Unix(l) => ListenAddr::Unix(
                l.local_addr()?
                    .as_pathname()
                    .map(PathBuf::from)
                    .unwrap_or_default(),
            ),
            Listener::Tcp(l) => ListenAddr::Tcp(l.local_addr()?.to_string()),
        })
    }

    /// Accepts connections forever and serves them with the default
    /// [`SocketLimits`].
    pub fn serve<F>(self, server: Arc<Server<F>>) -> Result<()>
    where
        F: Filesystem + 'static,
    {
        self.serve_with(server, SocketLimits::default())
    }

    /// Accepts connections forever (on the calling thread) and serves them
    /// on the socket threads within `limits` (see the module docs,
    /// "Threads"). Returns only if the socket threads cannot be started.
    pub fn serve_with<F>(self, server: Arc<Server<F>>, limits: SocketLimits) -> Result<()>
    where
        F: Filesystem + 'static,
    {
        let addr = self.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let log = Arc::clone(&server);
        let hub = Hub::start(server, &limits).map_err(|source| Error::Listen {
            addr: addr.clone(),
            source,
        })?;
        loop {
            let accepted = match &self {
                Listener::Unix(l) => l.accept().map(|(s, _)| OwnedFd::from(s)),
                Listener::Tcp(l) => l.accept().map(|(s, _)| {
                    let _ = s.set_nodelay(true);
                    OwnedFd::from(s)
                }),
            };
            let fd = match accepted {
                Ok(fd) => fd,
                Err(e) => {
                    accept_failed(&e);
                    continue;
                }
            };
            if hub.active.load(Ordering::Acquire) >= limits.max_connections {
                if log.log_limit().admit() {
                    warn!(
                        "9p: refusing connection: {} clients already connected",
                        limits.max_connections
                    );
                }
                continue;
            }
            if let Err(e) = hub.add(fd) {
                error!("9p: cannot serve a new connection: {e}");
            }
        }
    }
}

pub(super) fn accept_failed(e: &io::Error) {
    error!("9p: accept failed: {e}");
    // EMFILE and friends: back off instead of spinning.
    std::thread::sleep(Duration::from_millis(50));
}

/// A byte stream a connection runs on.
pub trait Stream: io::Read + io::Write + Send + AsFd {}
impl<T: io::Read + io::Write + Send + AsFd> Stream for T {}

/// Default of [`SocketLimits::max_in_flight`].
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;

/// Default of [`SocketLimits::max_requests`]: as many as one vhost-user
/// queue of 1024 entries.
pub const DEFAULT_MAX_REQUESTS: usize = 1024;

/// The errno of the Rlerror a request gets when its tag is in flight on
/// its connection.
pub const DUPLICATE_TAG_ERRNO: i32 = libc::EBUSY;

/// Default of [`SocketLimits::min_request_rate`]: 16 KiB/s.
pub(crate) const DEFAULT_MIN_REQUEST_RATE: usize = 16 << 10;

/// Default of [`SocketLimits::request_grace`]: 10 s.
pub(crate) const DEFAULT_REQUEST_GRACE: Duration = Duration::from_secs(10);

/// Default [`SocketLimits::buffer_bytes`]: 512 MiB.
pub const DEFAULT_BUFFER_BYTES: usize = 512 << 20;

/// Limits shared by every connection of one [`Listener`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SocketLimits {
    /// Most clients served at once; further connections are closed at
    /// accept.
    pub max_connections: usize,
    /// Bytes all connections together may hold in request and reply
    /// buffers above `KEEP_BUFFER` (streamed Twrite data never counts).
    /// A request frame that does not fit is read and dropped and answered
    /// with `ENOMEM`; a Tread or Treaddir whose reply does not fit gets a
    /// shorter reply (as POSIX allows).
    pub buffer_bytes: usize,
    /// Requests one connection may have in flight (started, or with a
    /// reply not yet written); further ones wait in the socket.
    pub max_in_flight: usize,
    /// Requests all connections together may have in flight (split evenly
    /// between the socket threads); at the limit a socket thread reads
    /// none of its sockets until a request finishes. It bounds the
    /// coroutine stacks and small buffers as a queue size does for a
    /// vhost-user device.
    pub max_requests: usize,
    /// Socket threads, each serving its share of the connections on one
    /// engine (at least 1).
    pub threads: usize,
    /// Worker threads for blocking filesystem calls, shared by every
    /// socket thread (`--thread-pool-size`); 0 runs every call inline.
    pub workers: usize,
    /// Send Rread data spliced from the file (default), not copied
    /// through the reply buffer (see "Zero-copy Rread" in the module
    /// docs). `false` copies every Rread: for measurements, or a kernel
    /// whose splice into sockets misbehaves.
    pub splice_reads: bool,
    /// Bytes a second a request must keep arriving at once
    /// [`request_grace`](SocketLimits::request_grace) has passed since its
    /// first byte; a connection whose request falls behind is closed (see
    /// "Slow senders" in the module docs). 0 turns the check off.
    /// Default: 16 KiB/s.
    pub min_request_rate: usize,
    /// How long a request may take to arrive before
    /// [`min_request_rate`](SocketLimits::min_request_rate) applies.
    /// Default: 10 s.
    pub request_grace: Duration,
}

impl Default for SocketLimits {
    fn default() -> Self {
        SocketLimits {
            max_connections: MAX_CONNECTIONS,
            buffer_bytes: DEFAULT_BUFFER_BYTES,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_requests: DEFAULT_MAX_REQUESTS,
            threads: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
                .min(4),
            workers: DEFAULT_WORKERS,
            splice_reads: true,
            min_request_rate: DEFAULT_MIN_REQUEST_RATE,
            request_grace: DEFAULT_REQUEST_GRACE,
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_listen_addr_parse() {
        assert_eq!(
            "unix:/tmp/x.sock".parse::<ListenAddr>().unwrap(),
            ListenAddr::Unix("/tmp/x.sock".into())
        );
        assert_eq!(
            "tcp:127.0.0.1:564".parse::<ListenAddr>().unwrap(),
            ListenAddr::Tcp("127.0.0.1:564".into())
        );
        for bad in [
            "",
            "unix:",
            "tcp:127.0.0.1",
            "tcp::5",
            "udp:1.2.3.4:5",
            "tcp:h:99999",
        ] {
            let e = bad.parse::<ListenAddr>().unwrap_err();
            assert!(e.to_string().starts_with("invalid listen address"), "{e}");
        }
    }
}
