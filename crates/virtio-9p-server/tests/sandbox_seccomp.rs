// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The seccomp filters' argument checks and the worker-thread filter,
//! syscall by syscall. Each case re-runs this test binary as a child
//! (`SANDBOX_SECCOMP_CASE=<case>`), which installs the daemon's filters
//! with `seccomp::apply` and then makes the calls; in `trap` mode a
//! forbidden call prints its number and exits with status 159, so the
//! parent sees exactly which call was refused.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus};

// The sandbox is the binary's code (src/daemon/sandbox/), not a library
// module: this test compiles it in as the binary does.
#[allow(dead_code, unused_imports)]
#[path = "../src/daemon/error.rs"]
mod error;
#[allow(dead_code, unused_imports)]
#[path = "../src/daemon/sandbox/mod.rs"]
mod sandbox;

use sandbox::seccomp::{self, SeccompMode, ThreadKind};

const CASE_VAR: &str = "SANDBOX_SECCOMP_CASE";
const OK: &str = "sandbox-seccomp: child ok";

/// Runs `case` in a child; returns its exit status and stderr.
fn run_child(test: &str, case: &str) -> (ExitStatus, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CASE_VAR, case)
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn child_case() -> Option<String> {
    std::env::var(CASE_VAR).ok()
}

/// The child's end after every allowed call went through.
fn child_done() -> ! {
    eprintln!("{OK}");
    std::process::exit(0)
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Reads a file the way a worker does (openat, read, close).
fn read_self_exe_head() {
    let mut f = std::fs::File::open("/proc/self/exe").unwrap();
    let mut head = [0u8; 4];
    f.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"\x7fELF");
}

fn assert_trapped(test: &str, case: &str, nr: i64) {
    let (status, err) = run_child(test, case);
    let want = format!("seccomp: forbidden syscall {nr}\n");
    assert!(err.contains(&want), "{case}: expected {want:?} in: {err}");
    assert_eq!(status.code(), Some(128 + libc::SIGSYS), "{case}: {err}");
    assert!(!err.contains(OK), "{case}: the forbidden call went through");
}

#[test]
fn test_threads_start_through_clone_after_clone3_gets_enosys() {
    if child_case().is_some() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        seccomp::apply(SeccompMode::Kill).unwrap();
        // clone3: ENOSYS before the kernel reads its arguments.
        // SAFETY: the filter answers before the (invalid) struct is read.
        let r = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) };
        assert_eq!((r, errno()), (-1, libc::ENOSYS));
        // glibc falls back to clone with the thread flags; std names it
        // with prctl(PR_SET_NAME).
        let t = std::thread::Builder::new()
            .name("sandbox-child".into())
            .spawn(|| 7)
            .unwrap();
        assert_eq!(t.join().unwrap(), 7);
        // ioctl(FIONBIO), std's set_nonblocking on sockets.
        a.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 1];
        let e = (&a).read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        drop(b);
        // A worker thread narrows its own filter and still reads files.
        std::thread::spawn(|| {
            seccomp::enter_thread(ThreadKind::Worker);
            read_self_exe_head();
        })
        .join()
        .unwrap();
        // The main thread keeps the process-wide list (eventfd is on it).
        // SAFETY: plain syscall; the fd is closed at once.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(fd >= 0, "eventfd: {}", errno());
        // SAFETY: our own fd.
        unsafe { libc::close(fd) };
        child_done();
    }
    let (status, err) = run_child(
        "test_threads_start_through_clone_after_clone3_gets_enosys",
        "threads",
    );
    assert_eq!(status.code(), Some(0), "{status:?}: {err}");
    assert!(err.contains(OK), "{err}");
}

#[test]
fn test_forbidden_arguments_are_trapped() {
    const TEST: &str = "test_forbidden_arguments_are_trapped";
    if let Some(case) = child_case() {
        seccomp::apply(SeccompMode::Trap).unwrap();
        match case.as_str() {
            // A process (fork's clone flags), not a thread.
            // SAFETY: the call is refused before a child exists.
            "fork" => unsafe {
                libc::fork();
            },
            // A terminal ioctl.
            // SAFETY: TCGETS into a valid termios.
            "ioctl" => unsafe {
                let mut t: libc::termios = std::mem::zeroed();
                libc::ioctl(std::io::stderr().as_raw_fd(), libc::TCGETS, &mut t);
            },
            // A prctl option outside PR_SET_NAME / PR_SET_NO_NEW_PRIVS.
            // SAFETY: integer arguments.
            "prctl" => unsafe {
                libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
            },
            // seccomp for every thread (TSYNC) is not the calling thread's.
            // SAFETY: refused before the kernel reads the (null) program.
            "seccomp-tsync" => unsafe {
                libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    libc::SECCOMP_FILTER_FLAG_TSYNC,
                    std::ptr::null::<u8>(),
                );
            },
            other => panic!("unknown case {other}"),
        }
        child_done();
    }
    assert_trapped(TEST, "fork", libc::SYS_clone);
    assert_trapped(TEST, "ioctl", libc::SYS_ioctl);
    assert_trapped(TEST, "prctl", libc::SYS_prctl);
    assert_trapped(TEST, "seccomp-tsync", libc::SYS_seccomp);
}

#[test]
fn test_worker_thread_filter_refuses_what_the_process_allows() {
    const TEST: &str = "test_worker_thread_filter_refuses_what_the_process_allows";
    if let Some(case) = child_case() {
        let (a, b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        seccomp::apply(SeccompMode::Trap).unwrap();
        let t = std::thread::spawn(move || {
            seccomp::enter_thread(ThreadKind::Worker);
            read_self_exe_head();
            match case.as_str() {
                // An eventfd: allowed process-wide, not on a worker.
                // SAFETY: plain syscall.
                "eventfd" => unsafe {
                    libc::eventfd(0, libc::EFD_CLOEXEC);
                },
                // A new thread from a worker: clone3 is refused outright.
                "spawn" => {
                    let _ = std::thread::spawn(|| ()).join();
                }
                // Sending on a socket (allowed process-wide).
                // (send(2); a plain write(2) on any fd stays possible.)
                // SAFETY: a valid fd and buffer.
                "send" => unsafe {
                    libc::send(a.as_raw_fd(), b"x".as_ptr().cast(), 1, 0);
                },
                other => panic!("unknown case {other}"),
            }
        });
        let _ = t.join();
        drop(b);
        child_done();
    }
    assert_trapped(TEST, "eventfd", libc::SYS_eventfd2);
    // pthread_create blocks every signal around clone3, so the kernel
    // forces the default action of the SIGSYS: the process dies of it
    // without the handler's message.
    let (status, err) = run_child(TEST, "spawn");
    assert_eq!(status.signal(), Some(libc::SIGSYS), "{status:?}: {err}");
    assert!(!err.contains(OK), "a worker started a thread: {err}");
    assert_trapped(TEST, "send", libc::SYS_sendto);
}
