// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The socket transport on the request engine: requests of one
//! connection in flight at once, replies out of order by tag, Tflush, a
//! duplicate tag, the in-flight limit, a hang-up with requests in flight,
//! and a client that sends faster than it reads.
//!
//! The slow requests are blocking Tlocks: one fid holds a write lock
//! (passthrough locks are OFD locks, so two opens conflict even in one
//! process) and other fids ask for the same range with `FLAGS_BLOCK`, on
//! a server whose `lock_wait` is unbounded, so they wait until the lock is
//! released or they are flushed.

mod common;
mod sandbox_support;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use virtio_9p_server::client::{Client, StreamTransport};
use virtio_9p_server::protocol::{
    GetattrMask, LockFlags, LockStatus, LockType, OpenFlags as of, Rmessage, Tflush, Tgetattr,
    Tlock, Tmessage, Tread,
};
use virtio_9p_server::transport::socket::{ListenAddr, Listener, SocketLimits};
use virtio_9p_server::{Config, PassthroughConfig};

type Sock = Client<StreamTransport<UnixStream>>;

/// The lock holder's fid, and the first of the waiters' fids.
const HOLDER: u32 = 1;
const WAITER: u32 = 10;

/// An in-process socket server on `dir`/9p.sock with `limits`, whose
/// blocking locks wait without a bound.
fn start(dir: &Path, limits: SocketLimits) -> PathBuf {
    let export = dir.join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("f"), vec![5u8; 1 << 20]).unwrap();
    let sock = dir.join("9p.sock");
    let mut config = Config::default();
    config.lock_wait = None;
    let server = server_with(PassthroughConfig::new(&export), config);
    let listener = Listener::bind(&ListenAddr::Unix(sock.clone())).unwrap();
    // The accept loop runs until the test process exits.
    std::thread::spawn(move || listener.serve_with(server, limits));
    sock
}

fn session(sock: &Path) -> Sock {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut c = Client::new(StreamTransport(s));
    c.version(MSIZE).unwrap();
    c.attach(ROOT, 0).unwrap();
    c
}

/// Walks `fid` to "f" and opens it read-write.
fn open(c: &mut Sock, fid: u32) {
    c.walk(ROOT, fid, &[b"f"]).unwrap();
    c.lopen(fid, of::RDWR).unwrap();
}

fn tlock(fid: u32, ty: LockType, flags: LockFlags) -> Tmessage {
    Tmessage::Lock(Tlock {
        fid,
        ty,
        flags,
        start: 0,
        length: 0,
        proc_id: fid,
        client_id: b"test".to_vec(),
    })
}

fn tgetattr(fid: u32) -> Tmessage {
    Tmessage::Getattr(Tgetattr {
        fid,
        request_mask: GetattrMask::BASIC,
    })
}

fn send(c: &mut Sock, tag: u16, msg: &Tmessage) {
    c.transport().0.write_all(&msg.encode_frame(tag)).unwrap();
}

/// Reads one reply frame.
fn recv(c: &mut Sock) -> (u16, Rmessage) {
    let frame = c.transport().read_frame().unwrap();
    Rmessage::decode_frame(&frame, MSIZE).unwrap()
}

/// Whether a reply arrives within `d` (a reply that does arrive is
/// returned).
fn recv_within(c: &mut Sock, d: Duration) -> Option<(u16, Rmessage)> {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: c.transport().0.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let r = unsafe { libc::poll(&mut p, 1, d.as_millis() as i32) };
    (r > 0).then(|| recv(c))
}

/// The next `n` replies, sorted by tag.
fn recv_sorted(c: &mut Sock, n: usize) -> Vec<(u16, Rmessage)> {
    let mut replies: Vec<_> = (0..n).map(|_| recv(c)).collect();
    replies.sort_by_key(|(t, _)| *t);
    replies
}

/// Sends the holder's unlock with `unlock_tag` and checks that both it and
/// the waiting Tlock `waiter_tag` answer with the lock granted.
fn release_and_expect_granted(c: &mut Sock, unlock_tag: u16, waiter_tag: u16) {
    send(
        c,
        unlock_tag,
        &tlock(HOLDER, LockType::Unlck, LockFlags::empty()),
    );
    let mut want = vec![
        (waiter_tag, Rmessage::Lock(LockStatus::Success)),
        (unlock_tag, Rmessage::Lock(LockStatus::Success)),
    ];
    want.sort_by_key(|(t, _)| *t);
    assert_eq!(recv_sorted(c, 2), want);
}

/// A connection with `HOLDER` holding a write lock on "f" and `waiters`
/// fids opened on it.
fn locked_session(sock: &Path, waiters: u32) -> Sock {
    let mut c = session(sock);
    open(&mut c, HOLDER);
    assert_eq!(
        c.lock(HOLDER, LockType::Wrlck, LockFlags::empty(), 0, 0)
            .unwrap(),
        LockStatus::Success
    );
    for i in 0..waiters {
        open(&mut c, WAITER + i);
    }
    c
}

#[test]
fn test_socket_replies_out_of_order_by_tag() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = start(tmp.path(), SocketLimits::default());
    let mut c = locked_session(&sock, 1);
    // Tag 1 waits for the lock; tag 2 and tag 3 overtake it.
    send(&mut c, 1, &tlock(WAITER, LockType::Wrlck, LockFlags::BLOCK));
    send(&mut c, 2, &tgetattr(ROOT));
    let (tag, r) = recv(&mut c);
    assert_eq!(tag, 2);
    assert!(matches!(r, Rmessage::Getattr(_)), "{r:?}");
    // The unlock answers, and then the waiter gets the lock.
    release_and_expect_granted(&mut c, 3, 1);
}

#[test]
fn test_socket_tflush_of_a_blocked_tlock_stops_its_wait() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = start(tmp.path(), SocketLimits::default());
    let mut c = locked_session(&sock, 1);
    send(&mut c, 7, &tlock(WAITER, LockType::Wrlck, LockFlags::BLOCK));
    // The lock waits without a bound: only the flush ends it.
    assert_eq!(recv_within(&mut c, Duration::from_millis(200)), None);
    send(&mut c, 8, &Tmessage::Flush(Tflush { oldtag: 7 }));
    // Cancelled before it answered: Rflush instead of its reply.
    assert_eq!(recv(&mut c), (8, Rmessage::Flush));
    send(&mut c, 9, &tgetattr(ROOT));
    let (tag, r) = recv(&mut c);
    assert_eq!(tag, 9, "no reply of the flushed Tlock: {r:?}");
    // The flushed Tlock holds nothing: the holder still has the lock,
    // and once it lets go another waiter gets it at once.
    c.lock(HOLDER, LockType::Unlck, LockFlags::empty(), 0, 0)
        .unwrap();
    assert_eq!(
        c.lock(WAITER, LockType::Wrlck, LockFlags::BLOCK, 0, 0)
            .unwrap(),
        LockStatus::Success
    );
}

#[test]
fn test_socket_tflush_of_a_finished_or_unknown_request() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = start(tmp.path(), SocketLimits::default());
    let mut c = session(&sock);
    // Finished: the reply is out, the flush finds nothing.
    send(&mut c, 1, &tgetattr(ROOT));
    assert!(matches!(recv(&mut c), (1, Rmessage::Getattr(_))));
    send(&mut c, 2, &Tmessage::Flush(Tflush { oldtag: 1 }));
    assert_eq!(recv(&mut c), (2, Rmessage::Flush));
    // Unknown tag: Rflush at once.
    send(&mut c, 3, &Tmessage::Flush(Tflush { oldtag: 999 }));
    assert_eq!(recv(&mut c), (3, Rmessage::Flush));
    // In the same write as the request: the reply, if the request
    // answered before the flush reached it, comes before the Rflush.
    for round in 0..50u16 {
        let tag = 100 + 2 * round;
        let mut frames = tgetattr(ROOT).encode_frame(tag);
        frames.extend(Tmessage::Flush(Tflush { oldtag: tag }).encode_frame(tag + 1));
        c.transport().0.write_all(&frames).unwrap();
        let first = recv(&mut c);
        if first.0 == tag {
            assert!(matches!(first.1, Rmessage::Getattr(_)), "{first:?}");
            assert_eq!(recv(&mut c), (tag + 1, Rmessage::Flush));
        } else {
            assert_eq!(first, (tag + 1, Rmessage::Flush));
        }
    }
    // The connection is in order afterwards.
    send(&mut c, 5, &tgetattr(ROOT));
    assert!(matches!(recv(&mut c), (5, Rmessage::Getattr(_))));
}

#[test]
fn test_socket_duplicate_tag_is_refused_without_disturbing_the_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = start(tmp.path(), SocketLimits::default());
    let mut c = locked_session(&sock, 1);
    send(&mut c, 4, &tlock(WAITER, LockType::Wrlck, LockFlags::BLOCK));
    send(&mut c, 4, &tgetattr(ROOT));
    assert_eq!(recv(&mut c), (4, Rmessage::Lerror(libc::EBUSY as u32)));
    // The holder of tag 4 still waits, and gets the lock when it frees.
    release_and_expect_granted(&mut c, 5, 4);
}

#[test]
fn test_socket_in_flight_limit_is_reached_then_drained() {
    let tmp = tempfile::tempdir().unwrap();
    let mut limits = SocketLimits::default();
    limits.max_in_flight = 4;
    let sock = start(tmp.path(), limits);
    // Another connection holds the lock, so this one can fill its limit.
    let mut holder = locked_session(&sock, 0);
    let mut c = session(&sock);
    for i in 0..4 {
        open(&mut c, WAITER + i);
    }
    for i in 0..4u16 {
        send(
            &mut c,
            10 + i,
            &tlock(WAITER + u32::from(i), LockType::Rdlck, LockFlags::BLOCK),
        );
    }
    // The fifth request stays in the socket: not read, not answered.
    send(&mut c, 20, &tgetattr(ROOT));
    assert_eq!(recv_within(&mut c, Duration::from_millis(300)), None);
    // Free the lock: the four readers get it, then tag 20 is read.
    holder
        .lock(HOLDER, LockType::Unlck, LockFlags::empty(), 0, 0)
        .unwrap();
    let mut tags: Vec<u16> = (0..5)
        .map(|_| {
            let (tag, r) = recv(&mut c);
            match tag {
                20 => assert!(matches!(r, Rmessage::Getattr(_)), "{r:?}"),
                _ => assert_eq!(r, Rmessage::Lock(LockStatus::Success)),
            }
            tag
        })
        .collect();
    // Tag 20 is read only once a slot frees, so after a lock's reply.
    assert_ne!(tags[0], 20, "tag 20 waited for a free slot: {tags:?}");
    tags.sort_unstable();
    assert_eq!(tags, vec![10, 11, 12, 13, 20]);
}

#[test]
fn test_socket_client_that_does_not_read_replies_is_not_buffered() {
    let tmp = tempfile::tempdir().unwrap();
    let mut limits = SocketLimits::default();
    limits.max_in_flight = 8;
    let sock = start(tmp.path(), limits);
    let mut c = session(&sock);
    open(&mut c, 2);
    // 64 KiB Treads, never reading a reply, until the socket is full.
    let frame = Tmessage::Read(Tread {
        fid: 2,
        offset: 0,
        count: 64 << 10,
    })
    .encode_frame(1);
    let s = &c.transport().0;
    s.set_nonblocking(true).unwrap();
    let mut sent = 0usize;
    let mut stalled_since: Option<Instant> = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tag = 1u16;
    let mut pending: Vec<u8> = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "the server kept reading");
        if pending.is_empty() {
            pending = frame.clone();
            pending[5..7].copy_from_slice(&tag.to_le_bytes());
            tag += 1;
        }
        match (&*s).write(&pending) {
            Ok(n) => {
                pending.drain(..n);
                sent += n;
                stalled_since = None;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Stalled for a while: the server stopped reading.
                let t = *stalled_since.get_or_insert_with(Instant::now);
                if t.elapsed() > Duration::from_millis(500) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("write: {e}"),
        }
    }
    let frames = sent / frame.len();
    eprintln!("{frames} Treads sent before the server stopped reading");
    // The in-flight limit plus what the socket buffers hold, not all the
    // client could send.
    assert!(frames < 10_000, "{frames} frames accepted");
    // Now read: every whole request is answered, in full.
    s.set_nonblocking(false).unwrap();
    if !pending.is_empty() && pending.len() < frame.len() {
        // Finish the frame that was cut.
        c.transport().0.write_all(&pending).unwrap();
    }
    let whole = sent.div_ceil(frame.len());
    for _ in 0..whole {
        let (_, r) = recv(&mut c);
        match r {
            Rmessage::Read(d) => assert_eq!(d.len(), 64 << 10),
            r => panic!("{r:?}"),
        }
    }
    send(&mut c, 1, &tgetattr(ROOT));
    assert!(matches!(recv(&mut c), (1, Rmessage::Getattr(_))));
}

/// The fds open in process `pid`.
fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn test_socket_hangup_with_requests_in_flight_frees_fids_and_fds() {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("f"), vec![5u8; 1 << 20]).unwrap();
    let sock = tmp.path().join("9p.sock");
    // The daemon, sandboxed (none) under --seccomp kill: its own fds only.
    let d = sandbox_support::socket_daemon(&export, &sock, tmp.path().join("log"), "none", &[])
        .expect("sandbox none always starts");
    let pid = d.server_pid("none");
    // A connection that came and went: the socket threads and pools exist.
    drop(session(&sock));
    let settle = |want: usize| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let n = fd_count(pid);
            if n <= want || Instant::now() > deadline {
                return n;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    std::thread::sleep(Duration::from_millis(200));
    let baseline = fd_count(pid);
    for round in 0..3 {
        let mut c = locked_session(&sock, 8);
        // More open fids, and requests in flight: 8 blocked locks and
        // reads.
        for i in 0..32 {
            open(&mut c, 100 + i);
        }
        for i in 0..8u16 {
            send(
                &mut c,
                10 + i,
                &tlock(WAITER + u32::from(i), LockType::Wrlck, LockFlags::BLOCK),
            );
        }
        for i in 0..8u16 {
            send(
                &mut c,
                30 + i,
                &Tmessage::Read(Tread {
                    fid: 100 + u32::from(i),
                    offset: 0,
                    count: 128 << 10,
                }),
            );
        }
        let busy = fd_count(pid);
        assert!(busy >= baseline + 41, "{busy} fds, baseline {baseline}");
        // Hang up with everything in flight.
        drop(c);
        let after = settle(baseline);
        assert_eq!(after, baseline, "round {round}: fds leaked");
    }
    // Still serving.
    let mut c = session(&sock);
    c.getattr(ROOT).unwrap();
    drop(c);
    d.assert_alive_then_stop("hang-ups with requests in flight");
}

#[test]
fn test_serve_connection_serves_one_client_and_reports_a_broken_frame() {
    use virtio_9p_server::transport::socket::serve_connection;
    let tmp = tempfile::tempdir().unwrap();
    let server = server_with(PassthroughConfig::new(tmp.path()), Config::default());
    // A client that works, then hangs up: Ok.
    let (ours, theirs) = UnixStream::pair().unwrap();
    let s = server.clone();
    let t = std::thread::spawn(move || serve_connection(&s, ours));
    let mut c = Client::new(StreamTransport(theirs));
    c.version(MSIZE).unwrap();
    c.attach(ROOT, 0).unwrap();
    send(&mut c, 1, &tgetattr(ROOT));
    assert!(matches!(recv(&mut c), (1, Rmessage::Getattr(_))));
    drop(c);
    t.join().unwrap().unwrap();
    // A frame shorter than its header: the connection ends with an error.
    let (ours, mut theirs) = UnixStream::pair().unwrap();
    let t = std::thread::spawn(move || serve_connection(&server, ours));
    theirs.write_all(&[3, 0, 0, 0, 100, 0, 0]).unwrap();
    let e = t.join().unwrap().unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
}
