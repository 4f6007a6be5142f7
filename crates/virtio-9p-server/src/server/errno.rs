// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Linux errno values as Rlerror carries them.

use std::io;

/// Bad file descriptor (unknown fid, fid in use, wrong fid kind).
pub const EBADF: u32 = libc::EBADF as u32;
/// Invalid argument.
pub const EINVAL: u32 = libc::EINVAL as u32;
/// Too many open files (fid table full).
pub const EMFILE: u32 = libc::EMFILE as u32;
/// Too many open files in the system (the server-wide fid limit).
pub const ENFILE: u32 = libc::ENFILE as u32;
/// Out of memory (the xattr byte limits).
pub const ENOMEM: u32 = libc::ENOMEM as u32;
/// Protocol error (request before Tversion, malformed message).
pub const EPROTO: u32 = libc::EPROTO as u32;
/// Value too large (xattr beyond the limit).
pub const E2BIG: u32 = libc::E2BIG as u32;
/// Operation not supported.
pub const EOPNOTSUPP: u32 = libc::EOPNOTSUPP as u32;
/// Reply does not fit.
pub const EMSGSIZE: u32 = libc::EMSGSIZE as u32;
/// Stale file handle (a restored fid whose file is gone or changed).
pub const ESTALE: u32 = libc::ESTALE as u32;
/// Interrupted (a flushed blocking lock).
pub const EINTR: u32 = libc::EINTR as u32;

/// The errno of an I/O error, `EIO` when it has none.
pub fn from_io(e: &io::Error) -> u32 {
    e.raw_os_error()
        .filter(|n| *n > 0)
        .map(|n| n as u32)
        .unwrap_or(libc::EIO as u32)
}
