// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The suite registry. Each suite lives in its own file and exposes
//! `ABOUT`, `READY` and `run(&Ctx) -> SuiteResult`.

mod coro_pool;
mod coro_pool_qemu;
mod mem_prealloc;
mod mlock_policy;
mod selftest;
mod virtio_9p;
mod virtio_9p_hostile;
mod virtqueue_large;

pub use virtio_9p::restart::serve_vhost_daemon as virtio_9p_vhost_daemon;
pub use virtio_9p::serve_socket_forever as virtio_9p_socket_server;

use crate::harness::{Ctx, SuiteResult};

/// One entry of the registry.
pub struct Suite {
    /// Name used on the command line and for the JSON file.
    pub name: &'static str,
    /// One-line description for `list`.
    pub about: &'static str,
    /// False while the suite's issue is still open; `all` skips it.
    pub ready: bool,
    /// Runs the suite.
    pub run: fn(&Ctx) -> SuiteResult,
}

/// Every suite, in report order.
pub const SUITES: &[Suite] = &[
    Suite {
        name: "selftest",
        about: selftest::ABOUT,
        ready: selftest::READY,
        run: selftest::run,
    },
    Suite {
        name: "coro-pool",
        about: coro_pool::ABOUT,
        ready: coro_pool::READY,
        run: coro_pool::run,
    },
    Suite {
        name: "mem-prealloc",
        about: mem_prealloc::ABOUT,
        ready: mem_prealloc::READY,
        run: mem_prealloc::run,
    },
    Suite {
        name: "mlock-policy",
        about: mlock_policy::ABOUT,
        ready: mlock_policy::READY,
        run: mlock_policy::run,
    },
    Suite {
        name: "virtqueue-large",
        about: virtqueue_large::ABOUT,
        ready: virtqueue_large::READY,
        run: virtqueue_large::run,
    },
    Suite {
        name: "virtio-9p",
        about: virtio_9p::ABOUT,
        ready: virtio_9p::READY,
        run: virtio_9p::run,
    },
    Suite {
        name: "virtio-9p-hostile",
        about: virtio_9p_hostile::ABOUT,
        ready: virtio_9p_hostile::READY,
        run: virtio_9p_hostile::run,
    },
    Suite {
        name: "virtio-9p-restart",
        about: virtio_9p::restart::ABOUT,
        ready: virtio_9p::restart::READY,
        run: virtio_9p::restart::run,
    },
    Suite {
        name: "virtio-9p-datapath",
        about: virtio_9p::datapath::ABOUT,
        ready: virtio_9p::datapath::READY,
        run: virtio_9p::datapath::run,
    },
];

/// Resolves command-line names; `all` means every ready suite.
pub fn select(names: &[String]) -> Result<Vec<&'static Suite>, String> {
    let mut selected: Vec<&'static Suite> = Vec::new();
    for name in names {
        if name == "all" {
            for suite in SUITES {
                if suite.ready {
                    selected.push(suite);
                } else {
                    eprintln!(
                        "vmm-benches: skipping suite {}: not implemented yet",
                        suite.name
                    );
                }
            }
            continue;
        }
        match SUITES.iter().find(|s| s.name == name) {
            Some(suite) => selected.push(suite),
            None => {
                let known: Vec<&str> = SUITES.iter().map(|s| s.name).collect();
                return Err(format!(
                    "unknown suite {name:?}; known suites: {}, all, list",
                    known.join(", ")
                ));
            }
        }
    }
    selected.dedup_by_key(|s| s.name);
    Ok(selected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_select_rejects_unknown_suite() {
        let err = select(&["nope".to_string()]).err().unwrap();
        assert!(err.contains("unknown suite \"nope\""), "{err}");
        assert!(err.contains("selftest"), "{err}");
    }

    #[test]
    fn test_select_all_takes_only_ready_suites() {
        let all = select(&["all".to_string()]).unwrap();
        assert!(all.iter().all(|s| s.ready));
        assert!(all.iter().any(|s| s.name == "selftest"));
    }
}
