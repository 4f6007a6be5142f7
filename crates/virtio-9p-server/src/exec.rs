// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The executor seam between the server and whatever runs its calls: how
//! a request's filesystem calls run (the [`Blocking`] executor an engine
//! provides; [`Inline`] runs them on the calling thread), the
//! [`Interrupted`] stand-in result of a call cancelled before it ran, and
//! the [`Cancel`] token an engine sets on Tflush, stop and teardown. The
//! server, the reply writers and the engine all use it; it uses none of
//! them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::protocol::MsgType;

/// Runs potentially blocking filesystem calls. An engine on coroutines
/// implements it to hand `f` to a worker thread and yield until it is done;
/// [`Inline`] just calls it.
///
/// `op` is the request's message type (for example
/// [`MsgType::Tread`]), so an engine can run cheap requests
/// inline and offload the rest. The closure borrows the filesystem, the
/// fid and, for Tread/Twrite, the request reader or reply writer; hence
/// [`Server::handle`](crate::Server::handle) needs them to be `Send`.
pub trait Blocking {
    /// Runs `f` to completion and returns its result. An executor that
    /// cancels the request before `f` started returns
    /// [`Interrupted::interrupted`] instead (the request then answers
    /// EINTR and finishes normally; nothing is unwound).
    fn run<R: Interrupted + Send>(&self, op: MsgType, f: impl FnOnce() -> R + Send) -> R;

    /// [`Blocking::run`] with what the filesystem says about the call
    /// ([`CallHint`]). The server runs every filesystem call through this
    /// method; the executor decides what the hint changes (the coroutine
    /// engine runs a [`CallHint::ReadsThroughWriter`] Tread and the short
    /// [`CallHint::LocalMetadata`] calls inline, see [`crate::engine`],
    /// "What runs where"). The default ignores the hint.
    fn run_hinted<R: Interrupted + Send>(
        &self,
        op: MsgType,
        hint: CallHint,
        f: impl FnOnce() -> R + Send,
    ) -> R {
        let _ = hint;
        self.run(op, f)
    }

    /// Reads file data into a reply: the reply writer's
    /// [`write_from_file_at`](crate::io::ReplyWriter::write_from_file_at)
    /// calls it with `cached` (whether the range can be read without
    /// blocking, e.g. it is in the page cache) and `read` (the read
    /// itself). An executor that ran the Tread inline on a thread that
    /// must not block (the coroutine engine, for a filesystem whose reads
    /// go through the writer) runs `read` on a worker unless `cached()`
    /// says it will not block. The default, and every executor whose Tread
    /// already runs where it may block, calls `read` here.
    fn read_at<R: Interrupted + Send>(
        &self,
        cached: impl FnOnce() -> bool,
        read: impl FnOnce() -> R + Send,
    ) -> R {
        let _ = cached;
        read()
    }

    /// Waits `d` between the attempts of a blocking Tlock. The default
    /// sleeps the thread; a coroutine engine yields to a timer instead, so
    /// a waiting lock holds no thread, and returns early when the request
    /// is cancelled or its waits are ended ([`Cancel::end_waits`]).
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }

    /// Tflush of `oldtag`: returns once that request has finished. The
    /// default returns at once, which is right where requests run one
    /// after another; the coroutine engine cancels the request and waits
    /// for it ([`crate::engine`], "Tflush").
    fn flush(&self, oldtag: u16) {
        let _ = oldtag;
    }
}

/// What the filesystem says about one call, passed to
/// [`Blocking::run_hinted`]: whether the call may run on a thread that
/// must not block for long. The executor decides where it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallHint {
    /// Nothing is known: the call may block for long (a filesystem on a
    /// peer, or a Tread that reads the file itself).
    MayBlock,
    /// A Tread whose reads go through the reply writer
    /// ([`Filesystem::reads_through_writer`](crate::fs::Filesystem::reads_through_writer)):
    /// the writer places each range with [`Blocking::read_at`], so the
    /// Tread itself need not leave the calling thread.
    ReadsThroughWriter,
    /// A call on a filesystem whose metadata calls never block for long
    /// ([`Filesystem::metadata_is_local`](crate::fs::Filesystem::metadata_is_local)).
    LocalMetadata,
}

/// The result of a call that was cancelled before it ran (Tflush, reset):
/// an EINTR error.
pub trait Interrupted {
    /// The value standing in for the call's result.
    fn interrupted() -> Self;
}

impl<T> Interrupted for std::io::Result<T> {
    fn interrupted() -> Self {
        Err(std::io::Error::from_raw_os_error(libc::EINTR))
    }
}

impl<T> Interrupted for std::result::Result<T, u32> {
    fn interrupted() -> Self {
        Err(libc::EINTR as u32)
    }
}

/// Runs every call on the calling thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct Inline;

impl Blocking for Inline {
    fn run<R: Send>(&self, _op: MsgType, f: impl FnOnce() -> R + Send) -> R {
        f()
    }
}

/// The lifecycle token of one request, shared by the engine that runs it
/// and the buffers it writes. An engine sets it when the request must end
/// early:
///
/// - [`Cancel::cancel`] (Tflush, reset, disconnect): the request answers
///   EINTR at its next suspension and its reply is dropped;
/// - [`Cancel::end_waits`] (the device is handed over or shut down): a
///   request waiting for something that may never come (a blocking Tlock)
///   ends now with the answer its client retries (`Rlock` BLOCKED);
/// - [`Cancel::hold_waits`] (the device pauses with the request kept in
///   flight): a waiting Tlock makes no attempt until
///   [`Cancel::release_waits`], so nothing is granted, and nothing
///   written, while the ring is stopped;
/// - [`Cancel::abandon`] (a bounded teardown gave up on a call that did not
///   return): the request may no longer touch guest memory. Writers that
///   run off the engine's thread wrap every guest-memory access in
///   [`Cancel::guest_access`], so a call that returns late writes nothing.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<CancelState>);

#[derive(Debug, Default)]
struct CancelState {
    cancelled: AtomicBool,
    waits_ended: AtomicBool,
    waits_held: AtomicBool,
    /// [`Cancel::abandon`] was called (read without the lock on the
    /// engine's thread, which is the one that abandons).
    gone: AtomicBool,
    /// Held for the length of each off-thread guest-memory access; true
    /// once the request is abandoned.
    abandoned: Mutex<bool>,
}

impl Cancel {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels the request.
    pub fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::Release);
    }

    /// Whether [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled.load(Ordering::Acquire)
    }

    /// Ends the request's waits: a blocking Tlock answers BLOCKED at its
    /// next check instead of waiting on.
    pub fn end_waits(&self) {
        self.0.waits_ended.store(true, Ordering::Release);
    }

    /// Whether [`Cancel::end_waits`] was called.
    pub fn waits_ended(&self) -> bool {
        self.0.waits_ended.load(Ordering::Acquire)
    }

    /// Gives the request up: from now on [`Cancel::guest_access`] runs
    /// nothing. Returns once an access in progress (a copy, never a
    /// blocking call) has finished.
    pub fn abandon(&self) {
        *self.lock_access() = true;
        self.0.gone.store(true, Ordering::Release);
    }

    /// Whether [`Cancel::abandon`] was called, without waiting for an
    /// access in progress (for the engine's own thread).
    pub fn is_gone(&self) -> bool {
        self.0.gone.load(Ordering::Acquire)
    }

    /// Holds the request's waits (the device pauses with it in flight):
    /// a waiting Tlock sleeps on without trying the lock.
    pub fn hold_waits(&self) {
        self.0.waits_held.store(true, Ordering::Release);
    }

    /// Ends [`Cancel::hold_waits`].
    pub fn release_waits(&self) {
        self.0.waits_held.store(false, Ordering::Release);
    }

    /// Whether the request's waits are held ([`Cancel::hold_waits`]).
    pub fn waits_held(&self) -> bool {
        self.0.waits_held.load(Ordering::Acquire)
    }

    /// Whether [`Cancel::abandon`] was called.
    pub fn is_abandoned(&self) -> bool {
        *self.lock_access()
    }

    /// Runs `access` (a copy into or out of guest memory) unless the
    /// request was abandoned; [`Cancel::abandon`] waits for it. `access`
    /// must not block: it delays the teardown that abandons the request.
    pub fn guest_access<R>(&self, access: impl FnOnce() -> R) -> Option<R> {
        let abandoned = self.lock_access();
        if *abandoned {
            return None;
        }
        Some(access())
    }

    fn lock_access(&self) -> MutexGuard<'_, bool> {
        self.0.abandoned.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn test_abandoned_request_gets_no_guest_access() {
        let c = Cancel::new();
        assert_eq!(c.guest_access(|| 1), Some(1));
        assert!(!c.is_abandoned());
        c.abandon();
        assert!(c.is_abandoned());
        assert_eq!(c.guest_access(|| 1), None);
        // Abandoning is not cancelling: the two are separate.
        assert!(!c.is_cancelled() && !c.waits_ended());
    }

    #[test]
    fn test_abandon_waits_for_an_access_in_progress() {
        let c = Cancel::new();
        let copied = Arc::new(AtomicBool::new(false));
        let (started, wait_started) = std::sync::mpsc::channel();
        let worker = {
            let c = c.clone();
            let copied = Arc::clone(&copied);
            std::thread::spawn(move || {
                c.guest_access(|| {
                    started.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(100));
                    copied.store(true, Ordering::Release);
                })
            })
        };
        wait_started.recv().unwrap();
        c.abandon();
        // The copy that had started finished before `abandon` returned.
        assert!(copied.load(Ordering::Acquire));
        assert_eq!(worker.join().unwrap(), Some(()));
    }
}
