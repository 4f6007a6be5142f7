// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Naming inodes across a daemon restart
//! ([`Filesystem::save_inode`](crate::fs::Filesystem::save_inode) and
//! `restore_inode`).
//!
//! A saved inode is its path below the export (the names the guest walked,
//! kept in each inode's link to its parent), its `(dev, ino)`, and a file
//! handle (`name_to_handle_at`) when the export's filesystem gives one.
//! Restoring walks the path again with the usual checks (no symlink
//! followed, nothing outside the export) and keeps the result if it is
//! the same `(dev, ino)`. Otherwise (renamed or unlinked on the host
//! meanwhile, or an open file that was unlinked) the handle is tried:
//! `open_by_handle_at` needs `CAP_DAC_READ_SEARCH`, and only a
//! non-directory on the export's device with the saved inode number is
//! accepted from it, so a handle cannot open a directory tree outside
//! the export.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use super::{err, sys, Inode, PassthroughFs};
use crate::protocol::Qid;

/// Format version of a saved inode.
const VERSION: u8 = 1;
/// Largest file handle asked for (Linux's `MAX_HANDLE_SZ`).
const MAX_HANDLE: usize = 128;
/// Deepest saved path.
const MAX_DEPTH: usize = 255;

impl PassthroughFs {
    pub(super) fn saved_inode(&self, inode: &Inode) -> io::Result<Vec<u8>> {
        let mut names = Vec::new();
        let mut cur = inode.clone();
        let mut has_path = true;
        while !self.is_root(cur.0.dev, cur.0.ino) {
            match cur.link() {
                Some((parent, name)) if names.len() < MAX_DEPTH => {
                    names.push(name);
                    cur = parent;
                }
                _ => {
                    has_path = false;
                    names.clear();
                    break;
                }
            }
        }
        names.reverse();
        let mut out = vec![VERSION];
        out.extend_from_slice(&inode.0.dev.to_le_bytes());
        out.extend_from_slice(&inode.0.ino.to_le_bytes());
        out.push(u8::from(has_path));
        out.extend_from_slice(&(names.len() as u16).to_le_bytes());
        for n in &names {
            out.extend_from_slice(&(n.len() as u16).to_le_bytes());
            out.extend_from_slice(n);
        }
        let (ty, handle) = file_handle(self.fd(inode)?.as_fd()).unwrap_or((0, Vec::new()));
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&(handle.len() as u16).to_le_bytes());
        out.extend_from_slice(&handle);
        Ok(out)
    }

    pub(super) fn inode_from_saved(&self, saved: &[u8]) -> io::Result<(Inode, Qid)> {
        let s = SavedInode::parse(saved).ok_or_else(|| err(libc::EINVAL))?;
        if s.has_path {
            let mut cur = (self.root.clone(), Qid::default());
            let mut walked = Ok(());
            for name in &s.names {
                crate::fs::validate_name(name)?;
                match self.lookup(&cur.0, name) {
                    Ok(next) => cur = next,
                    Err(e) => {
                        walked = Err(e);
                        break;
                    }
                }
            }
            if walked.is_ok() && cur.0 .0.dev == s.dev && cur.0 .0.ino == s.ino {
                if s.names.is_empty() {
                    let st = sys::fstat(self.fd(&cur.0)?.as_fd())?;
                    return Ok((cur.0, self.make_qid(&st, None)?));
                }
                return Ok(cur);
            }
        }
        // Renamed or unlinked since: the handle, for a file only.
        if s.handle.is_empty() || s.dev != self.root.0.dev {
            return Err(err(libc::ENOENT));
        }
        let fd = open_handle(self.fd(&self.root)?.as_fd(), s.handle_type, s.handle)?;
        let st = sys::fstat(fd.as_fd())?;
        if st.st_dev != s.dev || st.st_ino != s.ino || st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            return Err(err(libc::ESTALE));
        }
        self.new_inode(self.fds.adopt(fd), None)
    }
}

struct SavedInode<'a> {
    dev: u64,
    ino: u64,
    has_path: bool,
    names: Vec<&'a [u8]>,
    handle_type: i32,
    handle: &'a [u8],
}

impl<'a> SavedInode<'a> {
    fn parse(b: &'a [u8]) -> Option<SavedInode<'a>> {
        let mut r = b;
        let mut take = |n: usize| -> Option<&'a [u8]> {
            if r.len() < n {
                return None;
            }
            let (h, t) = r.split_at(n);
            r = t;
            Some(h)
        };
        if take(1)?[0] != VERSION {
            return None;
        }
        let dev = u64::from_le_bytes(take(8)?.try_into().ok()?);
        let ino = u64::from_le_bytes(take(8)?.try_into().ok()?);
        let has_path = take(1)?[0] != 0;
        let n = usize::from(u16::from_le_bytes(take(2)?.try_into().ok()?));
        if n > MAX_DEPTH {
            return None;
        }
        let mut names = Vec::with_capacity(n);
        for _ in 0..n {
            let len = usize::from(u16::from_le_bytes(take(2)?.try_into().ok()?));
            names.push(take(len)?);
        }
        let handle_type = i32::from_le_bytes(take(4)?.try_into().ok()?);
        let len = usize::from(u16::from_le_bytes(take(2)?.try_into().ok()?));
        if len > MAX_HANDLE {
            return None;
        }
        let handle = take(len)?;
        if !r.is_empty() {
            return None;
        }
        Some(SavedInode {
            dev,
            ino,
            has_path,
            names,
            handle_type,
            handle,
        })
    }
}

/// The file handle of the file `fd` names (`name_to_handle_at`), if its filesystem
/// has them.
pub(super) fn file_handle(fd: std::os::fd::BorrowedFd<'_>) -> Option<(i32, Vec<u8>)> {
    // file_handle: u32 handle_bytes, i32 handle_type, then the bytes; a
    // u32 buffer keeps it aligned.
    let mut buf = [0u32; 2 + MAX_HANDLE / 4];
    buf[0] = MAX_HANDLE as u32;
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `buf` is a file_handle header with room for MAX_HANDLE
    // bytes as handle_bytes says; the path is an empty C string used with
    // AT_EMPTY_PATH on a valid fd; the kernel writes only within them.
    let r = unsafe {
        libc::name_to_handle_at(
            fd.as_raw_fd(),
            c"".as_ptr(),
            buf.as_mut_ptr().cast(),
            &mut mount_id,
            libc::AT_EMPTY_PATH,
        )
    };
    if r != 0 {
        return None;
    }
    let len = (buf[0] as usize).min(MAX_HANDLE);
    let ty = buf[1] as i32;
    let bytes: Vec<u8> = buf[2..].iter().flat_map(|w| w.to_ne_bytes()).collect();
    Some((ty, bytes[..len].to_vec()))
}

/// Opens a saved file handle as `O_PATH` (needs `CAP_DAC_READ_SEARCH`).
pub(super) fn open_handle(
    mount: std::os::fd::BorrowedFd<'_>,
    ty: i32,
    handle: &[u8],
) -> io::Result<OwnedFd> {
    let mut buf = [0u32; 2 + MAX_HANDLE / 4];
    buf[0] = handle.len() as u32;
    buf[1] = ty as u32;
    let mut bytes = [0u8; MAX_HANDLE];
    bytes[..handle.len()].copy_from_slice(handle);
    for (i, w) in buf[2..].iter_mut().enumerate() {
        *w = u32::from_ne_bytes(bytes[i * 4..i * 4 + 4].try_into().unwrap_or_default());
    }
    // The mount fd cannot be an O_PATH fd: open the directory for real.
    // SAFETY: a valid dirfd and C string; the fd returned is checked.
    let dir = unsafe {
        libc::openat(
            mount.as_raw_fd(),
            c".".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dir < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd we own.
    let dir = unsafe { OwnedFd::from_raw_fd(dir) };
    // SAFETY: `buf` is a file_handle of `handle.len()` (<= MAX_HANDLE)
    // bytes; the kernel only reads it. The mount fd is valid.
    let fd = unsafe {
        libc::open_by_handle_at(
            dir.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
