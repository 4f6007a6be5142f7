// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
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
//!
//! Memory: a connection keeps a request and a reply buffer of
//! `KEEP_BUFFER` (64 KiB). A Twrite larger than that is not buffered: its data
//! goes from the socket to the file through a 64 KiB copy buffer. A larger
//! reply (Tread, Treaddir) or any other larger frame (none is valid: names
//! and strings are bounded at decode) is charged to the listener's shared
//! budget ([`SocketLimits::buffer_bytes`]) and freed once the connection
//! has been idle for `IDLE_RELEASE` (20 ms). A frame over the budget is read,
//! dropped and answered with `ENOMEM`; a Tread or Treaddir gets a shorter
//! reply. See [`crate::bound`] for the whole daemon's bound.

use std::io::{self, Read, Write};
use std::net::{TcpListener, ToSocketAddrs};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use log::{error, info, warn};

use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::io::{RequestReader, SliceReader, SliceWriter};
use crate::protocol::{Header, MsgType, Rmessage, HEADER_SIZE, TREAD, TREADDIR, TWRITE};
use crate::server::{Cancel, Inline, Server, Session};

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

    /// Accepts connections forever, serving each on its own thread, with
    /// the default [`SocketLimits`].
    pub fn serve<F>(self, server: Arc<Server<F>>) -> Result<()>
    where
        F: Filesystem + 'static,
    {
        self.serve_with(server, SocketLimits::default())
    }

    /// Accepts connections forever, serving each on its own thread within
    /// `limits`.
    pub fn serve_with<F>(self, server: Arc<Server<F>>, limits: SocketLimits) -> Result<()>
    where
        F: Filesystem + 'static,
    {
        let budget = BufferBudget::new(limits.buffer_bytes);
        let max_connections = limits.max_connections;
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
            if active.load(Ordering::Acquire) >= max_connections {
                error!("9p: refusing connection: {max_connections} clients already connected");
                continue;
            }
            next_id += 1;
            let id = next_id;
            active.fetch_add(1, Ordering::AcqRel);
            let server = server.clone();
            let active2 = active.clone();
            let budget = Arc::clone(&budget);
            let spawned = std::thread::Builder::new()
                .name(format!("9p-conn-{id}"))
                .spawn(move || {
                    info!("9p: connection {id} opened");
                    match serve_budgeted(&server, stream, budget) {
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
pub trait Stream: Read + Write + Send + std::os::fd::AsFd {}
impl<T: Read + Write + Send + std::os::fd::AsFd> Stream for T {}

/// Request and reply buffers a connection keeps between requests. A
/// larger request or reply gets its own buffer, kept only while the client
/// keeps sending (see [`IDLE_RELEASE`]).
pub(crate) const KEEP_BUFFER: usize = 64 << 10;

/// How long a connection may wait for its next request before it frees
/// buffers above [`KEEP_BUFFER`]: an idle connection holds at most two
/// buffers of `KEEP_BUFFER`, whatever it sent before.
pub(crate) const IDLE_RELEASE: Duration = Duration::from_millis(20);

/// Room for a reply other than Rread/Rreaddir: the largest is an Rgetlock
/// or Rreadlink with a [`MAX_PATH_LEN`](crate::protocol::MAX_PATH_LEN)
/// string.
const SMALL_REPLY: usize = 8 << 10;

/// The reply room a request can use: Tread and Treaddir ask for `count`
/// bytes of data (both carry `fid[4] offset[8] count[4]`); any other reply
/// is small. `frame` starts with the 7-byte header.
fn reply_room(frame: &[u8], limit: u32) -> usize {
    let ty = frame.get(4).and_then(|&t| MsgType::try_from(t).ok());
    let need = match (ty, frame.get(HEADER_SIZE + 12..HEADER_SIZE + 16)) {
        (Some(TREAD | TREADDIR), Some(c)) => {
            // size[4] type[1] tag[2] count[4] before the data.
            HEADER_SIZE + 4 + u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize
        }
        _ => SMALL_REPLY,
    };
    need.min(limit as usize)
        .max(SMALL_REPLY.min(limit as usize))
}

/// Waits up to `timeout` for `fd` to become readable (or hung up).
fn readable_within(fd: std::os::fd::BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r >= 0 {
            return Ok(r > 0);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

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
    /// buffers above 64 KiB (Twrite data is streamed and never
    /// counts). A request frame that does not fit is read and dropped and
    /// answered with `ENOMEM`; a Tread or Treaddir whose reply does not fit
    /// gets a shorter reply (as POSIX allows).
    pub buffer_bytes: usize,
}

impl Default for SocketLimits {
    fn default() -> Self {
        SocketLimits {
            max_connections: MAX_CONNECTIONS,
            buffer_bytes: DEFAULT_BUFFER_BYTES,
        }
    }
}

/// The shared budget for large connection buffers.
#[derive(Debug)]
struct BufferBudget {
    used: AtomicUsize,
    max: usize,
}

impl BufferBudget {
    fn new(max: usize) -> Arc<Self> {
        Arc::new(BufferBudget {
            used: AtomicUsize::new(0),
            max,
        })
    }

    fn try_take(&self, n: usize) -> bool {
        crate::server::try_add(&self.used, n, self.max)
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// A buffer of a connection: up to [`KEEP_BUFFER`] bytes are its own; a
/// larger one is charged against the listener's [`BufferBudget`].
#[derive(Default)]
struct Buf {
    data: Vec<u8>,
    charged: usize,
}

impl Buf {
    /// Makes room for `n` bytes (capacity for the request, zeroed length
    /// for the reply). False if the budget cannot cover it.
    fn ensure(&mut self, n: usize, zeroed: bool, budget: &BufferBudget) -> bool {
        let have = if zeroed {
            self.data.len()
        } else {
            self.data.capacity()
        };
        if have >= n {
            return true;
        }
        self.release(budget);
        if n > KEEP_BUFFER && !budget.try_take(n) {
            return false;
        }
        self.charged = if n > KEEP_BUFFER { n } else { 0 };
        // Small buffers get KEEP_BUFFER at once; large ones exactly `n`
        // (growing by doubling would hold up to twice the msize). Zeroed
        // buffers are calloc'd: pages are only touched as replies use them.
        let n = n.max(KEEP_BUFFER);
        self.data = if zeroed {
            vec![0u8; n]
        } else {
            Vec::with_capacity(n)
        };
        true
    }

    /// Frees the buffer if it is above [`KEEP_BUFFER`]; true if it was.
    fn shrink(&mut self, budget: &BufferBudget) -> bool {
        if self.data.capacity() <= KEEP_BUFFER {
            return false;
        }
        self.release(budget);
        true
    }

    fn release(&mut self, budget: &BufferBudget) {
        self.data = Vec::new();
        budget.give(std::mem::take(&mut self.charged));
    }
}

/// The buffers of one connection, shrunk back to [`KEEP_BUFFER`] when the
/// connection goes idle and given back to the budget when it ends.
struct Buffers {
    request: Buf,
    reply: Buf,
    budget: Arc<BufferBudget>,
}

impl Buffers {
    fn new(budget: Arc<BufferBudget>) -> Self {
        Buffers {
            request: Buf::default(),
            reply: Buf::default(),
            budget,
        }
    }

    /// Whether either buffer is above [`KEEP_BUFFER`].
    fn oversized(&self) -> bool {
        self.request.data.capacity() > KEEP_BUFFER || self.reply.data.capacity() > KEEP_BUFFER
    }

    /// Frees what is above [`KEEP_BUFFER`] and hands the freed pages back
    /// to the kernel: glibc otherwise keeps freed heap chunks below its
    /// (dynamic, up to 32 MiB) mmap threshold resident in its arenas.
    fn shrink(&mut self) {
        let freed = self.request.shrink(&self.budget) | self.reply.shrink(&self.budget);
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if freed {
            // SAFETY: malloc_trim only returns free allocator memory to
            // the kernel; it touches no live allocation.
            unsafe {
                libc::malloc_trim(0);
            }
        }
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        let _ = freed;
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        self.request.release(&self.budget);
        self.reply.release(&self.budget);
    }
}

/// A Twrite frame read straight from the stream as the server consumes
/// it: the header already read, then at most the rest of the frame.
struct StreamRequest<'a, S> {
    hdr: [u8; HEADER_SIZE],
    pos: usize,
    stream: &'a mut S,
    /// Bytes of the frame not consumed yet, header included.
    left: usize,
}

impl<S: Read> Read for StreamRequest<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let n = if self.pos < HEADER_SIZE {
            let n = buf.len().min(HEADER_SIZE - self.pos);
            buf[..n].copy_from_slice(&self.hdr[self.pos..self.pos + n]);
            self.pos += n;
            n
        } else {
            let want = buf.len().min(self.left);
            match self.stream.read(&mut buf[..want])? {
                0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "client hung up mid-message",
                    ))
                }
                n => n,
            }
        };
        self.left -= n;
        Ok(n)
    }
}

impl<S: Read + Send> RequestReader for StreamRequest<'_, S> {
    fn available_bytes(&self) -> usize {
        self.left
    }
}

/// Reads and drops `n` bytes of `stream` through `scratch`.
fn discard<S: Read>(stream: &mut S, mut n: u64, scratch: &mut [u8]) -> io::Result<()> {
    while n > 0 {
        let chunk = (scratch.len() as u64).min(n) as usize;
        stream.read_exact(&mut scratch[..chunk])?;
        n -= chunk as u64;
    }
    Ok(())
}

/// Serves one client on `stream` until it hangs up (`Ok`) or breaks the
/// framing (`Err`), with the default [`SocketLimits`] budget of its own.
pub fn serve_connection<F, S>(server: &Server<F>, stream: S) -> io::Result<()>
where
    F: Filesystem,
    S: Read + Write + Send + std::os::fd::AsFd,
{
    let budget = BufferBudget::new(SocketLimits::default().buffer_bytes);
    serve_budgeted(server, stream, budget)
}

/// Serves one connection; its large buffers are charged to `budget`.
///
/// Memory: a request holds at most one request buffer of its frame size
/// (at most the msize) and one reply buffer of the room it asks for (at
/// most the msize), both within the budget above [`KEEP_BUFFER`]. When
/// no request arrives within [`IDLE_RELEASE`], both buffers are cut back
/// to [`KEEP_BUFFER`].
fn serve_budgeted<F, S>(
    server: &Server<F>,
    mut stream: S,
    budget: Arc<BufferBudget>,
) -> io::Result<()>
where
    F: Filesystem,
    S: Read + Write + Send + std::os::fd::AsFd,
{
    let session = Session::new();
    let cancel = Cancel::new();
    let mut bufs = Buffers::new(budget);
    loop {
        if bufs.oversized() && !readable_within(stream.as_fd(), IDLE_RELEASE)? {
            bufs.shrink();
        }
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
        if size as usize > KEEP_BUFFER {
            stream.read_exact(&mut hdr[4..])?;
            if hdr[4] == TWRITE {
                // The data goes from the socket to the file through a
                // bounded copy buffer: no frame-sized request buffer.
                bufs.reply.ensure(SMALL_REPLY, true, &bufs.budget);
                let mut req = StreamRequest {
                    hdr,
                    pos: 0,
                    stream: &mut stream,
                    left: size as usize,
                };
                let out = server
                    .handle(
                        &session,
                        &mut req,
                        &mut SliceWriter::new(&mut bufs.reply.data[..SMALL_REPLY]),
                        &Inline,
                        &cancel,
                    )
                    .map_err(io::Error::other)?;
                // What the server did not take (an error before the data).
                let rest = req.left as u64;
                discard(&mut stream, rest, &mut [0u8; 8192])?;
                stream.write_all(&bufs.reply.data[..out.size as usize])?;
                continue;
            }
            if !bufs.request.ensure(size as usize, false, &bufs.budget) {
                // Over the shared budget: drop the frame, answer ENOMEM.
                let h = Header::from_bytes(&hdr);
                error!(
                    "9p: request of {size} bytes (tag {}) refused: connection buffers are at their limit",
                    h.tag
                );
                discard(
                    &mut stream,
                    (size as usize - HEADER_SIZE) as u64,
                    &mut [0u8; 8192],
                )?;
                let frame = Rmessage::Lerror(libc::ENOMEM as u32).encode_frame(h.tag);
                stream.write_all(&frame)?;
                continue;
            }
        } else {
            bufs.request.ensure(size as usize, false, &bufs.budget);
        }
        let request = &mut bufs.request.data;
        request.clear();
        let have = if size as usize > KEEP_BUFFER {
            HEADER_SIZE
        } else {
            4
        };
        request.extend_from_slice(&hdr[..have]);
        let body = (size as usize - have) as u64;
        let got = (&mut stream).take(body).read_to_end(request)?;
        if got as u64 != body {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "client hung up mid-message",
            ));
        }
        let mut room = reply_room(request, limit);
        if !bufs.reply.ensure(room, true, &bufs.budget) {
            // A shorter Rread/Rreaddir, as POSIX allows.
            room = KEEP_BUFFER.min(limit as usize);
            bufs.reply.ensure(room, true, &bufs.budget);
        }
        let out = server
            .handle(
                &session,
                &mut SliceReader::new(&bufs.request.data),
                &mut SliceWriter::new(&mut bufs.reply.data[..room]),
                &Inline,
                &cancel,
            )
            .map_err(io::Error::other)?;
        stream.write_all(&bufs.reply.data[..out.size as usize])?;
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
