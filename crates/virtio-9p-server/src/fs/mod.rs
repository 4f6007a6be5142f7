// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The [`Filesystem`] trait the [`Server`](crate::Server) serves, and the
//! [`passthrough`] implementation over a host directory.
//!
//! The server validates every name before it reaches a `Filesystem`
//! (`validate_name`): no empty names, no `/`, no NUL, not `.` or `..`
//! (walks may pass `..` and `.`, which the filesystem resolves without ever
//! leaving its root), at most [`NAME_MAX`](crate::protocol::MAX_NAME_LEN) bytes.

pub mod ids;
pub mod passthrough;

use std::io;

use crate::io::{ReplyWriter, RequestReader};
use crate::protocol::{
    DirEntry, GetattrMask, LockStatus, OpenFlags, Qid, Rgetattr, Rgetlock, Rstatfs, Tgetlock,
    Tlock, Tsetattr, UnlinkFlags,
};

/// Longest file name accepted (Linux `NAME_MAX`).
pub(crate) const NAME_MAX: usize = 255;

/// Who asks: the user of the fid (from Tattach's `n_uname`) and the group
/// a create message names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cred {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// Checks a name that creates or removes a directory entry.
pub(crate) fn validate_name(name: &[u8]) -> io::Result<()> {
    if name.is_empty() || name == b"." || name == b".." {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    validate_walk_name(name)
}

/// Checks a Twalk element: like [`validate_name`] but `.` and `..` pass.
pub(crate) fn validate_walk_name(name: &[u8]) -> io::Result<()> {
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    if name.len() > NAME_MAX {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    Ok(())
}

/// The error of an operation a [`Filesystem`] does not implement:
/// `ENOSYS`.
fn not_implemented<T>() -> io::Result<T> {
    Err(io::Error::from_raw_os_error(libc::ENOSYS))
}

/// The error of an optional feature a [`Filesystem`] does not have
/// (xattrs, locks): `EOPNOTSUPP`.
fn not_supported<T>() -> io::Result<T> {
    Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
}

/// A file tree served over 9P.
///
/// `Inode` is a handle on a file that has not been opened for I/O (a walked
/// fid); `File` an opened one. Every method may block and is called through
/// the caller's [`Blocking`](crate::Blocking) executor, possibly from many
/// threads at once. Names reaching the methods are already validated (see
/// the module docs). Errors are `io::Error`s whose raw OS error becomes the
/// Rlerror errno (`EIO` when there is none).
///
/// # Required and optional methods
///
/// Only [`attach`](Filesystem::attach), [`walk`](Filesystem::walk) and
/// [`getattr`](Filesystem::getattr) are required: with them a guest can
/// mount the tree and look around. Every other method has a default, so a
/// small or special-purpose filesystem implements only what it serves:
///
/// | methods | default answer |
/// |---|---|
/// | `open`, `read`, `readdir`, `readlink`, `statfs`, `fsync` | `ENOSYS` |
/// | `setattr`, `create`, `write`, `mkdir`, `symlink`, `mknod`, `link`, `rename`, `renameat`, `unlinkat`, `remove` | `ENOSYS` |
/// | `getxattr`, `listxattr`, `setxattr`, `removexattr` | `EOPNOTSUPP` (no xattrs) |
/// | `try_lock`, `getlock` | `EOPNOTSUPP` (no locks) |
///
/// A read-only tree implements `open`, `read` and `readdir` on top of the
/// three required methods; [`PassthroughFs`](crate::PassthroughFs)
/// implements everything.
pub trait Filesystem: Send + Sync {
    /// A walked, unopened file.
    type Inode: Clone + Send + Sync;
    /// An opened file or directory.
    type File: Send + Sync;

    /// The root of the tree for Tattach. `aname` is the client's tree name.
    /// Required.
    fn attach(&self, aname: &[u8], cred: Cred) -> io::Result<(Self::Inode, Qid)>;
    /// One walk step; `..` at the root stays at the root. Required.
    fn walk(&self, dir: &Self::Inode, name: &[u8]) -> io::Result<(Self::Inode, Qid)>;
    /// Attributes. Required.
    fn getattr(&self, inode: &Self::Inode, mask: GetattrMask) -> io::Result<Rgetattr>;
    /// Changes attributes; `file` is the open file of the fid, if any.
    fn setattr(
        &self,
        inode: &Self::Inode,
        file: Option<&Self::File>,
        attr: &Tsetattr,
    ) -> io::Result<()> {
        let _ = (inode, file, attr);
        not_implemented()
    }
    /// Filesystem statistics.
    fn statfs(&self, inode: &Self::Inode) -> io::Result<Rstatfs> {
        let _ = inode;
        not_implemented()
    }
    /// Opens with 9P2000.L flags.
    fn open(&self, inode: &Self::Inode, flags: OpenFlags) -> io::Result<(Self::File, Qid)> {
        let _ = (inode, flags);
        not_implemented()
    }
    /// Creates and opens `name` in `dir`.
    fn create(
        &self,
        dir: &Self::Inode,
        name: &[u8],
        flags: OpenFlags,
        mode: u32,
        cred: Cred,
    ) -> io::Result<(Self::Inode, Self::File, Qid)> {
        let _ = (dir, name, flags, mode, cred);
        not_implemented()
    }
    /// Reads up to `count` bytes at `off` into `w`; returns the bytes read.
    fn read<W: ReplyWriter>(
        &self,
        file: &Self::File,
        w: &mut W,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        let _ = (file, w, count, off);
        not_implemented()
    }
    /// Writes `count` bytes from `r` at `off`; returns the bytes written.
    fn write<R: RequestReader>(
        &self,
        file: &Self::File,
        r: &mut R,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        let _ = (file, r, count, off);
        not_implemented()
    }
    /// Lists entries after cookie `offset`, calling `emit` for each until it
    /// returns false (reply full).
    fn readdir(
        &self,
        file: &Self::File,
        offset: u64,
        emit: &mut dyn FnMut(DirEntry) -> bool,
    ) -> io::Result<()> {
        let _ = (file, offset, emit);
        not_implemented()
    }
    /// Flushes to stable storage.
    fn fsync(&self, file: &Self::File, datasync: bool) -> io::Result<()> {
        let _ = (file, datasync);
        not_implemented()
    }
    /// Creates a directory.
    fn mkdir(&self, dir: &Self::Inode, name: &[u8], mode: u32, cred: Cred) -> io::Result<Qid> {
        let _ = (dir, name, mode, cred);
        not_implemented()
    }
    /// Creates a symbolic link (the target is stored, never followed).
    fn symlink(
        &self,
        dir: &Self::Inode,
        name: &[u8],
        target: &[u8],
        cred: Cred,
    ) -> io::Result<Qid> {
        let _ = (dir, name, target, cred);
        not_implemented()
    }
    /// Creates a device node, fifo or socket.
    fn mknod(
        &self,
        dir: &Self::Inode,
        name: &[u8],
        mode: u32,
        rdev: u64,
        cred: Cred,
    ) -> io::Result<Qid> {
        let _ = (dir, name, mode, rdev, cred);
        not_implemented()
    }
    /// Hard-links `target` into `dir` as `name`.
    fn link(&self, target: &Self::Inode, dir: &Self::Inode, name: &[u8]) -> io::Result<()> {
        let _ = (target, dir, name);
        not_implemented()
    }
    /// Reads a symbolic link.
    fn readlink(&self, inode: &Self::Inode) -> io::Result<Vec<u8>> {
        let _ = inode;
        not_implemented()
    }
    /// Moves `inode` into `dir` as `name`.
    fn rename(&self, inode: &Self::Inode, dir: &Self::Inode, name: &[u8]) -> io::Result<()> {
        let _ = (inode, dir, name);
        not_implemented()
    }
    /// Moves `olddir/oldname` to `newdir/newname`.
    fn renameat(
        &self,
        olddir: &Self::Inode,
        oldname: &[u8],
        newdir: &Self::Inode,
        newname: &[u8],
    ) -> io::Result<()> {
        let _ = (olddir, oldname, newdir, newname);
        not_implemented()
    }
    /// Removes `dir/name`; `flags` is empty or [`UnlinkFlags::REMOVEDIR`].
    fn unlinkat(&self, dir: &Self::Inode, name: &[u8], flags: UnlinkFlags) -> io::Result<()> {
        let _ = (dir, name, flags);
        not_implemented()
    }
    /// Removes the file `inode` names.
    fn remove(&self, inode: &Self::Inode) -> io::Result<()> {
        let _ = inode;
        not_implemented()
    }
    /// An extended attribute's value, at most `max` bytes (else `E2BIG`).
    fn getxattr(&self, inode: &Self::Inode, name: &[u8], max: usize) -> io::Result<Vec<u8>> {
        let _ = (inode, name, max);
        not_supported()
    }
    /// The NUL-separated attribute names, at most `max` bytes.
    fn listxattr(&self, inode: &Self::Inode, max: usize) -> io::Result<Vec<u8>> {
        let _ = (inode, max);
        not_supported()
    }
    /// Sets an attribute; `flags` is `XATTR_CREATE`/`XATTR_REPLACE`.
    fn setxattr(
        &self,
        inode: &Self::Inode,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> io::Result<()> {
        let _ = (inode, name, value, flags);
        not_supported()
    }
    /// Removes an attribute.
    fn removexattr(&self, inode: &Self::Inode, name: &[u8]) -> io::Result<()> {
        let _ = (inode, name);
        not_supported()
    }
    /// Tries a byte-range lock without waiting: [`LockStatus::Success`] or
    /// [`LockStatus::Blocked`]. The server builds the blocking variant on
    /// top (see [`crate::Config::lock_wait`]).
    fn try_lock(&self, file: &Self::File, lock: &Tlock) -> io::Result<LockStatus> {
        let _ = (file, lock);
        not_supported()
    }
    /// Tests for a conflicting lock.
    fn getlock(&self, file: &Self::File, lock: &Tgetlock) -> io::Result<Rgetlock> {
        let _ = (file, lock);
        not_supported()
    }
    /// The fd whose open file description holds `file`'s locks, for a
    /// [`LockKeeper`](crate::LockKeeper) to keep across a crash. The
    /// default, `None`: the locks are not kept.
    fn lock_fd<'a>(&self, file: &'a Self::File) -> Option<std::os::fd::BorrowedFd<'a>> {
        let _ = file;
        None
    }
    /// `fd`, a file description a [`LockKeeper`](crate::LockKeeper) kept
    /// across a crash, as the open file of `inode` opened with `flags`:
    /// fails (`EINVAL`) unless it is that same file, opened for the same
    /// access. A keeper's fd is input like any other: check it. The
    /// default, `EOPNOTSUPP`, opens the file again instead.
    fn adopt_file(
        &self,
        inode: &Self::Inode,
        flags: OpenFlags,
        fd: std::os::fd::OwnedFd,
    ) -> io::Result<Self::File> {
        let _ = (inode, flags, fd);
        not_supported()
    }
    /// The filesystem's hint that its metadata calls never block for long:
    /// `getattr`, `walk`, `statfs`, `readlink`, `getxattr`/`listxattr` and
    /// dropping a file or inode (`close`) return within a disk access, as
    /// on a local disk or memory filesystem (ext4, xfs, btrfs, tmpfs,
    /// overlayfs), never waiting on a network peer or a userspace server
    /// (NFS, CIFS, FUSE, 9P, Ceph) that may stop answering.
    ///
    /// The engine decides what to do with it ([`crate::engine`], "What runs
    /// where"): under [`OffloadPolicy::Auto`](crate::engine::OffloadPolicy)
    /// it runs those calls inline on its own thread when this is `true`,
    /// saving a thread hop per call, and on a worker otherwise, so one hung
    /// call never stalls the device. Calls that change the tree, Tlock and
    /// Tfsync always go to a worker. The server asks on every call, so
    /// return a stored value.
    ///
    /// The default, `false`, keeps every call on the workers; a filesystem
    /// that cannot tell should keep it. [`PassthroughFs`](crate::PassthroughFs)
    /// answers from the type of its export root (see
    /// [`PassthroughConfig::inline_metadata`](crate::PassthroughConfig::inline_metadata)).
    fn metadata_is_local(&self) -> bool {
        false
    }

    /// Whether [`Filesystem::read`] reads file data only through the reply
    /// writer's [`ReplyWriter::write_from_file_at`] on an fd of a local
    /// file, so that the writer can place each range itself: under
    /// [`OffloadPolicy::Auto`](crate::engine::OffloadPolicy) the engine
    /// then runs the Tread inline on its own thread and the writer reads a
    /// range that is in the page cache right there (no thread hop), and
    /// hands any other range to a worker. With `false` the whole Tread
    /// runs on a worker.
    ///
    /// The default, `false`, is the safe answer for a filesystem that reads
    /// from the network, through FUSE, or copies its data itself: its
    /// reads never stall the device thread or slip past the teardown
    /// bound. [`PassthroughFs`](crate::PassthroughFs) answers `true`. The
    /// server asks on every Tread, so return a constant or a stored value.
    fn reads_through_writer(&self) -> bool {
        false
    }

    /// Bytes naming `inode` that [`Filesystem::restore_inode`] of another
    /// instance over the same export resolves to the same file: how a
    /// session outlives its daemon
    /// ([`Server::save_session`](crate::Server::save_session)). At most
    /// 8 KiB. The default, `EOPNOTSUPP`, makes such sessions unsavable.
    fn save_inode(&self, inode: &Self::Inode) -> io::Result<Vec<u8>> {
        let _ = inode;
        not_supported()
    }

    /// The inode [`Filesystem::save_inode`] described, with its qid now.
    /// The bytes come from a state file the daemon wrote, but check them
    /// as a guest's input all the same: a file named there must still
    /// lie in the export.
    fn restore_inode(&self, saved: &[u8]) -> io::Result<(Self::Inode, Qid)> {
        let _ = saved;
        not_supported()
    }

    /// Identifies the export, so that a session saved for another one is
    /// refused. The default (empty) matches any.
    fn export_id(&self) -> Vec<u8> {
        Vec::new()
    }

    /// Filesystem-wide state a restarted instance needs to answer as
    /// before, such as a qid remapping table; saved with each session.
    /// The default is none.
    fn save_state(&self) -> Vec<u8> {
        Vec::new()
    }

    /// Takes back what [`Filesystem::save_state`] returned. The default
    /// accepts only an empty state.
    fn restore_state(&self, saved: &[u8]) -> io::Result<()> {
        if saved.is_empty() {
            Ok(())
        } else {
            not_supported()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_validate_name_rejects_bad_names() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"/", b"a\0b"] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            validate_name(&[b'a'; 256]).unwrap_err().raw_os_error(),
            Some(libc::ENAMETOOLONG)
        );
        validate_name(b"ok.txt").unwrap();
        validate_walk_name(b"..").unwrap();
        assert!(validate_walk_name(b"../x").is_err());
    }
}
