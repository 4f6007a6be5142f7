// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Zero-copy Rread on the socket transport: Rread data
//! spliced file -> pipe -> socket, over unix and TCP sockets.
//!
//! In-process servers check content at page, pipe and EOF boundaries,
//! out-of-order replies (an uncached read filled on a worker beside cached
//! ones), Tflush of reads whose replies wait for the socket, and the copy
//! fallback of a filesystem that is not fd-backed. The daemon binary
//! (under `--seccomp kill`, so the filter is exercised too) is used where
//! its fds are counted: pipes held while a slow client's replies wait,
//! released once idle, none leaked by a hang-up mid-splice, and a file
//! truncated under spliced replies.

mod common;
mod sandbox_support;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use virtio_9p_server::client::{Client, StreamTransport};
use virtio_9p_server::fs::{Cred, Filesystem};
use virtio_9p_server::io::ReplyWriter;
use virtio_9p_server::protocol::{
    GetattrMask, OpenFlags as of, Qid, QidType, Rgetattr, Rmessage, Tflush, Tgetattr, Tmessage,
    Tread,
};
use virtio_9p_server::transport::socket::{ListenAddr, Listener};
use virtio_9p_server::{Config, PassthroughConfig, Server};

/// The byte at offset `i` of the test files: not periodic in pages.
fn byte_at(i: u64) -> u8 {
    ((i.wrapping_mul(2_654_435_761) >> 13) ^ (i >> 12)) as u8
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len as u64).map(byte_at).collect()
}

/// Size of the main test file: not a multiple of a page.
const FILE_LEN: usize = (3 << 20) + 1234;

fn tread(fid: u32, offset: u64, count: u32) -> Tmessage {
    Tmessage::Read(Tread { fid, offset, count })
}

fn tgetattr(fid: u32) -> Tmessage {
    Tmessage::Getattr(Tgetattr {
        fid,
        request_mask: GetattrMask::BASIC,
    })
}

/// A raw frame client over any stream, after version/attach.
struct Raw<S: Read + Write>(Client<StreamTransport<S>>);

impl<S: Read + Write> Raw<S> {
    fn new(s: S) -> Self {
        let mut c = Client::new(StreamTransport(s));
        c.version(MSIZE).unwrap();
        c.attach(ROOT, 0).unwrap();
        Raw(c)
    }

    /// Walks `fid` to `name` and opens it read-only.
    fn open(&mut self, fid: u32, name: &str) {
        self.0.walk(ROOT, fid, &[name.as_bytes()]).unwrap();
        self.0.lopen(fid, of::RDONLY).unwrap();
    }

    fn send(&mut self, tag: u16, m: &Tmessage) {
        self.0
            .transport()
            .0
            .write_all(&m.encode_frame(tag))
            .unwrap();
    }

    fn recv(&mut self) -> (u16, Rmessage) {
        let frame = self.0.transport().read_frame().unwrap();
        Rmessage::decode_frame(&frame, MSIZE).unwrap()
    }

    fn read(&mut self, tag: u16, fid: u32, off: u64, count: u32) -> Vec<u8> {
        self.send(tag, &tread(fid, off, count));
        match self.recv() {
            (t, Rmessage::Read(d)) if t == tag => d,
            r => panic!("{r:?}"),
        }
    }

    fn getattr_ok(&mut self, tag: u16) {
        self.send(tag, &tgetattr(ROOT));
        assert!(matches!(self.recv(), (t, Rmessage::Getattr(_)) if t == tag));
    }
}

fn export_with_file(dir: &Path) -> PathBuf {
    let export = dir.join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("f"), pattern(FILE_LEN)).unwrap();
    export
}

/// An in-process listener on `addr` serving `export`.
fn serve(export: &Path, addr: ListenAddr) -> ListenAddr {
    let server = server_with(PassthroughConfig::new(export), Config::default());
    let listener = Listener::bind(&addr).unwrap();
    let bound = listener.local_addr().unwrap();
    // The accept loop runs until the test process exits.
    std::thread::spawn(move || listener.serve(server));
    bound
}

/// An in-process listener on `dir`/9p.sock serving `export`.
fn serve_unix(export: &Path, dir: &Path) -> PathBuf {
    let path = dir.join("9p.sock");
    serve(export, ListenAddr::Unix(path.clone()));
    path
}

fn expect_range(got: &[u8], off: u64, count: usize, file_len: usize) {
    let end = (off as usize).saturating_add(count).min(file_len);
    let want = end.saturating_sub(off as usize);
    assert_eq!(got.len(), want, "length at offset {off} count {count}");
    for (i, &b) in got.iter().enumerate() {
        if b != byte_at(off + i as u64) {
            panic!("byte {} of the read at {off} (count {count}) differs", i);
        }
    }
}

/// Offsets and counts around pages, pipe sizes, the splice threshold,
/// msize and the end of the file.
fn boundary_reads() -> Vec<(u64, u32)> {
    let max = MSIZE - 11;
    let len = FILE_LEN as u64;
    let mut v = Vec::new();
    for off in [0u64, 1, 4095, 4096, 4097, 65_535, 1 << 20] {
        for count in [
            1u32, 4095, 4096, 16_383, 16_384, 16_385, 65_535, 65_536, 65_537, 131_073, 200_000, max,
        ] {
            v.push((off, count));
        }
    }
    for (back, count) in [
        (100u64, 65_536u32),
        (16_384, 65_536),
        (20_000, 65_536),
        (65_536, 65_536),
        (65_537, 65_536),
        (1, max),
    ] {
        v.push((len - back, count));
    }
    // At and after the end of the file.
    v.extend([(len, 65_536), (len + 1, 65_536), (len + (1 << 30), 4096)]);
    v
}

fn check_boundaries<S: Read + Write>(mut c: Raw<S>) {
    c.open(1, "f");
    for (i, (off, count)) in boundary_reads().into_iter().enumerate() {
        let d = c.read(i as u16 % 1000 + 1, 1, off, count);
        expect_range(&d, off, count as usize, FILE_LEN);
    }
    c.getattr_ok(2000);
}

#[test]
fn test_spliced_rread_matches_the_file_at_boundaries_over_unix() {
    let tmp = tempfile::tempdir().unwrap();
    let export = export_with_file(tmp.path());
    let path = serve_unix(&export, tmp.path());
    check_boundaries(Raw::new(UnixStream::connect(path).unwrap()));
}

#[test]
fn test_spliced_rread_matches_the_file_at_boundaries_over_tcp() {
    let tmp = tempfile::tempdir().unwrap();
    let export = export_with_file(tmp.path());
    let addr = serve(&export, ListenAddr::Tcp("127.0.0.1:0".into()));
    let ListenAddr::Tcp(hp) = addr else {
        unreachable!()
    };
    check_boundaries(Raw::new(TcpStream::connect(hp).unwrap()));
}

/// Drops the clean pages of `path` from the page cache.
fn evict(path: &Path) {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: fadvise on an fd we hold; no memory is passed.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0);
}

#[test]
fn test_spliced_replies_out_of_order_are_matched_by_tag() {
    let tmp = tempfile::tempdir().unwrap();
    let export = export_with_file(tmp.path());
    std::fs::write(export.join("cold"), pattern(FILE_LEN)).unwrap();
    let file = std::fs::File::open(export.join("cold")).unwrap();
    file.sync_all().unwrap();
    let path = serve_unix(&export, tmp.path());
    let mut c = Raw::new(UnixStream::connect(path).unwrap());
    c.open(1, "f");
    c.open(2, "cold");
    for round in 0..3u64 {
        evict(&export.join("cold"));
        // An uncached read (filled on a worker) first, then cached ones
        // and a Tgetattr behind it.
        let base = round * 10;
        c.send(100, &tread(2, (1 << 20) + round * 4096, 200_000));
        for i in 0..6u16 {
            c.send(
                101 + i,
                &tread(1, base * 65_536 + u64::from(i) * 70_001, 65_536),
            );
        }
        c.send(200, &tgetattr(ROOT));
        let mut seen = Vec::new();
        for _ in 0..8 {
            let (tag, r) = c.recv();
            match (tag, r) {
                (100, Rmessage::Read(d)) => {
                    expect_range(&d, (1 << 20) + round * 4096, 200_000, FILE_LEN)
                }
                (t @ 101..=106, Rmessage::Read(d)) => expect_range(
                    &d,
                    base * 65_536 + u64::from(t - 101) * 70_001,
                    65_536,
                    FILE_LEN,
                ),
                (200, Rmessage::Getattr(_)) => {}
                r => panic!("{r:?}"),
            }
            seen.push(tag);
        }
        seen.sort_unstable();
        assert_eq!(seen, [100, 101, 102, 103, 104, 105, 106, 200]);
    }
}

#[test]
fn test_tflush_of_spliced_reads_keeps_reply_before_rflush() {
    let tmp = tempfile::tempdir().unwrap();
    let export = export_with_file(tmp.path());
    let path = serve_unix(&export, tmp.path());
    let mut c = Raw::new(UnixStream::connect(path).unwrap());
    c.open(1, "f");
    // Reads whose replies fill the socket (the client reads nothing yet),
    // each followed by a Tflush of it.
    let n = 12u16;
    for i in 0..n {
        c.send(i + 1, &tread(1, u64::from(i) * 200_000, 200_000));
        c.send(500 + i, &Tmessage::Flush(Tflush { oldtag: i + 1 }));
    }
    std::thread::sleep(Duration::from_millis(200));
    let mut read_seen = vec![false; usize::from(n)];
    let mut flushed = vec![false; usize::from(n)];
    while flushed.iter().any(|f| !f) {
        match c.recv() {
            (t @ 1..=12, Rmessage::Read(d)) => {
                let i = usize::from(t - 1);
                assert!(!flushed[i], "tag {t}: Rread after its Rflush");
                read_seen[i] = true;
                expect_range(&d, i as u64 * 200_000, 200_000, FILE_LEN);
            }
            (t @ 500..=511, Rmessage::Flush) => flushed[usize::from(t - 500)] = true,
            r => panic!("{r:?}"),
        }
    }
    // Most reads had finished (their replies waiting for the socket) when
    // their Tflush was read: those are answered, before their Rflush.
    assert!(read_seen.iter().any(|&s| s), "{read_seen:?}");
    c.getattr_ok(900);
}

/// A filesystem that is not fd-backed: one file whose bytes it writes
/// into the reply itself.
struct Generated;

fn qid(ino: u64) -> Qid {
    Qid {
        ty: if ino == 0 {
            QidType::DIR
        } else {
            QidType::FILE
        },
        version: 0,
        path: ino,
    }
}

impl Filesystem for Generated {
    type Inode = u64;
    type File = u64;

    fn attach(&self, _aname: &[u8], _cred: Cred) -> io::Result<(u64, Qid)> {
        Ok((0, qid(0)))
    }

    fn walk(&self, dir: &u64, name: &[u8]) -> io::Result<(u64, Qid)> {
        match (*dir, name) {
            (0, b"f") => Ok((1, qid(1))),
            _ => Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
    }

    fn getattr(&self, inode: &u64, _mask: GetattrMask) -> io::Result<Rgetattr> {
        Ok(Rgetattr {
            qid: qid(*inode),
            mode: if *inode == 0 { 0o40755 } else { 0o100644 },
            size: FILE_LEN as u64,
            ..Default::default()
        })
    }

    fn open(&self, inode: &u64, _flags: of) -> io::Result<(u64, Qid)> {
        Ok((*inode, qid(*inode)))
    }

    fn read<W: ReplyWriter>(
        &self,
        _file: &u64,
        w: &mut W,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        let end = (off as usize).saturating_add(count).min(FILE_LEN);
        let start = (off as usize).min(end);
        let data: Vec<u8> = (start as u64..end as u64).map(byte_at).collect();
        w.write_all(&data)?;
        Ok(data.len())
    }
}

#[test]
fn test_filesystem_without_fds_keeps_the_copy_path() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("9p.sock");
    let server = Arc::new(Server::new(Generated, Config::default()).unwrap());
    let listener = Listener::bind(&ListenAddr::Unix(path.clone())).unwrap();
    std::thread::spawn(move || listener.serve(server));
    let mut c = Raw::new(UnixStream::connect(&path).unwrap());
    c.open(1, "f");
    for (i, (off, count)) in boundary_reads().into_iter().enumerate().step_by(3) {
        let d = c.read(i as u16 + 1, 1, off, count);
        expect_range(&d, off, count as usize, FILE_LEN);
    }
    c.getattr_ok(2000);
}

// --- The daemon: fds, slow clients, hang-ups, truncation. ---

/// The pipes (fd pairs) open in process `pid`.
fn pipes(pid: i32) -> usize {
    fds(pid).iter().filter(|l| l.starts_with("pipe:")).count() / 2
}

fn fds(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

/// Waits up to 10 s for `f` to hold; returns whether it did.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

struct DaemonSetup {
    _tmp: tempfile::TempDir,
    export: PathBuf,
    sock: PathBuf,
    d: sandbox_support::Daemon,
    pid: i32,
}

fn daemon() -> DaemonSetup {
    let tmp = tempfile::tempdir().unwrap();
    let export = export_with_file(tmp.path());
    let sock = tmp.path().join("9p.sock");
    let d = sandbox_support::socket_daemon(&export, &sock, tmp.path().join("log"), "none", &[])
        .expect("sandbox none always starts");
    let pid = d.server_pid("none");
    DaemonSetup {
        _tmp: tmp,
        export,
        sock,
        d,
        pid,
    }
}

fn unix(sock: &Path) -> Raw<UnixStream> {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    Raw::new(s)
}

/// Sends `n` reads of 200,000 bytes at offsets `i * 200_000` without
/// reading their replies.
fn stall(c: &mut Raw<UnixStream>, n: u16) {
    for i in 0..n {
        c.send(i + 1, &tread(1, u64::from(i) * 200_000, 200_000));
    }
}

#[test]
fn test_slow_reader_holds_pipes_others_are_served_then_pipes_go() {
    let s = daemon();
    // Warm the page cache and let the daemon's pools settle.
    std::fs::read(s.export.join("f")).unwrap();
    drop(unix(&s.sock));
    assert!(eventually(|| pipes(s.pid) == 0), "no pipe when idle");
    let mut slow = unix(&s.sock);
    slow.open(1, "f");
    stall(&mut slow, 8);
    // Replies wait in pipes while the socket is full (EAGAIN mid-splice).
    assert!(
        eventually(|| pipes(s.pid) > 0),
        "a spliced reply waiting for the socket holds a pipe"
    );
    // Another connection is served meanwhile.
    let mut other = unix(&s.sock);
    other.open(1, "f");
    for i in 0..4u64 {
        let d = other.read(7, 1, i * 65_536, 65_536);
        expect_range(&d, i * 65_536, 65_536, FILE_LEN);
    }
    other.getattr_ok(8);
    // The slow client now reads everything: whole and in order of the file.
    std::thread::sleep(Duration::from_millis(100));
    let mut tags = Vec::new();
    for _ in 0..8 {
        match slow.recv() {
            (t, Rmessage::Read(d)) => {
                expect_range(&d, u64::from(t - 1) * 200_000, 200_000, FILE_LEN);
                tags.push(t);
            }
            r => panic!("{r:?}"),
        }
    }
    tags.sort_unstable();
    assert_eq!(tags, (1..=8).collect::<Vec<_>>());
    slow.getattr_ok(100);
    drop((slow, other));
    assert!(
        eventually(|| pipes(s.pid) == 0),
        "pipes of idle connections are released: {} left",
        pipes(s.pid)
    );
    s.d.assert_alive_then_stop("slow reader");
}

#[test]
fn test_hangup_mid_splice_leaks_no_fd() {
    let s = daemon();
    std::fs::read(s.export.join("f")).unwrap();
    drop(unix(&s.sock));
    assert!(eventually(|| pipes(s.pid) == 0));
    std::thread::sleep(Duration::from_millis(100));
    let baseline = fds(s.pid).len();
    for round in 0..3 {
        let mut c = unix(&s.sock);
        c.open(1, "f");
        stall(&mut c, 10);
        assert!(eventually(|| pipes(s.pid) > 0), "round {round}: no pipe");
        // Read part of one reply, then hang up mid-splice.
        let mut part = vec![0u8; 50_000];
        c.0.transport().0.read_exact(&mut part).unwrap();
        drop(c);
        assert!(
            eventually(|| fds(s.pid).len() <= baseline),
            "round {round}: {} fds after the hang-up, baseline {baseline}: {:?}",
            fds(s.pid).len(),
            fds(s.pid)
        );
    }
    // Still serving, an uncached range too (spliced on a worker, under
    // the daemon's seccomp filter).
    let mut c = unix(&s.sock);
    c.open(1, "f");
    evict(&s.export.join("f"));
    let d = c.read(1, 1, 12_345, 100_000);
    expect_range(&d, 12_345, 100_000, FILE_LEN);
    drop(c);
    s.d.assert_alive_then_stop("hang-ups mid-splice");
}

#[test]
fn test_file_truncated_under_spliced_replies_keeps_the_framing() {
    let s = daemon();
    std::fs::read(s.export.join("f")).unwrap();
    let mut c = unix(&s.sock);
    c.open(1, "f");
    stall(&mut c, 12);
    assert!(eventually(|| pipes(s.pid) > 0));
    // Truncate the file under the replies waiting in pipes (and the reads
    // not started yet).
    std::fs::OpenOptions::new()
        .write(true)
        .open(s.export.join("f"))
        .unwrap()
        .set_len(300_000)
        .unwrap();
    let mut tags = Vec::new();
    for _ in 0..12 {
        match c.recv() {
            (t, Rmessage::Read(d)) => {
                // Either the data the pipe took, zeros for pages the
                // truncation dropped, or a read cut at the new end.
                let off = u64::from(t - 1) * 200_000;
                for (i, &b) in d.iter().enumerate() {
                    let want = byte_at(off + i as u64);
                    assert!(b == want || b == 0, "tag {t} byte {i}");
                }
                tags.push(t);
            }
            r => panic!("{r:?}"),
        }
    }
    tags.sort_unstable();
    assert_eq!(tags, (1..=12).collect::<Vec<_>>());
    // Still framed: the next request is answered, and reads see the new
    // size.
    c.getattr_ok(100);
    let d = c.read(101, 1, 250_000, 100_000);
    expect_range(&d, 250_000, 50_000, 300_000);
    drop(c);
    s.d.assert_alive_then_stop("truncation under spliced replies");
}
