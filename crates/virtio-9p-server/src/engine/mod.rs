// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The coroutine request engine.
//!
//! Every in-flight request runs on its own stackful coroutine (from
//! `coro-pool`), on the engine's thread (the vring thread). A request that
//! must block hands the call to an [`Executor`] (by default the engine's
//! own [worker threads](EngineConfig::workers)) and yields (`offload`);
//! the thread goes on serving other requests and resumes the coroutine
//! when the call's result is posted. So a handful of OS threads keeps a
//! whole queue of requests in flight, and the engine's thread itself never
//! blocks.
//!
//! What runs where (the inline-vs-offload line, measured in the
//! `virtio-9p` benchmark suite and documented in the repository's
//! `docs/virtio-9p-benchmarks.md`):
//!
//! - Tread of a filesystem whose reads go through the reply writer
//!   ([`Filesystem::reads_through_writer`](crate::fs::Filesystem::reads_through_writer))
//!   runs inline, and the writer asks the executor where each range is
//!   read ([`Blocking::read_at`](crate::Blocking::read_at)): a range already in the page cache
//!   (`cachestat(2)`) right there, since the `preadv` into guest memory
//!   costs less than a thread hop; any other range on a worker. Every
//!   other filesystem's Tread runs on a worker.
//! - The short metadata calls (Tgetattr, Twalk, Tclunk's `close`, Tstatfs,
//!   Treadlink, Txattrwalk) run inline when the filesystem says its
//!   metadata calls are local
//!   ([`Filesystem::metadata_is_local`](crate::fs::Filesystem::metadata_is_local):
//!   a local disk or memory filesystem, where they return within a disk
//!   access). The server passes the hint with every call
//!   ([`Blocking::run_hinted`](crate::Blocking::run_hinted)), the engine decides. On any other
//!   filesystem (the default hint: NFS, CIFS, FUSE, 9P, Ceph, unknown)
//!   they go to a worker, so a call that hangs on a peer never stalls the
//!   engine's thread. Treaddir (a large cold directory reads many blocks,
//!   with no cache hint), Tlopen, Tattach, every call that changes the
//!   tree, Tgetlock and Tfsync always go to a worker.
//! - A blocking Tlock waits between its attempts in `sleep` (a timer:
//!   the coroutine yields and holds no thread), and its attempts run apart
//!   from reads and writes ([`Job::may_wait`]), so a pile of blocked locks
//!   never starves them. It waits until granted, flushed, the device stops
//!   or the session ends (see `Config::lock_wait`).
//! - Every other filesystem call goes through [`Blocking::run`](crate::Blocking::run), which
//!   offloads it unless the [`OffloadPolicy`] says otherwise.
//! - With zero workers and no executor every call runs inline on the
//!   engine's thread (a slow call then stalls the queue).
//!
//! # Cancellation
//!
//! Cancellation never unwinds a stack, so the engine works in a program
//! built with `panic = "abort"`. Tflush, [`Engine::quiesce`] (device reset,
//! disconnect) and [`Engine::shutdown`] set the request's [`Cancel`](crate::Cancel) token
//! and, when the request is suspended (sleeping, waiting for a flush
//! target, or its call still queued for a worker), resume it with
//! "cancelled": the pending `offload` returns
//! [`Interrupted::interrupted`](crate::Interrupted::interrupted) (EINTR), `sleep` and `flush` return
//! early, and every later suspension of that request is answered the same
//! way at once, so the request returns normally and drops its locals on
//! the way out. A request whose call is running on a worker is waited for.
//! No code path drops a suspended coroutine: [`EngineStats::unwound`]
//! counts the attempts (always 0; a debug build asserts it), and such a
//! coroutine would be leaked rather than unwound.
//!
//! # Tflush
//!
//! The engine is the one owner of Tflush, for every transport. The
//! server's Tflush arm calls [`Blocking::flush`](crate::Blocking::flush), which `EngineExec`
//! implements with `flush`: it finds the request with `oldtag` in the
//! Tflush's own tag space (one per connection, [`Engine::spawn_in`]),
//! cancels it as above and returns only once the old request has finished;
//! the server then encodes Rflush with the protocol codec. So the old
//! request's reply (if it answered before it was cancelled) goes out before
//! the Rflush, a request cancelled before it answered gets no reply (its
//! transport drops an interrupted Rlerror, see `flushed_silently`), and a
//! Tflush of an unknown tag is answered at once. A Tflush that is itself
//! flushed keeps waiting for its own target (only teardown cuts that wait
//! short), so every Rflush of a chain goes out after the reply it
//! promises: the flushed request's, then each Tflush's in turn.
//!
//! # Stopping (vhost-user GET_VRING_BASE)
//!
//! [`Engine::pause`] finishes every request in flight without cancelling
//! any, as the vhost-user specification asks of a back-end whose ring
//! stops, except requests waiting for something that may never come (a
//! blocking Tlock): their waits are held
//! ([`Cancel::hold_waits`](crate::Cancel::hold_waits)), so they stay in
//! flight without trying or writing anything until the ring starts again
//! ([`Engine::resume_waits`]), or are discarded without a write
//! ([`Engine::discard`]) when it comes back as another guest's. Calls
//! running on workers are waited for, however long they take, with a
//! warning every 5 s (`DRAIN_LOG_EVERY`). The device writes their replies
//! to the ring before it answers. [`Engine::drain`] (a handover, which
//! leaves nothing in flight) ends those waits instead
//! ([`Cancel::end_waits`](crate::Cancel::end_waits)): they answer what
//! their client retries (BLOCKED).
//!
//! # Teardown
//!
//! [`Engine::shutdown`] (also run by `Drop`) and [`Engine::reset`] return
//! within [`EngineConfig::quiesce_timeout`] plus [`WORKER_JOIN_TIMEOUT`]
//! (5 s + 1 s by default), even when a worker is stuck in a call that never
//! returns. Such a request is leaked, never freed under the worker: its
//! coroutine stack and everything the call borrows stay allocated, its
//! late completion is ignored, and [`EngineStats::leaked`] counts it. It is
//! also abandoned ([`Cancel::abandon`](crate::Cancel::abandon)) before its chain goes back, so the
//! call cannot write guest memory when it returns: writers used off the
//! engine's thread copy into guest memory only under
//! [`Cancel::guest_access`](crate::Cancel::guest_access) (see [`crate::virtio::ChainWriter`]). A worker
//! thread still stuck when the engine's own pool is dropped is detached.
//!
//! # Threads and fds
//!
//! The engine's thread is the embedder's: the engine never blocks it
//! except in [`Engine::quiesce`]/[`Engine::shutdown`]. Add
//! [`Engine::fds`] (completion eventfd, timer fd) to your epoll loop for
//! `EPOLLIN` and call [`Engine::poll`] when one is readable. Worker
//! threads are the engine's own (`workers`, each running
//! [`EngineConfig::on_worker_start`] first) or the embedder's
//! ([`EngineConfig::executor`]), or there are none (`workers: 0`).
//!
//! # Files
//!
//! - `scheduler.rs`: the [`Engine`]: coroutines, their slots and tags,
//!   the run loop, timers, stop, drain and teardown. It knows nothing of
//!   9P or of the server.
//! - `coroutine.rs`: the calls a request makes from its coroutine
//!   (offload a call, sleep, wait for a flushed request).
//! - `policy.rs`: the 9P execution policy: [`OffloadPolicy`], the
//!   executor the server runs with, and which flushed replies are dropped.
//! - `workers.rs`: the worker threads and the [`Executor`] seam.

mod coroutine;
mod error;
mod policy;
mod scheduler;
#[cfg(test)]
mod tests;
mod workers;

pub(crate) use coroutine::{on_coroutine, sleep};
pub use error::EngineError;
pub use policy::OffloadPolicy;
pub(crate) use policy::{flushed_silently, EngineExec};
#[cfg(feature = "vhost-user")]
pub(crate) use scheduler::DRAIN_LOG_EVERY;
pub use scheduler::{Engine, EngineConfig, EngineStats, DEFAULT_STACK_SIZE, DEFAULT_WORKERS};
pub(crate) use workers::ThreadPool;
pub use workers::{Executor, Job, MAX_WORKERS, WORKER_JOIN_TIMEOUT};
