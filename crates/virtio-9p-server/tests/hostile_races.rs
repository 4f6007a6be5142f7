// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Races a hostile socket client can run: Tflush of a Tflush
//! while the flushed request is in a filesystem call, files truncated
//! under spliced Rreads, fid lifecycle races (one fid clunked twice at
//! once, Tremove while other connections walk in, a Twalk onto a fid an
//! in-flight request holds, Tversion with requests in flight), and path
//! escapes raced by a host thread and by a second connection. Each checks
//! what the client received byte by byte, and afterwards that the server
//! still serves and its fds are back.

mod common;
mod hostile_support;

use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hostile_support::*;
use virtio_9p_server::fs::{Cred, Filesystem};
use virtio_9p_server::protocol::{
    GetattrMask, OpenFlags as of, Qid, Rgetattr, Rmessage, Tlcreate, Tlink, Tmessage, Trename,
    Tsetattr, Tsymlink, Txattrcreate,
};
use virtio_9p_server::transport::socket::SocketLimits;
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server};

// --- Item 4: Rflush after the reply, also when the Tflush is flushed. ---

/// Holds the next armed Tgetattr in its filesystem call until released.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Default)]
struct GateState {
    armed: bool,
    entered: u64,
    released: u64,
}

impl Gate {
    fn arm(&self) {
        self.state.lock().unwrap().armed = true;
    }

    /// Waits until `n` armed calls have entered.
    fn wait_entered(&self, n: u64) -> bool {
        let deadline = Instant::now() + ANSWER_WITHIN;
        let mut s = self.state.lock().unwrap();
        while s.entered < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self.cv.wait_timeout(s, left).unwrap().0;
        }
        true
    }

    fn release(&self) {
        self.state.lock().unwrap().released += 1;
        self.cv.notify_all();
    }

    /// Called by the filesystem: blocks an armed call until released.
    fn pass(&self) {
        let mut s = self.state.lock().unwrap();
        if !s.armed {
            return;
        }
        s.armed = false;
        s.entered += 1;
        let me = s.entered;
        self.cv.notify_all();
        while s.released < me {
            s = self.cv.wait(s).unwrap();
        }
    }
}

/// One directory; Tgetattr passes the gate. Its metadata calls are not
/// local by its hint, so the engine runs them on workers.
struct GatedFs(Arc<Gate>);

impl Filesystem for GatedFs {
    type Inode = ();
    type File = ();

    fn attach(&self, _: &[u8], _: Cred) -> io::Result<((), Qid)> {
        Ok(((), Qid::default()))
    }
    fn walk(&self, _: &(), _: &[u8]) -> io::Result<((), Qid)> {
        Ok(((), Qid::default()))
    }
    fn getattr(&self, _: &(), _: GetattrMask) -> io::Result<Rgetattr> {
        self.0.pass();
        Ok(Rgetattr::default())
    }
}

/// A Tgetattr held in its filesystem call on a worker,
/// a Tflush of it, and a Tflush of that Tflush, 1000 rounds. Neither
/// Rflush may go out before the Tgetattr's reply: nothing is answered
/// while the call is held (a later request's reply shows the server got
/// that far), and once it is released the replies come as Rgetattr, then
/// the first Rflush, then the second.
#[test]
fn test_flush_of_a_flush_keeps_every_rflush_after_the_reply() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let server = Arc::new(Server::new(GatedFs(gate.clone()), Config::default()).unwrap());
    let sock = serve(tmp.path(), server, small_limits(128, 16));
    let mut p = Peer::attached(&sock);
    for round in 1..=1000u64 {
        gate.arm();
        p.send(1, &tgetattr(ROOT)).unwrap();
        assert!(
            gate.wait_entered(round),
            "round {round}: the call never ran"
        );
        p.send(2, &tflush(1)).unwrap();
        p.send(3, &tflush(2)).unwrap();
        // A later request: once its reply is here, the server has handled
        // both Tflush.
        p.send(4, &twalk(ROOT, 5, &[])).unwrap();
        let mut order = Vec::new();
        loop {
            let (tag, r) = p.recv().unwrap();
            if tag == 4 {
                assert!(matches!(r, Rmessage::Walk(_)), "{r:?}");
                break;
            }
            order.push((tag, r));
        }
        assert!(
            order.is_empty(),
            "round {round}: answered while the flushed call still runs: {order:?}"
        );
        gate.release();
        let mut tags = Vec::new();
        for _ in 0..3 {
            let (tag, r) = p.recv().unwrap();
            match (tag, &r) {
                (1, Rmessage::Getattr(_)) | (2 | 3, Rmessage::Flush) => tags.push(tag),
                _ => panic!("round {round}: tag {tag}: {r:?}"),
            }
        }
        assert_eq!(tags, [1, 2, 3], "round {round}: reply order");
        assert!(matches!(p.rpc(6, &tclunk(5)), Ok(Rmessage::Clunk)));
    }
}

// --- Item 5: a spliced Rread never invents bytes. ---

/// Never 0, so a zero in a reply is always an invented byte.
fn byte_at(i: u64) -> u8 {
    (((i.wrapping_mul(2_654_435_761) >> 13) ^ (i >> 12)) % 255 + 1) as u8
}

/// The test file's bytes, computed once.
fn full() -> &'static [u8] {
    static FULL: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    FULL.get_or_init(|| (0..SPLICE_FILE).map(byte_at).collect())
}

fn pattern(off: u64, len: usize) -> Vec<u8> {
    full()[off as usize..off as usize + len].to_vec()
}

const SPLICE_FILE: u64 = 4 << 20;

fn splice_server(dir: &Path) -> (PathBuf, PathBuf) {
    let export = dir.join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("f"), pattern(0, SPLICE_FILE as usize)).unwrap();
    let fs = PassthroughFs::new(PassthroughConfig::new(&export)).unwrap();
    let server = Arc::new(Server::new(fs, Config::default()).unwrap());
    let sock = serve(dir, server, SocketLimits::default());
    (export, sock)
}

fn pipes_open() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|p| p.to_string_lossy().starts_with("pipe:"))
        .count()
}

/// Checks one Rread of `count` at `off`: at most `count` bytes, each the
/// file's, and exactly `want` of them when given.
fn check_read(tag: u16, off: u64, count: usize, data: &[u8], want: Option<usize>) {
    assert!(data.len() <= count, "tag {tag}: {} bytes", data.len());
    if let Some(w) = want {
        assert_eq!(data.len(), w, "tag {tag} at {off}: count");
    }
    let file = &full()[off as usize..off as usize + data.len()];
    if data == file {
        return;
    }
    if let Some(i) = data.iter().zip(file).position(|(a, b)| a != b) {
        panic!(
            "tag {tag}: byte {i} of the read at {off} is {}, the file's was {}",
            data[i],
            byte_at(off + i as u64)
        );
    }
}

/// Where the file is cut: on a 2 MiB boundary, so the truncation drops
/// whole page-cache folios (it zeroes the tail of a folio it cuts
/// through in place, which any read racing it may see: the kernel's
/// bytes, not the server's).
const CUT: u64 = 2 << 20;

/// The stalled reads: [`STALLED`] reads of [`STALL_COUNT`] bytes, one after
/// the other from [`STALL_BASE`], so that the eighth starts at [`CUT`].
const STALLED: u16 = 40;
const STALL_COUNT: u32 = 32 << 10;
const STALL_BASE: u64 = CUT - 7 * STALL_COUNT as u64;

fn stall_offset(tag: u16) -> u64 {
    STALL_BASE + u64::from(tag - 10) * u64::from(STALL_COUNT)
}

/// [`STALLED`] reads whose replies wait (the client reads nothing yet):
/// about 200 KiB of them fill the socket buffer, the next ones (up to
/// 256 KiB of replies, `OUT_HIGH_WATER`) wait with their data in pipes,
/// past [`CUT`], and the rest wait in the socket, not started.
fn stalled_reads(sock: &Path) -> Peer {
    let mut p = Peer::attached(sock);
    assert!(matches!(
        p.rpc(2, &twalk(ROOT, 1, &[b"f"])),
        Ok(Rmessage::Walk(_))
    ));
    assert!(matches!(
        p.rpc(2, &tlopen(1, of::RDONLY)),
        Ok(Rmessage::Lopen { .. })
    ));
    for i in 0..STALLED {
        p.send(10 + i, &tread(1, stall_offset(10 + i), STALL_COUNT))
            .unwrap();
    }
    assert!(
        eventually(Duration::from_secs(10), || pipes_open() > 0),
        "no spliced reply is waiting"
    );
    std::thread::sleep(Duration::from_millis(100));
    p
}

/// The file shrinks under Rreads whose data sits in
/// pipes. Every byte received is the file's, and each reply holds exactly
/// the bytes the file still has (a short read at the new end), but for
/// the one reply whose header was already on its way.
#[test]
fn test_spliced_rread_of_a_shrunk_file_is_short_not_padded() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (export, sock) = splice_server(tmp.path());
    std::fs::read(export.join("f")).unwrap();
    let mut p = stalled_reads(&sock);
    std::fs::OpenOptions::new()
        .write(true)
        .open(export.join("f"))
        .unwrap()
        .set_len(CUT)
        .unwrap();
    let mut longer = Vec::new();
    for _ in 0..STALLED {
        match p.recv().unwrap() {
            (tag, Rmessage::Read(d)) => {
                let off = stall_offset(tag);
                let want = CUT.saturating_sub(off).min(u64::from(STALL_COUNT)) as usize;
                check_read(tag, off, STALL_COUNT as usize, &d, None);
                if d.len() != want {
                    longer.push((tag, d.len(), want));
                }
            }
            r => panic!("{r:?}"),
        }
    }
    assert!(
        longer.len() <= 1,
        "replies longer than the file (tag, count, bytes left): {longer:?}"
    );
    assert!(matches!(
        p.rpc(99, &tgetattr(ROOT)),
        Ok(Rmessage::Getattr(_))
    ));
}

/// The file is truncated under waiting spliced replies
/// and written back to its old size with the same bytes. Every reply is
/// whole and every byte is the file's.
#[test]
fn test_spliced_rread_of_a_truncated_then_rewritten_file_is_exact() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (export, sock) = splice_server(tmp.path());
    std::fs::read(export.join("f")).unwrap();
    let mut p = stalled_reads(&sock);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(export.join("f"))
        .unwrap();
    f.set_len(CUT).unwrap();
    f.write_all_at(&pattern(CUT, (SPLICE_FILE - CUT) as usize), CUT)
        .unwrap();
    for _ in 0..STALLED {
        match p.recv().unwrap() {
            (tag, Rmessage::Read(d)) => {
                let off = stall_offset(tag);
                let n = STALL_COUNT as usize;
                check_read(tag, off, n, &d, Some(n));
            }
            r => panic!("{r:?}"),
        }
    }
    assert!(matches!(
        p.rpc(99, &tgetattr(ROOT)),
        Ok(Rmessage::Getattr(_))
    ));
}

/// A host thread truncates the file (to 0 or [`CUT`])
/// and writes it back, over and over, while a client keeps 8 spliced
/// reads outstanding. Every byte received is the file's; a reply is short
/// only where the file was. (A reply whose pages vanish after its header
/// went out while the file is still short cannot be completed with real
/// bytes: the server then closes the connection, and the client
/// reconnects; that must stay rare.)
#[test]
fn test_spliced_rreads_racing_truncation_never_invent_bytes() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (export, sock) = splice_server(tmp.path());
    std::fs::read(export.join("f")).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let cuts = Arc::new(AtomicU64::new(0));
    let truncator = {
        let (stop, cuts) = (stop.clone(), cuts.clone());
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(export.join("f"))
            .unwrap();
        let full = full();
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let cut = (i % 2) * CUT;
                f.set_len(cut).unwrap();
                f.write_all_at(&full[cut as usize..], cut).unwrap();
                cuts.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let (mut reads, mut short, mut closes) = (0u64, 0u64, 0u64);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        let mut p = Peer::attached(&sock);
        assert!(matches!(
            p.rpc(2, &twalk(ROOT, 1, &[b"f"])),
            Ok(Rmessage::Walk(_))
        ));
        assert!(matches!(
            p.rpc(2, &tlopen(1, of::RDONLY)),
            Ok(Rmessage::Lopen { .. })
        ));
        let mut next = 0u64;
        let mut offs = std::collections::HashMap::new();
        let mut send = |p: &mut Peer, offs: &mut std::collections::HashMap<u16, u64>| {
            let tag = (next % 1000) as u16 + 10;
            let off = (next * 104_729) % (SPLICE_FILE - 131_072);
            next += 1;
            offs.insert(tag, off);
            p.send(tag, &tread(1, off, 131_072))
        };
        for _ in 0..8 {
            send(&mut p, &mut offs).unwrap();
        }
        loop {
            match p.recv() {
                Ok((tag, Rmessage::Read(d))) => {
                    let off = offs.remove(&tag).unwrap();
                    check_read(tag, off, 131_072, &d, None);
                    reads += 1;
                    short += u64::from(d.len() < 131_072);
                    if t0.elapsed() > Duration::from_secs(3) {
                        break;
                    }
                    if send(&mut p, &mut offs).is_err() {
                        closes += 1;
                        break;
                    }
                }
                Ok(r) => panic!("{r:?}"),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    closes += 1;
                    break;
                }
                Err(e) => panic!("after {reads} reads: {e}"),
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    truncator.join().unwrap();
    eprintln!(
        "{reads} reads ({short} short) under {} truncations; {closes} connections closed",
        cuts.load(Ordering::Relaxed)
    );
    assert!(reads >= 300, "only {reads} reads in 3 s");
    assert!(cuts.load(Ordering::Relaxed) >= 10, "too few truncations");
    assert!(closes * 100 <= reads, "{closes} closes for {reads} reads");
}

// --- Item 7: fid lifecycle races. ---

fn fid_server(dir: &Path) -> (PathBuf, PathBuf) {
    let export = dir.join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("f"), b"file f").unwrap();
    std::fs::write(export.join("g"), b"file g").unwrap();
    std::fs::create_dir(export.join("d")).unwrap();
    let fs = PassthroughFs::new(PassthroughConfig::new(&export)).unwrap();
    let mut config = Config::default();
    config.lock_wait = None;
    let server = Arc::new(Server::new(fs, config).unwrap());
    (export, serve(dir, server, small_limits(256, 32)))
}

/// Two Tclunk of one fid in flight at once, 1000 times: exactly one
/// succeeds and the other answers `EBADF`.
#[test]
fn test_concurrent_clunks_of_one_fid_free_it_once() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (_export, sock) = fid_server(tmp.path());
    let fds_before = idle_fds(&sock);
    let mut p = Peer::attached(&sock);
    for round in 0..1000 {
        assert!(matches!(
            p.rpc(1, &twalk(ROOT, 7, &[b"f"])),
            Ok(Rmessage::Walk(_))
        ));
        if round % 2 == 0 {
            assert!(matches!(
                p.rpc(1, &tlopen(7, of::RDONLY)),
                Ok(Rmessage::Lopen { .. })
            ));
        }
        p.send(2, &tclunk(7)).unwrap();
        p.send(3, &tclunk(7)).unwrap();
        let mut ok = 0;
        for _ in 0..2 {
            match p.recv().unwrap() {
                (2 | 3, Rmessage::Clunk) => ok += 1,
                (2 | 3, Rmessage::Lerror(e)) => assert_eq!(e, libc::EBADF as u32),
                r => panic!("{r:?}"),
            }
        }
        assert_eq!(ok, 1, "round {round}");
    }
    drop(p);
    assert!(eventually(Duration::from_secs(10), || fd_count() <= fds_before + 4));
}

/// One connection removes a file while three others keep walking to it
/// and opening it, 300 rounds: every request is answered, walks either
/// reach the file or find it gone, and the file is gone for good.
#[test]
fn test_remove_while_others_walk_in() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (export, sock) = fid_server(tmp.path());
    let mut remover = Peer::attached(&sock);
    let mut walkers: Vec<_> = (0..3).map(|_| Peer::attached(&sock)).collect();
    for round in 0..300 {
        std::fs::write(export.join("d/x"), b"x").unwrap();
        assert!(matches!(
            remover.rpc(1, &twalk(ROOT, 9, &[b"d", b"x"])),
            Ok(Rmessage::Walk(_))
        ));
        for w in &mut walkers {
            for i in 0..8u16 {
                w.send(10 + 2 * i, &twalk(ROOT, 20 + u32::from(i), &[b"d", b"x"]))
                    .unwrap();
                w.send(11 + 2 * i, &tlopen(20 + u32::from(i), of::RDONLY))
                    .unwrap();
            }
        }
        match remover.rpc(2, &tremove(9)) {
            Ok(Rmessage::Remove) => {}
            r => panic!("round {round}: Tremove: {r:?}"),
        }
        for w in &mut walkers {
            for _ in 0..16 {
                match w.recv().unwrap() {
                    (_, Rmessage::Walk(q)) => assert!(q.len() <= 2),
                    (_, Rmessage::Lopen { .. }) => {}
                    (_, Rmessage::Lerror(e)) => assert!(
                        [libc::ENOENT, libc::EBADF].contains(&(e as i32)),
                        "round {round}: errno {e}"
                    ),
                    r => panic!("round {round}: {r:?}"),
                }
            }
            for i in 0..8u16 {
                let _ = w.rpc(40 + i, &tclunk(20 + u32::from(i)));
            }
        }
        assert!(!export.join("d/x").exists(), "round {round}");
    }
}

/// A blocking Tlock holds fid 30 in flight (a host process holds the
/// lock); the client clunks fid 30 and walks a new fid 30 to another file.
/// The new fid is the new file's, the flushed Tlock touches nothing, and
/// the old file's lock was never taken.
#[test]
fn test_walk_onto_a_fid_an_inflight_request_holds() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (export, sock) = fid_server(tmp.path());
    let held = HostLock::take(&export.join("f"));
    let mut p = Peer::attached(&sock);
    for round in 0..100 {
        assert!(matches!(
            p.rpc(1, &twalk(ROOT, 30, &[b"f"])),
            Ok(Rmessage::Walk(_))
        ));
        assert!(matches!(
            p.rpc(1, &tlopen(30, of::RDWR)),
            Ok(Rmessage::Lopen { .. })
        ));
        p.send(2, &tlock_blocking(30)).unwrap();
        p.send(3, &tclunk(30)).unwrap();
        p.send(4, &twalk(ROOT, 30, &[b"g"])).unwrap();
        p.send(5, &tgetattr(30)).unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(p.recv().unwrap());
        }
        got.sort_by_key(|(t, _)| *t);
        assert!(matches!(got[0], (3, Rmessage::Clunk)), "{got:?}");
        assert!(matches!(got[1], (4, Rmessage::Walk(_))), "{got:?}");
        let g_ino = std::fs::metadata(export.join("g")).unwrap();
        match &got[2] {
            (5, Rmessage::Getattr(a)) => {
                assert_eq!(a.size, g_ino.len(), "round {round}");
            }
            r => panic!("{r:?}"),
        }
        // The Tlock still waits: flush it.
        match p.rpc(6, &tflush(2)) {
            Ok(Rmessage::Flush) => {}
            Ok(Rmessage::Lock(s)) => {
                panic!("round {round}: the Tlock answered {s:?} while the lock is held")
            }
            r => panic!("{r:?}"),
        }
        assert!(matches!(p.rpc(7, &tclunk(30)), Ok(Rmessage::Clunk)));
    }
    drop(held);
    // The lock is free again for anyone: nothing of ours holds it.
    let _again = HostLock::take(&export.join("f"));
}

/// Tversion with blocking Tlocks and reads in flight, 50 times: the
/// session is reset (the old fids are gone), the connection goes on, and
/// nothing is leaked.
#[test]
fn test_tversion_with_requests_in_flight() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (export, sock) = fid_server(tmp.path());
    let fds_before = idle_fds(&sock);
    let held = HostLock::take(&export.join("f"));
    let mut p = Peer::attached(&sock);
    for round in 0..50 {
        for i in 0..4u32 {
            assert!(matches!(
                p.rpc(1, &twalk(ROOT, 10 + i, &[b"f"])),
                Ok(Rmessage::Walk(_))
            ));
            let r = p.rpc(1, &tlopen(10 + i, of::RDWR));
            assert!(
                matches!(r, Ok(Rmessage::Lopen { .. })),
                "round {round}: {r:?}"
            );
        }
        for i in 0..4u32 {
            p.send(20 + i as u16, &tlock_blocking(10 + i)).unwrap();
            p.send(30 + i as u16, &tread(10 + i, 0, 4096)).unwrap();
        }
        p.send(0xffff, &tversion()).unwrap();
        // Replies of the old requests may come first; then Rversion.
        loop {
            match p.recv().unwrap() {
                (0xffff, Rmessage::Version(_)) => break,
                (t, _) if (20..34).contains(&t) => {}
                r => panic!("round {round}: {r:?}"),
            }
        }
        // The old fids are gone; the session works after a new attach.
        match p.rpc(2, &tgetattr(10)) {
            Ok(Rmessage::Lerror(e)) => assert_eq!(e, libc::EBADF as u32),
            // A Tlock cut short by the reset may still answer.
            r => panic!("round {round}: old fid after Tversion: {r:?}"),
        }
        assert!(matches!(p.rpc(3, &tattach(ROOT)), Ok(Rmessage::Attach(_))));
    }
    drop(p);
    drop(held);
    assert!(
        eventually(Duration::from_secs(10), || fd_count() <= fds_before + 4),
        "fds: {} (before {fds_before})",
        fd_count()
    );
}

// --- Item 7: escape races over the socket transport. ---

const SECRET: &[u8] = b"TOP SECRET";

fn cpath(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

/// Pipelined creates, links, renames, setattrs, xattrs, opens and walks of
/// `..` in a directory that a host thread keeps swapping with a symlink to
/// the outside (`RENAME_EXCHANGE`) and whose last component a second 9P
/// connection keeps replacing with a symlink to the outside. Nothing
/// outside the export is read or changed.
#[test]
fn test_escape_races_over_sockets_touch_nothing_outside() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&export).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), SECRET).unwrap();
    std::fs::write(outside.join("f"), SECRET).unwrap();
    let race = export.join("race");
    std::fs::create_dir(&race).unwrap();
    std::fs::write(race.join("f"), b"inside").unwrap();
    let link = export.join("race.link");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    let outside_before = snapshot(&outside);

    let fs = PassthroughFs::new(PassthroughConfig::new(&export)).unwrap();
    let server = Arc::new(Server::new(fs, Config::default()).unwrap());
    let sock = serve(tmp.path(), server, small_limits(256, 32));

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = common::spawn_exchanger(&race, &link, stop.clone());
    // The second connection: swaps the last component "race/f" for a
    // symlink to the outside file and back, through 9P.
    let relinker = {
        let (stop, sock, outside) = (stop.clone(), sock.clone(), outside.clone());
        std::thread::spawn(move || {
            let mut p = Peer::attached(&sock);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // "race/f" becomes a symlink to the outside file...
                let _ = p.rpc(1, &twalk(ROOT, 2, &[b"race"]));
                let _ = p.rpc(
                    2,
                    &Tmessage::Symlink(Tsymlink {
                        fid: 2,
                        name: b"f.new".to_vec(),
                        symtgt: outside.join("f").as_os_str().as_encoded_bytes().to_vec(),
                        gid: 0,
                    }),
                );
                let _ = p.rpc(3, &twalk(2, 3, &[b"f.new"]));
                let _ = p.rpc(
                    4,
                    &Tmessage::Rename(Trename {
                        fid: 3,
                        dfid: 2,
                        name: b"f".to_vec(),
                    }),
                );
                let _ = p.rpc(5, &tclunk(3));
                // ... and a regular file again.
                let _ = p.rpc(6, &twalk(2, 3, &[]));
                let _ = p.rpc(
                    7,
                    &Tmessage::Lcreate(Tlcreate {
                        fid: 3,
                        name: b"f.reg".to_vec(),
                        flags: of::RDWR | of::TRUNC,
                        mode: 0o644,
                        gid: 0,
                    }),
                );
                let _ = p.rpc(
                    8,
                    &Tmessage::Write(virtio_9p_server::protocol::Twrite {
                        fid: 3,
                        offset: 0,
                        data: b"inside".to_vec(),
                    }),
                );
                let _ = p.rpc(
                    9,
                    &Tmessage::Rename(Trename {
                        fid: 3,
                        dfid: 2,
                        name: b"f".to_vec(),
                    }),
                );
                let _ = p.rpc(10, &tclunk(3));
                let _ = p.rpc(11, &tclunk(2));
                n += 1;
            }
            n
        })
    };

    let mut attackers = Vec::new();
    for a in 0..3u32 {
        let (stop, sock) = (stop.clone(), sock.clone());
        attackers.push(std::thread::spawn(move || {
            let mut p = Peer::attached(&sock);
            let mut reads_inside = 0u64;
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) && rounds < 1000 {
                rounds += 1;
                let name = format!("n{a}-{}", rounds % 4).into_bytes();
                let ops: Vec<Tmessage> = vec![
                    twalk(ROOT, 10, &[b"race"]),
                    Tmessage::Lcreate(Tlcreate {
                        fid: 10,
                        name: name.clone(),
                        flags: of::RDWR | of::TRUNC,
                        mode: 0o666,
                        gid: 0,
                    }),
                    twalk(ROOT, 11, &[b"race", b"f"]),
                    tlopen(11, of::RDONLY),
                    tread(11, 0, 64),
                    twalk(ROOT, 12, &[b"race", b"..", b"race", b"f"]),
                    Tmessage::Setattr(Tsetattr {
                        fid: 12,
                        valid: virtio_9p_server::protocol::SetattrMask::MODE,
                        mode: 0o777,
                        ..setattr_zero(12)
                    }),
                    twalk(ROOT, 13, &[b"race"]),
                    Tmessage::Link(Tlink {
                        dfid: 13,
                        fid: 12,
                        name: format!("l{a}").into_bytes(),
                    }),
                    twalk(ROOT, 14, &[b"race", b"f"]),
                    Tmessage::Xattrcreate(Txattrcreate {
                        fid: 14,
                        name: b"user.evil".to_vec(),
                        attr_size: 4,
                        flags: 0,
                    }),
                    Tmessage::Write(virtio_9p_server::protocol::Twrite {
                        fid: 14,
                        offset: 0,
                        data: b"evil".to_vec(),
                    }),
                    tclunk(14),
                    twalk(ROOT, 15, &[b"race", b".."]),
                    tgetattr(15),
                    tclunk(10),
                    tclunk(11),
                    tclunk(12),
                    tclunk(13),
                    tclunk(15),
                ];
                // One at a time, as a client that waits for each reply:
                // every step acts on what the previous one found.
                for (i, m) in ops.iter().enumerate() {
                    let r = p.rpc(100 + i as u16, m).unwrap();
                    if let Rmessage::Read(d) = r {
                        assert_ne!(&d[..], SECRET, "read the outside file");
                        reads_inside += 1;
                    }
                }
            }
            reads_inside
        }));
    }
    let mut inside = 0;
    for a in attackers {
        inside += a.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    let relinks = relinker.join().unwrap();
    eprintln!("escape race: {swaps} swaps, {relinks} relinks, {inside} inside reads");
    assert_eq!(snapshot(&outside), outside_before, "the outside changed");
    assert!(inside > 0 && swaps > 0 && relinks > 0, "the race never ran");
    // The server still serves.
    let mut p = Peer::attached(&sock);
    assert!(matches!(
        p.rpc(3, &tgetattr(ROOT)),
        Ok(Rmessage::Getattr(_))
    ));
}

fn setattr_zero(fid: u32) -> Tsetattr {
    Tsetattr {
        fid,
        valid: virtio_9p_server::protocol::SetattrMask::empty(),
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

/// Names, modes, sizes, contents and xattrs of `dir`'s entries.
fn snapshot(dir: &Path) -> Vec<(String, u32, Vec<u8>, usize)> {
    use std::os::unix::fs::MetadataExt;
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            let xattrs = {
                let mut buf = vec![0u8; 4096];
                let p = cpath(&e.path());
                // SAFETY: valid C string; `buf` is valid for its length.
                let n = unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
                n.max(0) as usize
            };
            (
                e.file_name().to_string_lossy().into_owned(),
                md.mode(),
                std::fs::read(e.path()).unwrap_or_default(),
                xattrs,
            )
        })
        .collect();
    out.sort();
    out
}

/// A Tremove and a Tclunk of one fid in flight at once, 500 times:
/// exactly one releases the fid and the other answers `EBADF`; the file
/// is gone exactly when the Tremove won.
#[test]
fn test_remove_and_clunk_of_one_fid_have_one_winner() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let (export, sock) = fid_server(tmp.path());
    let fds_before = idle_fds(&sock);
    let mut p = Peer::attached(&sock);
    let (mut removed, mut clunked) = (0, 0);
    for round in 0..500 {
        std::fs::write(export.join("d/r"), b"r").unwrap();
        assert!(matches!(
            p.rpc(1, &twalk(ROOT, 7, &[b"d", b"r"])),
            Ok(Rmessage::Walk(_))
        ));
        // Alternate the order they are sent in.
        let (first, second) = if round % 2 == 0 {
            ((2, tremove(7)), (3, tclunk(7)))
        } else {
            ((3, tclunk(7)), (2, tremove(7)))
        };
        p.send(first.0, &first.1).unwrap();
        p.send(second.0, &second.1).unwrap();
        let mut ok = 0;
        let mut remove_won = false;
        for _ in 0..2 {
            match p.recv().unwrap() {
                (2, Rmessage::Remove) => {
                    ok += 1;
                    remove_won = true;
                }
                (3, Rmessage::Clunk) => ok += 1,
                (2 | 3, Rmessage::Lerror(e)) => assert_eq!(e, libc::EBADF as u32),
                r => panic!("{r:?}"),
            }
        }
        assert_eq!(ok, 1, "round {round}: both or neither released fid 7");
        assert_eq!(
            export.join("d/r").exists(),
            !remove_won,
            "round {round}: the file is gone exactly when Tremove won"
        );
        if remove_won {
            removed += 1;
        } else {
            clunked += 1;
        }
        // The fid is free again.
        assert!(matches!(
            p.rpc(4, &tclunk(7)),
            Ok(Rmessage::Lerror(e)) if e == libc::EBADF as u32
        ));
    }
    eprintln!("Tremove won {removed} rounds, Tclunk {clunked}");
    drop(p);
    assert!(eventually(Duration::from_secs(10), || fd_count() <= fds_before + 4));
}
