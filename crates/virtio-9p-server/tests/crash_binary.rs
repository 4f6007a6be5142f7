// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A daemon killed with SIGKILL under a running guest: with `--state-dir`
//! it kept its session crash-safe (a snapshot and a journal of fid
//! changes), so a new daemon with the same option takes the session over
//! and the frontend, reconnecting as QEMU does with `reconnect-ms`, goes
//! on with its fids, open files and locks. Damaged crash state stops the
//! start with one clear line, unless `--discard-bad-state`.

mod vhost_user_support;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vhost_user_support::scenarios::{attach_open, Ring};
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

/// The daemon (in its own process group: its sandbox forks the serving
/// process into a pid namespace) with `--state-dir state`.
fn spawn(share: &Path, sock: &Path, state: &Path, extra: &[&str]) -> Daemon {
    use std::os::unix::process::CommandExt;
    let child = Command::new(BIN)
        .process_group(0)
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
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// SIGKILL to the daemon's process group (the supervisor and the
/// serving process, as `systemctl kill -s KILL` does to a unit), then
/// waits until nothing listens on `sock` any more.
fn kill9(d: &mut Daemon, sock: &Path) {
    // SAFETY: kill(2) on our own child's process group.
    assert_eq!(unsafe { libc::kill(-(d.0.id() as i32), libc::SIGKILL) }, 0);
    let status = d.0.wait().unwrap();
    assert!(!status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::os::unix::net::UnixStream::connect(sock) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                ) =>
            {
                return
            }
            _ => {}
        }
        assert!(Instant::now() < deadline, "the killed daemon still listens");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn call(vmm: &mut FakeVmm, tag: u16, m: Tmessage) -> Rmessage {
    decode(&vmm.call(&frame(tag, m), 256, Layout::Direct).unwrap()).1
}

fn walk(vmm: &mut FakeVmm, newfid: u32, names: &[&str]) -> Rmessage {
    let m = Tmessage::Walk(Twalk {
        fid: 0,
        newfid,
        wnames: names.iter().map(|n| n.as_bytes().to_vec()).collect(),
    });
    call(vmm, 20, m)
}

/// Whether a host process can take a write lock on `path` now.
fn host_can_lock(path: &Path) -> bool {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    // SAFETY: a zeroed flock is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    // SAFETY: a valid fd and flock pointer for the call.
    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &fl) == 0 }
}

fn sigkill_keeps_the_session(ring: Ring) {
    let share = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    std::fs::write(share.path().join("f"), b"still open after kill -9").unwrap();
    std::fs::write(share.path().join("lockme"), b"x").unwrap();
    std::fs::create_dir(share.path().join("sub")).unwrap();
    std::fs::write(share.path().join("sub/g"), b"g").unwrap();
    let sock = run.path().join("vu.sock");
    let state = run.path().join("state");
    std::fs::create_dir(&state).unwrap();

    let mut old = spawn(share.path(), &sock, &state, &[]);
    wait_socket(&sock);
    let mut o = ring.opts(VmmOptions::default());
    o.mem_size = 16 << 20;
    o.queue_size = 256;
    let mut vmm = FakeVmm::connect(&sock, o).unwrap();
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "f", OpenFlags::RDONLY);
    // Fid 2: a file opened read-write with a lock granted.
    assert!(matches!(walk(&mut vmm, 2, &["lockme"]), Rmessage::Walk(_)));
    let open = Tmessage::Lopen(Tlopen {
        fid: 2,
        flags: OpenFlags::RDWR,
    });
    assert!(matches!(call(&mut vmm, 5, open), Rmessage::Lopen(..)));
    let lock = |proc_id| {
        Tmessage::Lock(Tlock {
            fid: 2,
            ty: LockType::Wrlck,
            flags: LockFlags::empty(),
            start: 0,
            length: 0,
            proc_id,
            client_id: b"guest".to_vec(),
        })
    };
    assert_eq!(
        call(&mut vmm, 6, lock(1)),
        Rmessage::Lock(LockStatus::Success)
    );
    // Fid 3: a directory below the root; fids 10..200 walked and most
    // clunked again (journal records, no save).
    assert!(matches!(walk(&mut vmm, 3, &["sub"]), Rmessage::Walk(_)));
    for fid in 10..200u32 {
        assert!(matches!(
            walk(&mut vmm, fid, &["sub", "g"]),
            Rmessage::Walk(_)
        ));
        if fid % 10 != 0 {
            assert_eq!(
                call(&mut vmm, 7, Tmessage::Clunk(Tfid { fid })),
                Rmessage::Clunk
            );
        }
    }
    assert!(!host_can_lock(&share.path().join("lockme")));

    kill9(&mut old, &sock);
    let killed = Instant::now();
    // The kill released the old process's lock; the new daemon takes it
    // again before it serves.
    let _new = spawn(share.path(), &sock, &state, &[]);
    vmm.reconnect(&sock).unwrap();
    let read = Tmessage::Read(Tread {
        fid: 1,
        offset: 0,
        count: 64,
    });
    let first = call(&mut vmm, 9, read);
    let took = killed.elapsed();
    assert_eq!(first, Rmessage::Read(b"still open after kill -9".to_vec()));
    eprintln!("kill -9 to the first reply of the new daemon ({ring:?} ring): {took:?}");

    // The lock is held again, by the new daemon, for fid 2.
    assert!(!host_can_lock(&share.path().join("lockme")));
    assert_eq!(
        call(&mut vmm, 10, lock(1)),
        Rmessage::Lock(LockStatus::Success),
        "the guest's own lock"
    );
    // The directory fid walks on; the kept fids are there, the clunked
    // ones are not.
    let r = call(
        &mut vmm,
        11,
        Tmessage::Walk(Twalk {
            fid: 3,
            newfid: 4,
            wnames: vec![b"g".to_vec()],
        }),
    );
    assert!(matches!(r, Rmessage::Walk(ref q) if q.len() == 1), "{r:?}");
    for fid in 10..200u32 {
        let r = call(&mut vmm, 12, Tmessage::Clunk(Tfid { fid }));
        if fid % 10 == 0 {
            assert_eq!(r, Rmessage::Clunk, "fid {fid} kept");
        } else {
            assert_eq!(r, Rmessage::Lerror(libc::EBADF as u32), "fid {fid} clunked");
        }
    }
    // A clean end (the frontend leaves) removes the crash state.
    drop(vmm);
    let deadline = Instant::now() + Duration::from_secs(10);
    while state.join("session.snap").exists() {
        assert!(Instant::now() < deadline, "the crash state stayed");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn test_sigkill_keeps_the_session_on_a_split_ring() {
    sigkill_keeps_the_session(Ring::Split);
}

#[test]
fn test_sigkill_keeps_the_session_on_a_packed_ring() {
    sigkill_keeps_the_session(Ring::Packed);
}

#[test]
fn test_damaged_crash_state_stops_the_start_unless_discarded() {
    let share = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir().unwrap();
    let sock = run.path().join("vu.sock");
    let state = run.path().join("state");
    std::fs::create_dir(&state).unwrap();
    // A snapshot of a daemon that served this export, damaged.
    let mut old = spawn(share.path(), &sock, &state, &[]);
    wait_socket(&sock);
    let mut vmm = FakeVmm::connect(&sock, VmmOptions::default()).unwrap();
    version(&mut vmm, 65536);
    kill9(&mut old, &sock);
    drop(vmm);
    let snap = state.join("session.snap");
    let mut bytes = std::fs::read(&snap).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&snap, &bytes).unwrap();

    let mut refused = spawn(share.path(), &sock, &state, &[]);
    let status = refused.0.wait().unwrap();
    let mut err = String::new();
    use std::io::Read;
    refused
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("virtio-9p-server: cannot take over ")
            && lines[0].contains("session.snap")
            && lines[0].contains("checksum")
            && lines[0].contains("--discard-bad-state"),
        "{err}"
    );

    let _d = spawn(share.path(), &sock, &state, &["--discard-bad-state"]);
    wait_socket(&sock);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !state.join("session.snap.refused").exists() {
        assert!(Instant::now() < deadline, "the bad state was not set aside");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut vmm = FakeVmm::connect(&sock, VmmOptions::default()).unwrap();
    assert_eq!(version(&mut vmm, 65536), 65536);
}
