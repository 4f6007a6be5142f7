// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! An escape-proof passthrough of a host directory.
//!
//! # How resolution stays inside the export
//!
//! - Every walked file is an `O_PATH` fd ([`Inode`]); nothing is ever
//!   resolved by path string. A walk step opens exactly one validated name
//!   (no `/`, no NUL) relative to its parent fd with `openat2(RESOLVE_BENEATH
//!   | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS)`, or with
//!   `openat(O_NOFOLLOW)` on kernels without `openat2`. Symlinks are never
//!   followed: walking to one yields the link itself, walking further from
//!   it fails with `ENOTDIR`, opening it fails with `ELOOP`.
//! - `..` at the root stays at the root. Elsewhere it is the kernel's `..`
//!   of the directory fd; the guest can only move directories within the
//!   export, so that parent is inside it too. (A host process that moves a
//!   directory out of the export while a guest holds a fid into it takes
//!   that fid with it; the host is trusted.)
//! - Swapping a directory for a symlink after a walk changes nothing: the
//!   fid holds the directory's fd, not its name. Past
//!   [`PassthroughConfig::max_path_fds`] idle fds are closed, and a reopen
//!   keeps only the same `(dev, ino)` (`reclaim.rs`): a swap then answers
//!   `ESTALE`.
//! - Files are opened for I/O by reopening their `O_PATH` fd through
//!   `/proc/self/fd`, and only regular files and directories: device nodes,
//!   fifos and sockets answer `ENXIO` (the QEMU CVE-2023-2861 lesson),
//!   symlinks `ELOOP`.
//! - Creation, link, rename and unlink take a parent directory fd and one
//!   validated name, so they cannot reach outside either.

mod error;
mod inode_naming;
mod mapped;
pub(crate) mod qid;
mod reclaim;
mod saved_inode;
pub(crate) mod sys;

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use log::{debug, info};

use super::ids::IdTranslation;
use super::{Cred, Filesystem};
use crate::io::{ReplyWriter, RequestReader};
use crate::protocol::{
    DirEntry, GetattrMask, LockStatus, LockType, OpenFlags, Qid, QidType, Rgetattr, Rgetlock,
    Rstatfs, SetattrMask, Tgetlock, Tlock, Tsetattr, UnlinkFlags,
};
use sys::check;

pub use error::PassthroughError;

use qid::QidMap;
use reclaim::{CountedFd, FdCache, FdSlot};

/// How guest ownership and modes map onto the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SecurityModel {
    /// Host ownership and modes are the guest's (the server usually runs as
    /// root). Failing chown/chmod are errors. `security.*` and `trusted.*`
    /// xattrs are refused (`EOPNOTSUPP`), as QEMU does.
    #[default]
    Passthrough,
    /// Ownership, mode and device numbers live in `user.virtfs.*` xattrs
    /// (QEMU's layout), and so do the guest's ACLs, `security.*` and
    /// `trusted.*` xattrs; host files stay owned by the server, 0600 (0700
    /// for directories) with only `user.*` xattrs: nothing the guest does
    /// creates host privilege. For untrusted guests.
    MappedXattr,
    /// Like `Passthrough`, but failing chown/chmod are ignored (for a
    /// server without privileges), set-id bits never reach the host, and
    /// device nodes (`EPERM`), ACLs, `security.*` and `trusted.*`
    /// (`EOPNOTSUPP`) are refused.
    None,
}

impl FromStr for SecurityModel {
    type Err = PassthroughError;

    fn from_str(s: &str) -> Result<Self, PassthroughError> {
        match s {
            "passthrough" => Ok(SecurityModel::Passthrough),
            "mapped-xattr" | "mapped" => Ok(SecurityModel::MappedXattr),
            "none" => Ok(SecurityModel::None),
            other => Err(PassthroughError::SecurityModel(other.to_string())),
        }
    }
}

impl fmt::Display for SecurityModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SecurityModel::Passthrough => "passthrough",
            SecurityModel::MappedXattr => "mapped-xattr",
            SecurityModel::None => "none",
        })
    }
}

/// Passthrough settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PassthroughConfig {
    /// The exported directory.
    pub shared_dir: PathBuf,
    /// Refuse every change with `EROFS`.
    pub readonly: bool,
    /// Ownership mapping.
    pub security_model: SecurityModel,
    /// Use `openat2` when the kernel has it (default). When false, every
    /// step uses the `openat(O_NOFOLLOW)` fallback (tests exercise both).
    pub use_openat2: bool,
    /// Hint that metadata calls are local when the export root is on a
    /// local disk or memory filesystem (default true): see
    /// [`PassthroughFs::metadata_is_local`](crate::fs::Filesystem::metadata_is_local).
    /// The type is read once, when the filesystem is built (`fstatfs` of the
    /// root): ext2/3/4, xfs, btrfs, f2fs, zfs, tmpfs, ramfs and overlayfs
    /// count as local, anything else as not. The first time a call meets a
    /// directory on another device (a filesystem mounted below the root),
    /// the hint turns false for good, but that one call (usually the walk
    /// onto the mount) has run inline: set this to false when a network
    /// or FUSE filesystem is mounted below the export root, and every call
    /// stays on a worker.
    pub inline_metadata: bool,
    /// Most `O_PATH` fds kept open for walked files. Past it, the least
    /// recently used are closed and reopened on their next use, by name
    /// in their parent and checked to be the same file, so a guest may
    /// hold more fids than the process has fds. A fid whose file the
    /// host renamed or replaced while its fd was closed answers `ESTALE`
    /// (a regular file is found by its file handle, with
    /// `CAP_DAC_READ_SEARCH`). Default: 256, bounded for an embedding
    /// process ([`PassthroughConfig::sized_to_process`]: half the soft
    /// `RLIMIT_NOFILE`). An open that fails with `EMFILE` or `ENFILE`
    /// closes idle fds and is tried once more.
    pub max_path_fds: usize,
    /// The export's name as the operator gives it (`--export-name`): a
    /// saved session names the export by it, so that a daemon on another
    /// host, exporting the same tree at another path, takes the session
    /// (live migration). `None` (the default): the export is named by its
    /// root's `(dev, ino)`, which only this host's same directory matches.
    pub export_name: Option<String>,
    /// How a restored session finds its files again (`--migration-mode`).
    pub migration_mode: MigrationMode,
}

/// How a restored session finds its fids' files again on the destination
/// of a migration ([`PassthroughConfig::migration_mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MigrationMode {
    /// The file the same `(dev, ino)` is, by its saved path or its file
    /// handle: both daemons see the same filesystem with the same device
    /// numbers (a restart, or a migration between two exports of one
    /// filesystem, such as a bind mount).
    #[default]
    FileHandles,
    /// The file at the saved path below the export, walked with the usual
    /// checks, if it is of the saved type: another host holding the same
    /// tree. A file gone, or of another type, makes its fid answer
    /// `ESTALE`.
    FindPaths,
}

impl FromStr for MigrationMode {
    type Err = PassthroughError;

    fn from_str(s: &str) -> Result<Self, PassthroughError> {
        match s {
            "file-handles" => Ok(MigrationMode::FileHandles),
            "find-paths" => Ok(MigrationMode::FindPaths),
            other => Err(PassthroughError::MigrationMode(other.to_string())),
        }
    }
}

/// Path fds kept by default: bounded for an embedding process.
const EMBEDDED_MAX_PATH_FDS: usize = 256;

/// Half the soft `RLIMIT_NOFILE`, at least 64.
fn process_max_path_fds() -> usize {
    let soft = crate::sys::soft_nofile();
    usize::try_from(soft / 2).unwrap_or(usize::MAX).max(64)
}

/// The filesystem types (`f_type`) whose metadata calls
/// [`PassthroughFs`] reports as local: ext2/3/4, xfs, btrfs, f2fs, zfs,
/// tmpfs, ramfs and overlayfs. Anything else (NFS, CIFS, FUSE, 9P, Ceph, and
/// types this list does not know) keeps every call on a worker.
// libc's magic numbers are `c_long` on most targets, `c_uint` on s390x.
#[allow(clippy::unnecessary_cast)]
const LOCAL_FS_TYPES: [i64; 8] = [
    libc::EXT4_SUPER_MAGIC as i64,
    libc::XFS_SUPER_MAGIC as i64,
    libc::BTRFS_SUPER_MAGIC as i64,
    libc::F2FS_SUPER_MAGIC as i64,
    ZFS_SUPER_MAGIC,
    libc::TMPFS_MAGIC as i64,
    RAMFS_MAGIC,
    libc::OVERLAYFS_SUPER_MAGIC as i64,
];

/// `RAMFS_MAGIC` of `<linux/magic.h>` (libc has no constant for it).
const RAMFS_MAGIC: i64 = 0x8584_58f6;
/// OpenZFS's `ZFS_SUPER_MAGIC` (not in `<linux/magic.h>` nor libc).
const ZFS_SUPER_MAGIC: i64 = 0x2fc1_2fc2;

/// Whether `fs_type` (an `f_type`) is in [`LOCAL_FS_TYPES`].
fn is_local_fs_type(fs_type: i64) -> bool {
    LOCAL_FS_TYPES.contains(&fs_type)
}

impl PassthroughConfig {
    /// Defaults for `shared_dir`: writable, passthrough, `openat2`.
    pub fn new(shared_dir: impl Into<PathBuf>) -> Self {
        PassthroughConfig {
            shared_dir: shared_dir.into(),
            readonly: false,
            security_model: SecurityModel::Passthrough,
            use_openat2: true,
            inline_metadata: true,
            max_path_fds: EMBEDDED_MAX_PATH_FDS,
            export_name: None,
            migration_mode: MigrationMode::default(),
        }
    }

    /// Like [`new`](PassthroughConfig::new), with
    /// [`max_path_fds`](PassthroughConfig::max_path_fds) sized from the
    /// process: half the soft `RLIMIT_NOFILE` now, at least 64 (for a
    /// process that serves nothing else).
    pub fn sized_to_process(shared_dir: impl Into<PathBuf>) -> Self {
        PassthroughConfig {
            max_path_fds: process_max_path_fds(),
            ..PassthroughConfig::new(shared_dir)
        }
    }
}

struct InodeData {
    /// Its `O_PATH` fd, closed and reopened by the [`reclaim`] cache.
    slot: FdSlot,
    /// `S_IFMT` bits of the host file.
    host_type: u32,
    dev: u64,
    ino: u64,
    /// Parent and name, for Tremove and Trename (checked before use).
    link: Mutex<Option<(Inode, Vec<u8>)>>,
}

/// A walked file: an `O_PATH` fd (closed while idle past
/// [`PassthroughConfig::max_path_fds`], reopened on use), shared between
/// fids.
#[derive(Clone)]
pub struct Inode(Arc<InodeData>);

impl fmt::Debug for Inode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inode")
            .field("dev", &self.0.dev)
            .field("ino", &self.0.ino)
            .finish()
    }
}

impl Inode {
    fn is_dir(&self) -> bool {
        self.0.host_type == libc::S_IFDIR
    }

    fn link(&self) -> Option<(Inode, Vec<u8>)> {
        self.0
            .link
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// An opened file or directory.
#[derive(Debug)]
pub struct File {
    fd: OwnedFd,
    /// Serializes seek + getdents of directory reads.
    dir_lock: Mutex<()>,
}

impl File {
    /// The open fd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The passthrough filesystem. See the module docs for its guarantees.
#[derive(Debug)]
pub struct PassthroughFs {
    root: Inode,
    proc_fd: OwnedFd,
    /// Reach `/proc/self/fd/N` as the relative path `N`
    /// ([`PassthroughFs::set_proc_fd_is_cwd`]).
    proc_fd_is_cwd: AtomicBool,
    /// `proc_fd` came from the embedder ([`PassthroughFs::from_fd`]):
    /// path-only calls go through it, not through a `/proc` mount.
    proc_fd_given: bool,
    qids: QidMap,
    cfg: PassthroughConfig,
    /// Guest/host id translation ([`PassthroughFs::with_ids`]).
    ids: IdTranslation,
    /// The answer of `metadata_is_local`: the root is on a
    /// [`LOCAL_FS_TYPES`] filesystem and `cfg.inline_metadata` is set,
    /// and no directory on another filesystem has been met since
    /// ([`PassthroughFs::make_qid`]).
    metadata_local: AtomicBool,
    /// The `O_PATH` fds of walked files ([`reclaim`]).
    fds: FdCache,
    /// The root's fd, which the cache never closes.
    root_fd: RawFd,
}

fn err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

fn qid_type(mode: u32) -> QidType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => QidType::DIR,
        libc::S_IFLNK => QidType::SYMLINK,
        _ => QidType::FILE,
    }
}

fn qid_version(mtime: i64, size: i64) -> u32 {
    (mtime ^ (size << 8)) as u32
}

/// Host `open` flags for 9P2000.L flags. `O_DIRECT`, `O_NOATIME`,
/// `FASYNC` and `O_NOFOLLOW` are dropped (as QEMU does), `O_CREAT` and
/// `O_EXCL` belong to Tlcreate, and `O_CLOEXEC | O_NOCTTY` are always set.
///
/// `O_APPEND` is dropped too: every Twrite carries its offset, and on
/// Linux a positional write to an `O_APPEND` descriptor lands at the end
/// of the file whatever the offset (`pwrite(2)`, BUGS). A client that
/// caches writes (v9fs `cache=mmap` or `loose`) writes a page back at its
/// own offset, again when more is appended to it; on an `O_APPEND`
/// descriptor that copy would be appended a second time and corrupt the
/// file (xfstests generic/069). The client already puts appends at the
/// end: it sends the file's size as the offset.
pub(crate) fn host_open_flags(flags: OpenFlags) -> io::Result<libc::c_int> {
    let mode = flags.access_mode();
    let mut out = if mode == OpenFlags::RDONLY {
        libc::O_RDONLY
    } else if mode == OpenFlags::WRONLY {
        libc::O_WRONLY
    } else if mode == OpenFlags::RDWR {
        libc::O_RDWR
    } else {
        return Err(err(libc::EINVAL));
    };
    for (p9, host) in [
        (OpenFlags::TRUNC, libc::O_TRUNC),
        (OpenFlags::NONBLOCK, libc::O_NONBLOCK),
        (OpenFlags::DSYNC, libc::O_DSYNC),
        (OpenFlags::DIRECTORY, libc::O_DIRECTORY),
        (OpenFlags::SYNC, libc::O_SYNC),
        (OpenFlags::LARGEFILE, libc::O_LARGEFILE),
    ] {
        if flags.contains(p9) {
            out |= host;
        }
    }
    Ok(out | libc::O_CLOEXEC | libc::O_NOCTTY)
}

/// Largest host xattr name list (Linux's `XATTR_LIST_MAX`).
const XATTR_LIST_MAX: usize = 65536;

/// The permission bits a guest mode gives a host file in the passthrough
/// and none models. In none the daemon owns what it creates (it keeps no
/// `CAP_CHOWN`), so set-user-ID and set-group-ID bits would make the
/// daemon's own id runnable by anyone: they never reach the host.
fn host_perm(model: SecurityModel, mode: u32) -> u32 {
    match model {
        SecurityModel::None => mode & 0o1777,
        _ => mode & 0o7777,
    }
}

fn writes(flags: OpenFlags) -> bool {
    flags.access_mode() != OpenFlags::RDONLY || flags.contains(OpenFlags::TRUNC)
}

impl PassthroughFs {
    /// Opens the export. Fails if `shared_dir` is not a directory or
    /// `/proc/self/fd` is unavailable.
    ///
    /// The path-only calls (xattrs, and the fallback of Tlink without
    /// `CAP_DAC_READ_SEARCH`) name files as `/proc/self/fd/N`, so `/proc`
    /// must stay mounted (or [`PassthroughFs::set_proc_fd_is_cwd`] be
    /// set); [`PassthroughFs::from_fd`] needs no `/proc` mount.
    pub fn new(cfg: PassthroughConfig) -> Result<Self, PassthroughError> {
        let path = CString::new(cfg.shared_dir.as_os_str().as_bytes()).map_err(|_| {
            PassthroughError::SharedDir {
                path: cfg.shared_dir.clone(),
                source: err(libc::EINVAL),
            }
        })?;
        let shared = |source| PassthroughError::SharedDir {
            path: cfg.shared_dir.clone(),
            source,
        };
        let fd = sys::open_path(&path, libc::O_PATH | libc::O_DIRECTORY).map_err(shared)?;
        let st = sys::fstat(fd.as_fd()).map_err(shared)?;
        let proc_fd = sys::open_path(c"/proc/self/fd", libc::O_PATH | libc::O_DIRECTORY)
            .map_err(PassthroughError::Proc)?;
        Ok(Self::build(fd, &st, proc_fd, false, cfg))
    }

    /// Serves an already open directory, for an embedder that opens (or
    /// receives) its fds before it jails the device.
    ///
    /// `dir` is an `O_PATH` or an `O_DIRECTORY` fd of the export; the
    /// filesystem reopens it as its own `O_PATH` fd, so the caller keeps
    /// `dir` and may close it. `cfg.shared_dir` is then only the tree name
    /// Tattach accepts besides `""` and `/`.
    ///
    /// `proc_self_fd` is an open `/proc/self/fd` directory of this process
    /// (`O_PATH` or `O_DIRECTORY`), if the embedder has one; it is checked
    /// (a procfs directory that lists this process's fds) and reopened.
    /// Every later call then goes through it: opening files, chmod and
    /// utimes by fd, and on Linux 6.13 or later the xattr calls
    /// (`getxattrat` and friends) and the Tlink fallback, so no `/proc`
    /// mount is needed after this returns. On older kernels the xattr
    /// calls fall back to `/proc/self/fd/N` paths, which need `/proc`
    /// mounted (or [`PassthroughFs::set_proc_fd_is_cwd`]).
    ///
    /// Without `proc_self_fd`, `/proc/self/fd` is opened here (as
    /// [`PassthroughFs::new`] does), so `/proc` must be mounted now; this
    /// fails with [`PassthroughError::Proc`] otherwise. After that it works as with
    /// a given fd.
    ///
    /// [`PassthroughFs::fds`] lists the fds the filesystem holds.
    pub fn from_fd(
        dir: BorrowedFd<'_>,
        proc_self_fd: Option<BorrowedFd<'_>>,
        cfg: PassthroughConfig,
    ) -> Result<Self, PassthroughError> {
        let bad_dir = |source| PassthroughError::SharedDirFd {
            fd: dir.as_raw_fd(),
            source,
        };
        let root = sys::reopen_dir(dir).map_err(bad_dir)?;
        let st = sys::fstat(root.as_fd()).map_err(bad_dir)?;
        let proc_fd = match proc_self_fd {
            Some(p) => {
                let bad_proc = |source| PassthroughError::ProcFd {
                    fd: p.as_raw_fd(),
                    source,
                };
                let proc_fd = sys::reopen_dir(p).map_err(bad_proc)?;
                sys::check_proc_self_fd(proc_fd.as_fd(), root.as_fd(), &st).map_err(bad_proc)?;
                proc_fd
            }
            None => sys::open_path(c"/proc/self/fd", libc::O_PATH | libc::O_DIRECTORY)
                .map_err(PassthroughError::Proc)?,
        };
        Ok(Self::build(root, &st, proc_fd, true, cfg))
    }

    fn build(
        fd: OwnedFd,
        st: &libc::stat64,
        proc_fd: OwnedFd,
        proc_fd_given: bool,
        cfg: PassthroughConfig,
    ) -> Self {
        // Unknown (fstatfs failed) counts as not local.
        let metadata_local =
            cfg.inline_metadata && sys::fs_type(fd.as_fd()).is_ok_and(is_local_fs_type);
        let fds = FdCache::new(cfg.max_path_fds, reclaim::handles_work(fd.as_fd()));
        let root_fd = fd.as_raw_fd();
        // The root has no parent: it is never closed.
        let root = Inode(Arc::new(InodeData {
            slot: FdSlot::new(fds.adopt(fd)),
            host_type: st.st_mode & libc::S_IFMT,
            dev: st.st_dev,
            ino: st.st_ino,
            link: Mutex::new(None),
        }));
        PassthroughFs {
            fds,
            root_fd,
            metadata_local: AtomicBool::new(metadata_local),
            qids: QidMap::new(st.st_dev),
            root,
            proc_fd,
            proc_fd_is_cwd: AtomicBool::new(false),
            proc_fd_given,
            cfg,
            ids: IdTranslation::default(),
        }
    }

    /// The fds the filesystem itself holds for as long as it lives: the
    /// export's root and the `/proc/self/fd` directory. A jailer that
    /// closes every fd it does not know keeps these. (Walked files hold up
    /// to [`PassthroughConfig::max_path_fds`] more, and each open file
    /// one; those come and go with the guest's requests.)
    pub fn fds(&self) -> Vec<RawFd> {
        vec![self.root_fd, self.proc_fd.as_raw_fd()]
    }

    /// Tells the filesystem that the process's current directory is now
    /// `/proc/self/fd` and `/proc` is no longer under `/` (a sandbox that
    /// chroots or pivots into the export after building it does this): the
    /// path-only xattr calls then name a file as `N` instead of
    /// `/proc/self/fd/N`. Off by default.
    pub fn set_proc_fd_is_cwd(&self, yes: bool) {
        self.proc_fd_is_cwd.store(yes, Ordering::Release);
    }

    fn proc_path(&self, fd: BorrowedFd<'_>) -> sys::FdPath {
        sys::proc_path(
            fd,
            self.proc_fd_is_cwd.load(Ordering::Acquire),
            self.proc_fd_given.then(|| self.proc_fd.as_fd()),
        )
    }

    /// Translates guest ids to host ids (credentials of creates, Tsetattr
    /// ownership; forbidden ids answer `EPERM`) and host ids to guest ids
    /// (Tgetattr). No translation by default.
    pub fn with_ids(mut self, ids: IdTranslation) -> Self {
        self.ids = ids;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &PassthroughConfig {
        &self.cfg
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.cfg.readonly {
            Err(err(libc::EROFS))
        } else {
            Ok(())
        }
    }

    fn mapped(&self) -> bool {
        self.cfg.security_model == SecurityModel::MappedXattr
    }

    fn is_root(&self, dev: u64, ino: u64) -> bool {
        dev == self.root.0.dev && ino == self.root.0.ino
    }

    fn make_qid(&self, st: &libc::stat64, mapped_mode: Option<u32>) -> io::Result<Qid> {
        // A directory on another device is a mount below the root, of a
        // type nobody vouched for (an NFS or FUSE mount may hang): from
        // now on every call goes to a worker. Only directories count, as
        // overlayfs reports its files with their layer's device.
        if st.st_dev != self.root.0.dev
            && st.st_mode & libc::S_IFMT == libc::S_IFDIR
            && self.metadata_local.swap(false, Ordering::Relaxed)
        {
            info!(
                "9p: a filesystem is mounted below the export root; metadata calls now run on workers"
            );
        }
        Ok(Qid {
            ty: qid_type(mapped_mode.unwrap_or(st.st_mode)),
            version: qid_version(st.st_mtime, st.st_size),
            path: self.qids.path(st.st_dev, st.st_ino)?,
        })
    }

    /// The directory entry type of `name` in `dir` from its mapped mode, in
    /// the mapped model: a guest symlink, device or fifo is a host regular
    /// file, and a client that trusts the host `DT_REG` would treat it as
    /// one (`ls -F`, `find -type`). `None` when the file has no mapped mode.
    fn mapped_entry_type(&self, dir: BorrowedFd<'_>, name: &[u8]) -> Option<u8> {
        let c = sys::cstr(name).ok()?;
        let fd = sys::open_beneath(dir, &c, libc::O_PATH, 0, self.cfg.use_openat2).ok()?;
        let mode = mapped::read_mode(&self.proc_path(fd.as_fd()))?;
        // DT_* is the S_IFMT type shifted down (the kernel's IFTODT).
        Some(((mode & libc::S_IFMT) >> 12) as u8)
    }

    /// The mapped mode of a host regular file, in the mapped model.
    fn mapped_mode(&self, fd: BorrowedFd<'_>, host_mode: u32) -> Option<u32> {
        if self.mapped() && host_mode & libc::S_IFMT == libc::S_IFREG {
            mapped::read_mode(&self.proc_path(fd))
        } else {
            None
        }
    }

    fn new_inode(&self, fd: CountedFd, link: Option<(Inode, Vec<u8>)>) -> io::Result<(Inode, Qid)> {
        let st = sys::fstat(fd.as_fd())?;
        if self.is_root(st.st_dev, st.st_ino) {
            return Ok((self.root.clone(), self.make_qid(&st, None)?));
        }
        let mm = self.mapped_mode(fd.as_fd(), st.st_mode);
        let qid = self.make_qid(&st, mm)?;
        let reclaimable = link.is_some();
        let inode = Inode(Arc::new(InodeData {
            slot: FdSlot::new(fd),
            host_type: st.st_mode & libc::S_IFMT,
            dev: st.st_dev,
            ino: st.st_ino,
            link: Mutex::new(link),
        }));
        if reclaimable {
            self.fds.register(&inode);
        }
        Ok((inode, qid))
    }

    /// Looks `name` up in `dir` without following symlinks.
    fn lookup(&self, dir: &Inode, name: &[u8]) -> io::Result<(Inode, Qid)> {
        let c = sys::cstr(name)?;
        let dir_fd = self.fd(dir)?;
        let fd = self.adopt_retrying(|| {
            sys::open_beneath(dir_fd.as_fd(), &c, libc::O_PATH, 0, self.cfg.use_openat2)
        })?;
        self.new_inode(fd, Some((dir.clone(), name.to_vec())))
    }

    /// Checks that `parent/name` still is `inode` (for Tremove/Trename).
    fn verify_link(&self, inode: &Inode) -> io::Result<(Inode, CString)> {
        let (parent, name) = inode.link().ok_or_else(|| err(libc::EBUSY))?;
        let c = sys::cstr(&name)?;
        let st = sys::fstatat(self.fd(&parent)?.as_fd(), &c)?;
        if st.st_dev != inode.0.dev || st.st_ino != inode.0.ino {
            return Err(err(libc::ENOENT));
        }
        Ok((parent, c))
    }

    /// Applies ownership (and mode) to a freshly created `dir/name`
    /// according to the security model; removes it again on failure.
    fn finish_create(
        &self,
        dir: &Inode,
        name: &[u8],
        cred: Cred,
        mode: u32,
        rdev: u64,
    ) -> io::Result<(Inode, Qid)> {
        let (inode, _) = self.lookup(dir, name)?;
        let res = self.set_owner(&inode, cred, mode, rdev);
        if let Err(e) = res {
            let c = sys::cstr(name)?;
            let flags = if inode.is_dir() {
                libc::AT_REMOVEDIR
            } else {
                0
            };
            // SAFETY: valid dirfd and C string.
            let _ = unsafe { libc::unlinkat(self.fd(dir)?.as_fd().as_raw_fd(), c.as_ptr(), flags) };
            return Err(e);
        }
        // Qid after the mapped attributes exist.
        let st = sys::fstat(self.fd(&inode)?.as_fd())?;
        let qid = self.make_qid(&st, self.mapped_mode(self.fd(&inode)?.as_fd(), st.st_mode))?;
        Ok((inode, qid))
    }

    fn set_owner(&self, inode: &Inode, cred: Cred, mode: u32, rdev: u64) -> io::Result<()> {
        match self.cfg.security_model {
            SecurityModel::MappedXattr => {
                // Exactly 0600/0700 with no ACL, whatever the host parent
                // passed on (a set-gid bit, a default ACL set on the host).
                let host = if inode.is_dir() {
                    mapped::DIR_MODE
                } else {
                    mapped::FILE_MODE
                };
                self.chmod(inode, host)?;
                mapped::drop_host_acls(&self.proc_path(self.fd(inode)?.as_fd()), inode.is_dir())?;
                let m = mapped::Mapped {
                    uid: Some(cred.uid),
                    gid: Some(cred.gid),
                    mode: Some(mode),
                    rdev: (rdev != 0).then_some(rdev),
                };
                mapped::write(&self.proc_path(self.fd(inode)?.as_fd()), &m)
            }
            model => {
                let chown = self.chown(inode, Some(cred.uid), Some(cred.gid));
                if let Err(e) = chown {
                    if model == SecurityModel::Passthrough {
                        return Err(e);
                    }
                }
                if inode.0.host_type != libc::S_IFLNK {
                    self.chmod(inode, host_perm(model, mode))?;
                }
                Ok(())
            }
        }
    }

    fn chown(&self, inode: &Inode, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
        // SAFETY: valid O_PATH fd with AT_EMPTY_PATH and an empty C string.
        check!(unsafe {
            libc::fchownat(
                self.fd(inode)?.as_fd().as_raw_fd(),
                c"".as_ptr(),
                uid.unwrap_or(u32::MAX),
                gid.unwrap_or(u32::MAX),
                libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
        Ok(())
    }

    fn chmod(&self, inode: &Inode, mode: u32) -> io::Result<()> {
        let fd = self.fd(inode)?;
        let name = sys::cstr(fd.as_fd().as_raw_fd().to_string().as_bytes())?;
        // SAFETY: valid dirfd (/proc/self/fd) and C string; `fd` keeps the
        // name pointing at this inode.
        check!(unsafe { libc::fchmodat(self.proc_fd.as_raw_fd(), name.as_ptr(), mode, 0) })?;
        Ok(())
    }

    /// The guest-visible mode of an inode.
    fn guest_mode(&self, inode: &Inode) -> io::Result<u32> {
        let st = sys::fstat(self.fd(inode)?.as_fd())?;
        Ok(self
            .mapped_mode(self.fd(inode)?.as_fd(), st.st_mode)
            .unwrap_or(st.st_mode))
    }

    fn open_fd(&self, inode: &Inode, flags: libc::c_int) -> io::Result<OwnedFd> {
        let fd = self.fd(inode)?;
        self.retry_out_of_fds(|| sys::reopen(self.proc_fd.as_fd(), fd.as_fd(), flags))
    }

    /// Refuses I/O on anything but regular files and directories.
    fn check_openable(&self, inode: &Inode) -> io::Result<()> {
        match inode.0.host_type {
            libc::S_IFREG | libc::S_IFDIR => {}
            libc::S_IFLNK => return Err(err(libc::ELOOP)),
            _ => return Err(err(libc::ENXIO)),
        }
        if self.mapped() && inode.0.host_type == libc::S_IFREG {
            if let Some(mode) = mapped::read_mode(&self.proc_path(self.fd(inode)?.as_fd())) {
                match mode & libc::S_IFMT {
                    libc::S_IFREG | libc::S_IFDIR => {}
                    libc::S_IFLNK => return Err(err(libc::ELOOP)),
                    _ => return Err(err(libc::ENXIO)),
                }
            }
        }
        Ok(())
    }

    /// Turns the host attributes `a` into the guest's view: the mapped
    /// attributes, then the id translation. In place: `Rgetattr` is 152
    /// bytes, and each move of it is a `memcpy`.
    fn apply_mapped(&self, inode: &Inode, a: &mut Rgetattr) -> io::Result<()> {
        self.apply_mapped_xattrs(inode, a)?;
        self.ids.to_guest_attr(a);
        Ok(())
    }

    /// Overrides ownership, mode and rdev with the mapped attributes.
    fn apply_mapped_xattrs(&self, inode: &Inode, a: &mut Rgetattr) -> io::Result<()> {
        if self.mapped() && inode.0.host_type != libc::S_IFLNK {
            let m = mapped::read(&self.proc_path(self.fd(inode)?.as_fd()));
            a.uid = m.uid.unwrap_or(a.uid);
            a.gid = m.gid.unwrap_or(a.gid);
            if let Some(mode) = m.mode {
                a.mode = mode;
                a.qid.ty = qid_type(mode);
            }
            a.rdev = m.rdev.unwrap_or(a.rdev);
        }
        Ok(())
    }

    fn host_create_mode(&self, mode: u32, dir: bool) -> u32 {
        match self.cfg.security_model {
            SecurityModel::MappedXattr if dir => mapped::DIR_MODE,
            SecurityModel::MappedXattr => mapped::FILE_MODE,
            model => host_perm(model, mode),
        }
    }

    /// The host name of the guest xattr `name` under the security model
    /// (see SECURITY.md), or the errno that refuses it. Mapped-xattr
    /// stores everything under `user.virtfs.*` ([`mapped::host_name`]).
    /// Passthrough and none refuse `security.*` and `trusted.*` with
    /// `EOPNOTSUPP`, and none the ACLs too, as QEMU's local backend does:
    /// so file capabilities, labels and `trusted.*` never land whatever
    /// capabilities the daemon was given (without an LSM the kernel lets
    /// any owner set `security.selinux`). The rest goes to the host.
    fn xattr_name(&self, name: &[u8]) -> io::Result<CString> {
        if name.is_empty() {
            return Err(err(libc::EINVAL));
        }
        let privileged = name.starts_with(b"security.") || name.starts_with(b"trusted.");
        match self.cfg.security_model {
            SecurityModel::MappedXattr => sys::cstr(&mapped::host_name(name).map_err(err)?),
            SecurityModel::None if privileged || name.starts_with(b"system.posix_acl_") => {
                Err(err(libc::EOPNOTSUPP))
            }
            SecurityModel::Passthrough if privileged => Err(err(libc::EOPNOTSUPP)),
            _ => sys::cstr(name),
        }
    }

    fn lock_struct(ty: LockType, start: u64, length: u64) -> io::Result<libc::flock64> {
        let l_type = match ty {
            LockType::Rdlck => libc::F_RDLCK,
            LockType::Wrlck => libc::F_WRLCK,
            LockType::Unlck => libc::F_UNLCK,
        };
        let start = i64::try_from(start).map_err(|_| err(libc::EINVAL))?;
        let len = i64::try_from(length).map_err(|_| err(libc::EINVAL))?;
        // SAFETY: flock64 is plain old data; zeroed is valid (l_pid must be 0
        // for OFD locks).
        let mut fl: libc::flock64 = unsafe { std::mem::zeroed() };
        fl.l_type = l_type as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = start;
        fl.l_len = len;
        Ok(fl)
    }
}

impl Filesystem for PassthroughFs {
    type Inode = Inode;
    type File = File;

    /// True when the export root is on a local filesystem (ext2/3/4, xfs,
    /// btrfs, f2fs, zfs, tmpfs, ramfs, overlayfs; read once at
    /// construction), [`PassthroughConfig::inline_metadata`] is set, and
    /// no call has yet met a directory on another filesystem (a mount
    /// below the root): from the first one on, false for good.
    fn metadata_is_local(&self) -> bool {
        self.metadata_local.load(Ordering::Relaxed)
    }

    /// Every read is a `preadv` of the file's fd through the writer.
    fn reads_through_writer(&self) -> bool {
        true
    }

    fn attach(&self, aname: &[u8], cred: Cred) -> io::Result<(Inode, Qid)> {
        // A forbidden id may not attach.
        self.ids.cred(cred)?;
        let export = self.cfg.shared_dir.as_os_str().as_bytes();
        let canonical = std::fs::canonicalize(&self.cfg.shared_dir).ok();
        let matches_export = aname.is_empty()
            || aname == b"/"
            || aname == export
            || canonical
                .as_deref()
                .map(Path::as_os_str)
                .map(OsStrExt::as_bytes)
                == Some(aname);
        if !matches_export {
            return Err(err(libc::ENOENT));
        }
        let st = sys::fstat(self.fd(&self.root)?.as_fd())?;
        Ok((self.root.clone(), self.make_qid(&st, None)?))
    }

    fn save_inode(&self, inode: &Inode) -> io::Result<Vec<u8>> {
        self.saved_inode(inode)
    }

    fn restore_inode(&self, saved: &[u8]) -> io::Result<(Inode, Qid)> {
        self.inode_from_saved(saved)
    }

    fn export_id(&self) -> Vec<u8> {
        // The export (its name, else its root) and the security model:
        // state saved for another export, or with another model, is
        // refused.
        let mut id = Vec::with_capacity(17);
        match &self.cfg.export_name {
            Some(name) => {
                id.extend_from_slice(b"name:");
                id.extend_from_slice(name.as_bytes());
            }
            None => {
                id.extend_from_slice(&self.root.0.dev.to_le_bytes());
                id.extend_from_slice(&self.root.0.ino.to_le_bytes());
            }
        }
        id.push(self.cfg.security_model as u8);
        id
    }

    fn save_state(&self) -> Vec<u8> {
        self.qids.save()
    }

    fn restore_state(&self, saved: &[u8]) -> io::Result<()> {
        self.qids.restore(saved)
    }

    fn walk(&self, dir: &Inode, name: &[u8]) -> io::Result<(Inode, Qid)> {
        match name {
            b"." => {
                let st = sys::fstat(self.fd(dir)?.as_fd())?;
                Ok((dir.clone(), self.make_qid(&st, None)?))
            }
            b".." => {
                if self.is_root(dir.0.dev, dir.0.ino) {
                    let st = sys::fstat(self.fd(dir)?.as_fd())?;
                    return Ok((self.root.clone(), self.make_qid(&st, None)?));
                }
                let fd = self.adopt_retrying(|| sys::open_parent(self.fd(dir)?.as_fd()))?;
                let st = sys::fstat(fd.as_fd())?;
                if let Some((parent, _)) = dir.link() {
                    if parent.0.dev == st.st_dev && parent.0.ino == st.st_ino {
                        return Ok((parent, self.make_qid(&st, None)?));
                    }
                }
                self.new_inode(fd, None)
            }
            _ => self.lookup(dir, name),
        }
    }

    fn getattr(&self, inode: &Inode, mask: GetattrMask) -> io::Result<Rgetattr> {
        if !mask.contains(GetattrMask::BTIME) {
            // fstat is a little cheaper than statx and has everything else.
            let st = self.fstat_of(inode)?;
            // `nlink_t` is u64 on x86_64 but u32 on aarch64.
            #[allow(clippy::unnecessary_cast)]
            let mut a = Rgetattr {
                valid: GetattrMask::BASIC,
                qid: self.make_qid(&st, None)?,
                mode: st.st_mode,
                uid: st.st_uid,
                gid: st.st_gid,
                nlink: st.st_nlink as u64,
                rdev: st.st_rdev,
                size: st.st_size as u64,
                blksize: st.st_blksize as u64,
                blocks: st.st_blocks as u64,
                atime_sec: st.st_atime as u64,
                atime_nsec: st.st_atime_nsec as u64,
                mtime_sec: st.st_mtime as u64,
                mtime_nsec: st.st_mtime_nsec as u64,
                ctime_sec: st.st_ctime as u64,
                ctime_nsec: st.st_ctime_nsec as u64,
                ..Default::default()
            };
            self.apply_mapped(inode, &mut a)?;
            return Ok(a);
        }
        let st = self.statx_of(inode)?;
        let mut a = Rgetattr {
            valid: GetattrMask::BASIC,
            qid: Qid {
                ty: qid_type(st.stx_mode as u32),
                version: qid_version(st.stx_mtime.tv_sec, st.stx_size as i64),
                path: self.qids.path(
                    libc::makedev(st.stx_dev_major, st.stx_dev_minor),
                    st.stx_ino,
                )?,
            },
            mode: st.stx_mode as u32,
            uid: st.stx_uid,
            gid: st.stx_gid,
            nlink: st.stx_nlink as u64,
            rdev: libc::makedev(st.stx_rdev_major, st.stx_rdev_minor),
            size: st.stx_size,
            blksize: st.stx_blksize as u64,
            blocks: st.stx_blocks,
            atime_sec: st.stx_atime.tv_sec as u64,
            atime_nsec: st.stx_atime.tv_nsec as u64,
            mtime_sec: st.stx_mtime.tv_sec as u64,
            mtime_nsec: st.stx_mtime.tv_nsec as u64,
            ctime_sec: st.stx_ctime.tv_sec as u64,
            ctime_nsec: st.stx_ctime.tv_nsec as u64,
            ..Default::default()
        };
        if st.stx_mask & libc::STATX_BTIME != 0 {
            a.valid |= GetattrMask::BTIME;
            a.btime_sec = st.stx_btime.tv_sec as u64;
            a.btime_nsec = st.stx_btime.tv_nsec as u64;
        }
        self.apply_mapped(inode, &mut a)?;
        Ok(a)
    }

    fn setattr(&self, inode: &Inode, file: Option<&File>, attr: &Tsetattr) -> io::Result<()> {
        let translated;
        let attr = if self.ids.is_identity() {
            attr
        } else {
            translated = self.ids.to_host_setattr(attr)?;
            &translated
        };
        self.check_writable()?;
        let v = attr.valid;
        let model = self.cfg.security_model;
        if model == SecurityModel::MappedXattr
            && inode.0.host_type == libc::S_IFLNK
            && v.intersects(SetattrMask::MODE | SetattrMask::UID | SetattrMask::GID)
        {
            // Mapped attributes cannot be stored on a host symlink.
            return Err(err(libc::EOPNOTSUPP));
        }
        if v.intersects(SetattrMask::MODE) {
            if model == SecurityModel::MappedXattr {
                let cur = self.guest_mode(inode)?;
                let mode = (cur & libc::S_IFMT) | (attr.mode & 0o7777);
                let m = mapped::Mapped {
                    mode: Some(mode),
                    ..Default::default()
                };
                mapped::write(&self.proc_path(self.fd(inode)?.as_fd()), &m)?;
            } else if inode.0.host_type != libc::S_IFLNK {
                let res = self.chmod(inode, host_perm(model, attr.mode));
                if model == SecurityModel::Passthrough {
                    res?;
                }
            }
        }
        if v.intersects(SetattrMask::UID | SetattrMask::GID) {
            let uid = v.intersects(SetattrMask::UID).then_some(attr.uid);
            let gid = v.intersects(SetattrMask::GID).then_some(attr.gid);
            if model == SecurityModel::MappedXattr {
                let m = mapped::Mapped {
                    uid,
                    gid,
                    ..Default::default()
                };
                mapped::write(&self.proc_path(self.fd(inode)?.as_fd()), &m)?;
            } else {
                let res = self.chown(inode, uid, gid);
                if model == SecurityModel::Passthrough {
                    res?;
                }
            }
        }
        if v.intersects(SetattrMask::SIZE) {
            let size = i64::try_from(attr.size).map_err(|_| err(libc::EFBIG))?;
            if inode.0.host_type == libc::S_IFDIR {
                return Err(err(libc::EISDIR));
            }
            if inode.0.host_type != libc::S_IFREG {
                return Err(err(libc::EINVAL));
            }
            let reopened;
            let fd = match file {
                Some(f) => f.fd(),
                None => {
                    reopened = self.open_fd(inode, libc::O_WRONLY)?;
                    reopened.as_fd()
                }
            };
            // SAFETY: plain syscall on a valid fd.
            let res = check!(unsafe { libc::ftruncate64(fd.as_raw_fd(), size) });
            if let Err(e) = res {
                // An fid opened read-only still may truncate (the guest
                // checked permissions): retry through a fresh write fd.
                if e.raw_os_error() == Some(libc::EBADF) || e.raw_os_error() == Some(libc::EINVAL) {
                    let fd = self.open_fd(inode, libc::O_WRONLY)?;
                    // SAFETY: plain syscall on a valid fd.
                    check!(unsafe { libc::ftruncate64(fd.as_raw_fd(), size) })?;
                } else {
                    return Err(e);
                }
            }
        }
        if v.intersects(SetattrMask::ATIME | SetattrMask::MTIME) {
            let ts = |set: SetattrMask, given: SetattrMask, sec: u64, nsec: u64| {
                if !v.intersects(set) {
                    libc::timespec {
                        tv_sec: 0,
                        tv_nsec: libc::UTIME_OMIT,
                    }
                } else if v.intersects(given) {
                    libc::timespec {
                        tv_sec: sec as libc::time_t,
                        tv_nsec: nsec as libc::c_long,
                    }
                } else {
                    libc::timespec {
                        tv_sec: 0,
                        tv_nsec: libc::UTIME_NOW,
                    }
                }
            };
            let times = [
                ts(
                    SetattrMask::ATIME,
                    SetattrMask::ATIME_SET,
                    attr.atime_sec,
                    attr.atime_nsec,
                ),
                ts(
                    SetattrMask::MTIME,
                    SetattrMask::MTIME_SET,
                    attr.mtime_sec,
                    attr.mtime_nsec,
                ),
            ];
            if inode.0.host_type == libc::S_IFLNK {
                let (parent, name) = self.verify_link(inode)?;
                // SAFETY: valid dirfd, C string and two timespecs.
                check!(unsafe {
                    libc::utimensat(
                        self.fd(&parent)?.as_fd().as_raw_fd(),
                        name.as_ptr(),
                        times.as_ptr(),
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                })?;
            } else {
                let fd = self.fd(inode)?;
                let name = sys::cstr(fd.as_fd().as_raw_fd().to_string().as_bytes())?;
                // SAFETY: valid dirfd (/proc/self/fd), C string, timespecs;
                // `fd` keeps the name pointing at this inode.
                check!(unsafe {
                    libc::utimensat(self.proc_fd.as_raw_fd(), name.as_ptr(), times.as_ptr(), 0)
                })?;
            }
        }
        Ok(())
    }

    fn statfs(&self, inode: &Inode) -> io::Result<Rstatfs> {
        let mut st = std::mem::MaybeUninit::<libc::statfs64>::uninit();
        // SAFETY: valid fd and out pointer.
        check!(unsafe { libc::fstatfs64(self.fd(inode)?.as_fd().as_raw_fd(), st.as_mut_ptr()) })?;
        // SAFETY: fstatfs64 succeeded and filled `st`.
        let st = unsafe { st.assume_init() };
        // SAFETY: fsid_t is two c_ints; reading it as bytes is sound.
        let fsid: [u32; 2] = unsafe { std::mem::transmute(st.f_fsid) };
        Ok(Rstatfs {
            ty: st.f_type as u32,
            bsize: st.f_bsize as u32,
            blocks: st.f_blocks,
            bfree: st.f_bfree,
            bavail: st.f_bavail,
            files: st.f_files,
            ffree: st.f_ffree,
            fsid: fsid[0] as u64 | ((fsid[1] as u64) << 32),
            namelen: st.f_namelen as u32,
        })
    }

    fn open(&self, inode: &Inode, flags: OpenFlags) -> io::Result<(File, Qid)> {
        if writes(flags) {
            self.check_writable()?;
        }
        self.check_openable(inode)?;
        let fd = self.open_fd(inode, host_open_flags(flags)?)?;
        let st = sys::fstat(fd.as_fd())?;
        let qid = self.make_qid(&st, self.mapped_mode(self.fd(inode)?.as_fd(), st.st_mode))?;
        Ok((
            File {
                fd,
                dir_lock: Mutex::new(()),
            },
            qid,
        ))
    }

    fn create(
        &self,
        dir: &Inode,
        name: &[u8],
        flags: OpenFlags,
        mode: u32,
        cred: Cred,
    ) -> io::Result<(Inode, File, Qid)> {
        let cred = self.ids.cred(cred)?;
        self.check_writable()?;
        let c = sys::cstr(name)?;
        let host = host_open_flags(flags)? & !libc::O_DIRECTORY;
        let created = sys::open_beneath(
            self.fd(dir)?.as_fd(),
            &c,
            host | libc::O_CREAT | libc::O_EXCL,
            self.host_create_mode(mode, false),
            self.cfg.use_openat2,
        );
        match created {
            Ok(fd) => {
                let full_mode = libc::S_IFREG | (mode & 0o7777);
                let (inode, qid) = self.finish_create(dir, name, cred, full_mode, 0)?;
                Ok((
                    inode,
                    File {
                        fd,
                        dir_lock: Mutex::new(()),
                    },
                    qid,
                ))
            }
            Err(e)
                if e.raw_os_error() == Some(libc::EEXIST) && !flags.contains(OpenFlags::EXCL) =>
            {
                // Plain O_CREAT of an existing file: open it, but only if it
                // is a regular file (never a fifo, device or symlink).
                let (inode, _) = self.lookup(dir, name)?;
                let (file, qid) = self.open(&inode, flags)?;
                Ok((inode, file, qid))
            }
            Err(e) => Err(e),
        }
    }

    fn read<W: ReplyWriter>(
        &self,
        file: &File,
        w: &mut W,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        w.write_from_file_at(file.fd(), count, off)
    }

    fn write<R: RequestReader>(
        &self,
        file: &File,
        r: &mut R,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        if self.cfg.readonly {
            return Err(err(libc::EROFS));
        }
        r.read_to_file_at(file.fd(), count, off)
    }

    fn readdir(
        &self,
        file: &File,
        offset: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> io::Result<()> {
        let _guard = file.dir_lock.lock().unwrap_or_else(|e| e.into_inner());
        let dir_st = sys::fstat(file.fd())?;
        sys::seek(file.fd(), offset)?;
        let mut buf = vec![0u8; 32 << 10];
        loop {
            let n = sys::getdents64(file.fd(), &mut buf)?;
            if n == 0 {
                return Ok(());
            }
            let mut pos = 0;
            while pos + 19 <= n {
                let rec = &buf[pos..n];
                let ino = u64::from_ne_bytes(rec[0..8].try_into().unwrap_or_default());
                let off = u64::from_ne_bytes(rec[8..16].try_into().unwrap_or_default());
                let reclen = u16::from_ne_bytes([rec[16], rec[17]]) as usize;
                let d_type = rec[18];
                if reclen < 19 || reclen > rec.len() {
                    return Err(err(libc::EIO));
                }
                let raw = &rec[19..reclen];
                let name = &raw[..raw.iter().position(|b| *b == 0).unwrap_or(raw.len())];
                pos += reclen;
                let (dev, ino) = if self.qids.multi_device() && name != b"." && name != b".." {
                    match sys::cstr(name).and_then(|c| sys::fstatat(file.fd(), &c)) {
                        Ok(st) => (st.st_dev, st.st_ino),
                        Err(_) => (dir_st.st_dev, ino),
                    }
                } else {
                    (dir_st.st_dev, ino)
                };
                let d_type = if d_type == libc::DT_REG && self.mapped() {
                    self.mapped_entry_type(file.fd(), name).unwrap_or(d_type)
                } else {
                    d_type
                };
                let ty = match d_type {
                    libc::DT_DIR => QidType::DIR,
                    libc::DT_LNK => QidType::SYMLINK,
                    _ => QidType::FILE,
                };
                let entry = DirEntry {
                    qid: Qid {
                        ty,
                        version: 0,
                        path: self.qids.path(dev, ino)?,
                    },
                    offset: off,
                    ty: d_type,
                    name: name.to_vec(),
                };
                if !emit(entry) {
                    return Ok(());
                }
            }
        }
    }

    fn fsync(&self, file: &File, datasync: bool) -> io::Result<()> {
        let fd = file.fd().as_raw_fd();
        if datasync {
            // SAFETY: plain syscall on a valid fd.
            check!(unsafe { libc::fdatasync(fd) })?;
        } else {
            // SAFETY: plain syscall on a valid fd.
            check!(unsafe { libc::fsync(fd) })?;
        }
        Ok(())
    }

    fn mkdir(&self, dir: &Inode, name: &[u8], mode: u32, cred: Cred) -> io::Result<Qid> {
        let cred = self.ids.cred(cred)?;
        self.check_writable()?;
        let c = sys::cstr(name)?;
        // SAFETY: valid dirfd and C string.
        check!(unsafe {
            libc::mkdirat(
                self.fd(dir)?.as_fd().as_raw_fd(),
                c.as_ptr(),
                self.host_create_mode(mode, true),
            )
        })?;
        let full = libc::S_IFDIR | (mode & 0o7777);
        Ok(self.finish_create(dir, name, cred, full, 0)?.1)
    }

    fn symlink(&self, dir: &Inode, name: &[u8], target: &[u8], cred: Cred) -> io::Result<Qid> {
        let cred = self.ids.cred(cred)?;
        self.check_writable()?;
        let c = sys::cstr(name)?;
        let t = sys::cstr(target)?;
        if target.is_empty() || target.len() >= libc::PATH_MAX as usize {
            return Err(err(if target.is_empty() {
                libc::ENOENT
            } else {
                libc::ENAMETOOLONG
            }));
        }
        if self.mapped() {
            let fd = sys::open_beneath(
                self.fd(dir)?.as_fd(),
                &c,
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                mapped::FILE_MODE,
                self.cfg.use_openat2,
            )?;
            let written = crate::sys::pwrite_all(fd.as_fd(), target, 0);
            if !matches!(written, Ok(n) if n == target.len()) {
                // SAFETY: valid dirfd and C string.
                let _ = unsafe { libc::unlinkat(self.fd(dir)?.as_fd().as_raw_fd(), c.as_ptr(), 0) };
                return Err(written.err().unwrap_or_else(|| err(libc::ENOSPC)));
            }
        } else {
            // SAFETY: valid C strings and dirfd.
            check!(unsafe {
                libc::symlinkat(t.as_ptr(), self.fd(dir)?.as_fd().as_raw_fd(), c.as_ptr())
            })?;
        }
        Ok(self
            .finish_create(dir, name, cred, libc::S_IFLNK | 0o777, 0)?
            .1)
    }

    fn mknod(&self, dir: &Inode, name: &[u8], mode: u32, rdev: u64, cred: Cred) -> io::Result<Qid> {
        let cred = self.ids.cred(cred)?;
        self.check_writable()?;
        let c = sys::cstr(name)?;
        let kind = mode & libc::S_IFMT;
        if !matches!(
            kind,
            libc::S_IFREG | libc::S_IFCHR | libc::S_IFBLK | libc::S_IFIFO | libc::S_IFSOCK
        ) {
            return Err(err(libc::EINVAL));
        }
        let (host_mode, host_rdev) = match self.cfg.security_model {
            SecurityModel::MappedXattr => (libc::S_IFREG | mapped::FILE_MODE, 0),
            // The none model creates no host device nodes, whatever
            // capabilities it was given.
            SecurityModel::None if matches!(kind, libc::S_IFCHR | libc::S_IFBLK) => {
                return Err(err(libc::EPERM))
            }
            model => (kind | host_perm(model, mode), rdev),
        };
        // SAFETY: valid dirfd and C string.
        check!(unsafe {
            libc::mknodat(
                self.fd(dir)?.as_fd().as_raw_fd(),
                c.as_ptr(),
                host_mode,
                host_rdev,
            )
        })?;
        let rdev = if matches!(kind, libc::S_IFCHR | libc::S_IFBLK) {
            rdev
        } else {
            0
        };
        Ok(self.finish_create(dir, name, cred, mode, rdev)?.1)
    }

    fn link(&self, target: &Inode, dir: &Inode, name: &[u8]) -> io::Result<()> {
        self.check_writable()?;
        if target.is_dir() {
            return Err(err(libc::EPERM));
        }
        let c = sys::cstr(name)?;
        // SAFETY: valid fds and C strings.
        let res = check!(unsafe {
            libc::linkat(
                self.fd(target)?.as_fd().as_raw_fd(),
                c"".as_ptr(),
                self.fd(dir)?.as_fd().as_raw_fd(),
                c.as_ptr(),
                libc::AT_EMPTY_PATH,
            )
        });
        if let Err(e) = res {
            // Without CAP_DAC_READ_SEARCH AT_EMPTY_PATH fails with ENOENT;
            // link through the fd's /proc entry instead.
            if e.raw_os_error() != Some(libc::ENOENT) || target.0.host_type == libc::S_IFLNK {
                return Err(e);
            }
            let target_fd = self.fd(target)?;
            let p = self.proc_path(target_fd.as_fd());
            // Relative to the /proc/self/fd fd when the embedder gave one
            // (no /proc mount needed), else by path.
            let (from_dir, from) = p.at().unwrap_or((libc::AT_FDCWD, p.path()));
            // SAFETY: valid C strings and dirfds.
            check!(unsafe {
                libc::linkat(
                    from_dir,
                    from.as_ptr(),
                    self.fd(dir)?.as_fd().as_raw_fd(),
                    c.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            })?;
        }
        Ok(())
    }

    fn readlink(&self, inode: &Inode) -> io::Result<Vec<u8>> {
        if inode.0.host_type == libc::S_IFLNK {
            return sys::readlink(self.fd(inode)?.as_fd());
        }
        if self.mapped() && inode.0.host_type == libc::S_IFREG {
            if let Some(mode) = mapped::read_mode(&self.proc_path(self.fd(inode)?.as_fd())) {
                if mode & libc::S_IFMT == libc::S_IFLNK {
                    let fd = self.open_fd(inode, libc::O_RDONLY)?;
                    let mut buf = vec![0u8; libc::PATH_MAX as usize];
                    let n = crate::sys::pread(fd.as_fd(), &mut buf, 0)?;
                    buf.truncate(n);
                    return Ok(buf);
                }
            }
        }
        Err(err(libc::EINVAL))
    }

    fn rename(&self, inode: &Inode, dir: &Inode, name: &[u8]) -> io::Result<()> {
        self.check_writable()?;
        let (parent, oldname) = self.verify_link(inode)?;
        let c = sys::cstr(name)?;
        // SAFETY: valid dirfds and C strings.
        check!(unsafe {
            libc::renameat(
                self.fd(&parent)?.as_fd().as_raw_fd(),
                oldname.as_ptr(),
                self.fd(dir)?.as_fd().as_raw_fd(),
                c.as_ptr(),
            )
        })?;
        *inode.0.link.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((dir.clone(), name.to_vec()));
        Ok(())
    }

    fn renameat(
        &self,
        olddir: &Inode,
        oldname: &[u8],
        newdir: &Inode,
        newname: &[u8],
    ) -> io::Result<()> {
        self.check_writable()?;
        let o = sys::cstr(oldname)?;
        let n = sys::cstr(newname)?;
        // SAFETY: valid dirfds and C strings.
        check!(unsafe {
            libc::renameat(
                self.fd(olddir)?.as_fd().as_raw_fd(),
                o.as_ptr(),
                self.fd(newdir)?.as_fd().as_raw_fd(),
                n.as_ptr(),
            )
        })?;
        Ok(())
    }

    fn unlinkat(&self, dir: &Inode, name: &[u8], flags: UnlinkFlags) -> io::Result<()> {
        self.check_writable()?;
        let c = sys::cstr(name)?;
        let host = if flags.contains(UnlinkFlags::REMOVEDIR) {
            libc::AT_REMOVEDIR
        } else {
            0
        };
        // SAFETY: valid dirfd and C string.
        check!(unsafe { libc::unlinkat(self.fd(dir)?.as_fd().as_raw_fd(), c.as_ptr(), host) })?;
        Ok(())
    }

    fn remove(&self, inode: &Inode) -> io::Result<()> {
        self.check_writable()?;
        let (parent, name) = self.verify_link(inode)?;
        let flags = if inode.is_dir() {
            libc::AT_REMOVEDIR
        } else {
            0
        };
        // SAFETY: valid dirfd and C string.
        check!(unsafe {
            libc::unlinkat(self.fd(&parent)?.as_fd().as_raw_fd(), name.as_ptr(), flags)
        })?;
        Ok(())
    }

    fn getxattr(&self, inode: &Inode, name: &[u8], max: usize) -> io::Result<Vec<u8>> {
        // The path calls would follow a symlink fid's /proc entry to the
        // link's target: symlinks have no xattrs here.
        if inode.0.host_type == libc::S_IFLNK {
            return Err(err(libc::ENODATA));
        }
        let c = match self.xattr_name(name) {
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => return Err(err(libc::ENODATA)),
            other => other?,
        };
        sys::getxattr(&self.proc_path(self.fd(inode)?.as_fd()), &c, max)
    }

    fn listxattr(&self, inode: &Inode, max: usize) -> io::Result<Vec<u8>> {
        if inode.0.host_type == libc::S_IFLNK {
            return Ok(Vec::new());
        }
        let fd = self.fd(inode)?;
        let path = self.proc_path(fd.as_fd());
        if self.mapped() {
            // The hidden and the longer mapped names may push the host
            // list over `max`: read all of it (the kernel's limit).
            let raw = sys::listxattr(&path, XATTR_LIST_MAX)?;
            let list = mapped::filter_list(&raw);
            if list.len() > max {
                return Err(err(libc::E2BIG));
            }
            return Ok(list);
        }
        sys::listxattr(&path, max)
    }

    fn setxattr(&self, inode: &Inode, name: &[u8], value: &[u8], flags: u32) -> io::Result<()> {
        self.check_writable()?;
        if inode.0.host_type == libc::S_IFLNK {
            return Err(err(libc::EPERM));
        }
        let c = self.xattr_name(name)?;
        sys::setxattr(&self.proc_path(self.fd(inode)?.as_fd()), &c, value, flags)
    }

    fn removexattr(&self, inode: &Inode, name: &[u8]) -> io::Result<()> {
        self.check_writable()?;
        if inode.0.host_type == libc::S_IFLNK {
            return Err(err(libc::EPERM));
        }
        let c = self.xattr_name(name)?;
        let res = sys::removexattr(&self.proc_path(self.fd(inode)?.as_fd()), &c);
        match res {
            // As QEMU: removing a mapped ACL that is not there succeeds
            // (the guest kernel does so on chmod).
            Err(e)
                if self.mapped()
                    && mapped::is_acl(name)
                    && e.raw_os_error() == Some(libc::ENODATA) =>
            {
                Ok(())
            }
            other => other,
        }
    }

    fn try_lock(&self, file: &File, l: &Tlock) -> io::Result<LockStatus> {
        let fl = Self::lock_struct(l.ty, l.start, l.length)?;
        // SAFETY: valid fd and flock64 pointer.
        let res = check!(unsafe { libc::fcntl(file.fd().as_raw_fd(), libc::F_OFD_SETLK, &fl) });
        match res {
            Ok(_) => Ok(LockStatus::Success),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {
                debug!("9p: lock {l:?} is held elsewhere");
                Ok(LockStatus::Blocked)
            }
            Err(e) => Err(e),
        }
    }

    fn lock_fd<'a>(&self, file: &'a File) -> Option<BorrowedFd<'a>> {
        Some(file.fd())
    }

    fn adopt_file(&self, inode: &Inode, flags: OpenFlags, fd: OwnedFd) -> io::Result<File> {
        let st = sys::fstat(fd.as_fd())?;
        if st.st_dev != inode.0.dev
            || st.st_ino != inode.0.ino
            || st.st_mode & libc::S_IFMT != inode.0.host_type
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "it is another file (dev {} ino {}, the fid's is dev {} ino {})",
                    st.st_dev, st.st_ino, inode.0.dev, inode.0.ino
                ),
            ));
        }
        // SAFETY: F_GETFL on a valid fd.
        let got = check!(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
        let want = host_open_flags(flags)?;
        if got & libc::O_ACCMODE != want & libc::O_ACCMODE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "it is open for another access mode than the fid",
            ));
        }
        Ok(File {
            fd,
            dir_lock: Mutex::new(()),
        })
    }

    fn getlock(&self, file: &File, l: &Tgetlock) -> io::Result<Rgetlock> {
        let mut fl = Self::lock_struct(l.ty, l.start, l.length)?;
        // SAFETY: valid fd and flock64 pointer.
        check!(unsafe { libc::fcntl(file.fd().as_raw_fd(), libc::F_OFD_GETLK, &mut fl) })?;
        let ty = match fl.l_type as libc::c_int {
            libc::F_RDLCK => LockType::Rdlck,
            libc::F_WRLCK => LockType::Wrlck,
            _ => LockType::Unlck,
        };
        Ok(Rgetlock {
            ty,
            start: fl.l_start as u64,
            length: fl.l_len as u64,
            proc_id: if fl.l_pid > 0 {
                fl.l_pid as u32
            } else {
                l.proc_id
            },
            client_id: l.client_id.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_security_model_parse_and_display() {
        for m in [
            SecurityModel::Passthrough,
            SecurityModel::MappedXattr,
            SecurityModel::None,
        ] {
            assert_eq!(m.to_string().parse::<SecurityModel>().unwrap(), m);
        }
        let e = "bogus".parse::<SecurityModel>().unwrap_err();
        assert!(matches!(&e, PassthroughError::SecurityModel(m) if m == "bogus"));
        assert!(
            e.to_string().contains("unknown security model \"bogus\""),
            "{e}"
        );
    }

    /// Whether `PassthroughFs::new` and `from_fd` of `dir` (with
    /// `inline_metadata` as given) report local metadata.
    fn local_hint(dir: &Path, inline_metadata: bool) -> [bool; 2] {
        let mut cfg = PassthroughConfig::new(dir);
        cfg.inline_metadata = inline_metadata;
        let by_path = PassthroughFs::new(cfg.clone()).unwrap();
        let root = std::fs::File::open(dir).unwrap();
        let by_fd = PassthroughFs::from_fd(root.as_fd(), None, cfg).unwrap();
        [by_path.metadata_is_local(), by_fd.metadata_is_local()]
    }

    #[test]
    fn test_a_mount_below_the_root_turns_metadata_is_local_off() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        std::fs::create_dir(dir.path().join("plain")).unwrap();
        std::fs::create_dir(dir.path().join("mnt")).unwrap();
        let target = CString::new(dir.path().join("mnt").as_os_str().as_bytes()).unwrap();
        // SAFETY: valid NUL-terminated strings; a fresh tmpfs on our own
        // temporary directory.
        let r = unsafe {
            libc::mount(
                c"none".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if r != 0 {
            // Needs CAP_SYS_ADMIN: runs as root (CI), skipped elsewhere.
            eprintln!("mount: {}: skipped", io::Error::last_os_error());
            return;
        }
        let fs = PassthroughFs::new(PassthroughConfig::new(dir.path())).unwrap();
        let root = fs.root.clone();
        fs.walk(&root, b"plain").unwrap();
        assert!(
            fs.metadata_is_local(),
            "a plain subdirectory keeps the hint"
        );
        let walked = fs.walk(&root, b"mnt");
        // SAFETY: unmounts the tmpfs mounted above.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        walked.unwrap();
        assert!(!fs.metadata_is_local(), "a mount below the root clears it");
        fs.walk(&root, b"plain").unwrap();
        assert!(!fs.metadata_is_local(), "for good");
    }

    #[test]
    #[allow(clippy::unnecessary_cast)]
    fn test_metadata_is_local_on_tmpfs_and_ext4_not_on_procfs() {
        // tmpfs: /dev/shm (tmpfs on this machine and in CI containers).
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let shm_root = sys::open_path(
            &CString::new(shm.path().as_os_str().as_bytes()).unwrap(),
            libc::O_PATH,
        )
        .unwrap();
        assert_eq!(
            sys::fs_type(shm_root.as_fd()).unwrap(),
            libc::TMPFS_MAGIC as i64,
            "/dev/shm is not tmpfs here"
        );
        assert_eq!(local_hint(shm.path(), true), [true, true]);
        assert_eq!(local_hint(shm.path(), false), [false, false]);
        // ext4: the source tree's filesystem, when it is ext2/3/4 (it is on
        // the machines this suite runs on; elsewhere this part is skipped
        // with a notice).
        let src = Path::new(env!("CARGO_MANIFEST_DIR"));
        let src_root = std::fs::File::open(src).unwrap();
        if sys::fs_type(src_root.as_fd()).unwrap() == libc::EXT4_SUPER_MAGIC as i64 {
            assert_eq!(local_hint(src, true), [true, true]);
        } else {
            eprintln!("{} is not ext4: the ext4 case is skipped", src.display());
        }
        // procfs is in no allow-list: every call stays on a worker.
        assert_eq!(local_hint(Path::new("/proc/self"), true), [false, false]);
    }

    #[test]
    #[allow(clippy::unnecessary_cast)]
    fn test_only_local_filesystem_types_count_as_local() {
        for local in [
            libc::EXT4_SUPER_MAGIC as i64,
            libc::XFS_SUPER_MAGIC as i64,
            libc::BTRFS_SUPER_MAGIC as i64,
            libc::TMPFS_MAGIC as i64,
            libc::OVERLAYFS_SUPER_MAGIC as i64,
        ] {
            assert!(is_local_fs_type(local), "{local:#x}");
        }
        // NFS, SMB/CIFS, FUSE, 9P, Ceph, AFS, procfs: workers.
        for remote in [
            libc::NFS_SUPER_MAGIC as i64,
            libc::SMB_SUPER_MAGIC as i64,
            0xff53_4d42, // CIFS_SUPER_MAGIC
            0xfe53_4d42, // SMB2_SUPER_MAGIC
            libc::FUSE_SUPER_MAGIC as i64,
            0x0102_1997, // V9FS_MAGIC
            0x00c3_6400, // CEPH_SUPER_MAGIC
            libc::AFS_SUPER_MAGIC as i64,
            libc::PROC_SUPER_MAGIC as i64,
        ] {
            assert!(!is_local_fs_type(remote), "{remote:#x}");
        }
    }

    #[test]
    fn test_host_open_flags_maps_and_rejects() {
        let f = host_open_flags(
            OpenFlags::RDWR | OpenFlags::TRUNC | OpenFlags::DIRECT | OpenFlags::NOATIME,
        )
        .unwrap();
        assert_eq!(f & libc::O_ACCMODE, libc::O_RDWR);
        assert_ne!(f & libc::O_TRUNC, 0);
        assert_eq!(f & libc::O_DIRECT, 0);
        assert_eq!(f & libc::O_NOATIME, 0);
        assert!(host_open_flags(OpenFlags::ACCMODE).is_err());
    }

    #[test]
    fn test_append_open_keeps_writes_at_their_offset() {
        // A guest opens with O_APPEND, then writes a range back at its
        // offset (a cached page written again): the bytes must land there,
        // not at the end of the file.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let flags = host_open_flags(OpenFlags::WRONLY | OpenFlags::APPEND).unwrap();
        assert_eq!(flags & libc::O_APPEND, 0);
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: open of a NUL-terminated path; the result is checked.
        let fd = unsafe { libc::open(c.as_ptr(), flags) };
        assert!(fd >= 0, "{}", io::Error::last_os_error());
        // SAFETY: `fd` was just opened and is owned here alone.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        assert_eq!(crate::sys::pwrite_all(fd.as_fd(), b"ab", 4).unwrap(), 2);
        assert_eq!(std::fs::read(&path).unwrap(), b"0123ab6789");
    }

    #[test]
    fn test_new_rejects_missing_dir() {
        let e = PassthroughFs::new(PassthroughConfig::new("/nonexistent/dir/x")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("cannot open shared directory /nonexistent/dir/x"),
            "{e}"
        );
    }
}
