// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A planned handover to a new daemon under a running guest, through a
//! vhost-user frontend on both ring layouts: the old daemon finishes what
//! it took, saves the session and goes; a new one on the same socket takes
//! the session over; the frontend reconnects (as QEMU with `reconnect-ms`)
//! and every request runs exactly once, with the guest's fids still valid.

#[macro_use]
mod vhost_user_support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vhost_user_support::scenarios::{attach_open, hold_lock, ofd_lock, Ring};
use vhost_user_support::*;
use virtio_9p_server::protocol::*;
use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout, Submitted, VmmOptions};
use virtio_9p_server::vhost_user::{Daemon, DaemonConfig, Listen, StopHandle};
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server};

/// A daemon on `socket` serving `dir`, optionally taking over `state`.
fn start(
    dir: &Path,
    socket: &Path,
    state: Option<&[u8]>,
) -> (StopHandle, JoinHandle<Daemon<PassthroughFs>>) {
    let fs = PassthroughFs::new(PassthroughConfig::new(dir)).unwrap();
    let server = Arc::new(Server::new(fs, Config::default()).unwrap());
    let mut config = DaemonConfig::default();
    config.listen = Listen::Path(socket.to_path_buf());
    config.backend.engine.workers = 2;
    let mut daemon = Daemon::new(Arc::clone(&server), config).unwrap();
    if let Some(bytes) = state {
        daemon.restore_session(server.restore_session(bytes).unwrap());
    }
    let stop = daemon.stop_handle();
    let thread = std::thread::spawn(move || {
        daemon.run().unwrap();
        daemon
    });
    (stop, thread)
}

fn submit(vmm: &mut FakeVmm, tag: u16, m: Tmessage) -> Submitted {
    vmm.submit(&frame(tag, m), 256, Layout::Indirect { seg: 64 })
        .unwrap()
}

/// `n` Twrite of a numbered record each, `n / 2` Tmkdir and `n / 2`
/// Tgetattr, tags from `first`; returns (tag, submission, kind).
fn batch(vmm: &mut FakeVmm, first: u16, n: u16, locks: u16) -> Vec<(u16, Submitted, u8)> {
    let mut out = Vec::new();
    for i in 0..n {
        let tag = first + i;
        let rec = format!("rec{tag:04}\n");
        let m = Tmessage::Write(Twrite {
            fid: 1,
            offset: u64::from(tag) * 8,
            data: rec.into_bytes(),
        });
        out.push((tag, submit(vmm, tag, m), MsgType::Rwrite.into()));
        if i % 2 == 0 {
            let tag = tag + 10_000;
            let m = Tmessage::Mkdir(Tmkdir {
                dfid: 0,
                name: format!("d{tag}").into_bytes(),
                mode: 0o755,
                gid: 0,
            });
            out.push((tag, submit(vmm, tag, m), MsgType::Rmkdir.into()));
        } else {
            let tag = tag + 20_000;
            let m = Tmessage::Getattr(Tgetattr {
                fid: 1,
                request_mask: GetattrMask::BASIC,
            });
            out.push((tag, submit(vmm, tag, m), MsgType::Rgetattr.into()));
        }
    }
    for i in 0..locks {
        let tag = first + 30_000 + i;
        let m = Tmessage::Lock(Tlock {
            fid: 2,
            ty: LockType::Wrlck,
            flags: LockFlags::BLOCK,
            start: 0,
            length: 0,
            proc_id: u32::from(tag),
            client_id: b"guest".to_vec(),
        });
        out.push((tag, submit(vmm, tag, m), MsgType::Rlock.into()));
    }
    vmm.kick().unwrap();
    out
}

/// Collects `want` used entries (20 s at most) and checks each reply:
/// its tag, its type, once.
fn check_replies(vmm: &mut FakeVmm, subs: &[(u16, Submitted, u8)], seen: &mut HashMap<u16, u32>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut used = Vec::new();
    while used.len() < subs.len() && Instant::now() < deadline {
        used.extend(vmm.wait_used(Duration::from_millis(200)).unwrap());
    }
    assert_eq!(used.len(), subs.len(), "every request answered");
    for u in used {
        let (tag, sub, ty) = subs.iter().find(|s| u32::from(s.1.head) == u.id).unwrap();
        let reply = vmm.read(sub.reply_addr, u.len as usize).unwrap();
        assert_eq!(u16::from_le_bytes([reply[5], reply[6]]), *tag);
        assert_eq!(reply[4], *ty, "tag {tag}: {:?}", decode(&reply));
        *seen.entry(*tag).or_default() += 1;
    }
}

fn handover_loses_and_repeats_nothing(ring: Ring) {
    let dir = tempfile::tempdir().unwrap();
    let sock_dir = tempfile::tempdir().unwrap();
    let socket: PathBuf = sock_dir.path().join("vu.sock");
    std::fs::write(dir.path().join("log"), b"").unwrap();
    std::fs::write(dir.path().join("lockme"), b"x").unwrap();
    let holder = hold_lock(&dir.path().join("lockme"));

    let (stop, old) = start(dir.path(), &socket, None);
    let mut vmm = FakeVmm::connect(&socket, ring.opts(VmmOptions::default())).unwrap();
    version(&mut vmm, 65536);
    attach_open(&mut vmm, "log", OpenFlags::RDWR);
    let open_lock = |vmm: &mut FakeVmm| {
        let walk = Tmessage::Walk(Twalk {
            fid: 0,
            newfid: 2,
            wnames: vec![b"lockme".to_vec()],
        });
        vmm.call(&frame(4, walk), 64, Layout::Direct).unwrap();
        let open = Tmessage::Lopen(Tlopen {
            fid: 2,
            flags: OpenFlags::RDWR,
        });
        vmm.call(&frame(5, open), 64, Layout::Direct).unwrap();
    };
    open_lock(&mut vmm);

    // Requests in flight, among them Tlocks waiting on the host's lock.
    let first = batch(&mut vmm, 100, 100, 8);
    std::thread::sleep(Duration::from_millis(50));
    stop.hand_over();
    let mut old = old.join().unwrap();
    let state = old.take_handover().expect("a handover").unwrap();
    drop(old);
    // Everything the old daemon took is answered (the locks BLOCKED).
    let mut seen = HashMap::new();
    check_replies(&mut vmm, &first, &mut seen);

    // The guest goes on meanwhile: these wait on the ring.
    let second = batch(&mut vmm, 1000, 100, 0);
    let (stop, new) = start(dir.path(), &socket, Some(&state));
    vmm.reconnect(&socket).unwrap();
    vmm.kick().unwrap();
    check_replies(&mut vmm, &second, &mut seen);
    assert!(seen.values().all(|n| *n == 1), "a request answered twice");
    assert_eq!(seen.len(), first.len() + second.len());

    // Ran once each: every record is in the file where its write put it,
    // and no Tmkdir found its directory already there.
    let log = std::fs::read(dir.path().join("log")).unwrap();
    for (tag, _, ty) in first.iter().chain(&second) {
        if *ty == u8::from(MsgType::Rwrite) {
            let at = usize::from(*tag) * 8;
            assert_eq!(&log[at..at + 8], format!("rec{tag:04}\n").as_bytes());
        }
    }
    // The lock fid survived too: released on the host, granted now.
    ofd_lock(&holder, libc::F_UNLCK);
    let lock = Tmessage::Lock(Tlock {
        fid: 2,
        ty: LockType::Wrlck,
        flags: LockFlags::BLOCK,
        start: 0,
        length: 0,
        proc_id: 1,
        client_id: b"guest".to_vec(),
    });
    let r = decode(&vmm.call(&frame(7, lock), 64, Layout::Direct).unwrap());
    assert_eq!(r.1, Rmessage::Lock(LockStatus::Success));
    drop(vmm);
    stop.stop();
    new.join().unwrap();
}

on_both_rings! {
    handover => handover_loses_and_repeats_nothing;
}
