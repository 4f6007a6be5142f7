// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A daemon killed with SIGKILL under a running guest: with `--state-dir`
//! it kept its session crash-safe (a snapshot and a journal of fid
//! changes), so a new daemon with the same option takes the session over
//! and the frontend, reconnecting as QEMU does with `reconnect-ms`, goes
//! on with its fids, open files and locks. Damaged crash state stops the
//! start with one clear line, unless `--discard-bad-state`.

mod vhost_user_support;

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vhost_user_support::scenarios::{attach_open, blocking_lock, hold_lock, ofd_lock, Ring};
use vhost_user_support::*;
use virtio_9p_server::protocol::*;
use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout, Submitted, VmmOptions};
use virtqueue_large::mock::UsedEntry;

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
        .args(["--thread-pool-size", "2"])
        .args(if extra.contains(&"--log-level") {
            &[][..]
        } else {
            &["--log-level", "error"][..]
        })
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

/// How the frontend comes back to the new daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rejoin {
    /// At the used position of the ring (what a frontend that can read
    /// the position back sends).
    Used,
    /// As QEMU 10 does: a packed ring at the stale base it last knew.
    Qemu,
    /// At available index 0, as QEMU does when it never processed the
    /// ring itself (its `last_avail_idx` after a lost back-end).
    Zero,
}

fn rejoin(vmm: &mut FakeVmm, sock: &Path, how: Rejoin) {
    match how {
        Rejoin::Used => vmm.reconnect(sock).unwrap(),
        Rejoin::Qemu => vmm.reconnect_like_qemu(sock).unwrap(),
        Rejoin::Zero => vmm.reconnect_at(sock, 0).unwrap(),
    }
}

fn sigkill_keeps_the_session(ring: Ring, how: Rejoin) {
    let share = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir_in(TMPFS).unwrap();
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
    rejoin(&mut vmm, &sock, how);
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

/// The split ring rejoined at available index 0, more than a ring behind
/// the used index (about 400 requests on a 256-entry ring): the device
/// starts at the used index (it cannot have used chains it never took)
/// rather than finding the ring broken.
#[test]
fn test_sigkill_keeps_the_session_on_a_split_ring_rejoined_at_base_0() {
    sigkill_keeps_the_session(Ring::Split, Rejoin::Zero);
}

#[test]
fn test_sigkill_keeps_the_session_on_a_split_ring() {
    sigkill_keeps_the_session(Ring::Split, Rejoin::Qemu);
}

#[test]
fn test_sigkill_keeps_the_session_on_a_packed_ring() {
    sigkill_keeps_the_session(Ring::Packed, Rejoin::Used);
}

/// QEMU sends the packed ring's stale base at the reconnect: the new
/// daemon goes on from the position the killed one recorded.
#[test]
fn test_sigkill_keeps_the_session_on_a_packed_ring_at_qemus_stale_base() {
    sigkill_keeps_the_session(Ring::Packed, Rejoin::Qemu);
}

#[test]
fn test_damaged_crash_state_stops_the_start_unless_discarded() {
    let share = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir_in(TMPFS).unwrap();
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

/// The kinds of request the exactly-once test drives, one per index
/// modulo their number.
const KINDS: u32 = 16;

/// Request `i` of the batch and the fid it needs prepared, if any.
fn request(i: u32) -> Tmessage {
    let name = |p: &str| format!("{p}{i:05}").into_bytes();
    match i % KINDS {
        0 => Tmessage::Write(Twrite {
            fid: 1,
            offset: u64::from(i) * 16,
            data: format!("record {i:05}...\n").into_bytes(),
        }),
        1 => Tmessage::Mkdir(Tmkdir {
            dfid: 0,
            name: name("d"),
            mode: 0o755,
            gid: 0,
        }),
        2 => Tmessage::Lcreate(Tlcreate {
            fid: 10_000 + i,
            name: name("c"),
            flags: OpenFlags::RDWR | OpenFlags::CREATE | OpenFlags::EXCL,
            mode: 0o644,
            gid: 0,
        }),
        3 => Tmessage::Symlink(Tsymlink {
            fid: 0,
            name: name("s"),
            symtgt: b"log".to_vec(),
            gid: 0,
        }),
        4 => Tmessage::Mknod(Tmknod {
            dfid: 0,
            name: name("n"),
            mode: libc::S_IFIFO | 0o644,
            major: 0,
            minor: 0,
            gid: 0,
        }),
        5 => Tmessage::Link(Tlink {
            dfid: 0,
            fid: 1,
            name: name("l"),
        }),
        6 => Tmessage::Unlinkat(Tunlinkat {
            dirfid: 0,
            name: name("u"),
            flags: UnlinkFlags::empty(),
        }),
        7 => Tmessage::Renameat(Trenameat {
            olddirfid: 0,
            oldname: name("r"),
            newdirfid: 0,
            newname: name("moved"),
        }),
        8 => Tmessage::Remove(Tfid { fid: 10_000 + i }),
        9 => Tmessage::Setattr(Tsetattr {
            fid: 10_000 + i,
            valid: SetattrMask::SIZE,
            mode: 0,
            uid: 0,
            gid: 0,
            size: u64::from(i) + 1,
            atime_sec: 0,
            atime_nsec: 0,
            mtime_sec: 0,
            mtime_nsec: 0,
        }),
        10 => Tmessage::Walk(Twalk {
            fid: 0,
            newfid: 10_000 + i,
            wnames: vec![b"log".to_vec()],
        }),
        11 => Tmessage::Clunk(Tfid { fid: 10_000 + i }),
        12 => Tmessage::Lopen(Tlopen {
            fid: 10_000 + i,
            flags: OpenFlags::RDONLY,
        }),
        13 => Tmessage::Xattrwalk(Txattrwalk {
            fid: 0,
            newfid: 10_000 + i,
            name: Vec::new(),
        }),
        14 => Tmessage::Getattr(Tgetattr {
            fid: 1,
            request_mask: GetattrMask::BASIC,
        }),
        // Waits in the server while the host holds the file's lock: taken
        // and not answered when the daemon is killed, with later requests
        // answered already.
        _ => Tmessage::Lock(Tlock {
            fid: 2,
            ty: LockType::Wrlck,
            flags: LockFlags::BLOCK,
            start: u64::from(i),
            length: 1,
            proc_id: i,
            client_id: b"guest".to_vec(),
        }),
    }
}

/// What request `i` needs before the batch: a file and a fid walked to it
/// or to the root.
fn prepare(vmm: &mut FakeVmm, share: &Path, i: u32) {
    let walk = |vmm: &mut FakeVmm, names: Vec<Vec<u8>>| {
        let m = Tmessage::Walk(Twalk {
            fid: 0,
            newfid: 10_000 + i,
            wnames: names,
        });
        let r = call(vmm, 30, m);
        assert!(matches!(r, Rmessage::Walk(_)), "{r:?}");
    };
    let file = |p: &str| {
        let n = format!("{p}{i:05}");
        std::fs::write(share.join(&n), b"x").unwrap();
        n.into_bytes()
    };
    match i % KINDS {
        2 => walk(vmm, Vec::new()),
        6 => {
            file("u");
        }
        7 => {
            file("r");
        }
        8 => {
            let n = file("x");
            walk(vmm, vec![n]);
        }
        9 => {
            let n = file("t");
            walk(vmm, vec![n]);
        }
        11 | 12 => walk(vmm, vec![b"log".to_vec()]),
        _ => {}
    }
}

/// Checks what request `i` left in the export.
fn check_effect(share: &Path, i: u32, log: &[u8]) {
    let p = |pre: &str| share.join(format!("{pre}{i:05}"));
    match i % KINDS {
        0 => {
            let at = i as usize * 16;
            assert_eq!(&log[at..at + 16], format!("record {i:05}...\n").as_bytes());
        }
        1 => assert!(p("d").is_dir()),
        2 => assert!(p("c").is_file()),
        3 => assert!(p("s").symlink_metadata().unwrap().file_type().is_symlink()),
        4 => assert!(p("n").symlink_metadata().is_ok()),
        5 => assert!(p("l").is_file()),
        6 => assert!(!p("u").exists()),
        7 => assert!(!p("r").exists() && p("moved").exists()),
        8 => assert!(!p("x").exists()),
        9 => assert_eq!(p("t").metadata().unwrap().len(), u64::from(i) + 1),
        _ => {}
    }
}

fn reply_ok(i: u32, r: &Rmessage) -> bool {
    matches!(
        (i % KINDS, r),
        (0, Rmessage::Write(16))
            | (1, Rmessage::Mkdir(_))
            | (2, Rmessage::Lcreate(..))
            | (3, Rmessage::Symlink(_))
            | (4, Rmessage::Mknod(_))
            | (5, Rmessage::Link)
            | (6, Rmessage::Unlinkat)
            | (7, Rmessage::Renameat)
            | (8, Rmessage::Remove)
            | (9, Rmessage::Setattr)
            | (10, Rmessage::Walk(_))
            | (11, Rmessage::Clunk)
            | (12, Rmessage::Lopen(..))
            | (13, Rmessage::Xattrwalk(_))
            | (14, Rmessage::Getattr(_))
            | (15, Rmessage::Lock(LockStatus::Success))
    )
}

/// 1024 requests of every kind in flight, the daemon killed with SIGKILL
/// in their midst, a new one started on the same state: every request is
/// answered once, with success, and did what it does once.
fn kill_in_flight_runs_each_request_once(ring: Ring, how: Rejoin) {
    const N: u32 = 1024;
    let share = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir_in(TMPFS).unwrap();
    std::fs::write(share.path().join("log"), vec![b'.'; N as usize * 16]).unwrap();
    let sock = run.path().join("vu.sock");
    let state = run.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let mut old = spawn(share.path(), &sock, &state, &[]);
    wait_socket(&sock);
    let mut o = ring.opts(VmmOptions::default());
    o.mem_size = 64 << 20;
    o.queue_size = 1024;
    let mut vmm = FakeVmm::connect(&sock, o).unwrap();
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "log", OpenFlags::RDWR);
    std::fs::write(share.path().join("lockme"), b"l").unwrap();
    let holder = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(share.path().join("lockme"))
        .unwrap();
    ofd_lock(&holder, libc::F_WRLCK);
    assert!(matches!(walk(&mut vmm, 2, &["lockme"]), Rmessage::Walk(_)));
    let open = Tmessage::Lopen(Tlopen {
        fid: 2,
        flags: OpenFlags::RDWR,
    });
    assert!(matches!(call(&mut vmm, 5, open), Rmessage::Lopen(..)));
    for i in 0..N {
        prepare(&mut vmm, share.path(), i);
    }
    // The batch, tag i + 1 for request i, streamed as a guest does (a
    // kick every 8 requests); the daemon is killed half-way, and the
    // guest goes on making requests available while it is dead.
    let mut subs = HashMap::new();
    let mut answered: HashMap<u32, Vec<Rmessage>> = HashMap::new();
    let take = |vmm: &mut FakeVmm,
                subs: &HashMap<u32, (u32, Submitted)>,
                answered: &mut HashMap<u32, Vec<Rmessage>>,
                used: Vec<UsedEntry>| {
        for u in used {
            let (i, s) = subs[&u.id];
            let (tag, r) = decode(&vmm.read(s.reply_addr, u.len as usize).unwrap());
            assert_eq!(tag, i as u16 + 1);
            answered.entry(i).or_default().push(r);
        }
    };
    let mut killed = None;
    for i in 0..N {
        let frame = frame(i as u16 + 1, request(i));
        let s = vmm
            .submit(&frame, 256, Layout::Indirect { seg: 256 })
            .unwrap();
        subs.insert(u32::from(s.head), (i, s));
        if i % 8 == 7 {
            vmm.kick().unwrap();
        }
        let used = vmm.collect_used().unwrap();
        take(&mut vmm, &subs, &mut answered, used);
        if i == N / 2 {
            // Mid-flight: some answered, others taken and waiting.
            let deadline = Instant::now() + Duration::from_secs(20);
            while answered.len() < 100 {
                assert!(Instant::now() < deadline, "the batch is not served");
                let used = vmm.wait_used(Duration::from_millis(50)).unwrap();
                take(&mut vmm, &subs, &mut answered, used);
            }
            kill9(&mut old, &sock);
            killed = Some(Instant::now());
            let used = vmm.collect_used().unwrap();
            take(&mut vmm, &subs, &mut answered, used);
        }
    }
    let killed = killed.unwrap();
    let before = answered.len();
    assert!(before < N as usize, "everything was done before the kill");

    let mut new = spawn(share.path(), &sock, &state, &["--log-level", "info"]);
    rejoin(&mut vmm, &sock, how);
    vmm.kick().unwrap();
    let mut first = None;
    let mut held = Some(holder);
    let deadline = Instant::now() + Duration::from_secs(30);
    while answered.len() < N as usize && Instant::now() < deadline {
        let used = vmm.wait_used(Duration::from_millis(100)).unwrap();
        if !used.is_empty() && first.is_none() {
            first = Some(killed.elapsed());
        }
        take(&mut vmm, &subs, &mut answered, used);
        if first.is_some() {
            // The waiting Tlocks get the lock now.
            if let Some(h) = held.take() {
                ofd_lock(&h, libc::F_UNLCK);
            }
        }
    }
    eprintln!(
        "{ring:?} ring, {how:?} rejoin: {before} of {N} answered before the kill; kill -9 to the first reply of the new daemon: {:?}",
        first
    );
    // Nothing more comes.
    std::thread::sleep(Duration::from_millis(200));

    let used = vmm.collect_used().unwrap();
    take(&mut vmm, &subs, &mut answered, used);
    let log = std::fs::read(share.path().join("log")).unwrap();
    for i in 0..N {
        let replies = answered
            .get(&i)
            .unwrap_or_else(|| panic!("request {i} ({:?}) never answered", request(i)));
        assert_eq!(
            replies.len(),
            1,
            "request {i} answered {} times",
            replies.len()
        );
        assert!(
            reply_ok(i, &replies[0]),
            "request {i} ({:?}): {:?}",
            request(i),
            replies[0]
        );
        check_effect(share.path(), i, &log);
    }
    // The fids the batch made or kept are there once, those it clunked
    // or removed are gone.
    for i in 0..N {
        let fid = 10_000 + i;
        let r = call(&mut vmm, 40, Tmessage::Clunk(Tfid { fid }));
        match i % KINDS {
            2 | 9 | 10 | 12 | 13 => assert_eq!(r, Rmessage::Clunk, "fid of request {i}"),
            8 | 11 => assert_eq!(
                r,
                Rmessage::Lerror(libc::EBADF as u32),
                "fid of request {i}"
            ),
            _ => {}
        }
    }
    // What the new daemon found (its log, for the test's output).
    kill9(&mut new, &sock);
    let mut err = String::new();
    use std::io::Read;
    new.0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    for l in err.lines().filter(|l| {
        l.contains("recovery at")
            || l.contains("in-flight table")
            || l.contains("cannot be served")
            || l.contains("stale base")
    }) {
        eprintln!("{l}");
    }
}

#[test]
fn test_kill_in_flight_runs_each_request_once_on_a_split_ring() {
    kill_in_flight_runs_each_request_once(Ring::Split, Rejoin::Qemu);
}

#[test]
fn test_kill_in_flight_runs_each_request_once_on_a_packed_ring() {
    kill_in_flight_runs_each_request_once(Ring::Packed, Rejoin::Used);
}

/// The packed ring rejoined at QEMU's stale base: the chains the killed
/// daemon took and did not answer are served from its table, the others
/// are taken where it left off.
#[test]
fn test_kill_in_flight_runs_each_request_once_on_a_packed_ring_at_qemus_stale_base() {
    kill_in_flight_runs_each_request_once(Ring::Packed, Rejoin::Qemu);
}

/// A daemon killed with requests in flight, then the guest is reset while
/// no daemon runs (fresh memory, the same ring layout, base 0: a reboot),
/// and the new daemon comes up with the killed one's in-flight table. The
/// new guest makes the same kind of requests at the same positions with
/// the same tags, as Linux does each boot: none of them gets the dead
/// guest's recorded reply or is passed over, nothing is written into the
/// new guest's memory for the dead guest's chains, and no used entry
/// appears for them.
fn a_reset_guest_gets_nothing_of_the_dead_one(ring: Ring) {
    let share = tempfile::tempdir().unwrap();
    let run = tempfile::tempdir_in(TMPFS).unwrap();
    std::fs::write(share.path().join("lockme"), b"x").unwrap();
    let sock = run.path().join("vu.sock");
    let state = run.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let opts = || {
        let mut o = ring.opts(VmmOptions::default());
        o.mem_size = 16 << 20;
        o.queue_size = 64;
        o
    };
    let mkdir = |name: &str| {
        Tmessage::Mkdir(Tmkdir {
            dfid: 0,
            name: name.as_bytes().to_vec(),
            mode: 0o755,
            gid: 0,
        })
    };

    // The first guest: a directory made, four Tlocks waiting on the
    // host's lock when the daemon is killed.
    let mut old = spawn(share.path(), &sock, &state, &[]);
    wait_socket(&sock);
    let mut vmm = FakeVmm::connect(&sock, opts()).unwrap();
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "lockme", OpenFlags::RDWR);
    assert!(matches!(call(&mut vmm, 30, mkdir("a")), Rmessage::Mkdir(_)));
    let holder = hold_lock(&share.path().join("lockme"));
    let waiting: Vec<_> = (100..104u16)
        .map(|tag| vmm.submit(&blocking_lock(tag), 64, Layout::Direct).unwrap())
        .collect();
    vmm.kick().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(vmm.collect_used().unwrap().is_empty(), "the locks wait");
    kill9(&mut old, &sock);
    drop(vmm);
    ofd_lock(&holder, libc::F_UNLCK);

    // The reset guest, on the new daemon.
    let _new = spawn(share.path(), &sock, &state, &[]);
    wait_socket(&sock);
    let mut vmm = FakeVmm::connect(&sock, opts()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        vmm.collect_used().unwrap().is_empty(),
        "a dead guest's chain was answered"
    );
    for s in &waiting {
        let now = vmm.read(s.reply_addr, 64).unwrap();
        assert!(
            now.iter().all(|b| *b == 0),
            "a dead guest's reply was written"
        );
    }
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "lockme", OpenFlags::RDWR);
    let r = call(&mut vmm, 30, mkdir("b"));
    assert!(matches!(r, Rmessage::Mkdir(_)), "{r:?}");
    assert!(
        share.path().join("b").is_dir(),
        "the new guest's Tmkdir got the dead guest's reply and did not run"
    );
    let r = decode(&vmm.call(&blocking_lock(100), 64, Layout::Direct).unwrap());
    assert_eq!(r, (100, Rmessage::Lock(LockStatus::Success)));
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        vmm.collect_used().unwrap().is_empty(),
        "a dead guest's chain came back"
    );
}

#[test]
fn test_a_reset_guest_gets_nothing_of_the_dead_one_on_a_split_ring() {
    a_reset_guest_gets_nothing_of_the_dead_one(Ring::Split);
}

#[test]
fn test_a_reset_guest_gets_nothing_of_the_dead_one_on_a_packed_ring() {
    a_reset_guest_gets_nothing_of_the_dead_one(Ring::Packed);
}
