// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The socket transport: concurrent clients with their own sessions,
//! clients that hang up mid-message or send garbage, and the binary.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use common::*;
use virtio_9p_server::client::{Client, StreamTransport};
use virtio_9p_server::protocol::{Header, MsgType, OpenFlags as of, Rmessage};
use virtio_9p_server::transport::socket::{ListenAddr, Listener};
use virtio_9p_server::{Config, PassthroughConfig};

/// Starts an in-process socket server on a unix socket in `dir`.
fn start(dir: &Path, sock: &Path) {
    let server = server_with(PassthroughConfig::new(dir), Config::default());
    let listener = Listener::bind(&ListenAddr::Unix(sock.to_path_buf())).unwrap();
    // The accept loop runs until the test process exits.
    std::thread::spawn(move || listener.serve(server));
}

fn connect(sock: &Path) -> Client<StreamTransport<UnixStream>> {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    Client::new(StreamTransport(s))
}

fn session(sock: &Path) -> Client<StreamTransport<UnixStream>> {
    let mut c = connect(sock);
    c.version(MSIZE).unwrap();
    c.attach(ROOT, 0).unwrap();
    c
}

#[test]
fn test_socket_concurrent_clients_have_own_sessions() {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    std::fs::create_dir(&export).unwrap();
    let sock = tmp.path().join("9p.sock");
    start(&export, &sock);
    let workers: Vec<_> = (0..8)
        .map(|i| {
            let sock = sock.clone();
            std::thread::spawn(move || {
                let mut c = session(&sock);
                // Every session uses the same fid numbers without clashing.
                let name = format!("file-{i}");
                c.walk(ROOT, 1, &[]).unwrap();
                c.lcreate(1, name.as_bytes(), of::RDWR, 0o600, 0).unwrap();
                let data: Vec<u8> = (0..100_000u32).map(|b| (b as u8) ^ i as u8).collect();
                let mut off = 0;
                while off < data.len() {
                    let end = (off + 60_000).min(data.len());
                    assert_eq!(
                        c.write(1, off as u64, &data[off..end]).unwrap() as usize,
                        end - off
                    );
                    off = end;
                }
                let mut back = Vec::new();
                while back.len() < data.len() {
                    back.extend(c.read(1, back.len() as u64, 65536).unwrap());
                }
                assert_eq!(back, data);
                c.clunk(1).unwrap();
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(std::fs::read_dir(&export).unwrap().count(), 8);
}

#[test]
fn test_socket_survives_hangup_mid_message() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("9p.sock");
    start(tmp.path(), &sock);
    for cut in [1usize, 3, 5, 9] {
        let mut s = UnixStream::connect(&sock).unwrap();
        let frame =
            virtio_9p_server::protocol::Tmessage::Version(virtio_9p_server::protocol::Tversion {
                msize: MSIZE,
                version: b"9P2000.L".to_vec(),
            })
            .encode_frame(0xffff);
        s.write_all(&frame[..cut]).unwrap();
        drop(s);
    }
    // A client that hangs up after a request, before reading the reply.
    {
        let mut c = session(&sock);
        c.walk(ROOT, 1, &[]).unwrap();
        let frame = virtio_9p_server::protocol::Tmessage::Read(virtio_9p_server::protocol::Tread {
            fid: 1,
            offset: 0,
            count: 100,
        })
        .encode_frame(3);
        c.transport().0.write_all(&frame).unwrap();
    }
    let mut c = session(&sock);
    c.statfs(ROOT).unwrap();
}

#[test]
fn test_socket_garbage_closes_only_that_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("9p.sock");
    start(tmp.path(), &sock);
    // Frame sizes the stream cannot recover from: the server hangs up.
    for garbage in [
        &[0xffu8; 64][..],
        &[2, 0, 0, 0, 1, 2, 3][..],
        &[0, 0, 0, 0][..],
    ] {
        let mut s = UnixStream::connect(&sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(garbage).unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(s.read(&mut buf).unwrap_or(0), 0, "server should close");
    }
    // Well-framed nonsense gets Rlerror and the connection goes on.
    let mut c = connect(&sock);
    let mut frame = Header {
        size: 11,
        ty: 200,
        tag: 5,
    }
    .to_bytes()
    .to_vec();
    frame.extend_from_slice(&[1, 2, 3, 4]);
    // Before Tversion: EPROTO.
    assert_eq!(
        c.raw(&frame).unwrap(),
        (5, Rmessage::Lerror(libc::EPROTO as u32))
    );
    c.version(MSIZE).unwrap();
    assert_eq!(
        c.raw(&frame).unwrap(),
        (5, Rmessage::Lerror(libc::EOPNOTSUPP as u32))
    );
    let mut bad_walk = Header {
        size: 7 + 10,
        ty: 110,
        tag: 6,
    }
    .to_bytes()
    .to_vec();
    bad_walk.extend_from_slice(&[0, 0, 0, 0, 1, 0, 0, 0, 0xff, 0xff]);
    let (tag, r) = c.raw(&bad_walk).unwrap();
    assert_eq!((tag, r), (6, Rmessage::Lerror(libc::EPROTO as u32)));
    c.attach(ROOT, 0).unwrap();
    c.statfs(ROOT).unwrap();
    // A frame over the msize ends the connection.
    let mut s = UnixStream::connect(&sock).unwrap();
    let mut big = Header {
        size: 4097,
        ty: 100,
        tag: 0xffff,
    }
    .to_bytes()
    .to_vec();
    big.resize(4097, 0);
    s.write_all(&big).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(s.read(&mut buf).unwrap_or(0), 0);
    // Others are unaffected.
    let mut c = session(&sock);
    c.statfs(ROOT).unwrap();
    let _ = MsgType::Rlerror;
}

#[test]
fn test_socket_tcp_listener() {
    let tmp = tempfile::tempdir().unwrap();
    let server = server_with(PassthroughConfig::new(tmp.path()), Config::default());
    let listener = Listener::bind(&"tcp:127.0.0.1:0".parse().unwrap()).unwrap();
    let ListenAddr::Tcp(addr) = listener.local_addr().unwrap() else {
        panic!("not tcp")
    };
    std::thread::spawn(move || listener.serve(server));
    let s = std::net::TcpStream::connect(&addr).unwrap();
    let mut c = Client::new(StreamTransport(s));
    c.version(MSIZE).unwrap();
    c.attach(ROOT, 0).unwrap();
    c.statfs(ROOT).unwrap();
}

#[test]
fn test_socket_bind_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let e = Listener::bind(&ListenAddr::Unix(tmp.path().join("no/such/dir/s"))).unwrap_err();
    assert!(e.to_string().starts_with("cannot listen on unix:"), "{e}");
    // A stale socket file nobody listens on is replaced.
    let stale = tmp.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    Listener::bind(&ListenAddr::Unix(stale)).unwrap();
}

struct Child(std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn test_binary_serves_unix_socket() {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("hello"), b"hello from the binary").unwrap();
    let sock = tmp.path().join("bin.sock");
    let _child = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_virtio-9p-server"))
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .arg("--shared-dir")
            .arg(&export)
            .arg("--readonly")
            .arg("--log-level")
            .arg("warn")
            .spawn()
            .unwrap(),
    );
    let start = std::time::Instant::now();
    while UnixStream::connect(&sock).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "binary did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut c = session(&sock);
    c.walk(ROOT, 1, &[b"hello"]).unwrap();
    c.lopen(1, of::RDONLY).unwrap();
    assert_eq!(c.read(1, 0, 100).unwrap(), b"hello from the binary");
    c.walk(ROOT, 2, &[]).unwrap();
    assert_eq!(
        errno(c.lcreate(2, b"x", of::RDWR, 0o600, 0).unwrap_err()),
        libc::EROFS
    );
}

#[test]
fn test_binary_startup_error_is_one_line() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_virtio-9p-server"))
        .args([
            "--listen",
            "unix:/tmp/never.sock",
            "--shared-dir",
            "/nonexistent/export",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot open shared directory /nonexistent/export"),
        "{err}"
    );
}
