// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The plain socket transport: `--listen unix:PATH` or `--listen
//! tcp:HOST:PORT`, the transport the Linux kernel client uses with
//! `mount -t 9p -o trans=unix` (or `trans=tcp`), and diod's.
//!
//! # Requests run on the engine
//!
//! Each connection's requests run on the coroutine [`Engine`], the same
//! one the virtio device uses, so many requests of one connection are in
//! flight at once and replies go out as requests finish, in any order,
//! matched by tag:
//!
//! - **In-flight limit.** A connection has at most
//!   [`SocketLimits::max_in_flight`] requests started or with a reply not
//!   yet written. At the limit the server stops reading that socket: the
//!   tags beyond it wait in the socket buffer (and then in the client) and
//!   are read when a slot frees. A client that sends faster than it reads
//!   its replies is therefore held to the limit, never buffered without
//!   bound.
//! - **Duplicate tags.** A request whose tag is in flight on its
//!   connection is answered with `EBUSY` ([`DUPLICATE_TAG_ERRNO`]) and not
//!   run; the request holding the tag goes on undisturbed.
//! - **Tflush** is the engine's ([`crate::engine`], "Tflush"): Rflush goes
//!   out after the flushed request's reply, or instead of it when the
//!   request was cancelled before it answered; a flushed blocking Tlock
//!   stops waiting; an unknown tag gets Rflush at once.
//! - **Hang-up.** A client that hangs up (or breaks the framing) has its
//!   requests cancelled at once ([`Engine::cancel_group`]): waiting ones
//!   return now, one in a filesystem call returns when the call does. Its
//!   socket is closed at once, and its session (with every fid) is freed
//!   when the last of its requests has returned.
//!
//! A frame whose size is below the header or above the session's msize
//! ends the connection (the stream cannot be resynchronised); any other
//! malformed message gets an Rlerror and the connection goes on.
//!
//! # Threads
//!
//! No thread per connection. [`Listener::serve_with`] accepts on the
//! calling thread and hands each connection to one of
//! [`SocketLimits::threads`] socket threads (the one with the fewest
//! connections). A socket thread runs one epoll loop and one [`Engine`]
//! for all its connections; each connection is a tag space of that engine
//! ([`Engine::spawn_in`]). Blocking filesystem calls of every socket
//! thread go to one shared pool of [`SocketLimits::workers`] worker
//! threads (`--thread-pool-size`; two pools of that size in fact, one for
//! blocking locks, see [`Job::may_wait`](crate::engine::Job::may_wait));
//! with 0 workers every call runs inline on its socket thread. Reads of
//! cached data run inline on the socket thread (no thread hop); uncached
//! ranges go to a worker (see "Zero-copy Rread"). So the daemon has
//! `1 + threads + 2 × workers` threads whatever the number of clients.
//!
//! # Memory
//!
//! Request and reply buffers are taken per request from a small pool of
//! the socket thread, sized by what is in flight, not by msize: a buffer
//! is exactly what the request or its reply needs (a Tread or Treaddir
//! asks for `count` bytes; every other reply fits `SMALL_BUFFER`), and
//! the pool keeps at most two free buffers per request the thread has in
//! flight or waiting to be written, and four more. Buffers above
//! `KEEP_BUFFER` are charged to the listener's
//! shared budget ([`SocketLimits::buffer_bytes`]): a request frame over
//! the budget is read, dropped and answered with `ENOMEM`; a Tread or
//! Treaddir gets a shorter reply. A Twrite larger than `KEEP_BUFFER` is
//! not buffered: its data goes from the socket to the file (on a worker)
//! through a 64 KiB copy buffer, and the connection reads nothing else
//! until it is done. A free buffer unused for `IDLE_RELEASE` is freed,
//! so an idle connection holds only its session and a few hundred bytes of
//! state, however busy the other connections of its thread are. See [`crate::bound`] for the
//! whole daemon's bound.
//!
//! # Zero-copy Rread
//!
//! An Rread of a regular file goes out as its 11-byte header from the
//! reply buffer plus the file range spliced through a pipe (file -> pipe
//! -> socket, no copy in the daemon; unix and TCP sockets take the pages
//! with `MSG_SPLICE_PAGES`). The transport's reply writer does it: the
//! server and the filesystem see a plain
//! [`ReplyWriter`](crate::io::ReplyWriter), and a filesystem that calls
//! `write_from_file_at` for the whole data of the reply gets the range
//! deferred to a pipe instead of copied.
//!
//! - **Count first.** The range is clamped to the request and to the file
//!   size (`fstat`), then spliced into the pipe before the server encodes
//!   the header, so the header's count is exactly what the pipe holds. A
//!   file that shrinks meanwhile only shortens the count. Should the
//!   kernel drop pages from the pipe later (a truncation removes them),
//!   the socket splice comes up short and the rest of the reply is sent
//!   as zeros (logged, rate-limited): the framing never breaks and the
//!   connection goes on.
//! - **Where the fill runs.** As for every Tread's read
//!   (`engine::offload_read`): inline on the socket thread when the range
//!   is in the page cache (`cachestat(2)`) and the file's filesystem
//!   answers `RWF_NOWAIT` reads (a 1-byte probe; NFS and FUSE do not),
//!   else spliced into the pipe on a worker, where a cold disk or a hung
//!   export may block. Uncached ranges are therefore zero-copy too, and
//!   the socket thread itself only splices pipe -> socket, which touches
//!   no file.
//! - **A full socket.** The pipe -> socket splice is `SPLICE_F_NONBLOCK`:
//!   on `EAGAIN` the connection waits for `EPOLLOUT` with the rest kept in
//!   the pipe, and the thread serves its other connections meanwhile.
//! - **Pipes.** Each socket thread has a pool of at most 16 pipes, sized
//!   with `F_SETPIPE_SZ` to the reply (at most 1 MiB; one page slot per
//!   page the range touches). A pipe is held from the fill until its
//!   reply is sent, then kept free for `IDLE_RELEASE` and closed: idle
//!   connections hold none. No pipe to be had (the cap, `EMFILE`, a size
//!   the kernel refuses) means the copy path. See [`crate::bound`] for
//!   the fds.
//! - **Copy path.** `pread` into the reply buffer and `send`, as before,
//!   for ranges under 16 KiB or over 1 MiB, files that are not regular,
//!   Treaddir and xattr reads, filesystems that are not fd-backed, and a
//!   filesystem that writes other bytes around the range (the spliced
//!   part is then read back into the buffer, so the order holds).
//! - **Lifetime.** The pipe holds references to the file's pages, so the
//!   fid may be clunked (and the file closed) by another request at any
//!   time after the fill. A write to the file between the fill and the
//!   client's receive may show in the data, as for any splice.
//! - **SIGPIPE.** A splice into a hung-up socket raises `SIGPIPE` (splice
//!   has no `MSG_NOSIGNAL`). Socket threads block it on themselves and
//!   take it after `EPIPE`, so an embedder that did not ignore it is not
//!   killed.
//!
//! [`SocketLimits::splice_reads`] `false` turns splicing off (every
//! Rread is copied). The `virtio-9p` suite runs the same server both ways
//! in one run (`sock_splice_vs_copy_depth1`, `_depth4`, `_depth16`); the
//! figures are in BENCHMARKS.md.

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, Read};
use std::net::{TcpListener, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::rc::Rc;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use coro_pool::{PoolConfig, StackPool};
use log::{debug, error, info, warn};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::splice::{
    self, Filled, PipePool, SharedPipes, SigpipeBlocked, SockWriter, Splicer, Tail,
};
use crate::engine::{
    self, set_nonblocking, Engine, EngineConfig, EngineExec, Executor, ThreadPool,
    DEFAULT_STACK_SIZE, DEFAULT_WORKERS,
};
use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::io::{RequestReader, SliceReader};
use crate::protocol::{Header, MsgType, Rmessage, HEADER_SIZE, TREAD, TREADDIR, TWRITE};
use crate::server::{Cancel, Server, Session};

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

fn accept_failed(e: &io::Error) {
    error!("9p: accept failed: {e}");
    // EMFILE and friends: back off instead of spinning.
    std::thread::sleep(Duration::from_millis(50));
}

/// A byte stream a connection runs on.
pub trait Stream: io::Read + io::Write + Send + AsFd {}
impl<T: io::Read + io::Write + Send + AsFd> Stream for T {}

/// Twrite frames larger than this are streamed from the socket to the file
/// instead of being buffered, and buffers up to this size are not charged
/// to the shared budget (so a client always gets a reply of this size,
/// whatever others hold).
pub(crate) const KEEP_BUFFER: usize = 64 << 10;

/// How long a free buffer stays in a socket thread's pool before it is
/// freed (and the heap trimmed).
pub(crate) const IDLE_RELEASE: Duration = Duration::from_millis(20);

/// The smallest buffer: every reply other than Rread/Rreaddir fits (the
/// largest is an Rgetlock or Rreadlink with a
/// [`MAX_PATH_LEN`](crate::protocol::MAX_PATH_LEN) string), and so do most
/// requests.
pub(crate) const SMALL_BUFFER: usize = 8 << 10;

/// Default of [`SocketLimits::max_in_flight`].
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;

/// A connection whose unwritten replies reach this many bytes reads no
/// further request until the client has taken some: a client that does not
/// read its replies makes the server stop reading, and the replies in the
/// making stay few (and warm in the cache) however many requests the client
/// keeps outstanding.
pub(crate) const OUT_HIGH_WATER: usize = 256 << 10;

/// Default of [`SocketLimits::max_requests`]: as many as one vhost-user
/// queue of 1024 entries.
pub const DEFAULT_MAX_REQUESTS: usize = 1024;

/// The errno of the Rlerror a request gets when its tag is in flight on
/// its connection.
pub const DUPLICATE_TAG_ERRNO: i32 = libc::EBUSY;

/// How long a streamed Twrite waits for more of its data before it fails
/// (and its connection is closed).
pub(crate) const STREAM_STALL: Duration = Duration::from_secs(10);

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
        _ => SMALL_BUFFER,
    };
    need.min(limit as usize)
        .max(SMALL_BUFFER.min(limit as usize))
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
        }
    }
}

/// The shared budget for large buffers.
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

/// The buffer pool of one socket thread. A buffer's length is its size
/// (it is zeroed once, when allocated); one above `KEEP_BUFFER` is
/// charged to the budget for as long as it exists, in use or pooled.
struct BufPool {
    /// Free buffers and when each was put back.
    free: Vec<(Vec<u8>, Instant)>,
    budget: Arc<BufferBudget>,
}

impl BufPool {
    /// A buffer of at least `n` bytes (at least `SMALL_BUFFER`), or
    /// `None` when a new one would exceed the budget.
    fn take(&mut self, n: usize) -> Option<Vec<u8>> {
        let n = n.max(SMALL_BUFFER);
        // The smallest free buffer that fits, if it is not far too big.
        let best = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, (b, _))| b.len() >= n && b.len() <= n.saturating_mul(4))
            .min_by_key(|(_, (b, _))| b.len())
            .map(|(i, _)| i);
        if let Some(i) = best {
            return Some(self.free.swap_remove(i).0);
        }
        if n > KEEP_BUFFER && !self.budget.try_take(n) {
            return None;
        }
        // calloc: pages are only touched as the request uses them.
        Some(vec![0u8; n])
    }

    /// Returns `buf`, keeping at most `keep` free buffers.
    fn put(&mut self, buf: Vec<u8>, keep: usize) {
        if self.free.len() < keep {
            self.free.push((buf, Instant::now()));
        } else {
            self.release(buf);
        }
    }

    fn release(&self, buf: Vec<u8>) {
        if buf.len() > KEEP_BUFFER {
            self.budget.give(buf.len());
        }
    }

    /// Frees every pooled buffer; true if there were any.
    fn clear(&mut self) -> bool {
        let any = !self.free.is_empty();
        for (b, _) in std::mem::take(&mut self.free) {
            self.release(b);
        }
        any
    }

    /// Frees the buffers unused for `IDLE_RELEASE`; true if any.
    fn expire(&mut self) -> bool {
        let before = self.free.len();
        let mut kept = Vec::with_capacity(before);
        for (b, since) in std::mem::take(&mut self.free) {
            if since.elapsed() >= IDLE_RELEASE {
                self.release(b);
            } else {
                kept.push((b, since));
            }
        }
        self.free = kept;
        self.free.len() < before
    }

    /// How long until the oldest free buffer expires.
    fn next_expiry(&self) -> Option<Duration> {
        self.free
            .iter()
            .map(|(_, since)| IDLE_RELEASE.saturating_sub(since.elapsed()))
            .min()
    }
}

impl Drop for BufPool {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Hands freed heap pages back to the kernel: glibc otherwise keeps freed
/// chunks below its (dynamic, up to 32 MiB) mmap threshold resident.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free allocator memory to the
    // kernel; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The socket threads of one listener.
struct Hub {
    threads: Vec<ThreadHandle>,
    active: Arc<AtomicUsize>,
}

struct ThreadHandle {
    tx: mpsc::Sender<OwnedFd>,
    wake: EventFd,
    conns: Arc<AtomicUsize>,
}

impl Hub {
    fn start<F: Filesystem + 'static>(
        server: Arc<Server<F>>,
        limits: &SocketLimits,
    ) -> io::Result<Hub> {
        let shared = Shared::new(server, limits)?;
        let active = Arc::new(AtomicUsize::new(0));
        let mut threads = Vec::new();
        for i in 0..limits.threads.max(1) {
            let (tx, rx) = mpsc::channel();
            let wake = EventFd::new(EFD_NONBLOCK)?;
            let conns = Arc::new(AtomicUsize::new(0));
            let ctx = ThreadCtx {
                shared: shared.clone(),
                rx,
                wake: wake.try_clone()?,
                conns: Arc::clone(&conns),
                active: Arc::clone(&active),
            };
            std::thread::Builder::new()
                .name(format!("9p-sock-{i}"))
                .spawn(move || {
                    if let Err(e) = run_thread(ctx, false) {
                        error!("9p: socket thread stopped: {e}");
                    }
                })?;
            threads.push(ThreadHandle { tx, wake, conns });
        }
        Ok(Hub { threads, active })
    }

    /// Hands `fd` to the socket thread with the fewest connections.
    fn add(&self, fd: OwnedFd) -> io::Result<()> {
        let t = self
            .threads
            .iter()
            .min_by_key(|t| t.conns.load(Ordering::Acquire))
            .ok_or_else(|| io::Error::other("no socket thread"))?;
        set_nonblocking(fd.as_raw_fd())?;
        self.active.fetch_add(1, Ordering::AcqRel);
        t.conns.fetch_add(1, Ordering::AcqRel);
        if t.tx.send(fd).is_err() {
            self.active.fetch_sub(1, Ordering::AcqRel);
            t.conns.fetch_sub(1, Ordering::AcqRel);
            return Err(io::Error::other("the socket thread has stopped"));
        }
        t.wake.write(1)
    }
}

/// What every socket thread of a listener shares.
struct Shared<F> {
    server: Arc<Server<F>>,
    budget: Arc<BufferBudget>,
    limits: SocketLimits,
    executor: Option<Arc<dyn Executor>>,
    pool: Arc<StackPool>,
}

impl<F> Clone for Shared<F> {
    fn clone(&self) -> Self {
        Shared {
            server: Arc::clone(&self.server),
            budget: Arc::clone(&self.budget),
            limits: self.limits.clone(),
            executor: self.executor.clone(),
            pool: Arc::clone(&self.pool),
        }
    }
}

impl<F: Filesystem + 'static> Shared<F> {
    fn new(server: Arc<Server<F>>, limits: &SocketLimits) -> io::Result<Self> {
        let executor: Option<Arc<dyn Executor>> = if limits.workers > 0 {
            Some(Arc::new(ThreadPool::new(limits.workers, None)?))
        } else {
            None
        };
        let pool = StackPool::new(PoolConfig::default().stack_size(DEFAULT_STACK_SIZE))
            .map_err(io::Error::other)?;
        Ok(Shared {
            server,
            budget: BufferBudget::new(limits.buffer_bytes),
            limits: limits.clone(),
            executor,
            pool: Arc::new(pool),
        })
    }
}

struct ThreadCtx<F> {
    shared: Shared<F>,
    rx: mpsc::Receiver<OwnedFd>,
    wake: EventFd,
    conns: Arc<AtomicUsize>,
    active: Arc<AtomicUsize>,
}

/// Serves one client on `stream` on the calling thread, on an engine of
/// its own (with the default [`SocketLimits`]), until it hangs up (`Ok`)
/// or breaks the framing (`Err`). [`Listener::serve_with`] is what the
/// daemon runs; this is the same loop for one connection.
pub fn serve_connection<F, S>(server: &Arc<Server<F>>, stream: S) -> io::Result<()>
where
    F: Filesystem + 'static,
    S: AsFd,
{
    let fd = stream.as_fd().try_clone_to_owned()?;
    drop(stream);
    set_nonblocking(fd.as_raw_fd())?;
    let limits = SocketLimits::default();
    let shared = Shared::new(Arc::clone(server), &limits)?;
    let (tx, rx) = mpsc::channel();
    let wake = EventFd::new(EFD_NONBLOCK)?;
    tx.send(fd)
        .map_err(|_| io::Error::other("channel closed"))?;
    wake.write(1)?;
    let ctx = ThreadCtx {
        shared,
        rx,
        wake,
        conns: Arc::new(AtomicUsize::new(1)),
        active: Arc::new(AtomicUsize::new(1)),
    };
    run_thread(ctx, true)
}

/// Epoll data of the thread's own fds; connections use their id.
const EV_NEW: u64 = 0;
const EV_ENGINE: u64 = 1;
/// The first connection id.
const FIRST_CONN: u32 = 16;

/// The input state of a connection.
enum Input {
    /// Reading the 7-byte header.
    Header { hdr: [u8; HEADER_SIZE], have: usize },
    /// Reading the rest of a frame into `buf`.
    Body {
        buf: Vec<u8>,
        size: usize,
        have: usize,
    },
    /// Reading the fixed part of a large Twrite (streamed after it).
    TwriteHead {
        head: [u8; TWRITE_HEAD],
        have: usize,
    },
    /// A streamed Twrite owns the socket's input until it finishes.
    Streaming,
    /// Dropping `left` bytes of a frame, then answering `tag` with
    /// `errno` (if any).
    Skip {
        left: u64,
        answer: Option<(u16, u32)>,
    },
}

/// Header plus `fid[4] offset[8] count[4]` of a Twrite.
const TWRITE_HEAD: usize = HEADER_SIZE + 16;

impl Input {
    fn header() -> Input {
        Input::Header {
            hdr: [0; HEADER_SIZE],
            have: 0,
        }
    }
}

/// One reply waiting to be written: `buf[..len]`, then the spliced data
/// of an Rread.
struct Out {
    buf: Vec<u8>,
    len: usize,
    /// Whether `buf` came from the pool.
    pooled: bool,
    tail: Option<Tail>,
}

impl Out {
    /// Bytes of the whole reply.
    fn total(&self) -> usize {
        self.len + self.tail.as_ref().map_or(0, |t| t.len)
    }
}

struct Conn<F: Filesystem> {
    sock: Arc<File>,
    session: Arc<Session<F>>,
    input: Input,
    out: VecDeque<Out>,
    /// Bytes of the front reply already written.
    out_pos: usize,
    /// Requests started, or answered and not yet written.
    in_flight: usize,
    /// Bytes of the replies waiting to be written.
    out_bytes: usize,
    /// The epoll events registered now.
    interest: EventSet,
}

/// What a request hands back to its socket thread when it finishes.
#[derive(Default)]
struct Handoff {
    request: Cell<Option<Vec<u8>>>,
    reply: Cell<Option<Vec<u8>>>,
    /// An Rread's data, spliced into a pipe.
    spliced: Cell<Option<Filled>>,
}

/// A request in flight, by its engine token.
struct Req {
    conn: u32,
    handoff: Rc<Handoff>,
    /// For a streamed Twrite: the frame bytes it did not consume.
    stream_left: Option<Arc<AtomicUsize>>,
}

/// Why a connection ends.
enum Close {
    /// The client hung up.
    HungUp,
    /// A framing or socket error.
    Failed(io::Error),
}

struct Loop<F: Filesystem> {
    shared: Shared<F>,
    epoll: Epoll,
    engine: Engine,
    exec: EngineExec,
    conns: HashMap<u32, Conn<F>>,
    next_conn: u32,
    reqs: Vec<Option<Req>>,
    free_tokens: Vec<u16>,
    /// Requests of this thread in flight (all connections).
    live: usize,
    /// Replies in pooled buffers waiting to be written.
    queued: usize,
    /// Most requests this thread runs at once (its share of
    /// [`SocketLimits::max_requests`]).
    thread_cap: usize,
    /// Connections left unread because the thread was at `thread_cap`.
    starved: Vec<u32>,
    bufs: BufPool,
    /// Pipes for spliced Rreads, shared with this thread's requests.
    pipes: SharedPipes,
    done: Vec<(u16, u32)>,
    /// Connections whose output or interest may need work.
    dirty: Vec<u32>,
    /// Why the last connection that failed ended (for [`serve_connection`]).
    last_error: Option<io::Error>,
    ctx_rx: mpsc::Receiver<OwnedFd>,
    ctx_wake: EventFd,
    conns_count: Arc<AtomicUsize>,
    active: Arc<AtomicUsize>,
}

/// `read(2)` on a nonblocking socket: `Ok(None)` for `EAGAIN`.
fn read_some(sock: &File, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        match (&*sock).read(buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `send(2)` without SIGPIPE: `Ok(None)` for `EAGAIN`; with `more`, the
/// rest of the message follows (`MSG_MORE`).
pub(super) fn send_fd(sock: BorrowedFd<'_>, buf: &[u8], more: bool) -> io::Result<Option<usize>> {
    let more = if more { libc::MSG_MORE } else { 0 };
    loop {
        // SAFETY: `buf` is valid for reads of its length for the call; the
        // fd is borrowed.
        let n = unsafe {
            libc::send(
                sock.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT | more,
            )
        };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(None),
            io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
}

fn run_thread<F: Filesystem + 'static>(ctx: ThreadCtx<F>, single: bool) -> io::Result<()> {
    // Splices into sockets raise SIGPIPE on a hang-up: keep it pending on
    // this thread (and take it) rather than let it reach the process.
    let _sigpipe = SigpipeBlocked::new();
    let limits = &ctx.shared.limits;
    let thread_cap = limits
        .max_requests
        .div_ceil(limits.threads.max(1))
        .clamp(1, usize::from(u16::MAX) - 1);
    let engine_config = EngineConfig {
        workers: 0,
        executor: ctx.shared.executor.clone(),
        max_in_flight: thread_cap,
        ..EngineConfig::default()
    };
    let engine =
        Engine::new(Arc::clone(&ctx.shared.pool), &engine_config).map_err(io::Error::other)?;
    let epoll = Epoll::new()?;
    epoll.ctl(
        ControlOperation::Add,
        ctx.wake.as_raw_fd(),
        EpollEvent::new(EventSet::IN, EV_NEW),
    )?;
    for fd in engine.fds() {
        epoll.ctl(
            ControlOperation::Add,
            fd,
            EpollEvent::new(EventSet::IN, EV_ENGINE),
        )?;
    }
    let mut l = Loop {
        bufs: BufPool {
            free: Vec::new(),
            budget: Arc::clone(&ctx.shared.budget),
        },
        pipes: Arc::new(Mutex::new(PipePool::new(splice::MAX_PIPES))),
        shared: ctx.shared,
        epoll,
        engine,
        exec: EngineExec::new(engine_config.offload),
        conns: HashMap::new(),
        next_conn: FIRST_CONN,
        reqs: Vec::new(),
        free_tokens: Vec::new(),
        live: 0,
        thread_cap,
        queued: 0,
        starved: Vec::new(),
        done: Vec::new(),
        dirty: Vec::new(),
        last_error: None,
        ctx_rx: ctx.rx,
        ctx_wake: ctx.wake,
        conns_count: ctx.conns,
        active: ctx.active,
    };
    l.run(single)
}

impl<F: Filesystem + 'static> Loop<F> {
    /// Serves until the thread's channel closes, or with `single` until
    /// its one connection ends (with that connection's result).
    fn run(&mut self, single: bool) -> io::Result<()> {
        let mut events = vec![EpollEvent::default(); 64];
        let mut served_one = false;
        loop {
            let pipes = splice::lock(&self.pipes).next_expiry();
            let timeout = match self.bufs.next_expiry().into_iter().chain(pipes).min() {
                Some(left) => left.as_millis().clamp(1, i32::MAX as u128) as i32,
                None => -1,
            };
            let n = match self.epoll.wait(timeout, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            for ev in &events[..n] {
                match ev.data() {
                    EV_NEW => {
                        let _ = self.ctx_wake.read();
                        while let Ok(fd) = self.ctx_rx.try_recv() {
                            served_one = true;
                            self.open(fd);
                        }
                    }
                    EV_ENGINE => self.engine.poll(),
                    id => self.on_conn_event(id as u32, ev.event_set()),
                }
            }
            self.collect();
            self.settle();
            if single && served_one && self.conns.is_empty() {
                // Let the requests of the closed connection return.
                while self.live > 0 {
                    self.engine.poll();
                    self.collect();
                    if self.live > 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                return self.last_error.take().map_or(Ok(()), Err);
            }
        }
    }

    fn open(&mut self, fd: OwnedFd) {
        let id = self.next_conn;
        self.next_conn = self.next_conn.checked_add(1).unwrap_or(FIRST_CONN);
        let sock = Arc::new(File::from(fd));
        if let Err(e) = self.epoll.ctl(
            ControlOperation::Add,
            sock.as_raw_fd(),
            EpollEvent::new(EventSet::IN, u64::from(id)),
        ) {
            error!("9p: cannot watch a new connection: {e}");
            self.conns_count.fetch_sub(1, Ordering::AcqRel);
            self.active.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        if self.shared.server.log_limit().admit() {
            info!("9p: connection {id} opened");
        }
        self.conns.insert(
            id,
            Conn {
                sock,
                session: Arc::new(Session::new()),
                input: Input::header(),
                out: VecDeque::new(),
                out_pos: 0,
                in_flight: 0,
                out_bytes: 0,
                interest: EventSet::IN,
            },
        );
    }

    fn close(&mut self, id: u32, why: Close) {
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        let _ = self.epoll.ctl(
            ControlOperation::Delete,
            conn.sock.as_raw_fd(),
            EpollEvent::default(),
        );
        let left = self.engine.cancel_group(id);
        match why {
            Close::HungUp => {
                if self.shared.server.log_limit().admit() {
                    info!("9p: connection {id} closed");
                }
            }
            Close::Failed(e) => {
                if self.shared.server.log_limit().admit() {
                    warn!("9p: connection {id} ended: {e}");
                }
                self.last_error = Some(e);
            }
        }
        if left > 0 {
            debug!("9p: connection {id}: {left} requests still in filesystem calls");
        }
        for o in conn.out {
            if o.pooled {
                self.queued -= 1;
                self.bufs.put(o.buf, self.keep());
            }
        }
        self.conns_count.fetch_sub(1, Ordering::AcqRel);
        self.active.fetch_sub(1, Ordering::AcqRel);
    }

    fn on_conn_event(&mut self, id: u32, ev: EventSet) {
        if ev.contains(EventSet::OUT) {
            self.dirty.push(id);
        }
        if ev.intersects(EventSet::IN | EventSet::HANG_UP | EventSet::ERROR) {
            if let Err(why) = self.read_conn(id) {
                self.close(id, why);
                return;
            }
            if ev.intersects(EventSet::HANG_UP | EventSet::ERROR) {
                // Nothing more to read and nowhere to write.
                if self.conns.get(&id).is_some_and(|c| !self.can_read(c)) {
                    self.close(id, Close::HungUp);
                }
            }
        }
    }

    /// Free buffers the pool may keep: a request and a reply buffer for
    /// each request in flight, and a few more.
    fn keep(&self) -> usize {
        2 * (self.live + self.queued) + 4
    }

    fn can_read(&self, c: &Conn<F>) -> bool {
        c.in_flight < self.shared.limits.max_in_flight.max(1)
            && c.out_bytes < OUT_HIGH_WATER
            && self.live < self.thread_cap
            && !matches!(c.input, Input::Streaming)
    }

    /// Reads and starts what the socket holds, up to the in-flight limit.
    fn read_conn(&mut self, id: u32) -> std::result::Result<(), Close> {
        // A bounded number of frames per wakeup keeps connections fair.
        for _ in 0..64 {
            // Send what finished at once (a cached read runs inline), so
            // the client reads replies while the next requests run.
            self.collect();
            self.flush_out(id).map_err(Close::Failed)?;
            let Some(c) = self.conns.get_mut(&id) else {
                return Ok(());
            };
            if c.in_flight >= self.shared.limits.max_in_flight.max(1)
                || c.out_bytes >= OUT_HIGH_WATER
                || matches!(c.input, Input::Streaming)
            {
                break;
            }
            if self.live >= self.thread_cap {
                // Read again once a request of this thread finishes.
                self.starved.push(id);
                self.dirty.push(id);
                break;
            }
            let sock = Arc::clone(&c.sock);
            match &mut c.input {
                Input::Header { hdr, have } => {
                    let Some(n) = read_some(&sock, &mut hdr[*have..]).map_err(Close::Failed)?
                    else {
                        break;
                    };
                    if n == 0 {
                        return Err(Close::HungUp);
                    }
                    *have += n;
                    if *have < HEADER_SIZE {
                        continue;
                    }
                    let hdr = *hdr;
                    self.on_header(id, hdr)?;
                }
                Input::Body { buf, size, have } => {
                    let Some(n) =
                        read_some(&sock, &mut buf[*have..*size]).map_err(Close::Failed)?
                    else {
                        break;
                    };
                    if n == 0 {
                        return Err(Close::HungUp);
                    }
                    *have += n;
                    if *have == *size {
                        let (size, buf) = (*size, std::mem::take(buf));
                        c.input = Input::header();
                        self.start(id, buf, size);
                    }
                }
                Input::TwriteHead { head, have } => {
                    let Some(n) = read_some(&sock, &mut head[*have..]).map_err(Close::Failed)?
                    else {
                        break;
                    };
                    if n == 0 {
                        return Err(Close::HungUp);
                    }
                    *have += n;
                    if *have == TWRITE_HEAD {
                        let head = *head;
                        c.input = Input::Streaming;
                        self.start_stream(id, head);
                    }
                }
                Input::Skip { left, answer } => {
                    if *left > 0 {
                        let mut scratch = [0u8; 8192];
                        let want = scratch.len().min(*left as usize);
                        let Some(n) =
                            read_some(&sock, &mut scratch[..want]).map_err(Close::Failed)?
                        else {
                            break;
                        };
                        if n == 0 {
                            return Err(Close::HungUp);
                        }
                        *left -= n as u64;
                    }
                    if *left == 0 {
                        let answer = answer.take();
                        c.input = Input::header();
                        if let Some((tag, errno)) = answer {
                            self.answer_now(id, tag, errno);
                        }
                    }
                }
                Input::Streaming => break,
            }
        }
        Ok(())
    }

    /// A whole header arrived: check the frame size and pick how to read
    /// the rest.
    fn on_header(&mut self, id: u32, hdr: [u8; HEADER_SIZE]) -> std::result::Result<(), Close> {
        let Some(c) = self.conns.get_mut(&id) else {
            return Ok(());
        };
        let h = Header::from_bytes(&hdr);
        let size = h.size as usize;
        // A Tversion may announce any msize, but the frame itself is tiny.
        let limit = c.session.frame_limit();
        if size < HEADER_SIZE || h.size > limit {
            if self.shared.server.log_limit().admit() {
                warn!("9p: closing connection {id}: frame size {size} outside 7..={limit}");
            }
            return Err(Close::Failed(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame size {size} outside 7..={limit}"),
            )));
        }
        if h.ty == TWRITE && size > KEEP_BUFFER {
            let mut head = [0u8; TWRITE_HEAD];
            head[..HEADER_SIZE].copy_from_slice(&hdr);
            c.input = Input::TwriteHead {
                head,
                have: HEADER_SIZE,
            };
            return Ok(());
        }
        let Some(mut buf) = self.bufs.take(size) else {
            // Over the shared budget: drop the frame, answer ENOMEM.
            if self.shared.server.log_limit().admit() {
                warn!(
                    "9p: request of {size} bytes (tag {}) refused: connection buffers are at their limit",
                    h.tag
                );
            }
            c.input = Input::Skip {
                left: (size - HEADER_SIZE) as u64,
                answer: Some((h.tag, libc::ENOMEM as u32)),
            };
            return Ok(());
        };
        buf[..HEADER_SIZE].copy_from_slice(&hdr);
        if size == HEADER_SIZE {
            self.start(id, buf, size);
        } else {
            c.input = Input::Body {
                buf,
                size,
                have: HEADER_SIZE,
            };
        }
        Ok(())
    }

    /// Queues an Rlerror for `tag` without running anything.
    fn answer_now(&mut self, id: u32, tag: u16, errno: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let frame = Rmessage::Lerror(errno).encode_frame(tag);
        let len = frame.len();
        c.in_flight += 1;
        c.out_bytes += len;
        c.out.push_back(Out {
            buf: frame,
            len,
            pooled: false,
            tail: None,
        });
        self.dirty.push(id);
    }

    fn token(&mut self, req: Req) -> Option<u16> {
        let t = match self.free_tokens.pop() {
            Some(t) => t,
            None if self.reqs.len() < usize::from(u16::MAX) => {
                self.reqs.push(None);
                (self.reqs.len() - 1) as u16
            }
            None => return None,
        };
        self.reqs[usize::from(t)] = Some(req);
        Some(t)
    }

    /// Runs the buffered request `buf[..size]` on the engine.
    fn start(&mut self, id: u32, buf: Vec<u8>, size: usize) {
        let Some(c) = self.conns.get(&id) else {
            self.bufs.put(buf, self.keep());
            return;
        };
        let h = Header::from_bytes(buf[..HEADER_SIZE].try_into().unwrap_or(&[0; HEADER_SIZE]));
        if self.engine.has_tag(id, h.tag) {
            if self.shared.server.log_limit().admit() {
                warn!("9p: connection {id}: tag {} is already in flight", h.tag);
            }
            self.bufs.put(buf, self.keep());
            self.answer_now(id, h.tag, DUPLICATE_TAG_ERRNO as u32);
            return;
        }
        let limit = c.session.frame_limit();
        let mut room = reply_room(&buf[..size], limit);
        let reply = match self.bufs.take(room) {
            Some(r) => r,
            None => {
                // A shorter Rread/Rreaddir, as POSIX allows.
                room = KEEP_BUFFER.min(limit as usize);
                match self.bufs.take(room) {
                    Some(r) => r,
                    None => {
                        self.bufs.put(buf, self.keep());
                        self.answer_now(id, h.tag, libc::ENOMEM as u32);
                        return;
                    }
                }
            }
        };
        let server = Arc::clone(&self.shared.server);
        let session = Arc::clone(&c.session);
        let exec = self.exec;
        let handoff = Rc::new(Handoff::default());
        let back = Rc::clone(&handoff);
        // An Rread may go out as its header plus a spliced file range.
        let splicer = (h.ty == TREAD && self.shared.limits.splice_reads)
            .then(|| Splicer::new(Arc::clone(&self.pipes)));
        let task = move |cancel: Cancel| {
            let mut reply = reply;
            let r = server.handle(
                &session,
                &mut SliceReader::new(&buf[..size]),
                &mut SockWriter::new(&mut reply[..room], splicer.as_ref()),
                &exec,
                &cancel,
            );
            back.request.set(Some(buf));
            back.reply.set(Some(reply));
            back.spliced.set(splicer.as_ref().and_then(Splicer::take));
            reply_len(r, &cancel)
        };
        self.spawn(id, h.tag, handoff, None, task);
    }

    /// Runs a large Twrite whose data is read from the socket as the
    /// filesystem consumes it.
    fn start_stream(&mut self, id: u32, head: [u8; TWRITE_HEAD]) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let h = Header::from_bytes(head[..HEADER_SIZE].try_into().unwrap_or(&[0; HEADER_SIZE]));
        let left = Arc::new(AtomicUsize::new(h.size as usize));
        // Small buffers are never refused.
        let reply = self
            .bufs
            .take(SMALL_BUFFER)
            .unwrap_or_else(|| vec![0u8; SMALL_BUFFER]);
        if self.engine.has_tag(id, h.tag) {
            if self.shared.server.log_limit().admit() {
                warn!("9p: connection {id}: tag {} is already in flight", h.tag);
            }
            self.bufs.put(reply, self.keep());
            // Skip its data, then answer.
            if let Some(c) = self.conns.get_mut(&id) {
                c.input = Input::Skip {
                    left: (h.size as usize - TWRITE_HEAD) as u64,
                    answer: Some((h.tag, DUPLICATE_TAG_ERRNO as u32)),
                };
            }
            return;
        }
        let server = Arc::clone(&self.shared.server);
        let session = Arc::clone(&c.session);
        let sock = Arc::clone(&c.sock);
        let exec = self.exec;
        let handoff = Rc::new(Handoff::default());
        let back = Rc::clone(&handoff);
        let stream_left = Arc::clone(&left);
        let task = move |cancel: Cancel| {
            let mut reply = reply;
            let mut req = StreamRequest {
                head,
                pos: 0,
                sock,
                left: stream_left,
                cancel: cancel.clone(),
            };
            let r = server.handle(
                &session,
                &mut req,
                &mut SockWriter::new(&mut reply[..SMALL_BUFFER], None),
                &exec,
                &cancel,
            );
            back.reply.set(Some(reply));
            reply_len(r, &cancel)
        };
        self.spawn(id, h.tag, handoff, Some(left), task);
    }

    fn spawn(
        &mut self,
        id: u32,
        tag: u16,
        handoff: Rc<Handoff>,
        stream_left: Option<Arc<AtomicUsize>>,
        task: impl FnOnce(Cancel) -> u32 + 'static,
    ) {
        let streaming = stream_left.is_some();
        let Some(token) = self.token(Req {
            conn: id,
            handoff: Rc::clone(&handoff),
            stream_left,
        }) else {
            if self.shared.server.log_limit().admit() {
                warn!("9p: connection {id}: no request slot for tag {tag}");
            }
            self.answer_now(id, tag, libc::EAGAIN as u32);
            return;
        };
        if let Some(c) = self.conns.get_mut(&id) {
            c.in_flight += 1;
        }
        self.live += 1;
        // Its interest may change (in-flight limit, streaming).
        self.dirty.push(id);
        let cancel = Cancel::new();
        let token_cancel = cancel.clone();
        if let Err(e) = self
            .engine
            .spawn_in(id, token, Some(tag), cancel, move || task(token_cancel))
        {
            // The task (and its buffers) is dropped unrun.
            error!("9p: connection {id}: cannot start tag {tag}: {e}");
            self.reqs[usize::from(token)] = None;
            self.free_tokens.push(token);
            self.live -= 1;
            if let Some(c) = self.conns.get_mut(&id) {
                c.in_flight -= 1;
                if streaming {
                    c.input = Input::header();
                    // The frame cannot be skipped reliably: end it.
                    self.close(
                        id,
                        Close::Failed(io::Error::other("cannot start a streamed Twrite")),
                    );
                    return;
                }
            }
            self.answer_now(id, tag, libc::ENOMEM as u32);
        }
    }

    /// Routes finished requests to their connections' output.
    fn collect(&mut self) {
        self.engine.take_completed(&mut self.done);
        let done = std::mem::take(&mut self.done);
        for &(token, len) in &done {
            let Some(req) = self.reqs.get_mut(usize::from(token)).and_then(Option::take) else {
                continue;
            };
            self.free_tokens.push(token);
            self.live -= 1;
            if let Some(b) = req.handoff.request.take() {
                self.bufs.put(b, self.keep());
            }
            let reply = req.handoff.reply.take();
            let spliced = req.handoff.spliced.take();
            let Some(c) = self.conns.get_mut(&req.conn) else {
                if let Some(b) = reply {
                    self.bufs.put(b, self.keep());
                }
                continue;
            };
            if let Some(left) = &req.stream_left {
                // The rest of the streamed frame (an error before its
                // data) is skipped, not parsed.
                c.input = Input::Skip {
                    left: left.load(Ordering::Acquire) as u64,
                    answer: None,
                };
            }
            match reply {
                Some(mut buf) if len > 0 && len as usize <= buf.len() => {
                    let (len, tail) = match spliced {
                        Some(f) => rread_tail(&mut buf, len as usize, f),
                        None => (len as usize, None),
                    };
                    self.queued += 1;
                    let out = Out {
                        buf,
                        len,
                        pooled: true,
                        tail,
                    };
                    c.out_bytes += out.total();
                    c.out.push_back(out);
                }
                other => {
                    // Flushed before it answered, or not answerable.
                    c.in_flight -= 1;
                    if let Some(b) = other {
                        self.bufs.put(b, self.keep());
                    }
                }
            }
            self.dirty.push(req.conn);
        }
        self.done = done;
        self.done.clear();
        if self.live < self.thread_cap && !self.starved.is_empty() {
            let starved = std::mem::take(&mut self.starved);
            self.dirty.extend(starved);
        }
    }

    /// Writes queued replies, resumes reading where a slot freed, updates
    /// the epoll interest, and frees the pool once idle.
    fn settle(&mut self) {
        while !self.dirty.is_empty() {
            let mut dirty = std::mem::take(&mut self.dirty);
            dirty.sort_unstable();
            dirty.dedup();
            for id in dirty {
                if let Err(e) = self.flush_out(id) {
                    self.close(id, Close::Failed(e));
                    continue;
                }
                let Some(c) = self.conns.get(&id) else {
                    continue;
                };
                let readable = self.can_read(c);
                if readable {
                    // A slot freed: read what waits in the socket (level
                    // triggered epoll would also tell us).
                    if let Err(why) = self.read_conn(id) {
                        self.close(id, why);
                        continue;
                    }
                }
                self.update_interest(id);
            }
            self.collect();
        }
        // Buffers unused for IDLE_RELEASE go back to the kernel, whether
        // or not other connections of the thread are busy.
        splice::lock(&self.pipes).expire();
        if self.bufs.expire() {
            trim_heap();
            if self.live == 0 {
                self.shared.pool.trim();
            }
        }
    }

    fn flush_out(&mut self, id: u32) -> io::Result<()> {
        let keep = self.keep();
        let Some(c) = self.conns.get_mut(&id) else {
            return Ok(());
        };
        let log = self.shared.server.log_limit();
        while let Some(front) = c.out.front_mut() {
            if c.out_pos < front.len {
                let more = front.tail.is_some();
                let Some(n) = send_fd(c.sock.as_fd(), &front.buf[c.out_pos..front.len], more)?
                else {
                    break;
                };
                c.out_pos += n;
                continue;
            }
            if let Some(t) = front.tail.as_mut().filter(|t| t.left > 0) {
                // The header is out: now the pipe (kept while the socket
                // is full).
                let Some(n) = splice::splice_out(t, c.sock.as_fd(), || log.admit())? else {
                    break;
                };
                t.left -= n;
                continue;
            }
            c.out_pos = 0;
            c.in_flight -= 1;
            c.out_bytes -= front.total();
            if let Some(o) = c.out.pop_front() {
                if let Some(Tail {
                    pipe: Some(pipe), ..
                }) = o.tail
                {
                    // Sent in full: empty.
                    splice::lock(&self.pipes).put(pipe, true);
                }
                if o.pooled {
                    self.queued -= 1;
                    self.bufs.put(o.buf, keep);
                }
            }
        }
        Ok(())
    }

    fn update_interest(&mut self, id: u32) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let mut want = EventSet::empty();
        if self.can_read(c) {
            want |= EventSet::IN;
        }
        if !c.out.is_empty() {
            want |= EventSet::OUT;
        }
        if want == c.interest {
            return;
        }
        let fd = c.sock.as_raw_fd();
        if let Err(e) = self.epoll.ctl(
            ControlOperation::Modify,
            fd,
            EpollEvent::new(want, u64::from(id)),
        ) {
            error!("9p: connection {id}: cannot update its epoll events: {e}");
        }
        if let Some(c) = self.conns.get_mut(&id) {
            c.interest = want;
        }
    }
}

impl<F: Filesystem> Drop for Loop<F> {
    fn drop(&mut self) {
        // Cancel everything; the engine's own drop waits (bounded).
        for id in self.conns.keys().copied().collect::<Vec<_>>() {
            self.engine.cancel_group(id);
        }
    }
}

/// An Rread whose data was spliced into a pipe: the bytes of `buf` to
/// send (its header) and the pipe to send after them. A reply that is not
/// that Rread (the filesystem failed after the splice, or reported
/// another count) drops the pipe; a mismatched Rread becomes an `EIO`
/// Rlerror, since its data is not in the buffer.
fn rread_tail(buf: &mut [u8], len: usize, f: Filled) -> (usize, Option<Tail>) {
    const RHDR: usize = HEADER_SIZE + 4;
    let is_rread = buf.get(4) == Some(&u8::from(MsgType::Rread));
    let count = buf
        .get(HEADER_SIZE..RHDR)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize);
    if is_rread && len == RHDR + f.len && count == Some(f.len) {
        let tail = Tail {
            pipe: Some(f.pipe),
            left: f.len,
            len: f.len,
        };
        return (RHDR, Some(tail));
    }
    if !is_rread {
        return (len, None);
    }
    error!("9p: an Rread's count does not match its spliced data; answering EIO");
    let tag = u16::from_le_bytes([buf[5], buf[6]]);
    let frame = Rmessage::Lerror(libc::EIO as u32).encode_frame(tag);
    buf[..frame.len()].copy_from_slice(&frame);
    (frame.len(), None)
}

/// The reply length of a finished request: 0 (no reply) when it was
/// flushed before it answered, or could not be answered at all.
fn reply_len(r: Result<crate::server::Reply>, cancel: &Cancel) -> u32 {
    match r {
        Ok(reply) if engine::flushed_silently(reply.reply_type, cancel) => 0,
        Ok(reply) => reply.size,
        Err(e) => {
            warn!("9p: request not answered: {e}");
            0
        }
    }
}

/// A large Twrite read from the socket as the server consumes it: the
/// head already read, then at most the rest of the frame. It runs where
/// the filesystem call runs (a worker, by default), and waits for data
/// with `poll`, for at most `STREAM_STALL` without progress, and not at
/// all once the request is cancelled.
struct StreamRequest {
    head: [u8; TWRITE_HEAD],
    pos: usize,
    sock: Arc<File>,
    /// Bytes of the frame not consumed yet, head included.
    left: Arc<AtomicUsize>,
    cancel: Cancel,
}

impl StreamRequest {
    fn wait_readable(&self) -> io::Result<()> {
        let deadline = Instant::now() + STREAM_STALL;
        loop {
            if self.cancel.is_cancelled() {
                return Err(io::Error::from_raw_os_error(libc::EINTR));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "client stopped sending its Twrite data",
                ));
            }
            if readable_within(self.sock.as_fd(), (deadline - now).min(POLL_STEP))? {
                return Ok(());
            }
        }
    }
}

/// How often a waiting [`StreamRequest`] checks for cancellation.
const POLL_STEP: Duration = Duration::from_millis(100);

impl Read for StreamRequest {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left.load(Ordering::Acquire);
        if left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let n = if self.pos < TWRITE_HEAD {
            let n = buf.len().min(TWRITE_HEAD - self.pos);
            buf[..n].copy_from_slice(&self.head[self.pos..self.pos + n]);
            self.pos += n;
            n
        } else {
            let want = buf.len().min(left);
            loop {
                match read_some(&self.sock, &mut buf[..want])? {
                    Some(0) => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "client hung up mid-message",
                        ))
                    }
                    Some(n) => break n,
                    None => self.wait_readable()?,
                }
            }
        };
        self.left.store(left - n, Ordering::Release);
        Ok(n)
    }
}

impl RequestReader for StreamRequest {
    fn available_bytes(&self) -> usize {
        self.left.load(Ordering::Acquire)
    }
}

/// Waits up to `timeout` for `fd` to become readable (or hung up).
fn readable_within(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
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
