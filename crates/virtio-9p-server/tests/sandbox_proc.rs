// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The sandbox hides the host's kernel knobs: from inside the
//! namespace and chroot sandboxes, `/proc/sys` and `/proc/1/root` are
//! unreachable through every fd the running daemon holds.
//!
//! The check takes the daemon's view without its help: it copies each of
//! the daemon's fds into a child of the test (`pidfd_getfd`), chroots that
//! child into the daemon's root (`/proc/PID/root`), and there tries
//! `openat` escapes (`..` chains to `sys/kernel/core_pattern`,
//! `1/root`, `sysrq-trigger` and more, and the absolute paths) from each
//! fd and from the daemon's current directory. `--sandbox none` is the
//! control: there the same check must find the way out, which shows the
//! check can see one. A host `/` leaked to the daemon as an inherited fd is
//! closed at start, and chroot mode, whose current directory is the
//! confined fd directory, serves mapped-xattr. Needs root (pidfd_getfd of a root daemon, chroot);
//! namespace cases skip with a notice where namespaces cannot be created.

mod sandbox_support;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use sandbox_support::{no_namespaces, socket_daemon, version, Daemon};
use virtio_9p_server::protocol::OpenFlags as of;
use virtio_9p_server::vhost_user::mock::{FakeVmm, VmmOptions};

const ROOT: u32 = 0;

/// The names an escape would reach, each tried after 0 to 6 `../`.
const TARGETS: [&str; 8] = [
    "sys/kernel/core_pattern",
    "proc/sys/kernel/core_pattern",
    "1/root/etc",
    "proc/1/root/etc",
    "sysrq-trigger",
    "proc/sysrq-trigger",
    "self/root/etc",
    "thread-self/root/etc",
];

/// Absolute paths tried as well (they ignore the fd: the root decides).
const ABSOLUTE: [&str; 4] = [
    "/proc/sys/kernel/core_pattern",
    "/proc/1/root",
    "/sys/kernel",
    "/etc/passwd",
];

/// One of the daemon's fds, copied into this process.
struct Held {
    label: String,
    fd: OwnedFd,
}

/// False (after a skip notice) unless the test runs as root.
fn root_user(what: &str) -> bool {
    // SAFETY: plain getter.
    let root = unsafe { libc::geteuid() == 0 };
    if !root {
        eprintln!("SKIP {what}: needs root (pidfd_getfd, chroot, mount namespaces)");
    }
    root
}

/// Asserts that nothing out of the daemon's view was found.
fn assert_confined(pid: i32, what: &str) {
    let found = escapes(pid, "hello");
    assert!(found.is_empty(), "{what}: ways out: {found:#?}");
}

/// Starts `cmd`, which creates `sock`, and waits until it is confined;
/// `None` (after a notice) where namespaces cannot be created.
fn start(cmd: &mut std::process::Command, sock: &Path, log: std::path::PathBuf) -> Option<Daemon> {
    let mut d = Daemon::spawn_with(cmd, log);
    if !d.wait_for(sock) {
        if no_namespaces(&d, "proc escapes") {
            return None;
        }
        panic!("daemon exited: {}", d.stderr());
    }
    d.wait_log("capabilities [");
    Some(d)
}

/// Every fd of `pid`, its current directory and its root, as fds of this
/// process; and the root on its own (for the chroot).
fn take_fds(pid: i32) -> (Vec<Held>, OwnedFd) {
    // SAFETY: pidfd_open with a pid and no flags; the result is checked.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    assert!(
        pidfd >= 0,
        "pidfd_open: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh fd we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let mut held = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let e = e.unwrap();
        let n: i32 = e.file_name().to_str().unwrap().parse().unwrap();
        let target = std::fs::read_link(e.path())
            .map(|t| t.display().to_string())
            .unwrap_or_default();
        // SAFETY: pidfd_getfd on a pidfd we own; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), n, 0) } as i32;
        if fd < 0 {
            // Closed between the listing and now.
            continue;
        }
        held.push(Held {
            label: format!("fd {n} ({target})"),
            // SAFETY: a fresh fd we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        });
    }
    let open = |what: &str| -> OwnedFd {
        let c = CString::new(format!("/proc/{pid}/{what}")).unwrap();
        // SAFETY: valid C string; the result is checked.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        assert!(fd >= 0, "open /proc/{pid}/{what}");
        // SAFETY: a fresh fd we own.
        unsafe { OwnedFd::from_raw_fd(fd) }
    };
    held.push(Held {
        label: "the current directory".into(),
        fd: open("cwd"),
    });
    held.push(Held {
        label: "the root directory".into(),
        fd: open("root"),
    });
    (held, open("root"))
}

/// Runs `(fd, path)` openat probes in a child chrooted into `root`;
/// returns, for each, whether the open succeeded.
fn probe_in_view(root: &OwnedFd, probes: &[(i32, CString)]) -> Vec<bool> {
    let mut fds = [0; 2];
    // SAFETY: a valid out array of two fds.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // Allocated before fork: the child only makes system calls.
    let mut out = vec![0u8; probes.len()];
    // SAFETY: the child runs only async-signal-safe system calls on
    // memory allocated before the fork, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: raw system calls on valid fds, C strings and buffers.
        unsafe {
            if libc::fchdir(root.as_raw_fd()) != 0 || libc::chroot(c".".as_ptr()) != 0 {
                libc::_exit(2);
            }
            for (i, (dir, path)) in probes.iter().enumerate() {
                let fd = libc::openat(*dir, path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                if fd >= 0 {
                    out[i] = 1;
                    libc::close(fd);
                }
            }
            let n = libc::write(fds[1], out.as_ptr().cast(), out.len());
            libc::_exit(if n == out.len() as isize { 0 } else { 3 });
        }
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(fds[1]) };
    // SAFETY: the read end, which we own.
    let mut r = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fds[0]) });
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut r, &mut got).unwrap();
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "probe child failed: {status:#x}"
    );
    assert_eq!(got.len(), probes.len());
    got.into_iter().map(|b| b == 1).collect()
}

/// Every way out of `pid`'s view that the probes found, as
/// `"<fd label>: <path>"`; panics unless `must_reach` (relative to the
/// daemon's root) is reachable, which shows the probes ran in its view.
fn escapes(pid: i32, must_reach: &str) -> Vec<String> {
    let (held, root) = take_fds(pid);
    let mut probes = Vec::new();
    let mut labels = Vec::new();
    for h in &held {
        for depth in 0..=6 {
            for t in TARGETS {
                let path = format!("{}{t}", "../".repeat(depth));
                labels.push(format!("{}: {path}", h.label));
                probes.push((h.fd.as_raw_fd(), CString::new(path).unwrap()));
            }
        }
    }
    for a in ABSOLUTE {
        labels.push(format!("absolute: {a}"));
        probes.push((libc::AT_FDCWD, CString::new(a).unwrap()));
    }
    labels.push(format!("control: /{must_reach}"));
    probes.push((
        libc::AT_FDCWD,
        CString::new(format!("/{must_reach}")).unwrap(),
    ));
    let mut reached = probe_in_view(&root, &probes);
    assert!(
        reached.pop().unwrap(),
        "/{must_reach} is not visible: the probes did not run in the daemon's view"
    );
    labels
        .into_iter()
        .zip(reached)
        .filter_map(|(l, r)| r.then_some(l))
        .collect()
}

/// A tree with `export/hello` and `export/dir/inner`.
fn tree() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    std::fs::create_dir_all(export.join("dir")).unwrap();
    std::fs::write(export.join("hello"), b"hello world").unwrap();
    std::fs::write(export.join("dir/inner"), b"inner").unwrap();
    (tmp, export)
}

/// Holds fids on a file and a directory, one file open for I/O.
fn busy_session(sock: &Path) -> sandbox_support::SockClient {
    let mut c = sandbox_support::session(sock, ROOT);
    c.walk(ROOT, 1, &[b"dir"]).unwrap();
    c.walk(ROOT, 2, &[b"hello"]).unwrap();
    c.lopen(2, of::RDWR).unwrap();
    c.walk(1, 3, &[b"inner"]).unwrap();
    c.walk(ROOT, 4, &[b"dir"]).unwrap();
    c.lopen(4, of::RDONLY | of::DIRECTORY).unwrap();
    c
}

#[test]
fn test_proc_knobs_unreachable_from_every_socket_daemon_fd() {
    if !root_user("proc escapes") {
        return;
    }
    for mode in ["namespace", "chroot"] {
        let (tmp, export) = tree();
        let sock = tmp.path().join("9p.sock");
        let Some(d) = socket_daemon(&export, &sock, tmp.path().join("d.log"), mode, &[]) else {
            continue;
        };
        let mut c = busy_session(&sock);
        assert_confined(d.server_pid(mode), mode);
        // The daemon still serves, xattrs (through the confined fd
        // directory) included.
        c.set_xattr(2, 10, b"user.probe", b"v", 0).unwrap();
        assert_eq!(c.get_xattr(2, 11, b"user.probe").unwrap(), b"v");
        assert_eq!(c.read(2, 0, 64).unwrap(), b"hello world");
        drop(c);
        d.assert_alive_then_stop(mode);
    }
}

#[test]
fn test_proc_knobs_unreachable_from_the_vhost_user_daemon() {
    if !root_user("proc escapes") {
        return;
    }
    for mode in ["namespace", "chroot"] {
        let (tmp, export) = tree();
        let sock = tmp.path().join("vu.sock");
        let mut cmd = std::process::Command::new(sandbox_support::BIN);
        cmd.args(["--shared-dir", export.to_str().unwrap()]).args([
            "--socket-path",
            sock.to_str().unwrap(),
            "--sandbox",
            mode,
            "--keep-serving",
        ]);
        let Some(d) = start(&mut cmd, &sock, tmp.path().join("vu.log")) else {
            continue;
        };
        // Connected: guest memory (memfd), eventfds, the engine's fds.
        let mut vmm = FakeVmm::connect(&sock, VmmOptions::default()).unwrap();
        assert_eq!(version(&mut vmm, 8192), 8192);
        assert_confined(d.server_pid(mode), mode);
        drop(vmm);
        d.assert_alive_then_stop(mode);
    }
}

#[test]
fn test_proc_escape_check_finds_the_way_out_without_a_sandbox() {
    if !root_user("proc escapes") {
        return;
    }
    // --sandbox none keeps a /proc/self/fd fd on the host's /proc: the
    // check must report the climb from it to the kernel knobs.
    let (tmp, export) = tree();
    let sock = tmp.path().join("9p.sock");
    let d = socket_daemon(&export, &sock, tmp.path().join("d.log"), "none", &[]).unwrap();
    let c = busy_session(&sock);
    let found = escapes(d.server_pid("none"), export.join("hello").to_str().unwrap());
    let core = found
        .iter()
        .any(|f| f.ends_with(": ../../sys/kernel/core_pattern"));
    // The pid directories are reachable too (this machine's own pid 1 is
    // closed even to root, so the control climbs to /proc/self/root).
    let pid_root = found.iter().any(|f| f.ends_with(": ../../self/root/etc"));
    assert!(core && pid_root, "{found:#?}");
    assert!(found
        .iter()
        .any(|f| f == "absolute: /proc/sys/kernel/core_pattern"));
    drop(c);
    d.assert_alive_then_stop("none");
}

#[test]
fn test_inherited_fds_are_closed_at_start() {
    if !root_user("proc escapes") {
        return;
    }
    // A careless parent leaks the host's `/` (not close-on-exec) as fd 40:
    // it would be a way out of any sandbox, so the daemon closes it.
    for mode in ["namespace", "chroot"] {
        let (tmp, export) = tree();
        let sock = tmp.path().join("9p.sock");
        let listen = format!("unix:{}", sock.display());
        let mut cmd = std::process::Command::new(sandbox_support::BIN);
        cmd.args([
            "--shared-dir",
            export.to_str().unwrap(),
            "--listen",
            &listen,
        ])
        .args(["--sandbox", mode]);
        // SAFETY: open(2) and dup2(2) in the child before exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                let fd = libc::open(c"/".as_ptr(), libc::O_PATH | libc::O_DIRECTORY);
                if fd < 0 || libc::dup2(fd, 40) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
        let Some(d) = start(&mut cmd, &sock, tmp.path().join("leak.log")) else {
            continue;
        };
        let pid = d.server_pid(mode);
        assert!(
            std::fs::symlink_metadata(format!("/proc/{pid}/fd/40")).is_err(),
            "{mode}: the leaked fd is still open"
        );
        assert_confined(pid, mode);
        d.assert_alive_then_stop(mode);
    }
}

#[test]
fn test_chroot_mode_serves_mapped_xattr() {
    // The confined /proc/self/fd is the chroot's current directory, so the
    // path-only xattr calls work there and mapped-xattr is no longer
    // refused under --sandbox chroot.
    if !root_user("chroot mapped-xattr") {
        return;
    }
    let (tmp, export) = tree();
    let sock = tmp.path().join("9p.sock");
    let extra = ["--security-model", "mapped-xattr"];
    let d = socket_daemon(&export, &sock, tmp.path().join("m.log"), "chroot", &extra).unwrap();
    let mut c = sandbox_support::session(&sock, ROOT);
    c.walk(ROOT, 1, &[]).unwrap();
    c.lcreate(1, b"mapped", of::RDWR, 0o640, 0).unwrap();
    assert_eq!(c.getattr(1).unwrap().mode & 0o7777, 0o640);
    let host = CString::new(export.join("mapped").to_str().unwrap()).unwrap();
    // SAFETY: valid C strings; a NULL buffer asks for the size only.
    let n = unsafe {
        libc::getxattr(
            host.as_ptr(),
            c"user.virtfs.mode".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    assert!(n > 0, "no user.virtfs.mode on the host file");
    drop(c);
    d.assert_alive_then_stop("chroot mapped-xattr");
}
