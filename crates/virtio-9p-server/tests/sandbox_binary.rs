// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The hardened binary: every sandbox mode under `--seccomp
//! kill` serves the socket and vhost-user transports (the full path-escape
//! suite runs against it from `tests/escape.rs`); forbidden syscalls are
//! killed, logged or trapped; the worker threads carry their own filter;
//! capabilities,
//! the root directory, fd limits and id squashing are checked on the
//! running daemon. Tests that need namespaces skip with a notice where they
//! cannot be created.

mod common;
// The binary's sandbox code (src/daemon/sandbox/), compiled in as the
// binary does: it is no library module.
#[allow(dead_code, unused_imports)]
#[path = "../src/daemon/error.rs"]
mod error;
#[allow(dead_code, unused_imports)]
#[path = "../src/daemon/sandbox/mod.rs"]
mod sandbox;
mod sandbox_support;

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sandbox_support::{
    no_namespaces, version, vhost_mount_sequence, Daemon, SockClient, BIN, MODES,
};
use virtio_9p_server::protocol::{
    DirEntry, LockFlags, LockStatus, LockType, OpenFlags as of, SetattrMask, Tsetattr, UnlinkFlags,
};
use virtio_9p_server::vhost_user::mock::{FakeVmm, VmmOptions};

const ROOT: u32 = 0;
const SECRET: &[u8] = b"TOP SECRET";

/// A temp tree: `export/` (served) and `outside/secret` (must stay hidden).
struct Tree {
    tmp: tempfile::TempDir,
    export: PathBuf,
    outside: PathBuf,
}

fn tree() -> Tree {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&export).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), SECRET).unwrap();
    std::fs::write(export.join("hello"), b"hello world").unwrap();
    Tree {
        tmp,
        export,
        outside,
    }
}

impl Tree {
    fn sock(&self) -> PathBuf {
        self.tmp.path().join("9p.sock")
    }

    fn outside_untouched(&self) {
        assert_eq!(std::fs::read(self.outside.join("secret")).unwrap(), SECRET);
        assert_eq!(std::fs::read_dir(&self.outside).unwrap().count(), 1);
    }
}

/// Starts the socket daemon on `t` in `mode` under `--seccomp kill` plus
/// `extra`; `None` (skip) when namespace mode is impossible here.
fn socket_daemon(t: &Tree, mode: &str, extra: &[&str]) -> Option<Daemon> {
    sandbox_support::socket_daemon(
        &t.export,
        &t.sock(),
        t.tmp.path().join(format!("daemon-{mode}.log")),
        mode,
        extra,
    )
}

fn session(sock: &Path) -> SockClient {
    sandbox_support::session(sock, ROOT)
}

fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

fn names(entries: &[DirEntry]) -> Vec<String> {
    let mut v: Vec<_> = entries
        .iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .filter(|n| n != "." && n != "..")
        .collect();
    v.sort();
    v
}

fn setattr_msg(fid: u32, valid: SetattrMask) -> Tsetattr {
    Tsetattr {
        valid,
        ..common::setattr_base(fid)
    }
}

/// Every kind of operation, so each passthrough syscall runs under the
/// filter.
fn exercise(c: &mut SockClient, export: &Path) {
    // read an existing file
    c.walk(ROOT, 1, &[b"hello"]).unwrap();
    c.lopen(1, of::RDONLY).unwrap();
    assert_eq!(c.read(1, 0, 100).unwrap(), b"hello world");
    c.clunk(1).unwrap();
    // create, write, read back, fsync, truncate, chmod, chown, times
    c.walk(ROOT, 2, &[]).unwrap();
    c.lcreate(2, b"new", of::RDWR, 0o644, 0).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    let mut off = 0;
    while off < data.len() {
        let end = (off + 100_000).min(data.len());
        off += c.write(2, off as u64, &data[off..end]).unwrap() as usize;
    }
    assert_eq!(c.read(2, 1000, 16).unwrap(), &data[1000..1016]);
    c.fsync(2, false).unwrap();
    c.fsync(2, true).unwrap();
    let mut a = setattr_msg(
        2,
        SetattrMask::SIZE | SetattrMask::MODE | SetattrMask::UID | SetattrMask::GID,
    );
    a.size = 1234;
    a.mode = 0o600;
    a.uid = 4321;
    a.gid = 4322;
    c.setattr(a).unwrap();
    let mut a = setattr_msg(
        2,
        SetattrMask::ATIME | SetattrMask::MTIME | SetattrMask::ATIME_SET | SetattrMask::MTIME_SET,
    );
    a.mtime_sec = 1_000_000;
    c.setattr(a).unwrap();
    let st = std::fs::metadata(export.join("new")).unwrap();
    assert_eq!(
        (st.len(), st.mode() & 0o7777, st.uid(), st.gid(), st.mtime()),
        (1234, 0o600, 4321, 4322, 1_000_000)
    );
    assert_eq!(c.getattr(2).unwrap().size, 1234);
    // locks
    assert_eq!(
        c.lock(2, LockType::Wrlck, LockFlags::empty(), 0, 10)
            .unwrap(),
        LockStatus::Success
    );
    c.getlock(2, LockType::Wrlck, 0, 10).unwrap();
    c.clunk(2).unwrap();
    // directories, links, renames, removal
    c.mkdir(ROOT, b"dir", 0o755, 0).unwrap();
    c.walk(ROOT, 3, &[b"dir"]).unwrap();
    c.symlink(3, b"sym", b"../hello", 0).unwrap();
    c.walk(3, 4, &[b"sym"]).unwrap();
    assert_eq!(c.readlink(4).unwrap(), b"../hello");
    c.clunk(4).unwrap();
    c.walk(ROOT, 5, &[b"hello"]).unwrap();
    c.link(3, 5, b"hard").unwrap();
    c.rename(5, 3, b"moved").unwrap();
    c.renameat(3, b"moved", ROOT, b"back").unwrap();
    c.clunk(5).unwrap();
    c.mknod(3, b"fifo", libc::S_IFIFO | 0o644, 0, 0, 0).unwrap();
    c.walk(ROOT, 6, &[b"dir"]).unwrap();
    c.lopen(6, of::RDONLY | of::DIRECTORY).unwrap();
    assert_eq!(
        names(&c.readdir_all(6, 8192).unwrap()),
        ["fifo", "hard", "sym"]
    );
    c.clunk(6).unwrap();
    c.unlinkat(3, b"fifo", UnlinkFlags::empty()).unwrap();
    c.unlinkat(3, b"sym", UnlinkFlags::empty()).unwrap();
    c.unlinkat(3, b"hard", UnlinkFlags::empty()).unwrap();
    c.clunk(3).unwrap();
    c.unlinkat(ROOT, b"dir", UnlinkFlags::REMOVEDIR).unwrap();
    c.statfs(ROOT).unwrap();
    // xattrs (through the detached /proc/self/fd, in every mode)
    c.walk(ROOT, 7, &[b"back"]).unwrap();
    c.set_xattr(7, 8, b"user.test", b"value", 0).unwrap();
    assert_eq!(c.get_xattr(7, 9, b"user.test").unwrap(), b"value");
    c.clunk(7).unwrap();
    let mut entries = names(&{
        c.walk(ROOT, 10, &[]).unwrap();
        c.lopen(10, of::RDONLY | of::DIRECTORY).unwrap();
        c.readdir_all(10, 8192).unwrap()
    });
    entries.sort();
    // "hello" was moved to dir/moved and back as "back".
    assert_eq!(entries, ["back", "new"]);
    c.clunk(10).unwrap();
}

#[test]
fn test_socket_operations_under_every_sandbox_mode() {
    for mode in MODES {
        let t = tree();
        let Some(mut d) = socket_daemon(&t, mode, &[]) else {
            continue;
        };
        let mut c = session(&t.sock());
        exercise(&mut c, &t.export);
        drop(c);
        assert!(
            d.try_wait().is_none(),
            "{mode}: daemon died: {}",
            d.stderr()
        );
        let st = d.terminate();
        assert_eq!(st.code(), Some(0), "{mode}: {st:?} {}", d.stderr());
        if mode == "namespace" {
            assert!(!t.sock().exists(), "the supervisor removes the socket");
        }
        t.outside_untouched();
    }
}

#[test]
fn test_vhost_user_default_hardening_serves_every_mode() {
    // No --sandbox/--seccomp: the default is namespace + kill.
    for mode in [None, Some("chroot"), Some("none")] {
        let t = tree();
        let sock = t.tmp.path().join("vu.sock");
        let mut args = vec![
            "--shared-dir",
            t.export.to_str().unwrap(),
            "--socket-path",
            sock.to_str().unwrap(),
            "--keep-serving",
        ];
        match mode {
            Some(m) => args.extend(["--sandbox", m]),
            // The default, with memory locking (mlockall under the filter).
            None => args.extend(["--mlock", "on-fault"]),
        }
        let mut d = Daemon::spawn(&args, t.tmp.path().join("vu.log"));
        if !d.wait_for(&sock) {
            if no_namespaces(&d, "default sandbox") {
                continue;
            }
            panic!("{mode:?}: daemon exited: {}", d.stderr());
        }
        // Two connections: each starts fresh threads under the filter.
        for _ in 0..2 {
            std::fs::write(t.export.join("hello"), b"hello world").unwrap();
            vhost_mount_sequence(&sock);
        }
        assert!(
            d.try_wait().is_none(),
            "{mode:?}: daemon died: {}",
            d.stderr()
        );
        if mode.is_none() {
            let status =
                std::fs::read_to_string(format!("/proc/{}/status", d.server_pid("namespace")))
                    .unwrap();
            assert!(status.lines().any(|l| l == "Seccomp:\t2"), "{status}");
            let cap_eff = status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .unwrap();
            let cap_eff = u64::from_str_radix(cap_eff.trim(), 16).unwrap();
            assert!(
                cap_eff & (1 << 14) != 0,
                "--mlock keeps CAP_IPC_LOCK: {status}"
            );
            let locked = status
                .lines()
                .find_map(|l| l.strip_prefix("VmLck:"))
                .unwrap();
            assert_ne!(locked.trim(), "0 kB", "{status}");
        }
        let st = d.terminate();
        assert_eq!(st.code(), Some(0), "{mode:?}: {st:?} {}", d.stderr());
        assert!(
            !sock.exists() || mode == Some("chroot"),
            "{mode:?}: socket left"
        );
        t.outside_untouched();
    }
}

/// Spawns the daemon with the forbidden-syscall hook.
fn forbidden(t: &Tree, sandbox: &str, seccomp: &str) -> Option<Daemon> {
    let sock = t.sock();
    let listen = format!("unix:{}", sock.display());
    let mut d = Daemon::spawn(
        &[
            "--shared-dir",
            t.export.to_str().unwrap(),
            "--listen",
            &listen,
            "--sandbox",
            sandbox,
            "--seccomp",
            seccomp,
            "--test-hook",
            "forbidden-syscall",
        ],
        t.tmp
            .path()
            .join(format!("forbidden-{sandbox}-{seccomp}.log")),
    );
    std::thread::sleep(Duration::from_millis(50));
    if d.try_wait().is_some() && no_namespaces(&d, "forbidden syscall in namespace mode") {
        return None;
    }
    Some(d)
}

#[test]
fn test_forbidden_syscall_is_killed_logged_or_trapped() {
    for sandbox in ["none", "namespace"] {
        // kill: the process dies of SIGSYS (the supervisor reports 128 + 31).
        let t = tree();
        let Some(mut d) = forbidden(&t, sandbox, "kill") else {
            continue;
        };
        let st = d.wait();
        if sandbox == "none" {
            assert_eq!(st.signal(), Some(libc::SIGSYS), "{st:?} {}", d.stderr());
        } else {
            assert_eq!(st.code(), Some(128 + libc::SIGSYS), "{st:?} {}", d.stderr());
        }
        assert!(!d.stderr().contains("test-hook: forbidden syscall returned"));

        // trap: SIGSYS with the syscall number on stderr, then death.
        let t = tree();
        let mut d = forbidden(&t, sandbox, "trap").unwrap();
        let st = d.wait();
        let expect = format!("seccomp: forbidden syscall {}", libc::SYS_personality);
        assert!(d.stderr().contains(&expect), "{}", d.stderr());
        assert_eq!(st.code(), Some(128 + libc::SIGSYS), "{st:?}");

        // log: the call goes through (and into the kernel log); the daemon serves on.
        for mode in ["log", "none"] {
            let t = tree();
            let mut d = forbidden(&t, sandbox, mode).unwrap();
            d.wait_log("test-hook: forbidden syscall returned");
            assert!(d.wait_for(&t.sock()), "{}", d.stderr());
            let mut c = session(&t.sock());
            c.walk(ROOT, 1, &[b"hello"]).unwrap();
            drop(c);
            assert!(d.try_wait().is_none());
            assert_eq!(d.terminate().code(), Some(0), "{}", d.stderr());
        }
    }
}

/// `(comm, Seccomp_filters)` of every thread of `pid`.
fn thread_filters(pid: i32) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("status")),
        ) else {
            continue;
        };
        let Some(n) = status
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp_filters:"))
        else {
            continue;
        };
        out.push((comm.trim().to_string(), n.trim().parse().unwrap()));
    }
    out
}

#[test]
fn test_worker_threads_stack_their_own_filter() {
    if !std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .contains("Seccomp_filters:")
    {
        eprintln!("SKIP worker filters: this kernel shows no Seccomp_filters in /proc");
        return;
    }
    for mode in MODES {
        let t = tree();
        let sock = t.tmp.path().join("vu.sock");
        let mut d = Daemon::spawn(
            &[
                "--shared-dir",
                t.export.to_str().unwrap(),
                "--socket-path",
                sock.to_str().unwrap(),
                "--sandbox",
                mode,
                "--thread-pool-size",
                "2",
                "--keep-serving",
            ],
            t.tmp.path().join("workers.log"),
        );
        if !d.wait_for(&sock) {
            if no_namespaces(&d, "worker filters in namespace mode") {
                continue;
            }
            panic!("{mode}: daemon exited: {}", d.stderr());
        }
        // The engine and its workers live while a frontend is connected.
        let mut vmm = FakeVmm::connect(&sock, VmmOptions::default()).unwrap();
        assert_eq!(version(&mut vmm, 8192), 8192);
        let pid = d.server_pid(mode);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let is_worker = |c: &str| c.starts_with("9p-worker") || c.starts_with("9p-lock-wait");
        // A worker is named when it is spawned and adds its own filter
        // once it runs: wait for all four to have started.
        let threads = loop {
            let th = thread_filters(pid);
            let workers = th.iter().filter(|(c, _)| is_worker(c)).count();
            let started = th.iter().all(|(c, n)| !is_worker(c) || *n == 3);
            if workers == 4 && started {
                break th;
            }
            assert!(std::time::Instant::now() < deadline, "{mode}: {th:?}");
            std::thread::sleep(Duration::from_millis(20));
        };
        // Every thread: the clone3 filter and the allow-list; the workers
        // one more, their own.
        for (comm, n) in &threads {
            let worker = is_worker(comm);
            assert_eq!(
                *n,
                if worker { 3 } else { 2 },
                "{mode}: {comm}: {threads:?}"
            );
        }
        drop(vmm);
        d.assert_alive_then_stop(mode);
    }
}

fn status_field(pid: i32, key: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

fn cap_mask(pid: i32, key: &str) -> u64 {
    u64::from_str_radix(&status_field(pid, key), 16).unwrap()
}

#[test]
fn test_daemon_holds_only_needed_capabilities() {
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP capabilities: not root");
        return;
    }
    let default: u64 = [0u32, 1, 2, 3, 4, 27].iter().map(|c| 1u64 << c).sum();
    let readonly: u64 = [1u32, 2, 3].iter().map(|c| 1u64 << c).sum();
    let cases: [(&str, &[&str], u64); 4] = [
        ("namespace", &[], default),
        ("none", &[], default),
        ("namespace", &["--readonly"], readonly),
        (
            "chroot",
            &["--modcaps=-mknod,+sys_nice"],
            (default & !(1 << 27)) | (1 << 23),
        ),
    ];
    for (mode, extra, want) in cases {
        let t = tree();
        let Some(d) = socket_daemon(&t, mode, extra) else {
            continue;
        };
        let pid = d.server_pid(mode);
        for key in ["CapEff:", "CapPrm:", "CapBnd:"] {
            assert_eq!(cap_mask(pid, key), want, "{mode} {extra:?} {key}");
        }
        assert_eq!(cap_mask(pid, "CapInh:"), 0);
        assert_eq!(cap_mask(pid, "CapAmb:"), 0);
        assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
        assert_eq!(status_field(pid, "Seccomp:"), "2");
        if mode == "namespace" {
            // The supervisor outside keeps only dac_override (socket removal).
            // It drops the rest (capset last) after the fork, while the child is
            // getting ready, so wait for that rather than race it.
            let sup = |key| cap_mask(d.pid(), key);
            let settled = (0..500).any(|_| {
                let done = sup("CapEff:") == 1 << 1;
                if !done {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                done
            });
            assert!(settled, "supervisor never dropped its capabilities");
            assert_eq!(sup("CapEff:"), 1 << 1, "supervisor");
            assert_eq!(sup("CapBnd:"), 1 << 1, "supervisor");
        }
        // Threads started later (connections) hold the same.
        let mut c = session(&t.sock());
        c.walk(ROOT, 1, &[b"hello"]).unwrap();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let tid: i32 = task.unwrap().file_name().to_str().unwrap().parse().unwrap();
            if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")) {
                let eff = s.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap();
                assert_eq!(u64::from_str_radix(eff.trim(), 16).unwrap(), want);
            }
        }
    }
}

fn probe(d: &mut Daemon, path: &str) -> String {
    let key = format!("test-hook: probe {path} ");
    d.wait_log(&key);
    let log = d.stderr();
    let line = log.lines().find(|l| l.starts_with(&key)).unwrap();
    line[key.len()..].to_string()
}

#[test]
fn test_absolute_paths_stay_inside_the_export() {
    for mode in MODES {
        let t = tree();
        let secret = t.outside.join("secret");
        let probe_root = "probe:/".to_string();
        let probe_secret = format!("probe:{}", secret.display());
        let probe_etc = "probe:/etc/passwd".to_string();
        let Some(mut d) = socket_daemon(
            &t,
            mode,
            &[
                "--test-hook",
                &probe_root,
                "--test-hook",
                &probe_secret,
                "--test-hook",
                &probe_etc,
            ],
        ) else {
            continue;
        };
        let ex = std::fs::metadata(&t.export).unwrap();
        let export_id = format!("dev={} ino={}", ex.dev(), ex.ino());
        let root = probe(&mut d, "/");
        let sec = probe(&mut d, secret.to_str().unwrap());
        let etc = probe(&mut d, "/etc/passwd");
        if mode == "none" {
            // The control: without a sandbox the host is visible.
            assert_ne!(root, export_id);
            assert!(sec.starts_with("dev="), "{sec}");
            continue;
        }
        assert_eq!(root, export_id, "{mode}: / is not the export");
        assert_eq!(sec, format!("errno={}", libc::ENOENT), "{mode}");
        assert_eq!(etc, format!("errno={}", libc::ENOENT), "{mode}");
        // Seen from the host: the daemon's root directory is the export.
        let pid = d.server_pid(mode);
        let r = std::fs::metadata(format!("/proc/{pid}/root")).unwrap();
        assert_eq!((r.dev(), r.ino()), (ex.dev(), ex.ino()), "{mode}");
    }
}

#[test]
fn test_rlimit_nofile_bounds_open_fids_not_walked_ones() {
    let t = tree();
    // 16 budgeted socket clients: (1280 - 256) / 2 / 16 = 32 open fids
    // each is too few.
    let listen = format!("unix:{}", t.sock().display());
    let out = Command::new(BIN)
        .args([
            "--shared-dir",
            t.export.to_str().unwrap(),
            "--listen",
            &listen,
        ])
        .args(["--sandbox", "none", "--rlimit-nofile", "1280"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("raise --rlimit-nofile"), "{err}");

    // (16640 - 256) / 2 / 16 = 512 open fids per session, and 8192 fds
    // for walked files.
    let Some(d) = socket_daemon(&t, "namespace", &["--rlimit-nofile", "16640"]) else {
        return;
    };
    let limits =
        std::fs::read_to_string(format!("/proc/{}/limits", d.server_pid("namespace"))).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    assert_eq!(
        line.split_whitespace().collect::<Vec<_>>()[3..5],
        ["16640", "16640"]
    );
    let mut c = session(&t.sock());
    for fid in 1..=512 {
        c.walk(ROOT, fid, &[b"hello"]).unwrap();
        c.lopen(fid, of::RDONLY).unwrap();
    }
    c.walk(ROOT, 600, &[b"hello"]).unwrap();
    let e = c.lopen(600, of::RDONLY).unwrap_err();
    assert_eq!(errno(e), libc::EMFILE);
    c.clunk(1).unwrap();
    c.lopen(600, of::RDONLY).unwrap();
    for fid in (2..=512).chain([600]) {
        c.clunk(fid).unwrap();
    }
    // Walked fids are not bounded by the fds: more of them than the fd
    // limit, each a distinct file, all usable, the fds within the cache.
    let many = 17_000u32;
    for i in 0..many {
        std::fs::write(t.export.join(format!("w{i}")), i.to_string()).unwrap();
    }
    for i in 0..many {
        c.walk(ROOT, 1000 + i, &[format!("w{i}").as_bytes()])
            .unwrap();
    }
    let fds = std::fs::read_dir(format!("/proc/{}/fd", d.server_pid("namespace")))
        .unwrap()
        .count();
    assert!(fds < 16_640, "{fds} fds open");
    for i in (0..many).step_by(97) {
        assert_eq!(
            c.getattr(1000 + i).unwrap().size,
            i.to_string().len() as u64
        );
        c.lopen(1000 + i, of::RDONLY).unwrap();
        assert_eq!(c.read(1000 + i, 0, 16).unwrap(), i.to_string().as_bytes());
        c.clunk(1000 + i).unwrap();
    }
}

#[test]
fn test_translate_ids_squash() {
    let t = tree();
    let Some(_d) = socket_daemon(
        &t,
        "namespace",
        &[
            "--translate-uid",
            "squash-guest:4242",
            "--translate-gid",
            "squash-host:777",
        ],
    ) else {
        return;
    };
    let mut c = session(&t.sock());
    c.walk(ROOT, 1, &[]).unwrap();
    c.lcreate(1, b"owned", of::RDWR, 0o644, 55).unwrap();
    let mut a = setattr_msg(1, SetattrMask::UID);
    a.uid = 99;
    c.setattr(a).unwrap();
    let st = std::fs::metadata(t.export.join("owned")).unwrap();
    assert_eq!(st.uid(), 4242, "the guest's uid is squashed");
    assert_eq!(st.gid(), 55, "gids pass through to the host");
    let ga = c.getattr(1).unwrap();
    assert_eq!((ga.uid, ga.gid), (4242, 777), "host gids read as 777");
}

#[test]
fn test_unprivileged_namespace_sandbox_uses_a_user_namespace() {
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP unprivileged sandbox: needs root to switch to nobody");
        return;
    }
    let t = tree();
    for p in [t.tmp.path(), t.export.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    std::fs::set_permissions(
        t.export.join("hello"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let sock = t.sock();
    let listen = format!("unix:{}", sock.display());
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--shared-dir",
        t.export.to_str().unwrap(),
        "--listen",
        &listen,
    ])
    .args(["--uid-map", "65534:65534:1", "--gid-map", "65534:65534:1"])
    .uid(65534)
    .gid(65534);
    let mut d = Daemon::spawn_with(&mut cmd, t.tmp.path().join("unpriv.log"));
    if !d.wait_for(&sock) {
        if no_namespaces(&d, "unprivileged user namespace") {
            return;
        }
        panic!("unprivileged daemon exited: {}", d.stderr());
    }
    let pid = d.server_pid("namespace");
    let own = std::fs::read_link("/proc/self/ns/user").unwrap();
    let theirs = std::fs::read_link(format!("/proc/{pid}/ns/user")).unwrap();
    assert_ne!(own, theirs, "the daemon runs in its own user namespace");
    let mut c = session(&sock);
    c.walk(ROOT, 1, &[b"hello"]).unwrap();
    c.lopen(1, of::RDONLY).unwrap();
    assert_eq!(c.read(1, 0, 64).unwrap(), b"hello world");
    let mut buf = String::new();
    let _ = std::fs::File::open(&d.log).and_then(|mut f| f.read_to_string(&mut buf));
    assert!(d.try_wait().is_none(), "{buf}");
}

/// The capability names SECURITY.md and `sandbox/caps.rs` document for
/// each writable export, as numbers.
fn documented_caps(model: &str) -> u64 {
    let names: &[u32] = match model {
        // chown, dac_override, dac_read_search, fowner, fsetid, mknod
        "passthrough" => &[0, 1, 2, 3, 4, 27],
        // dac_override, dac_read_search, fowner
        "mapped-xattr" | "none" => &[1, 2, 3],
        other => panic!("no model {other}"),
    };
    names.iter().map(|c| 1u64 << c).sum()
}

#[test]
fn test_capabilities_follow_the_security_model() {
    use sandbox::caps;
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP capabilities per model: not root");
        return;
    }
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for model in ["passthrough", "mapped-xattr", "none"] {
        let want = documented_caps(model);
        let parsed: virtio_9p_server::SecurityModel = model.parse().unwrap();
        assert_eq!(caps::CapSet::of(caps::for_model(parsed, false)).0, want);
        for mode in &MODES {
            let t = tree();
            let Some(d) = socket_daemon(&t, mode, &["--security-model", model]) else {
                continue;
            };
            let pid = d.server_pid(mode);
            for key in ["CapEff:", "CapPrm:", "CapBnd:"] {
                assert_eq!(cap_mask(pid, key), want, "{model} {mode} {key}");
            }
            // The bounding set was cut up to the kernel's real last
            // capability, found without /proc (which pivot_root hid).
            assert!(
                d.stderr()
                    .contains(&format!("kernel capabilities 0..={last}")),
                "{model} {mode}: {}",
                d.stderr()
            );
            d.assert_alive_then_stop(&format!("{model} {mode}"));
        }
    }
}

#[test]
fn test_modcaps_non_ascii_exits_with_one_line() {
    let t = tree();
    for spec in ["é", "+sys_admin,ésys_nice", "\u{1F600}mknod"] {
        let out = Command::new(BIN)
            .args(["--shared-dir", t.export.to_str().unwrap()])
            .arg("--listen")
            .arg(format!("unix:{}", t.sock().display()))
            .args(["--sandbox", "none", "--modcaps", spec])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{spec}: {err}");
        assert!(!err.contains("panicked"), "{spec}: {err}");
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("virtio-9p-server: sandbox: --modcaps ")
                && last.ends_with("expected +name or -name"),
            "{spec}: {err}"
        );
    }
}

#[test]
fn test_vhost_user_mapped_xattr_as_the_guest_row_runs_it() {
    // The arguments of ci/guest/run.sh's ours-vhost-mapped row.
    let t = tree();
    let sock = t.tmp.path().join("vu.sock");
    let args = [
        "--socket-path",
        sock.to_str().unwrap(),
        "--shared-dir",
        t.export.to_str().unwrap(),
        "--tag",
        "share",
        "--security-model",
        "mapped-xattr",
        "--log-level",
        "debug",
    ];
    let mut d = Daemon::spawn(&args, t.tmp.path().join("vu.log"));
    if !d.wait_for(&sock) {
        if no_namespaces(&d, "mapped-xattr over vhost-user") {
            return;
        }
        panic!("daemon exited: {}", d.stderr());
    }
    // SAFETY: plain getter.
    if unsafe { libc::geteuid() } == 0 {
        // The socket exists before the sandbox: wait until the child has
        // dropped its capabilities (it logs them right after).
        d.wait_log("capabilities [");
        let pid = d.server_pid("namespace");
        assert_eq!(cap_mask(pid, "CapEff:"), documented_caps("mapped-xattr"));
    }
    vhost_mount_sequence(&sock);
    // As when the guest's QEMU goes away: the frontend's disconnect ends
    // the daemon, cleanly.
    let status = d.wait();
    assert!(status.success(), "{status:?}: {}", d.stderr());
    t.outside_untouched();
}

/// A stop that comes right after the namespace sandbox's fork, before the
/// supervisor has its signal handlers, ends the daemon with an exit
/// status; it never kills the supervisor (which would leave the socket
/// file behind). The test spins until the supervisor has a child, then
/// sends SIGTERM at once, 40 times.
#[test]
fn test_sigterm_right_after_the_sandbox_fork_never_kills_the_supervisor() {
    let t = tree();
    let listen = format!("unix:{}", t.sock().display());
    let mut caught = 0;
    for round in 0..40 {
        let _ = std::fs::remove_file(t.sock());
        let mut child = Command::new(BIN)
            .args([
                "--shared-dir",
                t.export.to_str().unwrap(),
                "--listen",
                &listen,
            ])
            .args(["--sandbox", "namespace"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let children = format!("/proc/{pid}/task/{pid}/children");
        let deadline = Instant::now() + Duration::from_secs(10);
        let forked = loop {
            match std::fs::read_to_string(&children) {
                Ok(c) if !c.trim().is_empty() => break true,
                Ok(_) if Instant::now() < deadline => continue,
                _ => break false,
            }
        };
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        // A stop lost on the way (pid 1 drops signals it has no handler
        // for) leaves the daemon running.
        let deadline = Instant::now() + Duration::from_secs(20);
        let st = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("round {round}: the SIGTERM was lost, the daemon still runs");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        if !forked {
            // No namespaces here: the daemon exited before forking.
            assert!(st.code().is_some(), "{st:?}");
            eprintln!("SKIP sigterm after fork: the daemon did not fork (namespaces)");
            return;
        }
        caught += 1;
        assert!(
            st.signal().is_none(),
            "round {round}: the supervisor died of signal {:?}",
            st.signal()
        );
        assert!(!t.sock().exists(), "round {round}: the socket file stayed");
    }
    assert_eq!(caught, 40);
}
