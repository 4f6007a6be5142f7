//! Coroutines on pooled stacks.

use corosensei::{CoroutineResult, Yielder};

use crate::pool::{PooledStack, StackId, StackPool};
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
    /// `None` once the coroutine has returned and its stack went back.
    inner: Option<corosensei::Coroutine<Input, Yield, Return, PooledStack>>,
    id: StackId,
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
        let id = stack.id();
        Coroutine {
            inner: Some(corosensei::Coroutine::with_stack(stack, func)),
            id,
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
        let co = match self.inner.as_mut() {
            Some(co) if !co.done() => co,
            _ => return Err(Error::Finished),
        };
        let result = co.resume(input);
        if let CoroutineResult::Return(_) = result {
            // Give the stack back right away. Dropping a finished corosensei
            // coroutine in place only drops its stack (nothing to unwind),
            // and saves moving it out first.
            self.inner = None;
        }
        Ok(result)
    }

    /// Whether the coroutine has been resumed at least once.
    pub fn started(&self) -> bool {
        self.inner.as_ref().is_none_or(|co| co.started())
    }

    /// Whether the coroutine has returned (or panicked).
    pub fn done(&self) -> bool {
        self.inner.as_ref().is_none_or(|co| co.done())
    }

    /// The identity of the stack the coroutine runs on, `None` once it has
    /// returned and given the stack back.
    pub fn stack_id(&self) -> Option<StackId> {
        self.inner.as_ref().map(|_| self.id)
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn resumed_after_return() -> ! {
    panic!("attempt to resume a coroutine that has already returned")
}
