// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! vhost-user integration: a 128 MiB Tread through one indirect chain of
//! 32768 data descriptors (plus the request's), 1024 requests in flight,
//! Tflush of a blocked Tlock, a ring reset with requests in flight, and
//! malformed chains and messages, each on a split and on a packed ring.
//! The scenarios live in `vhost_user_support::scenarios`, shared with
//! `sandbox_vhost_user.rs`.

#[macro_use]
mod vhost_user_support;

use vhost_user_support::scenarios::{self, Ring};
use vhost_user_support::*;
use virtio_9p_server::engine::OffloadPolicy;

on_both_rings! {
    read_128m_through_32768_data_descriptor_indirect_chain => |ring| {
        let d = TestDaemon::start(2);
        scenarios::read_128m_through_indirect_chain(d.dir.path(), |o| d.connect(o), ring);
        d.stop();
    };
    requests_1024_in_flight_with_two_workers => |ring| {
        // Every call offloaded: each request waits for one of 2 workers,
        // so all are in flight at once.
        let d = TestDaemon::start_with(2, 1024, OffloadPolicy::Always);
        scenarios::requests_1024_in_flight(d.dir.path(), |o| d.connect(o), ring);
        d.stop();
    };
    blocked_locks_in_flight_then_flushed => |ring| {
        let d = TestDaemon::start_with(2, 1024, OffloadPolicy::Auto);
        scenarios::blocked_locks_then_flushed(d.dir.path(), |o| d.connect(o), ring);
        d.stop();
    };
    ring_reset_with_requests_in_flight => |ring| {
        let d = TestDaemon::start_with(2, 64, OffloadPolicy::Auto);
        scenarios::reset_with_requests_in_flight(d.dir.path(), |o| d.connect(o), ring);
        d.stop();
    };
    malformed_chains_and_messages_keep_the_queue_serving => |ring| {
        let d = TestDaemon::start(2);
        scenarios::malformed_chains_and_messages(d.dir.path(), |o| d.connect(o), ring);
        d.stop();
    };
}
