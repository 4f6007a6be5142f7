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
        Self::try_start_with(workers, &[])
    }

    /// [`BinDaemon::try_start`] with more options.
    fn try_start_with(workers: usize, extra: &[&str]) -> Option<BinDaemon> {
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
            .args(extra)
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

#[test]
fn test_sandboxed_live_migration_between_two_daemons() {
    // Dirty logging (the log mmap), the device-state save thread and
    // pipe on the source, the load thread and the restore (opens, OFD
    // lock) on the destination, all under the binary's filters.
    use vhost_user_support::{decode, frame};
    use virtio_9p_server::protocol::*;
    use virtio_9p_server::vhost_user::mock::Layout;
    let args = ["--export-name", "vol", "--migration-mode", "find-paths"];
    let Some(src) = BinDaemon::try_start_with(2, &args) else {
        return;
    };
    let Some(dst) = BinDaemon::try_start_with(2, &args) else {
        return;
    };
    for d in [&src, &dst] {
        std::fs::write(d.dir().join("f"), b"same tree, two paths").unwrap();
    }
    let mut vmm = src.connect(VmmOptions::default());
    vmm.open_file(Some(65536), "f", OpenFlags::RDWR).unwrap();
    let lock = Tmessage::Lock(Tlock {
        fid: 1,
        ty: LockType::Wrlck,
        flags: LockFlags::empty(),
        start: 0,
        length: 0,
        proc_id: 1,
        client_id: b"guest".to_vec(),
    });
    let call = |vmm: &mut FakeVmm, tag, m| {
        decode(&vmm.call(&frame(tag, m), 256, Layout::Direct).unwrap()).1
    };
    assert_eq!(call(&mut vmm, 2, lock), Rmessage::Lock(LockStatus::Success));
    vmm.start_dirty_log().unwrap();
    let read = |offset| {
        Tmessage::Read(Tread {
            fid: 1,
            offset,
            count: 4,
        })
    };
    assert_eq!(call(&mut vmm, 3, read(0)), Rmessage::Read(b"same".to_vec()));
    assert!(!vmm.dirty_pages().unwrap().is_empty());
    let base = vmm.stop_ring().unwrap();
    let state = vmm.save_device_state().unwrap();
    vmm.migrate_to(&dst.socket(), &state, base).unwrap();
    assert_eq!(call(&mut vmm, 4, read(5)), Rmessage::Read(b"tree".to_vec()));
    assert!(dst.log().contains("session restored"), "{}", dst.log());
    drop(vmm);
    src.stop();
    dst.stop();
}
