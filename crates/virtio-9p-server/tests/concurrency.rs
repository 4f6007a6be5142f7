// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! One session shared by many threads, a custom blocking executor,
//! cancellation of a blocking Tlock, and qid uniqueness across devices.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use virtio_9p_server::io::{SliceReader, SliceWriter};
use virtio_9p_server::protocol::*;
use virtio_9p_server::{
    Blocking, Cancel, Config, Inline, PassthroughConfig, PassthroughFs, Server, Session,
};

type Fs = PassthroughFs;

fn call<B: Blocking>(
    server: &Server<Fs>,
    s: &Session<Fs>,
    msg: &Tmessage,
    tag: u16,
    exec: &B,
    cancel: &Cancel,
) -> Rmessage {
    let frame = msg.encode_frame(tag);
    let mut reply = vec![0u8; 1 << 17];
    let out = server
        .handle(
            s,
            &mut SliceReader::new(&frame),
            &mut SliceWriter::new(&mut reply),
            exec,
            cancel,
        )
        .unwrap();
    let (rtag, r) = Rmessage::decode_frame(&reply[..out.size as usize], u32::MAX).unwrap();
    assert_eq!(rtag, tag);
    r
}

fn ok(server: &Server<Fs>, s: &Session<Fs>, msg: Tmessage) -> Rmessage {
    let r = call(server, s, &msg, 1, &Inline, &Cancel::new());
    assert!(!matches!(r, Rmessage::Lerror(_)), "{msg:?} -> {r:?}");
    r
}

fn setup(dir: &std::path::Path, config: Config) -> (Arc<Server<Fs>>, Arc<Session<Fs>>) {
    let server = server_with(PassthroughConfig::new(dir), config);
    let s = Arc::new(Session::new());
    ok(
        &server,
        &s,
        Tmessage::Version(Tversion {
            msize: 1 << 17,
            version: b"9P2000.L".to_vec(),
        }),
    );
    ok(
        &server,
        &s,
        Tmessage::Attach(Tattach {
            fid: 0,
            afid: NOFID,
            uname: vec![],
            aname: vec![],
            n_uname: 0,
        }),
    );
    (server, s)
}

fn walk_open(server: &Server<Fs>, s: &Session<Fs>, fid: u32, name: &[u8], flags: OpenFlags) {
    ok(
        server,
        s,
        Tmessage::Walk(Twalk {
            fid: 0,
            newfid: fid,
            wnames: vec![name.to_vec()],
        }),
    );
    ok(server, s, Tmessage::Lopen(Tlopen { fid, flags }));
}

#[test]
fn test_one_session_many_threads_with_clunk_during_reads() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    std::fs::write(dir.path().join("f"), &data).unwrap();
    let (server, s) = setup(dir.path(), Config::default());
    walk_open(&server, &s, 1, b"f", OpenFlags::RDONLY);
    let errors = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..8u32 {
            let (server, s, data, errors) = (&server, &s, &data, &errors);
            scope.spawn(move || {
                for i in 0..200u32 {
                    let off = ((t * 7919 + i * 104_729) % (1 << 20)) as u64 & !4095;
                    let tag = (t * 1000 + i) as u16;
                    match call(
                        server,
                        s,
                        &Tmessage::Read(Tread {
                            fid: 1,
                            offset: off,
                            count: 8192,
                        }),
                        tag,
                        &Inline,
                        &Cancel::new(),
                    ) {
                        Rmessage::Read(d) => {
                            assert_eq!(&d[..], &data[off as usize..off as usize + d.len()])
                        }
                        // After the clunk below, the fid is gone.
                        Rmessage::Lerror(e) => {
                            assert_eq!(e, libc::EBADF as u32);
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                        r => panic!("{r:?}"),
                    }
                    // Every thread also walks and clunks its own fids.
                    let fid = 100 + t;
                    ok(
                        server,
                        s,
                        Tmessage::Walk(Twalk {
                            fid: 0,
                            newfid: fid,
                            wnames: vec![b"f".to_vec()],
                        }),
                    );
                    ok(server, s, Tmessage::Clunk(Tfid { fid }));
                }
            });
        }
        let (server, s) = (&server, &s);
        scope.spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            ok(server, s, Tmessage::Clunk(Tfid { fid: 1 }));
        });
    });
    // Only the shared fid 0 is left.
    assert_eq!(s.fid_count(), 1);
}

/// An executor that runs every call on a fresh thread and records the ops.
struct OtherThread(Mutex<Vec<MsgType>>);

impl Blocking for OtherThread {
    fn run<R: Send>(&self, op: MsgType, f: impl FnOnce() -> R + Send) -> R {
        self.0.lock().unwrap().push(op);
        std::thread::scope(|scope| scope.spawn(f).join().unwrap())
    }
}

#[test]
fn test_blocking_executor_runs_filesystem_calls() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"0123456789").unwrap();
    let (server, s) = setup(dir.path(), Config::default());
    let exec = OtherThread(Mutex::new(Vec::new()));
    let c = Cancel::new();
    let r = call(
        &server,
        &s,
        &Tmessage::Walk(Twalk {
            fid: 0,
            newfid: 1,
            wnames: vec![b"f".to_vec()],
        }),
        2,
        &exec,
        &c,
    );
    assert!(matches!(r, Rmessage::Walk(ref q) if q.len() == 1));
    call(
        &server,
        &s,
        &Tmessage::Lopen(Tlopen {
            fid: 1,
            flags: OpenFlags::RDWR,
        }),
        3,
        &exec,
        &c,
    );
    let r = call(
        &server,
        &s,
        &Tmessage::Read(Tread {
            fid: 1,
            offset: 2,
            count: 3,
        }),
        4,
        &exec,
        &c,
    );
    assert_eq!(r, Rmessage::Read(b"234".to_vec()));
    let r = call(
        &server,
        &s,
        &Tmessage::Write(Twrite {
            fid: 1,
            offset: 0,
            data: b"ab".to_vec(),
        }),
        5,
        &exec,
        &c,
    );
    assert_eq!(r, Rmessage::Write(2));
    call(
        &server,
        &s,
        &Tmessage::Getattr(Tgetattr {
            fid: 1,
            request_mask: GetattrMask::ALL,
        }),
        6,
        &exec,
        &c,
    );
    assert_eq!(
        *exec.0.lock().unwrap(),
        vec![
            MsgType::Twalk,
            MsgType::Tlopen,
            MsgType::Tread,
            MsgType::Twrite,
            MsgType::Tgetattr
        ]
    );
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"ab23456789");
}

#[test]
fn test_blocking_lock_waits_until_released_or_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    let (server, s) = setup(dir.path(), {
        let mut cfg = Config::default();
        cfg.lock_wait = None;
        cfg
    });
    walk_open(&server, &s, 1, b"f", OpenFlags::RDWR);
    walk_open(&server, &s, 2, b"f", OpenFlags::RDWR);
    let lock = |fid, ty, flags| {
        Tmessage::Lock(Tlock {
            fid,
            ty,
            flags,
            start: 0,
            length: 0,
            proc_id: 1,
            client_id: b"c".to_vec(),
        })
    };
    assert_eq!(
        ok(&server, &s, lock(1, LockType::Wrlck, LockFlags::empty())),
        Rmessage::Lock(LockStatus::Success)
    );
    // A blocking request waits until the holder unlocks.
    std::thread::scope(|scope| {
        let (server, s) = (&server, &s);
        let waiter = scope.spawn(move || {
            call(
                server,
                s,
                &lock(2, LockType::Wrlck, LockFlags::BLOCK),
                9,
                &Inline,
                &Cancel::new(),
            )
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!waiter.is_finished());
        ok(server, s, lock(1, LockType::Unlck, LockFlags::empty()));
        assert_eq!(waiter.join().unwrap(), Rmessage::Lock(LockStatus::Success));
    });
    // Now fid 2 holds it; a blocking request from fid 1 is cancelled (Tflush).
    std::thread::scope(|scope| {
        let cancel = Cancel::new();
        let (server, s, c2) = (&server, &s, cancel.clone());
        let waiter = scope.spawn(move || {
            call(
                server,
                s,
                &lock(1, LockType::Rdlck, LockFlags::BLOCK),
                10,
                &Inline,
                &c2,
            )
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!waiter.is_finished());
        cancel.cancel();
        assert_eq!(waiter.join().unwrap(), Rmessage::Lerror(libc::EINTR as u32));
    });
}

#[test]
fn test_qid_paths_unique_across_mounted_devices() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let target = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid C strings; a private tmpfs on a directory we own.
    let r = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r != 0 {
        eprintln!(
            "skipping: cannot mount tmpfs here: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    struct Unmount(std::ffi::CString);
    impl Drop for Unmount {
        fn drop(&mut self) {
            // SAFETY: valid C string.
            unsafe { libc::umount2(self.0.as_ptr(), libc::MNT_DETACH) };
        }
    }
    let _guard = Unmount(target);
    std::fs::write(mnt.join("a"), b"").unwrap();
    std::fs::write(dir.path().join("b"), b"").unwrap();
    use std::os::unix::fs::MetadataExt;
    let (server, s) = setup(dir.path(), Config::default());
    let Rmessage::Walk(q_mnt) = ok(
        &server,
        &s,
        Tmessage::Walk(Twalk {
            fid: 0,
            newfid: 1,
            wnames: vec![b"mnt".to_vec(), b"a".to_vec()],
        }),
    ) else {
        panic!()
    };
    let Rmessage::Walk(q_b) = ok(
        &server,
        &s,
        Tmessage::Walk(Twalk {
            fid: 0,
            newfid: 2,
            wnames: vec![b"b".to_vec()],
        }),
    ) else {
        panic!()
    };
    let ino_a = std::fs::metadata(mnt.join("a")).unwrap().ino();
    // The root device keeps raw inode numbers; the tmpfs gets a prefix.
    assert_eq!(
        q_b[0].path,
        std::fs::metadata(dir.path().join("b")).unwrap().ino()
    );
    assert_ne!(q_mnt[1].path, ino_a);
    assert_eq!(q_mnt[1].path & ((1 << 48) - 1), ino_a);
    assert_ne!(q_mnt[1].path >> 48, 0);
    // Readdir of the mount reports the same remapped paths.
    ok(
        &server,
        &s,
        Tmessage::Walk(Twalk {
            fid: 0,
            newfid: 3,
            wnames: vec![b"mnt".to_vec()],
        }),
    );
    ok(
        &server,
        &s,
        Tmessage::Lopen(Tlopen {
            fid: 3,
            flags: OpenFlags::RDONLY,
        }),
    );
    let Rmessage::Readdir(d) = ok(
        &server,
        &s,
        Tmessage::Readdir(Treaddir {
            fid: 3,
            offset: 0,
            count: 4096,
        }),
    ) else {
        panic!()
    };
    let entries = DirEntry::decode_all(&d).unwrap();
    let a = entries.iter().find(|e| e.name == b"a").unwrap();
    assert_eq!(a.qid.path, q_mnt[1].path);
}
