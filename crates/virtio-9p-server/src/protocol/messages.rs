// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Every 9P2000.L message, declared once.
//!
//! [`messages!`] takes one line per request/reply pair (its type number,
//! the request's body struct and the reply's fields) and generates
//! [`MsgType`], [`Tmessage`] and [`Rmessage`] with their strict decoders
//! and their encoders. [`wire_struct!`] declares a message body struct
//! together with its wire form, field by field in wire order. A field's
//! wire form is its type's ([`Wire`]) unless an `as Kind` names one of the
//! [`kind`] codecs (bounded strings, counted data, walk lists).

use super::wire::{Decoder, Encoder};
use super::{
    DecodeError, GetattrMask, Header, LockFlags, LockStatus, LockType, OpenFlags, Qid, QidType,
    SetattrMask, UnlinkFlags, HEADER_SIZE, MAXWELEM, QID_SIZE,
};

/// A value with one wire form: integers, qids, flag sets, lock enums and
/// the message body structs.
pub(crate) trait Wire: Sized {
    /// Reads the value; fails on short or invalid input.
    fn decode(d: &mut Decoder<'_>) -> Result<Self, DecodeError>;
    /// Appends the value.
    fn encode(&self, e: &mut Encoder<'_>);
}

macro_rules! wire_int {
    ($($t:ident),*) => {$(
        impl Wire for $t {
            fn decode(d: &mut Decoder<'_>) -> Result<Self, DecodeError> {
                d.$t()
            }
            fn encode(&self, e: &mut Encoder<'_>) {
                e.$t(*self);
            }
        }
    )*};
}
wire_int!(u8, u16, u32, u64);

// Flag sets keep unknown bits, so every decoded message encodes back to
// the same bytes; the server decides which bits it accepts.
macro_rules! wire_flags {
    ($($t:ident: $bits:ident),*) => {$(
        impl Wire for $t {
            fn decode(d: &mut Decoder<'_>) -> Result<Self, DecodeError> {
                Ok($t::from_bits_retain(d.$bits()?))
            }
            fn encode(&self, e: &mut Encoder<'_>) {
                e.$bits(self.bits());
            }
        }
    )*};
}
wire_flags!(QidType: u8, GetattrMask: u64, SetattrMask: u32, OpenFlags: u32, LockFlags: u32, UnlinkFlags: u32);

// Lock types and statuses are closed sets: anything else is refused.
macro_rules! wire_enum {
    ($($t:ident),*) => {$(
        impl Wire for $t {
            fn decode(d: &mut Decoder<'_>) -> Result<Self, DecodeError> {
                $t::try_from(d.u8()?)
            }
            fn encode(&self, e: &mut Encoder<'_>) {
                e.u8(*self as u8);
            }
        }
    )*};
}
wire_enum!(LockType, LockStatus);

impl Wire for Qid {
    fn decode(d: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        d.qid()
    }
    fn encode(&self, e: &mut Encoder<'_>) {
        e.qid(self);
    }
}

impl<T: Wire> Wire for Box<T> {
    fn decode(d: &mut Decoder<'_>) -> Result<Self, DecodeError> {
        T::decode(d).map(Box::new)
    }
    fn encode(&self, e: &mut Encoder<'_>) {
        T::encode(self, e);
    }
}

/// The codecs of fields whose type alone does not say their wire form.
pub(crate) mod kind {
    use super::*;

    /// A codec for values of type `T`.
    pub(crate) trait Kind<T> {
        /// Reads the value.
        fn decode(d: &mut Decoder<'_>) -> Result<T, DecodeError>;
        /// Appends the value.
        fn encode(v: &T, e: &mut Encoder<'_>);
    }

    macro_rules! string_kind {
        ($($(#[$m:meta])* $name:ident => $dec:ident;)*) => {$(
            $(#[$m])*
            pub(crate) struct $name;

            impl Kind<Vec<u8>> for $name {
                fn decode(d: &mut Decoder<'_>) -> Result<Vec<u8>, DecodeError> {
                    d.$dec()
                }
                fn encode(v: &Vec<u8>, e: &mut Encoder<'_>) {
                    e.string(v);
                }
            }
        )*};
    }

    string_kind! {
        /// A 9P string of any length (in replies).
        Str => string;
        /// A file name: at most [`super::super::MAX_NAME_LEN`] bytes.
        Name => name;
        /// An xattr name: at most [`super::super::MAX_NAME_LEN`] bytes.
        XattrName => xattr_name;
        /// A path-like string: at most [`super::super::MAX_PATH_LEN`] bytes.
        Path => path;
    }

    /// `count[4]` and exactly `count` bytes, the rest of the message
    /// (Twrite, Rread, Rreaddir).
    pub(crate) struct Data;

    impl Kind<Vec<u8>> for Data {
        fn decode(d: &mut Decoder<'_>) -> Result<Vec<u8>, DecodeError> {
            let count = d.u32()?;
            if count as usize != d.remaining() {
                return Err(DecodeError::CountMismatch {
                    count,
                    left: d.remaining(),
                });
            }
            Ok(d.bytes(count as usize)?.to_vec())
        }
        fn encode(v: &Vec<u8>, e: &mut Encoder<'_>) {
            e.u32(v.len() as u32).bytes(v);
        }
    }

    /// Reads the `n[2]` of a walk list, at most [`MAXWELEM`].
    fn walk_len(d: &mut Decoder<'_>) -> Result<usize, DecodeError> {
        let n = d.u16()?;
        if n as usize > MAXWELEM {
            return Err(DecodeError::TooManyWalkElements(n));
        }
        Ok(n as usize)
    }

    /// `nwname[2]` and that many names (Twalk).
    pub(crate) struct Wnames;

    impl Kind<Vec<Vec<u8>>> for Wnames {
        fn decode(d: &mut Decoder<'_>) -> Result<Vec<Vec<u8>>, DecodeError> {
            let n = walk_len(d)?;
            (0..n).map(|_| d.name()).collect()
        }
        fn encode(v: &Vec<Vec<u8>>, e: &mut Encoder<'_>) {
            e.u16(v.len() as u16);
            for name in v {
                e.string(name);
            }
        }
    }

    /// `nwqid[2]` and that many qids (Rwalk).
    pub(crate) struct Qids;

    impl Kind<Vec<Qid>> for Qids {
        fn decode(d: &mut Decoder<'_>) -> Result<Vec<Qid>, DecodeError> {
            let n = walk_len(d)?;
            (0..n).map(|_| d.qid()).collect()
        }
        fn encode(v: &Vec<Qid>, e: &mut Encoder<'_>) {
            e.u16(v.len() as u16);
            for q in v {
                e.qid(q);
            }
        }
    }
}

use kind::Kind;

/// Decodes one field: by its type, or by the named [`kind`].
macro_rules! dec {
    ($d:expr, $ty:ty) => {
        <$ty as Wire>::decode($d)?
    };
    ($d:expr, $ty:ty, $k:ident) => {
        <kind::$k as Kind<$ty>>::decode($d)?
    };
}

/// Encodes one field: by its type, or by the named [`kind`].
macro_rules! enc {
    ($e:expr, $v:expr, $ty:ty) => {
        <$ty as Wire>::encode($v, $e)
    };
    ($e:expr, $v:expr, $ty:ty, $k:ident) => {
        <kind::$k as Kind<$ty>>::encode($v, $e)
    };
}

/// A message body struct and its wire form, fields in wire order.
macro_rules! wire_struct {
    ($(
        $(#[$m:meta])*
        $name:ident { $($(#[$fm:meta])* $f:ident: $ty:ty $(as $k:ident)?,)* }
    )*) => {$(
        $(#[$m])*
        pub struct $name {
            $($(#[$fm])* pub $f: $ty,)*
        }

        impl Wire for $name {
            fn decode(d: &mut Decoder<'_>) -> Result<Self, DecodeError> {
                Ok($name { $($f: dec!(d, $ty $(, $k)?),)* })
            }
            fn encode(&self, e: &mut Encoder<'_>) {
                $(enc!(e, &self.$f, $ty $(, $k)?);)*
            }
        }
    )*};
}

wire_struct! {
    /// Tversion: negotiate msize and version; resets the session.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tversion {
        /// Largest message the client accepts.
        msize: u32,
        /// Protocol version, `9P2000.L`.
        version: Vec<u8> as Path,
    }

    /// Rversion: the msize and version the server agreed to.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Rversion {
        /// Negotiated msize, at most the client's.
        msize: u32,
        /// `9P2000.L`, or `unknown` for a version the server does not speak.
        version: Vec<u8> as Str,
    }

    /// Tauth: set up an authentication fid (this server needs none).
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tauth {
        /// Auth fid.
        afid: u32,
        /// User name.
        uname: Vec<u8> as Path,
        /// Tree name.
        aname: Vec<u8> as Path,
        /// Numeric user id.
        n_uname: u32,
    }

    /// Tattach: a new fid at the root of the export.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tattach {
        /// New fid.
        fid: u32,
        /// Auth fid ([`super::NOFID`]).
        afid: u32,
        /// User name.
        uname: Vec<u8> as Path,
        /// Tree name.
        aname: Vec<u8> as Path,
        /// Numeric user id.
        n_uname: u32,
    }

    /// Tflush: abort request `oldtag`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tflush {
        /// Tag of the request to abort.
        oldtag: u16,
    }

    /// Twalk: walk `fid` along `wnames` into `newfid`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Twalk {
        /// Start.
        fid: u32,
        /// Result fid (may equal `fid`).
        newfid: u32,
        /// Path elements, at most [`MAXWELEM`].
        wnames: Vec<Vec<u8>> as Wnames,
    }

    /// Tread: read from an open fid.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tread {
        /// Open fid.
        fid: u32,
        /// File offset.
        offset: u64,
        /// Bytes wanted.
        count: u32,
    }

    /// Twrite: write to an open fid. The server's zero-copy path never
    /// builds this struct: it decodes [`TwriteHeader`] and leaves the data
    /// in the transport buffer.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Twrite {
        /// Open fid.
        fid: u32,
        /// File offset.
        offset: u64,
        /// Data (`count[4]` on the wire).
        data: Vec<u8> as Data,
    }

    /// Tclunk / Tremove / Tstatfs / Treadlink: a request naming one fid.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tfid {
        /// The fid.
        fid: u32,
    }

    /// Tlopen: open a walked fid.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tlopen {
        /// Fid to open.
        fid: u32,
        /// Open flags.
        flags: OpenFlags,
    }

    /// Tlcreate: create and open `name` in directory `fid`; `fid` becomes
    /// the new file.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tlcreate {
        /// Directory fid.
        fid: u32,
        /// New name.
        name: Vec<u8> as Name,
        /// Open flags.
        flags: OpenFlags,
        /// Permission bits.
        mode: u32,
        /// Group of the new file.
        gid: u32,
    }

    /// Tsymlink: create symlink `name` → `symtgt` in directory `fid`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tsymlink {
        /// Directory fid.
        fid: u32,
        /// New name.
        name: Vec<u8> as Name,
        /// Link target (stored, never resolved by the server).
        symtgt: Vec<u8> as Path,
        /// Group.
        gid: u32,
    }

    /// Tmknod: create a device node, fifo or socket.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tmknod {
        /// Directory fid.
        dfid: u32,
        /// New name.
        name: Vec<u8> as Name,
        /// File type and permission bits.
        mode: u32,
        /// Device major.
        major: u32,
        /// Device minor.
        minor: u32,
        /// Group.
        gid: u32,
    }

    /// Trename: move `fid` into directory `dfid` as `name`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Trename {
        /// File to move.
        fid: u32,
        /// Target directory.
        dfid: u32,
        /// Target name.
        name: Vec<u8> as Name,
    }

    /// Tgetattr.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tgetattr {
        /// The fid.
        fid: u32,
        /// Attributes wanted.
        request_mask: GetattrMask,
    }

    /// Tsetattr.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tsetattr {
        /// The fid.
        fid: u32,
        /// Attributes to set.
        valid: SetattrMask,
        /// New mode.
        mode: u32,
        /// New owner.
        uid: u32,
        /// New group.
        gid: u32,
        /// New size.
        size: u64,
        /// atime seconds.
        atime_sec: u64,
        /// atime nanoseconds.
        atime_nsec: u64,
        /// mtime seconds.
        mtime_sec: u64,
        /// mtime nanoseconds.
        mtime_nsec: u64,
    }

    /// Txattrwalk: `newfid` reads xattr `name` (or the name list if empty).
    #[derive(Debug, Clone, PartialEq, Eq)]
    Txattrwalk {
        /// File.
        fid: u32,
        /// Fid for reading the value.
        newfid: u32,
        /// Attribute name; empty lists names.
        name: Vec<u8> as XattrName,
    }

    /// Txattrcreate: `fid` becomes a write-only fid for xattr `name`; the
    /// value is written with Twrite and set on Tclunk.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Txattrcreate {
        /// File; becomes the xattr fid.
        fid: u32,
        /// Attribute name.
        name: Vec<u8> as XattrName,
        /// Total value size.
        attr_size: u64,
        /// `XATTR_CREATE` (1) / `XATTR_REPLACE` (2).
        flags: u32,
    }

    /// Treaddir.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Treaddir {
        /// Open directory fid.
        fid: u32,
        /// Offset cookie from the previous entry (0 to start).
        offset: u64,
        /// Most bytes of entries to return.
        count: u32,
    }

    /// Tfsync.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tfsync {
        /// Open fid.
        fid: u32,
        /// Non-zero: data only.
        datasync: u32,
    }

    /// Tlock: a POSIX byte-range lock.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tlock {
        /// Open fid.
        fid: u32,
        /// Lock type.
        ty: LockType,
        /// Lock flags.
        flags: LockFlags,
        /// Start offset.
        start: u64,
        /// Length; 0 means to end of file.
        length: u64,
        /// Client process id.
        proc_id: u32,
        /// Client identity.
        client_id: Vec<u8> as Path,
    }

    /// Tgetlock: test for a conflicting lock.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tgetlock {
        /// Open fid.
        fid: u32,
        /// Lock type to test.
        ty: LockType,
        /// Start.
        start: u64,
        /// Length.
        length: u64,
        /// Client process id.
        proc_id: u32,
        /// Client identity.
        client_id: Vec<u8> as Path,
    }

    /// Tlink: hard link `fid` into `dfid` as `name`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tlink {
        /// Directory.
        dfid: u32,
        /// Existing file.
        fid: u32,
        /// New name.
        name: Vec<u8> as Name,
    }

    /// Tmkdir.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tmkdir {
        /// Parent directory.
        dfid: u32,
        /// New name.
        name: Vec<u8> as Name,
        /// Permission bits.
        mode: u32,
        /// Group.
        gid: u32,
    }

    /// Trenameat.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Trenameat {
        /// Source directory.
        olddirfid: u32,
        /// Source name.
        oldname: Vec<u8> as Name,
        /// Target directory.
        newdirfid: u32,
        /// Target name.
        newname: Vec<u8> as Name,
    }

    /// Tunlinkat.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Tunlinkat {
        /// Directory.
        dirfid: u32,
        /// Name.
        name: Vec<u8> as Name,
        /// [`UnlinkFlags::REMOVEDIR`] or none.
        flags: UnlinkFlags,
    }

    /// Rstatfs.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    Rstatfs {
        /// Filesystem type.
        ty: u32,
        /// Block size.
        bsize: u32,
        /// Total blocks.
        blocks: u64,
        /// Free blocks.
        bfree: u64,
        /// Blocks available to unprivileged users.
        bavail: u64,
        /// Total inodes.
        files: u64,
        /// Free inodes.
        ffree: u64,
        /// Filesystem id.
        fsid: u64,
        /// Longest name.
        namelen: u32,
    }

    /// Rgetattr.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    Rgetattr {
        /// Attributes that are valid.
        valid: GetattrMask,
        /// Qid.
        qid: Qid,
        /// Mode (type and permissions).
        mode: u32,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
        /// Links.
        nlink: u64,
        /// Device number for device nodes.
        rdev: u64,
        /// Size.
        size: u64,
        /// Preferred I/O size.
        blksize: u64,
        /// 512-byte blocks.
        blocks: u64,
        /// atime seconds.
        atime_sec: u64,
        /// atime nanoseconds.
        atime_nsec: u64,
        /// mtime seconds.
        mtime_sec: u64,
        /// mtime nanoseconds.
        mtime_nsec: u64,
        /// ctime seconds.
        ctime_sec: u64,
        /// ctime nanoseconds.
        ctime_nsec: u64,
        /// Birth time seconds.
        btime_sec: u64,
        /// Birth time nanoseconds.
        btime_nsec: u64,
        /// Generation.
        gen: u64,
        /// Data version.
        data_version: u64,
    }

    /// Rgetlock.
    #[derive(Debug, Clone, PartialEq, Eq)]
    Rgetlock {
        /// [`LockType::Unlck`] if there is no conflict, else the
        /// conflicting type.
        ty: LockType,
        /// Conflict start.
        start: u64,
        /// Conflict length.
        length: u64,
        /// Holder's process id.
        proc_id: u32,
        /// Holder's identity.
        client_id: Vec<u8> as Str,
    }

    /// One Rreaddir entry.
    #[derive(Debug, Clone, PartialEq, Eq)]
    DirEntry {
        /// Qid of the entry.
        qid: Qid,
        /// Offset cookie of the next entry.
        offset: u64,
        /// `DT_*` type.
        ty: u8,
        /// Name.
        name: Vec<u8> as Str,
    }
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

impl DirEntry {
    /// Encoded size.
    pub fn size(&self) -> usize {
        QID_SIZE + 8 + 1 + 2 + self.name.len()
    }

    /// Appends the wire form.
    pub fn encode(&self, out: &mut Vec<u8>) {
        Wire::encode(self, &mut Encoder::new(out));
    }

    /// Parses the data of an Rreaddir.
    pub fn decode_all(data: &[u8]) -> Result<Vec<DirEntry>, DecodeError> {
        let mut d = Decoder::new(data);
        let mut out = Vec::new();
        while d.remaining() > 0 {
            out.push(<DirEntry as Wire>::decode(&mut d)?);
        }
        Ok(out)
    }
}

/// Type bytes of 9P2000 and 9P2000.u requests that 9P2000.L does not use
/// (Terror, Topen, Tcreate, Tstat, Twstat): decoding them reports
/// [`DecodeError::NotDotL`].
const NOT_DOT_L: [u8; 5] = [106, 112, 114, 124, 126];

/// Appends the body of an Rgetattr carrying `a`: the bytes
/// `Rmessage::Getattr` encodes, without boxing the attributes first (the
/// server's Tgetattr path, see `Server::handle_recorded`).
pub(crate) fn encode_rgetattr(out: &mut Vec<u8>, a: &Rgetattr) {
    a.encode(&mut Encoder::new(out));
}

/// Bytes of a Tgetattr body: `fid[4] request_mask[8]`.
pub(crate) const TGETATTR_BODY_SIZE: usize = 4 + 8;

/// The Tgetattr of a body of exactly [`TGETATTR_BODY_SIZE`] bytes, as
/// `Tmessage::decode_body` decodes it (the server's Tgetattr path, which
/// builds no `Tmessage`).
pub(crate) fn decode_tgetattr(b: &[u8; TGETATTR_BODY_SIZE]) -> Tgetattr {
    let (fid, mask) = b.split_at(4);
    Tgetattr {
        fid: u32::from_le_bytes(fid.try_into().unwrap_or_default()),
        request_mask: GetattrMask::from_bits_retain(u64::from_le_bytes(
            mask.try_into().unwrap_or_default(),
        )),
    }
}

/// Bytes of a whole Rgetattr frame (it has no variable-length field).
pub(crate) const RGETATTR_FRAME_SIZE: usize = HEADER_SIZE + 8 + QID_SIZE + 3 * 4 + 15 * 8;

/// The whole Rgetattr frame answering `tag` with `a`, built on the stack
/// with stores at fixed offsets: no buffer, no capacity check per field
/// (the commonest reply; the same bytes as [`encode_rgetattr`] behind a
/// header).
pub(crate) fn rgetattr_frame(tag: u16, a: &Rgetattr) -> [u8; RGETATTR_FRAME_SIZE] {
    let mut out = [0u8; RGETATTR_FRAME_SIZE];
    let hdr = Header {
        size: RGETATTR_FRAME_SIZE as u32,
        ty: MsgType::Rgetattr.into(),
        tag,
    };
    out[..HEADER_SIZE].copy_from_slice(&hdr.to_bytes());
    let mut at = HEADER_SIZE;
    let mut put = |b: &[u8]| {
        out[at..at + b.len()].copy_from_slice(b);
        at += b.len();
    };
    put(&a.valid.bits().to_le_bytes());
    put(&a.qid.to_bytes());
    for v in [a.mode, a.uid, a.gid] {
        put(&v.to_le_bytes());
    }
    for v in [
        a.nlink,
        a.rdev,
        a.size,
        a.blksize,
        a.blocks,
        a.atime_sec,
        a.atime_nsec,
        a.mtime_sec,
        a.mtime_nsec,
        a.ctime_sec,
        a.ctime_nsec,
        a.btime_sec,
        a.btime_nsec,
        a.gen,
        a.data_version,
    ] {
        put(&v.to_le_bytes());
    }
    out
}

/// Initial capacity of an encoded frame: enough for every fixed-size
/// message (Rgetattr is the largest at 160 bytes) and short names.
const FRAME_CAPACITY: usize = 256;

/// Declares every request/reply pair once: its name, request type number
/// (the reply's is one more), request body and reply fields.
macro_rules! messages {
    ($(
        $(#[$m:meta])*
        $var:ident = $n:literal,
        $tname:ident($tty:ty),
        $rname:ident $(( $($rf:ident: $rty:ty $(as $rk:ident)?),* ))?;
    )*) => {
        /// The type byte of a 9P2000.L message. Requests (`T*`) are even,
        /// their replies (`R*`) one more; [`MsgType::Rlerror`] answers any
        /// request that failed.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        #[non_exhaustive]
        pub enum MsgType {
            /// Rlerror: a Linux errno (the only reply without a request).
            Rlerror = 7,
            $(
                #[doc = concat!(stringify!($tname), ".")]
                $tname = $n,
                #[doc = concat!(stringify!($rname), ".")]
                $rname = $n + 1,
            )*
        }

        impl MsgType {
            /// Whether this is a request type.
            pub fn is_request(self) -> bool {
                match self {
                    $(MsgType::$tname => true,)*
                    _ => false,
                }
            }

            /// The reply type of a request type; `None` for a reply type.
            pub fn reply(self) -> Option<MsgType> {
                match self {
                    $(MsgType::$tname => Some(MsgType::$rname),)*
                    _ => None,
                }
            }
        }

        impl TryFrom<u8> for MsgType {
            type Error = DecodeError;

            /// The 9P2000.L type of a type byte: [`DecodeError::NotDotL`]
            /// for a 9P2000 request 9P2000.L does not use,
            /// [`DecodeError::UnknownType`] for anything else unknown.
            fn try_from(v: u8) -> Result<Self, DecodeError> {
                let reply = v & 1 == 1;
                match v & !1 {
                    $($n => Ok(if reply { MsgType::$rname } else { MsgType::$tname }),)*
                    _ if v == MsgType::Rlerror => Ok(MsgType::Rlerror),
                    _ if NOT_DOT_L.contains(&v) => Err(DecodeError::NotDotL(v)),
                    _ => Err(DecodeError::UnknownType(v)),
                }
            }
        }

        /// A request.
        #[derive(Debug, Clone, PartialEq, Eq)]
        #[non_exhaustive]
        pub enum Tmessage {
            $($(#[$m])* $var($tty),)*
        }

        impl Tmessage {
            /// The message type.
            pub fn msg_type(&self) -> MsgType {
                match self {
                    $(Tmessage::$var(_) => MsgType::$tname,)*
                }
            }

            /// Decodes the body of a message of type `ty` (the bytes after
            /// the header). The body must be consumed exactly.
            pub fn decode_body(ty: u8, body: &[u8]) -> Result<Tmessage, DecodeError> {
                let mut d = Decoder::new(body);
                let msg = match MsgType::try_from(ty)? {
                    $(MsgType::$tname => Tmessage::$var(dec!(&mut d, $tty)),)*
                    // A reply type in a request.
                    _ => return Err(DecodeError::UnknownType(ty)),
                };
                d.finish()?;
                Ok(msg)
            }

            fn encode_body(&self, e: &mut Encoder<'_>) {
                match self {
                    $(Tmessage::$var(m) => Wire::encode(m, e),)*
                }
            }
        }

        /// A reply.
        #[derive(Debug, Clone, PartialEq, Eq)]
        #[non_exhaustive]
        pub enum Rmessage {
            /// Rlerror with a Linux errno.
            Lerror(u32),
            $($(#[$m])* $var $(( $($rty),* ))?,)*
        }

        impl Rmessage {
            /// The message type.
            pub fn msg_type(&self) -> MsgType {
                match self {
                    Rmessage::Lerror(_) => MsgType::Rlerror,
                    $(Rmessage::$var { .. } => MsgType::$rname,)*
                }
            }

            /// Decodes the body of a reply of type `ty`.
            pub fn decode_body(ty: u8, body: &[u8]) -> Result<Rmessage, DecodeError> {
                let mut d = Decoder::new(body);
                let msg = match MsgType::try_from(ty) {
                    Ok(MsgType::Rlerror) => Rmessage::Lerror(d.u32()?),
                    $(Ok(MsgType::$rname) => {
                        Rmessage::$var $(( $(dec!(&mut d, $rty $(, $rk)?)),* ))?
                    })*
                    _ => return Err(DecodeError::UnknownType(ty)),
                };
                d.finish()?;
                Ok(msg)
            }

            /// Appends the body (everything after the header) to `out`.
            pub fn encode_body(&self, out: &mut Vec<u8>) {
                let e = &mut Encoder::new(out);
                match self {
                    Rmessage::Lerror(errno) => {
                        e.u32(*errno);
                    }
                    $(Rmessage::$var $(( $($rf),* ))? => {
                        $($(enc!(e, $rf, $rty $(, $rk)?);)*)?
                    })*
                }
            }
        }
    };
}

messages! {
    /// Tversion / Rversion.
    Version = 100, Tversion(Tversion), Rversion(m: Rversion);
    /// Tauth / Rauth: the auth fid's qid.
    Auth = 102, Tauth(Tauth), Rauth(qid: Qid);
    /// Tattach / Rattach: the root's qid.
    Attach = 104, Tattach(Tattach), Rattach(qid: Qid);
    /// Tflush / Rflush.
    Flush = 108, Tflush(Tflush), Rflush;
    /// Twalk / Rwalk: one qid per element walked.
    Walk = 110, Twalk(Twalk), Rwalk(qids: Vec<Qid> as Qids);
    /// Tread / Rread: the data.
    Read = 116, Tread(Tread), Rread(data: Vec<u8> as Data);
    /// Twrite / Rwrite: bytes written.
    Write = 118, Twrite(Twrite), Rwrite(count: u32);
    /// Tclunk / Rclunk.
    Clunk = 120, Tclunk(Tfid), Rclunk;
    /// Tremove / Rremove.
    Remove = 122, Tremove(Tfid), Rremove;
    /// Tstatfs / Rstatfs.
    Statfs = 8, Tstatfs(Tfid), Rstatfs(s: Rstatfs);
    /// Tlopen / Rlopen: qid and iounit.
    Lopen = 12, Tlopen(Tlopen), Rlopen(qid: Qid, iounit: u32);
    /// Tlcreate / Rlcreate: qid and iounit.
    Lcreate = 14, Tlcreate(Tlcreate), Rlcreate(qid: Qid, iounit: u32);
    /// Tsymlink / Rsymlink: the link's qid.
    Symlink = 16, Tsymlink(Tsymlink), Rsymlink(qid: Qid);
    /// Tmknod / Rmknod: the node's qid.
    Mknod = 18, Tmknod(Tmknod), Rmknod(qid: Qid);
    /// Trename / Rrename.
    Rename = 20, Trename(Trename), Rrename;
    /// Treadlink / Rreadlink: the target.
    Readlink = 22, Treadlink(Tfid), Rreadlink(target: Vec<u8> as Str);
    /// Tgetattr / Rgetattr.
    Getattr = 24, Tgetattr(Tgetattr), Rgetattr(a: Box<Rgetattr>);
    /// Tsetattr / Rsetattr.
    Setattr = 26, Tsetattr(Tsetattr), Rsetattr;
    /// Txattrwalk / Rxattrwalk: the value's size.
    Xattrwalk = 30, Txattrwalk(Txattrwalk), Rxattrwalk(size: u64);
    /// Txattrcreate / Rxattrcreate.
    Xattrcreate = 32, Txattrcreate(Txattrcreate), Rxattrcreate;
    /// Treaddir / Rreaddir: encoded [`DirEntry`] records.
    Readdir = 40, Treaddir(Treaddir), Rreaddir(data: Vec<u8> as Data);
    /// Tfsync / Rfsync.
    Fsync = 50, Tfsync(Tfsync), Rfsync;
    /// Tlock / Rlock: the status.
    Lock = 52, Tlock(Tlock), Rlock(status: LockStatus);
    /// Tgetlock / Rgetlock.
    Getlock = 54, Tgetlock(Tgetlock), Rgetlock(g: Rgetlock);
    /// Tlink / Rlink.
    Link = 70, Tlink(Tlink), Rlink;
    /// Tmkdir / Rmkdir: the directory's qid.
    Mkdir = 72, Tmkdir(Tmkdir), Rmkdir(qid: Qid);
    /// Trenameat / Rrenameat.
    Renameat = 74, Trenameat(Trenameat), Rrenameat;
    /// Tunlinkat / Runlinkat.
    Unlinkat = 76, Tunlinkat(Tunlinkat), Runlinkat;
}

impl PartialEq<MsgType> for u8 {
    fn eq(&self, other: &MsgType) -> bool {
        *self == *other as u8
    }
}

impl PartialEq<u8> for MsgType {
    fn eq(&self, other: &u8) -> bool {
        *self as u8 == *other
    }
}

impl From<MsgType> for u8 {
    fn from(t: MsgType) -> u8 {
        t as u8
    }
}

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

fn finish_frame(ty: MsgType, tag: u16, mut out: Vec<u8>) -> Vec<u8> {
    let size = out.len() as u32;
    let hdr = Header {
        size,
        ty: ty.into(),
        tag,
    }
    .to_bytes();
    out[..HEADER_SIZE].copy_from_slice(&hdr);
    out
}

impl Tmessage {
    /// Decodes a whole frame (`size[4] type[1] tag[2] body`), checking the
    /// size against `msize`. Returns the tag and the message.
    pub fn decode_frame(frame: &[u8], msize: u32) -> Result<(u16, Tmessage), DecodeError> {
        let h = check_frame(frame, msize)?;
        Ok((h.tag, Self::decode_body(h.ty, &frame[HEADER_SIZE..])?))
    }

    /// Encodes the whole frame with `tag`.
    pub fn encode_frame(&self, tag: u16) -> Vec<u8> {
        let data = match self {
            Tmessage::Write(m) => m.data.len(),
            _ => 0,
        };
        let mut out = Vec::with_capacity(FRAME_CAPACITY + data);
        out.resize(HEADER_SIZE, 0);
        self.encode_body(&mut Encoder::new(&mut out));
        finish_frame(self.msg_type(), tag, out)
    }
}

impl Rmessage {
    /// Decodes a whole reply frame, checking its size against `msize`.
    pub fn decode_frame(frame: &[u8], msize: u32) -> Result<(u16, Rmessage), DecodeError> {
        let h = check_frame(frame, msize)?;
        Ok((h.tag, Self::decode_body(h.ty, &frame[HEADER_SIZE..])?))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_encode_rgetattr_matches_the_boxed_reply() {
        let a = Rgetattr {
            valid: GetattrMask::BASIC | GetattrMask::BTIME,
            qid: Qid {
                ty: QidType::FILE,
                version: 7,
                path: 0x1234_5678_9abc,
            },
            mode: 0o100644,
            uid: 1000,
            gid: 100,
            nlink: 1,
            size: 4097,
            blksize: 4096,
            blocks: 16,
            mtime_sec: 1_700_000_000,
            mtime_nsec: 999_999_999,
            btime_sec: 1,
            data_version: u64::MAX,
            ..Default::default()
        };
        let (mut direct, mut boxed) = (Vec::new(), Vec::new());
        encode_rgetattr(&mut direct, &a);
        Rmessage::Getattr(Box::new(a)).encode_body(&mut boxed);
        assert_eq!(direct, boxed);
        assert_eq!(direct.len() + HEADER_SIZE, 160);
        let frame = rgetattr_frame(0x1234, &a);
        assert_eq!(frame.len(), RGETATTR_FRAME_SIZE);
        assert_eq!(
            frame.to_vec(),
            Rmessage::Getattr(Box::new(a)).encode_frame(0x1234)
        );
        let back = Rmessage::decode_body(MsgType::Rgetattr.into(), &direct).unwrap();
        assert_eq!(back, Rmessage::Getattr(Box::new(a)));
    }

    #[test]
    fn test_decode_tgetattr_matches_decode_body() {
        let m = Tgetattr {
            fid: 0xdead_beef,
            request_mask: GetattrMask::from_bits_retain(0x8000_0000_0000_3fff),
        };
        let frame = Tmessage::Getattr(m.clone()).encode_frame(3);
        let body: &[u8; TGETATTR_BODY_SIZE] = frame[HEADER_SIZE..].try_into().unwrap();
        assert_eq!(decode_tgetattr(body), m);
        assert_eq!(
            Tmessage::decode_body(MsgType::Tgetattr.into(), body).unwrap(),
            Tmessage::Getattr(decode_tgetattr(body))
        );
    }

    #[test]
    fn test_msg_type_numbers_and_pairs() {
        assert_eq!(u8::from(MsgType::Tversion), 100);
        assert_eq!(u8::from(MsgType::Rversion), 101);
        assert_eq!(u8::from(MsgType::Rlerror), 7);
        assert_eq!(u8::from(MsgType::Tstatfs), 8);
        assert_eq!(u8::from(MsgType::Runlinkat), 77);
        assert_eq!(MsgType::Tread.reply(), Some(MsgType::Rread));
        assert_eq!(MsgType::Rread.reply(), None);
        assert!(MsgType::Tflush.is_request() && !MsgType::Rlerror.is_request());
        for v in 0..=u8::MAX {
            if let Ok(t) = MsgType::try_from(v) {
                assert_eq!(u8::from(t), v, "type {v} round trip");
            }
        }
    }

    #[test]
    fn test_msg_type_refuses_unknown_and_legacy() {
        assert_eq!(MsgType::try_from(6), Err(DecodeError::UnknownType(6)));
        assert_eq!(MsgType::try_from(107), Err(DecodeError::UnknownType(107)));
        assert_eq!(MsgType::try_from(112), Err(DecodeError::NotDotL(112)));
        assert_eq!(MsgType::try_from(200), Err(DecodeError::UnknownType(200)));
        // A reply type is no request, and the reverse.
        assert_eq!(
            Tmessage::decode_body(101, &[]),
            Err(DecodeError::UnknownType(101))
        );
        assert_eq!(
            Rmessage::decode_body(112, &[]),
            Err(DecodeError::UnknownType(112))
        );
        assert_eq!(
            Tmessage::decode_body(124, &[]),
            Err(DecodeError::NotDotL(124))
        );
    }

    #[test]
    fn test_lock_type_is_strict() {
        let mut body = Vec::new();
        Encoder::new(&mut body)
            .u32(1)
            .u8(3)
            .u32(0)
            .u64(0)
            .u64(0)
            .u32(0)
            .string(b"");
        let e = Tmessage::decode_body(MsgType::Tlock.into(), &body).unwrap_err();
        assert_eq!(e, DecodeError::LockType(3));
        assert_eq!(e.errno(), libc::EINVAL as u32);
        assert_eq!(
            Rmessage::decode_body(MsgType::Rlock.into(), &[4]),
            Err(DecodeError::LockStatus(4))
        );
    }

    #[test]
    fn test_flags_keep_unknown_bits() {
        let msg = Tmessage::Lopen(Tlopen {
            fid: 1,
            flags: OpenFlags::from_bits_retain(0x8000_0002),
        });
        let frame = msg.encode_frame(5);
        assert_eq!(Tmessage::decode_frame(&frame, 8192), Ok((5, msg)));
        assert_eq!(OpenFlags::RDWR.access_mode(), OpenFlags::RDWR);
        assert_eq!(OpenFlags::TRUNC.access_mode(), OpenFlags::RDONLY);
    }
}
