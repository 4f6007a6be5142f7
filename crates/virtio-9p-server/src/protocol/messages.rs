// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Every 9P2000.L message, with its strict decoder and its encoder.

use super::wire::{Decoder, Encoder};
use super::{DecodeError, Header, Qid, HEADER_SIZE, MAXWELEM};

macro_rules! msg_types {
    ($($(#[$m:meta])* $name:ident = $v:expr;)*) => {
        $($(#[$m])* pub const $name: u8 = $v;)*
    };
}

msg_types! {
    /// Rlerror.
    RLERROR = 7;
    /// Tstatfs.
    TSTATFS = 8;
    /// Tlopen.
    TLOPEN = 12;
    /// Tlcreate.
    TLCREATE = 14;
    /// Tsymlink.
    TSYMLINK = 16;
    /// Tmknod.
    TMKNOD = 18;
    /// Trename.
    TRENAME = 20;
    /// Treadlink.
    TREADLINK = 22;
    /// Tgetattr.
    TGETATTR = 24;
    /// Tsetattr.
    TSETATTR = 26;
    /// Txattrwalk.
    TXATTRWALK = 30;
    /// Txattrcreate.
    TXATTRCREATE = 32;
    /// Treaddir.
    TREADDIR = 40;
    /// Tfsync.
    TFSYNC = 50;
    /// Tlock.
    TLOCK = 52;
    /// Tgetlock.
    TGETLOCK = 54;
    /// Tlink.
    TLINK = 70;
    /// Tmkdir.
    TMKDIR = 72;
    /// Trenameat.
    TRENAMEAT = 74;
    /// Tunlinkat.
    TUNLINKAT = 76;
    /// Tversion.
    TVERSION = 100;
    /// Tauth.
    TAUTH = 102;
    /// Tattach.
    TATTACH = 104;
    /// Terror (never valid; Rerror is 9P2000's error reply).
    TERROR = 106;
    /// Tflush.
    TFLUSH = 108;
    /// Twalk.
    TWALK = 110;
    /// Topen (9P2000, not .L).
    TOPEN = 112;
    /// Tcreate (9P2000, not .L).
    TCREATE = 114;
    /// Tread.
    TREAD = 116;
    /// Twrite.
    TWRITE = 118;
    /// Tclunk.
    TCLUNK = 120;
    /// Tremove.
    TREMOVE = 122;
    /// Tstat (9P2000, not .L).
    TSTAT = 124;
    /// Twstat (9P2000, not .L).
    TWSTAT = 126;
}

/// Tversion: negotiate msize and version; resets the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tversion {
    /// Largest message the client accepts.
    pub msize: u32,
    /// Protocol version, `9P2000.L`.
    pub version: Vec<u8>,
}

/// Tauth: set up an authentication fid (this server needs none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tauth {
    /// Auth fid.
    pub afid: u32,
    /// User name.
    pub uname: Vec<u8>,
    /// Tree name.
    pub aname: Vec<u8>,
    /// Numeric user id.
    pub n_uname: u32,
}

/// Tattach: a new fid at the root of the export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tattach {
    /// New fid.
    pub fid: u32,
    /// Auth fid ([`super::NOFID`]).
    pub afid: u32,
    /// User name.
    pub uname: Vec<u8>,
    /// Tree name.
    pub aname: Vec<u8>,
    /// Numeric user id.
    pub n_uname: u32,
}

/// Tflush: abort request `oldtag`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tflush {
    /// Tag of the request to abort.
    pub oldtag: u16,
}

/// Twalk: walk `fid` along `wnames` into `newfid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Twalk {
    /// Start.
    pub fid: u32,
    /// Result fid (may equal `fid`).
    pub newfid: u32,
    /// Path elements, at most [`MAXWELEM`].
    pub wnames: Vec<Vec<u8>>,
}

/// Tread: read from an open fid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tread {
    /// Open fid.
    pub fid: u32,
    /// File offset.
    pub offset: u64,
    /// Bytes wanted.
    pub count: u32,
}

/// Twrite: write to an open fid. The server's zero-copy path never builds
/// this struct: it decodes [`TwriteHeader`] and leaves the data in the
/// transport buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Twrite {
    /// Open fid.
    pub fid: u32,
    /// File offset.
    pub offset: u64,
    /// Data.
    pub data: Vec<u8>,
}

/// The fixed part of a Twrite: `fid[4] offset[8] count[4]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TwriteHeader {
    /// Open fid.
    pub fid: u32,
    /// File offset.
    pub offset: u64,
    /// Data bytes following.
    pub count: u32,
}

impl TwriteHeader {
    /// Encoded size.
    pub const SIZE: usize = 16;

    /// Decodes the fixed part; `data_len` is the number of bytes that
    /// follow it in the message, which must equal `count`.
    pub fn decode(b: &[u8; Self::SIZE], data_len: usize) -> Result<Self, DecodeError> {
        let mut d = Decoder::new(b);
        let h = TwriteHeader {
            fid: d.u32()?,
            offset: d.u64()?,
            count: d.u32()?,
        };
        if h.count as usize != data_len {
            return Err(DecodeError::CountMismatch {
                count: h.count,
                left: data_len,
            });
        }
        Ok(h)
    }
}

/// Tclunk / Tremove / Tstatfs / Treadlink: a request naming one fid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tfid {
    /// The fid.
    pub fid: u32,
}

/// Tlopen: open a walked fid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tlopen {
    /// Fid to open.
    pub fid: u32,
    /// [`super::open_flags`].
    pub flags: u32,
}

/// Tlcreate: create and open `name` in directory `fid`; `fid` becomes the
/// new file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tlcreate {
    /// Directory fid.
    pub fid: u32,
    /// New name.
    pub name: Vec<u8>,
    /// [`super::open_flags`].
    pub flags: u32,
    /// Permission bits.
    pub mode: u32,
    /// Group of the new file.
    pub gid: u32,
}

/// Tsymlink: create symlink `name` → `symtgt` in directory `fid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tsymlink {
    /// Directory fid.
    pub fid: u32,
    /// New name.
    pub name: Vec<u8>,
    /// Link target (stored, never resolved by the server).
    pub symtgt: Vec<u8>,
    /// Group.
    pub gid: u32,
}

/// Tmknod: create a device node, fifo or socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tmknod {
    /// Directory fid.
    pub dfid: u32,
    /// New name.
    pub name: Vec<u8>,
    /// File type and permission bits.
    pub mode: u32,
    /// Device major.
    pub major: u32,
    /// Device minor.
    pub minor: u32,
    /// Group.
    pub gid: u32,
}

/// Trename: move `fid` into directory `dfid` as `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trename {
    /// File to move.
    pub fid: u32,
    /// Target directory.
    pub dfid: u32,
    /// Target name.
    pub name: Vec<u8>,
}

/// Tgetattr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tgetattr {
    /// The fid.
    pub fid: u32,
    /// [`super::getattr`] bits wanted.
    pub request_mask: u64,
}

/// Tsetattr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tsetattr {
    /// The fid.
    pub fid: u32,
    /// [`super::setattr`] bits.
    pub valid: u32,
    /// New mode.
    pub mode: u32,
    /// New owner.
    pub uid: u32,
    /// New group.
    pub gid: u32,
    /// New size.
    pub size: u64,
    /// atime seconds.
    pub atime_sec: u64,
    /// atime nanoseconds.
    pub atime_nsec: u64,
    /// mtime seconds.
    pub mtime_sec: u64,
    /// mtime nanoseconds.
    pub mtime_nsec: u64,
}

/// Txattrwalk: `newfid` reads xattr `name` (or the name list if empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Txattrwalk {
    /// File.
    pub fid: u32,
    /// Fid for reading the value.
    pub newfid: u32,
    /// Attribute name; empty lists names.
    pub name: Vec<u8>,
}

/// Txattrcreate: `fid` becomes a write-only fid for xattr `name`; the
/// value is written with Twrite and set on Tclunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Txattrcreate {
    /// File; becomes the xattr fid.
    pub fid: u32,
    /// Attribute name.
    pub name: Vec<u8>,
    /// Total value size.
    pub attr_size: u64,
    /// `XATTR_CREATE` (1) / `XATTR_REPLACE` (2).
    pub flags: u32,
}

/// Treaddir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Treaddir {
    /// Open directory fid.
    pub fid: u32,
    /// Offset cookie from the previous entry (0 to start).
    pub offset: u64,
    /// Most bytes of entries to return.
    pub count: u32,
}

/// Tfsync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tfsync {
    /// Open fid.
    pub fid: u32,
    /// Non-zero: data only.
    pub datasync: u32,
}

/// Tlock: a POSIX byte-range lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tlock {
    /// Open fid.
    pub fid: u32,
    /// [`super::lock`] `TYPE_*`.
    pub ty: u8,
    /// [`super::lock`] `FLAGS_*`.
    pub flags: u32,
    /// Start offset.
    pub start: u64,
    /// Length; 0 means to end of file.
    pub length: u64,
    /// Client process id.
    pub proc_id: u32,
    /// Client identity.
    pub client_id: Vec<u8>,
}

/// Tgetlock: test for a conflicting lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tgetlock {
    /// Open fid.
    pub fid: u32,
    /// Lock type to test.
    pub ty: u8,
    /// Start.
    pub start: u64,
    /// Length.
    pub length: u64,
    /// Client process id.
    pub proc_id: u32,
    /// Client identity.
    pub client_id: Vec<u8>,
}

/// Tlink: hard link `fid` into `dfid` as `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tlink {
    /// Directory.
    pub dfid: u32,
    /// Existing file.
    pub fid: u32,
    /// New name.
    pub name: Vec<u8>,
}

/// Tmkdir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tmkdir {
    /// Parent directory.
    pub dfid: u32,
    /// New name.
    pub name: Vec<u8>,
    /// Permission bits.
    pub mode: u32,
    /// Group.
    pub gid: u32,
}

/// Trenameat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trenameat {
    /// Source directory.
    pub olddirfid: u32,
    /// Source name.
    pub oldname: Vec<u8>,
    /// Target directory.
    pub newdirfid: u32,
    /// Target name.
    pub newname: Vec<u8>,
}

/// Tunlinkat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tunlinkat {
    /// Directory.
    pub dirfid: u32,
    /// Name.
    pub name: Vec<u8>,
    /// [`super::AT_REMOVEDIR`] or 0.
    pub flags: u32,
}

/// A request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tmessage {
    /// Tversion.
    Version(Tversion),
    /// Tauth.
    Auth(Tauth),
    /// Tattach.
    Attach(Tattach),
    /// Tflush.
    Flush(Tflush),
    /// Twalk.
    Walk(Twalk),
    /// Tread.
    Read(Tread),
    /// Twrite.
    Write(Twrite),
    /// Tclunk.
    Clunk(Tfid),
    /// Tremove.
    Remove(Tfid),
    /// Tstatfs.
    Statfs(Tfid),
    /// Tlopen.
    Lopen(Tlopen),
    /// Tlcreate.
    Lcreate(Tlcreate),
    /// Tsymlink.
    Symlink(Tsymlink),
    /// Tmknod.
    Mknod(Tmknod),
    /// Trename.
    Rename(Trename),
    /// Treadlink.
    Readlink(Tfid),
    /// Tgetattr.
    Getattr(Tgetattr),
    /// Tsetattr.
    Setattr(Tsetattr),
    /// Txattrwalk.
    Xattrwalk(Txattrwalk),
    /// Txattrcreate.
    Xattrcreate(Txattrcreate),
    /// Treaddir.
    Readdir(Treaddir),
    /// Tfsync.
    Fsync(Tfsync),
    /// Tlock.
    Lock(Tlock),
    /// Tgetlock.
    Getlock(Tgetlock),
    /// Tlink.
    Link(Tlink),
    /// Tmkdir.
    Mkdir(Tmkdir),
    /// Trenameat.
    Renameat(Trenameat),
    /// Tunlinkat.
    Unlinkat(Tunlinkat),
}

/// Rstatfs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rstatfs {
    /// Filesystem type.
    pub ty: u32,
    /// Block size.
    pub bsize: u32,
    /// Total blocks.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Blocks available to unprivileged users.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Filesystem id.
    pub fsid: u64,
    /// Longest name.
    pub namelen: u32,
}

/// Rgetattr.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rgetattr {
    /// [`super::getattr`] bits that are valid.
    pub valid: u64,
    /// Qid.
    pub qid: Qid,
    /// Mode (type and permissions).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Links.
    pub nlink: u64,
    /// Device number for device nodes.
    pub rdev: u64,
    /// Size.
    pub size: u64,
    /// Preferred I/O size.
    pub blksize: u64,
    /// 512-byte blocks.
    pub blocks: u64,
    /// atime seconds.
    pub atime_sec: u64,
    /// atime nanoseconds.
    pub atime_nsec: u64,
    /// mtime seconds.
    pub mtime_sec: u64,
    /// mtime nanoseconds.
    pub mtime_nsec: u64,
    /// ctime seconds.
    pub ctime_sec: u64,
    /// ctime nanoseconds.
    pub ctime_nsec: u64,
    /// Birth time seconds.
    pub btime_sec: u64,
    /// Birth time nanoseconds.
    pub btime_nsec: u64,
    /// Generation.
    pub gen: u64,
    /// Data version.
    pub data_version: u64,
}

/// Rgetlock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgetlock {
    /// `TYPE_UNLCK` if there is no conflict, else the conflicting type.
    pub ty: u8,
    /// Conflict start.
    pub start: u64,
    /// Conflict length.
    pub length: u64,
    /// Holder's process id.
    pub proc_id: u32,
    /// Holder's identity.
    pub client_id: Vec<u8>,
}

/// One Rreaddir entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Qid of the entry.
    pub qid: Qid,
    /// Offset cookie of the next entry.
    pub offset: u64,
    /// `DT_*` type.
    pub ty: u8,
    /// Name.
    pub name: Vec<u8>,
}

impl DirEntry {
    /// Encoded size.
    pub fn size(&self) -> usize {
        super::QID_SIZE + 8 + 1 + 2 + self.name.len()
    }

    /// Appends the wire form.
    pub fn encode(&self, out: &mut Vec<u8>) {
        Encoder::new(out)
            .qid(&self.qid)
            .u64(self.offset)
            .u8(self.ty)
            .string(&self.name);
    }

    /// Parses the data of an Rreaddir.
    pub fn decode_all(data: &[u8]) -> Result<Vec<DirEntry>, DecodeError> {
        let mut d = Decoder::new(data);
        let mut out = Vec::new();
        while d.remaining() > 0 {
            out.push(DirEntry {
                qid: d.qid()?,
                offset: d.u64()?,
                ty: d.u8()?,
                name: d.string()?,
            });
        }
        Ok(out)
    }
}

/// A reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rmessage {
    /// Rlerror with a Linux errno.
    Lerror(u32),
    /// Rversion.
    Version(Tversion),
    /// Rauth.
    Auth(Qid),
    /// Rattach.
    Attach(Qid),
    /// Rflush.
    Flush,
    /// Rwalk: one qid per element walked.
    Walk(Vec<Qid>),
    /// Rread.
    Read(Vec<u8>),
    /// Rwrite: bytes written.
    Write(u32),
    /// Rclunk.
    Clunk,
    /// Rremove.
    Remove,
    /// Rstatfs.
    Statfs(Rstatfs),
    /// Rlopen: qid and iounit.
    Lopen(Qid, u32),
    /// Rlcreate: qid and iounit.
    Lcreate(Qid, u32),
    /// Rsymlink.
    Symlink(Qid),
    /// Rmknod.
    Mknod(Qid),
    /// Rrename.
    Rename,
    /// Rreadlink.
    Readlink(Vec<u8>),
    /// Rgetattr.
    Getattr(Box<Rgetattr>),
    /// Rsetattr.
    Setattr,
    /// Rxattrwalk: value size.
    Xattrwalk(u64),
    /// Rxattrcreate.
    Xattrcreate,
    /// Rreaddir: encoded [`DirEntry`] records.
    Readdir(Vec<u8>),
    /// Rfsync.
    Fsync,
    /// Rlock status.
    Lock(u8),
    /// Rgetlock.
    Getlock(Rgetlock),
    /// Rlink.
    Link,
    /// Rmkdir.
    Mkdir(Qid),
    /// Rrenameat.
    Renameat,
    /// Runlinkat.
    Unlinkat,
}

/// Initial capacity of an encoded frame: enough for every fixed-size
/// message (Rgetattr is the largest at 160 bytes) and short names.
const FRAME_CAPACITY: usize = 256;

fn check_frame(frame: &[u8], msize: u32) -> Result<Header, DecodeError> {
    let hdr: &[u8; HEADER_SIZE] = frame
        .get(..HEADER_SIZE)
        .and_then(|h| h.try_into().ok())
        .ok_or(DecodeError::ShortFrame(frame.len()))?;
    let h = Header::from_bytes(hdr);
    h.check_size(msize)?;
    if h.size as usize != frame.len() {
        return Err(DecodeError::SizeMismatch {
            declared: h.size,
            actual: frame.len(),
        });
    }
    Ok(h)
}

fn finish_frame(ty: u8, tag: u16, mut out: Vec<u8>) -> Vec<u8> {
    let size = out.len() as u32;
    let hdr = Header { size, ty, tag }.to_bytes();
    out[..HEADER_SIZE].copy_from_slice(&hdr);
    out
}

impl Tmessage {
    /// The message type byte.
    pub fn msg_type(&self) -> u8 {
        match self {
            Tmessage::Version(_) => TVERSION,
            Tmessage::Auth(_) => TAUTH,
            Tmessage::Attach(_) => TATTACH,
            Tmessage::Flush(_) => TFLUSH,
            Tmessage::Walk(_) => TWALK,
            Tmessage::Read(_) => TREAD,
            Tmessage::Write(_) => TWRITE,
            Tmessage::Clunk(_) => TCLUNK,
            Tmessage::Remove(_) => TREMOVE,
            Tmessage::Statfs(_) => TSTATFS,
            Tmessage::Lopen(_) => TLOPEN,
            Tmessage::Lcreate(_) => TLCREATE,
            Tmessage::Symlink(_) => TSYMLINK,
            Tmessage::Mknod(_) => TMKNOD,
            Tmessage::Rename(_) => TRENAME,
            Tmessage::Readlink(_) => TREADLINK,
            Tmessage::Getattr(_) => TGETATTR,
            Tmessage::Setattr(_) => TSETATTR,
            Tmessage::Xattrwalk(_) => TXATTRWALK,
            Tmessage::Xattrcreate(_) => TXATTRCREATE,
            Tmessage::Readdir(_) => TREADDIR,
            Tmessage::Fsync(_) => TFSYNC,
            Tmessage::Lock(_) => TLOCK,
            Tmessage::Getlock(_) => TGETLOCK,
            Tmessage::Link(_) => TLINK,
            Tmessage::Mkdir(_) => TMKDIR,
            Tmessage::Renameat(_) => TRENAMEAT,
            Tmessage::Unlinkat(_) => TUNLINKAT,
        }
    }

    /// Decodes a whole frame (`size[4] type[1] tag[2] body`), checking the
    /// size against `msize`. Returns the tag and the message.
    pub fn decode_frame(frame: &[u8], msize: u32) -> Result<(u16, Tmessage), DecodeError> {
        let h = check_frame(frame, msize)?;
        Ok((h.tag, Self::decode_body(h.ty, &frame[HEADER_SIZE..])?))
    }

    /// Decodes the body of a message of type `ty` (the bytes after the
    /// header). The body must be consumed exactly.
    pub fn decode_body(ty: u8, body: &[u8]) -> Result<Tmessage, DecodeError> {
        let mut d = Decoder::new(body);
        let msg = match ty {
            TVERSION => Tmessage::Version(Tversion {
                msize: d.u32()?,
                version: d.path()?,
            }),
            TAUTH => Tmessage::Auth(Tauth {
                afid: d.u32()?,
                uname: d.path()?,
                aname: d.path()?,
                n_uname: d.u32()?,
            }),
            TATTACH => Tmessage::Attach(Tattach {
                fid: d.u32()?,
                afid: d.u32()?,
                uname: d.path()?,
                aname: d.path()?,
                n_uname: d.u32()?,
            }),
            TFLUSH => Tmessage::Flush(Tflush { oldtag: d.u16()? }),
            TWALK => {
                let fid = d.u32()?;
                let newfid = d.u32()?;
                let n = d.u16()?;
                if n as usize > MAXWELEM {
                    return Err(DecodeError::TooManyWalkElements(n));
                }
                let mut wnames = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    wnames.push(d.name()?);
                }
                Tmessage::Walk(Twalk {
                    fid,
                    newfid,
                    wnames,
                })
            }
            TREAD => Tmessage::Read(Tread {
                fid: d.u32()?,
                offset: d.u64()?,
                count: d.u32()?,
            }),
            TWRITE => {
                let fid = d.u32()?;
                let offset = d.u64()?;
                let count = d.u32()?;
                if count as usize != d.remaining() {
                    return Err(DecodeError::CountMismatch {
                        count,
                        left: d.remaining(),
                    });
                }
                Tmessage::Write(Twrite {
                    fid,
                    offset,
                    data: d.bytes(count as usize)?.to_vec(),
                })
            }
            TCLUNK => Tmessage::Clunk(Tfid { fid: d.u32()? }),
            TREMOVE => Tmessage::Remove(Tfid { fid: d.u32()? }),
            TSTATFS => Tmessage::Statfs(Tfid { fid: d.u32()? }),
            TREADLINK => Tmessage::Readlink(Tfid { fid: d.u32()? }),
            TLOPEN => Tmessage::Lopen(Tlopen {
                fid: d.u32()?,
                flags: d.u32()?,
            }),
            TLCREATE => Tmessage::Lcreate(Tlcreate {
                fid: d.u32()?,
                name: d.name()?,
                flags: d.u32()?,
                mode: d.u32()?,
                gid: d.u32()?,
            }),
            TSYMLINK => Tmessage::Symlink(Tsymlink {
                fid: d.u32()?,
                name: d.name()?,
                symtgt: d.path()?,
                gid: d.u32()?,
            }),
            TMKNOD => Tmessage::Mknod(Tmknod {
                dfid: d.u32()?,
                name: d.name()?,
                mode: d.u32()?,
                major: d.u32()?,
                minor: d.u32()?,
                gid: d.u32()?,
            }),
            TRENAME => Tmessage::Rename(Trename {
                fid: d.u32()?,
                dfid: d.u32()?,
                name: d.name()?,
            }),
            TGETATTR => Tmessage::Getattr(Tgetattr {
                fid: d.u32()?,
                request_mask: d.u64()?,
            }),
            TSETATTR => Tmessage::Setattr(Tsetattr {
                fid: d.u32()?,
                valid: d.u32()?,
                mode: d.u32()?,
                uid: d.u32()?,
                gid: d.u32()?,
                size: d.u64()?,
                atime_sec: d.u64()?,
                atime_nsec: d.u64()?,
                mtime_sec: d.u64()?,
                mtime_nsec: d.u64()?,
            }),
            TXATTRWALK => Tmessage::Xattrwalk(Txattrwalk {
                fid: d.u32()?,
                newfid: d.u32()?,
                name: d.xattr_name()?,
            }),
            TXATTRCREATE => Tmessage::Xattrcreate(Txattrcreate {
                fid: d.u32()?,
                name: d.xattr_name()?,
                attr_size: d.u64()?,
                flags: d.u32()?,
            }),
            TREADDIR => Tmessage::Readdir(Treaddir {
                fid: d.u32()?,
                offset: d.u64()?,
                count: d.u32()?,
            }),
            TFSYNC => Tmessage::Fsync(Tfsync {
                fid: d.u32()?,
                datasync: d.u32()?,
            }),
            TLOCK => Tmessage::Lock(Tlock {
                fid: d.u32()?,
                ty: d.u8()?,
                flags: d.u32()?,
                start: d.u64()?,
                length: d.u64()?,
                proc_id: d.u32()?,
                client_id: d.path()?,
            }),
            TGETLOCK => Tmessage::Getlock(Tgetlock {
                fid: d.u32()?,
                ty: d.u8()?,
                start: d.u64()?,
                length: d.u64()?,
                proc_id: d.u32()?,
                client_id: d.path()?,
            }),
            TLINK => Tmessage::Link(Tlink {
                dfid: d.u32()?,
                fid: d.u32()?,
                name: d.name()?,
            }),
            TMKDIR => Tmessage::Mkdir(Tmkdir {
                dfid: d.u32()?,
                name: d.name()?,
                mode: d.u32()?,
                gid: d.u32()?,
            }),
            TRENAMEAT => Tmessage::Renameat(Trenameat {
                olddirfid: d.u32()?,
                oldname: d.name()?,
                newdirfid: d.u32()?,
                newname: d.name()?,
            }),
            TUNLINKAT => Tmessage::Unlinkat(Tunlinkat {
                dirfid: d.u32()?,
                name: d.name()?,
                flags: d.u32()?,
            }),
            TERROR | TOPEN | TCREATE | TSTAT | TWSTAT => return Err(DecodeError::NotDotL(ty)),
            other => return Err(DecodeError::UnknownType(other)),
        };
        d.finish()?;
        Ok(msg)
    }

    /// Encodes the whole frame with `tag`.
    pub fn encode_frame(&self, tag: u16) -> Vec<u8> {
        let data = match self {
            Tmessage::Write(m) => m.data.len(),
            _ => 0,
        };
        let mut out = Vec::with_capacity(FRAME_CAPACITY + data);
        out.resize(HEADER_SIZE, 0);
        let mut e = Encoder::new(&mut out);
        match self {
            Tmessage::Version(m) => {
                e.u32(m.msize).string(&m.version);
            }
            Tmessage::Auth(m) => {
                e.u32(m.afid)
                    .string(&m.uname)
                    .string(&m.aname)
                    .u32(m.n_uname);
            }
            Tmessage::Attach(m) => {
                e.u32(m.fid)
                    .u32(m.afid)
                    .string(&m.uname)
                    .string(&m.aname)
                    .u32(m.n_uname);
            }
            Tmessage::Flush(m) => {
                e.u16(m.oldtag);
            }
            Tmessage::Walk(m) => {
                e.u32(m.fid).u32(m.newfid).u16(m.wnames.len() as u16);
                for n in &m.wnames {
                    e.string(n);
                }
            }
            Tmessage::Read(m) => {
                e.u32(m.fid).u64(m.offset).u32(m.count);
            }
            Tmessage::Write(m) => {
                e.u32(m.fid)
                    .u64(m.offset)
                    .u32(m.data.len() as u32)
                    .bytes(&m.data);
            }
            Tmessage::Clunk(m) | Tmessage::Remove(m) | Tmessage::Statfs(m) => {
                e.u32(m.fid);
            }
            Tmessage::Readlink(m) => {
                e.u32(m.fid);
            }
            Tmessage::Lopen(m) => {
                e.u32(m.fid).u32(m.flags);
            }
            Tmessage::Lcreate(m) => {
                e.u32(m.fid)
                    .string(&m.name)
                    .u32(m.flags)
                    .u32(m.mode)
                    .u32(m.gid);
            }
            Tmessage::Symlink(m) => {
                e.u32(m.fid).string(&m.name).string(&m.symtgt).u32(m.gid);
            }
            Tmessage::Mknod(m) => {
                e.u32(m.dfid)
                    .string(&m.name)
                    .u32(m.mode)
                    .u32(m.major)
                    .u32(m.minor)
                    .u32(m.gid);
            }
            Tmessage::Rename(m) => {
                e.u32(m.fid).u32(m.dfid).string(&m.name);
            }
            Tmessage::Getattr(m) => {
                e.u32(m.fid).u64(m.request_mask);
            }
            Tmessage::Setattr(m) => {
                e.u32(m.fid)
                    .u32(m.valid)
                    .u32(m.mode)
                    .u32(m.uid)
                    .u32(m.gid)
                    .u64(m.size)
                    .u64(m.atime_sec)
                    .u64(m.atime_nsec)
                    .u64(m.mtime_sec)
                    .u64(m.mtime_nsec);
            }
            Tmessage::Xattrwalk(m) => {
                e.u32(m.fid).u32(m.newfid).string(&m.name);
            }
            Tmessage::Xattrcreate(m) => {
                e.u32(m.fid).string(&m.name).u64(m.attr_size).u32(m.flags);
            }
            Tmessage::Readdir(m) => {
                e.u32(m.fid).u64(m.offset).u32(m.count);
            }
            Tmessage::Fsync(m) => {
                e.u32(m.fid).u32(m.datasync);
            }
            Tmessage::Lock(m) => {
                e.u32(m.fid)
                    .u8(m.ty)
                    .u32(m.flags)
                    .u64(m.start)
                    .u64(m.length)
                    .u32(m.proc_id)
                    .string(&m.client_id);
            }
            Tmessage::Getlock(m) => {
                e.u32(m.fid)
                    .u8(m.ty)
                    .u64(m.start)
                    .u64(m.length)
                    .u32(m.proc_id)
                    .string(&m.client_id);
            }
            Tmessage::Link(m) => {
                e.u32(m.dfid).u32(m.fid).string(&m.name);
            }
            Tmessage::Mkdir(m) => {
                e.u32(m.dfid).string(&m.name).u32(m.mode).u32(m.gid);
            }
            Tmessage::Renameat(m) => {
                e.u32(m.olddirfid)
                    .string(&m.oldname)
                    .u32(m.newdirfid)
                    .string(&m.newname);
            }
            Tmessage::Unlinkat(m) => {
                e.u32(m.dirfid).string(&m.name).u32(m.flags);
            }
        }
        finish_frame(self.msg_type(), tag, out)
    }
}

impl Rmessage {
    /// The message type byte (the request's type plus one).
    pub fn msg_type(&self) -> u8 {
        match self {
            Rmessage::Lerror(_) => RLERROR,
            Rmessage::Version(_) => TVERSION + 1,
            Rmessage::Auth(_) => TAUTH + 1,
            Rmessage::Attach(_) => TATTACH + 1,
            Rmessage::Flush => TFLUSH + 1,
            Rmessage::Walk(_) => TWALK + 1,
            Rmessage::Read(_) => TREAD + 1,
            Rmessage::Write(_) => TWRITE + 1,
            Rmessage::Clunk => TCLUNK + 1,
            Rmessage::Remove => TREMOVE + 1,
            Rmessage::Statfs(_) => TSTATFS + 1,
            Rmessage::Lopen(..) => TLOPEN + 1,
            Rmessage::Lcreate(..) => TLCREATE + 1,
            Rmessage::Symlink(_) => TSYMLINK + 1,
            Rmessage::Mknod(_) => TMKNOD + 1,
            Rmessage::Rename => TRENAME + 1,
            Rmessage::Readlink(_) => TREADLINK + 1,
            Rmessage::Getattr(_) => TGETATTR + 1,
            Rmessage::Setattr => TSETATTR + 1,
            Rmessage::Xattrwalk(_) => TXATTRWALK + 1,
            Rmessage::Xattrcreate => TXATTRCREATE + 1,
            Rmessage::Readdir(_) => TREADDIR + 1,
            Rmessage::Fsync => TFSYNC + 1,
            Rmessage::Lock(_) => TLOCK + 1,
            Rmessage::Getlock(_) => TGETLOCK + 1,
            Rmessage::Link => TLINK + 1,
            Rmessage::Mkdir(_) => TMKDIR + 1,
            Rmessage::Renameat => TRENAMEAT + 1,
            Rmessage::Unlinkat => TUNLINKAT + 1,
        }
    }

    /// Decodes a whole reply frame, checking its size against `msize`.
    pub fn decode_frame(frame: &[u8], msize: u32) -> Result<(u16, Rmessage), DecodeError> {
        let h = check_frame(frame, msize)?;
        Ok((h.tag, Self::decode_body(h.ty, &frame[HEADER_SIZE..])?))
    }

    /// Decodes the body of a reply of type `ty`.
    pub fn decode_body(ty: u8, body: &[u8]) -> Result<Rmessage, DecodeError> {
        let mut d = Decoder::new(body);
        let counted = |d: &mut Decoder<'_>| -> Result<Vec<u8>, DecodeError> {
            let count = d.u32()?;
            if count as usize != d.remaining() {
                return Err(DecodeError::CountMismatch {
                    count,
                    left: d.remaining(),
                });
            }
            Ok(d.bytes(count as usize)?.to_vec())
        };
        let msg = match ty.wrapping_sub(1) {
            _ if ty == RLERROR => Rmessage::Lerror(d.u32()?),
            TVERSION => Rmessage::Version(Tversion {
                msize: d.u32()?,
                version: d.string()?,
            }),
            TAUTH => Rmessage::Auth(d.qid()?),
            TATTACH => Rmessage::Attach(d.qid()?),
            TFLUSH => Rmessage::Flush,
            TWALK => {
                let n = d.u16()?;
                if n as usize > MAXWELEM {
                    return Err(DecodeError::TooManyWalkElements(n));
                }
                let mut qids = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    qids.push(d.qid()?);
                }
                Rmessage::Walk(qids)
            }
            TREAD => Rmessage::Read(counted(&mut d)?),
            TWRITE => Rmessage::Write(d.u32()?),
            TCLUNK => Rmessage::Clunk,
            TREMOVE => Rmessage::Remove,
            TSTATFS => Rmessage::Statfs(Rstatfs {
                ty: d.u32()?,
                bsize: d.u32()?,
                blocks: d.u64()?,
                bfree: d.u64()?,
                bavail: d.u64()?,
                files: d.u64()?,
                ffree: d.u64()?,
                fsid: d.u64()?,
                namelen: d.u32()?,
            }),
            TLOPEN => Rmessage::Lopen(d.qid()?, d.u32()?),
            TLCREATE => Rmessage::Lcreate(d.qid()?, d.u32()?),
            TSYMLINK => Rmessage::Symlink(d.qid()?),
            TMKNOD => Rmessage::Mknod(d.qid()?),
            TRENAME => Rmessage::Rename,
            TREADLINK => Rmessage::Readlink(d.string()?),
            TGETATTR => Rmessage::Getattr(Box::new(Rgetattr {
                valid: d.u64()?,
                qid: d.qid()?,
                mode: d.u32()?,
                uid: d.u32()?,
                gid: d.u32()?,
                nlink: d.u64()?,
                rdev: d.u64()?,
                size: d.u64()?,
                blksize: d.u64()?,
                blocks: d.u64()?,
                atime_sec: d.u64()?,
                atime_nsec: d.u64()?,
                mtime_sec: d.u64()?,
                mtime_nsec: d.u64()?,
                ctime_sec: d.u64()?,
                ctime_nsec: d.u64()?,
                btime_sec: d.u64()?,
                btime_nsec: d.u64()?,
                gen: d.u64()?,
                data_version: d.u64()?,
            })),
            TSETATTR => Rmessage::Setattr,
            TXATTRWALK => Rmessage::Xattrwalk(d.u64()?),
            TXATTRCREATE => Rmessage::Xattrcreate,
            TREADDIR => Rmessage::Readdir(counted(&mut d)?),
            TFSYNC => Rmessage::Fsync,
            TLOCK => Rmessage::Lock(d.u8()?),
            TGETLOCK => Rmessage::Getlock(Rgetlock {
                ty: d.u8()?,
                start: d.u64()?,
                length: d.u64()?,
                proc_id: d.u32()?,
                client_id: d.string()?,
            }),
            TLINK => Rmessage::Link,
            TMKDIR => Rmessage::Mkdir(d.qid()?),
            TRENAMEAT => Rmessage::Renameat,
            TUNLINKAT => Rmessage::Unlinkat,
            _ => return Err(DecodeError::UnknownType(ty)),
        };
        d.finish()?;
        Ok(msg)
    }

    /// Appends the body (everything after the header) to `out`.
    pub fn encode_body(&self, out: &mut Vec<u8>) {
        let mut e = Encoder::new(out);
        match self {
            Rmessage::Lerror(errno) => {
                e.u32(*errno);
            }
            Rmessage::Version(m) => {
                e.u32(m.msize).string(&m.version);
            }
            Rmessage::Auth(q)
            | Rmessage::Attach(q)
            | Rmessage::Symlink(q)
            | Rmessage::Mknod(q)
            | Rmessage::Mkdir(q) => {
                e.qid(q);
            }
            Rmessage::Walk(qids) => {
                e.u16(qids.len() as u16);
                for q in qids {
                    e.qid(q);
                }
            }
            Rmessage::Read(data) | Rmessage::Readdir(data) => {
                e.u32(data.len() as u32).bytes(data);
            }
            Rmessage::Write(n) => {
                e.u32(*n);
            }
            Rmessage::Statfs(s) => {
                e.u32(s.ty)
                    .u32(s.bsize)
                    .u64(s.blocks)
                    .u64(s.bfree)
                    .u64(s.bavail)
                    .u64(s.files)
                    .u64(s.ffree)
                    .u64(s.fsid)
                    .u32(s.namelen);
            }
            Rmessage::Lopen(q, iounit) | Rmessage::Lcreate(q, iounit) => {
                e.qid(q).u32(*iounit);
            }
            Rmessage::Readlink(target) => {
                e.string(target);
            }
            Rmessage::Getattr(a) => {
                e.u64(a.valid)
                    .qid(&a.qid)
                    .u32(a.mode)
                    .u32(a.uid)
                    .u32(a.gid)
                    .u64(a.nlink)
                    .u64(a.rdev)
                    .u64(a.size)
                    .u64(a.blksize)
                    .u64(a.blocks)
                    .u64(a.atime_sec)
                    .u64(a.atime_nsec)
                    .u64(a.mtime_sec)
                    .u64(a.mtime_nsec)
                    .u64(a.ctime_sec)
                    .u64(a.ctime_nsec)
                    .u64(a.btime_sec)
                    .u64(a.btime_nsec)
                    .u64(a.gen)
                    .u64(a.data_version);
            }
            Rmessage::Xattrwalk(size) => {
                e.u64(*size);
            }
            Rmessage::Lock(status) => {
                e.u8(*status);
            }
            Rmessage::Getlock(g) => {
                e.u8(g.ty)
                    .u64(g.start)
                    .u64(g.length)
                    .u32(g.proc_id)
                    .string(&g.client_id);
            }
            Rmessage::Flush
            | Rmessage::Clunk
            | Rmessage::Remove
            | Rmessage::Rename
            | Rmessage::Setattr
            | Rmessage::Xattrcreate
            | Rmessage::Fsync
            | Rmessage::Link
            | Rmessage::Renameat
            | Rmessage::Unlinkat => {}
        }
    }

    /// Encodes the whole frame with `tag`.
    pub fn encode_frame(&self, tag: u16) -> Vec<u8> {
        let data = match self {
            Rmessage::Read(d) | Rmessage::Readdir(d) => d.len(),
            _ => 0,
        };
        let mut out = Vec::with_capacity(FRAME_CAPACITY + data);
        out.resize(HEADER_SIZE, 0);
        self.encode_body(&mut out);
        finish_frame(self.msg_type(), tag, out)
    }
}
