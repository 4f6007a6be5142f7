// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The listening socket and its accept loop.

use std::io;
use std::net::{TcpListener, ToSocketAddrs};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use log::{error, warn};

use super::error::SocketError;
use super::hub::Hub;
use super::limits::SocketLimits;
use crate::fs::Filesystem;
use crate::server::Server;

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
    type Err = SocketError;

    fn from_str(s: &str) -> Result<Self, SocketError> {
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
        Err(SocketError::ListenAddress(s.to_string()))
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
    pub fn bind(addr: &ListenAddr) -> Result<Self, SocketError> {
        let listen_err = |source| SocketError::Listen {
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
    pub fn serve<F>(self, server: Arc<Server<F>>) -> Result<(), SocketError>
    where
        F: Filesystem + 'static,
    {
        self.serve_with(server, SocketLimits::default())
    }

    /// Accepts connections forever (on the calling thread) and serves them
    /// on the socket threads within `limits` (see the module docs,
    /// "Threads"). Returns only if the socket threads cannot be started.
    pub fn serve_with<F>(
        self,
        server: Arc<Server<F>>,
        limits: SocketLimits,
    ) -> Result<(), SocketError>
    where
        F: Filesystem + 'static,
    {
        let addr = self.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let log = Arc::clone(&server);
        let hub = Hub::start(server, &limits).map_err(|source| SocketError::Listen {
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
            if hub.active() >= limits.max_connections {
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

fn accept_failed(e: &io::Error) {
    error!("9p: accept failed: {e}");
    // EMFILE and friends: back off instead of spinning.
    std::thread::sleep(Duration::from_millis(50));
}

/// A byte stream a connection runs on.
pub trait Stream: io::Read + io::Write + Send + AsFd {}
impl<T: io::Read + io::Write + Send + AsFd> Stream for T {}

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
