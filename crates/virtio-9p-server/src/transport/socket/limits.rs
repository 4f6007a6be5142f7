// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The limits of a listener's connections, with their defaults, and the
//! minimum-rate check ("Fairness" and "Slow senders" in the module docs).

use std::io;
use std::time::{Duration, Instant};

use crate::engine::DEFAULT_WORKERS;

/// Most client connections served at once; further ones are closed at
/// accept.
pub const MAX_CONNECTIONS: usize = 256;

/// Default of [`SocketLimits::max_in_flight`].
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;

/// Default of [`SocketLimits::max_requests`]: as many as one vhost-user
/// queue of 1024 entries.
pub const DEFAULT_MAX_REQUESTS: usize = 1024;

/// The errno of the Rlerror a request gets when its tag is in flight on
/// its connection.
pub(crate) const DUPLICATE_TAG_ERRNO: i32 = libc::EBUSY;

/// Default of [`SocketLimits::min_request_rate`]: 16 KiB/s.
pub(crate) const DEFAULT_MIN_REQUEST_RATE: usize = 16 << 10;

/// Default of [`SocketLimits::request_grace`]: 10 s.
pub(crate) const DEFAULT_REQUEST_GRACE: Duration = Duration::from_secs(10);

/// Default [`SocketLimits::buffer_bytes`]: 512 MiB.
pub const DEFAULT_BUFFER_BYTES: usize = 512 << 20;

/// Limits shared by every connection of one [`Listener`](super::Listener).
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

/// The minimum rate a request must arrive at
/// ([`SocketLimits::min_request_rate`] once
/// [`SocketLimits::request_grace`] has passed since its first byte).
#[derive(Debug, Clone, Copy)]
pub(super) struct RateFloor {
    /// Bytes a second; 0 turns the check off.
    pub(super) rate: usize,
    pub(super) grace: Duration,
}

impl RateFloor {
    pub(super) fn of(limits: &SocketLimits) -> Self {
        RateFloor {
            rate: limits.min_request_rate,
            grace: limits.request_grace,
        }
    }

    /// Whether a request that started arriving at `start` and has `got`
    /// bytes now falls below the minimum rate: once the grace has passed,
    /// it must have kept up the rate over the time since.
    pub(super) fn too_slow(&self, start: Instant, got: usize, now: Instant) -> bool {
        if self.rate == 0 {
            return false;
        }
        let late = now.saturating_duration_since(start);
        let Some(over) = late.checked_sub(self.grace) else {
            return false;
        };
        (got as f64) < over.as_secs_f64() * self.rate as f64
    }
}

/// Why a connection whose request fell below the [`RateFloor`] ends.
pub(super) fn too_slow_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "request arriving below the minimum rate",
    )
}
