// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The binary's planned handover, as an operator runs an upgrade: SIGUSR1
//! makes the daemon finish its requests, save the session in
//! `--state-dir` and exit 0; a new daemon with the same `--state-dir`
//! takes the session over and the frontend, reconnecting, goes on with
//! its fids. A state it cannot use stops it with one clear line, unless
//! `--discard-bad-state`.

mod vhost_user_support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vhost_user_support::scenarios::attach_open;
use vhost_user_support::*;
use virtio_9p_server::protocol::*;
use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout, VmmOptions};

const BIN: &str = env!("CARGO_BIN_EXE_virtio-9p-server");

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The daemon with its default sandbox, `--state-dir state`.
fn spawn(share: &Path, sock: &Path, state: &Path, extra: &[&str]) -> Daemon {
    let child = Command::new(BIN)
        .arg("--socket-path")
        .arg(sock)
        .arg("--shared-dir")
        .arg(share)
        .arg("--state-dir")
        .arg(state)
        .args(["--thread-pool-size", "2", "--log-level", "error"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    Daemon(child)
}

fn wait_socket(sock: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "the daemon did not bind");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_exit(d: &mut Daemon) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = d.0.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            d.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (status, err);
        }
        assert!(Instant::now() < deadline, "the daemon did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(d: &Daemon, sig: i32) {
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(d.0.id() as i32, sig) }, 0);
}

fn read_fid1(vmm: &mut FakeVmm) -> Rmessage {
    let read = Tmessage::Read(Tread {
        fid: 1,
        offset: 0,
        count: 64,
    });
    decode(&vmm.call(&frame(9, read), 128, Layout::Direct).unwrap()).1
}

#[test]
fn test_sigusr1_hands_the_session_to_the_next_daemon() {
    sigusr1_hands_the_session_over(false);
}

/// A packed ring, and the frontend back at the stale base QEMU sends
/// (it cannot read a packed ring's position back): the new daemon goes
/// on from the position the old one recorded in the state directory.
#[test]
fn test_sigusr1_hands_a_packed_ring_over_at_qemus_stale_base() {
    sigusr1_hands_the_session_over(true);
}

fn sigusr1_hands_the_session_over(packed: bool) {
    let share = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    std::fs::write(share.path().join("f"), b"kept across the upgrade").unwrap();
    let sock = run.path().join("vu.sock");
    let state = run.path().join("state");
    std::fs::create_dir(&state).unwrap();

    let mut old = spawn(share.path(), &sock, &state, &[]);
    wait_socket(&sock);
    let mut o = VmmOptions::default();
    o.mem_size = 16 << 20;
    o.queue_size = 256;
    o.packed = packed;
    let mut vmm = FakeVmm::connect(&sock, o).unwrap();
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "f", OpenFlags::RDONLY);
    // Past the stale base: the ring position is the daemon's only.
    for _ in 0..100 {
        assert!(matches!(read_fid1(&mut vmm), Rmessage::Read(_)));
    }

    signal(&old, libc::SIGUSR1);
    let (status, err) = wait_exit(&mut old);
    assert!(status.success(), "{status:?}: {err}");
    assert!(state.join("session.state").exists());

    let _new = spawn(share.path(), &sock, &state, &[]);
    vmm.reconnect_like_qemu(&sock).unwrap();
    // No Tversion, no Tattach: fid 1 is still open; the ring goes on
    // through a wrap.
    for _ in 0..300 {
        assert_eq!(
            read_fid1(&mut vmm),
            Rmessage::Read(b"kept across the upgrade".to_vec())
        );
    }
    // The state was used up: a later start does not take it again.
    assert!(!state.join("session.state").exists());
}

#[test]
fn test_a_bad_state_stops_the_start_with_one_line_unless_discarded() {
    let share = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    let sock = run.path().join("vu.sock");
    let state = run.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::write(state.join("session.state"), b"not state at all").unwrap();

    let mut refused = spawn(share.path(), &sock, &state, &[]);
    let (status, err) = wait_exit(&mut refused);
    assert_eq!(status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("virtio-9p-server: cannot take over ")
            && lines[0].contains("not a virtio-9p-server state file")
            && lines[0].contains("--discard-bad-state"),
        "{err}"
    );
    assert!(
        state.join("session.state").exists(),
        "left for the operator"
    );

    let d = spawn(share.path(), &sock, &state, &["--discard-bad-state"]);
    wait_socket(&sock);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !state.join("session.state.refused").exists() {
        assert!(Instant::now() < deadline, "the bad state was not set aside");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!state.join("session.state").exists());
    let mut o = VmmOptions::default();
    o.mem_size = 16 << 20;
    o.queue_size = 256;
    let mut vmm = FakeVmm::connect(&sock, o).unwrap();
    assert_eq!(version(&mut vmm, 65536), 65536);
    drop(d);
}
