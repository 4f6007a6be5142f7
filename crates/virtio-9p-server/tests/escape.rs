// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The path-escape suite: every attack must be refused, and each attack
//! also checks that nothing outside the export was read or changed.
//!
//! Each attack runs against five targets, from one definition:
//! - the server in-process, resolving with `openat2`;
//! - the server in-process, with the `O_NOFOLLOW` fallback;
//! - the real daemon binary over its socket transport (`--listen`) under
//!   each `--sandbox` mode (namespace, chroot, none), always with
//!   `--seccomp kill`: a syscall outside the allow-list, even one that only
//!   an attack reaches, kills the daemon and fails the attack, which
//!   checks after every attack that the daemon still runs and exits 0.
//!
//! Namespace mode is skipped with a notice where namespaces cannot be
//! created.
//!
//! The `test_escape_model_*` attacks (host privilege through xattrs, set-id
//! bits, device nodes, ACLs and world-writable modes) run in every
//! security model: passthrough, mapped-xattr and none, against every
//! target, chroot mode included.

mod common;
mod sandbox_support;

use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{
    errno, host_set_xattr, host_xattr, host_xattr_names, server_with, setattr_base,
    spawn_exchanger, MSIZE, ROOT,
};
use sandbox_support::Daemon;
use virtio_9p_server::client::{Client, InProcess, StreamTransport, Transport};
use virtio_9p_server::protocol::{
    OpenFlags as of, QidType, SetattrMask, Tattach, Tmessage, Tsetattr, UnlinkFlags,
};
use virtio_9p_server::{Config, PassthroughConfig, SecurityModel};

const SECRET: &[u8] = b"TOP SECRET";

/// Where an attack is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// The server in this process; `openat2` or the `O_NOFOLLOW` fallback.
    InProcess { openat2: bool },
    /// The daemon binary over a unix socket, in this `--sandbox` mode.
    Binary { sandbox: &'static str },
}

const TARGETS: [Target; 5] = [
    Target::InProcess { openat2: true },
    Target::InProcess { openat2: false },
    Target::Binary {
        sandbox: "namespace",
    },
    Target::Binary { sandbox: "chroot" },
    Target::Binary { sandbox: "none" },
];

/// Any transport behind one client type.
struct AnyTransport(Box<dyn Transport>);

impl Transport for AnyTransport {
    fn call(&mut self, frame: &[u8]) -> io::Result<Vec<u8>> {
        self.0.call(frame)
    }
}

type AttackClient = Client<AnyTransport>;

struct Env {
    tmp: tempfile::TempDir,
    export: PathBuf,
    outside: PathBuf,
    /// The target, for the few answers that depend on it.
    target: Target,
}

fn env(target: Target) -> Env {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&export).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), SECRET).unwrap();
    std::fs::create_dir(export.join("sub")).unwrap();
    std::fs::write(export.join("sub/inner"), b"inner").unwrap();
    Env {
        tmp,
        export,
        outside,
        target,
    }
}

/// A client attached (fid ROOT, uid 0) to `e`'s export through its
/// target, and the daemon serving it (binary targets). `None` when the
/// target cannot run here (namespaces unavailable; a notice is printed).
fn connect(e: &Env, readonly: bool) -> Option<(AttackClient, Option<Daemon>)> {
    connect_as(e, readonly, SecurityModel::Passthrough)
}

/// As [`connect`], serving in security model `model`.
fn connect_as(
    e: &Env,
    readonly: bool,
    model: SecurityModel,
) -> Option<(AttackClient, Option<Daemon>)> {
    match e.target {
        Target::InProcess { openat2 } => {
            let mut cfg = PassthroughConfig::new(&e.export);
            cfg.readonly = readonly;
            cfg.use_openat2 = openat2;
            cfg.security_model = model;
            let server = server_with(cfg, Config::default());
            let t = InProcess::new(server, MSIZE as usize);
            Some((attached(Box::new(t)), None))
        }
        Target::Binary { sandbox } => {
            let sock = e.tmp.path().join("9p.sock");
            let model = model.to_string();
            let mut extra = vec!["--security-model", &model];
            if readonly {
                extra.push("--readonly");
            }
            let log = e.tmp.path().join(format!("daemon-{sandbox}.log"));
            let d = sandbox_support::socket_daemon(&e.export, &sock, log, sandbox, &extra)?;
            let s = UnixStream::connect(&sock).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            Some((attached(Box::new(StreamTransport(s))), Some(d)))
        }
    }
}

/// Version (256 KiB) and attach as uid 0 on fid ROOT.
fn attached(t: Box<dyn Transport>) -> AttackClient {
    let mut c = Client::new(AnyTransport(t));
    c.version(MSIZE).unwrap();
    c.attach(ROOT, 0).unwrap();
    c
}

fn outside_untouched(e: &Env) {
    assert_eq!(std::fs::read(e.outside.join("secret")).unwrap(), SECRET);
    let names: Vec<_> = std::fs::read_dir(&e.outside)
        .unwrap()
        .map(|d| d.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("secret")],
        "outside dir changed"
    );
}

fn symlink(target: impl AsRef<Path>, at: impl AsRef<Path>) {
    std::os::unix::fs::symlink(target, at).unwrap();
}

/// Runs `f` against a fresh export on every target, then checks the
/// outside directory and (binary targets) that the daemon survived.
fn attack(f: impl Fn(&Env, &mut AttackClient)) {
    attack_with(false, |e, c| {
        f(e, c);
        outside_untouched(e);
    });
}

/// As [`attack`] with a read-only export when `readonly`, leaving the
/// final checks of the outside to `f`.
fn attack_with(readonly: bool, f: impl Fn(&Env, &mut AttackClient)) {
    for target in TARGETS {
        let e = env(target);
        let Some((mut c, daemon)) = connect(&e, readonly) else {
            continue;
        };
        f(&e, &mut c);
        drop(c);
        if let Some(d) = daemon {
            d.assert_alive_then_stop(&format!("{target:?}"));
        }
    }
}

#[test]
fn test_escape_dotdot_at_root_stays_at_root() {
    attack(|_, c| {
        let root = c.walk(ROOT, 1, &[]).unwrap();
        let q = c.walk(ROOT, 2, &[b".."]).unwrap();
        assert_eq!(
            c.getattr(2).unwrap().qid.path,
            c.getattr(ROOT).unwrap().qid.path
        );
        assert_eq!(q.len(), 1);
        let _ = root;
        assert_eq!(
            errno(c.walk(2, 3, &[b"outside"]).unwrap_err()),
            libc::ENOENT
        );
    });
}

#[test]
fn test_escape_dotdot_chain_of_sixteen() {
    attack(|_, c| {
        let names: Vec<&[u8]> = vec![b".."; 16];
        let qids = c.walk(ROOT, 1, &names).unwrap();
        let root = c.getattr(ROOT).unwrap().qid.path;
        assert!(qids.iter().all(|q| q.path == root));
        assert_eq!(
            errno(c.walk(1, 2, &[b"outside", b"secret"]).unwrap_err()),
            libc::ENOENT
        );
    });
}

#[test]
fn test_escape_dotdot_from_subdir_past_root() {
    attack(|_, c| {
        let qids = c
            .walk(ROOT, 1, &[b"sub", b"..", b"..", b"..", b"outside"])
            .unwrap();
        assert_eq!(qids.len(), 4, "stopped at outside");
        assert_eq!(errno(c.getattr(1).unwrap_err()), libc::EBADF);
    });
}

#[test]
fn test_escape_dotdot_then_walk_via_fid_stays_inside() {
    attack(|_, c| {
        c.walk(ROOT, 1, &[b"sub"]).unwrap();
        c.walk(1, 2, &[b".."]).unwrap();
        c.walk(2, 3, &[b".."]).unwrap();
        assert_eq!(
            c.getattr(3).unwrap().qid.path,
            c.getattr(ROOT).unwrap().qid.path
        );
    });
}

#[test]
fn test_escape_name_with_slash_in_walk() {
    attack(|_, c| {
        for name in [
            &b"../outside"[..],
            b"/etc",
            b"sub/inner",
            b"../outside/secret",
            b"/",
        ] {
            assert_eq!(
                errno(c.walk(ROOT, 1, &[name]).unwrap_err()),
                libc::EINVAL,
                "{name:?}"
            );
        }
    });
}

#[test]
fn test_escape_empty_walk_name() {
    attack(|_, c| {
        assert_eq!(errno(c.walk(ROOT, 1, &[b""]).unwrap_err()), libc::EINVAL);
    });
}

#[test]
fn test_escape_absolute_symlink_to_outside_file() {
    attack(|e, c| {
        symlink(e.outside.join("secret"), e.export.join("abs"));
        let q = c.walk(ROOT, 1, &[b"abs"]).unwrap();
        assert_eq!(q[0].ty, QidType::SYMLINK);
        assert_eq!(errno(c.lopen(1, of::RDONLY).unwrap_err()), libc::ELOOP);
        assert_eq!(errno(c.read(1, 0, 100).unwrap_err()), libc::EBADF);
    });
}

#[test]
fn test_escape_relative_symlink_to_outside_file() {
    attack(|e, c| {
        symlink("../outside/secret", e.export.join("rel"));
        c.walk(ROOT, 1, &[b"rel"]).unwrap();
        assert_eq!(errno(c.lopen(1, of::RDWR).unwrap_err()), libc::ELOOP);
    });
}

#[test]
fn test_escape_walk_through_symlinked_directory() {
    attack(|e, c| {
        symlink(&e.outside, e.export.join("escdir"));
        let qids = c.walk(ROOT, 1, &[b"escdir", b"secret"]).unwrap();
        assert_eq!(qids.len(), 1, "walk must stop at the symlink");
        c.walk(ROOT, 2, &[b"escdir"]).unwrap();
        assert_eq!(
            errno(c.walk(2, 3, &[b"secret"]).unwrap_err()),
            libc::ENOTDIR
        );
    });
}

#[test]
fn test_escape_symlink_to_host_root() {
    attack(|e, c| {
        symlink("/", e.export.join("hostroot"));
        c.walk(ROOT, 1, &[b"hostroot"]).unwrap();
        assert_eq!(errno(c.walk(1, 2, &[b"etc"]).unwrap_err()), libc::ENOTDIR);
        assert_eq!(
            errno(c.lopen(1, of::RDONLY | of::DIRECTORY).unwrap_err()),
            libc::ELOOP
        );
    });
}

#[test]
fn test_escape_symlink_loop() {
    attack(|e, c| {
        symlink("loop2", e.export.join("loop1"));
        symlink("loop1", e.export.join("loop2"));
        symlink("self", e.export.join("self"));
        for name in [&b"loop1"[..], b"self"] {
            c.walk(ROOT, 1, &[name]).unwrap();
            assert_eq!(errno(c.lopen(1, of::RDONLY).unwrap_err()), libc::ELOOP);
            assert_eq!(errno(c.walk(1, 2, &[b"x"]).unwrap_err()), libc::ENOTDIR);
            c.clunk(1).unwrap();
        }
    });
}

#[test]
fn test_escape_proc_magic_links() {
    attack(|e, c| {
        symlink("/proc/self/root", e.export.join("procroot"));
        symlink("/proc/self/cwd", e.export.join("proccwd"));
        symlink("/proc/self/fd/0", e.export.join("procfd"));
        for name in [&b"procroot"[..], b"proccwd", b"procfd"] {
            c.walk(ROOT, 1, &[name]).unwrap();
            assert_eq!(errno(c.walk(1, 2, &[b"etc"]).unwrap_err()), libc::ENOTDIR);
            assert_eq!(errno(c.lopen(1, of::RDONLY).unwrap_err()), libc::ELOOP);
            c.clunk(1).unwrap();
        }
    });
}

#[test]
fn test_escape_link_to_outside_by_name() {
    attack(|_, c| {
        c.walk(ROOT, 1, &[b"sub", b"inner"]).unwrap();
        for name in [&b"../outside/hard"[..], b"/tmp/hard", b"..", b"."] {
            assert_eq!(
                errno(c.link(ROOT, 1, name).unwrap_err()),
                libc::EINVAL,
                "{name:?}"
            );
        }
    });
}

#[test]
fn test_escape_hard_link_of_outside_symlink_stays_a_link() {
    attack(|e, c| {
        symlink(e.outside.join("secret"), e.export.join("abs"));
        c.walk(ROOT, 1, &[b"abs"]).unwrap();
        c.link(ROOT, 1, b"abs2").unwrap();
        assert!(std::fs::symlink_metadata(e.export.join("abs2"))
            .unwrap()
            .file_type()
            .is_symlink());
        c.walk(ROOT, 2, &[b"abs2"]).unwrap();
        assert_eq!(errno(c.lopen(2, of::RDONLY).unwrap_err()), libc::ELOOP);
    });
}

#[test]
fn test_escape_rename_to_outside() {
    attack(|_, c| {
        c.walk(ROOT, 1, &[b"sub", b"inner"]).unwrap();
        c.walk(ROOT, 2, &[b"sub"]).unwrap();
        assert_eq!(
            errno(c.rename(1, ROOT, b"../outside/moved").unwrap_err()),
            libc::EINVAL
        );
        assert_eq!(
            errno(
                c.renameat(2, b"inner", ROOT, b"../outside/moved")
                    .unwrap_err()
            ),
            libc::EINVAL
        );
        assert_eq!(
            errno(
                c.renameat(2, b"../../outside/secret", ROOT, b"stolen")
                    .unwrap_err()
            ),
            libc::EINVAL
        );
        assert_eq!(
            errno(c.renameat(ROOT, b"..", 2, b"x").unwrap_err()),
            libc::EINVAL
        );
    });
}

#[test]
fn test_escape_rename_into_symlinked_dir_stays_inside() {
    attack(|e, c| {
        symlink(&e.outside, e.export.join("escdir"));
        c.walk(ROOT, 1, &[b"escdir"]).unwrap();
        // The "directory" is the symlink itself: the kernel refuses it.
        assert_eq!(
            errno(c.renameat(ROOT, b"sub", 1, b"moved").unwrap_err()),
            libc::ENOTDIR
        );
        c.walk(ROOT, 2, &[b"sub", b"inner"]).unwrap();
        assert_eq!(errno(c.rename(2, 1, b"moved").unwrap_err()), libc::ENOTDIR);
    });
}

#[test]
fn test_escape_create_names_with_slash() {
    attack(|_, c| {
        c.walk(ROOT, 1, &[]).unwrap();
        assert_eq!(
            errno(
                c.lcreate(1, b"../outside/evil", of::RDWR, 0o600, 0)
                    .unwrap_err()
            ),
            libc::EINVAL
        );
        assert_eq!(
            errno(c.mkdir(ROOT, b"../outside/d", 0o700, 0).unwrap_err()),
            libc::EINVAL
        );
        assert_eq!(
            errno(c.symlink(ROOT, b"a/b", b"/etc", 0).unwrap_err()),
            libc::EINVAL
        );
        assert_eq!(
            errno(
                c.mknod(ROOT, b"../n", libc::S_IFIFO | 0o600, 0, 0, 0)
                    .unwrap_err()
            ),
            libc::EINVAL
        );
        assert_eq!(
            errno(c.lcreate(1, b"..", of::RDWR, 0o600, 0).unwrap_err()),
            libc::EINVAL
        );
        assert_eq!(
            errno(c.mkdir(ROOT, b".", 0o700, 0).unwrap_err()),
            libc::EINVAL
        );
    });
}

#[test]
fn test_escape_unlink_outside() {
    attack(|_, c| {
        assert_eq!(
            errno(
                c.unlinkat(ROOT, b"../outside/secret", UnlinkFlags::empty())
                    .unwrap_err()
            ),
            libc::EINVAL
        );
        assert_eq!(
            errno(
                c.unlinkat(ROOT, b"..", UnlinkFlags::from_bits_retain(0x200))
                    .unwrap_err()
            ),
            libc::EINVAL
        );
    });
}

#[test]
fn test_escape_create_over_symlink_to_outside() {
    attack(|e, c| {
        symlink(e.outside.join("secret"), e.export.join("trap"));
        symlink(e.outside.join("newfile"), e.export.join("dangling"));
        c.walk(ROOT, 1, &[]).unwrap();
        assert_eq!(
            errno(
                c.lcreate(1, b"trap", of::RDWR | of::TRUNC, 0o600, 0)
                    .unwrap_err()
            ),
            libc::ELOOP
        );
        assert_eq!(
            errno(c.lcreate(1, b"dangling", of::RDWR, 0o600, 0).unwrap_err()),
            libc::ELOOP
        );
    });
}

#[test]
fn test_escape_device_nodes_never_opened() {
    attack(|e, c| {
        let null =
            std::ffi::CString::new(e.export.join("null").into_os_string().into_encoded_bytes())
                .unwrap();
        // SAFETY: valid C string.
        let made =
            unsafe { libc::mknod(null.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
        if made != 0 {
            eprintln!("skipping the device-node half: mknod needs CAP_MKNOD");
            return;
        }
        c.walk(ROOT, 1, &[b"null"]).unwrap();
        assert_eq!(errno(c.lopen(1, of::RDWR).unwrap_err()), libc::ENXIO);
        // Guest-created device nodes are refused as well.
        c.mknod(ROOT, b"zero", libc::S_IFCHR | 0o666, 1, 5, 0)
            .unwrap();
        c.walk(ROOT, 2, &[b"zero"]).unwrap();
        assert_eq!(errno(c.lopen(2, of::RDONLY).unwrap_err()), libc::ENXIO);
        // And Tlcreate without O_EXCL over one.
        c.walk(ROOT, 3, &[]).unwrap();
        assert_eq!(
            errno(c.lcreate(3, b"zero", of::RDONLY, 0o600, 0).unwrap_err()),
            libc::ENXIO
        );
    });
}

#[test]
fn test_escape_fifo_never_opened() {
    attack(|e, c| {
        let fifo =
            std::ffi::CString::new(e.export.join("fifo").into_os_string().into_encoded_bytes())
                .unwrap();
        // SAFETY: valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
        c.walk(ROOT, 1, &[b"fifo"]).unwrap();
        // Opening a fifo for reading would block the server forever.
        assert_eq!(errno(c.lopen(1, of::RDONLY).unwrap_err()), libc::ENXIO);
        assert_eq!(
            errno(c.lopen(1, of::WRONLY | of::NONBLOCK).unwrap_err()),
            libc::ENXIO
        );
    });
}

#[test]
fn test_escape_socket_never_opened() {
    attack(|e, c| {
        let _l = std::os::unix::net::UnixListener::bind(e.export.join("sock")).unwrap();
        c.walk(ROOT, 1, &[b"sock"]).unwrap();
        assert_eq!(errno(c.lopen(1, of::RDWR).unwrap_err()), libc::ENXIO);
    });
}

#[test]
fn test_escape_attrs_through_symlink_do_not_touch_target() {
    attack(|e, c| {
        symlink(e.outside.join("secret"), e.export.join("abs"));
        let before = std::fs::metadata(e.outside.join("secret")).unwrap();
        c.walk(ROOT, 1, &[b"abs"]).unwrap();
        let base = Tsetattr {
            fid: 1,
            valid: SetattrMask::empty(),
            mode: 0o777,
            uid: 4321,
            gid: 4321,
            size: 0,
            atime_sec: 1,
            atime_nsec: 0,
            mtime_sec: 1,
            mtime_nsec: 0,
        };
        assert_eq!(
            errno(
                c.setattr(Tsetattr {
                    valid: SetattrMask::SIZE,
                    ..base.clone()
                })
                .unwrap_err()
            ),
            libc::EINVAL
        );
        c.setattr(Tsetattr {
            valid: SetattrMask::MODE,
            ..base.clone()
        })
        .unwrap();
        c.setattr(Tsetattr {
            valid: SetattrMask::UID | SetattrMask::GID,
            ..base.clone()
        })
        .unwrap();
        c.setattr(Tsetattr {
            valid: SetattrMask::MTIME
                | SetattrMask::MTIME_SET
                | SetattrMask::ATIME
                | SetattrMask::ATIME_SET,
            ..base.clone()
        })
        .unwrap();
        let after = std::fs::metadata(e.outside.join("secret")).unwrap();
        assert_eq!(after.mode(), before.mode());
        assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
        assert_eq!(after.mtime(), before.mtime());
        // getattr describes the link, not the target.
        assert_eq!(c.getattr(1).unwrap().mode & libc::S_IFMT, libc::S_IFLNK);
    });
}

#[test]
fn test_escape_xattrs_through_symlink_refused() {
    attack(|e, c| {
        symlink(e.outside.join("secret"), e.export.join("abs"));
        c.walk(ROOT, 1, &[b"abs"]).unwrap();
        assert_eq!(
            errno(c.set_xattr(1, 2, b"user.evil", b"x", 0).unwrap_err()),
            libc::EPERM
        );
        assert_eq!(
            errno(c.xattrwalk(1, 3, b"user.evil").unwrap_err()),
            libc::ENODATA
        );
        assert!(c.get_xattr(1, 4, b"").unwrap().is_empty());
        let p = std::ffi::CString::new(
            e.outside
                .join("secret")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: valid C strings; size-0 query.
        let n =
            unsafe { libc::getxattr(p.as_ptr(), c"user.evil".as_ptr(), std::ptr::null_mut(), 0) };
        assert_eq!(n, -1, "xattr leaked to the symlink target");
    });
}

#[test]
fn test_escape_attach_with_foreign_aname() {
    attack(|_, c| {
        for aname in [&b"/etc"[..], b"..", b"../outside"] {
            let e = c
                .rpc(&Tmessage::Attach(Tattach {
                    fid: 50,
                    afid: u32::MAX,
                    uname: b"root".to_vec(),
                    aname: aname.to_vec(),
                    n_uname: 0,
                }))
                .unwrap_err();
            assert_eq!(errno(e), libc::ENOENT);
        }
    });
}

#[test]
fn test_escape_swap_dir_for_symlink_after_walk() {
    attack(|e, c| {
        std::fs::create_dir(e.export.join("d")).unwrap();
        std::fs::write(e.export.join("d/f"), b"inside").unwrap();
        c.walk(ROOT, 1, &[b"d"]).unwrap();
        // Swap: d moves away and becomes a symlink to the outside.
        std::fs::rename(e.export.join("d"), e.export.join("d.old")).unwrap();
        symlink(&e.outside, e.export.join("d"));
        // The fid still is the original directory.
        assert_eq!(errno(c.walk(1, 2, &[b"secret"]).unwrap_err()), libc::ENOENT);
        c.walk(1, 3, &[b"f"]).unwrap();
        c.lopen(3, of::RDONLY).unwrap();
        assert_eq!(c.read(3, 0, 100).unwrap(), b"inside");
        c.lopen(1, of::RDONLY | of::DIRECTORY).unwrap();
        let names: Vec<_> = c
            .readdir_all(1, 4096)
            .unwrap()
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert!(!names.contains(&b"secret".to_vec()));
        // A fresh walk by name finds the symlink and stops there.
        assert_eq!(c.walk(ROOT, 4, &[b"d", b"secret"]).unwrap().len(), 1);
    });
}

#[test]
fn test_escape_race_swap_dir_and_symlink_while_walking() {
    attack_with(false, |e, c| {
        std::fs::write(e.outside.join("f"), SECRET).unwrap();
        let dir_a = e.export.join("race.dir");
        std::fs::create_dir(&dir_a).unwrap();
        std::fs::write(dir_a.join("f"), b"inside").unwrap();
        let link_tmp = e.export.join("race.link");
        symlink(&e.outside, &link_tmp);
        let race = e.export.join("race");
        std::fs::rename(&dir_a, &race).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = spawn_exchanger(&race, &link_tmp, stop.clone());
        let mut inside_reads = 0;
        for i in 0..3000u32 {
            let fid = 10 + (i % 2);
            if c.walk(ROOT, fid, &[b"race", b"f"])
                .map(|q| q.len() == 2)
                .unwrap_or(false)
            {
                if c.lopen(fid, of::RDONLY).is_ok() {
                    let data = c.read(fid, 0, 100).unwrap();
                    assert_ne!(data, SECRET, "read the outside file through the race");
                    inside_reads += 1;
                }
                c.clunk(fid).unwrap();
            }
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        assert!(swaps > 0);
        eprintln!(
            "race ({:?}): {swaps} swaps, {inside_reads} reads of the inside file, none outside",
            e.target
        );
        outside_untouched_but_f(e);
    });
}

/// The same race with a fd cache of 2: every use reopens the fid's file by
/// name while the name flips between the directory and a symlink out.
/// A fid walked before the race (its fd closed at once) must reach the
/// directory or answer `ESTALE`, never the outside.
#[test]
fn test_escape_race_swap_while_idle_fds_are_closed() {
    for openat2 in [true, false] {
        let e = env(Target::InProcess { openat2 });
        let mut cfg = PassthroughConfig::new(&e.export);
        cfg.use_openat2 = openat2;
        cfg.max_path_fds = 2;
        let server = server_with(cfg, Config::default());
        let mut c = attached(Box::new(InProcess::new(server, MSIZE as usize)));
        std::fs::write(e.outside.join("f"), SECRET).unwrap();
        let race = e.export.join("race");
        std::fs::create_dir(&race).unwrap();
        std::fs::write(race.join("f"), b"inside").unwrap();
        let link_tmp = e.export.join("race.link");
        symlink(&e.outside, &link_tmp);
        c.walk(ROOT, 2, &[b"race"]).unwrap();
        // Walks elsewhere run the reclaim passes that close the idle
        // directory fid's fd.
        for p in 0..4 {
            std::fs::write(e.export.join(format!("pad{p}")), b"pad").unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = spawn_exchanger(&race, &link_tmp, stop.clone());
        let (mut inside, mut stale) = (0, 0);
        for i in 0..3000u32 {
            for p in [i % 4, (i + 1) % 4] {
                let _ = c.clunk(20 + p);
                c.walk(ROOT, 20 + p, &[format!("pad{p}").as_bytes()])
                    .unwrap();
            }
            let fid = 10 + (i % 2);
            // From the held directory fid: reopened by name when closed.
            match c.walk(2, fid, &[b"f"]) {
                Ok(_) => {
                    if c.lopen(fid, of::RDONLY).is_ok() {
                        assert_eq!(c.read(fid, 0, 100).unwrap(), b"inside");
                        inside += 1;
                    }
                    c.clunk(fid).unwrap();
                }
                Err(err) => {
                    let n = errno(err);
                    assert!(n == libc::ESTALE || n == libc::ENOENT, "errno {n}");
                    stale += 1;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(swapper.join().unwrap() > 0);
        eprintln!("reclaim race (openat2 {openat2}): {inside} inside reads, {stale} refused");
        // Refusals show the directory was closed and looked up again.
        assert!(stale > 0, "the directory fid was never reopened");
        outside_untouched_but_f(&e);
    }
}

fn outside_untouched_but_f(e: &Env) {
    assert_eq!(std::fs::read(e.outside.join("secret")).unwrap(), SECRET);
    assert_eq!(std::fs::read(e.outside.join("f")).unwrap(), SECRET);
}

#[test]
fn test_escape_readonly_export_refuses_changes_through_links() {
    attack_with(true, |e, c| {
        symlink(e.outside.join("secret"), e.export.join("abs"));
        c.walk(ROOT, 1, &[]).unwrap();
        assert_eq!(
            errno(
                c.lcreate(1, b"abs", of::WRONLY | of::TRUNC, 0o600, 0)
                    .unwrap_err()
            ),
            libc::EROFS
        );
        outside_untouched(e);
    });
}

/// Every security model.
const MODELS: [SecurityModel; 3] = [
    SecurityModel::Passthrough,
    SecurityModel::MappedXattr,
    SecurityModel::None,
];

/// Runs `f` in every security model against every target that serves it,
/// then checks the outside directory and (binary targets) that the daemon
/// survived.
fn attack_models(f: impl Fn(&Env, &mut AttackClient, SecurityModel)) {
    for model in MODELS {
        for target in TARGETS {
            let e = env(target);
            let Some((mut c, daemon)) = connect_as(&e, false, model) else {
                continue;
            };
            f(&e, &mut c, model);
            drop(c);
            outside_untouched(&e);
            if let Some(d) = daemon {
                d.assert_alive_then_stop(&format!("{model} {target:?}"));
            }
        }
    }
}

/// Asserts the host state of a file the mapped model created: a regular
/// file (directory when `dir`) of exactly 0600 (0700), owned by the
/// daemon (root here), whose only xattrs are in `user.*`.
fn assert_sealed(p: &Path, dir: bool) {
    let m = std::fs::symlink_metadata(p).unwrap();
    let (kind, perm) = if dir {
        (libc::S_IFDIR, 0o700)
    } else {
        (libc::S_IFREG, 0o600)
    };
    assert_eq!(m.mode() & libc::S_IFMT, kind, "{}", p.display());
    assert_eq!(m.mode() & 0o7777, perm, "{}: {:o}", p.display(), m.mode());
    // SAFETY: plain getters.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    assert_eq!((m.uid(), m.gid()), (uid, gid), "{}", p.display());
    for name in host_xattr_names(p) {
        assert!(
            name.starts_with("user."),
            "{}: host xattr {name}",
            p.display()
        );
    }
}

/// Asserts no host xattr a guest must not place: file capabilities and
/// `trusted.*`.
fn assert_no_privileged_xattrs(p: &Path) {
    for name in host_xattr_names(p) {
        assert!(
            name != "security.capability" && !name.starts_with("trusted."),
            "{}: host xattr {name}",
            p.display()
        );
    }
}

/// A POSIX ACL (`posix_acl_xattr` layout, version 2) granting rwx to the
/// owner, user 1234, the group, the mask and everyone else: an extended
/// ACL, which the kernel stores (a minimal one would only become a mode).
fn acl_rwx_for_all() -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, id) in [
        (0x01u16, u32::MAX),
        (0x02, 1234),
        (0x04, u32::MAX),
        (0x10, u32::MAX),
        (0x20, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&7u16.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// `security.capability` v2 with every capability permitted, effective.
fn every_capability() -> Vec<u8> {
    let mut v = 0x0200_0001u32.to_le_bytes().to_vec();
    for w in [u32::MAX, 0, u32::MAX, 0] {
        v.extend_from_slice(&w.to_le_bytes());
    }
    v
}

/// What a model does with one guest xattr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Lands on the host under the same name.
    Host,
    /// Lands on the host as `user.virtfs.<name>`.
    Mapped,
    /// Refused with this errno; nothing on the host.
    Refused(i32),
}

fn fate(model: SecurityModel, name: &[u8]) -> Fate {
    let security_or_trusted = name.starts_with(b"security.") || name.starts_with(b"trusted.");
    match model {
        SecurityModel::MappedXattr => match name {
            b"user.t" => Fate::Host,
            b"user.virtfs.mode" => Fate::Refused(libc::EACCES),
            b"os2.evil" => Fate::Refused(libc::EOPNOTSUPP),
            _ => Fate::Mapped,
        },
        // As QEMU: none stores no ACLs; neither stores security.* or trusted.*.
        SecurityModel::None if security_or_trusted || name.starts_with(b"system.posix_acl_") => {
            Fate::Refused(libc::EOPNOTSUPP)
        }
        SecurityModel::Passthrough if security_or_trusted => Fate::Refused(libc::EOPNOTSUPP),
        _ if name == b"os2.evil" => Fate::Refused(libc::EOPNOTSUPP),
        _ => Fate::Host,
    }
}

/// Sets each xattr of `names` on guest fid `fid` (host path `p`), checks
/// the answer, the host state and the guest's read-back against [`fate`];
/// returns the names the guest must list.
fn xattr_round(
    c: &mut AttackClient,
    e: &Env,
    model: SecurityModel,
    fid: u32,
    p: &Path,
    names: &[(&[u8], Vec<u8>)],
    next_fid: &mut u32,
) -> Vec<Vec<u8>> {
    let mut listed = Vec::new();
    for (name, value) in names {
        let f = fate(model, name);
        let what = format!(
            "{model} {:?} {} on {}",
            e.target,
            String::from_utf8_lossy(name),
            p.display()
        );
        *next_fid += 2;
        let set = c.set_xattr(fid, *next_fid, name, value, 0);
        let mut mapped = b"user.virtfs.".to_vec();
        mapped.extend_from_slice(name);
        let on_host = host_xattr(p, name);
        let guest_read = c.get_xattr(fid, *next_fid + 1, name);
        match f {
            Fate::Host | Fate::Mapped => {
                set.unwrap_or_else(|err| panic!("{what}: {err}"));
                let stored = if f == Fate::Host {
                    on_host.clone()
                } else {
                    assert_eq!(on_host, None, "{what}: landed on the host");
                    host_xattr(p, &mapped)
                };
                let stored = stored.unwrap_or_else(|| panic!("{what}: not stored"));
                let guest = guest_read.unwrap_or_else(|err| panic!("{what}: read back: {err}"));
                assert_eq!(guest, stored, "{what}");
                if name.starts_with(b"user.") || f == Fate::Mapped {
                    assert_eq!(&guest, value, "{what}");
                }
                listed.push(name.to_vec());
            }
            Fate::Refused(want) => {
                let err = set.expect_err(&what);
                assert_eq!(errno(err), want, "{what}");
                // (user.virtfs.mode exists in mapped-xattr: the daemon's.)
                assert_ne!(on_host.as_ref(), Some(value), "{what}: landed on the host");
                assert_eq!(host_xattr(p, &mapped), None, "{what}: landed mapped");
                assert!(guest_read.is_err(), "{what}: guest reads a refused xattr");
            }
        }
    }
    listed
}

fn guest_list(c: &mut AttackClient, fid: u32, tmp: u32) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = c
        .get_xattr(fid, tmp, b"")
        .unwrap()
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    v.sort();
    v
}

#[test]
fn test_escape_model_xattr_namespaces() {
    attack_models(|e, c, model| {
        c.walk(ROOT, 1, &[]).unwrap();
        c.lcreate(1, b"f", of::RDWR, 0o644, 0).unwrap();
        c.mkdir(ROOT, b"d", 0o755, 0).unwrap();
        c.walk(ROOT, 2, &[b"d"]).unwrap();
        let file_names: Vec<(&[u8], Vec<u8>)> = vec![
            (b"user.t", b"guest value".to_vec()),
            (b"user.virtfs.mode", 0o104777u32.to_le_bytes().to_vec()),
            (b"system.posix_acl_access", acl_rwx_for_all()),
            (b"security.capability", every_capability()),
            (
                b"security.selinux",
                b"system_u:object_r:shadow_t:s0\0".to_vec(),
            ),
            (b"trusted.evil", b"x".to_vec()),
            (b"os2.evil", b"x".to_vec()),
        ];
        let dir_names: Vec<(&[u8], Vec<u8>)> = vec![
            (b"system.posix_acl_access", acl_rwx_for_all()),
            (b"system.posix_acl_default", acl_rwx_for_all()),
            (b"trusted.overlay.opaque", b"y".to_vec()),
        ];
        let mut next = 100;
        let f = e.export.join("f");
        let d = e.export.join("d");
        let mut want_f = xattr_round(c, e, model, 1, &f, &file_names, &mut next);
        let mut want_d = xattr_round(c, e, model, 2, &d, &dir_names, &mut next);
        // Files created in a directory with a guest default ACL.
        c.walk(ROOT, 3, &[b"d"]).unwrap();
        c.lcreate(3, b"inner", of::RDWR, 0o600, 0).unwrap();
        c.mkdir(2, b"sub", 0o700, 0).unwrap();
        if model == SecurityModel::MappedXattr {
            // The guest lists exactly what it set, in its own names.
            want_f.sort();
            want_d.sort();
            assert_eq!(guest_list(c, 1, 90), want_f);
            assert_eq!(guest_list(c, 2, 91), want_d);
            for (p, dir) in [
                (&f, false),
                (&d, true),
                (&d.join("inner"), false),
                (&d.join("sub"), true),
            ] {
                assert_sealed(p, dir);
            }
            // Guest ownership and mode are untouched by the guest's ACLs
            // and by the reserved name it tried.
            let a = c.getattr(1).unwrap();
            assert_eq!(a.mode, libc::S_IFREG | 0o644);
            // Removal (Txattrcreate of size 0 with XATTR_REPLACE) takes
            // the mapped name away; a missing ACL removes fine (as QEMU).
            let replace = libc::XATTR_REPLACE as u32;
            for (i, name) in [&b"security.capability"[..], b"system.posix_acl_access"]
                .into_iter()
                .enumerate()
            {
                c.set_xattr(1, 60 + i as u32, name, b"", replace).unwrap();
                let mut mapped = b"user.virtfs.".to_vec();
                mapped.extend_from_slice(name);
                assert_eq!(host_xattr(&f, &mapped), None);
                assert_eq!(
                    errno(c.xattrwalk(1, 70 + i as u32, name).unwrap_err()),
                    libc::ENODATA
                );
            }
            c.set_xattr(1, 80, b"system.posix_acl_access", b"", replace)
                .unwrap();
            assert_eq!(
                errno(
                    c.set_xattr(1, 81, b"security.capability", b"", replace)
                        .unwrap_err()
                ),
                libc::ENODATA
            );
            assert_eq!(
                errno(
                    c.set_xattr(1, 82, b"user.virtfs.uid", b"", replace)
                        .unwrap_err()
                ),
                libc::EACCES
            );
            assert!(host_xattr(&f, b"user.virtfs.uid").is_some());
        } else {
            assert_eq!(guest_list(c, 1, 90), {
                let mut v = want_f.clone();
                v.sort();
                v
            });
        }
        for p in [&f, &d, &d.join("inner"), &d.join("sub")] {
            if model != SecurityModel::Passthrough {
                assert_no_privileged_xattrs(p);
            }
            // No model lets the guest label host files.
            assert_eq!(host_xattr(p, b"security.selinux"), None, "{}", p.display());
        }
    });
}

/// Guest-visible mode of `fid`.
fn guest_mode(c: &mut AttackClient, fid: u32) -> u32 {
    c.getattr(fid).unwrap().mode
}

fn host_mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode()
}

#[test]
fn test_escape_model_setid_devices_and_world_writable() {
    attack_models(|e, c, model| {
        let x = |n: &str| e.export.join(n);
        // A default ACL the host set on the export root: mapped-xattr
        // files must not inherit it.
        host_set_xattr(&e.export, b"system.posix_acl_default", &acl_rwx_for_all());
        // Tlcreate with set-id bits, world-writable; Tmkdir likewise.
        c.walk(ROOT, 1, &[]).unwrap();
        c.lcreate(1, b"suid", of::RDWR, 0o6777, 0).unwrap();
        c.walk(ROOT, 2, &[]).unwrap();
        c.lcreate(2, b"ww", of::RDWR, 0o666, 0).unwrap();
        c.mkdir(ROOT, b"wdir", 0o3777, 0).unwrap();
        c.walk(ROOT, 3, &[b"wdir"]).unwrap();
        // Tsetattr: ownership, then set-uid; a directory to set-gid.
        c.walk(ROOT, 4, &[]).unwrap();
        c.lcreate(4, b"plain", of::RDWR, 0o644, 0).unwrap();
        c.setattr(Tsetattr {
            valid: SetattrMask::UID | SetattrMask::GID,
            uid: 1234,
            gid: 1234,
            ..setattr_base(4)
        })
        .unwrap();
        c.setattr(Tsetattr {
            valid: SetattrMask::MODE,
            mode: 0o4755,
            ..setattr_base(4)
        })
        .unwrap();
        c.mkdir(ROOT, b"gdir", 0o755, 0).unwrap();
        c.walk(ROOT, 5, &[b"gdir"]).unwrap();
        c.setattr(Tsetattr {
            valid: SetattrMask::MODE,
            mode: 0o2777,
            ..setattr_base(5)
        })
        .unwrap();
        // A file the host put there (0644, root's).
        c.walk(ROOT, 9, &[b"sub", b"inner"]).unwrap();
        c.setattr(Tsetattr {
            valid: SetattrMask::MODE,
            mode: 0o6777,
            ..setattr_base(9)
        })
        .unwrap();
        let inner = host_mode(&x("sub/inner")) & 0o7777;
        let want_inner = match model {
            SecurityModel::MappedXattr => 0o644,
            SecurityModel::None => 0o777,
            _ => 0o6777,
        };
        assert_eq!(inner, want_inner, "{model} {:?}: host-made file", e.target);
        assert_eq!(
            guest_mode(c, 9) & 0o7777,
            if model == SecurityModel::None {
                0o777
            } else {
                0o6777
            }
        );
        // Device nodes.
        let chr = c.mknod(ROOT, b"chr", libc::S_IFCHR | 0o666, 1, 3, 0);
        let blk = c.mknod(ROOT, b"blk", libc::S_IFBLK | 0o666, 7, 0, 0);
        // Tlink and Trenameat keep what the host has.
        c.link(ROOT, 1, b"suid-link").unwrap();
        c.renameat(ROOT, b"suid-link", ROOT, b"suid-moved").unwrap();
        let what = format!("{model} {:?}", e.target);
        match model {
            SecurityModel::MappedXattr => {
                chr.unwrap();
                blk.unwrap();
                for n in ["suid", "ww", "plain", "chr", "blk", "suid-moved"] {
                    assert_sealed(&x(n), false);
                }
                for n in ["wdir", "gdir"] {
                    assert_sealed(&x(n), true);
                }
                // The guest sees exactly what it set.
                assert_eq!(guest_mode(c, 1), libc::S_IFREG | 0o6777, "{what}");
                assert_eq!(guest_mode(c, 2), libc::S_IFREG | 0o666, "{what}");
                assert_eq!(guest_mode(c, 3), libc::S_IFDIR | 0o3777, "{what}");
                let a = c.getattr(4).unwrap();
                assert_eq!((a.mode, a.uid, a.gid), (libc::S_IFREG | 0o4755, 1234, 1234));
                assert_eq!(guest_mode(c, 5), libc::S_IFDIR | 0o2777, "{what}");
                c.walk(ROOT, 6, &[b"chr"]).unwrap();
                let a = c.getattr(6).unwrap();
                assert_eq!(
                    (a.mode, a.rdev),
                    (libc::S_IFCHR | 0o666, libc::makedev(1, 3))
                );
                c.walk(ROOT, 7, &[b"blk"]).unwrap();
                let a = c.getattr(7).unwrap();
                assert_eq!(
                    (a.mode, a.rdev),
                    (libc::S_IFBLK | 0o666, libc::makedev(7, 0))
                );
                // A mapped device is never opened as a device or a file.
                assert_eq!(errno(c.lopen(6, of::RDWR).unwrap_err()), libc::ENXIO);
                // Symlinks: a sealed regular file; Treadlink round-trips.
                c.symlink(ROOT, b"sl", b"/etc/shadow", 0).unwrap();
                assert_sealed(&x("sl"), false);
                c.walk(ROOT, 8, &[b"sl"]).unwrap();
                assert_eq!(c.readlink(8).unwrap(), b"/etc/shadow");
                assert_eq!(guest_mode(c, 8), libc::S_IFLNK | 0o777);
            }
            SecurityModel::None => {
                assert_eq!(errno(chr.unwrap_err()), libc::EPERM, "{what}");
                assert_eq!(errno(blk.unwrap_err()), libc::EPERM, "{what}");
                assert!(!x("chr").exists() && !x("blk").exists(), "{what}");
                // No set-id bit reaches the host; the guest sees the host.
                assert_eq!(host_mode(&x("suid")) & 0o7777, 0o777, "{what}");
                assert_eq!(host_mode(&x("wdir")) & 0o7777, 0o1777, "{what}");
                assert_eq!(host_mode(&x("plain")) & 0o7777, 0o755, "{what}");
                assert_eq!(host_mode(&x("gdir")) & 0o7777, 0o777, "{what}");
                assert_eq!(guest_mode(c, 1), libc::S_IFREG | 0o777, "{what}");
                if matches!(e.target, Target::Binary { .. }) {
                    // No CAP_CHOWN: the failing chown was ignored.
                    assert_eq!(std::fs::metadata(x("plain")).unwrap().uid(), 0, "{what}");
                }
            }
            _ => {
                chr.unwrap();
                blk.unwrap();
                let m = std::fs::symlink_metadata(x("chr")).unwrap();
                assert_eq!(
                    (m.mode() & libc::S_IFMT, m.rdev()),
                    (libc::S_IFCHR, libc::makedev(1, 3))
                );
                let m = std::fs::symlink_metadata(x("blk")).unwrap();
                assert_eq!(
                    (m.mode() & libc::S_IFMT, m.rdev()),
                    (libc::S_IFBLK, libc::makedev(7, 0))
                );
                assert_eq!(host_mode(&x("suid")) & 0o7777, 0o6777, "{what}");
                assert_eq!(host_mode(&x("wdir")) & 0o7777, 0o3777, "{what}");
                let m = std::fs::metadata(x("plain")).unwrap();
                assert_eq!(
                    (m.mode() & 0o7777, m.uid(), m.gid()),
                    (0o4755, 1234, 1234),
                    "{what}"
                );
                assert_eq!(host_mode(&x("gdir")) & 0o7777, 0o2777, "{what}");
            }
        }
        for n in ["suid", "ww", "wdir", "plain", "gdir", "suid-moved"] {
            if model != SecurityModel::Passthrough {
                assert_no_privileged_xattrs(&x(n));
            }
        }
    });
}
