// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Shared helpers of the vhost-user integration tests: an in-process
//! daemon on a temp socket and 9P frame builders.
#![allow(dead_code)]

pub mod scenarios;

/// One test per ring layout for each scenario.
#[allow(unused_macros)]
macro_rules! on_both_rings {
    ($($name:ident => $run:expr;)*) => {
        $(
            mod $name {
                use super::*;

                #[test]
                fn test_split() {
                    ($run)(Ring::Split);
                }

                #[test]
                fn test_packed() {
                    ($run)(Ring::Packed);
                }
            }
        )*
    };
}

use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use virtio_9p_server::engine::OffloadPolicy;
use virtio_9p_server::protocol::{Rmessage, Tmessage, Tversion};
use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout, VmmOptions};
use virtio_9p_server::vhost_user::{Daemon, DaemonConfig, Listen, StopHandle};
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server};

pub struct TestDaemon {
    pub dir: tempfile::TempDir,
    pub sock_dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub server: Arc<Server<PassthroughFs>>,
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
}

impl TestDaemon {
    pub fn start(workers: usize) -> TestDaemon {
        Self::start_with(workers, 1024, OffloadPolicy::Auto)
    }

    pub fn start_with(workers: usize, queue_size: u16, offload: OffloadPolicy) -> TestDaemon {
        Self::start_offering(workers, queue_size, offload, true)
    }

    /// `packed_ring`: offer `VIRTIO_F_RING_PACKED`.
    pub fn start_offering(
        workers: usize,
        queue_size: u16,
        offload: OffloadPolicy,
        packed_ring: bool,
    ) -> TestDaemon {
        let dir = tempfile::tempdir().unwrap();
        let sock_dir = tempfile::tempdir().unwrap();
        let socket = sock_dir.path().join("vu.sock");
        let fs = PassthroughFs::new(PassthroughConfig::new(dir.path())).unwrap();
        let server = Arc::new(Server::new(fs, Config::default()).unwrap());
        let mut config = DaemonConfig::default();
        config.listen = Listen::Path(socket.clone());
        config.backend.queue_size = queue_size;
        config.backend.engine.workers = workers;
        config.backend.engine.max_in_flight = usize::from(queue_size);
        config.backend.engine.offload = offload;
        config.backend.packed_ring = packed_ring;
        let mut daemon = Daemon::new(Arc::clone(&server), config).unwrap();
        let stop = daemon.stop_handle();
        let thread = std::thread::spawn(move || daemon.run().unwrap());
        TestDaemon {
            dir,
            sock_dir,
            socket,
            server,
            stop,
            thread: Some(thread),
        }
    }

    pub fn connect(&self, opts: VmmOptions) -> FakeVmm {
        FakeVmm::connect(&self.socket, opts).unwrap()
    }

    pub fn stop(mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn frame(tag: u16, msg: Tmessage) -> Vec<u8> {
    msg.encode_frame(tag)
}

pub fn decode(reply: &[u8]) -> (u16, Rmessage) {
    Rmessage::decode_frame(reply, 128 << 20).unwrap()
}

/// Tversion with `msize`, returns the negotiated msize.
pub fn version(vmm: &mut FakeVmm, msize: u32) -> u32 {
    let req = frame(
        0xffff,
        Tmessage::Version(Tversion {
            msize,
            version: b"9P2000.L".to_vec(),
        }),
    );
    match decode(&vmm.call(&req, 64, Layout::Direct).unwrap()).1 {
        Rmessage::Version(v) => v.msize,
        other => panic!("unexpected {other:?}"),
    }
}

pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

pub fn status_kib(pid: &str, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
