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
/// A tmpfs for the state directory, as `--state-dir` requires.
const TMPFS: &str = "/dev/shm";

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
    let run = tempfile::tempdir_in(TMPFS).unwrap();
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
    let run = tempfile::tempdir_in(TMPFS).unwrap();
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

/// Starts the daemon with `--state-dir state` and returns its one line of
/// refusal (it must exit 1 before binding anything).
fn refused(share: &Path, sock: &Path, state: &Path) -> String {
    let mut d = spawn(share, sock, state, &[]);
    let (status, err) = wait_exit(&mut d);
    assert_eq!(status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with(&format!(
            "virtio-9p-server: state directory {} refused: ",
            state.display()
        )),
        "{err}"
    );
    assert!(!sock.exists(), "refused before binding");
    lines[0].to_owned()
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn test_a_state_dir_the_guest_can_reach_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    // The share on a tmpfs too, so that only the ancestry refuses.
    let share = tempfile::tempdir_in(TMPFS).unwrap();
    let run = tempfile::tempdir_in(TMPFS).unwrap();
    let sock = run.path().join("vu.sock");

    // Inside the share.
    let inside = share.path().join("state");
    std::fs::create_dir(&inside).unwrap();
    std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o700)).unwrap();
    let line = refused(share.path(), &sock, &inside);
    assert!(
        line.contains("inside it, where the guest could write it"),
        "{line}"
    );
    // The share itself.
    let line = refused(share.path(), &sock, share.path());
    assert!(line.contains("the shared directory"), "{line}");
    // Below a symlink into the share: the path's string is outside it.
    std::os::unix::fs::symlink(share.path(), run.path().join("via")).unwrap();
    let via = run.path().join("via/state");
    let line = refused(share.path(), &sock, &via);
    assert!(line.contains("inside it"), "{line}");
    // A symlink as the state dir, even to a good directory.
    let good = run.path().join("good");
    std::fs::create_dir(&good).unwrap();
    std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&good, run.path().join("link")).unwrap();
    let line = refused(share.path(), &sock, &run.path().join("link"));
    assert!(
        line.ends_with("it is a symlink; give the directory itself"),
        "{line}"
    );
    // Writable by group or others.
    for mode in [0o777, 0o720, 0o702] {
        let d = run.path().join(format!("mode{mode:o}"));
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
        let line = refused(share.path(), &sock, &d);
        assert!(
            line.contains(&format!("writable by group or others (mode 0{mode:o})")),
            "{line}"
        );
    }
    // Owned by another user (needs root to give it away).
    if is_root() {
        let d = run.path().join("theirs");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
        let line = refused(share.path(), &sock, &d);
        assert!(
            line.ends_with("it is owned by uid 65534, not by the daemon's uid 0"),
            "{line}"
        );
    } else {
        eprintln!("skipped the other owner's directory: not root");
    }
    // Nothing was written into any of them.
    assert_eq!(std::fs::read_dir(&inside).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(&good).unwrap().count(), 0);
}

#[test]
fn test_a_state_dir_not_on_a_tmpfs_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let share = tempfile::tempdir_in(TMPFS).unwrap();
    let run = tempfile::tempdir_in(TMPFS).unwrap();
    let sock = run.path().join("vu.sock");
    // The target directory is on the build's disk.
    let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let fs_type = {
        // SAFETY: an all-zero statfs is a valid value to overwrite.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        let c = std::ffi::CString::new(disk.path().as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string and a statfs buffer.
        assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut st) }, 0);
        st.f_type as i64
    };
    assert_ne!(
        fs_type, 0x0102_1994,
        "the target directory is on a tmpfs: this test needs a disk"
    );
    std::fs::set_permissions(disk.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let line = refused(share.path(), &sock, disk.path());
    assert!(line.contains("it is not on a tmpfs"), "{line}");
}

#[test]
fn test_a_second_daemon_on_the_same_state_dir_is_refused() {
    let share = tempfile::tempdir_in(TMPFS).unwrap();
    let run = tempfile::tempdir_in(TMPFS).unwrap();
    let state = run.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let sock = run.path().join("vu.sock");
    let first = spawn(share.path(), &sock, &state, &[]);
    wait_socket(&sock);
    let line = refused(share.path(), &run.path().join("second.sock"), &state);
    assert!(line.ends_with("another daemon is using it"), "{line}");
    // The first one still serves.
    let mut o = VmmOptions::default();
    o.mem_size = 16 << 20;
    o.queue_size = 256;
    let mut vmm = FakeVmm::connect(&sock, o).unwrap();
    assert_eq!(version(&mut vmm, 65536), 65536);
    drop(vmm);
    drop(first);
    // Once it is gone (its sandboxed child too, which holds the lock
    // with it), the directory is free again.
    let third = run.path().join("third.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut again = spawn(share.path(), &third, &state, &[]);
        while !third.exists() && again.0.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(10));
        }
        if third.exists() {
            break;
        }
        let (_, err) = wait_exit(&mut again);
        assert!(err.contains("another daemon is using it"), "{err}");
        assert!(Instant::now() < deadline, "the lock outlived the daemon");
        std::thread::sleep(Duration::from_millis(50));
    }
}
