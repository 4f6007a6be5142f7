// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The plain socket transport: `--listen unix:PATH` or `--listen
//! tcp:HOST:PORT`, the transport the Linux kernel client uses with
//! `mount -t 9p -o trans=unix` (or `trans=tcp`), and diod's.
//!
//! # Requests run on the engine
//!
//! Each connection's requests run on the coroutine [`Engine`](crate::engine::Engine), the same
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
//!   connection is answered with `EBUSY` and not
//!   run; the request holding the tag goes on undisturbed.
//! - **Tflush** is the engine's ([`crate::engine`], "Tflush"): Rflush goes
//!   out after the flushed request's reply, or instead of it when the
//!   request was cancelled before it answered; a flushed blocking Tlock
//!   stops waiting; an unknown tag gets Rflush at once.
//! - **Hang-up.** A client that hangs up (or breaks the framing) has its
//!   requests cancelled at once ([`Engine::cancel_group`](crate::engine::Engine::cancel_group)): waiting ones
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
//! connections). A socket thread runs one epoll loop and one [`Engine`](crate::engine::Engine)
//! for all its connections; each connection is a tag space of that engine
//! ([`Engine::spawn_in`](crate::engine::Engine::spawn_in)). Blocking filesystem calls of every socket
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
//!   ([`Blocking::read_at`](crate::Blocking::read_at)): inline on the socket thread when the range
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
//! - **Copy path.** `pread` into the reply buffer and `send`,
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
//!
//! # Files
//!
//! From the listener down to its parts; each file imports only from the
//! files below it.
//!
//! - `listener.rs`: the address, the bound listener and its accept loop.
//! - `hub.rs`: the socket threads of a listener, and which one serves a
//!   new connection.
//! - `connection.rs`: one socket thread's epoll loop over its
//!   connections: reading frames, starting requests, routing replies.
//! - `admission.rs`: the slots and worker turns a connection may take
//!   ("Fairness").
//! - `framing.rs`: a connection's input state, and one read of its socket.
//! - `output.rs`: a connection's replies waiting to be written, and the
//!   writing of them.
//! - `requests.rs`: what a request runs on the engine, what it hands
//!   back, and the table of those in flight.
//! - `stream.rs`: the streamed Twrite's reader ("Slow senders").
//! - `writer.rs`: the reply writer of every request, with splicing as its
//!   strategy for file ranges.
//! - `splice.rs`: the zero-copy Rread: filling a pipe, sending it.
//! - `pipes.rs`: the pipes of a socket thread.
//! - `buffers.rs`: the request and reply buffers and their budget
//!   ("Memory").
//! - `limits.rs`: [`SocketLimits`] with its defaults, and the
//!   minimum-rate check.

mod admission;
mod buffers;
mod connection;
mod error;
mod framing;
mod hub;
mod limits;
mod listener;
mod output;
mod pipes;
mod requests;
mod splice;
mod stream;
mod writer;

pub(crate) use buffers::KEEP_BUFFER;
pub use error::SocketError;
pub use hub::serve_connection;
pub use limits::{
    SocketLimits, DEFAULT_BUFFER_BYTES, DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_REQUESTS,
    MAX_CONNECTIONS,
};
pub use listener::{ListenAddr, Listener, Stream};
