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
//! - **Tversion** aborts the connection's requests in flight, as 9P says:
//!   they are cancelled, and the Tversion runs (resetting the session)
//!   once the last of them has returned, so no reply of an old request
//!   follows the Rversion.
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
//! # Fairness
//!
//! A socket thread runs at most `max_requests / threads` requests at
//! once (its slots: 512 with the defaults on 2 threads). Requests hold
//! their slot until they return, which for a blocking Tlock may be a long
//! time, so the slots are shared out so that no client can take them
//! from the others:
//!
//! - **First slots.** `max_connections / threads` slots (at most half of
//!   them; 128 of 512 with the defaults) are kept for connections that
//!   have nothing running: a connection's first request always finds a
//!   slot, however many the others hold. So a new client's Tversion and
//!   Tattach, or a client's single Tgetattr, are never queued behind a
//!   flood (with `max_requests >= max_connections`, true of the
//!   defaults).
//! - **A connection's share.** A connection holds at most
//!   `min(max_in_flight, 1 + shared / 2)` slots (64 with the defaults,
//!   `shared` being the slots that are not first slots), and at most
//!   `max_in_flight` requests started or unwritten; past that its further
//!   requests wait in its socket.
//! - **Turns.** A connection that finds no free slot waits in the thread's
//!   queue (its socket is not read meanwhile, it is never dropped from
//!   it): each freed slot goes to the next connection in the queue, which
//!   starts one request and goes to the back if it has more. No
//!   connection is left unread while it has data and the thread has a
//!   slot for it.
//!
//! - **Worker turns.** Requests whose filesystem call always runs on a
//!   worker (Tattach, Tlopen, Tlcreate, Treaddir, a buffered Twrite and
//!   the calls that change the tree) take turns: a socket thread runs at
//!   most `2 × workers / threads` of them at once (8 with the defaults on
//!   2 threads), enough to keep the shared workers busy, and the next
//!   waits in the thread's worker queue, holding its slot, with its
//!   connection read no further meanwhile. A connection with nothing else
//!   running goes to the front of that queue; the others take one turn
//!   each in order. So the workers' own queue stays short, and a fresh
//!   client's Tattach waits behind a handful of calls, not behind every
//!   Tlopen of a flood.
//!
//! The limits, all named: per connection `max_in_flight` (64) and the
//! share above; per thread its slots, first slots and worker turns; per listener
//! `max_requests` (1024), `buffer_bytes` (512 MiB) and `max_connections`
//! (256, refused at accept: one local client can hold them all).
//!
//! # Slow senders
//!
//! No socket thread or worker ever waits for a client's bytes. Frames up
//! to `KEEP_BUFFER` (and any frame but a Twrite) are read into a buffer by
//! the connection's event loop and start when complete. A larger Twrite
//! is streamed: its request reads the data from the socket itself, a
//! chunk of `STREAM_CHUNK` (256 KiB, charged to the budget; 64 KiB when
//! the budget is spent) at a time, on its coroutine, pausing on the
//! engine's timer while the socket is empty (no thread held), and hands
//! each full chunk to one filesystem call (a worker), which only copies
//! bytes already received. An xattr Twrite is read whole (at most the
//! xattr size limit) before it takes the xattr writer's lock.
//!
//! A request must arrive at a minimum rate: once
//! [`SocketLimits::request_grace`] (10 s) has passed since its first byte,
//! it must have kept up [`SocketLimits::min_request_rate`] (16 KiB/s) over
//! the time since, or the connection is closed. The deadline counts from
//! the first byte and is never restarted by later bytes, so a client
//! sending a byte a second holds its slot and buffer for the grace period,
//! not for ever. A connection between requests (idle) has no deadline.
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
//! not buffered whole: its data goes from the socket to the file chunk by
//! chunk (see "Slow senders"), and the connection reads nothing else
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
//!   the header, so the header's count is exactly what the pipe holds.
//! - **No invented bytes.** Just before the header goes out, the file's
//!   size is checked again (`statx`, cached attributes: no round trip to
//!   a network filesystem): a file that shrank since the fill cuts the
//!   reply to the bytes still there, header count included. Pages the
//!   kernel drops from the pipe after the header went out (a truncation
//!   can) are sent from the file as it is then (`preadv2(RWF_NOWAIT)`);
//!   if the file no longer has them, the connection is closed (logged):
//!   a promised count is never filled with bytes that were not in the
//!   file.
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
//!   reply is sent, with a duplicate of the file's fd (for the checks
//!   above), then kept free for `IDLE_RELEASE` and closed: idle
//!   connections hold none. No pipe or fd to be had (the cap, `EMFILE`, a
//!   size the kernel refuses) means the copy path. See [`crate::bound`]
//!   for the fds.
//! - **Copy path.** `pread` into the reply buffer and `send`, as before,
//!   for ranges under 16 KiB or over 1 MiB, files that are not regular,
//!   Treaddir and xattr reads, filesystems that are not fd-backed, and a
//!   filesystem that writes other bytes around the range (the spliced
//!   part is then read back into the buffer, so the order holds).
//! - **Lifetime.** The pipe holds references to the file's pages and the
//!   reply its own fd, so the fid may be clunked by another request at
//!   any time after the fill. A write to the file between the fill and
//!   the client's receive may show in the data, as for any splice; so may
//!   the zeros a truncation writes into the tail of a page-cache folio it
//!   cuts through, as for any read racing that truncation.
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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
use crate::protocol::{
    Header, MsgType, Rmessage, HEADER_SIZE, TATTACH, TFSYNC, TLCREATE, TLINK, TLOPEN, TMKDIR,
    TMKNOD, TREAD, TREADDIR, TREMOVE, TRENAME, TRENAMEAT, TSETATTR, TSYMLINK, TUNLINKAT, TVERSION,
    TWRITE,
};
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

/// Default of [`SocketLimits::min_request_rate`]: 16 KiB/s.
pub(crate) const DEFAULT_MIN_REQUEST_RATE: usize = 16 << 10;

/// Default of [`SocketLimits::request_grace`]: 10 s.
pub(crate) const DEFAULT_REQUEST_GRACE: Duration = Duration::from_secs(10);

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
    /// Reading the 7-byte header (`have` 0: between frames).
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

    /// Between two frames: the next byte starts a new request.
    fn at_boundary(&self) -> bool {
        matches!(self, Input::Header { have: 0, .. })
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
    /// Request slots of the thread this connection holds: its requests
    /// on the engine, plus the frame being read (see "Fairness").
    slots: usize,
    /// One of `slots` is the thread's first-slot reserve.
    first: bool,
    /// The frame being read holds a slot (taken with its first byte).
    reserved: bool,
    /// Waiting in the thread's queue for a slot.
    queued: bool,
    /// When the frame being read started, and its bytes so far (the
    /// minimum-rate check).
    frame_start: Option<Instant>,
    frame_got: usize,
    /// A Tversion waiting for the connection's other requests to end.
    version: Option<(Vec<u8>, usize)>,
    /// A request that always runs on a worker, waiting for its turn
    /// ("Workers" in the module docs).
    held: Option<(Vec<u8>, usize)>,
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
    /// For a streamed Twrite: its state and the frame's size.
    stream: Option<(Arc<StreamState>, usize)>,
    /// It counts against the thread's worker turns.
    on_worker: bool,
}

/// Why a connection ends.
enum Close {
    /// The client hung up.
    HungUp,
    /// A framing or socket error.
    Failed(io::Error),
}

/// Which reserve a new request slot comes from (see "Fairness").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admit {
    /// The connection's first slot, from the reserve kept for
    /// connections that have nothing running.
    First,
    /// A further slot, from the shared part.
    Shared,
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
    /// Requests of this thread on the engine (all connections, closed
    /// ones too until their calls return).
    live: usize,
    /// Frames being read that hold a slot.
    reserved: usize,
    /// Replies in pooled buffers waiting to be written.
    queued: usize,
    /// Most requests this thread runs at once (its share of
    /// [`SocketLimits::max_requests`]).
    thread_cap: usize,
    /// Slots kept for connections with nothing running.
    first_slots: usize,
    /// Connections holding one of those.
    firsts: usize,
    /// Most slots one connection holds.
    share: usize,
    /// Connections waiting for a slot, served in turn.
    waitq: VecDeque<u32>,
    /// A slot was freed since the queue was last served.
    released: bool,
    /// Requests of worker-bound types running, the most at once, and the
    /// connections whose next one waits for a turn.
    on_workers: usize,
    worker_turns: usize,
    workq: VecDeque<u32>,
    /// Some connection may be in the middle of a frame: check rates.
    stall_watch: bool,
    next_stall_check: Instant,
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

/// The slots of one socket thread: `(thread_cap, first_slots, share)`
/// (see "Fairness" in the module docs).
fn thread_slots(limits: &SocketLimits) -> (usize, usize, usize) {
    let threads = limits.threads.max(1);
    let cap = limits
        .max_requests
        .div_ceil(threads)
        .clamp(1, usize::from(u16::MAX) - 1);
    let first = limits.max_connections.div_ceil(threads).min(cap / 2);
    let share = limits.max_in_flight.max(1).min(1 + (cap - first) / 2);
    (cap, first, share)
}

/// Requests of worker-bound types one socket thread runs at once: twice
/// its share of the workers, enough to keep them busy (see "Workers").
fn worker_turns(limits: &SocketLimits) -> usize {
    (2 * limits.workers).div_ceil(limits.threads.max(1)).max(2)
}

/// Request types whose filesystem call always runs on a worker (the
/// engine's placement, `crate::engine`): they take turns ("Workers").
/// Twrite comes here only buffered; a streamed one is never held.
fn worker_bound(ty: u8) -> bool {
    [
        TATTACH, TLOPEN, TLCREATE, TREADDIR, TWRITE, TMKDIR, TSYMLINK, TMKNOD, TRENAME, TRENAMEAT,
        TUNLINKAT, TREMOVE, TSETATTR, TFSYNC, TLINK,
    ]
    .iter()
    .any(|&t| ty == t)
}

/// Whether a request that started arriving at `start` and has `got`
/// bytes now falls below the minimum rate: once `grace` has passed, it
/// must have kept up `rate` bytes a second over the time since (`rate`
/// 0: never).
fn too_slow(rate: usize, grace: Duration, start: Instant, got: usize, now: Instant) -> bool {
    if rate == 0 {
        return false;
    }
    let late = now.saturating_duration_since(start);
    let Some(over) = late.checked_sub(grace) else {
        return false;
    };
    (got as f64) < over.as_secs_f64() * rate as f64
}

/// How often a socket thread checks the rate of frames being read.
const STALL_CHECK: Duration = Duration::from_millis(250);

fn too_slow_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "request arriving below the minimum rate",
    )
}

fn run_thread<F: Filesystem + 'static>(ctx: ThreadCtx<F>, single: bool) -> io::Result<()> {
    // Splices into sockets raise SIGPIPE on a hang-up: keep it pending on
    // this thread (and take it) rather than let it reach the process.
    let _sigpipe = SigpipeBlocked::new();
    let (thread_cap, first_slots, share) = thread_slots(&ctx.shared.limits);
    let worker_turns = worker_turns(&ctx.shared.limits);
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
        reserved: 0,
        thread_cap,
        first_slots,
        firsts: 0,
        share,
        waitq: VecDeque::new(),
        released: false,
        on_workers: 0,
        worker_turns,
        workq: VecDeque::new(),
        stall_watch: false,
        next_stall_check: Instant::now(),
        queued: 0,
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
            let stalls = self.stall_watch.then(|| {
                self.next_stall_check
                    .saturating_duration_since(Instant::now())
            });
            let pending = !self.dirty.is_empty()
                || (self.released && !self.waitq.is_empty())
                || (self.on_workers < self.worker_turns && !self.workq.is_empty());
            let timeout = match self
                .bufs
                .next_expiry()
                .into_iter()
                .chain(pipes)
                .chain(stalls)
                .min()
            {
                _ if pending => 0,
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
            self.check_stalls();
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
                slots: 0,
                first: false,
                reserved: false,
                queued: false,
                frame_start: None,
                frame_got: 0,
                version: None,
                held: None,
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
        // Its requests still running hold plain slots until they return.
        if conn.reserved {
            self.reserved -= 1;
        }
        if conn.first {
            self.firsts -= 1;
        }
        self.released = true;
        for (buf, _) in conn.version.into_iter().chain(conn.held) {
            self.bufs.put(buf, self.keep());
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
            if let Err(why) = self.read_conn(id, false) {
                self.close(id, why);
                return;
            }
            if ev.intersects(EventSet::HANG_UP | EventSet::ERROR) {
                // Nothing more to read and nowhere to write.
                if self.conns.get(&id).is_some_and(|c| !self.readable(c)) {
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

    /// Whether the connection may start another request, as far as it
    /// alone is concerned: the per-connection limits.
    fn conn_ready(&self, c: &Conn<F>) -> bool {
        c.in_flight < self.shared.limits.max_in_flight.max(1)
            && c.out_bytes < OUT_HIGH_WATER
            && c.slots < self.share
            && c.version.is_none()
            && c.held.is_none()
            && !matches!(c.input, Input::Streaming)
    }

    /// Whether the thread has a slot for the connection's next request:
    /// its first from the reserve while it has nothing running, any other
    /// from the shared part, in queue order (`from_queue`: its turn).
    fn admit(&self, c: &Conn<F>, from_queue: bool) -> Option<Admit> {
        let used = self.live + self.reserved;
        if used >= self.thread_cap {
            return None;
        }
        if c.slots == 0 && self.firsts < self.first_slots {
            return Some(Admit::First);
        }
        let shared_used = used.saturating_sub(self.firsts);
        (shared_used < self.thread_cap - self.first_slots && (from_queue || self.waitq.is_empty()))
            .then_some(Admit::Shared)
    }

    /// Whether to read the connection's socket now.
    fn readable(&self, c: &Conn<F>) -> bool {
        match c.input {
            Input::Streaming => false,
            ref i if !i.at_boundary() => true,
            _ => self.conn_ready(c) && !c.queued && self.admit(c, false).is_some(),
        }
    }

    /// Puts the connection in the thread's queue for a slot.
    fn enqueue(&mut self, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            if !c.queued {
                c.queued = true;
                self.waitq.push_back(id);
            }
        }
    }

    /// The frame just begun takes a slot.
    fn reserve(&mut self, id: u32, how: Admit) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.slots += 1;
        c.reserved = true;
        self.reserved += 1;
        if how == Admit::First {
            c.first = true;
            self.firsts += 1;
        }
        c.frame_start = Some(Instant::now());
        c.frame_got = 0;
        self.stall_watch = true;
    }

    /// The frame being read gives its slot to the request it starts.
    fn take_reservation(&mut self, id: u32) {
        if let Some(c) = self.conns.get_mut(&id).filter(|c| c.reserved) {
            c.reserved = false;
            self.reserved -= 1;
        }
    }

    /// The frame being read ends without a request: its slot is free.
    fn unreserve(&mut self, id: u32) {
        if self.conns.get(&id).is_some_and(|c| c.reserved) {
            self.take_reservation(id);
            self.drop_slot(id);
        }
    }

    /// One of the connection's slots is free.
    fn drop_slot(&mut self, id: u32) {
        self.released = true;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.slots = c.slots.saturating_sub(1);
        if c.slots == 0 && c.first {
            c.first = false;
            self.firsts -= 1;
        }
    }

    /// Reads and starts what the socket holds, within the limits.
    /// `from_queue`: the connection's turn in the queue came, its next
    /// frame takes a shared slot ahead of the others waiting.
    fn read_conn(&mut self, id: u32, mut from_queue: bool) -> std::result::Result<(), Close> {
        // A bounded number of frames per wakeup keeps connections fair.
        for _ in 0..64 {
            // Send what finished at once (a cached read runs inline), so
            // the client reads replies while the next requests run.
            self.collect();
            self.flush_out(id).map_err(Close::Failed)?;
            let Some(c) = self.conns.get(&id) else {
                return Ok(());
            };
            if matches!(c.input, Input::Streaming) {
                break;
            }
            let mut admit = None;
            if c.input.at_boundary() {
                // A new request: it needs the connection's and the
                // thread's room.
                if !self.conn_ready(c) {
                    break;
                }
                match self.admit(c, from_queue) {
                    Some(how) => admit = Some(how),
                    None => {
                        self.enqueue(id);
                        break;
                    }
                }
            }
            let Some(c) = self.conns.get_mut(&id) else {
                return Ok(());
            };
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
                    let (hdr, have) = (*hdr, *have);
                    if let Some(how) = admit {
                        from_queue = false;
                        self.reserve(id, how);
                    }
                    self.got(id, n);
                    if have < HEADER_SIZE {
                        continue;
                    }
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
                        c.frame_start = None;
                        self.start(id, buf, size);
                    } else {
                        self.got(id, n);
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
                        self.got(id, n);
                        self.start_stream(id, head);
                    } else {
                        self.got(id, n);
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
                        c.frame_got += n;
                    }
                    if *left == 0 {
                        let answer = answer.take();
                        c.input = Input::header();
                        c.frame_start = None;
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

    /// `n` more bytes of the frame being read arrived.
    fn got(&mut self, id: u32, n: usize) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.frame_got += n;
        }
    }

    /// Closes the connections whose frame in progress arrives below the
    /// minimum rate ([`SocketLimits::min_request_rate`]); a streamed
    /// Twrite checks its own.
    fn check_stalls(&mut self) {
        if !self.stall_watch {
            return;
        }
        let now = Instant::now();
        if now < self.next_stall_check {
            return;
        }
        self.next_stall_check = now + STALL_CHECK;
        let limits = &self.shared.limits;
        let mut partial = false;
        let mut slow = Vec::new();
        for (&id, c) in &self.conns {
            let Some(start) = c.frame_start else {
                continue;
            };
            partial = true;
            let (rate, grace) = (limits.min_request_rate, limits.request_grace);
            if !matches!(c.input, Input::Streaming)
                && too_slow(rate, grace, start, c.frame_got, now)
            {
                slow.push(id);
            }
        }
        self.stall_watch = partial;
        for id in slow {
            if self.shared.server.log_limit().admit() {
                warn!("9p: closing connection {id}: its request arrives below the minimum rate");
            }
            self.close(id, Close::Failed(too_slow_error()));
        }
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
            self.unreserve(id);
            return Ok(());
        };
        buf[..HEADER_SIZE].copy_from_slice(&hdr);
        if size == HEADER_SIZE {
            c.input = Input::header();
            c.frame_start = None;
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
        let Some(c) = self.conns.get_mut(&id) else {
            self.bufs.put(buf, self.keep());
            return;
        };
        let h = Header::from_bytes(buf[..HEADER_SIZE].try_into().unwrap_or(&[0; HEADER_SIZE]));
        if h.ty == TVERSION && c.slots > 1 {
            // Tversion aborts the connection's requests in flight: they
            // are cancelled, and it runs once the last has returned, so
            // no reply of theirs follows the Rversion.
            c.version = Some((buf, size));
            self.engine.cancel_group(id);
            self.dirty.push(id);
            return;
        }
        let on_worker = worker_bound(h.ty);
        if on_worker && self.on_workers >= self.worker_turns {
            // Its turn comes when a worker-bound request of the thread
            // returns; a connection with nothing else running goes first.
            let alone = c.slots == 1;
            c.held = Some((buf, size));
            if alone {
                self.workq.push_front(id);
            } else {
                self.workq.push_back(id);
            }
            self.dirty.push(id);
            return;
        }
        let limit = c.session.frame_limit();
        let session = Arc::clone(&c.session);
        if self.engine.has_tag(id, h.tag) {
            if self.shared.server.log_limit().admit() {
                warn!("9p: connection {id}: tag {} is already in flight", h.tag);
            }
            self.bufs.put(buf, self.keep());
            self.unreserve(id);
            self.answer_now(id, h.tag, DUPLICATE_TAG_ERRNO as u32);
            return;
        }
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
                        self.unreserve(id);
                        self.answer_now(id, h.tag, libc::ENOMEM as u32);
                        return;
                    }
                }
            }
        };
        let server = Arc::clone(&self.shared.server);
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
        self.spawn(id, h.tag, handoff, None, on_worker, task);
    }

    /// Runs a large Twrite whose data the request reads from the socket
    /// itself, chunk by chunk, as it arrives ("Slow senders").
    fn start_stream(&mut self, id: u32, head: [u8; TWRITE_HEAD]) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let h = Header::from_bytes(head[..HEADER_SIZE].try_into().unwrap_or(&[0; HEADER_SIZE]));
        let frame_start = c.frame_start.unwrap_or_else(Instant::now);
        if self.engine.has_tag(id, h.tag) {
            if self.shared.server.log_limit().admit() {
                warn!("9p: connection {id}: tag {} is already in flight", h.tag);
            }
            self.unreserve(id);
            // Skip its data, then answer.
            if let Some(c) = self.conns.get_mut(&id) {
                c.input = Input::Skip {
                    left: (h.size as usize - TWRITE_HEAD) as u64,
                    answer: Some((h.tag, DUPLICATE_TAG_ERRNO as u32)),
                };
            }
            return;
        }
        // Small buffers are never refused.
        let reply = self
            .bufs
            .take(SMALL_BUFFER)
            .unwrap_or_else(|| vec![0u8; SMALL_BUFFER]);
        let chunk = self
            .bufs
            .take(STREAM_CHUNK)
            .or_else(|| self.bufs.take(KEEP_BUFFER))
            .unwrap_or_else(|| vec![0u8; KEEP_BUFFER]);
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let server = Arc::clone(&self.shared.server);
        let session = Arc::clone(&c.session);
        let sock = Arc::clone(&c.sock);
        let exec = self.exec;
        let handoff = Rc::new(Handoff::default());
        let back = Rc::clone(&handoff);
        let state = Arc::new(StreamState {
            unread: AtomicUsize::new(h.size as usize - TWRITE_HEAD),
            too_slow: AtomicBool::new(false),
        });
        let size = h.size as usize;
        let stream_state = Arc::clone(&state);
        let limits = (
            self.shared.limits.min_request_rate,
            self.shared.limits.request_grace,
        );
        let task = move |cancel: Cancel| {
            let mut reply = reply;
            let mut req = StreamRequest {
                head,
                pos: 0,
                chunk,
                start: 0,
                end: 0,
                sock,
                size,
                state: stream_state,
                frame_start,
                limits,
                cancel: cancel.clone(),
            };
            let r = server.handle(
                &session,
                &mut req,
                &mut SockWriter::new(&mut reply[..SMALL_BUFFER], None),
                &exec,
                &cancel,
            );
            back.request.set(Some(req.chunk));
            back.reply.set(Some(reply));
            reply_len(r, &cancel)
        };
        self.spawn(id, h.tag, handoff, Some((state, size)), false, task);
    }

    fn spawn(
        &mut self,
        id: u32,
        tag: u16,
        handoff: Rc<Handoff>,
        stream: Option<(Arc<StreamState>, usize)>,
        on_worker: bool,
        task: impl FnOnce(Cancel) -> u32 + 'static,
    ) {
        let streaming = stream.is_some();
        let Some(token) = self.token(Req {
            conn: id,
            handoff: Rc::clone(&handoff),
            stream,
            on_worker,
        }) else {
            if self.shared.server.log_limit().admit() {
                warn!("9p: connection {id}: no request slot for tag {tag}");
            }
            self.unreserve(id);
            self.answer_now(id, tag, libc::EAGAIN as u32);
            return;
        };
        self.take_reservation(id);
        if let Some(c) = self.conns.get_mut(&id) {
            c.in_flight += 1;
        }
        self.live += 1;
        if on_worker {
            self.on_workers += 1;
        }
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
            if on_worker {
                self.on_workers -= 1;
            }
            self.drop_slot(id);
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
        let mut slow = Vec::new();
        for &(token, len) in &done {
            let Some(req) = self.reqs.get_mut(usize::from(token)).and_then(Option::take) else {
                continue;
            };
            self.free_tokens.push(token);
            self.live -= 1;
            self.released = true;
            if req.on_worker {
                self.on_workers -= 1;
            }
            if let Some(b) = req.handoff.request.take() {
                self.bufs.put(b, self.keep());
            }
            let reply = req.handoff.reply.take();
            let spliced = req.handoff.spliced.take();
            if !self.conns.contains_key(&req.conn) {
                if let Some(b) = reply {
                    self.bufs.put(b, self.keep());
                }
                continue;
            }
            self.drop_slot(req.conn);
            let Some(c) = self.conns.get_mut(&req.conn) else {
                continue;
            };
            if let Some((st, size)) = &req.stream {
                if st.too_slow.load(Ordering::Acquire) {
                    slow.push(req.conn);
                }
                c.frame_got = st.got(*size);
                // The rest of the streamed frame (an error before all its
                // data was used) is skipped, not parsed.
                let left = st.unread.load(Ordering::Acquire);
                c.input = if left > 0 {
                    self.stall_watch = true;
                    Input::Skip {
                        left: left as u64,
                        answer: None,
                    }
                } else {
                    c.frame_start = None;
                    Input::header()
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
        for id in slow {
            if self.shared.server.log_limit().admit() {
                warn!(
                    "9p: closing connection {id}: its Twrite data arrives below the minimum rate"
                );
            }
            self.close(id, Close::Failed(too_slow_error()));
        }
    }

    /// Starts the requests waiting for a worker turn, in order, while the
    /// thread has turns free.
    fn serve_workq(&mut self) {
        while self.on_workers < self.worker_turns {
            let Some(id) = self.workq.pop_front() else {
                break;
            };
            let Some((buf, size)) = self.conns.get_mut(&id).and_then(|c| c.held.take()) else {
                continue;
            };
            self.start(id, buf, size);
            self.dirty.push(id);
        }
    }

    /// Gives the connections waiting for a slot their turn, in order, as
    /// long as slots are free: each starts one request, then waits again
    /// at the back if it has more.
    fn serve_waiters(&mut self) {
        if !self.released || self.waitq.is_empty() {
            return;
        }
        self.released = false;
        let mut passed = VecDeque::new();
        for _ in 0..self.waitq.len() {
            if self.live + self.reserved >= self.thread_cap {
                break;
            }
            let Some(id) = self.waitq.pop_front() else {
                break;
            };
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            c.queued = false;
            let c = &self.conns[&id];
            if !self.conn_ready(c) || !c.input.at_boundary() {
                // It waits for itself now, not for the thread.
                self.dirty.push(id);
                continue;
            }
            if self.admit(c, true).is_none() {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.queued = true;
                }
                passed.push_back(id);
                continue;
            }
            if let Err(why) = self.read_conn(id, true) {
                self.close(id, why);
                continue;
            }
            self.dirty.push(id);
        }
        // Those that could not have a slot keep their place.
        while let Some(id) = passed.pop_back() {
            self.waitq.push_front(id);
        }
    }

    /// Writes queued replies, resumes reading where a slot freed, updates
    /// the epoll interest, and frees the pool once idle.
    fn settle(&mut self) {
        // Bounded, so new connections and events are seen between rounds
        // of a busy queue; what is left makes the next epoll wait return
        // at once.
        for _ in 0..16 {
            self.serve_workq();
            self.serve_waiters();
            if self.dirty.is_empty() {
                break;
            }
            let mut dirty = std::mem::take(&mut self.dirty);
            dirty.sort_unstable();
            dirty.dedup();
            for id in dirty {
                if let Err(e) = self.flush_out(id) {
                    self.close(id, Close::Failed(e));
                    continue;
                }
                if let Some(c) = self.conns.get(&id) {
                    if c.version.is_some() && c.slots == 1 {
                        // The requests a Tversion waited for have returned.
                        if let Some(c) = self.conns.get_mut(&id) {
                            if let Some((buf, size)) = c.version.take() {
                                self.start(id, buf, size);
                            }
                        }
                    }
                }
                let Some(c) = self.conns.get(&id) else {
                    continue;
                };
                if self.readable(c) {
                    // A slot freed: read what waits in the socket (level
                    // triggered epoll would also tell us).
                    if let Err(why) = self.read_conn(id, false) {
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
            if c.out_pos == 0 {
                if let Some(t) = front.tail.as_mut() {
                    if t.left == t.len {
                        // Just before its header goes out: a file that
                        // shrank since the fill cuts the reply.
                        let old = t.len;
                        if let Some(len) = t.recount() {
                            c.out_bytes -= old - len;
                            set_rread_count(&mut front.buf, len);
                        }
                    }
                }
            }
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
                if let Some((pipe, empty)) = o.tail.and_then(Tail::into_pipe) {
                    // Sent in full: empty, unless the reply was cut.
                    splice::lock(&self.pipes).put(pipe, empty);
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
        let mut wait_turn = false;
        if self.readable(c) {
            want |= EventSet::IN;
        } else {
            // Only the thread's slots stop it: it waits in the queue, so
            // it is read again when its turn comes (never left unread).
            wait_turn = c.input.at_boundary() && self.conn_ready(c);
        }
        if !c.out.is_empty() {
            want |= EventSet::OUT;
        }
        if wait_turn {
            self.enqueue(id);
        }
        let Some(c) = self.conns.get(&id) else {
            return;
        };
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
        return (RHDR, Some(Tail::new(f)));
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

/// Rewrites the size and count of the Rread header in `buf` for `len`
/// bytes of data.
fn set_rread_count(buf: &mut [u8], len: usize) {
    const RHDR: usize = HEADER_SIZE + 4;
    buf[..4].copy_from_slice(&((RHDR + len) as u32).to_le_bytes());
    buf[HEADER_SIZE..RHDR].copy_from_slice(&(len as u32).to_le_bytes());
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

/// What a streamed Twrite shares with its socket thread.
struct StreamState {
    /// Bytes of the frame still in the socket (the thread skips them if
    /// the request ends early).
    unread: AtomicUsize,
    /// The data arrived below the minimum rate: the thread closes the
    /// connection.
    too_slow: AtomicBool,
}

impl StreamState {
    /// Bytes of the frame of `size` received so far.
    fn got(&self, size: usize) -> usize {
        size - self.unread.load(Ordering::Acquire)
    }
}

/// Bytes a streamed Twrite receives before it hands them to a filesystem
/// call (charged to the shared budget; 64 KiB when the budget is spent).
pub(crate) const STREAM_CHUNK: usize = 256 << 10;

/// The first pause of a streamed Twrite whose socket has nothing for it,
/// and the longest (the pause doubles while nothing comes).
const STREAM_PAUSE_MIN: Duration = Duration::from_micros(50);
const STREAM_PAUSE_MAX: Duration = Duration::from_millis(10);

/// A large Twrite whose data the request reads from the socket itself
/// ("Slow senders" in the module docs): the head already read, then the
/// rest of the frame in chunks. [`RequestReader::wait_ready`] fills the
/// next chunk on the request's coroutine, from the nonblocking socket,
/// pausing on the engine's timer (no thread held) while nothing comes;
/// reads and file writes then take only bytes already in the chunk, so
/// neither a socket thread nor a worker ever waits for the peer. The
/// frame must keep up the minimum rate
/// ([`SocketLimits::min_request_rate`]) once its grace has passed.
struct StreamRequest {
    head: [u8; TWRITE_HEAD],
    pos: usize,
    /// Received bytes `chunk[start..end]` not consumed yet.
    chunk: Vec<u8>,
    start: usize,
    end: usize,
    sock: Arc<File>,
    /// The frame's size.
    size: usize,
    state: Arc<StreamState>,
    /// When the frame's first byte arrived.
    frame_start: Instant,
    /// `(min_request_rate, request_grace)`.
    limits: (usize, Duration),
    cancel: Cancel,
}

impl StreamRequest {
    fn unread(&self) -> usize {
        self.state.unread.load(Ordering::Acquire)
    }

    /// Whether the frame so far arrived below the minimum rate.
    fn too_slow(&self) -> bool {
        let (rate, grace) = self.limits;
        let got = self.size - self.unread();
        too_slow(rate, grace, self.frame_start, got, Instant::now())
    }

    /// Fills the empty chunk with the next bytes of the frame: all of the
    /// chunk (or of the frame's rest), or at least `KEEP_BUFFER` when the
    /// socket runs dry.
    fn fill(&mut self) -> io::Result<()> {
        self.start = 0;
        self.end = 0;
        let goal = self.chunk.len().min(self.unread());
        let mut pause = STREAM_PAUSE_MIN;
        while self.end < goal {
            if self.cancel.is_cancelled() {
                return Err(io::Error::from_raw_os_error(libc::EINTR));
            }
            match read_some(&self.sock, &mut self.chunk[self.end..goal])? {
                Some(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "client hung up mid-message",
                    ))
                }
                Some(n) => {
                    self.end += n;
                    self.state.unread.fetch_sub(n, Ordering::AcqRel);
                    pause = STREAM_PAUSE_MIN;
                }
                None if self.end >= KEEP_BUFFER => break,
                None => {
                    if self.too_slow() {
                        self.state.too_slow.store(true, Ordering::Release);
                        return Err(too_slow_error());
                    }
                    // On the request's coroutine: a timer, no thread.
                    engine::sleep(pause);
                    pause = (pause * 2).min(STREAM_PAUSE_MAX);
                }
            }
        }
        Ok(())
    }
}

impl Read for StreamRequest {
    /// The head, then bytes already received; never waits (`EAGAIN` when
    /// the chunk is empty: call `wait_ready` first).
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.pos < TWRITE_HEAD {
            let n = buf.len().min(TWRITE_HEAD - self.pos);
            buf[..n].copy_from_slice(&self.head[self.pos..self.pos + n]);
            self.pos += n;
            return Ok(n);
        }
        if self.start == self.end {
            if self.unread() == 0 {
                return Ok(0);
            }
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        let n = buf.len().min(self.end - self.start);
        buf[..n].copy_from_slice(&self.chunk[self.start..self.start + n]);
        self.start += n;
        Ok(n)
    }
}

impl RequestReader for StreamRequest {
    fn available_bytes(&self) -> usize {
        (TWRITE_HEAD - self.pos) + (self.end - self.start) + self.unread()
    }

    fn wait_ready(&mut self) -> io::Result<usize> {
        if self.pos < TWRITE_HEAD {
            return Ok(TWRITE_HEAD - self.pos);
        }
        if self.start == self.end && self.unread() > 0 {
            self.fill()?;
        }
        Ok(self.end - self.start)
    }

    /// Writes bytes already received straight from the chunk.
    fn read_to_file_at(
        &mut self,
        file: BorrowedFd<'_>,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        if self.pos < TWRITE_HEAD {
            return Err(io::Error::other("Twrite data read before its head"));
        }
        let n = count.min(self.end - self.start);
        let w = crate::io::pwrite_all(file, &self.chunk[self.start..self.start + n], off)?;
        self.start += w;
        Ok(w)
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
