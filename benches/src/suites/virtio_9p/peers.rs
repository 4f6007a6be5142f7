// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The servers the socket parts measure: ours on a listener of the bench
//! process or in a child process of its own, and diod, the 9P2000.L
//! server Debian ships, as a separate process (`diod -f -n -N -l SOCK -e
//! DIR`).

use std::error::Error;
use std::fs::File;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_9p_server::transport::socket::{ListenAddr, Listener, SocketLimits};
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server};

type Res<T> = Result<T, Box<dyn Error>>;

/// Our socket server on a listener of this process: `Listener::serve_with`,
/// what `virtio-9p-server --listen unix:PATH` runs (socket threads on the
/// request engine, the default limits). Its accept thread runs until the
/// bench process exits.
pub(super) struct OursSocket {
    pub(super) path: PathBuf,
}

impl OursSocket {
    pub(super) fn new(dir: &Path, sock: PathBuf) -> Res<Self> {
        Self::with_limits(dir, sock, SocketLimits::default())
    }

    pub(super) fn with_limits(dir: &Path, sock: PathBuf, limits: SocketLimits) -> Res<Self> {
        let fs = PassthroughFs::new(PassthroughConfig::new(dir))?;
        let server = Arc::new(Server::new(fs, Config::default())?);
        let listener = Listener::bind(&ListenAddr::Unix(sock.clone()))?;
        std::thread::Builder::new()
            .name("ours-accept".into())
            .spawn(move || listener.serve_with(server, limits))?;
        Ok(OursSocket { path: sock })
    }

    pub(super) fn connect(&mut self) -> Res<UnixStream> {
        Ok(UnixStream::connect(&self.path)?)
    }
}

/// Serves `dir` on the unix socket `sock` in this process, forever: the
/// child process whose memory the idle-RSS figure reads
/// (`vmm-benches __socket-server DIR SOCK`).
pub fn serve_socket_forever(dir: &Path, sock: &Path) -> Res<()> {
    let fs = PassthroughFs::new(PassthroughConfig::new(dir))?;
    let server = Arc::new(Server::new(fs, Config::default())?);
    let listener = Listener::bind(&ListenAddr::Unix(sock.to_path_buf()))?;
    listener.serve_with(server, SocketLimits::default())?;
    Ok(())
}

/// Our server in a child process (see [`serve_socket_forever`]).
pub(super) struct OursProcess {
    pub(super) child: Child,
    pub(super) sock: PathBuf,
}

impl OursProcess {
    pub(super) fn start(dir: &Path, sock: PathBuf) -> Res<Self> {
        let child = Command::new(std::env::current_exe()?)
            .arg("__socket-server")
            .arg(dir)
            .arg(&sock)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let me = OursProcess { child, sock };
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&me.sock).is_err() {
            if Instant::now() > deadline {
                return Err("our socket server did not listen within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(me)
    }
}

impl Drop for OursProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// VmRSS of process `pid`, MiB.
pub(super) fn rss_mib(pid: u32) -> Res<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or("no VmRSS")?;
    Ok(kib / 1024.0)
}

/// A diod process, killed and reaped on drop.
pub(super) struct Diod {
    pub(super) child: Child,
    pub(super) sock: PathBuf,
    pub(super) log: PathBuf,
}

impl Drop for Diod {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// `diod` on `PATH`, or in the sbin directories a non-root `PATH` may lack.
pub(super) fn find_diod() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|d| d.join("diod"))
        .find(|p| p.is_file())
}

pub(super) fn diod_version(path: &Path) -> String {
    // diod has no --version; the Debian package records it.
    Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", "diod"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|v| format!("diod {v}"))
        .unwrap_or_else(|| format!("diod ({})", path.display()))
}

impl Diod {
    pub(super) fn start(path: &Path, dir: &Path, sock: PathBuf, log: PathBuf) -> Res<Self> {
        let child = Command::new(path)
            .args(["-f", "-n", "-N", "-L", "stderr", "-l"])
            .arg(&sock)
            .arg("-e")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log)?)
            .spawn()?;
        let mut diod = Diod { child, sock, log };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = diod.child.try_wait()? {
                return Err(format!("diod exited with {status}: {}", diod.log_text()).into());
            }
            if UnixStream::connect(&diod.sock).is_ok() {
                return Ok(diod);
            }
            if Instant::now() > deadline {
                return Err(format!("diod did not listen within 10 s: {}", diod.log_text()).into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(super) fn connect(&self) -> Res<UnixStream> {
        Ok(UnixStream::connect(&self.sock)?)
    }

    pub(super) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log)
            .map(|s| s.trim().chars().take(400).collect())
            .unwrap_or_default()
    }
}
