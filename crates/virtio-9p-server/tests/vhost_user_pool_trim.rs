// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon's coroutine stack pool trims on an interval by default: a
//! burst to 1024 requests in flight is followed, two trim passes after the
//! daemon goes idle, by a pool back at its thread-local batches. (The
//! `--stack-trim-interval-ms` default is pinned by the binary's unit tests.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use coro_pool::Coroutine;
use virtio_9p_server::engine::OffloadPolicy;
use virtio_9p_server::vhost_user::{Daemon, DaemonConfig, Listen};
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server};

#[test]
fn test_daemon_pool_falls_back_within_two_trim_intervals() {
    let dir = tempfile::tempdir().unwrap();
    let sock_dir = tempfile::tempdir().unwrap();
    let fs = PassthroughFs::new(PassthroughConfig::new(dir.path())).unwrap();
    let server = Arc::new(Server::new(fs, Config::default()).unwrap());
    let interval = Duration::from_millis(100);
    let mut config = DaemonConfig::default();
    config.listen = Listen::Path(sock_dir.path().join("vu.sock"));
    config.backend.engine.workers = 2;
    config.backend.engine.max_in_flight = 1024;
    config.backend.engine.offload = OffloadPolicy::Auto;
    config.stack_trim_interval = Some(interval);
    let daemon = Daemon::new(server, config).unwrap();
    let pool = daemon.stack_pool();
    assert_eq!(pool.trim_interval(), Some(interval));
    // 1024 requests in flight, as the engine runs them: its in-flight
    // limit reserved, one coroutine per request, each suspended on I/O.
    let in_flight = pool.reserve(1024);
    let mut requests: Vec<Coroutine<(), (), ()>> = (0..1024)
        .map(|_| {
            let mut co = Coroutine::new_in(pool, |y, ()| y.suspend(())).unwrap();
            co.resume(());
            co
        })
        .collect();
    let vps = pool.budget().vmas_per_stack;
    let burst_vmas = pool.stats().vmas_held;
    assert!(burst_vmas >= 1024 * vps);
    for co in &mut requests {
        co.resume(());
    }
    drop(requests);
    // Idle: count two trim passes from here (a hang guard, not a timing
    // assertion).
    let target = pool.stats().trims + 2;
    let deadline = Instant::now() + Duration::from_secs(60);
    while pool.stats().trims < target {
        assert!(Instant::now() < deadline, "the daemon's pool never trimmed");
        std::thread::sleep(Duration::from_millis(10));
    }
    let after = pool.stats();
    assert_eq!(after.pooled_global, 0, "{after:?}");
    assert!(after.vmas_held <= 2 * pool.batch_size() * vps, "{after:?}");
    assert!(after.vmas_held < burst_vmas);
    drop(in_flight);
}
