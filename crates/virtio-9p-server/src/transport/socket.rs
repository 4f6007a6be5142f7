//! The plain socket transport: `--listen unix:PATH` or `--listen
//! tcp:HOST:PORT`.
//!
//! Each accepted connection gets its own thread and its own [`Session`].
//! Requests are framed by their `size` field and answered in order. A frame
//! whose size is below the header or above the session's msize ends the
//! connection (the stream cannot be resynchronised); any other malformed
//! message gets an Rlerror and the connection goes on. A client that hangs
//! up mid-message only ends its own connection. This is the transport the
//! Linux kernel client uses with `mount -t 9p -o trans=unix` (or
//! `trans=tcp`).

use std::io::{self, Read, Write};
use std::net::{TcpListener, ToSocketAddrs};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use log::{error, info, warn};

use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::io::{SliceReader, SliceWriter};
use crate::protocol::HEADER_SIZE;
use crate::server::{Cancel, Inline, Server, Session};

/// Most client connections served at once; further ones are closed at
/// accept.
pub const MAX_CONNECTIONS: usize = 256;

/// Where to listen.
#[derive(Debug, Clone, PartialEq, Eq)]
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
pub enum Listener {
    /// Unix.
    Unix(UnixListener),
    /// TCP.
    Tcp(TcpListener),
}

impl Listener {
    /// Binds `addr`. A unix socket is owner-only and replaces only a stale
    /// socket ([`super::unix::bind`]).
    pub fn bind(addr: &ListenAddr) -> Result<Self> {
        let listen_err = |source| Error::Listen {
            addr: addr.to_string(),
            source,
        };
        match addr {
            ListenAddr::Unix(path) => super::unix::bind(path, super::unix::SocketPerms::default())
                .map(Listener::Unix)
                .map_err(listen_err),
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

    /// Accepts connections forever, serving each on its own thread.
    pub fn serve<F>(self, server: Arc<Server<F>>) -> Result<()>
    where
        F: Filesystem + 'static,
    {
        let active = Arc::new(AtomicUsize::new(0));
        let mut next_id = 0u64;
        loop {
            let stream: Box<dyn Stream> = match &self {
                Listener::Unix(l) => match l.accept() {
                    Ok((s, _)) => Box::new(s),
                    Err(e) => {
                        accept_failed(&e);
                        continue;
                    }
                },
                Listener::Tcp(l) => match l.accept() {
                    Ok((s, _)) => {
                        let _ = s.set_nodelay(true);
                        Box::new(s)
                    }
                    Err(e) => {
                        accept_failed(&e);
                        continue;
                    }
                },
            };
            if active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
                error!("9p: refusing connection: {MAX_CONNECTIONS} clients already connected");
                continue;
            }
            next_id += 1;
            let id = next_id;
            active.fetch_add(1, Ordering::AcqRel);
            let server = server.clone();
            let active2 = active.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("9p-conn-{id}"))
                .spawn(move || {
                    info!("9p: connection {id} opened");
                    match serve_connection(&server, stream) {
                        Ok(()) => info!("9p: connection {id} closed"),
                        Err(e) => warn!("9p: connection {id} ended: {e}"),
                    }
                    active2.fetch_sub(1, Ordering::AcqRel);
                });
            if let Err(e) = spawned {
                error!("9p: cannot start a connection thread: {e}");
                active.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

fn accept_failed(e: &io::Error) {
    error!("9p: accept failed: {e}");
    // EMFILE and friends: back off instead of spinning.
    std::thread::sleep(std::time::Duration::from_millis(50));
}

/// A byte stream a connection runs on.
pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// Serves one client on `stream` until it hangs up (`Ok`) or breaks the
/// framing (`Err`).
pub fn serve_connection<F, S>(server: &Server<F>, mut stream: S) -> io::Result<()>
where
    F: Filesystem,
    S: Read + Write,
{
    let session = Session::new();
    let cancel = Cancel::new();
    let mut request = Vec::new();
    let mut reply: Vec<u8> = Vec::new();
    loop {
        let mut hdr = [0u8; HEADER_SIZE];
        match stream.read_exact(&mut hdr[..4]) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let size = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
        // A Tversion may announce any msize, but the frame itself is tiny.
        let limit = session.frame_limit();
        if (size as usize) < HEADER_SIZE || size > limit {
            error!("9p: closing connection: frame size {size} outside 7..={limit}");
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame size {size} outside 7..={limit}"),
            ));
        }
        request.clear();
        request.extend_from_slice(&hdr[..4]);
        let body = (size - 4) as u64;
        let got = (&mut stream).take(body).read_to_end(&mut request)?;
        if got as u64 != body {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "client hung up mid-message",
            ));
        }
        if reply.len() != limit as usize {
            // calloc'd: pages are only touched as replies use them.
            reply = vec![0u8; limit as usize];
        }
        let out = server
            .handle(
                &session,
                &mut SliceReader::new(&request),
                &mut SliceWriter::new(&mut reply),
                &Inline,
                &cancel,
            )
            .map_err(io::Error::other)?;
        stream.write_all(&reply[..out.size as usize])?;
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
