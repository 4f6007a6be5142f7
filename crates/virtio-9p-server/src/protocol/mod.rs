// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The 9P2000.L wire protocol: message types, strict decoding and encoding.
//!
//! Every message is `size[4] type[1] tag[2] body`. [`Tmessage`] holds the
//! requests a client sends and [`Rmessage`] the replies. Decoding is strict:
//! the declared size must match the bytes, stay within the negotiated msize,
//! strings must fit and carry no NUL, walks have at most [`MAXWELEM`] names,
//! counts must match their payload and no trailing bytes are accepted.
//!
//! ```
//! use virtio_9p_server::protocol::{Tmessage, Tversion};
//!
//! let msg = Tmessage::Version(Tversion { msize: 8192, version: b"9P2000.L".to_vec() });
//! let frame = msg.encode_frame(0xffff);
//! let (tag, back) = Tmessage::decode_frame(&frame, 8192).unwrap();
//! assert_eq!((tag, back), (0xffff, msg));
//! ```

mod messages;
pub mod wire;

pub use messages::*;

use thiserror::Error;

/// Size of the common header: `size[4] type[1] tag[2]`.
pub const HEADER_SIZE: usize = 7;
/// Bytes of a Twrite/Rread message before its data: QEMU's and Linux's
/// `P9_IOHDRSZ`. The data of one Tread/Twrite is at most `msize - IOHDRSZ`.
pub const IOHDRSZ: u32 = 24;
/// Smallest msize a client may negotiate (QEMU and Linux agree on 4096).
pub const MIN_MSIZE: u32 = 4096;
/// Largest msize this crate supports: 128 MiB.
pub const MAX_MSIZE: u32 = 128 << 20;
/// Most names in one Twalk (`MAXWELEM` in Plan 9 and Linux).
pub const MAXWELEM: usize = 16;
/// Longest string the encoder writes: the 16-bit length field.
pub const MAX_STRING_LEN: usize = u16::MAX as usize;
/// Longest file or xattr name a request may carry (Linux `NAME_MAX` and
/// `XATTR_NAME_MAX`); longer ones are refused at decode.
pub const MAX_NAME_LEN: usize = 255;
/// Longest path-like string a request may carry (symlink target, uname,
/// aname, lock client id, version): Linux `PATH_MAX`.
pub const MAX_PATH_LEN: usize = 4096;
/// Size of an encoded qid.
pub const QID_SIZE: usize = 13;
/// The tag of a Tversion, which has no tag.
pub const NOTAG: u16 = 0xffff;
/// The "no fid" value (afid of an unauthenticated Tattach).
pub const NOFID: u32 = 0xffff_ffff;
/// The only protocol version this server speaks.
pub const VERSION_9P2000_L: &[u8] = b"9P2000.L";
/// The version string a server answers when it does not know the client's.
pub const VERSION_UNKNOWN: &[u8] = b"unknown";

/// Qid type bit: a directory.
pub const QTDIR: u8 = 0x80;
/// Qid type bit: a symbolic link.
pub const QTSYMLINK: u8 = 0x02;
/// Qid type: a plain file.
pub const QTFILE: u8 = 0x00;

/// Tgetattr/Rgetattr mask bits (`P9_GETATTR_*`).
pub mod getattr {
    /// `mode` is valid.
    pub const MODE: u64 = 0x0000_0001;
    /// `nlink` is valid.
    pub const NLINK: u64 = 0x0000_0002;
    /// `uid` is valid.
    pub const UID: u64 = 0x0000_0004;
    /// `gid` is valid.
    pub const GID: u64 = 0x0000_0008;
    /// `rdev` is valid.
    pub const RDEV: u64 = 0x0000_0010;
    /// `atime` is valid.
    pub const ATIME: u64 = 0x0000_0020;
    /// `mtime` is valid.
    pub const MTIME: u64 = 0x0000_0040;
    /// `ctime` is valid.
    pub const CTIME: u64 = 0x0000_0080;
    /// `qid.path` (inode) is valid.
    pub const INO: u64 = 0x0000_0100;
    /// `size` is valid.
    pub const SIZE: u64 = 0x0000_0200;
    /// `blocks` is valid.
    pub const BLOCKS: u64 = 0x0000_0400;
    /// `btime` is valid.
    pub const BTIME: u64 = 0x0000_0800;
    /// `gen` is valid.
    pub const GEN: u64 = 0x0000_1000;
    /// `data_version` is valid.
    pub const DATA_VERSION: u64 = 0x0000_2000;
    /// Everything `stat` returns.
    pub const BASIC: u64 = 0x0000_07ff;
    /// Everything.
    pub const ALL: u64 = 0x0000_3fff;
}

/// Tsetattr valid bits (`P9_ATTR_*`).
pub mod setattr {
    /// Set the mode.
    pub const MODE: u32 = 1 << 0;
    /// Set the owner.
    pub const UID: u32 = 1 << 1;
    /// Set the group.
    pub const GID: u32 = 1 << 2;
    /// Truncate or extend.
    pub const SIZE: u32 = 1 << 3;
    /// Set atime (to now unless `ATIME_SET`).
    pub const ATIME: u32 = 1 << 4;
    /// Set mtime (to now unless `MTIME_SET`).
    pub const MTIME: u32 = 1 << 5;
    /// Update ctime.
    pub const CTIME: u32 = 1 << 6;
    /// atime comes from the message.
    pub const ATIME_SET: u32 = 1 << 7;
    /// mtime comes from the message.
    pub const MTIME_SET: u32 = 1 << 8;
}

/// Tlopen/Tlcreate flags (`P9_DOTL_*`, the x86 Linux `O_*` values).
pub mod open_flags {
    /// Access mode mask.
    pub const ACCMODE: u32 = 0o3;
    /// Read only.
    pub const RDONLY: u32 = 0o0;
    /// Write only.
    pub const WRONLY: u32 = 0o1;
    /// Read and write.
    pub const RDWR: u32 = 0o2;
    /// Create.
    pub const CREATE: u32 = 0o100;
    /// Fail if it exists.
    pub const EXCL: u32 = 0o200;
    /// No controlling terminal.
    pub const NOCTTY: u32 = 0o400;
    /// Truncate.
    pub const TRUNC: u32 = 0o1000;
    /// Append.
    pub const APPEND: u32 = 0o2000;
    /// Non-blocking.
    pub const NONBLOCK: u32 = 0o4000;
    /// Data sync.
    pub const DSYNC: u32 = 0o10000;
    /// Async I/O signals.
    pub const FASYNC: u32 = 0o20000;
    /// Direct I/O.
    pub const DIRECT: u32 = 0o40000;
    /// Large file.
    pub const LARGEFILE: u32 = 0o100000;
    /// Must be a directory.
    pub const DIRECTORY: u32 = 0o200000;
    /// Do not follow symlinks.
    pub const NOFOLLOW: u32 = 0o400000;
    /// Do not update atime.
    pub const NOATIME: u32 = 0o1000000;
    /// Close on exec.
    pub const CLOEXEC: u32 = 0o2000000;
    /// Full sync.
    pub const SYNC: u32 = 0o4000000;
}

/// Tlock types, flags and Rlock status values.
pub mod lock {
    /// Read (shared) lock.
    pub const TYPE_RDLCK: u8 = 0;
    /// Write (exclusive) lock.
    pub const TYPE_WRLCK: u8 = 1;
    /// Unlock.
    pub const TYPE_UNLCK: u8 = 2;
    /// The client waits for the lock (F_SETLKW).
    pub const FLAGS_BLOCK: u32 = 1;
    /// Reclaim after a server restart.
    pub const FLAGS_RECLAIM: u32 = 2;
    /// Granted.
    pub const SUCCESS: u8 = 0;
    /// Held by someone else; the client retries.
    pub const BLOCKED: u8 = 1;
    /// Failed.
    pub const ERROR: u8 = 2;
    /// Server in grace period.
    pub const GRACE: u8 = 3;
}

/// Tunlinkat flag: remove a directory (`AT_REMOVEDIR`).
pub const AT_REMOVEDIR: u32 = 0x200;

/// A qid: the server's unique identity of a file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Qid {
    /// `QTDIR`, `QTSYMLINK` or `QTFILE`.
    pub ty: u8,
    /// Version, changing when the file changes.
    pub version: u32,
    /// Unique path (inode) number.
    pub path: u64,
}

impl Qid {
    /// Wire form.
    pub fn to_bytes(&self) -> [u8; QID_SIZE] {
        let mut out = [0u8; QID_SIZE];
        out[0] = self.ty;
        out[1..5].copy_from_slice(&self.version.to_le_bytes());
        out[5..13].copy_from_slice(&self.path.to_le_bytes());
        out
    }

    /// From the wire form.
    pub fn from_bytes(b: &[u8; QID_SIZE]) -> Self {
        let mut v = [0u8; 4];
        v.copy_from_slice(&b[1..5]);
        let mut p = [0u8; 8];
        p.copy_from_slice(&b[5..13]);
        Qid {
            ty: b[0],
            version: u32::from_le_bytes(v),
            path: u64::from_le_bytes(p),
        }
    }
}

/// The fixed header of every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Whole message size, header included.
    pub size: u32,
    /// Message type.
    pub ty: u8,
    /// Request tag.
    pub tag: u16,
}

impl Header {
    /// Parses the 7 header bytes.
    pub fn from_bytes(b: &[u8; HEADER_SIZE]) -> Self {
        Header {
            size: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            ty: b[4],
            tag: u16::from_le_bytes([b[5], b[6]]),
        }
    }

    /// Wire form.
    pub fn to_bytes(&self) -> [u8; HEADER_SIZE] {
        let mut out = [0u8; HEADER_SIZE];
        out[0..4].copy_from_slice(&self.size.to_le_bytes());
        out[4] = self.ty;
        out[5..7].copy_from_slice(&self.tag.to_le_bytes());
        out
    }

    /// Checks the declared size against the header size and `msize`.
    pub fn check_size(&self, msize: u32) -> Result<(), DecodeError> {
        if (self.size as usize) < HEADER_SIZE {
            return Err(DecodeError::SizeTooSmall(self.size));
        }
        if self.size > msize {
            return Err(DecodeError::SizeOverMsize {
                size: self.size,
                msize,
            });
        }
        Ok(())
    }
}

/// Why a message could not be decoded. Each maps to an errno for Rlerror
/// through [`DecodeError::errno`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// Fewer than 7 bytes.
    #[error("message of {0} bytes is shorter than the 7-byte header")]
    ShortFrame(usize),
    /// The size field is below the header size.
    #[error("declared size {0} is smaller than the header")]
    SizeTooSmall(u32),
    /// The size field is above the negotiated msize.
    #[error("declared size {size} exceeds msize {msize}")]
    SizeOverMsize {
        /// Declared size.
        size: u32,
        /// Negotiated msize.
        msize: u32,
    },
    /// The size field disagrees with the bytes supplied.
    #[error("declared size {declared} but {actual} bytes supplied")]
    SizeMismatch {
        /// Declared size.
        declared: u32,
        /// Bytes in the frame.
        actual: usize,
    },
    /// A type this side does not know (or a reply type in a request).
    #[error("unknown message type {0}")]
    UnknownType(u8),
    /// A 9P2000 or 9P2000.u message that 9P2000.L does not use.
    #[error("message type {0} is not part of 9P2000.L")]
    NotDotL(u8),
    /// The body ended early.
    #[error("message truncated: needed {needed} bytes, {left} left")]
    Truncated {
        /// Bytes the field needed.
        needed: usize,
        /// Bytes left.
        left: usize,
    },
    /// Bytes after the last field.
    #[error("{0} trailing bytes after the message body")]
    TrailingBytes(usize),
    /// A string with a NUL byte.
    #[error("string contains a NUL byte")]
    NulInString,
    /// A Twalk with more than [`MAXWELEM`] names (or Rwalk qids).
    #[error("walk of {0} elements exceeds the limit of 16")]
    TooManyWalkElements(u16),
    /// A file name longer than [`MAX_NAME_LEN`].
    #[error("name of {0} bytes exceeds the limit of 255")]
    NameTooLong(usize),
    /// An xattr name longer than [`MAX_NAME_LEN`].
    #[error("xattr name of {0} bytes exceeds the limit of 255")]
    XattrNameTooLong(usize),
    /// A path-like string longer than [`MAX_PATH_LEN`].
    #[error("string of {0} bytes exceeds the path limit of 4096")]
    PathTooLong(usize),
    /// A data count that disagrees with the payload.
    #[error("count {count} does not match the {left} data bytes")]
    CountMismatch {
        /// Declared count.
        count: u32,
        /// Bytes present.
        left: usize,
    },
}

impl DecodeError {
    /// The errno a server answers with in Rlerror.
    pub fn errno(&self) -> u32 {
        match self {
            DecodeError::SizeOverMsize { .. } => libc::EMSGSIZE as u32,
            DecodeError::UnknownType(_) | DecodeError::NotDotL(_) => libc::EOPNOTSUPP as u32,
            DecodeError::NameTooLong(_) | DecodeError::PathTooLong(_) => libc::ENAMETOOLONG as u32,
            DecodeError::XattrNameTooLong(_) => libc::ERANGE as u32,
            _ => libc::EPROTO as u32,
        }
    }
}
