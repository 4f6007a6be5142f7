// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The readonly export and the security models (mapped-xattr ownership in
//! QEMU's layout, none).

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;
use virtio_9p_server::protocol::{
    LockFlags, LockStatus, LockType, OpenFlags as of, QidType, SetattrMask, Tsetattr, UnlinkFlags,
};
use virtio_9p_server::SecurityModel;

fn xattr(path: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    common::host_xattr(path, name.as_bytes())
}

fn set_xattr(path: &std::path::Path, name: &str, value: &[u8]) {
    common::host_set_xattr(path, name.as_bytes(), value);
}

#[test]
fn test_readonly_export_refuses_every_change() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"data").unwrap();
    std::fs::create_dir(dir.path().join("d")).unwrap();
    let mut c = client_for(dir.path(), SecurityModel::Passthrough, true, true);
    let rofs = libc::EROFS;
    c.walk(ROOT, 1, &[b"f"]).unwrap();
    // Reading works.
    c.walk(ROOT, 2, &[b"f"]).unwrap();
    c.lopen(2, of::RDONLY).unwrap();
    assert_eq!(c.read(2, 0, 10).unwrap(), b"data");
    assert_eq!(
        c.lock(2, LockType::Rdlck, LockFlags::empty(), 0, 0)
            .unwrap(),
        LockStatus::Success
    );
    c.getattr(1).unwrap();
    c.statfs(ROOT).unwrap();
    // Every change fails with EROFS.
    assert_eq!(errno(c.lopen(1, of::WRONLY).unwrap_err()), rofs);
    assert_eq!(errno(c.lopen(1, of::RDONLY | of::TRUNC).unwrap_err()), rofs);
    c.walk(ROOT, 3, &[]).unwrap();
    assert_eq!(
        errno(c.lcreate(3, b"new", of::RDWR, 0o600, 0).unwrap_err()),
        rofs
    );
    assert_eq!(errno(c.mkdir(ROOT, b"nd", 0o700, 0).unwrap_err()), rofs);
    assert_eq!(errno(c.symlink(ROOT, b"nl", b"x", 0).unwrap_err()), rofs);
    assert_eq!(
        errno(
            c.mknod(ROOT, b"nn", libc::S_IFIFO | 0o600, 0, 0, 0)
                .unwrap_err()
        ),
        rofs
    );
    assert_eq!(errno(c.link(ROOT, 1, b"hard").unwrap_err()), rofs);
    assert_eq!(errno(c.rename(1, ROOT, b"moved").unwrap_err()), rofs);
    assert_eq!(errno(c.renameat(ROOT, b"f", ROOT, b"g").unwrap_err()), rofs);
    assert_eq!(
        errno(c.unlinkat(ROOT, b"f", UnlinkFlags::empty()).unwrap_err()),
        rofs
    );
    assert_eq!(
        errno(
            c.setattr(Tsetattr {
                valid: SetattrMask::MODE,
                mode: 0o777,
                ..setattr_base(1)
            })
            .unwrap_err()
        ),
        rofs
    );
    assert_eq!(
        errno(
            c.setattr(Tsetattr {
                valid: SetattrMask::SIZE,
                ..setattr_base(1)
            })
            .unwrap_err()
        ),
        rofs
    );
    assert_eq!(
        errno(c.set_xattr(1, 4, b"user.x", b"v", 0).unwrap_err()),
        rofs
    );
    c.walk(ROOT, 5, &[b"d"]).unwrap();
    assert_eq!(errno(c.remove(5).unwrap_err()), rofs);
    // Nothing changed on the host.
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"data");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|d| d.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2);
}

#[test]
fn test_mapped_xattr_create_stores_ownership_in_qemu_layout() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = client_for(dir.path(), SecurityModel::MappedXattr, false, true);
    c.walk(ROOT, 1, &[]).unwrap();
    c.rpc(&virtio_9p_server::protocol::Tmessage::Attach(
        virtio_9p_server::protocol::Tattach {
            fid: 9,
            afid: u32::MAX,
            uname: b"alice".to_vec(),
            aname: vec![],
            n_uname: 1000,
        },
    ))
    .unwrap();
    c.walk(9, 10, &[]).unwrap();
    c.lcreate(10, b"file", of::RDWR, 0o644, 100).unwrap();
    let host = dir.path().join("file");
    let meta = std::fs::metadata(&host).unwrap();
    // Host file: owned by the server, 0600.
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(
        xattr(&host, "user.virtfs.uid").unwrap(),
        1000u32.to_le_bytes()
    );
    assert_eq!(
        xattr(&host, "user.virtfs.gid").unwrap(),
        100u32.to_le_bytes()
    );
    assert_eq!(
        xattr(&host, "user.virtfs.mode").unwrap(),
        (libc::S_IFREG | 0o644).to_le_bytes()
    );
    // The guest sees the mapped values.
    let a = c.getattr(10).unwrap();
    assert_eq!((a.uid, a.gid, a.mode), (1000, 100, libc::S_IFREG | 0o644));
    // mkdir: host 0700, mapped S_IFDIR.
    let q = c.mkdir(9, b"dir", 0o755, 100).unwrap();
    assert_eq!(q.ty, QidType::DIR);
    let d = dir.path().join("dir");
    assert_eq!(
        std::fs::metadata(&d).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(
        xattr(&d, "user.virtfs.mode").unwrap(),
        (libc::S_IFDIR | 0o755).to_le_bytes()
    );
}

#[test]
fn test_mapped_xattr_symlink_and_device_are_regular_host_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = client_for(dir.path(), SecurityModel::MappedXattr, false, true);
    let q = c.symlink(ROOT, b"link", b"/etc/passwd", 0).unwrap();
    assert_eq!(q.ty, QidType::SYMLINK);
    let host = dir.path().join("link");
    let meta = std::fs::symlink_metadata(&host).unwrap();
    assert!(meta.file_type().is_file(), "mapped symlinks are host files");
    assert_eq!(std::fs::read(&host).unwrap(), b"/etc/passwd");
    assert_eq!(
        xattr(&host, "user.virtfs.mode").unwrap(),
        (libc::S_IFLNK | 0o777).to_le_bytes()
    );
    c.walk(ROOT, 1, &[b"link"]).unwrap();
    assert_eq!(c.readlink(1).unwrap(), b"/etc/passwd");
    assert_eq!(c.getattr(1).unwrap().mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(errno(c.lopen(1, of::RDONLY).unwrap_err()), libc::ELOOP);

    c.mknod(ROOT, b"tty", libc::S_IFCHR | 0o620, 4, 1, 5)
        .unwrap();
    let dev = dir.path().join("tty");
    assert!(std::fs::symlink_metadata(&dev)
        .unwrap()
        .file_type()
        .is_file());
    assert_eq!(
        xattr(&dev, "user.virtfs.rdev").unwrap(),
        libc::makedev(4, 1).to_le_bytes()
    );
    c.walk(ROOT, 2, &[b"tty"]).unwrap();
    let a = c.getattr(2).unwrap();
    assert_eq!(a.mode, libc::S_IFCHR | 0o620);
    assert_eq!(a.rdev, libc::makedev(4, 1));
    assert_eq!(errno(c.lopen(2, of::RDONLY).unwrap_err()), libc::ENXIO);
}

#[test]
fn test_mapped_xattr_readdir_reports_the_mapped_type() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = client_for(dir.path(), SecurityModel::MappedXattr, false, true);
    c.symlink(ROOT, b"link", b"target", 0).unwrap();
    c.mknod(ROOT, b"tty", libc::S_IFCHR | 0o620, 4, 1, 0)
        .unwrap();
    c.mknod(ROOT, b"fifo", libc::S_IFIFO | 0o600, 0, 0, 0)
        .unwrap();
    c.mknod(ROOT, b"sock", libc::S_IFSOCK | 0o600, 0, 0, 0)
        .unwrap();
    c.mkdir(ROOT, b"sub", 0o755, 0).unwrap();
    c.walk(ROOT, 1, &[]).unwrap();
    c.lcreate(1, b"plain", of::RDWR, 0o644, 0).unwrap();
    // A host file without mapped attributes keeps its host type.
    std::fs::write(dir.path().join("host"), b"x").unwrap();

    c.walk(ROOT, 2, &[]).unwrap();
    c.lopen(2, of::RDONLY | of::DIRECTORY).unwrap();
    let types: std::collections::BTreeMap<Vec<u8>, (u8, QidType)> = c
        .readdir_all(2, 8192)
        .unwrap()
        .into_iter()
        .map(|e| (e.name, (e.ty, e.qid.ty)))
        .collect();
    let expect = [
        (&b"link"[..], libc::DT_LNK, QidType::SYMLINK),
        (b"tty", libc::DT_CHR, QidType::FILE),
        (b"fifo", libc::DT_FIFO, QidType::FILE),
        (b"sock", libc::DT_SOCK, QidType::FILE),
        (b"sub", libc::DT_DIR, QidType::DIR),
        (b"plain", libc::DT_REG, QidType::FILE),
        (b"host", libc::DT_REG, QidType::FILE),
    ];
    for (name, d_type, qid_type) in expect {
        assert_eq!(
            types.get(name),
            Some(&(d_type, qid_type)),
            "{}",
            String::from_utf8_lossy(name)
        );
    }
}

#[test]
fn test_mapped_xattr_reads_existing_qemu_share() {
    // A file as QEMU's mapped-xattr backend leaves it.
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("old");
    std::fs::write(&host, b"x").unwrap();
    set_xattr(&host, "user.virtfs.uid", &1234u32.to_le_bytes());
    set_xattr(&host, "user.virtfs.gid", &5678u32.to_le_bytes());
    set_xattr(
        &host,
        "user.virtfs.mode",
        &(libc::S_IFREG | 0o640).to_le_bytes(),
    );
    let mut c = client_for(dir.path(), SecurityModel::MappedXattr, false, true);
    let q = c.walk(ROOT, 1, &[b"old"]).unwrap();
    assert_eq!(q[0].ty, QidType::FILE);
    let a = c.getattr(1).unwrap();
    assert_eq!((a.uid, a.gid, a.mode), (1234, 5678, libc::S_IFREG | 0o640));
}

#[test]
fn test_mapped_xattr_setattr_updates_xattrs_not_host() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("f");
    std::fs::write(&host, b"x").unwrap();
    std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut c = client_for(dir.path(), SecurityModel::MappedXattr, false, true);
    c.walk(ROOT, 1, &[b"f"]).unwrap();
    c.setattr(Tsetattr {
        valid: SetattrMask::UID | SetattrMask::GID,
        uid: 42,
        gid: 43,
        ..setattr_base(1)
    })
    .unwrap();
    c.setattr(Tsetattr {
        valid: SetattrMask::MODE,
        mode: 0o4755,
        ..setattr_base(1)
    })
    .unwrap();
    let meta = std::fs::metadata(&host).unwrap();
    assert_eq!((meta.uid(), meta.permissions().mode() & 0o7777), (0, 0o600));
    let a = c.getattr(1).unwrap();
    assert_eq!((a.uid, a.gid, a.mode), (42, 43, libc::S_IFREG | 0o4755));
}

#[test]
fn test_mapped_xattr_hides_and_protects_reserved_names() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = client_for(dir.path(), SecurityModel::MappedXattr, false, true);
    c.walk(ROOT, 1, &[]).unwrap();
    c.lcreate(1, b"f", of::RDWR, 0o644, 0).unwrap();
    c.set_xattr(1, 2, b"user.mine", b"v", 0).unwrap();
    let list = c.get_xattr(1, 3, b"").unwrap();
    let names: Vec<&[u8]> = list.split(|b| *b == 0).filter(|n| !n.is_empty()).collect();
    assert_eq!(names, vec![&b"user.mine"[..]]);
    assert_eq!(
        errno(c.xattrwalk(1, 4, b"user.virtfs.uid").unwrap_err()),
        libc::ENODATA
    );
    assert_eq!(
        errno(
            c.set_xattr(1, 5, b"user.virtfs.uid", &0u32.to_le_bytes(), 0)
                .unwrap_err()
        ),
        libc::EACCES
    );
    assert_eq!(
        errno(
            c.set_xattr(1, 6, b"user.virtfs.mode", b"", libc::XATTR_REPLACE as u32)
                .unwrap_err()
        ),
        libc::EACCES
    );
}

fn chattr(path: &std::path::Path, flag: &str) -> bool {
    std::process::Command::new("chattr")
        .arg(flag)
        .arg(path)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn test_none_model_ignores_failing_chown() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    // An immutable file refuses chown/chmod even to root.
    if !chattr(&f, "+i") {
        eprintln!("skipping: chattr +i is not supported here");
        return;
    }
    let mut strict = client_for(dir.path(), SecurityModel::Passthrough, false, true);
    strict.walk(ROOT, 1, &[b"f"]).unwrap();
    let chown = Tsetattr {
        valid: SetattrMask::UID | SetattrMask::GID,
        uid: 7,
        gid: 7,
        ..setattr_base(1)
    };
    let chmod = Tsetattr {
        valid: SetattrMask::MODE,
        mode: 0o640,
        ..setattr_base(1)
    };
    assert_eq!(
        errno(strict.setattr(chown.clone()).unwrap_err()),
        libc::EPERM
    );
    assert_eq!(
        errno(strict.setattr(chmod.clone()).unwrap_err()),
        libc::EPERM
    );
    let mut none = client_for(dir.path(), SecurityModel::None, false, true);
    none.walk(ROOT, 1, &[b"f"]).unwrap();
    let r1 = none.setattr(chown);
    let r2 = none.setattr(chmod);
    assert!(chattr(&f, "-i"));
    r1.unwrap();
    r2.unwrap();
    assert_eq!(
        std::fs::metadata(&f).unwrap().uid(),
        0,
        "the failed chown was ignored, not applied"
    );
}

#[test]
fn test_passthrough_model_creates_with_guest_owner() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = client(dir.path());
    c.rpc(&virtio_9p_server::protocol::Tmessage::Attach(
        virtio_9p_server::protocol::Tattach {
            fid: 9,
            afid: u32::MAX,
            uname: b"bob".to_vec(),
            aname: vec![],
            n_uname: 2000,
        },
    ))
    .unwrap();
    c.mkdir(9, b"d", 0o711, 2001).unwrap();
    c.symlink(9, b"l", b"d", 2001).unwrap();
    let m = std::fs::metadata(dir.path().join("d")).unwrap();
    assert_eq!(
        (m.uid(), m.gid(), m.permissions().mode() & 0o7777),
        (2000, 2001, 0o711)
    );
    let l = std::fs::symlink_metadata(dir.path().join("l")).unwrap();
    assert_eq!((l.uid(), l.gid()), (2000, 2001));
}
