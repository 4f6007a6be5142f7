// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Shared helpers of the hostile-client suites (`tests/hostile_*.rs`): an
//! in-process socket listener, a raw pipelining 9P peer, message
//! builders, and the process's fds and memory for the bounds checked
//! after each attack.
#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_9p_server::fs::Filesystem;
use virtio_9p_server::protocol::{
    GetattrMask, LockFlags, LockType, OpenFlags, Rmessage, Tattach, Tfid, Tflush, Tgetattr, Tlock,
    Tlopen, Tmessage, Tread, Treaddir, Tversion, Twalk, NOFID, NOTAG, VERSION_9P2000_L,
};
use virtio_9p_server::transport::socket::{ListenAddr, Listener, SocketLimits};
use virtio_9p_server::Server;

pub const ROOT: u32 = 0;
pub const MSIZE: u32 = 256 << 10;

/// The bound on every wait for a reply: generous, so a loaded machine
/// never fails a test by being slow; a request that is never answered
/// fails it.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(20);

/// Runs the tests of one binary one at a time: they read process-wide
/// state (the fds, the pipes and the memory of this process, which
/// `cargo test` shares between the tests of a binary it runs in
/// parallel), and each one loads the machine on purpose.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves `server` on a fresh unix socket in `dir` with `limits`; the
/// accept loop runs until the test process exits.
pub fn serve<F: Filesystem + 'static>(
    dir: &Path,
    server: Arc<Server<F>>,
    limits: SocketLimits,
) -> PathBuf {
    let sock = dir.join("9p.sock");
    let listener = Listener::bind(&ListenAddr::Unix(sock.clone())).unwrap();
    std::thread::spawn(move || listener.serve_with(server, limits));
    sock
}

/// Limits for a small machine: two socket threads, two workers, and
/// `max_requests` in flight over the listener.
pub fn small_limits(max_requests: usize, max_connections: usize) -> SocketLimits {
    let mut l = SocketLimits::default();
    l.threads = 2;
    l.workers = 2;
    l.max_requests = max_requests;
    l.max_connections = max_connections;
    l
}

/// A raw 9P peer: writes frames and reads replies by itself, so it can
/// keep any number of requests outstanding or misbehave.
pub struct Peer {
    pub s: UnixStream,
}

impl Peer {
    /// Connects without negotiating.
    pub fn connect(sock: &Path) -> Peer {
        let s = UnixStream::connect(sock).unwrap();
        s.set_read_timeout(Some(ANSWER_WITHIN)).unwrap();
        Peer { s }
    }

    /// Connects, negotiates `MSIZE` and attaches fid `ROOT` as uid 0.
    pub fn attached(sock: &Path) -> Peer {
        let mut p = Peer::connect(sock);
        p.hello().unwrap();
        p
    }

    /// Tversion then Tattach; errors if either is not answered in time.
    pub fn hello(&mut self) -> io::Result<()> {
        match self.rpc(NOTAG, &tversion())? {
            Rmessage::Version(v) if v.msize >= 8192 => {}
            r => return Err(io::Error::other(format!("Tversion: {r:?}"))),
        }
        match self.rpc(1, &tattach(ROOT))? {
            Rmessage::Attach(_) => Ok(()),
            r => Err(io::Error::other(format!("Tattach: {r:?}"))),
        }
    }

    pub fn send(&mut self, tag: u16, m: &Tmessage) -> io::Result<()> {
        self.s.write_all(&m.encode_frame(tag))
    }

    pub fn send_raw(&mut self, frame: &[u8]) -> io::Result<()> {
        self.s.write_all(frame)
    }

    /// The next reply frame, whole.
    pub fn recv_frame(&mut self) -> io::Result<Vec<u8>> {
        let mut size = [0u8; 4];
        self.s.read_exact(&mut size)?;
        let n = u32::from_le_bytes(size) as usize;
        if !(7..=MSIZE as usize).contains(&n) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("reply size {n}"),
            ));
        }
        let mut out = size.to_vec();
        out.resize(n, 0);
        self.s.read_exact(&mut out[4..])?;
        Ok(out)
    }

    pub fn recv(&mut self) -> io::Result<(u16, Rmessage)> {
        let f = self.recv_frame()?;
        Rmessage::decode_frame(&f, MSIZE)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
    }

    /// Sends `m` with `tag` and returns its reply, which must be the next.
    pub fn rpc(&mut self, tag: u16, m: &Tmessage) -> io::Result<Rmessage> {
        self.send(tag, m)?;
        let (t, r) = self.recv()?;
        if t != tag {
            return Err(io::Error::other(format!("reply tag {t} for {tag}: {r:?}")));
        }
        Ok(r)
    }

    /// Whether a reply (or EOF) is waiting within `d`, without reading it.
    pub fn readable_within(&self, d: Duration) -> bool {
        let mut p = libc::pollfd {
            fd: self.s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut p, 1, d.as_millis() as i32) > 0 }
    }

    /// Whether the server closed the connection within `d` (any replies
    /// still queued are read and dropped).
    pub fn closed_within(&mut self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.s
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            match self.s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::TimedOut => return false,
                Err(_) => return true,
            }
        }
    }
}

pub fn tversion() -> Tmessage {
    Tmessage::Version(Tversion {
        msize: MSIZE,
        version: VERSION_9P2000_L.to_vec(),
    })
}

pub fn tattach(fid: u32) -> Tmessage {
    Tmessage::Attach(Tattach {
        fid,
        afid: NOFID,
        uname: Vec::new(),
        aname: Vec::new(),
        n_uname: 0,
    })
}

pub fn twalk(fid: u32, newfid: u32, names: &[&[u8]]) -> Tmessage {
    Tmessage::Walk(Twalk {
        fid,
        newfid,
        wnames: names.iter().map(|n| n.to_vec()).collect(),
    })
}

pub fn tlopen(fid: u32, flags: OpenFlags) -> Tmessage {
    Tmessage::Lopen(Tlopen { fid, flags })
}

pub fn tclunk(fid: u32) -> Tmessage {
    Tmessage::Clunk(Tfid { fid })
}

pub fn tremove(fid: u32) -> Tmessage {
    Tmessage::Remove(Tfid { fid })
}

pub fn tgetattr(fid: u32) -> Tmessage {
    Tmessage::Getattr(Tgetattr {
        fid,
        request_mask: GetattrMask::BASIC,
    })
}

pub fn tread(fid: u32, offset: u64, count: u32) -> Tmessage {
    Tmessage::Read(Tread { fid, offset, count })
}

pub fn treaddir(fid: u32, count: u32) -> Tmessage {
    Tmessage::Readdir(Treaddir {
        fid,
        offset: 0,
        count,
    })
}

pub fn tflush(oldtag: u16) -> Tmessage {
    Tmessage::Flush(Tflush { oldtag })
}

/// A blocking write lock on the whole file of `fid`.
pub fn tlock_blocking(fid: u32) -> Tmessage {
    Tmessage::Lock(Tlock {
        fid,
        ty: LockType::Wrlck,
        flags: LockFlags::BLOCK,
        start: 0,
        length: 0,
        proc_id: fid,
        client_id: b"hostile".to_vec(),
    })
}

/// The head of a Twrite frame whose data is `count` bytes: size, type,
/// tag, fid, offset, count. The data is the caller's to send.
pub fn twrite_head(tag: u16, fid: u32, offset: u64, count: u32) -> Vec<u8> {
    let size = 7 + 16 + count;
    let mut f = Vec::with_capacity(23);
    f.extend_from_slice(&size.to_le_bytes());
    f.push(118); // Twrite
    f.extend_from_slice(&tag.to_le_bytes());
    f.extend_from_slice(&fid.to_le_bytes());
    f.extend_from_slice(&offset.to_le_bytes());
    f.extend_from_slice(&count.to_le_bytes());
    f
}

/// The fds of this process once the server on `sock` has served a client
/// and gone idle: the baseline an attack's fds must return to.
pub fn idle_fds(sock: &Path) -> usize {
    drop(Peer::attached(sock));
    std::thread::sleep(Duration::from_millis(200));
    fd_count()
}

/// The fds this process holds.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// The resident memory of this process, MiB.
pub fn rss_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: f64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024.0
}

/// Waits up to `d` for `f` to hold; returns whether it did.
pub fn eventually(d: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + d;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Holds an OFD write lock on the whole of `path` (as another host
/// process would) until dropped.
pub struct HostLock(std::fs::File);

impl HostLock {
    pub fn take(path: &Path) -> HostLock {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        // SAFETY: a zeroed flock is a valid value; every field is set below.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        // SAFETY: F_OFD_SETLK reads one flock, valid for the call.
        let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
        assert_eq!(r, 0, "host lock: {}", io::Error::last_os_error());
        HostLock(f)
    }
}

/// Percentile `p` (0..=1) of `v`, which it sorts.
pub fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort_unstable();
    if v.is_empty() {
        return Duration::ZERO;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}
