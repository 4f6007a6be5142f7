// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The bytes of a saved inode and the file-handle calls that name it:
//! what `inode_naming.rs` writes and reads back, and what the inode
//! reclaim reopens files by. It uses nothing of the passthrough, so the
//! passthrough's files build on it without importing each other.
//!
//! ```text
//! version u8 (2) | dev u64 | ino u64 | file type u32 (S_IFMT bits)
//! | has path u8 | name count u16 | (length u16 | name)*
//! | handle type i32 | handle length u16 | handle
//! ```
//!
//! Integers are little-endian; at most [`MAX_DEPTH`] names and
//! [`MAX_HANDLE`] handle bytes.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Format version of a saved inode (2: with the file type).
pub(super) const VERSION: u8 = 2;
/// Largest file handle asked for (Linux's `MAX_HANDLE_SZ`).
const MAX_HANDLE: usize = 128;
/// Deepest saved path.
pub(super) const MAX_DEPTH: usize = 255;

/// A saved inode, parsed (see the module docs).
pub(super) struct SavedInode<'a> {
    pub(super) dev: u64,
    pub(super) ino: u64,
    pub(super) ty: u32,
    pub(super) has_path: bool,
    pub(super) names: Vec<&'a [u8]>,
    pub(super) handle_type: i32,
    pub(super) handle: &'a [u8],
}

impl<'a> SavedInode<'a> {
    pub(super) fn parse(b: &'a [u8]) -> Option<SavedInode<'a>> {
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
        let ty = u32::from_le_bytes(take(4)?.try_into().ok()?);
        if ty & !libc::S_IFMT != 0 || ty == 0 {
            return None;
        }
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
            ty,
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
