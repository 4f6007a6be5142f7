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
//! use virtio_9p_server::protocol::{MsgType, Tmessage, Tversion};
//!
//! let msg = Tmessage::Version(Tversion { msize: 8192, version: b"9P2000.L".to_vec() });
//! assert_eq!(msg.msg_type(), MsgType::Tversion);
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

bitflags::bitflags! {
    /// The type byte of a [`Qid`] (`QT*`). Unknown bits are kept, so a
    /// decoded qid encodes back to the same bytes.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct QidType: u8 {
        /// A directory (`QTDIR`).
        const DIR = 0x80;
        /// An append-only file (`QTAPPEND`).
        const APPEND = 0x40;
        /// An exclusive-use file (`QTEXCL`).
        const EXCL = 0x20;
        /// A mount point (`QTMOUNT`).
        const MOUNT = 0x10;
        /// An authentication file (`QTAUTH`).
        const AUTH = 0x08;
        /// A non-backed-up file (`QTTMP`).
        const TMP = 0x04;
        /// A symbolic link (`QTSYMLINK`).
        const SYMLINK = 0x02;
        /// A hard link (`QTLINK`).
        const LINK = 0x01;
    }

    /// Tgetattr request mask and Rgetattr valid mask (`P9_GETATTR_*`).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct GetattrMask: u64 {
        /// `mode` is valid.
        const MODE = 0x0000_0001;
        /// `nlink` is valid.
        const NLINK = 0x0000_0002;
        /// `uid` is valid.
        const UID = 0x0000_0004;
        /// `gid` is valid.
        const GID = 0x0000_0008;
        /// `rdev` is valid.
        const RDEV = 0x0000_0010;
        /// `atime` is valid.
        const ATIME = 0x0000_0020;
        /// `mtime` is valid.
        const MTIME = 0x0000_0040;
        /// `ctime` is valid.
        const CTIME = 0x0000_0080;
        /// `qid.path` (inode) is valid.
        const INO = 0x0000_0100;
        /// `size` is valid.
        const SIZE = 0x0000_0200;
        /// `blocks` is valid.
        const BLOCKS = 0x0000_0400;
        /// `btime` is valid.
        const BTIME = 0x0000_0800;
        /// `gen` is valid.
        const GEN = 0x0000_1000;
        /// `data_version` is valid.
        const DATA_VERSION = 0x0000_2000;
        /// Everything `stat` returns (`P9_GETATTR_BASIC`).
        const BASIC = 0x0000_07ff;
        /// Everything (`P9_GETATTR_ALL`).
        const ALL = 0x0000_3fff;
    }

    /// Tsetattr valid mask (`P9_ATTR_*`).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct SetattrMask: u32 {
        /// Set the mode.
        const MODE = 1 << 0;
        /// Set the owner.
        const UID = 1 << 1;
        /// Set the group.
        const GID = 1 << 2;
        /// Truncate or extend.
        const SIZE = 1 << 3;
        /// Set atime (to now unless `ATIME_SET`).
        const ATIME = 1 << 4;
        /// Set mtime (to now unless `MTIME_SET`).
        const MTIME = 1 << 5;
        /// Update ctime.
        const CTIME = 1 << 6;
        /// atime comes from the message.
        const ATIME_SET = 1 << 7;
        /// mtime comes from the message.
        const MTIME_SET = 1 << 8;
    }

    /// Tlopen/Tlcreate flags (`P9_DOTL_*`, the x86 Linux `O_*` values). The
    /// access mode is the two-bit field under [`OpenFlags::ACCMODE`]:
    /// [`OpenFlags::RDONLY`] (no bit), `WRONLY` or `RDWR`.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct OpenFlags: u32 {
        /// Access mode mask.
        const ACCMODE = 0o3;
        /// Write only.
        const WRONLY = 0o1;
        /// Read and write.
        const RDWR = 0o2;
        /// Create.
        const CREATE = 0o100;
        /// Fail if it exists.
        const EXCL = 0o200;
        /// No controlling terminal.
        const NOCTTY = 0o400;
        /// Truncate.
        const TRUNC = 0o1000;
        /// Append.
        const APPEND = 0o2000;
        /// Non-blocking.
        const NONBLOCK = 0o4000;
        /// Data sync.
        const DSYNC = 0o10000;
        /// Async I/O signals.
        const FASYNC = 0o20000;
        /// Direct I/O.
        const DIRECT = 0o40000;
        /// Large file.
        const LARGEFILE = 0o100000;
        /// Must be a directory.
        const DIRECTORY = 0o200000;
        /// Do not follow symlinks.
        const NOFOLLOW = 0o400000;
        /// Do not update atime.
        const NOATIME = 0o1000000;
        /// Close on exec.
        const CLOEXEC = 0o2000000;
        /// Full sync.
        const SYNC = 0o4000000;
    }

    /// Tlock flags (`P9_LOCK_FLAGS_*`).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct LockFlags: u32 {
        /// The client waits for the lock (F_SETLKW).
        const BLOCK = 1;
        /// Reclaim after a server restart.
        const RECLAIM = 2;
    }

    /// Tunlinkat flags.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct UnlinkFlags: u32 {
        /// Remove a directory (`AT_REMOVEDIR`).
        const REMOVEDIR = 0x200;
    }
}

impl QidType {
    /// A plain file: no type bit (`QTFILE`).
    pub const FILE: Self = Self::empty();
}

impl OpenFlags {
    /// Read only: the access mode without a bit (`O_RDONLY`).
    pub const RDONLY: Self = Self::empty();

    /// The access mode alone: `RDONLY`, `WRONLY`, `RDWR` or (invalid)
    /// both bits.
    pub fn access_mode(self) -> Self {
        self & Self::ACCMODE
    }
}

/// Defines a `#[repr(u8)]` enum decoded strictly from its wire byte.
macro_rules! byte_enum {
    ($(#[$m:meta])* $name:ident, $err:ident { $($(#[$vm:meta])* $v:ident = $n:literal,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        #[non_exhaustive]
        pub enum $name {
            $($(#[$vm])* $v = $n,)*
        }

        impl TryFrom<u8> for $name {
            type Error = DecodeError;

            fn try_from(v: u8) -> Result<Self, DecodeError> {
                match v {
                    $($n => Ok($name::$v),)*
                    other => Err(DecodeError::$err(other)),
                }
            }
        }

        impl From<$name> for u8 {
            fn from(v: $name) -> u8 {
                v as u8
            }
        }
    };
}

byte_enum! {
    /// The lock type of a Tlock, Tgetlock or Rgetlock (`P9_LOCK_TYPE_*`).
    LockType, LockType {
        /// Read (shared) lock.
        Rdlck = 0,
        /// Write (exclusive) lock.
        Wrlck = 1,
        /// Unlock (in Rgetlock: no conflicting lock).
        Unlck = 2,
    }
}

byte_enum! {
    /// The status of an Rlock (`P9_LOCK_*`).
    LockStatus, LockStatus {
        /// Granted.
        Success = 0,
        /// Held by someone else; the client retries.
        Blocked = 1,
        /// Failed.
        Error = 2,
        /// Server in grace period.
        Grace = 3,
    }
}

/// A qid: the server's unique identity of a file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Qid {
    /// Directory, symlink or plain file.
    pub ty: QidType,
    /// Version, changing when the file changes.
    pub version: u32,
    /// Unique path (inode) number.
    pub path: u64,
}

impl Qid {
    /// Wire form.
    pub fn to_bytes(&self) -> [u8; QID_SIZE] {
        let mut out = [0u8; QID_SIZE];
        out[0] = self.ty.bits();
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
            ty: QidType::from_bits_retain(b[0]),
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
    /// Message type, raw: a server must read the tag of a request of an
    /// unknown type to answer it ([`MsgType::try_from`] checks it).
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
#[non_exhaustive]
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
    /// A lock type other than [`LockType`]'s.
    #[error("unknown lock type {0}")]
    LockType(u8),
    /// A lock status other than [`LockStatus`]'s.
    #[error("unknown lock status {0}")]
    LockStatus(u8),
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
            DecodeError::LockType(_) | DecodeError::LockStatus(_) => libc::EINVAL as u32,
            _ => libc::EPROTO as u32,
        }
    }
}
