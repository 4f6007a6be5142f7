// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The calls a request makes from its coroutine: hand a call to a worker
//! and yield ([`offload`]), sleep on the engine's timer ([`sleep`]), wait
//! for a flushed request ([`flush`]). Each suspends the running coroutine
//! with a [`Suspend`] and is resumed by the scheduler with a [`Resume`].

use std::cell::Cell;
use std::panic::resume_unwind;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use coro_pool::Yielder;
use log::error;

use super::workers::JobFn;
use crate::exec::Interrupted;

/// Input of a resumed coroutine.
pub(super) enum Resume {
    /// First run, a sleep ended, or a flush target finished.
    Go,
    /// The offloaded job finished; `true` if it panicked.
    JobDone(bool),
    /// The request was cancelled: return as soon as possible.
    Cancelled,
}

/// Why a coroutine yielded.
pub(super) enum Suspend {
    /// Run this job on a worker; `true`: it may wait long (Tlock).
    Offload(JobFn, bool),
    /// Wake me at this instant.
    Sleep(Instant),
    /// Cancel the request with this tag and wake me when it is gone.
    Flush(u16),
}

/// What a running coroutine can reach from the calls it makes: its
/// yielder.
pub(super) struct Context {
    pub(super) yielder: NonNull<Yielder<Resume, Suspend>>,
}

thread_local! {
    /// The context of the coroutine currently running on this thread. Set
    /// by the coroutine when it starts and after every suspension, cleared
    /// by the engine when a resume returns: only the running coroutine's
    /// calls see it.
    pub(super) static CURRENT: Cell<Option<NonNull<Context>>> = const { Cell::new(None) };
}

/// Restores [`CURRENT`] on scope exit.
pub(super) struct CurrentGuard(pub(super) Option<NonNull<Context>>);

impl Drop for CurrentGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

pub(super) fn suspend(s: Suspend) -> Option<Resume> {
    let ctx = CURRENT.with(|c| c.get())?;
    // SAFETY: CURRENT only holds the context of the coroutine running on
    // this thread right now; it lives on that coroutine's stack for the
    // coroutine's whole run, and the yielder as long as its coroutine.
    let yielder = unsafe { ctx.as_ref().yielder.as_ref() };
    let input = yielder.suspend(s);
    CURRENT.with(|c| c.set(Some(ctx)));
    Some(input)
}

/// Whether the caller runs on an engine coroutine.
pub(crate) fn on_coroutine() -> bool {
    CURRENT.with(|c| c.get().is_some())
}

/// Runs `f` on a worker thread while the calling coroutine yields, and
/// returns its result. Outside an engine coroutine it simply calls `f`.
/// When the request is cancelled before the call started, `f` never runs
/// and the result is [`Interrupted::interrupted`]. A panic in `f` is
/// propagated to the caller.
pub(crate) fn offload<R: Interrupted + Send>(f: impl FnOnce() -> R + Send) -> R {
    offload_in(false, f)
}

pub(super) fn offload_in<R: Interrupted + Send>(may_wait: bool, f: impl FnOnce() -> R + Send) -> R {
    if !on_coroutine() {
        return f();
    }
    let mut f = Some(f);
    let mut out: Option<R> = None;
    let mut call = || {
        if let Some(f) = f.take() {
            out = Some(f());
        }
    };
    let dyn_call: &mut (dyn FnMut() + Send) = &mut call;
    // SAFETY: only the lifetime is erased. The engine keeps this coroutine
    // suspended, and never drops it, until the call has finished or was
    // cancelled before it started (see `Engine::run` and `Job`), so the
    // borrow outlives every use.
    let ptr: *mut (dyn FnMut() + Send + 'static) = unsafe { std::mem::transmute(dyn_call) };
    match suspend(Suspend::Offload(JobFn(ptr), may_wait)) {
        Some(Resume::JobDone(true)) => resume_unwind(Box::new("filesystem call panicked")),
        Some(Resume::JobDone(false)) => match out {
            Some(r) => r,
            None => {
                error!("virtio-9p: an offloaded call did not run");
                R::interrupted()
            }
        },
        Some(Resume::Cancelled) => R::interrupted(),
        Some(Resume::Go) | None => {
            error!("virtio-9p: engine resumed an offloaded request early");
            R::interrupted()
        }
    }
}

/// Sleeps `d`: on an engine coroutine by yielding to a timer (the thread
/// keeps serving), elsewhere with `std::thread::sleep`. Returns early when
/// the request is cancelled.
pub(crate) fn sleep(d: Duration) {
    if !on_coroutine() {
        std::thread::sleep(d);
        return;
    }
    let _ = suspend(Suspend::Sleep(Instant::now() + d));
}

/// Cancels the in-flight request with `tag` (see the module docs) and
/// returns once it has finished (or the flush itself was cancelled). Must
/// run on an engine coroutine; elsewhere it returns at once.
pub(crate) fn flush(tag: u16) {
    let _ = suspend(Suspend::Flush(tag));
}
