// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! virtiofsd's conventions for the daemon, tested on
//! the real binary: the locked `<socket>.pid` refuses a second instance
//! and leaves the running one alone; the daemon exits when its frontend
//! leaves (unless `--keep-serving`); options of the other mode are
//! refused; SIGHUP and SIGTERM end it with status 0 in every sandbox mode;
//! `--syslog` logs through `/dev/log` from inside the sandbox;
//! `--print-capabilities` matches the shipped JSON descriptor;
//! `--no-inline-metadata` keeps metadata calls on workers. The start logs
//! no warning in any sandbox, and the coroutine stacks' budget inside the
//! sandbox knows the real `vm.max_map_count` and mapping count.

mod sandbox_support;

use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use sandbox_support::{no_namespaces, session, version, Daemon, BIN, MODES};
use virtio_9p_server::vhost_user::mock::{FakeVmm, VmmOptions};

/// A temp dir with an export.
fn tree() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("hello"), b"hello world").unwrap();
    (tmp, export)
}

/// Whether the transport is the vhost-user daemon or socket mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    VhostUser,
    Socket,
}

const KINDS: [Kind; 2] = [Kind::VhostUser, Kind::Socket];

/// The arguments that serve `export` on the unix socket `sock`.
fn args(kind: Kind, export: &Path, sock: &Path, mode: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec!["--shared-dir".into(), export.display().to_string()];
    match kind {
        Kind::VhostUser => v.extend(["--socket-path".into(), sock.display().to_string()]),
        Kind::Socket => v.extend(["--listen".into(), format!("unix:{}", sock.display())]),
    }
    v.extend(["--sandbox".into(), mode.into()]);
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn pid_path(sock: &Path) -> PathBuf {
    PathBuf::from(format!("{}.pid", sock.display()))
}

/// Starts the daemon and waits until it is confined and serving; `None`
/// (after a notice) where namespaces cannot be created.
fn start(kind: Kind, export: &Path, sock: &Path, mode: &str, extra: &[&str]) -> Option<Daemon> {
    let a = args(kind, export, sock, mode, extra);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let log = sock.with_extension("log");
    let mut d = Daemon::spawn(&a, log);
    if !d.wait_for(sock) {
        if no_namespaces(&d, &format!("{kind:?} in {mode} mode")) {
            return None;
        }
        panic!("{kind:?} {mode}: daemon exited: {}", d.stderr());
    }
    // Logged once the signal handlers are in place.
    d.wait_log(match kind {
        Kind::VhostUser => "vhost-user socket on inherited fd",
        Kind::Socket => "serving ",
    });
    Some(d)
}

/// One exchange with the daemon: it still serves.
fn assert_serves(kind: Kind, sock: &Path) {
    match kind {
        Kind::VhostUser => {
            let mut vmm = FakeVmm::connect(sock, VmmOptions::default()).unwrap();
            assert_eq!(version(&mut vmm, 8192), 8192);
        }
        Kind::Socket => {
            let mut c = session(sock, 0);
            c.walk(0, 1, &[b"hello"]).unwrap();
        }
    }
}

fn run(a: &[String]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(a).stdin(Stdio::null());
    // SAFETY: alarm(2) only arms a timer, so a hung run cannot hang the test.
    unsafe {
        cmd.pre_exec(|| {
            libc::alarm(20);
            Ok(())
        })
    };
    cmd.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn test_second_instance_is_refused_and_the_first_untouched() {
    for kind in KINDS {
        for mode in ["none", "namespace"] {
            let (tmp, export) = tree();
            let sock = tmp.path().join("9p.sock");
            let extra: &[&str] = if kind == Kind::VhostUser {
                &["--keep-serving"]
            } else {
                &[]
            };
            let Some(first) = start(kind, &export, &sock, mode, extra) else {
                continue;
            };
            let pid_file = pid_path(&sock);
            let pid_text = std::fs::read_to_string(&pid_file).unwrap();
            assert_eq!(pid_text, format!("{}\n", first.pid()), "{kind:?} {mode}");
            let sock_ino = std::fs::symlink_metadata(&sock).unwrap().ino();
            let pid_meta = std::fs::metadata(&pid_file).unwrap();

            let out = run(&args(kind, &export, &sock, "none", &[]));
            assert_eq!(out.status.code(), Some(1), "{kind:?} {mode}: {out:?}");
            assert_eq!(
                stderr(&out),
                format!(
                    "virtio-9p-server: another instance is already serving {} (pid {}): \
                     its pid file {} is locked\n",
                    sock.display(),
                    first.pid(),
                    pid_file.display()
                ),
                "{kind:?} {mode}"
            );
            // The running instance keeps its socket, its pid file (same
            // inode, same content) and serves.
            assert_eq!(std::fs::symlink_metadata(&sock).unwrap().ino(), sock_ino);
            let after = std::fs::metadata(&pid_file).unwrap();
            assert_eq!(after.ino(), pid_meta.ino());
            assert_eq!(std::fs::read_to_string(&pid_file).unwrap(), pid_text);
            assert_serves(kind, &sock);
            first.assert_alive_then_stop(&format!("{kind:?} {mode}"));
            assert!(!sock.exists() && !pid_file.exists(), "{kind:?} {mode}");
        }
    }
}

#[test]
fn test_refused_start_leaves_no_pid_file() {
    let (tmp, export) = tree();
    let sock = tmp.path().join("precious");
    std::fs::write(&sock, b"keep me").unwrap();
    for kind in KINDS {
        let out = run(&args(kind, &export, &sock, "none", &[]));
        assert_eq!(out.status.code(), Some(1), "{kind:?}: {out:?}");
        assert!(stderr(&out).contains("refusing to replace it"), "{out:?}");
        assert!(!pid_path(&sock).exists(), "{kind:?}");
        assert_eq!(std::fs::read(&sock).unwrap(), b"keep me");
    }
}

#[test]
fn test_frontend_disconnect_ends_the_daemon() {
    for mode in MODES {
        let (tmp, export) = tree();
        let sock = tmp.path().join("vu.sock");
        let Some(mut d) = start(Kind::VhostUser, &export, &sock, mode, &[]) else {
            continue;
        };
        assert_serves(Kind::VhostUser, &sock);
        let st = d.wait();
        assert_eq!(st.code(), Some(0), "{mode}: {st:?} {}", d.stderr());
        assert!(
            d.stderr().contains("the frontend left; exiting"),
            "{mode}: {}",
            d.stderr()
        );
        if mode != "chroot" {
            assert!(!sock.exists(), "{mode}: socket left behind");
            assert!(!pid_path(&sock).exists(), "{mode}: pid file left behind");
        }
    }
}

#[test]
fn test_keep_serving_serves_the_next_frontend() {
    let (tmp, export) = tree();
    let sock = tmp.path().join("vu.sock");
    let Some(mut d) = start(
        Kind::VhostUser,
        &export,
        &sock,
        "namespace",
        &["--keep-serving"],
    )
    .or_else(|| start(Kind::VhostUser, &export, &sock, "none", &["--keep-serving"])) else {
        unreachable!("sandbox none always starts");
    };
    for _ in 0..3 {
        assert_serves(Kind::VhostUser, &sock);
        std::thread::sleep(Duration::from_millis(200));
        assert!(d.try_wait().is_none(), "exited: {}", d.stderr());
    }
    assert!(!d.stderr().contains("exiting"), "{}", d.stderr());
    d.assert_alive_then_stop("--keep-serving");
}

#[test]
fn test_options_of_the_other_mode_are_refused() {
    let (tmp, export) = tree();
    let sock = tmp.path().join("x.sock");
    let cases: &[(Kind, &[&str], &str)] = &[
        (Kind::Socket, &["--tag", "t"], "--tag"),
        (Kind::Socket, &["--queue-size", "256"], "--queue-size"),
        (Kind::Socket, &["--mlock", "on"], "--mlock"),
        (Kind::Socket, &["--keep-serving"], "--keep-serving"),
        (Kind::Socket, &["--socket-path", "/tmp/v"], "--socket-path"),
        (
            Kind::VhostUser,
            &["--allow-unauthenticated-tcp-passthrough"],
            "--allow-unauthenticated-tcp-passthrough",
        ),
    ];
    for (kind, extra, flag) in cases {
        let out = run(&args(*kind, &export, &sock, "none", extra));
        assert_eq!(out.status.code(), Some(1), "{flag}: {out:?}");
        let mode = match kind {
            Kind::Socket => "socket mode (--listen)",
            Kind::VhostUser => "the vhost-user daemon (no --listen)",
        };
        assert_eq!(
            stderr(&out),
            format!("virtio-9p-server: {flag} does not apply to {mode}\n")
        );
        assert!(!sock.exists() && !pid_path(&sock).exists(), "{flag}");
    }
}

#[test]
fn test_sighup_and_sigterm_exit_cleanly_in_every_mode() {
    for kind in KINDS {
        for mode in MODES {
            for sig in [libc::SIGHUP, libc::SIGTERM] {
                let (tmp, export) = tree();
                let sock = tmp.path().join("s.sock");
                let Some(mut d) = start(kind, &export, &sock, mode, &[]) else {
                    continue;
                };
                // SAFETY: kill(2) on our own child.
                assert_eq!(unsafe { libc::kill(d.pid(), sig) }, 0);
                let st = d.wait();
                let what = format!("{kind:?} {mode} signal {sig}");
                assert_eq!(st.code(), Some(0), "{what}: {st:?} {}", d.stderr());
                if mode == "chroot" {
                    // The paths are outside the new root: both files stay,
                    // and the next start takes them over.
                    let again = start(kind, &export, &sock, "none", &[]).unwrap();
                    again.assert_alive_then_stop(&what);
                } else {
                    assert!(!sock.exists(), "{what}: socket left behind");
                    assert!(!pid_path(&sock).exists(), "{what}: pid file left behind");
                }
            }
        }
    }
}

#[test]
fn test_no_inline_metadata_keeps_metadata_calls_on_workers() {
    // The export is a local temp dir: by default its metadata calls run on
    // the vring or socket thread (under the process-wide seccomp filter of
    // the default hardening), with the option on workers.
    for kind in KINDS {
        for (extra, log) in [
            (
                &[][..],
                "metadata calls inline (the shared dir is on a local filesystem)",
            ),
            (&["--no-inline-metadata"][..], "metadata calls on workers"),
        ] {
            let (tmp, export) = tree();
            let sock = tmp.path().join("s.sock");
            let Some(mut d) = start(kind, &export, &sock, "namespace", extra) else {
                continue;
            };
            d.wait_log(log);
            assert_serves(kind, &sock);
            d.assert_alive_then_stop(&format!("{kind:?} {extra:?}"));
        }
    }
}

#[test]
fn test_zero_values_of_virtiofsd() {
    let (tmp, export) = tree();
    let sock = tmp.path().join("vu.sock");
    let a = args(
        Kind::VhostUser,
        &export,
        &sock,
        "none",
        &["--thread-pool-size", "0", "--rlimit-nofile", "0"],
    );
    let mut cmd = Command::new(BIN);
    cmd.args(&a);
    // A soft limit below the hard one, which the default would raise.
    // SAFETY: getrlimit/setrlimit between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut l = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
            l.rlim_cur = l.rlim_max.min(2048);
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            Ok(())
        })
    };
    let mut d = Daemon::spawn_with(&mut cmd, tmp.path().join("z.log"));
    assert!(d.wait_for(&sock), "{}", d.stderr());
    d.wait_log("vhost-user socket on inherited fd");
    let pid = d.pid();
    // --rlimit-nofile 0: the inherited limit stays.
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let soft: u64 = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .unwrap()
        .parse()
        .unwrap();
    let mut ours = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `ours` is a valid out pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut ours) };
    assert_eq!(soft, ours.rlim_max.min(2048), "{limits}");
    // --thread-pool-size 0: requests run on the vring thread.
    let mut vmm = FakeVmm::connect(&sock, VmmOptions::default()).unwrap();
    assert_eq!(version(&mut vmm, 8192), 8192);
    drop(vmm);
    assert_eq!(d.wait().code(), Some(0), "{}", d.stderr());
}

#[test]
fn test_map_syntaxes_of_virtiofsd_are_accepted() {
    let (tmp, export) = tree();
    let sock = tmp.path().join("m.sock");
    let extra = [
        "--translate-uid",
        "map:0:0:1",
        "--translate-uid",
        "squash-host:1:65534:4294967295",
        "--translate-gid",
        "forbid-guest:5000:10",
        "--uid-map",
        ":0:0:1:",
    ];
    let d = start(Kind::Socket, &export, &sock, "none", &extra).unwrap();
    assert_serves(Kind::Socket, &sock);
    d.assert_alive_then_stop("maps");
    for (bad, want) in [
        (
            ["--translate-uid", "map:0:0:1", "--translate-uid", "guest:0:5:1"],
            "virtio-9p-server: --translate-uid: id translations map:0:0:1 and guest:0:5:1 overlap on guest ids\n",
        ),
        (["--uid-map", ":0:0:1", "--gid-map", "0:0:1"], ""),
    ] {
        let out = run(&args(Kind::Socket, &export, &sock, "none", &bad));
        assert_ne!(out.status.code(), Some(0), "{bad:?}");
        if want.is_empty() {
            // clap's own error for the value: the reason, and no panic.
            assert!(stderr(&out).contains("bad id map"), "{}", stderr(&out));
        } else {
            assert_eq!(stderr(&out), want);
        }
        assert!(!stderr(&out).contains("panicked"));
        assert!(!sock.exists());
    }
}

/// The descriptor's `"type"` value (a flat JSON object of strings).
fn json_string(text: &str, key: &str) -> Option<String> {
    let at = text.find(&format!("\"{key}\""))?;
    let rest = &text[at + key.len() + 2..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_string())
}

#[test]
fn test_print_capabilities_matches_the_descriptor() {
    let desc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("50-virtio-9p-server.json"),
    )
    .unwrap();
    let ty = json_string(&desc, "type").unwrap();
    assert_eq!(ty, "9p", "VHostUserBackendType of QEMU's vhost-user.json");
    assert!(json_string(&desc, "binary").unwrap().starts_with('/'));
    assert!(!json_string(&desc, "description").unwrap().is_empty());
    let out = Command::new(BIN)
        .arg("--print-capabilities")
        .output()
        .unwrap();
    assert!(out.status.success());
    let caps = String::from_utf8(out.stdout).unwrap();
    assert_eq!(json_string(&caps, "type").as_deref(), Some(ty.as_str()));
    // Nothing else: the schema has no features for type 9p.
    let flat: String = caps.chars().filter(|c| !c.is_whitespace()).collect();
    assert_eq!(flat, format!("{{\"type\":\"{ty}\"}}"));
}

#[test]
fn test_syslog_logs_from_inside_the_sandbox() {
    // SAFETY: a plain getter.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP --syslog: a private /dev/log needs root (mount namespace)");
        return;
    }
    for mode in MODES {
        let (tmp, export) = tree();
        let log_sock = tmp.path().join("log.sock");
        let server = UnixDatagram::bind(&log_sock).unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let sock = tmp.path().join("s.sock");
        let mut cmd = Command::new(BIN);
        cmd.args(args(Kind::Socket, &export, &sock, mode, &["--syslog"]));
        let src = std::ffi::CString::new(log_sock.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: between fork and exec, only syscalls on data prepared
        // before the fork: a private mount namespace with a tmpfs on /dev
        // whose `log` is the test's datagram socket.
        unsafe {
            cmd.pre_exec(move || {
                let c = |s: &[u8]| s.as_ptr().cast::<libc::c_char>();
                let ok = |r: libc::c_int| {
                    if r == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                };
                ok(libc::unshare(libc::CLONE_NEWNS))?;
                ok(libc::mount(
                    std::ptr::null(),
                    c(b"/\0"),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                ok(libc::mount(
                    c(b"tmpfs\0"),
                    c(b"/dev\0"),
                    c(b"tmpfs\0"),
                    0,
                    std::ptr::null(),
                ))?;
                let fd = libc::open(c(b"/dev/log\0"), libc::O_CREAT | libc::O_WRONLY, 0o600);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
                ok(libc::mount(
                    src.as_ptr(),
                    c(b"/dev/log\0"),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
                libc::alarm(30);
                Ok(())
            })
        };
        let mut d = Daemon::spawn_with(&mut cmd, tmp.path().join("d.log"));
        if !d.wait_for(&sock) {
            if no_namespaces(&d, "--syslog in namespace mode") {
                continue;
            }
            panic!("{mode}: exited: {}", d.stderr());
        }
        // The line logged once the sandbox and seccomp are in place.
        let mut buf = vec![0; 8192];
        let line = loop {
            let n = server.recv(&mut buf).expect("no syslog message");
            let m = String::from_utf8_lossy(&buf[..n]).into_owned();
            if m.contains("capabilities [") {
                break m;
            }
        };
        assert!(line.starts_with("<30>virtio-9p-server["), "{mode}: {line}");
        assert!(
            line.contains(&format!("sandbox {mode}, seccomp kill")),
            "{line}"
        );
        // Nothing on stderr: the log goes to syslog.
        assert_eq!(d.stderr(), "", "{mode}");
        assert_serves(Kind::Socket, &sock);
        d.assert_alive_then_stop(mode);
    }
    // Without a syslog socket: one clear line.
    let (tmp, export) = tree();
    if !Path::new("/dev/log").exists() {
        let sock = tmp.path().join("n.sock");
        let out = run(&args(Kind::Socket, &export, &sock, "none", &["--syslog"]));
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(
            stderr(&out),
            "virtio-9p-server: --syslog: cannot connect to /dev/log: No such file or directory (os error 2)\n"
        );
    }
}

/// `vm.max_map_count` as the test reads it.
fn max_map_count() -> u64 {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// One exchange with the daemon, on a connection that stays open (a
/// frontend that leaves is logged).
fn connected(kind: Kind, sock: &Path) -> Box<dyn std::any::Any> {
    match kind {
        Kind::VhostUser => {
            let mut vmm = FakeVmm::connect(sock, VmmOptions::default()).unwrap();
            assert_eq!(version(&mut vmm, 8192), 8192);
            Box::new(vmm)
        }
        Kind::Socket => {
            let mut c = session(sock, 0);
            c.walk(0, 1, &[b"hello"]).unwrap();
            Box::new(c)
        }
    }
}

/// The WARN lines of a daemon's log.
fn warnings(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains(" WARN ")).collect()
}

#[test]
fn test_start_prints_no_warning_in_any_sandbox() {
    // coro-pool used to log two warnings at every start in the
    // namespace and chroot sandboxes, which hide /proc/self/maps and
    // /proc/sys/vm/max_map_count from it. The daemons start together, serve
    // a request (the first coroutine stacks) and run through two trims of
    // the stack pool (one per second), which count the mappings again.
    let real = max_map_count();
    let mut running = Vec::new();
    for kind in KINDS {
        // The default sandbox (namespace, no --sandbox flag), then the others.
        for mode in [None, Some("chroot"), Some("none")] {
            let (tmp, export) = tree();
            let sock = tmp.path().join("s.sock");
            let mut a = args(kind, &export, &sock, mode.unwrap_or("none"), &[]);
            if mode.is_none() {
                a.truncate(a.len() - 2);
            }
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            let mut d = Daemon::spawn(&a, tmp.path().join("d.log"));
            if !d.wait_for(&sock) {
                if no_namespaces(&d, &format!("{kind:?} default sandbox")) {
                    continue;
                }
                panic!("{kind:?} {mode:?}: daemon exited: {}", d.stderr());
            }
            running.push((kind, mode, tmp, sock, d));
        }
    }
    let mut connections = Vec::new();
    for (kind, _, _, sock, d) in &mut running {
        d.wait_log(match kind {
            Kind::VhostUser => "vhost-user socket on inherited fd",
            Kind::Socket => "serving ",
        });
        connections.push(connected(*kind, sock));
    }
    std::thread::sleep(Duration::from_millis(2500));
    for (kind, mode, _, _, d) in running {
        let log = d.stderr();
        assert_eq!(
            warnings(&log),
            Vec::<&str>::new(),
            "{kind:?} {mode:?}: {log}"
        );
        assert!(
            log.contains(&format!("coroutine stacks: vm.max_map_count {real}, ")),
            "{kind:?} {mode:?}: {log}"
        );
        d.assert_alive_then_stop(&format!("{kind:?} {mode:?}"));
    }
    drop(connections);
}

#[test]
fn test_stack_budget_inside_the_sandbox_is_the_real_one() {
    // Inside the sandbox, the budget knows the real vm.max_map_count and
    // counts exactly the mappings the kernel lists for the process, read
    // here from outside while the daemon waits in the `budget` hook.
    use std::io::Write;
    let real = max_map_count();
    for mode in ["namespace", "chroot"] {
        let (tmp, export) = tree();
        let sock = tmp.path().join("vu.sock");
        let mut cmd = Command::new(BIN);
        cmd.args(args(
            Kind::VhostUser,
            &export,
            &sock,
            mode,
            &["--test-hook", "budget"],
        ))
        .stdin(Stdio::piped());
        let mut d = Daemon::spawn_stdin(&mut cmd, tmp.path().join("d.log"));
        let mut go = d.stdin().unwrap();
        if !d.wait_for(&sock) {
            if no_namespaces(&d, "the budget hook in namespace mode") {
                continue;
            }
            panic!("{mode}: daemon exited: {}", d.stderr());
        }
        d.wait_log("test-hook: budget ");
        let log = d.stderr();
        let line = log
            .lines()
            .find_map(|l| l.strip_prefix("test-hook: budget "))
            .unwrap();
        let field = |name: &str| -> u64 {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .unwrap_or_else(|| panic!("no {name} in {line:?}"))
                .parse()
                .unwrap()
        };
        let pid = d.server_pid(mode);
        let outside = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap()
            .lines()
            .count() as u64;
        go.write_all(b"\n").unwrap();
        drop(go);
        assert_eq!(field("max_map_count"), real, "{mode}: {line}");
        assert_eq!(field("process_vmas"), outside, "{mode}: {line}");
        // No stack yet: the limit is the real one less the reserve, less
        // what the rest of the process maps beyond half the reserve.
        assert_eq!(
            field("limit_vmas"),
            real - 5000 - outside.saturating_sub(2500),
            "{mode}: {line}"
        );
        d.wait_log("vhost-user socket on inherited fd");
        let vmm = connected(Kind::VhostUser, &sock);
        assert_eq!(warnings(&d.stderr()), Vec::<&str>::new(), "{mode}");
        d.assert_alive_then_stop(mode);
        drop(vmm);
    }
}
