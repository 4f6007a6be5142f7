// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Coroutines on pooled stacks.

use std::mem::ManuallyDrop;

use corosensei::{CoroutineResult, Yielder};

use crate::pool::{PooledStack, StackBounds, StackId, StackPool};
use crate::{Error, Result};

/// A stackful coroutine running on a stack from a [`StackPool`].
///
/// `Input` is passed in by [`resume`](Coroutine::resume) and returned by
/// [`Yielder::suspend`]; `Yield` is passed out by `suspend`; `Return` is
/// the closure's result. The stack goes back to the pool as soon as the
/// coroutine returns (even before the `Coroutine` is dropped), and when a
/// suspended coroutine is dropped its stack is unwound first (the closure's
/// locals are dropped; this needs `panic = "unwind"`).
///
/// A coroutine is neither `Send` nor `Sync`: create, resume and drop it on
/// one thread (for example a vring thread that hands blocking work to
/// workers and resumes the coroutine when the result arrives).
///
/// # Stack overflow
///
/// Each stack has an inaccessible guard region below it. Overflowing the
/// stack touches the guard and the thread gets `SIGSEGV` (the process dies,
/// as with an overflow of a thread stack); memory next to the stack is never
/// written. Rust emits stack probes for frames larger than a page, so a large
/// frame cannot jump over the guard.
pub struct Coroutine<Input, Yield, Return> {
    /// Runs on the bounds of `stack`. Dropped in place, always before the
    /// stack goes back: when the coroutine returns, or by Drop if it never
    /// did (which unwinds it if it is suspended). Never touched after that.
    inner: ManuallyDrop<corosensei::Coroutine<Input, Yield, Return, StackBounds>>,
    /// The stack `inner` runs on; `None` once the coroutine has returned
    /// and the stack went back to the pool. Dropped by hand too, so that
    /// dropping a finished coroutine is one test.
    stack: ManuallyDrop<Option<PooledStack>>,
}

impl<Input, Yield, Return> std::fmt::Debug for Coroutine<Input, Yield, Return> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coroutine")
            .field("stack", &self.stack_id())
            .field("done", &self.done())
            .finish()
    }
}

impl<Input, Yield, Return> Coroutine<Input, Yield, Return> {
    /// Creates a coroutine on a stack from the process-wide pool
    /// ([`StackPool::global`]). It starts running at the first
    /// [`resume`](Coroutine::resume).
    pub fn new<F>(func: F) -> Result<Self>
    where
        F: FnOnce(&Yielder<Input, Yield>, Input) -> Return + 'static,
        Input: 'static,
        Yield: 'static,
        Return: 'static,
    {
        Self::new_in(StackPool::global(), func)
    }

    /// Creates a coroutine on a stack from `pool`.
    ///
    /// Fails (never aborts) when no stack can be had: mapping budget
    /// exhausted, `mmap` or guard setup failed.
    #[inline]
    pub fn new_in<F>(pool: &StackPool, func: F) -> Result<Self>
    where
        F: FnOnce(&Yielder<Input, Yield>, Input) -> Return + 'static,
        Input: 'static,
        Yield: 'static,
        Return: 'static,
    {
        Ok(Self::with_stack(pool.take_stack()?, func))
    }

    /// Creates a coroutine on a stack already taken from a pool.
    #[inline]
    pub fn with_stack<F>(stack: PooledStack, func: F) -> Self
    where
        F: FnOnce(&Yielder<Input, Yield>, Input) -> Return + 'static,
        Input: 'static,
        Yield: 'static,
        Return: 'static,
    {
        Coroutine {
            inner: ManuallyDrop::new(corosensei::Coroutine::with_stack(stack.bounds(), func)),
            stack: ManuallyDrop::new(Some(stack)),
        }
    }

    /// Runs the coroutine until it yields or returns.
    ///
    /// # Panics
    ///
    /// Panics if the coroutine has already returned (use
    /// [`try_resume`](Coroutine::try_resume) to get an error instead). A
    /// panic inside the coroutine is propagated to the caller, after which
    /// the coroutine counts as finished.
    #[inline(always)]
    pub fn resume(&mut self, input: Input) -> CoroutineResult<Yield, Return> {
        match self.try_resume(input) {
            Ok(result) => result,
            Err(_) => resumed_after_return(),
        }
    }

    /// Like [`resume`](Coroutine::resume), but returns
    /// [`Error::Finished`] instead of panicking when the coroutine has
    /// already returned.
    #[inline(always)]
    pub fn try_resume(&mut self, input: Input) -> Result<CoroutineResult<Yield, Return>> {
        if self.stack.is_none() || self.inner.done() {
            return Err(Error::Finished);
        }
        let result = self.inner.resume(input);
        if let CoroutineResult::Return(_) = result {
            // Give the stack back right away. Dropping a finished corosensei
            // coroutine in place unwinds nothing (it only clears sanitizer
            // poisoning) and copies nothing out.
            // SAFETY: `inner` is never used again: with `stack` gone, every
            // method and Drop treat the coroutine as finished.
            unsafe { ManuallyDrop::drop(&mut self.inner) };
            PooledStack::give_back(&mut self.stack);
        }
        Ok(result)
    }

    /// Whether the coroutine has been resumed at least once.
    pub fn started(&self) -> bool {
        self.stack.is_none() || self.inner.started()
    }

    /// Whether the coroutine has returned (or panicked).
    pub fn done(&self) -> bool {
        self.stack.is_none() || self.inner.done()
    }

    /// The identity of the stack the coroutine runs on, `None` once it has
    /// returned and given the stack back.
    pub fn stack_id(&self) -> Option<StackId> {
        self.stack.as_ref().map(PooledStack::id)
    }
}

impl<Input, Yield, Return> Coroutine<Input, Yield, Return> {
    /// Drops a coroutine that has not returned: unwinds it if it is
    /// suspended, then gives its stack back.
    #[cold]
    #[inline(never)]
    fn drop_unfinished(&mut self) {
        // SAFETY: with the stack still held, `inner` was not dropped; it is
        // dropped here once, before its stack goes back.
        unsafe { ManuallyDrop::drop(&mut self.inner) };
        drop(self.stack.take());
    }
}

impl<Input, Yield, Return> Drop for Coroutine<Input, Yield, Return> {
    #[inline(always)]
    fn drop(&mut self) {
        if self.stack.is_some() {
            self.drop_unfinished();
        }
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn resumed_after_return() -> ! {
    panic!("attempt to resume a coroutine that has already returned")
}
