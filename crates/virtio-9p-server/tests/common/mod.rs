// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Shared helpers of the integration tests.
#![allow(dead_code)]

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use virtio_9p_server::client::{Client, InProcess};
use virtio_9p_server::protocol::{SetattrMask, Tsetattr};
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, SecurityModel, Server};

pub const ROOT: u32 = 0;
pub const MSIZE: u32 = 256 << 10;

pub type TestClient = Client<InProcess<PassthroughFs>>;

pub fn server_with(cfg: PassthroughConfig, config: Config) -> Arc<Server<PassthroughFs>> {
    Arc::new(Server::new(PassthroughFs::new(cfg).unwrap(), config).unwrap())
}

/// A client attached (fid ROOT, uid 0) to a passthrough export of `dir`.
pub fn client_for(
    dir: &std::path::Path,
    model: SecurityModel,
    readonly: bool,
    openat2: bool,
) -> TestClient {
    let mut cfg = PassthroughConfig::new(dir);
    cfg.security_model = model;
    cfg.readonly = readonly;
    cfg.use_openat2 = openat2;
    // The in-process client runs each request on the test's own thread,
    // so a blocking Tlock must give up: nothing else could free the lock.
    let mut config = Config::default();
    config.lock_wait = Some(std::time::Duration::from_secs(1));
    let server = server_with(cfg, config);
    let mut c = Client::new(InProcess::new(server, MSIZE as usize));
    c.version(MSIZE).unwrap();
    c.attach(ROOT, 0).unwrap();
    c
}

pub fn client(dir: &std::path::Path) -> TestClient {
    client_for(dir, SecurityModel::Passthrough, false, true)
}

pub fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// A Tsetattr for `fid` that changes nothing (`valid` 0, every field 0),
/// to fill the rest of a struct update.
pub fn setattr_base(fid: u32) -> Tsetattr {
    Tsetattr {
        fid,
        valid: SetattrMask::empty(),
        mode: 0,
        uid: 0,
        gid: 0,
        size: 0,
        atime_sec: 0,
        atime_nsec: 0,
        mtime_sec: 0,
        mtime_nsec: 0,
    }
}

fn cpath(p: &std::path::Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

/// The host value of xattr `name` on `p` (not following symlinks).
pub fn host_xattr(p: &std::path::Path, name: &[u8]) -> Option<Vec<u8>> {
    let path = cpath(p);
    let name = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid C strings; `buf` is valid for its length.
    let n = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    (n >= 0).then(|| {
        buf.truncate(n as usize);
        buf
    })
}

/// The host xattr names of `p`.
pub fn host_xattr_names(p: &std::path::Path) -> Vec<String> {
    let path = cpath(p);
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid C string; `buf` is valid for its length.
    let n = unsafe { libc::llistxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(
        n >= 0,
        "llistxattr {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    buf[..n as usize]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}

/// Sets the host xattr `name` on `p` (following symlinks); panics on
/// failure.
pub fn host_set_xattr(p: &std::path::Path, name: &[u8], value: &[u8]) {
    let path = cpath(p);
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C strings; `value` is valid for its length.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "setxattr {}: {}",
        String::from_utf8_lossy(name),
        std::io::Error::last_os_error()
    );
}

/// A gate a filesystem call waits on until the test opens it.
#[derive(Default)]
pub struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
    entered: Mutex<usize>,
    entered_cv: Condvar,
}

impl Gate {
    pub fn wait(&self) {
        *self.entered.lock().unwrap() += 1;
        self.entered_cv.notify_all();
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
    }

    pub fn wait_entered(&self, n: usize) {
        let mut e = self.entered.lock().unwrap();
        while *e < n {
            let (guard, res) = self
                .entered_cv
                .wait_timeout(e, Duration::from_secs(10))
                .unwrap();
            e = guard;
            assert!(!res.timed_out(), "the filesystem call never started");
        }
    }

    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

/// A thread that exchanges the names `a` and `b` (`renameat2`
/// `RENAME_EXCHANGE`) as fast as it can until `stop`; it returns how many
/// times it tried.
pub fn spawn_exchanger(
    a: &std::path::Path,
    b: &std::path::Path,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    let cpath =
        |p: &std::path::Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let (a, b) = (cpath(a), cpath(b));
    std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            // SAFETY: valid C strings.
            unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    a.as_ptr(),
                    libc::AT_FDCWD,
                    b.as_ptr(),
                    libc::RENAME_EXCHANGE,
                )
            };
            n += 1;
        }
        n
    })
}
