// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `PassthroughFs::from_fd` for an embedder that jails its device: the
//! export and `/proc/self/fd` come in as open fds, the filesystem reports
//! exactly the fds it holds, bad fds get clear errors, and with a given
//! `/proc/self/fd` fd the filesystem serves with `/proc` unmounted (a
//! child process in its own mount namespace unmounts it).
//!
//! The tests compare this process's open fds before and after, so they
//! hold one lock: no other test of this binary opens fds meanwhile.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::{Arc, Mutex};

use virtio_9p_server::client::{Client, InProcess};
use virtio_9p_server::protocol::{OpenFlags, SetattrMask, UnlinkFlags};
use virtio_9p_server::{Config, PassthroughConfig, PassthroughError, PassthroughFs, Server};

static FDS: Mutex<()> = Mutex::new(());

/// This process's open fds.
fn open_fds() -> BTreeSet<RawFd> {
    let listed: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_str().unwrap().parse().unwrap())
        .collect();
    // The listing's own fd is closed by now.
    listed
        .into_iter()
        // SAFETY: F_GETFD only asks whether the number is open.
        .filter(|&fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1)
        .collect()
}

fn is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only asks whether the number is open.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

fn open_raw(path: &std::path::Path, flags: libc::c_int) -> OwnedFd {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; the result is checked.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    assert!(
        fd >= 0,
        "open {path:?}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a fresh fd nobody else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Attach, create, write, read back, list, xattrs, chmod, utimes,
/// truncate, hard link, rename, unlink: the calls that need
/// `/proc/self/fd` (reopening, path-only xattrs, chmod and utimes by fd).
fn workload(fs: PassthroughFs, dir: &std::path::Path) {
    let server = Arc::new(Server::new(fs, Config::default()).unwrap());
    let mut c = Client::new(InProcess::new(server, 64 << 10));
    c.version(64 << 10).unwrap();
    c.attach(0, 0).unwrap();
    c.walk(0, 1, &[]).unwrap();
    c.lcreate(1, b"f", OpenFlags::RDWR, 0o644, 0).unwrap();
    assert_eq!(c.write(1, 0, b"hello").unwrap(), 5);
    c.walk(0, 2, &[b"f"]).unwrap();
    c.lopen(2, OpenFlags::RDONLY).unwrap();
    assert_eq!(c.read(2, 0, 100).unwrap(), b"hello");
    c.set_xattr(0, 3, b"user.k", b"v", 0).unwrap();
    c.walk(0, 4, &[b"f"]).unwrap();
    c.set_xattr(4, 5, b"user.k", b"value", 0).unwrap();
    assert_eq!(c.get_xattr(4, 5, b"user.k").unwrap(), b"value");
    let names = c.get_xattr(4, 5, b"").unwrap();
    assert!(
        names.split(|b| *b == 0).any(|n| n == b"user.k"),
        "{names:?}"
    );
    let set = |valid, size| virtio_9p_server::protocol::Tsetattr {
        fid: 4,
        valid,
        mode: 0o600,
        uid: 0,
        gid: 0,
        size,
        atime_sec: 1,
        atime_nsec: 0,
        mtime_sec: 2,
        mtime_nsec: 0,
    };
    use SetattrMask as sa;
    c.setattr(set(sa::MODE, 0)).unwrap();
    c.setattr(set(
        sa::ATIME | sa::ATIME_SET | sa::MTIME | sa::MTIME_SET,
        0,
    ))
    .unwrap();
    c.setattr(set(sa::SIZE, 2)).unwrap();
    assert_eq!(c.getattr(4).unwrap().mode & 0o7777, 0o600);
    assert_eq!(c.getattr(4).unwrap().size, 2);
    c.link(0, 4, b"g").unwrap();
    c.renameat(0, b"g", 0, b"h").unwrap();
    let names: Vec<Vec<u8>> = {
        c.walk(0, 6, &[]).unwrap();
        c.lopen(6, OpenFlags::RDONLY).unwrap();
        c.readdir_all(6, 8192)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect()
    };
    assert!(names.contains(&b"f".to_vec()) && names.contains(&b"h".to_vec()));
    c.unlinkat(0, b"h", UnlinkFlags::empty()).unwrap();
    assert!(dir.join("f").exists() && !dir.join("h").exists());
}

#[test]
fn test_from_fd_reports_exactly_the_fds_it_holds() {
    let _g = FDS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    for (root_flags, with_proc) in [
        (libc::O_PATH | libc::O_DIRECTORY, true),
        (libc::O_RDONLY | libc::O_DIRECTORY, true),
        (libc::O_PATH | libc::O_DIRECTORY, false),
    ] {
        let root = open_raw(dir.path(), root_flags);
        let proc_fd = with_proc.then(|| File::open("/proc/self/fd").unwrap());
        let before = open_fds();
        let fs = PassthroughFs::from_fd(
            root.as_fd(),
            proc_fd.as_ref().map(|f| f.as_fd()),
            PassthroughConfig::new(""),
        )
        .unwrap();
        let after = open_fds();
        let reported: BTreeSet<RawFd> = fs.fds().into_iter().collect();
        let new: BTreeSet<RawFd> = after.difference(&before).copied().collect();
        assert_eq!(reported, new, "flags {root_flags:#x}, proc fd {with_proc}");
        assert_eq!(reported.len(), 2);
        // The filesystem's fds are its own: the caller's may go.
        drop(root);
        drop(proc_fd);
        workload(fs, dir.path());
        for fd in &reported {
            assert!(!is_open(*fd), "fd {fd} still open after the drop");
        }
    }
    // `new` reports its fds the same way.
    let before = open_fds();
    let fs = PassthroughFs::new(PassthroughConfig::new(dir.path())).unwrap();
    let new: BTreeSet<RawFd> = open_fds().difference(&before).copied().collect();
    assert_eq!(fs.fds().into_iter().collect::<BTreeSet<_>>(), new);
}

#[test]
fn test_from_fd_rejects_bad_fds_clearly() {
    let _g = FDS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file"), b"x").unwrap();
    let cfg = || PassthroughConfig::new("");
    let before = open_fds();

    // Not a directory.
    let file = File::open(dir.path().join("file")).unwrap();
    let e = PassthroughFs::from_fd(file.as_fd(), None, cfg()).unwrap_err();
    assert!(
        matches!(&e, PassthroughError::SharedDirFd { fd, source } if *fd == file.as_raw_fd()
            && source.raw_os_error() == Some(libc::ENOTDIR)),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "shared directory fd {} is not an open directory: Not a directory (os error 20)",
            file.as_raw_fd()
        )
    );
    // A closed fd.
    let closed = File::open(dir.path()).unwrap().into_raw_fd_for_test();
    // SAFETY: the number is closed on purpose; `from_fd` only hands it to
    // openat, which answers EBADF, and never closes it.
    let gone = unsafe { BorrowedFd::borrow_raw(closed) };
    let e = PassthroughFs::from_fd(gone, None, cfg()).unwrap_err();
    assert!(
        matches!(&e, PassthroughError::SharedDirFd { source, .. } if source.raw_os_error() == Some(libc::EBADF)),
        "{e:?}"
    );

    // /proc/self/fd fds that are not this process's.
    let root = File::open(dir.path()).unwrap();
    for (proc_path, why) in [
        (dir.path().to_path_buf(), "not a procfs directory"),
        ("/proc".into(), "this process's fds"),
        ("/proc/1/fd".into(), "this process's fds"),
    ] {
        let p = File::open(&proc_path).unwrap();
        let e = PassthroughFs::from_fd(root.as_fd(), Some(p.as_fd()), cfg()).unwrap_err();
        assert!(
            matches!(e, PassthroughError::ProcFd { fd, .. } if fd == p.as_raw_fd()),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!(
                "fd {} is not this process's /proc/self/fd: ",
                p.as_raw_fd()
            )) && msg.contains(why),
            "{proc_path:?}: {msg}"
        );
    }
    // A regular file as the /proc/self/fd fd.
    let e = PassthroughFs::from_fd(root.as_fd(), Some(file.as_fd()), cfg()).unwrap_err();
    assert!(
        matches!(&e, PassthroughError::ProcFd { source, .. } if source.raw_os_error() == Some(libc::ENOTDIR)),
        "{e:?}"
    );
    drop((file, root));
    // Nothing leaked on the error paths.
    assert_eq!(open_fds(), before);
}

trait IntoRawForTest {
    /// Closes the file and returns the number it had.
    fn into_raw_fd_for_test(self) -> RawFd;
}

impl IntoRawForTest for File {
    fn into_raw_fd_for_test(self) -> RawFd {
        let n = self.as_raw_fd();
        drop(self);
        n
    }
}

const CHILD: &str = "PASSTHROUGH_FDS_CHILD";

#[test]
fn test_from_fd_with_proc_fd_serves_without_proc_mounted() {
    let _g = FDS.lock().unwrap_or_else(|e| e.into_inner());
    if std::env::var_os(CHILD).is_some() {
        // The child: in its own mount namespace (see below). Take the fds,
        // then unmount /proc.
        let dir = std::path::PathBuf::from(std::env::var_os(CHILD).unwrap());
        let root = File::open(&dir).unwrap();
        let proc_fd = File::open("/proc/self/fd").unwrap();
        let fs = PassthroughFs::from_fd(
            root.as_fd(),
            Some(proc_fd.as_fd()),
            PassthroughConfig::new(""),
        )
        .unwrap();
        drop((root, proc_fd));
        // The control: `new` names files by /proc path for xattrs.
        let by_path = PassthroughFs::new(PassthroughConfig::new(&dir)).unwrap();
        // SAFETY: a valid C string; detaching /proc in a private namespace.
        let r = unsafe { libc::umount2(c"/proc".as_ptr(), libc::MNT_DETACH) };
        assert_eq!(r, 0, "umount /proc: {}", std::io::Error::last_os_error());
        assert!(
            std::fs::metadata("/proc/self/fd").is_err(),
            "/proc still there"
        );
        let server = Arc::new(Server::new(by_path, Config::default()).unwrap());
        let mut c = Client::new(InProcess::new(server, 8192));
        c.version(8192).unwrap();
        c.attach(0, 0).unwrap();
        let e = c.get_xattr(0, 1, b"user.none").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
        workload(fs, &dir);
        eprintln!("passthrough-fds: child ok");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "test_from_fd_with_proc_fd_serves_without_proc_mounted",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, dir.path());
    // SAFETY: between fork and exec the closure only makes raw syscalls.
    unsafe {
        cmd.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWNS) != 0
                || libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed: {err}");
    assert!(err.contains("passthrough-fds: child ok"), "{err}");
}
