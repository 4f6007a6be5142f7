// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The heavy vhost-user scenarios of `vhost_user_requests.rs` against the
//! binary under its default hardening (namespace sandbox, seccomp kill):
//! a 128 MiB Tread through one indirect chain, 1024 requests in flight,
//! Tflush of blocked Tlocks on the worker pool, and malformed chains and
//! messages; and 20 reconnects, each starting fresh worker threads under
//! their own filter. The export is a local temp dir, so the short metadata
//! calls run on the vring thread. Any syscall missing from the allow-lists kills the
//! daemon, and `stop` checks that it exited 0. Skips with a notice where
//! namespaces cannot be created. The scenarios live in
//! `vhost_user_support::scenarios`.

mod sandbox_support;
mod vhost_user_support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vhost_user_support::scenarios::{self, Ring};
use virtio_9p_server::vhost_user::mock::{FakeVmm, VmmOptions};

const BIN: &str = env!("CARGO_BIN_EXE_virtio-9p-server");

/// The binary with its default hardening on a temp export and socket.
struct BinDaemon {
    tmp: tempfile::TempDir,
    child: Option<Child>,
}

impl BinDaemon {
    /// `None` (after a notice) where namespaces cannot be created.
    fn try_start(workers: usize) -> Option<BinDaemon> {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("export")).unwrap();
        let log = std::fs::File::create(tmp.path().join("log")).unwrap();
        let child = Command::new(BIN)
            .arg("--shared-dir")
            .arg(tmp.path().join("export"))
            .arg("--socket-path")
            .arg(tmp.path().join("vu.sock"))
            .args(["--thread-pool-size", &workers.to_string()])
            // Several frontends connect one after another.
            .arg("--keep-serving")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut d = BinDaemon {
            tmp,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        // Logged right after the sandbox and seccomp line.
        while !d.log().contains("metadata calls ") {
            if let Some(st) = d.child.as_mut().unwrap().try_wait().unwrap() {
                d.child = None;
                if d.log().contains("cannot create namespaces") {
                    eprintln!("SKIP: namespaces cannot be created here: {}", d.log());
                    return None;
                }
                panic!("daemon exited ({st:?}): {}", d.log());
            }
            assert!(Instant::now() < deadline, "daemon not ready: {}", d.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        // The export is a local temp dir: the scenarios' walks, getattrs
        // and clunks run on the vring thread, under the process-wide
        // filter.
        assert!(d.log().contains("metadata calls inline"), "{}", d.log());
        Some(d)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.tmp.path().join("log")).unwrap_or_default()
    }

    fn dir(&self) -> PathBuf {
        self.tmp.path().join("export")
    }

    fn socket(&self) -> PathBuf {
        self.tmp.path().join("vu.sock")
    }

    fn connect(&self, opts: VmmOptions) -> FakeVmm {
        FakeVmm::connect(&self.socket(), opts).unwrap()
    }

    /// SIGTERM; the daemon must exit 0 (not be killed by seccomp).
    fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        assert!(
            child.try_wait().unwrap().is_none(),
            "daemon died: {}",
            self.log()
        );
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        let st = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            assert!(
                Instant::now() < deadline,
                "no exit on SIGTERM: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(st.code(), Some(0), "{st:?}: {}", self.log());
        assert!(!self.socket().exists(), "the supervisor removes the socket");
    }
}

impl Drop for BinDaemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn test_sandboxed_128m_read_through_indirect_chain() {
    let Some(d) = BinDaemon::try_start(2) else {
        return;
    };
    scenarios::read_128m_through_indirect_chain(&d.dir(), |o| d.connect(o), Ring::Split);
    d.stop();
}

#[test]
fn test_sandboxed_1024_requests_in_flight() {
    let Some(d) = BinDaemon::try_start(2) else {
        return;
    };
    scenarios::requests_1024_in_flight(&d.dir(), |o| d.connect(o), Ring::Split);
    d.stop();
}

#[test]
fn test_sandboxed_blocked_locks_then_flushed() {
    let Some(d) = BinDaemon::try_start(4) else {
        return;
    };
    scenarios::blocked_locks_then_flushed(&d.dir(), |o| d.connect(o), Ring::Split);
    d.stop();
}

#[test]
fn test_sandboxed_malformed_chains_and_messages() {
    let Some(d) = BinDaemon::try_start(2) else {
        return;
    };
    scenarios::malformed_chains_and_messages(&d.dir(), |o| d.connect(o), Ring::Split);
    d.stop();
}

#[test]
fn test_sandboxed_packed_ring_reset_and_malformed_chains() {
    // The packed ring's paths (GET_VRING_BASE sync, packed walk and used
    // writes) under the binary's seccomp filter.
    let Some(d) = BinDaemon::try_start(2) else {
        return;
    };
    scenarios::reset_with_requests_in_flight(&d.dir(), |o| d.connect(o), Ring::Packed);
    scenarios::malformed_chains_and_messages(&d.dir(), |o| d.connect(o), Ring::Packed);
    d.stop();
}

#[test]
fn test_sandboxed_reconnects_start_fresh_filtered_workers() {
    // Every connection builds a new engine, whose worker threads stack
    // their own filter as they start; a missing entry in either list
    // kills the daemon.
    let Some(d) = BinDaemon::try_start(2) else {
        return;
    };
    for _ in 0..20 {
        std::fs::write(d.dir().join("hello"), b"hello world").unwrap();
        sandbox_support::vhost_mount_sequence(&d.socket());
    }
    d.stop();
}
