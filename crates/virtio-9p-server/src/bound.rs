// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon's memory bound, as the formula `docs/virtio-9p-design.md`
//! ("Memory bound") and SECURITY.md give, computed from the limits in force.
//!
//! Every term is something a client can make the daemon hold, capped by a
//! named limit:
//!
//! ```text
//! socket:     BASE + C x PER_CONNECTION
//!                  + min(buffer_bytes, C x F x 2 x msize)      buffers above KEEP_BUFFER
//!                  + min(C x F, R) x (2 x KEEP_BUFFER + STACK) smaller buffers, coroutines
//!                  + min(C x max_xattr_bytes, max_total_xattr_bytes)
//!                  + min(C x max_fids, max_total_fids) x FID_COST
//!                  + QID_TABLE
//! vhost-user: BASE + D x (msize                                 one request body at a time
//!                  + queue_size x STACK                         one coroutine per chain
//!                  + (MAX_IN_FLIGHT_SEGMENTS + 32771) x 16      chain segment lists
//!                  + POOLED_SEGMENTS)
//!                  + min(D x max_xattr_bytes, max_total_xattr_bytes)
//!                  + min(D x max_fids, max_total_fids) x FID_COST
//!                  + QID_TABLE
//! ```
//!
//! `C` is the number of socket clients (at most
//! [`SocketLimits::max_connections`]), `F` the requests one of them may
//! have in flight ([`SocketLimits::max_in_flight`]), `R` the requests
//! all of them may have in flight ([`SocketLimits::max_requests`]), `D`
//! the number of vhost-user
//! devices (one per daemon). When no request is in flight the socket
//! buffer term drops out: an idle connection holds only its
//! `PER_CONNECTION` share ([`socket_idle`]).
//!
//! Spliced Rreads (socket mode) add no term: their data sits in pipes as
//! references to page-cache pages, not in the daemon's memory, and the
//! reply buffer they were given stays untouched beyond its header. Their
//! cost is fds: at most 16 pipes (32 fds) per socket thread, in use or
//! free, and a duplicate of the file's fd for each pipe in use, so
//! `threads x 48` fds (192 with the default of at most 4 threads), taken
//! from the daemon's fd reserve (`FD_RESERVE` of the binary's sandbox).
//!
//! A streamed Twrite's chunk (256 KiB) is a buffer above `KEEP_BUFFER`,
//! charged to `buffer_bytes` like any other (64 KiB, within the
//! per-request term, when the budget is spent). A free pipe unused for the socket transport's
//! `IDLE_RELEASE` is closed, so idle connections hold no pipe, and a
//! pipe that cannot be had (`EMFILE`, the cap) makes the read take the
//! copy path.

use crate::engine::DEFAULT_STACK_SIZE;
use crate::fs::passthrough::qid::{DEFAULT_MAX_EXACT, MAX_PREFIX};
use crate::server::Config;
use crate::transport::socket::{SocketLimits, KEEP_BUFFER};
use crate::virtio::{MAX_CHAIN_DESCRIPTORS, MAX_IN_FLIGHT_SEGMENTS};

/// What the binary, its libraries, the logger and the sandbox hold before
/// any client (measured at 6 MiB on Linux 6.18; 16 MiB leaves room).
pub(crate) const BASE: u64 = 16 << 20;
/// What one socket connection holds when idle, with room to spare: the
/// two `KEEP_BUFFER`s it may keep, its socket thread's reply-encoding
/// buffer (at most 64 KiB), and 320 KiB for its state, session and share
/// of that thread's stack and allocator arena.
pub(crate) const PER_CONNECTION: u64 = 3 * KEEP_BUFFER as u64 + (320 << 10);
/// Upper bound on one fid: the table entry, the shared fid record and an
/// inode record of its own.
pub(crate) const FID_COST: u64 = 256;
/// The qid remap tables at their caps: the prefix map and the exact map
/// (about 48 bytes an entry with the hash table's slack).
pub(crate) const QID_TABLE: u64 = (MAX_PREFIX + DEFAULT_MAX_EXACT as u64) * 48;
/// Bytes of one chain segment.
const SEGMENT: u64 = 16;
/// The walker's pooled segment buffers: 64 buffers of 1024 segments.
const POOLED_SEGMENTS: u64 = 64 * 1024 * SEGMENT;

fn shared_terms(config: &Config, sessions: u64) -> u64 {
    let xattr = (sessions * config.max_xattr_bytes as u64).min(config.max_total_xattr_bytes as u64);
    let fids = (sessions * config.max_fids as u64).min(config.max_total_fids as u64);
    xattr + fids * FID_COST + QID_TABLE
}

/// The most the socket daemon holds with `clients` connections (capped at
/// `limits.max_connections`) and a negotiated `msize`.
pub fn socket(config: &Config, limits: &SocketLimits, msize: u32, clients: usize) -> u64 {
    let c = clients.min(limits.max_connections) as u64;
    let f = limits.max_in_flight.max(1) as u64;
    let buffers = (c * f * 2 * u64::from(msize)).min(limits.buffer_bytes as u64);
    let requests = (c * f).min(limits.max_requests as u64);
    let in_flight = requests * (2 * KEEP_BUFFER as u64 + DEFAULT_STACK_SIZE as u64);
    socket_idle(config, limits, clients) + buffers + in_flight
}

/// The most the socket daemon holds with `clients` connections when none
/// of them has a request in flight: no buffer term.
pub fn socket_idle(config: &Config, limits: &SocketLimits, clients: usize) -> u64 {
    let c = clients.min(limits.max_connections) as u64;
    BASE + c * PER_CONNECTION + shared_terms(config, c)
}

/// The most the vhost-user daemon holds for `devices` devices with queues
/// of `queue_size` and a negotiated `msize`.
pub fn vhost_user(config: &Config, queue_size: u16, msize: u32, devices: usize) -> u64 {
    let d = devices as u64;
    let segments = (MAX_IN_FLIGHT_SEGMENTS as u64 + u64::from(MAX_CHAIN_DESCRIPTORS)) * SEGMENT;
    let per_device = u64::from(msize)
        + u64::from(queue_size) * DEFAULT_STACK_SIZE as u64
        + segments
        + POOLED_SEGMENTS;
    BASE + d * per_device + shared_terms(config, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_default_bounds() {
        let c = Config::default();
        let l = SocketLimits::default();
        // 256 clients at 128 MiB msize: the shared buffer budget caps the
        // large buffers, max_requests the coroutines and small buffers.
        let mib = |b: u64| b >> 20;
        assert_eq!(
            mib(socket(&c, &l, 128 << 20, 256) - socket_idle(&c, &l, 256)),
            512 + 384
        );
        // The figures the README gives.
        assert_eq!(mib(socket(&c, &l, 128 << 20, 256)), 1181);
        assert_eq!(mib(socket(&c, &l, 128 << 20, 10_000)), 1181);
        assert_eq!(mib(socket_idle(&c, &l, 1)), 49);
        assert_eq!(mib(vhost_user(&c, 1024, 512_000, 1)), 311);
    }
}
