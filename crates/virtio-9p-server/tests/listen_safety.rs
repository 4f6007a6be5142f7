// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The transport doors of the binary: a writable passthrough
//! export over TCP needs `--allow-unauthenticated-tcp-passthrough`; unix
//! sockets (`--socket-path`, `--listen unix:`) replace only a stale socket,
//! refuse anything else with one clear line and exit 1, and are created
//! 0600 (0660 with `--socket-group`) whatever the umask.

mod sandbox_support;

use std::net::TcpStream;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use sandbox_support::{version, Daemon, BIN};
use virtio_9p_server::client::{Client, StreamTransport};
use virtio_9p_server::protocol::OpenFlags as of;
use virtio_9p_server::vhost_user::mock::{FakeVmm, VmmOptions};

const TCP_REFUSAL: &str = "virtio-9p-server: refusing a writable --security-model MODEL export \
over TCP, which has no authentication (anyone who can connect acts as the guest on the host \
files); use --security-model mapped-xattr, --readonly or a unix socket (--listen unix:PATH), or \
pass --allow-unauthenticated-tcp-passthrough to accept the risk\n";

fn export() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("hello"), b"hello world").unwrap();
    (tmp, export)
}

/// The binary with `args`, running `setup` in the child before exec.
fn command(args: &[&str], setup: fn()) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    // SAFETY: `setup` only makes a system call (alarm, umask) in the child.
    unsafe {
        cmd.pre_exec(move || {
            setup();
            Ok(())
        })
    };
    cmd
}

/// Runs the binary to completion with `args` (it must not start serving:
/// one that wrongly does is killed by SIGALRM after 20 s).
fn run(args: &[&str]) -> Output {
    // SAFETY: alarm(2) only arms a timer.
    command(args, || unsafe {
        libc::alarm(20);
    })
    .output()
    .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A daemon spawned with umask 0, so that only its own choice of mode
/// shows on the socket file.
fn spawn_umask0(args: &[&str], log: PathBuf) -> Daemon {
    // SAFETY: umask(2) only sets the mask.
    let mut cmd = command(args, || unsafe {
        libc::umask(0);
    });
    Daemon::spawn_with(&mut cmd, log)
}

/// The port of a TCP daemon, from its startup log.
fn tcp_port(d: &mut Daemon) -> u16 {
    d.wait_log("serving ");
    let log = d.stderr();
    let line = log.lines().find(|l| l.contains("serving ")).unwrap();
    let addr = line.split(" on tcp:").nth(1).unwrap();
    let addr = addr.split_whitespace().next().unwrap();
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// `--listen tcp:127.0.0.1:0` on `export` without a sandbox, plus `extra`.
fn tcp_args<'a>(export: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--shared-dir", export.to_str().unwrap()];
    v.extend(["--listen", "tcp:127.0.0.1:0", "--sandbox", "none"]);
    v.extend_from_slice(extra);
    v
}

#[test]
fn test_writable_tcp_passthrough_is_refused_with_one_line() {
    let (_tmp, export) = export();
    for model in ["passthrough", "none"] {
        let out = run(&tcp_args(&export, &["--security-model", model]));
        assert_eq!(out.status.code(), Some(1), "{model}: {out:?}");
        assert_eq!(stderr(&out), TCP_REFUSAL.replace("MODEL", model), "{model}");
    }
    // --socket-group has nothing to act on over TCP.
    let out = run(&tcp_args(&export, &["--readonly", "--socket-group", "0"]));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        stderr(&out),
        "virtio-9p-server: --socket-group applies to unix sockets only\n"
    );
}

#[test]
fn test_tcp_serves_readonly_mapped_or_with_the_opt_in() {
    let cases: [(&[&str], bool); 3] = [
        (&["--readonly"], false),
        (&["--security-model", "mapped-xattr"], true),
        (&["--allow-unauthenticated-tcp-passthrough"], true),
    ];
    for (extra, writable) in cases {
        let (tmp, export) = export();
        let mut d = Daemon::spawn(&tcp_args(&export, extra), tmp.path().join("tcp.log"));
        let port = tcp_port(&mut d);
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut c = Client::new(StreamTransport(s));
        c.version(64 << 10).unwrap();
        c.attach(0, 0).unwrap();
        c.walk(0, 1, &[b"hello"]).unwrap();
        let opened = c.lopen(1, of::RDWR);
        assert_eq!(opened.is_ok(), writable, "{extra:?}: {opened:?}");
        if writable {
            c.write(1, 0, b"HELLO").unwrap();
            assert_eq!(std::fs::read(export.join("hello")).unwrap(), b"HELLO world");
        }
        let warned = d
            .stderr()
            .contains("--allow-unauthenticated-tcp-passthrough: anyone who can connect");
        assert_eq!(
            warned,
            extra[0] == "--allow-unauthenticated-tcp-passthrough",
            "{}",
            d.stderr()
        );
        drop(c);
        d.assert_alive_then_stop(&format!("{extra:?}"));
    }
}

/// `--socket-path P` (vhost-user) or `--listen unix:P` (socket mode).
fn unix_args<'a>(export: &'a Path, flag: &'a str, path: &'a str) -> Vec<&'a str> {
    let mut v = vec![
        "--shared-dir",
        export.to_str().unwrap(),
        "--sandbox",
        "none",
    ];
    v.extend([flag, path]);
    if flag == "--socket-path" {
        // These tests check the daemon after the frontend has left.
        v.push("--keep-serving");
    }
    v
}

/// The value of `flag` (`--socket-path` or `--listen`) for the socket `path`.
fn flag_value(flag: &str, path: &Path) -> String {
    if flag == "--listen" {
        format!("unix:{}", path.display())
    } else {
        path.display().to_string()
    }
}

fn listen_flags(path: &Path) -> [(&'static str, String); 2] {
    ["--socket-path", "--listen"].map(|f| (f, flag_value(f, path)))
}

/// The error line for `what` at the socket path `p` given as `flag`.
fn refusal(flag: &str, p: &Path, what: &str) -> String {
    format!(
        "virtio-9p-server: cannot listen on {}: {} {what}; refusing to replace it\n",
        flag_value(flag, p),
        p.display()
    )
}

#[test]
fn test_socket_path_refuses_a_regular_file_or_directory() {
    let (tmp, export) = export();
    let file = tmp.path().join("precious");
    let dir = tmp.path().join("adir");
    std::fs::create_dir(&dir).unwrap();
    for (target, what) in [
        (&file, "exists and is a regular file"),
        (&dir, "exists and is a directory"),
    ] {
        for (flag, value) in listen_flags(target) {
            std::fs::write(&file, b"keep me").unwrap();
            let out = run(&unix_args(&export, flag, &value));
            assert_eq!(out.status.code(), Some(1), "{flag}: {out:?}");
            assert_eq!(stderr(&out), refusal(flag, target, what), "{flag}");
            assert_eq!(std::fs::read(&file).unwrap(), b"keep me", "{flag}");
            assert!(dir.is_dir());
        }
    }
}

#[test]
fn test_socket_path_refuses_a_live_socket() {
    let (tmp, export) = export();
    let path = tmp.path().join("live.sock");
    // Another server's live socket.
    let other = UnixListener::bind(&path).unwrap();
    for (flag, value) in listen_flags(&path) {
        let out = run(&unix_args(&export, flag, &value));
        assert_eq!(out.status.code(), Some(1), "{flag}: {out:?}");
        assert_eq!(
            stderr(&out),
            format!(
                "virtio-9p-server: cannot listen on {}: {} is a live socket (a server is \
                 listening on it); refusing to replace it\n",
                flag_value(flag, &path),
                path.display()
            ),
            "{flag}"
        );
        // Still the other server's: a connection reaches it.
        let _c = UnixStream::connect(&path).unwrap();
        let (_s, _) = other.accept().unwrap();
    }
}

#[test]
fn test_socket_path_replaces_a_stale_socket_owner_only() {
    for (flag, mode) in [("--socket-path", "vhost-user"), ("--listen", "socket")] {
        let (tmp, export) = export();
        let path = tmp.path().join("stale.sock");
        // A killed daemon's socket: the file stays, nobody listens.
        drop(UnixListener::bind(&path).unwrap());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        let value = flag_value(flag, &path);
        let mut args = unix_args(&export, flag, &value);
        args.extend(["--log-level", "debug"]);
        let mut d = spawn_umask0(&args, tmp.path().join("d.log"));
        d.wait_log("capabilities [");
        let m = std::fs::symlink_metadata(&path).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.permissions().mode() & 0o7777, 0o600, "{mode}: umask 0");
        assert!(
            d.stderr().contains("replacing the stale socket"),
            "{}",
            d.stderr()
        );
        if mode == "vhost-user" {
            let mut vmm = FakeVmm::connect(&path, VmmOptions::default()).unwrap();
            assert_eq!(version(&mut vmm, 8192), 8192);
        } else {
            let mut c = sandbox_support::session(&path, 0);
            c.walk(0, 1, &[b"hello"]).unwrap();
        }
        d.assert_alive_then_stop(mode);
    }
}

#[test]
fn test_socket_group_makes_the_socket_0660() {
    // SAFETY: plain getters.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // A group other than ours where root may give one away.
    let (want_gid, group) = if uid == 0 {
        (65534, "65534".to_string())
    } else {
        (gid, gid.to_string())
    };
    for (flag, mode) in [("--socket-path", "vhost-user"), ("--listen", "socket")] {
        let (tmp, export) = export();
        let path = tmp.path().join("g.sock");
        let value = flag_value(flag, &path);
        let mut args = unix_args(&export, flag, &value);
        args.extend(["--socket-group", &group]);
        let mut d = spawn_umask0(&args, tmp.path().join("d.log"));
        d.wait_log("capabilities [");
        let m = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o660, "{mode}");
        assert_eq!(m.gid(), want_gid, "{mode}");
        d.assert_alive_then_stop(mode);
    }
    let (_tmp, export) = export();
    let out = run(&[
        "--shared-dir",
        export.to_str().unwrap(),
        "--socket-path",
        "/nonexistent/x.sock",
        "--socket-group",
        "no-such-group-9p",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "virtio-9p-server: --socket-group no-such-group-9p: no group named \"no-such-group-9p\"\n"
    );
}
