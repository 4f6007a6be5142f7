// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The engine's own errors. The crate's [`Error`](crate::Error) wraps
//! them ([`Error::Engine`](crate::Error::Engine)); nothing here imports it
//! back.

use std::io;

/// Why the engine could not start, or take a new request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The engine's worker pool or its eventfd could not be created.
    #[error("cannot start the engine's workers: {0}")]
    Workers(#[source] io::Error),
    /// The engine's timer fd could not be created or armed.
    #[error("engine timer failed: {0}")]
    Timer(#[source] io::Error),
    /// No coroutine stack could be had for a new request.
    #[error("no coroutine stack for a new request: {0}")]
    Stack(#[source] coro_pool::Error),
    /// The coroutine stack pool could not be created.
    #[error("cannot create the coroutine stack pool: {0}")]
    StackPool(#[source] coro_pool::Error),
    /// More requests than the engine's `max_in_flight`.
    #[error("more than {0} requests in flight")]
    TooManyRequests(usize),
}
