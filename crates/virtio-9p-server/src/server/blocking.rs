// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! How a request's filesystem calls run: the [`Blocking`] executor an
//! engine provides ([`Inline`] runs them on the calling thread), the
//! [`Interrupted`] stand-in result of a call cancelled before it ran, and
//! the [`Cancel`] token an engine sets on Tflush.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::errno;
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

    /// [`Blocking::run`] with the filesystem's hint: `metadata_is_local`
    /// is its [`Filesystem::metadata_is_local`](crate::fs::Filesystem::metadata_is_local)
    /// (its metadata calls never block for long). The server runs every
    /// filesystem call through this method; the executor decides what the
    /// hint changes (the coroutine engine runs short metadata calls inline,
    /// see [`crate::engine`], "What runs where"). The default ignores the
    /// hint.
    fn run_hinted<R: Interrupted + Send>(
        &self,
        op: MsgType,
        metadata_is_local: bool,
        f: impl FnOnce() -> R + Send,
    ) -> R {
        let _ = metadata_is_local;
        self.run(op, f)
    }

    /// Waits `d` between the attempts of a blocking Tlock. The default
    /// sleeps the thread; a coroutine engine yields to a timer instead, so
    /// a waiting lock holds no thread.
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
        Err(errno::EINTR)
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

/// Cancellation flag of one request (set by an engine on Tflush).
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels the request.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`Cancel::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}
