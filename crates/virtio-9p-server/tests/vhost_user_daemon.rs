// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! vhost-user integration: 100 disconnect/reconnect cycles without fd or
//! memory growth, and the `virtio-9p-server` binary (`--mlock on-fault`,
//! SIGTERM, `--print-capabilities`, usage).
//!
//! The reconnect test counts this process's fds and RSS, which the other
//! tests change while they run (their FakeVmm holds a memfd, eventfds and
//! guest pages): it runs alone, in a child process of its own.

mod vhost_user_support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vhost_user_support::*;
use virtio_9p_server::protocol::*;
use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout, VmmOptions};

const BIN: &str = env!("CARGO_BIN_EXE_virtio-9p-server");

fn small() -> VmmOptions {
    {
        let mut o = VmmOptions::default();
        o.mem_size = 8 << 20;
        o.queue_size = 256;
        o
    }
}

fn one_session(vmm: &mut FakeVmm) {
    assert_eq!(version(vmm, 65536), 65536);
    let attach = Tmessage::Attach(Tattach {
        fid: 0,
        afid: NOFID,
        uname: b"root".to_vec(),
        aname: Vec::new(),
        n_uname: 0,
    });
    let r = decode(&vmm.call(&frame(1, attach), 64, Layout::Direct).unwrap()).1;
    assert!(matches!(r, Rmessage::Attach(_)), "{r:?}");
}

fn settle_fds(baseline: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = fd_count();
        if n <= baseline || Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `body` alone in a child process: this test binary re-run on test
/// `name` only, with a marker that makes the test run `body` there.
fn alone(name: &str, body: impl FnOnce()) {
    const MARKER: &str = "VHOST_USER_DAEMON_ALONE";
    if std::env::var(MARKER).is_ok_and(|v| v == name) {
        body();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(MARKER, name)
        .output()
        .unwrap();
    let text = format!(
        "{:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    // The filter matched: the body ran.
    assert!(text.contains("1 passed"), "{text}");
}

#[test]
fn test_100_reconnects_without_fd_or_memory_growth() {
    alone(
        "test_100_reconnects_without_fd_or_memory_growth",
        reconnects_without_growth,
    );
}

fn reconnects_without_growth() {
    let d = TestDaemon::start(2);
    // Warm up: first connection creates the lazily built parts.
    for _ in 0..5 {
        let mut vmm = d.connect(small());
        one_session(&mut vmm);
    }
    let fds = settle_fds(0);
    let rss = status_kib("self", "VmRSS:");
    for _ in 0..100 {
        let mut vmm = d.connect(small());
        one_session(&mut vmm);
    }
    let fds_after = settle_fds(fds);
    let rss_after = status_kib("self", "VmRSS:");
    assert!(fds_after <= fds, "fds grew from {fds} to {fds_after}");
    assert!(
        rss_after < rss + 16 * 1024,
        "RSS grew from {rss} KiB to {rss_after} KiB over 100 reconnects"
    );
    d.stop();
}

/// Kills the child if the test fails before it exits.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn test_binary_mlock_on_fault_reconnect_and_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("vu.sock");
    // A stale socket file from a killed daemon (nobody listens) is
    // replaced; tests/listen_safety.rs checks that nothing else is.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).unwrap();
    let share = tempfile::tempdir().unwrap();
    std::fs::write(share.path().join("f"), b"x").unwrap();
    let child = Command::new(BIN)
        .args(["--socket-path", sock.to_str().unwrap(), "--shared-dir"])
        .arg(share.path())
        .args([
            "--tag",
            "share",
            "--mlock",
            "on-fault",
            "--thread-pool-size",
            "2",
            "--keep-serving",
            "--log-level",
            "warn",
            // VmLck is read from this process: the namespace sandbox would
            // serve from a forked child (tests/sandbox_binary.rs covers it).
            "--sandbox",
            "none",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let pid = child.0.id().to_string();
    // Wait until the daemon has bound its own socket there (owner-only).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        use std::os::unix::fs::FileTypeExt;
        if std::fs::metadata(&sock)
            .map(|m| m.file_type().is_socket() && m.permissions().mode() & 0o777 == 0o600)
            .unwrap_or(false)
        {
            break;
        }
        assert!(Instant::now() < deadline, "daemon did not bind");
        std::thread::sleep(Duration::from_millis(10));
    }
    for _ in 0..2 {
        let mut vmm = FakeVmm::connect(&sock, small()).unwrap();
        one_session(&mut vmm);
        let vmlck = status_kib(&pid, "VmLck:");
        let rss = status_kib(&pid, "VmRSS:");
        // Every mapping is locked (MCL_FUTURE), but on-fault: only touched
        // pages become resident, so RSS stays far below the locked size.
        assert!(vmlck > 0, "--mlock on-fault locked nothing");
        assert!(rss < 256 * 1024, "RSS {rss} KiB: pages were populated");
        assert!(vmlck > rss, "VmLck {vmlck} KiB, VmRSS {rss} KiB");
    }
    // SIGTERM: clean exit 0, socket removed.
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= deadline {
            panic!("daemon did not exit on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status:?}");
    assert!(!sock.exists(), "socket left behind");
    wait_for(dir.path());
}

#[test]
fn test_binary_capabilities_and_usage() {
    let out = Command::new(BIN)
        .arg("--print-capabilities")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"type\": \"9p\""));
    let out = Command::new(BIN).output().unwrap();
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("--socket-path") && text.contains("--shared-dir"),
        "{text}"
    );
}

#[test]
fn test_binary_shared_dir_alone_prints_attach_help() {
    let dir = tempfile::tempdir().unwrap();
    let share = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("stdout.txt");
    let child = Command::new(BIN)
        .current_dir(dir.path())
        .arg("--shared-dir")
        .arg(share.path())
        .args(["--log-level", "error", "--tag", "hostfiles"])
        .stdout(std::fs::File::create(&out_path).unwrap())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let sock = dir.path().join("virtio-9p.sock");
    wait_for(&sock);
    // Serving (so the signal handlers are in place): one session.
    let mut vmm = FakeVmm::connect(&sock, small()).unwrap();
    one_session(&mut vmm);
    drop(vmm);
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.0.id() as i32, libc::SIGINT) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "daemon did not exit on SIGINT");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "{status:?}");
    let text = std::fs::read_to_string(&out_path).unwrap();
    // Stock QEMU >= 10.2's device; config_size = 2 + len("hostfiles").
    let sock = std::fs::canonicalize(dir.path())
        .unwrap()
        .join("virtio-9p.sock");
    let line = format!(
        "  qemu-system-x86_64 -m 1G \
         -object memory-backend-memfd,id=mem,size=1G,share=on -machine q35,memory-backend=mem \
         -chardev socket,id=vu,path={} \
         -device vhost-user-test-device-pci,chardev=vu,virtio-id=9,num_vqs=1,\
         config_size=11,vq_size=1024 ...\n",
        sock.display()
    );
    assert!(text.contains(&line), "{text}");
    assert!(text.contains(" hostfiles /mnt"), "{text}");
}
