// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! vhost-user integration: a 128 MiB Tread through one indirect chain of
//! 32768 data descriptors (plus the request's), 1024 requests in flight, Tflush of a blocked Tlock, and
//! malformed chains and messages. The scenarios live in
//! `vhost_user_support::scenarios`, shared with `sandbox_vhost_user.rs`.

mod vhost_user_support;

use vhost_user_support::scenarios;
use vhost_user_support::*;
use virtio_9p_server::engine::OffloadPolicy;

#[test]
fn test_128m_read_through_32768_data_descriptor_indirect_chain() {
    let d = TestDaemon::start(2);
    scenarios::read_128m_through_indirect_chain(d.dir.path(), |o| d.connect(o));
    d.stop();
}

#[test]
fn test_1024_requests_in_flight_with_two_workers() {
    // Every call offloaded: each request waits for one of 2 workers, so
    // all 1024 are in flight at once.
    let d = TestDaemon::start_with(2, 1024, OffloadPolicy::Always);
    scenarios::requests_1024_in_flight(d.dir.path(), |o| d.connect(o));
    d.stop();
}

#[test]
fn test_1024_blocked_locks_in_flight_then_flushed() {
    let d = TestDaemon::start_with(2, 1024, OffloadPolicy::Auto);
    scenarios::blocked_locks_then_flushed(d.dir.path(), |o| d.connect(o));
    d.stop();
}

#[test]
fn test_malformed_chains_and_messages_keep_the_queue_serving() {
    let d = TestDaemon::start(2);
    scenarios::malformed_chains_and_messages(d.dir.path(), |o| d.connect(o));
    d.stop();
}
