// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Memory is bounded: names are limited at decode, fids
//! and xattr bytes per session and in total, socket buffers within a
//! shared budget and freed when idle, a kick's work within a budget, and
//! one msize snapshot per request. The hostile-client acceptance test runs
//! the real binary over `--listen unix:` and checks its RSS against the
//! formula of `docs/virtio-9p-design.md` ("Memory bound").

mod common;
mod sandbox_support;
mod vhost_user_support;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use virtio_9p_server::client::{Client, InProcess, StreamTransport, Transport};
use virtio_9p_server::io::{SliceReader, SliceWriter};
use virtio_9p_server::protocol::*;
use virtio_9p_server::transport::socket::{ListenAddr, Listener, SocketLimits};
use virtio_9p_server::vhost_user::mock::{Layout, VmmOptions};
use virtio_9p_server::virtio::{KICK_BUDGET, MAX_IN_FLIGHT_SEGMENTS};
use virtio_9p_server::{Cancel, Config, Inline, PassthroughConfig, Session};

fn config(f: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config::default();
    f(&mut c);
    c
}

fn in_process(
    server: &Arc<virtio_9p_server::Server<virtio_9p_server::PassthroughFs>>,
) -> TestClient {
    let mut c = Client::new(InProcess::new(Arc::clone(server), MSIZE as usize));
    c.version(MSIZE).unwrap();
    c.attach(ROOT, 0).unwrap();
    c
}

fn rpc_errno(c: &mut TestClient, msg: Tmessage) -> i32 {
    errno(c.rpc(&msg).unwrap_err())
}

#[test]
fn test_long_names_refused_at_decode() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = client(tmp.path());
    // 16 names of 60,000 bytes would have been held while waiting for a
    // worker; the first one over 255 bytes refuses the walk at decode.
    let big = vec![b'a'; 15_000];
    let walk = Tmessage::Walk(Twalk {
        fid: ROOT,
        newfid: 1,
        wnames: vec![big.clone(); 16],
    });
    assert_eq!(rpc_errno(&mut c, walk), libc::ENAMETOOLONG);
    let n256 = vec![b'n'; 256];
    let lcreate = Tmessage::Lcreate(Tlcreate {
        fid: ROOT,
        name: n256.clone(),
        flags: OpenFlags::RDWR,
        mode: 0o600,
        gid: 0,
    });
    assert_eq!(rpc_errno(&mut c, lcreate), libc::ENAMETOOLONG);
    let xwalk = Tmessage::Xattrwalk(Txattrwalk {
        fid: ROOT,
        newfid: 2,
        name: n256.clone(),
    });
    assert_eq!(rpc_errno(&mut c, xwalk), libc::ERANGE);
    let symlink = Tmessage::Symlink(Tsymlink {
        fid: ROOT,
        name: b"l".to_vec(),
        symtgt: vec![b't'; 4097],
        gid: 0,
    });
    assert_eq!(rpc_errno(&mut c, symlink), libc::ENAMETOOLONG);
    assert_eq!(c.fid_count_hint(), 1);
    // 255 bytes is fine, and the session goes on.
    c.walk(ROOT, 1, &[]).unwrap();
    c.lcreate(1, &[b'n'; 255], OpenFlags::RDWR, 0o600, 0)
        .unwrap();
    c.getattr(ROOT).unwrap();
}

/// A trait to read the session's fid count from a test client.
trait FidCount {
    fn fid_count_hint(&mut self) -> usize;
}

impl FidCount for TestClient {
    fn fid_count_hint(&mut self) -> usize {
        self.transport().session().fid_count()
    }
}

/// A file `x` in `dir` with a `user.big` xattr of `len` bytes of 7.
fn big_xattr_file(dir: &Path, len: usize) {
    let p = dir.join("x");
    std::fs::write(&p, b"data").unwrap();
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    let v = vec![7u8; len];
    // SAFETY: valid NUL-terminated path and name, value buffer of v.len().
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"user.big".as_ptr(),
            v.as_ptr().cast(),
            v.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setxattr: {}", std::io::Error::last_os_error());
}

#[test]
fn test_xattr_fids_bounded_per_session_and_in_total() {
    // tmpfs takes 60,000-byte user xattrs (ext4 does not).
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    big_xattr_file(tmp.path(), 60_000);
    let server = server_with(
        PassthroughConfig::new(tmp.path()),
        config(|c| {
            c.max_xattr_bytes = 256 << 10;
            c.max_total_xattr_bytes = 384 << 10;
        }),
    );
    let mut a = in_process(&server);
    a.walk(ROOT, 1, &[b"x"]).unwrap();
    // Each walk reserves 64 KiB while reading, then keeps 60,000 bytes.
    let mut held = Vec::new();
    let mut fid = 100;
    let e = loop {
        match a.xattrwalk(1, fid, b"user.big") {
            Ok(n) => {
                assert_eq!(n, 60_000);
                held.push(fid);
                fid += 1;
            }
            Err(e) => break e,
        }
        assert!(held.len() <= 8, "no per-session limit");
    };
    assert_eq!(errno(e), libc::ENOMEM);
    assert_eq!(held.len(), 4);
    assert_eq!(a.transport().session().xattr_bytes(), 4 * 60_000);
    // A Txattrcreate buffer is charged as well.
    a.walk(ROOT, 50, &[b"x"]).unwrap();
    assert_eq!(
        errno(a.xattrcreate(50, b"user.new", 65_536, 0).unwrap_err()),
        libc::ENOMEM
    );
    // Another session reaches the total limit sooner.
    let mut b = in_process(&server);
    b.walk(ROOT, 1, &[b"x"]).unwrap();
    b.xattrwalk(1, 100, b"user.big").unwrap();
    b.xattrwalk(1, 101, b"user.big").unwrap();
    assert_eq!(
        errno(b.xattrwalk(1, 102, b"user.big").unwrap_err()),
        libc::ENOMEM
    );
    assert_eq!(server.total_xattr_bytes(), 6 * 60_000);
    // The value is still served, and clunks give the bytes back.
    assert_eq!(a.read(100, 59_990, 100).unwrap(), vec![7u8; 10]);
    for f in held {
        a.clunk(f).unwrap();
    }
    assert_eq!(a.transport().session().xattr_bytes(), 0);
    assert_eq!(b.get_xattr(1, 102, b"user.big").unwrap().len(), 60_000);
    // Tversion and a closed session give back the rest.
    b.version(MSIZE).unwrap();
    assert_eq!(server.total_xattr_bytes(), 0);
    drop(b);
    assert_eq!(server.total_xattr_bytes(), 0);
}

#[test]
fn test_fids_bounded_per_session_and_in_total() {
    let tmp = tempfile::tempdir().unwrap();
    let server = server_with(
        PassthroughConfig::new(tmp.path()),
        config(|c| {
            c.max_fids = 100;
            c.max_total_fids = 150;
        }),
    );
    // Zero-name clone walks cost no fd, so only the fid limits stop them.
    let mut a = in_process(&server);
    assert_eq!(clone_walks_until_refused(&mut a, 1), (100, libc::EMFILE));
    assert_eq!(a.fid_count_hint(), 100);
    let mut b = in_process(&server);
    let (m, e) = clone_walks_until_refused(&mut b, 1);
    assert_eq!(e, libc::ENFILE);
    assert_eq!(server.total_fids(), 150);
    assert_eq!(b.fid_count_hint(), 50);
    // A walk onto itself and Tgetattr still work at the limit.
    b.walk(1, 1, &[]).unwrap();
    b.getattr(ROOT).unwrap();
    for f in 1..=10 {
        a.clunk(f).unwrap();
    }
    for f in m..m + 10 {
        b.walk(ROOT, f, &[]).unwrap();
    }
    drop(a);
    assert_eq!(server.total_fids(), 60);
    b.version(MSIZE).unwrap();
    assert_eq!(server.total_fids(), 0);
}

/// Zero-name clone walks of the root into fids `first..` until one is
/// refused; returns the refused fid and the errno.
fn clone_walks_until_refused<T: Transport>(c: &mut Client<T>, first: u32) -> (u32, i32) {
    let mut n = first;
    loop {
        match c.walk(ROOT, n, &[]) {
            Ok(_) => n += 1,
            Err(e) => return (n, errno(e)),
        }
        assert!(n - first < 200_000, "clone walks not bounded");
    }
}

/// Tattach of fid ROOT as uid 0.
fn attach_root() -> Tmessage {
    Tmessage::Attach(Tattach {
        fid: ROOT,
        afid: NOFID,
        uname: Vec::new(),
        aname: Vec::new(),
        n_uname: 0,
    })
}

/// Runs one request on `session` and returns the decoded reply.
fn handle(
    server: &virtio_9p_server::Server<virtio_9p_server::PassthroughFs>,
    session: &Session<virtio_9p_server::PassthroughFs>,
    tag: u16,
    msg: Tmessage,
    reply: &mut [u8],
) -> Rmessage {
    let frame = msg.encode_frame(tag);
    let out = server
        .handle(
            session,
            &mut SliceReader::new(&frame),
            &mut SliceWriter::new(reply),
            &Inline,
            &Cancel::new(),
        )
        .unwrap();
    Rmessage::decode_frame(&reply[..out.size as usize], MAX_MSIZE)
        .unwrap()
        .1
}

#[test]
fn test_concurrent_bad_tversion_never_breaks_a_request() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), vec![1u8; 100_000]).unwrap();
    let server = server_with(PassthroughConfig::new(tmp.path()), Config::default());
    let session = Arc::new(Session::new());
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (server, session, stop) = (server.clone(), session.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reply = vec![0u8; 1 << 20];
            let mut reads = 0u32;
            while !stop.load(Ordering::Acquire) {
                let read = Tmessage::Read(Tread {
                    fid: 1,
                    offset: 0,
                    count: 1 << 20,
                });
                match handle(&server, &session, 1, read, &mut reply) {
                    Rmessage::Read(d) => {
                        // Never more than the msize that was in force.
                        assert!(d.len() <= 8192 - 11, "{} bytes", d.len());
                        reads += 1;
                    }
                    Rmessage::Lerror(_) => {}
                    other => panic!("unexpected {other:?}"),
                }
                let readdir = Tmessage::Readdir(Treaddir {
                    fid: 1,
                    offset: 0,
                    count: 1 << 20,
                });
                let r = handle(&server, &session, 2, readdir, &mut reply);
                assert!(matches!(r, Rmessage::Lerror(_) | Rmessage::Readdir(_)));
            }
            reads
        })
    };
    let mut reply = vec![0u8; 4096];
    for i in 0..20_000u32 {
        // A bad Tversion (msize below the minimum) resets the session to
        // msize 0; a good one sets 8192 again. Every 8th round reopens
        // fid 1 for the reads.
        let bad = Tmessage::Version(Tversion {
            msize: 100,
            version: VERSION_9P2000_L.to_vec(),
        });
        handle(&server, &session, NOTAG, bad, &mut reply);
        let good = Tmessage::Version(Tversion {
            msize: 8192,
            version: VERSION_9P2000_L.to_vec(),
        });
        handle(&server, &session, NOTAG, good, &mut reply);
        if i % 8 != 0 {
            continue;
        }
        handle(&server, &session, 3, attach_root(), &mut reply);
        let name: &[u8] = if i % 16 == 0 { b"f" } else { b"." };
        let walk = Tmessage::Walk(Twalk {
            fid: ROOT,
            newfid: 1,
            wnames: vec![name.to_vec()],
        });
        handle(&server, &session, 4, walk, &mut reply);
        let lopen = Tmessage::Lopen(Tlopen {
            fid: 1,
            flags: OpenFlags::RDONLY,
        });
        handle(&server, &session, 5, lopen, &mut reply);
    }
    stop.store(true, Ordering::Release);
    let reads = reader.join().expect("a request panicked");
    eprintln!("{reads} Rread replies while Tversions raced");
}

fn socket_client(sock: &Path, msize: u32) -> Client<StreamTransport<UnixStream>> {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut c = Client::new(StreamTransport(s));
    assert_eq!(c.version(msize).unwrap(), msize);
    c.attach(ROOT, 0).unwrap();
    c
}

#[test]
fn test_socket_buffers_within_the_shared_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("f"), vec![3u8; 4 << 20]).unwrap();
    let sock = tmp.path().join("9p.sock");
    let server = server_with(PassthroughConfig::new(&export), Config::default());
    let listener = Listener::bind(&ListenAddr::Unix(sock.clone())).unwrap();
    let mut limits = SocketLimits::default();
    limits.buffer_bytes = 1 << 20;
    limits.max_connections = 2;
    std::thread::spawn(move || listener.serve_with(server, limits));
    let mut c = socket_client(&sock, 8 << 20);
    c.walk(ROOT, 1, &[b"f"]).unwrap();
    c.lopen(1, OpenFlags::RDWR).unwrap();
    // A 2 MiB Twrite is streamed to the file: no buffer, no budget.
    assert_eq!(c.write(1, 0, &vec![9u8; 2 << 20]).unwrap(), 2 << 20);
    assert_eq!(
        std::fs::read(export.join("f")).unwrap()[..2 << 20],
        vec![9u8; 2 << 20]
    );
    // Also when it fails before its data: the rest is skipped, not parsed.
    let bad = Tmessage::Write(Twrite {
        fid: 77,
        offset: 0,
        data: vec![b'x'; 1 << 20],
    });
    assert_eq!(errno(c.rpc(&bad).unwrap_err()), libc::EBADF);
    // Any other 2 MiB frame does not fit the 1 MiB budget: read, dropped,
    // ENOMEM.
    let mut big = Tmessage::Getattr(Tgetattr {
        fid: 1,
        request_mask: GetattrMask::BASIC,
    })
    .encode_frame(9);
    big.resize(2 << 20, 0);
    big[..4].copy_from_slice(&(2u32 << 20).to_le_bytes());
    assert_eq!(
        c.raw(&big).unwrap(),
        (9, Rmessage::Lerror(libc::ENOMEM as u32))
    );
    // A 2 MiB read is cut to what the budget leaves.
    let d = c.read(1, 0, 2 << 20).unwrap();
    assert!(!d.is_empty() && d.len() < 2 << 20, "{} bytes", d.len());
    assert!(d.iter().all(|b| *b == 9));
    c.getattr(1).unwrap();
    // A third connection is over max_connections and closed at accept.
    let _second = socket_client(&sock, 8192);
    let mut third = UnixStream::connect(&sock).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let v = Tmessage::Version(Tversion {
        msize: 8192,
        version: VERSION_9P2000_L.to_vec(),
    });
    let _ = third.write_all(&v.encode_frame(NOTAG));
    let mut buf = [0u8; 16];
    assert_eq!(std::io::Read::read(&mut third, &mut buf).unwrap_or(0), 0);
    // The first connection keeps working.
    c.getattr(ROOT).unwrap();
}

#[test]
fn test_kick_budget_leaves_nothing_on_the_ring() {
    use vhost_user_support::*;
    let d = TestDaemon::start(2);
    let mut vmm = d.connect({
        let mut o = VmmOptions::default();
        o.mem_size = 64 << 20;
        o
    });
    assert_eq!(version(&mut vmm, 65_536), 65_536);
    vmm.call(&frame(1, attach_root()), 64, Layout::Direct)
        .unwrap();
    // 12 chains of 32,769 descriptors: more than one kick's budget and
    // more segments than may be in flight at once.
    let chains = 12u32;
    assert!(chains * 32_769 > KICK_BUDGET);
    assert!(chains as usize * 32_769 > MAX_IN_FLIGHT_SEGMENTS);
    let mut subs = Vec::new();
    for tag in 0..chains {
        let getattr = Tmessage::Getattr(Tgetattr {
            fid: ROOT,
            request_mask: GetattrMask::BASIC,
        });
        let sub = vmm
            .submit(
                &frame(10 + tag as u16, getattr),
                32_768 * 16,
                Layout::Indirect { seg: 16 },
            )
            .unwrap();
        subs.push(sub);
    }
    vmm.kick().unwrap();
    let mut used = Vec::new();
    while used.len() < subs.len() {
        let got = vmm.wait_used(Duration::from_secs(30)).unwrap();
        assert!(!got.is_empty(), "only {} of {chains} answered", used.len());
        used.extend(got);
    }
    for s in &subs {
        let len = used.iter().find(|u| u.id == u32::from(s.head)).unwrap().len;
        let reply = vmm.read(s.reply_addr, len as usize).unwrap();
        assert!(matches!(decode(&reply).1, Rmessage::Getattr(_)));
    }
    drop(vmm);
    d.stop();
}

/// VmRSS or VmHWM of `pid`, in bytes.
fn status_bytes(pid: i32, key: &str) -> u64 {
    vhost_user_support::status_kib(&pid.to_string(), key) << 10
}

/// One hostile client: every allocation it can make, then it stays
/// connected and idle. Returns what it was refused, for the log.
fn hostile(sock: &Path, id: u32, payload: &[u8]) -> Vec<String> {
    let mut c = socket_client(sock, MAX_MSIZE);
    let mut seen = Vec::new();
    let note = |seen: &mut Vec<String>, what: &str, r: std::io::Result<()>| {
        if let Err(e) = r {
            seen.push(format!("{what}: errno {}", errno(e)));
        }
    };
    let name = format!("h{id}");
    c.walk(ROOT, 1, &[]).unwrap();
    c.lcreate(1, name.as_bytes(), OpenFlags::RDWR, 0o600, 0)
        .unwrap();
    // Xattr fids of 64 KiB until refused.
    c.walk(ROOT, 2, &[b"x"]).unwrap();
    let mut f = 10;
    loop {
        match c.xattrwalk(2, f, b"user.big") {
            Ok(_) => f += 1,
            Err(e) => {
                assert_eq!(errno(e), libc::ENOMEM, "xattr fids");
                break;
            }
        }
        assert!(f < 10_000, "xattr fids not bounded");
    }
    seen.push(format!("{} xattr fids", f - 10));
    // Clone walks until refused.
    let (n, e) = clone_walks_until_refused(&mut c, 20_000);
    assert!(e == libc::EMFILE || e == libc::ENFILE, "clone walks: {e}");
    seen.push(format!("{} clone walks", n - 20_000));
    // Free two fids for what follows.
    c.clunk(20_000).unwrap();
    c.clunk(20_001).unwrap();
    // A 128 MiB Twrite and a 128 MiB Tread (within the shared budget:
    // ENOMEM or a short read otherwise, never a dropped connection).
    note(&mut seen, "twrite", c.write(1, 0, payload).map(|_| ()));
    match c.read(1, 0, MAX_MSIZE - 11) {
        Ok(d) => seen.push(format!("tread of {} bytes", d.len())),
        Err(e) => note(&mut seen, "tread", Err(e)),
    }
    // Big Twalks: 16 names of 4,000 bytes.
    let walk = Tmessage::Walk(Twalk {
        fid: ROOT,
        newfid: 20_000,
        wnames: vec![vec![b'w'; 4000]; 16],
    });
    assert_eq!(errno(c.rpc(&walk).unwrap_err()), libc::ENAMETOOLONG);
    // Still served.
    c.getattr(1).unwrap();
    // Stay connected (and idle) until the test ends.
    std::mem::forget(c);
    seen
}

#[test]
fn test_hostile_socket_clients_stay_within_the_memory_bound() {
    use sandbox_support::socket_daemon;
    // tmpfs for 64 KiB xattrs.
    let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
    let export = tmp.path().join("export");
    std::fs::create_dir(&export).unwrap();
    // 65,536 bytes: the largest value.
    big_xattr_file(&export, 65_536);
    std::fs::write(export.join("good"), vec![1u8; 8192]).unwrap();
    let sock = tmp.path().join("9p.sock");
    let d = socket_daemon(&export, &sock, tmp.path().join("daemon.log"), "none", &[])
        .expect("sandbox none always starts");
    let pid = d.server_pid("none");
    let log = d.stderr();
    let max_open_fids: usize = log
        .split(" open fids per session")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("open-fid budget in the log");
    let cfg = config(|c| c.max_open_fids = max_open_fids);
    let limits = SocketLimits::default();

    // The well-behaved client works throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let good = {
        let (sock, stop) = (sock.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut c = socket_client(&sock, 65_536);
            c.walk(ROOT, 1, &[b"good"]).unwrap();
            c.lopen(1, OpenFlags::RDONLY).unwrap();
            let mut rounds = 0u32;
            while !stop.load(Ordering::Acquire) || rounds == 0 {
                assert_eq!(c.getattr(1).unwrap().size, 8192);
                assert_eq!(c.read(1, 0, 8192).unwrap(), vec![1u8; 8192]);
                rounds += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            rounds
        })
    };
    const HOSTILE: u32 = 6;
    let payload = Arc::new(vec![0xa5u8; MAX_MSIZE as usize - 24]);
    let hostile: Vec<_> = (0..HOSTILE)
        .map(|id| {
            let (sock, payload) = (sock.clone(), payload.clone());
            std::thread::spawn(move || hostile(&sock, id, &payload))
        })
        .collect();
    for (i, h) in hostile.into_iter().enumerate() {
        eprintln!("hostile client {i}: {:?}", h.join().unwrap());
    }
    drop(payload);
    // Idle: every buffer above 64 KiB goes back within IDLE_RELEASE.
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Release);
    let rounds = good.join().unwrap();
    let clients = HOSTILE as usize + 1;
    let hwm = status_bytes(pid, "VmHWM:");
    let rss = status_bytes(pid, "VmRSS:");
    let bound = virtio_9p_server::bound::socket(&cfg, &limits, MAX_MSIZE, clients);
    let idle = virtio_9p_server::bound::socket_idle(&cfg, &limits, clients);
    eprintln!(
        "{clients} clients: VmHWM {} MiB (bound {} MiB), idle VmRSS {} MiB (idle bound {} MiB), {rounds} good rounds",
        hwm >> 20,
        bound >> 20,
        rss >> 20,
        idle >> 20
    );
    assert!(hwm <= bound, "VmHWM {hwm} over the bound {bound}");
    assert!(rss <= idle, "idle VmRSS {rss} over the idle bound {idle}");
    // Without the limits 6 clients would have held 6 x 4 GiB of xattr
    // fids; the daemon still serves a new client.
    let mut late = socket_client(&sock, 65_536);
    late.walk(ROOT, 1, &[b"good"]).unwrap();
    late.getattr(1).unwrap();
    d.assert_alive_then_stop("hostile clients");
}
