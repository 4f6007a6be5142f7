// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The filesystem API an embedder uses: a `Filesystem` that implements only
//! the three required methods serves (every optional operation answers its
//! documented default, `ENOSYS`, or `EOPNOTSUPP` for xattrs and locks), and
//! `PassthroughFs::with_ids` translates ids.

mod common;

use std::io;
use std::sync::Arc;

use virtio_9p_server::client::{Client, InProcess};
use virtio_9p_server::fs::{Cred, Filesystem};
use virtio_9p_server::protocol::{
    GetattrMask, LockFlags, LockType, OpenFlags, Qid, QidType, Rgetattr, SetattrMask, Tsetattr,
    UnlinkFlags,
};
use virtio_9p_server::{Config, Server};

/// One directory `/` holding one file `f`; inode 0 is the root, 1 the file.
struct Tiny;

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

impl Filesystem for Tiny {
    type Inode = u64;
    type File = u64;

    fn attach(&self, _aname: &[u8], _cred: Cred) -> io::Result<(u64, Qid)> {
        Ok((0, qid(0)))
    }

    fn walk(&self, dir: &u64, name: &[u8]) -> io::Result<(u64, Qid)> {
        match (*dir, name) {
            (0, b"f") => Ok((1, qid(1))),
            (0, b"." | b"..") => Ok((0, qid(0))),
            _ => Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
    }

    fn getattr(&self, inode: &u64, _mask: GetattrMask) -> io::Result<Rgetattr> {
        Ok(Rgetattr {
            qid: qid(*inode),
            mode: if *inode == 0 { 0o40755 } else { 0o100644 },
            ..Default::default()
        })
    }
}

fn errno(r: io::Result<impl std::fmt::Debug>) -> i32 {
    r.unwrap_err().raw_os_error().expect("an Rlerror")
}

#[test]
fn test_required_methods_alone_serve_and_the_rest_default() {
    let server = Arc::new(Server::new(Tiny, Config::default()).unwrap());
    let mut c = Client::new(InProcess::new(server, 64 << 10));
    c.version(64 << 10).unwrap();
    assert_eq!(c.attach(0, 1000).unwrap(), qid(0));
    assert_eq!(c.walk(0, 1, &[b"f"]).unwrap(), vec![qid(1)]);
    assert_eq!(c.getattr(1).unwrap().mode, 0o100644);
    assert_eq!(errno(c.walk(0, 2, &[b"missing"])), libc::ENOENT);

    let enosys = libc::ENOSYS;
    assert_eq!(errno(c.lopen(1, OpenFlags::RDONLY)), enosys);
    assert_eq!(errno(c.statfs(0)), enosys);
    assert_eq!(errno(c.readlink(1)), enosys);
    assert_eq!(errno(c.mkdir(0, b"d", 0o755, 0)), enosys);
    assert_eq!(errno(c.symlink(0, b"s", b"f", 0)), enosys);
    assert_eq!(errno(c.link(0, 1, b"l")), enosys);
    assert_eq!(errno(c.rename(1, 0, b"g")), enosys);
    assert_eq!(errno(c.renameat(0, b"f", 0, b"g")), enosys);
    assert_eq!(errno(c.unlinkat(0, b"f", UnlinkFlags::empty())), enosys);
    assert_eq!(
        errno(c.lcreate(0, b"new", OpenFlags::RDONLY, 0o644, 0)),
        enosys
    );
    let attr = Tsetattr {
        valid: SetattrMask::MODE,
        mode: 0o600,
        ..common::setattr_base(1)
    };
    assert_eq!(errno(c.setattr(attr)), enosys);
    // Xattrs: not supported, on the walk (get/list) and on the commit.
    assert_eq!(errno(c.xattrwalk(1, 5, b"user.x")), libc::EOPNOTSUPP);
    assert_eq!(errno(c.xattrwalk(1, 5, b"")), libc::EOPNOTSUPP);
    assert_eq!(
        errno(c.set_xattr(1, 6, b"user.x", b"v", 0)),
        libc::EOPNOTSUPP
    );
    // Tremove clunks the fid even though the removal failed.
    c.walk(0, 7, &[b"f"]).unwrap();
    assert_eq!(errno(c.remove(7)), enosys);
    assert_eq!(errno(c.getattr(7)), libc::EBADF);
    // The session still serves.
    assert_eq!(c.getattr(0).unwrap().mode, 0o40755);
    // No open file, so locks never reach the filesystem: EBADF.
    assert_eq!(
        errno(c.lock(1, LockType::Wrlck, LockFlags::empty(), 0, 1)),
        libc::EBADF
    );
}

#[test]
fn test_passthrough_with_ids_translates_both_ways() {
    use std::os::unix::fs::MetadataExt;
    use virtio_9p_server::fs::ids::{IdRules, IdTranslation};
    use virtio_9p_server::{PassthroughConfig, PassthroughFs};

    if !is_root() {
        // Only root can create files owned by another user.
        eprintln!("skipped: not root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rules = |list: &[&str]| IdRules::new(list.iter().map(|r| r.parse().unwrap()).collect());
    let mut ids = IdTranslation::default();
    ids.uid = rules(&["map:5:1234:1", "forbid-guest:7:1"]).unwrap();
    ids.gid = rules(&["map:6:4321:1"]).unwrap();
    let fs = PassthroughFs::new(PassthroughConfig::new(dir.path()))
        .unwrap()
        .with_ids(ids);
    let server = Arc::new(Server::new(fs, Config::default()).unwrap());
    let mut c = Client::new(InProcess::new(server, 64 << 10));
    c.version(64 << 10).unwrap();
    assert_eq!(errno(c.attach(0, 7)), libc::EPERM);
    c.attach(0, 5).unwrap();
    c.walk(0, 1, &[]).unwrap();
    c.lcreate(1, b"f", OpenFlags::RDONLY, 0o644, 6).unwrap();
    let host = std::fs::metadata(dir.path().join("f")).unwrap();
    assert_eq!((host.uid(), host.gid()), (1234, 4321));
    let a = c.getattr(1).unwrap();
    assert_eq!((a.uid, a.gid), (5, 6));
    // Tsetattr to a forbidden guest id is refused, to a mapped one lands
    // as the host id.
    let chown = |uid| Tsetattr {
        valid: SetattrMask::UID,
        uid,
        ..common::setattr_base(1)
    };
    assert_eq!(errno(c.setattr(chown(7))), libc::EPERM);
    c.setattr(chown(5)).unwrap();
    assert_eq!(std::fs::metadata(dir.path().join("f")).unwrap().uid(), 1234);
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
