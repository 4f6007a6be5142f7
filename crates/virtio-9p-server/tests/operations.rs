// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Every 9P2000.L operation through the in-process client against a temp dir.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;
use virtio_9p_server::protocol::{
    GetattrMask, LockFlags, LockStatus, LockType, OpenFlags as of, QidType, Rmessage, SetattrMask,
    Tlock, Tmessage, Tsetattr, UnlinkFlags, HEADER_SIZE,
};

#[test]
fn test_version_attach_walk_getattr() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/f"), b"hello").unwrap();
    let mut c = client(dir.path());
    let qids = c.walk(ROOT, 1, &[b"sub", b"f"]).unwrap();
    assert_eq!(qids.len(), 2);
    assert_eq!(qids[0].ty, QidType::DIR);
    let meta = std::fs::metadata(dir.path().join("sub/f")).unwrap();
    assert_eq!(qids[1].path, meta.ino());
    let a = c.getattr(1).unwrap();
    assert_eq!(a.size, 5);
    assert_eq!(a.mode & libc::S_IFMT, libc::S_IFREG);
    assert!(a.valid.contains(GetattrMask::BASIC));
    // A partial walk returns the qids walked and creates no fid.
    let partial = c.walk(ROOT, 2, &[b"sub", b"missing"]).unwrap();
    assert_eq!(partial.len(), 1);
    assert_eq!(errno(c.getattr(2).unwrap_err()), libc::EBADF);
    // A failing first element is an error.
    assert_eq!(
        errno(c.walk(ROOT, 2, &[b"missing"]).unwrap_err()),
        libc::ENOENT
    );
    // Clone with nwname = 0, then clunk.
    c.walk(ROOT, 3, &[]).unwrap();
    c.clunk(3).unwrap();
    assert_eq!(errno(c.clunk(3).unwrap_err()), libc::EBADF);
    // newfid in use.
    assert_eq!(errno(c.walk(ROOT, 1, &[b"sub"]).unwrap_err()), libc::EBADF);
}

#[test]
fn test_lopen_read_write_fsync() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"0123456789").unwrap();
    let mut c = client(dir.path());
    c.walk(ROOT, 1, &[b"f"]).unwrap();
    c.lopen(1, of::RDWR).unwrap();
    assert_eq!(c.read(1, 2, 4).unwrap(), b"2345");
    assert_eq!(c.read(1, 100, 4).unwrap(), b"");
    assert_eq!(c.write(1, 10, b"abc").unwrap(), 3);
    c.fsync(1, false).unwrap();
    c.fsync(1, true).unwrap();
    // An empty walk of an open fid onto itself keeps it open.
    assert!(c.walk(1, 1, &[]).unwrap().is_empty());
    assert_eq!(c.read(1, 0, 2).unwrap(), b"01");
    assert_eq!(
        std::fs::read(dir.path().join("f")).unwrap(),
        b"0123456789abc"
    );
    // Reads are capped at msize - 11.
    let big = vec![7u8; 600 << 10];
    std::fs::write(dir.path().join("big"), &big).unwrap();
    c.walk(ROOT, 2, &[b"big"]).unwrap();
    c.lopen(2, of::RDONLY).unwrap();
    let got = c.read(2, 0, u32::MAX).unwrap();
    assert_eq!(got.len(), MSIZE as usize - 11);
    // Opening twice fails; I/O on an unopened fid fails.
    assert_eq!(errno(c.lopen(2, of::RDONLY).unwrap_err()), libc::EBADF);
    c.walk(ROOT, 3, &[b"f"]).unwrap();
    assert_eq!(errno(c.read(3, 0, 1).unwrap_err()), libc::EBADF);
    assert_eq!(errno(c.write(3, 0, b"x").unwrap_err()), libc::EBADF);
    assert_eq!(errno(c.fsync(3, false).unwrap_err()), libc::EBADF);
}

#[test]
fn test_lcreate_mkdir_symlink_mknod_link_readlink() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = client(dir.path());
    c.walk(ROOT, 1, &[]).unwrap();
    c.lcreate(1, b"new", of::RDWR, 0o640, 0).unwrap();
    c.write(1, 0, b"data").unwrap();
    let meta = std::fs::metadata(dir.path().join("new")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    // O_CREAT without O_EXCL of an existing file opens it.
    c.walk(ROOT, 2, &[]).unwrap();
    c.lcreate(2, b"new", of::RDONLY, 0o600, 0).unwrap();
    assert_eq!(c.read(2, 0, 10).unwrap(), b"data");
    c.walk(ROOT, 3, &[]).unwrap();
    assert_eq!(
        errno(
            c.lcreate(3, b"new", of::RDWR | of::EXCL, 0o600, 0)
                .unwrap_err()
        ),
        libc::EEXIST
    );

    let q = c.mkdir(ROOT, b"d", 0o750, 0).unwrap();
    assert_eq!(q.ty, QidType::DIR);
    assert_eq!(
        std::fs::metadata(dir.path().join("d"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o750
    );
    let q = c.symlink(ROOT, b"l", b"../../etc/passwd", 0).unwrap();
    assert_eq!(q.ty, QidType::SYMLINK);
    c.walk(ROOT, 4, &[b"l"]).unwrap();
    assert_eq!(c.readlink(4).unwrap(), b"../../etc/passwd");
    c.walk(ROOT, 5, &[b"new"]).unwrap();
    assert_eq!(errno(c.readlink(5).unwrap_err()), libc::EINVAL);
    c.mknod(ROOT, b"fifo", libc::S_IFIFO | 0o600, 0, 0, 0)
        .unwrap();
    assert!(std::fs::symlink_metadata(dir.path().join("fifo"))
        .unwrap()
        .file_type()
        .is_fifo_like());
    assert_eq!(
        errno(
            c.mknod(ROOT, b"bad", libc::S_IFDIR | 0o600, 0, 0, 0)
                .unwrap_err()
        ),
        libc::EINVAL
    );
    c.link(ROOT, 5, b"hard").unwrap();
    assert_eq!(std::fs::read(dir.path().join("hard")).unwrap(), b"data");
    c.walk(ROOT, 6, &[b"d"]).unwrap();
    assert_eq!(errno(c.link(ROOT, 6, b"dirlink").unwrap_err()), libc::EPERM);
}

trait FifoLike {
    fn is_fifo_like(&self) -> bool;
}
impl FifoLike for std::fs::FileType {
    fn is_fifo_like(&self) -> bool {
        use std::os::unix::fs::FileTypeExt;
        self.is_fifo()
    }
}

#[test]
fn test_rename_renameat_unlinkat_remove() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("a")).unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    std::fs::write(dir.path().join("a/f"), b"x").unwrap();
    std::fs::write(dir.path().join("a/g"), b"y").unwrap();
    let mut c = client(dir.path());
    c.walk(ROOT, 1, &[b"a"]).unwrap();
    c.walk(ROOT, 2, &[b"b"]).unwrap();
    c.walk(1, 3, &[b"f"]).unwrap();
    c.rename(3, 2, b"f2").unwrap();
    assert!(dir.path().join("b/f2").exists());
    // The fid follows its file: rename again from the new place.
    c.rename(3, 1, b"f3").unwrap();
    assert!(dir.path().join("a/f3").exists());
    c.renameat(1, b"g", 2, b"g2").unwrap();
    assert!(dir.path().join("b/g2").exists());
    c.unlinkat(2, b"g2", UnlinkFlags::empty()).unwrap();
    assert!(!dir.path().join("b/g2").exists());
    assert_eq!(
        errno(c.unlinkat(ROOT, b"b", UnlinkFlags::empty()).unwrap_err()),
        libc::EISDIR
    );
    assert_eq!(
        errno(
            c.unlinkat(ROOT, b"b", UnlinkFlags::from_bits_retain(0x1))
                .unwrap_err()
        ),
        libc::EINVAL
    );
    c.clunk(2).unwrap();
    c.unlinkat(ROOT, b"b", UnlinkFlags::REMOVEDIR).unwrap();
    assert!(!dir.path().join("b").exists());
    c.remove(3).unwrap();
    assert!(!dir.path().join("a/f3").exists());
    // Tremove clunks even on failure.
    assert_eq!(errno(c.getattr(3).unwrap_err()), libc::EBADF);
    // Removing a file renamed behind the fid's back is refused, not
    // misdirected.
    std::fs::write(dir.path().join("a/h"), b"z").unwrap();
    c.walk(1, 4, &[b"h"]).unwrap();
    std::fs::rename(dir.path().join("a/h"), dir.path().join("a/h2")).unwrap();
    std::fs::write(dir.path().join("a/h"), b"other").unwrap();
    assert_eq!(errno(c.remove(4).unwrap_err()), libc::ENOENT);
    assert!(dir.path().join("a/h").exists());
    // The root cannot be removed.
    c.walk(ROOT, 5, &[]).unwrap();
    assert_eq!(errno(c.remove(5).unwrap_err()), libc::EBUSY);
}

#[test]
fn test_setattr_mode_size_times_owner() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"0123456789").unwrap();
    let mut c = client(dir.path());
    c.walk(ROOT, 1, &[b"f"]).unwrap();
    let base = setattr_base(1);
    c.setattr(Tsetattr {
        valid: SetattrMask::MODE,
        mode: 0o604,
        ..base.clone()
    })
    .unwrap();
    c.setattr(Tsetattr {
        valid: SetattrMask::SIZE,
        size: 4,
        ..base.clone()
    })
    .unwrap();
    c.setattr(Tsetattr {
        valid: SetattrMask::MTIME
            | SetattrMask::MTIME_SET
            | SetattrMask::ATIME
            | SetattrMask::ATIME_SET,
        mtime_sec: 1_000_000,
        atime_sec: 2_000_000,
        ..base.clone()
    })
    .unwrap();
    c.setattr(Tsetattr {
        valid: SetattrMask::UID | SetattrMask::GID,
        uid: 1234,
        gid: 5678,
        ..base.clone()
    })
    .unwrap();
    let m = std::fs::metadata(dir.path().join("f")).unwrap();
    assert_eq!(m.permissions().mode() & 0o7777, 0o604);
    assert_eq!(m.len(), 4);
    assert_eq!(m.mtime(), 1_000_000);
    assert_eq!(m.atime(), 2_000_000);
    assert_eq!((m.uid(), m.gid()), (1234, 5678));
    let a = c.getattr(1).unwrap();
    assert_eq!(
        (a.uid, a.gid, a.size, a.mtime_sec),
        (1234, 5678, 4, 1_000_000)
    );
}

#[test]
fn test_readdir_offsets_and_small_counts() {
    let dir = tempfile::tempdir().unwrap();
    let mut names: Vec<String> = (0..200).map(|i| format!("file-{i:04}")).collect();
    for n in &names {
        std::fs::write(dir.path().join(n), b"").unwrap();
    }
    let mut c = client(dir.path());
    c.walk(ROOT, 1, &[]).unwrap();
    c.lopen(1, of::RDONLY | of::DIRECTORY).unwrap();
    // A small count forces many round trips through the offset cookies.
    let entries = c.readdir_all(1, 200).unwrap();
    let mut got: Vec<String> = entries
        .iter()
        .map(|e| String::from_utf8(e.name.clone()).unwrap())
        .filter(|n| n != "." && n != "..")
        .collect();
    got.sort();
    names.sort();
    assert_eq!(got, names);
    // Reading again from 0 restarts.
    assert!(!c.readdir(1, 0, 4096).unwrap().is_empty());
    // A count too small for one entry returns nothing rather than failing.
    assert!(c.readdir(1, 0, 10).unwrap().is_empty());
}

#[test]
fn test_statfs_and_xattrs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"").unwrap();
    let mut c = client(dir.path());
    let s = c.statfs(ROOT).unwrap();
    assert!(s.bsize > 0 && s.namelen > 0);
    c.walk(ROOT, 1, &[b"f"]).unwrap();
    c.set_xattr(1, 10, b"user.test", b"value", 0).unwrap();
    assert_eq!(c.get_xattr(1, 11, b"user.test").unwrap(), b"value");
    let list = c.get_xattr(1, 12, b"").unwrap();
    assert!(
        list.split(|b| *b == 0).any(|n| n == b"user.test"),
        "{list:?}"
    );
    // XATTR_CREATE on an existing attribute fails at clunk.
    c.walk(1, 13, &[]).unwrap();
    c.xattrcreate(13, b"user.test", 1, libc::XATTR_CREATE as u32)
        .unwrap();
    c.write(13, 0, b"z").unwrap();
    assert_eq!(errno(c.clunk(13).unwrap_err()), libc::EEXIST);
    // A short value fails at clunk.
    c.walk(1, 14, &[]).unwrap();
    c.xattrcreate(14, b"user.short", 4, 0).unwrap();
    c.write(14, 0, b"ab").unwrap();
    assert_eq!(errno(c.clunk(14).unwrap_err()), libc::EINVAL);
    // Writing past the declared size fails.
    c.walk(1, 15, &[]).unwrap();
    c.xattrcreate(15, b"user.over", 2, 0).unwrap();
    assert_eq!(errno(c.write(15, 0, b"abc").unwrap_err()), libc::EINVAL);
    c.clunk(15).unwrap_err();
    // Size limit.
    c.walk(1, 16, &[]).unwrap();
    assert_eq!(
        errno(c.xattrcreate(16, b"user.big", 65_537, 0).unwrap_err()),
        libc::E2BIG
    );
    // Remove: size 0 with XATTR_REPLACE.
    c.set_xattr(1, 17, b"user.test", b"", libc::XATTR_REPLACE as u32)
        .unwrap();
    assert_eq!(
        errno(c.xattrwalk(1, 18, b"user.test").unwrap_err()),
        libc::ENODATA
    );
}

#[test]
fn test_locks_conflict_between_fids() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"0123456789").unwrap();
    let mut c = client(dir.path());
    c.walk(ROOT, 1, &[b"f"]).unwrap();
    c.lopen(1, of::RDWR).unwrap();
    c.walk(ROOT, 2, &[b"f"]).unwrap();
    c.lopen(2, of::RDWR).unwrap();
    assert_eq!(
        c.lock(1, LockType::Wrlck, LockFlags::empty(), 0, 0)
            .unwrap(),
        LockStatus::Success
    );
    assert_eq!(
        c.lock(2, LockType::Wrlck, LockFlags::empty(), 0, 0)
            .unwrap(),
        LockStatus::Blocked
    );
    let g = c.getlock(2, LockType::Wrlck, 0, 0).unwrap();
    assert_eq!(g.ty, LockType::Wrlck);
    // Blocking variant gives up after the configured wait (1 s default)
    // with BLOCKED, and the client retries.
    let t = std::time::Instant::now();
    assert_eq!(
        c.lock(2, LockType::Wrlck, LockFlags::BLOCK, 0, 0).unwrap(),
        LockStatus::Blocked
    );
    assert!(t.elapsed() >= std::time::Duration::from_millis(900));
    assert_eq!(
        c.lock(1, LockType::Unlck, LockFlags::empty(), 0, 0)
            .unwrap(),
        LockStatus::Success
    );
    assert_eq!(
        c.getlock(2, LockType::Wrlck, 0, 0).unwrap().ty,
        LockType::Unlck
    );
    assert_eq!(
        c.lock(2, LockType::Wrlck, LockFlags::BLOCK, 0, 0).unwrap(),
        LockStatus::Success
    );
    // A lock type outside LockType is refused at decode, with EINVAL.
    let mut bad = Tmessage::Lock(Tlock {
        fid: 2,
        ty: LockType::Rdlck,
        flags: LockFlags::empty(),
        start: 0,
        length: 0,
        proc_id: 1,
        client_id: b"client".to_vec(),
    })
    .encode_frame(9);
    bad[HEADER_SIZE + 4] = 7;
    assert_eq!(
        c.raw(&bad).unwrap(),
        (9, Rmessage::Lerror(libc::EINVAL as u32))
    );
    assert_eq!(
        errno(
            c.lock(2, LockType::Rdlck, LockFlags::empty(), u64::MAX, 0)
                .unwrap_err()
        ),
        libc::EINVAL
    );
}

#[test]
fn test_flush_auth_and_session_rules() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = client(dir.path());
    c.flush(1).unwrap();
    use virtio_9p_server::protocol::{Tauth, Tmessage};
    let e = c
        .rpc(&Tmessage::Auth(Tauth {
            afid: 1,
            uname: b"u".to_vec(),
            aname: vec![],
            n_uname: 0,
        }))
        .unwrap_err();
    assert_eq!(errno(e), libc::EOPNOTSUPP);
    // Attach to an fid in use.
    assert_eq!(errno(c.attach(ROOT, 0).unwrap_err()), libc::EBADF);
    // Tversion resets the session: fids are gone.
    c.version(8192).unwrap();
    assert_eq!(errno(c.getattr(ROOT).unwrap_err()), libc::EBADF);
    assert_eq!(c.msize(), 8192);
}

mod server_rules {
    use super::common::*;
    use std::sync::Arc;
    use virtio_9p_server::client::{Client, InProcess};
    use virtio_9p_server::io::{SliceReader, SliceWriter};
    use virtio_9p_server::protocol::*;
    use virtio_9p_server::{Cancel, Config, Error, Inline, PassthroughConfig, Session};

    fn raw_client(
        config: Config,
    ) -> (
        tempfile::TempDir,
        Client<InProcess<virtio_9p_server::PassthroughFs>>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let server = server_with(PassthroughConfig::new(dir.path()), config);
        (dir, Client::new(InProcess::new(server, 1 << 20)))
    }

    #[test]
    fn test_version_negotiation() {
        let (_d, mut c) = raw_client({
            let mut cfg = Config::default();
            cfg.msize_max = 65536;
            cfg
        });
        // Requests before Tversion are refused.
        assert_eq!(errno(c.attach(ROOT, 0).unwrap_err()), libc::EPROTO);
        // msize is clamped to the configured maximum.
        assert_eq!(c.version(1 << 20).unwrap(), 65536);
        // Below the minimum: error, session not usable.
        assert_eq!(errno(c.version(4095).unwrap_err()), libc::EINVAL);
        assert_eq!(errno(c.attach(ROOT, 0).unwrap_err()), libc::EPROTO);
        // Unknown versions get "unknown".
        let r = c
            .rpc(&Tmessage::Version(Tversion {
                msize: 8192,
                version: b"9P2000.u".to_vec(),
            }))
            .unwrap();
        assert_eq!(
            r,
            Rmessage::Version(Rversion {
                msize: 8192,
                version: b"unknown".to_vec()
            })
        );
        // Extensions of 9P2000.L are answered with plain 9P2000.L.
        let r = c
            .rpc(&Tmessage::Version(Tversion {
                msize: 8192,
                version: b"9P2000.L.foo".to_vec(),
            }))
            .unwrap();
        assert_eq!(
            r,
            Rmessage::Version(Rversion {
                msize: 8192,
                version: b"9P2000.L".to_vec()
            })
        );
    }

    #[test]
    fn test_config_rejects_bad_msize() {
        let dir = tempfile::tempdir().unwrap();
        let fs = virtio_9p_server::PassthroughFs::new(PassthroughConfig::new(dir.path())).unwrap();
        let e = virtio_9p_server::Server::new(fs, {
            let mut cfg = Config::default();
            cfg.msize_max = 1000;
            cfg
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "msize 1000 is outside the supported range 4096..=134217728"
        );
    }

    #[test]
    fn test_fid_limit() {
        let (_d, mut c) = raw_client({
            let mut cfg = Config::default();
            cfg.max_fids = 3;
            cfg
        });
        c.version(8192).unwrap();
        c.attach(0, 0).unwrap();
        c.walk(0, 1, &[]).unwrap();
        c.walk(0, 2, &[]).unwrap();
        assert_eq!(errno(c.walk(0, 3, &[]).unwrap_err()), libc::EMFILE);
        // Walking a fid onto itself does not need a new slot.
        c.walk(2, 2, &[]).unwrap();
        c.clunk(2).unwrap();
        c.walk(0, 3, &[]).unwrap();
    }

    #[test]
    fn test_xattr_limit_from_config() {
        let (d, mut c) = raw_client({
            let mut cfg = Config::default();
            cfg.max_xattr_size = 8;
            cfg
        });
        std::fs::write(d.path().join("f"), b"").unwrap();
        c.version(8192).unwrap();
        c.attach(0, 0).unwrap();
        c.walk(0, 1, &[b"f"]).unwrap();
        c.walk(1, 2, &[]).unwrap();
        assert_eq!(
            errno(c.xattrcreate(2, b"user.x", 9, 0).unwrap_err()),
            libc::E2BIG
        );
        let p = std::ffi::CString::new(d.path().join("f").into_os_string().into_encoded_bytes())
            .unwrap();
        // SAFETY: valid C strings and buffer.
        unsafe {
            libc::setxattr(
                p.as_ptr(),
                c"user.big".as_ptr(),
                [1u8; 20].as_ptr().cast(),
                20,
                0,
            )
        };
        assert_eq!(
            errno(c.xattrwalk(1, 3, b"user.big").unwrap_err()),
            libc::E2BIG
        );
        assert_eq!(
            errno(c.xattrcreate(2, b"user.x", 1, 4).unwrap_err()),
            libc::EINVAL
        );
        assert_eq!(
            errno(c.xattrcreate(2, b"", 1, 0).unwrap_err()),
            libc::EINVAL
        );
    }

    fn handle(
        server: &virtio_9p_server::Server<virtio_9p_server::PassthroughFs>,
        s: &Session<virtio_9p_server::PassthroughFs>,
        frame: &[u8],
        room: usize,
    ) -> Result<(u16, Rmessage), Error> {
        let mut reply = vec![0u8; room];
        let out = server.handle(
            s,
            &mut SliceReader::new(frame),
            &mut SliceWriter::new(&mut reply),
            &Inline,
            &Cancel::new(),
        )?;
        Ok(Rmessage::decode_frame(&reply[..out.size as usize], u32::MAX).unwrap())
    }

    #[test]
    fn test_transport_level_errors() {
        let dir = tempfile::tempdir().unwrap();
        let server = server_with(PassthroughConfig::new(dir.path()), Config::default());
        let s = Session::new();
        let v = Tmessage::Version(Tversion {
            msize: 8192,
            version: b"9P2000.L".to_vec(),
        })
        .encode_frame(NOTAG);
        assert!(matches!(
            handle(&server, &s, &v, 10),
            Err(Error::ReplyTooSmall(10))
        ));
        assert!(matches!(
            handle(&server, &s, &v[..5], 100),
            Err(Error::ShortRequest(5))
        ));
        handle(&server, &s, &v, 100).unwrap();
        // Declared size beyond the bytes supplied.
        let mut short = Tmessage::Clunk(Tfid { fid: 1 }).encode_frame(4);
        short.truncate(9);
        assert_eq!(
            handle(&server, &s, &short, 100).unwrap(),
            (4, Rmessage::Lerror(libc::EPROTO as u32))
        );
        // Over the msize.
        let mut big = Header {
            size: 9000,
            ty: MsgType::Twrite.into(),
            tag: 5,
        }
        .to_bytes()
        .to_vec();
        big.resize(9000, 0);
        assert_eq!(
            handle(&server, &s, &big, 100).unwrap(),
            (5, Rmessage::Lerror(libc::EMSGSIZE as u32))
        );
        // A Twrite too short for its fixed fields, and one whose count lies.
        let mut tw = Header {
            size: 7 + 10,
            ty: MsgType::Twrite.into(),
            tag: 6,
        }
        .to_bytes()
        .to_vec();
        tw.resize(17, 0);
        assert_eq!(
            handle(&server, &s, &tw, 100).unwrap(),
            (6, Rmessage::Lerror(libc::EPROTO as u32))
        );
        let mut tw = Tmessage::Write(Twrite {
            fid: 1,
            offset: 0,
            data: vec![1, 2, 3],
        })
        .encode_frame(7);
        tw[19] = 9;
        assert_eq!(
            handle(&server, &s, &tw, 100).unwrap(),
            (7, Rmessage::Lerror(libc::EPROTO as u32))
        );
        // A reply larger than the room left is replaced by EMSGSIZE.
        handle(
            &server,
            &s,
            &Tmessage::Attach(Tattach {
                fid: 0,
                afid: NOFID,
                uname: vec![],
                aname: vec![],
                n_uname: 0,
            })
            .encode_frame(1),
            100,
        )
        .unwrap();
        let r = handle(
            &server,
            &s,
            &Tmessage::Getattr(Tgetattr {
                fid: 0,
                request_mask: GetattrMask::ALL,
            })
            .encode_frame(8),
            100,
        )
        .unwrap();
        assert_eq!(r, (8, Rmessage::Lerror(libc::EMSGSIZE as u32)));
        let _ = Arc::new(0);
    }
}
