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

mod common;
mod sandbox_support;

use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{errno, server_with, MSIZE, ROOT};
use sandbox_support::Daemon;
use virtio_9p_server::client::{Client, InProcess, StreamTransport, Transport};
use virtio_9p_server::protocol::{
    open_flags as of, setattr, Tattach, Tmessage, Tsetattr, QTSYMLINK,
};
use virtio_9p_server::{Config, PassthroughConfig};

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
    match e.target {
        Target::InProcess { openat2 } => {
            let mut cfg = PassthroughConfig::new(&e.export);
            cfg.readonly = readonly;
            cfg.use_openat2 = openat2;
            let server = server_with(cfg, Config::default());
            let t = InProcess::new(server, MSIZE as usize);
            Some((attached(Box::new(t)), None))
        }
        Target::Binary { sandbox } => {
            let sock = e.tmp.path().join("9p.sock");
            let extra: &[&str] = if readonly { &["--readonly"] } else { &[] };
            let log = e.tmp.path().join(format!("daemon-{sandbox}.log"));
            let d = sandbox_support::socket_daemon(&e.export, &sock, log, sandbox, extra)?;
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
        assert_eq!(q[0].ty, QTSYMLINK);
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
            errno(c.unlinkat(ROOT, b"../outside/secret", 0).unwrap_err()),
            libc::EINVAL
        );
        assert_eq!(
            errno(c.unlinkat(ROOT, b"..", 0x200).unwrap_err()),
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
            valid: 0,
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
                    valid: setattr::SIZE,
                    ..base.clone()
                })
                .unwrap_err()
            ),
            libc::EINVAL
        );
        c.setattr(Tsetattr {
            valid: setattr::MODE,
            ..base.clone()
        })
        .unwrap();
        c.setattr(Tsetattr {
            valid: setattr::UID | setattr::GID,
            ..base.clone()
        })
        .unwrap();
        c.setattr(Tsetattr {
            valid: setattr::MTIME | setattr::MTIME_SET | setattr::ATIME | setattr::ATIME_SET,
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
        let swapper = {
            let (stop, race, link_tmp, dir_a) =
                (stop.clone(), race.clone(), link_tmp.clone(), dir_a.clone());
            std::thread::spawn(move || {
                let cpath =
                    |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
                let (r, l) = (cpath(&race), cpath(&link_tmp));
                let mut swaps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Atomically exchange "race" (dir) and "race.link" (symlink).
                    // SAFETY: valid C strings.
                    unsafe {
                        libc::renameat2(
                            libc::AT_FDCWD,
                            r.as_ptr(),
                            libc::AT_FDCWD,
                            l.as_ptr(),
                            libc::RENAME_EXCHANGE,
                        )
                    };
                    swaps += 1;
                }
                let _ = dir_a;
                swaps
            })
        };
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
