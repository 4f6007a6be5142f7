// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Live migration through the vhost-user device-state channel
//! (`VHOST_USER_PROTOCOL_F_DEVICE_STATE`), with the fake VMM on both ring
//! layouts: a source daemon and a destination daemon that exports the
//! same tree at another path (another host's copy), `--export-name` and
//! `--migration-mode find-paths`. Requests are in flight when the VMM
//! stops the ring; the session (msize, fids, open files, a lock, an xattr
//! fid) crosses; a file gone or changed on the destination answers ESTALE
//! and nothing else fails. On one filesystem (both daemons exporting one
//! directory) the source lets the guest's lock go at the save and the
//! destination holds it. Streams that are truncated, damaged, from
//! another version or for another export are refused by the destination
//! and the guest goes on on the source, its locks taken again.

#[macro_use]
mod vhost_user_support;

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use vhost_user_support::scenarios::{hold_lock, ofd_lock, Ring};
use vhost_user_support::*;
use virtio_9p_server::engine::OffloadPolicy;
use virtio_9p_server::protocol::*;
use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout, VmmOptions};
use virtio_9p_server::vhost_user::{Daemon, DaemonConfig, Listen, StopHandle};
use virtio_9p_server::{Config, MigrationMode, PassthroughConfig, PassthroughFs, Server};

/// A daemon on `socket` exporting `dir` as `name`, finding files by path.
struct Host {
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
}

impl Host {
    fn start(dir: &Path, socket: &Path, name: &str) -> Host {
        let mut pcfg = PassthroughConfig::new(dir);
        pcfg.export_name = Some(name.into());
        pcfg.migration_mode = MigrationMode::FindPaths;
        let fs = PassthroughFs::new(pcfg).unwrap();
        let server = Arc::new(Server::new(fs, Config::default()).unwrap());
        let mut config = DaemonConfig::default();
        config.listen = Listen::Path(socket.to_path_buf());
        config.backend.engine.workers = 2;
        let mut daemon = Daemon::new(server, config).unwrap();
        let stop = daemon.stop_handle();
        let thread = Some(std::thread::spawn(move || daemon.run().unwrap()));
        Host { stop, thread }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The same tree in `dir`: `data` (a file the guest opens and locks),
/// `sub/kept`, `gone` and `changed` (files).
fn tree(dir: &Path) {
    std::fs::write(dir.join("data"), b"0123456789abcdef").unwrap();
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/kept"), b"kept").unwrap();
    std::fs::write(dir.join("gone"), b"gone").unwrap();
    std::fs::write(dir.join("changed"), b"changed").unwrap();
}

fn rpc(vmm: &mut FakeVmm, tag: u16, m: Tmessage) -> Rmessage {
    decode(&vmm.call(&frame(tag, m), 512, Layout::Direct).unwrap()).1
}

fn walk(vmm: &mut FakeVmm, newfid: u32, names: &[&str]) {
    let m = Tmessage::Walk(Twalk {
        fid: 0,
        newfid,
        wnames: names.iter().map(|n| n.as_bytes().to_vec()).collect(),
    });
    assert!(matches!(rpc(vmm, 2, m), Rmessage::Walk(_)));
}

fn getattr(fid: u32) -> Tmessage {
    Tmessage::Getattr(Tgetattr {
        fid,
        request_mask: GetattrMask::BASIC,
    })
}

fn read(fid: u32, offset: u64, count: u32) -> Tmessage {
    Tmessage::Read(Tread { fid, offset, count })
}

fn lock(fid: u32) -> Tmessage {
    Tmessage::Lock(Tlock {
        fid,
        ty: LockType::Wrlck,
        flags: LockFlags::empty(),
        start: 0,
        length: 0,
        proc_id: 1,
        client_id: b"guest".to_vec(),
    })
}

/// The guest's session on the source: msize 65536, fid 0 the root, fid 1
/// `data` open read-write with a write lock, fid 2 `sub/kept`, fid 3
/// `gone`, fid 4 `changed`, fid 5 an xattr write under way on `data`.
fn session(vmm: &mut FakeVmm) {
    vmm.open_file(Some(65536), "data", OpenFlags::RDWR).unwrap();
    assert_eq!(rpc(vmm, 3, lock(1)), Rmessage::Lock(LockStatus::Success));
    walk(vmm, 2, &["sub", "kept"]);
    walk(vmm, 3, &["gone"]);
    walk(vmm, 4, &["changed"]);
    walk(vmm, 5, &["data"]);
    let m = Tmessage::Xattrcreate(Txattrcreate {
        fid: 5,
        name: b"user.migrated".to_vec(),
        attr_size: 3,
        flags: 0,
    });
    assert!(matches!(rpc(vmm, 4, m), Rmessage::Xattrcreate));
    let m = Tmessage::Write(Twrite {
        fid: 5,
        offset: 0,
        data: b"yes".to_vec(),
    });
    assert_eq!(rpc(vmm, 5, m), Rmessage::Write(3));
}

/// Whether some open file description holds a lock on `path`: an OFD
/// write lock of ours conflicts with it.
fn locked(path: &Path) -> bool {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    // SAFETY: a zeroed flock is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    // SAFETY: a valid fd and flock pointer for the call.
    let r = unsafe { libc::fcntl(fd, libc::F_OFD_GETLK, &mut fl) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    fl.l_type != libc::F_UNLCK as i16
}

/// Source and destination, same tree at two paths, the guest connected to
/// the source with its session set up.
struct Setup {
    src_dir: tempfile::TempDir,
    dst_dir: tempfile::TempDir,
    socks: tempfile::TempDir,
    _src: Host,
    vmm: FakeVmm,
}

fn setup(ring: Ring) -> Setup {
    let src_dir = tempfile::tempdir().unwrap();
    let dst_dir = tempfile::tempdir().unwrap();
    tree(src_dir.path());
    tree(dst_dir.path());
    let socks = tempfile::tempdir().unwrap();
    let src = Host::start(src_dir.path(), &socks.path().join("src.sock"), "share");
    let mut vmm = FakeVmm::connect(
        &socks.path().join("src.sock"),
        ring.opts(VmmOptions::default()),
    )
    .unwrap();
    session(&mut vmm);
    Setup {
        src_dir,
        dst_dir,
        socks,
        _src: src,
        vmm,
    }
}

fn migrates_across_exports(ring: Ring) {
    let Setup {
        src_dir,
        dst_dir,
        socks,
        _src,
        mut vmm,
    } = setup(ring);
    assert!(locked(&src_dir.path().join("data")));
    assert!(!locked(&dst_dir.path().join("data")));

    // Requests in flight when the VMM stops the ring: the stop finishes
    // them on the source, their replies are in guest memory.
    let mut subs = Vec::new();
    for i in 0..8u16 {
        let m = if i % 2 == 0 {
            read(1, u64::from(i), 4)
        } else {
            getattr(2)
        };
        subs.push(
            vmm.submit(&frame(100 + i, m), 256, Layout::Indirect { seg: 64 })
                .unwrap(),
        );
    }
    vmm.kick().unwrap();
    // Those the source took are answered before GET_VRING_BASE returns;
    // the others stay on the ring for the destination.
    let base = vmm.stop_ring().unwrap();
    let mut used = vmm.collect_used().unwrap();
    let state = vmm.save_device_state().unwrap();
    assert!(state.starts_with(b"V9PSTATE"));

    // Between the hosts: one file vanished, one changed type.
    std::fs::remove_file(dst_dir.path().join("gone")).unwrap();
    std::fs::remove_file(dst_dir.path().join("changed")).unwrap();
    std::fs::create_dir(dst_dir.path().join("changed")).unwrap();

    let dst_sock = socks.path().join("dst.sock");
    let _dst = Host::start(dst_dir.path(), &dst_sock, "share");
    vmm.migrate_to(&dst_sock, &state, base).unwrap();
    // The lock was taken again on the destination before the ring ran.
    assert!(locked(&dst_dir.path().join("data")));

    // Every request in flight at the save is answered exactly once.
    vmm.kick().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while used.len() < subs.len() && std::time::Instant::now() < deadline {
        used.extend(vmm.wait_used(std::time::Duration::from_secs(1)).unwrap());
    }
    assert_eq!(used.len(), subs.len(), "every request in flight answered");
    let lens: std::collections::HashMap<u32, u32> =
        used.into_iter().map(|u| (u.id, u.len)).collect();
    assert_eq!(lens.len(), subs.len(), "answered twice");
    for (i, s) in subs.iter().enumerate() {
        let len = lens[&u32::from(s.head)] as usize;
        let (tag, r) = decode(&vmm.read(s.reply_addr, len).unwrap());
        assert_eq!(tag, 100 + i as u16);
        if i % 2 == 0 {
            assert_eq!(r, Rmessage::Read(b"0123456789abcdef"[i..i + 4].to_vec()));
        } else {
            assert!(matches!(r, Rmessage::Getattr(_)), "{r:?}");
        }
    }

    // The open fid reads and writes the destination's file.
    assert_eq!(
        rpc(&mut vmm, 10, read(1, 0, 4)),
        Rmessage::Read(b"0123".to_vec())
    );
    let m = Tmessage::Write(Twrite {
        fid: 1,
        offset: 16,
        data: b"+dst".to_vec(),
    });
    assert_eq!(rpc(&mut vmm, 11, m), Rmessage::Write(4));
    assert_eq!(
        std::fs::read(dst_dir.path().join("data")).unwrap(),
        b"0123456789abcdef+dst"
    );
    assert_eq!(
        std::fs::read(src_dir.path().join("data")).unwrap(),
        b"0123456789abcdef"
    );
    // A walked fid is found by path.
    assert!(matches!(
        rpc(&mut vmm, 12, getattr(2)),
        Rmessage::Getattr(_)
    ));
    // Gone and changed: ESTALE, until clunked.
    let estale = Rmessage::Lerror(libc::ESTALE as u32);
    assert_eq!(rpc(&mut vmm, 13, getattr(3)), estale);
    assert_eq!(rpc(&mut vmm, 14, getattr(4)), estale);
    let clunk = |fid| Tmessage::Clunk(Tfid { fid });
    assert_eq!(rpc(&mut vmm, 15, clunk(3)), estale);
    assert_eq!(
        rpc(&mut vmm, 16, getattr(3)),
        Rmessage::Lerror(libc::EBADF as u32)
    );
    // The fid number is free again.
    walk(&mut vmm, 3, &["sub"]);
    // The xattr write under way completes on the destination.
    assert_eq!(rpc(&mut vmm, 17, clunk(5)), Rmessage::Clunk);
    assert_eq!(
        xattr(&dst_dir.path().join("data"), "user.migrated"),
        Some(b"yes".to_vec())
    );
    // The lock is still the guest's: a second Tlock of its own is granted,
    // the host's is refused.
    assert_eq!(
        rpc(&mut vmm, 18, lock(1)),
        Rmessage::Lock(LockStatus::Success)
    );
    let other = std::fs::OpenOptions::new()
        .write(true)
        .open(dst_dir.path().join("data"))
        .unwrap();
    // SAFETY: a zeroed flock is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    // SAFETY: a valid fd and flock pointer.
    let r = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&other),
            libc::F_OFD_SETLK,
            &fl,
        )
    };
    assert_eq!(r, -1, "the host took the guest's lock");
}

/// `user.*` xattr `name` of `path`.
fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: C strings and a buffer valid for its length.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (r >= 0).then(|| {
        buf.truncate(r as usize);
        buf
    })
}

/// How a stream is spoiled.
#[derive(Clone, Copy, Debug)]
enum Bad {
    Truncated,
    Corrupt,
    Version,
    OtherExport,
}

fn refused_stream_leaves_the_source(ring: Ring, bad: Bad) {
    let Setup {
        src_dir,
        dst_dir,
        socks,
        _src,
        mut vmm,
    } = setup(ring);
    let base = vmm.stop_ring().unwrap();
    let mut state = vmm.save_device_state().unwrap();
    let mut name = "share";
    match bad {
        Bad::Truncated => state.truncate(state.len() / 2),
        Bad::Corrupt => {
            let mid = state.len() / 2;
            state[mid] ^= 0x5a;
        }
        Bad::Version => state[8] = state[8].wrapping_add(1),
        Bad::OtherExport => name = "another",
    }
    let dst_sock = socks.path().join("dst.sock");
    let _dst = Host::start(dst_dir.path(), &dst_sock, name);
    assert!(
        vmm.migrate_to(&dst_sock, &state, base).is_err(),
        "{bad:?} accepted"
    );
    // Nothing of the state was used: no lock taken on the destination.
    assert!(!locked(&dst_dir.path().join("data")));
    // The guest goes on on the source, its session whole.
    vmm.resume_ring(base).unwrap();
    assert_eq!(
        rpc(&mut vmm, 20, read(1, 4, 4)),
        Rmessage::Read(b"4567".to_vec())
    );
    assert!(matches!(
        rpc(&mut vmm, 21, getattr(3)),
        Rmessage::Getattr(_)
    ));
    assert!(locked(&src_dir.path().join("data")));
    // A good stream still migrates afterwards.
    let base = vmm.stop_ring().unwrap();
    let state = vmm.save_device_state().unwrap();
    let good = socks.path().join("good.sock");
    let _good = Host::start(dst_dir.path(), &good, "share");
    vmm.migrate_to(&good, &state, base).unwrap();
    assert_eq!(
        rpc(&mut vmm, 22, read(1, 8, 4)),
        Rmessage::Read(b"89ab".to_vec())
    );
}

/// Source and destination on one filesystem (one host and a bind mount,
/// as ci/guest/migrate.sh runs it, or a filesystem both hosts share): the
/// source lets the guest's lock go once the state is saved, the
/// destination takes it before its ring runs and keeps it after the
/// source is gone; a host process cannot take it.
fn migrates_on_one_filesystem(ring: Ring) {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let socks = tempfile::tempdir().unwrap();
    let src = Host::start(dir.path(), &socks.path().join("src.sock"), "share");
    let mut vmm = FakeVmm::connect(
        &socks.path().join("src.sock"),
        ring.opts(VmmOptions::default()),
    )
    .unwrap();
    session(&mut vmm);
    let data = dir.path().join("data");
    assert!(locked(&data));
    let base = vmm.stop_ring().unwrap();
    let state = vmm.save_device_state().unwrap();
    let dst_sock = socks.path().join("dst.sock");
    let _dst = Host::start(dir.path(), &dst_sock, "share");
    vmm.migrate_to(&dst_sock, &state, base).unwrap();
    drop(src);
    assert!(
        locked(&data),
        "the destination does not hold the guest's lock"
    );
    assert_eq!(
        rpc(&mut vmm, 30, lock(1)),
        Rmessage::Lock(LockStatus::Success)
    );
    assert_eq!(
        rpc(&mut vmm, 31, read(1, 0, 4)),
        Rmessage::Read(b"0123".to_vec())
    );
    assert!(locked(&data));
}

/// The reasons the destination names (the one line it logs).
#[test]
fn refusals_name_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    tree(dir.path());
    let server = |name: &str| {
        let mut pcfg = PassthroughConfig::new(dir.path());
        pcfg.export_name = Some(name.into());
        pcfg.migration_mode = MigrationMode::FindPaths;
        Server::new(PassthroughFs::new(pcfg).unwrap(), Config::default()).unwrap()
    };
    let src = server("share");
    let session = virtio_9p_server::Session::new();
    let state = src.save_session(&session).unwrap();
    let dst = server("share");
    assert!(dst.restore_migrated_session(&state).is_ok());
    let why = |bytes: &[u8], s: &Server<PassthroughFs>| {
        s.restore_migrated_session(bytes).unwrap_err().to_string()
    };
    let mut corrupt = state.clone();
    let mid = corrupt.len() / 2;
    corrupt[mid] ^= 1;
    let mut version = state.clone();
    version[8] ^= 0x40;
    for (bytes, s, words) in [
        (&state[..state.len() - 3], &dst, "truncated"),
        (&corrupt[..], &dst, "checksum"),
        (&version[..], &dst, "version"),
        (&state[..], &server("another"), "another export"),
    ] {
        let line = why(bytes, s);
        assert!(line.contains(words), "{line:?} does not say {words:?}");
        assert!(!line.contains('\n'), "{line:?}");
    }
}

on_both_rings! {
    across_exports => migrates_across_exports;
    one_filesystem => migrates_on_one_filesystem;
    truncated => |r| refused_stream_leaves_the_source(r, Bad::Truncated);
    corrupt => |r| refused_stream_leaves_the_source(r, Bad::Corrupt);
    other_version => |r| refused_stream_leaves_the_source(r, Bad::Version);
    other_export => |r| refused_stream_leaves_the_source(r, Bad::OtherExport);
}

#[test]
fn host_lock_helpers_agree() {
    // `locked` sees an OFD lock the host holds.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("f");
    std::fs::write(&p, b"x").unwrap();
    assert!(!locked(&p));
    let h = hold_lock(&p);
    assert!(locked(&p));
    ofd_lock(&h, libc::F_UNLCK);
    assert!(!locked(&p));
}

/// Dirty logging (`VHOST_USER_PROTOCOL_F_LOG_SHMFD`): once the VMM gave
/// a log, exactly the guest pages the device wrote are marked: the reply
/// buffer's pages a Tread filled (through the zero-copy `preadv` inline,
/// or on a worker) and the ring's own pages, nothing else.
fn dirty_log_marks_written_pages(ring: Ring, offload: OffloadPolicy) {
    let d = TestDaemon::start_with(2, 1024, offload);
    let data: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 251) as u8).collect();
    std::fs::write(d.dir.path().join("f"), &data).unwrap();
    let mut vmm = d.connect(ring.opts(VmmOptions::default()));
    vmm.open_file(Some(1 << 20), "f", OpenFlags::RDWR).unwrap();
    vmm.start_dirty_log().unwrap();
    assert!(vmm.dirty_pages().unwrap().is_empty(), "nothing written yet");

    let ring_pages: Vec<u64> = vmm
        .ring_write_areas()
        .into_iter()
        .flat_map(|(a, l)| a / 4096..=(a + l - 1) / 4096)
        .collect();
    let count = data.len() as u32;
    for (tag, m) in [
        (30u16, read(1, 0, count)),
        (
            31,
            Tmessage::Write(Twrite {
                fid: 1,
                offset: 0,
                data: b"w".to_vec(),
            }),
        ),
    ] {
        let s = vmm
            .submit(&frame(tag, m), 64 + count, Layout::Indirect { seg: 4096 })
            .unwrap();
        vmm.kick().unwrap();
        let mut used = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while used.is_empty() && std::time::Instant::now() < deadline {
            used = vmm.wait_used(std::time::Duration::from_secs(1)).unwrap();
        }
        assert_eq!(used.len(), 1);
        let len = u64::from(used[0].len);
        let (_, r) = decode(&vmm.read(s.reply_addr, len as usize).unwrap());
        if tag == 30 {
            assert_eq!(r, Rmessage::Read(data.clone()));
        } else {
            assert_eq!(r, Rmessage::Write(1));
        }
        let reply: Vec<u64> = (s.reply_addr / 4096..=(s.reply_addr + len - 1) / 4096).collect();
        let dirty = vmm.dirty_pages().unwrap();
        for p in &reply {
            assert!(
                dirty.contains(p),
                "tag {tag}: reply page {p:#x} not logged: {dirty:x?}"
            );
        }
        assert!(
            dirty.iter().any(|p| ring_pages.contains(p)),
            "tag {tag}: the ring's page not logged: {dirty:x?}"
        );
        for p in &dirty {
            assert!(
                reply.contains(p) || ring_pages.contains(p),
                "tag {tag}: page {p:#x} logged but not written (reply {reply:x?}, ring {ring_pages:x?})"
            );
        }
    }
}

on_both_rings! {
    dirty_log_inline => |r| dirty_log_marks_written_pages(r, OffloadPolicy::Auto);
    dirty_log_worker => |r| dirty_log_marks_written_pages(r, OffloadPolicy::Always);
}

/// A blocking Tlock waiting on a host lock when the VMM stops the ring:
/// during a migration (dirty logging on, `VHOST_F_LOG_ALL`) the stop
/// answers it BLOCKED and the session crosses; without logging (a mere
/// pause) it stays in flight, a device-state save is refused, and the
/// guest goes on on the source, where the lock is granted once free.
fn waiting_lock_at_the_save(ring: Ring, logging: bool) {
    let Setup {
        src_dir,
        dst_dir,
        socks,
        _src,
        mut vmm,
    } = setup(ring);
    // Fid 6: `sub/kept` open, its Tlock waits on the host's lock.
    walk(&mut vmm, 6, &["sub", "kept"]);
    let m = Tmessage::Lopen(Tlopen {
        fid: 6,
        flags: OpenFlags::RDWR,
    });
    assert!(matches!(rpc(&mut vmm, 40, m), Rmessage::Lopen { .. }));
    let holder = hold_lock(&src_dir.path().join("sub/kept"));
    let mut wait = lock(6);
    if let Tmessage::Lock(l) = &mut wait {
        l.flags = LockFlags::BLOCK;
    }
    let s = vmm.submit(&frame(41, wait), 64, Layout::Direct).unwrap();
    vmm.kick().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(vmm.collect_used().unwrap().is_empty(), "the Tlock waits");
    if logging {
        vmm.start_dirty_log().unwrap();
    }
    let base = vmm.stop_ring().unwrap();
    if logging {
        let used = vmm.collect_used().unwrap();
        assert_eq!(used.len(), 1, "the waiter is answered at the stop");
        let (tag, r) = decode(&vmm.read(s.reply_addr, used[0].len as usize).unwrap());
        assert_eq!((tag, r), (41, Rmessage::Lock(LockStatus::Blocked)));
        let state = vmm.save_device_state().unwrap();
        let dst_sock = socks.path().join("dst.sock");
        let _dst = Host::start(dst_dir.path(), &dst_sock, "share");
        vmm.migrate_to(&dst_sock, &state, base).unwrap();
        assert_eq!(
            rpc(&mut vmm, 42, read(1, 0, 4)),
            Rmessage::Read(b"0123".to_vec())
        );
    } else {
        assert!(vmm.save_device_state().is_err(), "saved with a waiter kept");
        vmm.resume_ring(base).unwrap();
        ofd_lock(&holder, libc::F_UNLCK);
        vmm.kick().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut used = Vec::new();
        while used.is_empty() && std::time::Instant::now() < deadline {
            used = vmm.wait_used(std::time::Duration::from_secs(1)).unwrap();
        }
        assert_eq!(used.len(), 1);
        let (tag, r) = decode(&vmm.read(s.reply_addr, used[0].len as usize).unwrap());
        assert_eq!((tag, r), (41, Rmessage::Lock(LockStatus::Success)));
    }
    drop(holder);
}

on_both_rings! {
    waiting_lock_migrating => |r| waiting_lock_at_the_save(r, true);
    waiting_lock_paused => |r| waiting_lock_at_the_save(r, false);
}
