// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Inputs of the `p9_decode` and `p9_session` targets.
//!
//! `p9_decode` takes raw bytes; [`decode_seeds`] gives one encoded frame of
//! every request and reply type. `p9_session` takes a [`SessionInput`]: a
//! server configuration and a sequence of request frames, each either raw
//! fuzz bytes (with the size field optionally fixed up) or generated from
//! structured fields with small fids and names that aim at the edges of
//! the export (`..`, symlinks leaving it, the canary directory beside it).

use virtio_9p_server::protocol::*;

use crate::bytes::{ByteSink, ByteSource};

/// Most requests in one session input.
pub const MAX_STEPS: usize = 48;
/// Longest raw frame or generated payload.
pub const MAX_FRAME: usize = 16 << 10;
/// The largest msize the fuzzed server grants (small, so reply buffers stay
/// cheap; Tversion may ask for anything).
pub const SERVER_MSIZE: u32 = 64 << 10;

/// Names the structured generator picks from: entries of the seeded export
/// (see the `p9_session` target), the canary beside it, and invalid names.
pub const NAMES: &[&[u8]] = &[
    b"file",
    b"dir",
    b"inner",
    b"up",
    b"abs",
    b"loop",
    b"new",
    b"new2",
    b".",
    b"..",
    b"",
    b"../canary",
    b"canary",
    b"secret",
    b"/",
    b"a/b",
    b"...",
    b"export",
    b"dirlink",
    b"hard",
];
/// Symlink targets the generator picks from.
pub const TARGETS: &[&[u8]] = &[
    b"file",
    b"..",
    b"../canary",
    b"../canary/secret",
    b"/",
    b"/etc/passwd",
    b"dir/inner",
    b"",
];
/// Xattr names the generator picks from.
pub const XATTRS: &[&[u8]] = &[
    b"user.fuzz",
    b"user.virtfs.uid",
    b"user.virtfs.mode",
    b"security.capability",
    b"trusted.x",
    b"system.posix_acl_access",
    b"",
    b"user.",
];

/// The server set-up of one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionConfig {
    /// Export read-only.
    pub readonly: bool,
    /// 0 passthrough, 1 mapped-xattr, 2 none.
    pub security_model: u8,
    /// Resolve with `openat2` (else the `openat(O_NOFOLLOW)` fallback).
    pub openat2: bool,
}

impl SessionConfig {
    /// The passthrough settings of this set-up for the export `dir`.
    pub fn passthrough(
        &self,
        dir: impl Into<std::path::PathBuf>,
    ) -> virtio_9p_server::PassthroughConfig {
        let mut cfg = virtio_9p_server::PassthroughConfig::new(dir);
        cfg.readonly = self.readonly;
        cfg.security_model = match self.security_model {
            0 => virtio_9p_server::SecurityModel::Passthrough,
            1 => virtio_9p_server::SecurityModel::MappedXattr,
            _ => virtio_9p_server::SecurityModel::None,
        };
        cfg.use_openat2 = self.openat2;
        cfg
    }
}

/// The server limits both 9P targets run with: [`SERVER_MSIZE`], 32 fids,
/// blocking locks that wait 1 ms.
pub fn server_config() -> virtio_9p_server::Config {
    let mut cfg = virtio_9p_server::Config::default();
    cfg.msize_max = SERVER_MSIZE;
    cfg.max_fids = 32;
    cfg.lock_wait = Some(std::time::Duration::from_millis(1));
    cfg
}

/// A session: configuration and request frames in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInput {
    /// Server set-up.
    pub config: SessionConfig,
    /// Whole request frames.
    pub frames: Vec<Vec<u8>>,
}

impl SessionInput {
    /// Decodes any bytes.
    pub fn decode(data: &[u8]) -> Self {
        let mut s = ByteSource::new(data);
        let c = s.u8();
        let config = SessionConfig {
            readonly: c & 1 != 0,
            security_model: ((c >> 1) & 3) % 3,
            openat2: c & 16 == 0,
        };
        let mut frames = Vec::new();
        while !s.is_empty() && frames.len() < MAX_STEPS {
            let kind = s.u8();
            let frame = frame(kind, &mut s);
            frames.push(frame);
        }
        SessionInput { config, frames }
    }

    /// Encodes the input (every frame as raw bytes) so that
    /// [`decode`](Self::decode) gives it back.
    pub fn encode(&self) -> Vec<u8> {
        let mut k = ByteSink::new();
        let c = &self.config;
        k.u8(u8::from(c.readonly) | (c.security_model % 3) << 1 | u8::from(!c.openat2) << 4);
        for f in &self.frames {
            assert!(f.len() <= MAX_FRAME, "seed frame of {} bytes", f.len());
            k.u8(0).bytes(f);
        }
        k.into_bytes()
    }
}

/// One request frame: `kind % 4` is 0 for raw bytes, 1 for raw bytes with
/// the size field set to their length, 2 and 3 for a request generated
/// from structured fields (a tag, then [`generate`]).
pub fn frame(kind: u8, s: &mut ByteSource<'_>) -> Vec<u8> {
    match kind % 4 {
        0 => s.bytes(MAX_FRAME).to_vec(),
        1 => {
            let mut f = s.bytes(MAX_FRAME).to_vec();
            if f.len() >= 4 {
                let n = f.len() as u32;
                f[..4].copy_from_slice(&n.to_le_bytes());
            }
            f
        }
        _ => {
            let tag = s.u16();
            generate(s).encode_frame(tag)
        }
    }
}

fn fid(s: &mut ByteSource<'_>) -> u32 {
    match s.u8() {
        b @ 0..=239 => u32::from(b % 12),
        240..=254 => s.u32(),
        _ => NOFID,
    }
}

fn pick(s: &mut ByteSource<'_>, dict: &[&[u8]]) -> Vec<u8> {
    let b = usize::from(s.u8());
    match dict.get(b) {
        Some(n) => n.to_vec(),
        // Anything else: raw bytes (possibly with NUL or '/'), or a long name.
        None if b == 255 => vec![b'x'; 256],
        None => s.bytes(300).to_vec(),
    }
}

fn small_u64(s: &mut ByteSource<'_>) -> u64 {
    match s.u8() {
        b @ 0..=200 => u64::from(b) * 512,
        201..=250 => u64::from(s.u32()),
        _ => s.u64(),
    }
}

fn count(s: &mut ByteSource<'_>) -> u32 {
    match s.u8() {
        b @ 0..=200 => u32::from(b) * 64,
        _ => s.u32(),
    }
}

const OPEN_FLAGS: [OpenFlags; 8] = [
    OpenFlags::RDONLY,
    OpenFlags::WRONLY,
    OpenFlags::RDWR,
    OpenFlags::RDWR.union(OpenFlags::TRUNC),
    OpenFlags::RDONLY.union(OpenFlags::DIRECTORY),
    OpenFlags::WRONLY.union(OpenFlags::APPEND),
    OpenFlags::RDWR
        .union(OpenFlags::NOFOLLOW)
        .union(OpenFlags::NONBLOCK),
    OpenFlags::ACCMODE,
];

/// A lock type: the three 9P2000.L ones (any other byte is refused at
/// decode, see `DecodeError::LockType`).
fn lock_type(s: &mut ByteSource<'_>) -> LockType {
    match s.u8() % 3 {
        0 => LockType::Rdlck,
        1 => LockType::Wrlck,
        _ => LockType::Unlck,
    }
}

fn flags(s: &mut ByteSource<'_>) -> OpenFlags {
    let b = s.u8();
    match OPEN_FLAGS.get(usize::from(b)) {
        Some(f) => *f,
        None => OpenFlags::from_bits_retain(s.u32()),
    }
}

const MODES: [u32; 8] = [
    0o644, 0o755, 0o100644, 0o010644, // FIFO
    0o020644, // char device
    0o060644, // block device
    0o140755, // socket
    0o4777,
];

fn mode(s: &mut ByteSource<'_>) -> u32 {
    let b = s.u8();
    match MODES.get(usize::from(b)) {
        Some(m) => *m,
        None => s.u32(),
    }
}

fn uid(s: &mut ByteSource<'_>) -> u32 {
    match s.u8() % 4 {
        0 => 0,
        1 => 1000,
        2 => u32::MAX,
        _ => s.u32(),
    }
}

/// One request from structured fields (total: any bytes give a message).
pub fn generate(s: &mut ByteSource<'_>) -> Tmessage {
    match s.u8() % 30 {
        0 => Tmessage::Version(Tversion {
            msize: match s.u8() % 4 {
                0 => 8192,
                1 => SERVER_MSIZE,
                2 => MIN_MSIZE,
                _ => s.u32(),
            },
            version: if s.bool() {
                VERSION_9P2000_L.to_vec()
            } else {
                s.bytes(32).to_vec()
            },
        }),
        1 => Tmessage::Auth(Tauth {
            afid: fid(s),
            uname: pick(s, NAMES),
            aname: pick(s, NAMES),
            n_uname: uid(s),
        }),
        2 | 3 => Tmessage::Attach(Tattach {
            fid: fid(s),
            afid: NOFID,
            uname: b"root".to_vec(),
            aname: if s.bool() { Vec::new() } else { pick(s, NAMES) },
            n_uname: uid(s),
        }),
        4 => Tmessage::Flush(Tflush { oldtag: s.u16() }),
        5 | 6 => {
            let (f, newfid) = (fid(s), fid(s));
            let n = usize::from(s.u8() % 18);
            Tmessage::Walk(Twalk {
                fid: f,
                newfid,
                wnames: (0..n).map(|_| pick(s, NAMES)).collect(),
            })
        }
        7 => Tmessage::Read(Tread {
            fid: fid(s),
            offset: small_u64(s),
            count: count(s),
        }),
        8 => Tmessage::Write(Twrite {
            fid: fid(s),
            offset: small_u64(s),
            data: s.bytes(MAX_FRAME).to_vec(),
        }),
        9 => Tmessage::Clunk(Tfid { fid: fid(s) }),
        10 => Tmessage::Remove(Tfid { fid: fid(s) }),
        11 => Tmessage::Statfs(Tfid { fid: fid(s) }),
        12 => Tmessage::Lopen(Tlopen {
            fid: fid(s),
            flags: flags(s),
        }),
        13 => Tmessage::Lcreate(Tlcreate {
            fid: fid(s),
            name: pick(s, NAMES),
            flags: flags(s),
            mode: mode(s),
            gid: uid(s),
        }),
        14 => Tmessage::Symlink(Tsymlink {
            fid: fid(s),
            name: pick(s, NAMES),
            symtgt: pick(s, TARGETS),
            gid: uid(s),
        }),
        15 => Tmessage::Mknod(Tmknod {
            dfid: fid(s),
            name: pick(s, NAMES),
            mode: mode(s),
            major: u32::from(s.u8()),
            minor: u32::from(s.u8()),
            gid: uid(s),
        }),
        16 => Tmessage::Rename(Trename {
            fid: fid(s),
            dfid: fid(s),
            name: pick(s, NAMES),
        }),
        17 => Tmessage::Readlink(Tfid { fid: fid(s) }),
        18 => Tmessage::Getattr(Tgetattr {
            fid: fid(s),
            request_mask: if s.bool() {
                GetattrMask::ALL
            } else {
                GetattrMask::from_bits_retain(s.u64())
            },
        }),
        19 => Tmessage::Setattr(Tsetattr {
            fid: fid(s),
            valid: SetattrMask::from_bits_retain(u32::from(s.u16())),
            mode: mode(s),
            uid: uid(s),
            gid: uid(s),
            size: small_u64(s),
            atime_sec: small_u64(s),
            atime_nsec: small_u64(s),
            mtime_sec: small_u64(s),
            mtime_nsec: small_u64(s),
        }),
        20 => Tmessage::Xattrwalk(Txattrwalk {
            fid: fid(s),
            newfid: fid(s),
            name: pick(s, XATTRS),
        }),
        21 => Tmessage::Xattrcreate(Txattrcreate {
            fid: fid(s),
            name: pick(s, XATTRS),
            attr_size: small_u64(s),
            flags: u32::from(s.u8() % 4),
        }),
        22 => Tmessage::Readdir(Treaddir {
            fid: fid(s),
            offset: small_u64(s),
            count: count(s),
        }),
        23 => Tmessage::Fsync(Tfsync {
            fid: fid(s),
            datasync: u32::from(s.u8() % 2),
        }),
        24 => Tmessage::Lock(Tlock {
            fid: fid(s),
            ty: lock_type(s),
            flags: LockFlags::from_bits_retain(u32::from(s.u8() % 4)),
            start: small_u64(s),
            length: small_u64(s),
            proc_id: s.u32(),
            client_id: s.bytes(16).to_vec(),
        }),
        25 => Tmessage::Getlock(Tgetlock {
            fid: fid(s),
            ty: lock_type(s),
            start: small_u64(s),
            length: small_u64(s),
            proc_id: s.u32(),
            client_id: s.bytes(16).to_vec(),
        }),
        26 => Tmessage::Link(Tlink {
            dfid: fid(s),
            fid: fid(s),
            name: pick(s, NAMES),
        }),
        27 => Tmessage::Mkdir(Tmkdir {
            dfid: fid(s),
            name: pick(s, NAMES),
            mode: mode(s),
            gid: uid(s),
        }),
        28 => Tmessage::Renameat(Trenameat {
            olddirfid: fid(s),
            oldname: pick(s, NAMES),
            newdirfid: fid(s),
            newname: pick(s, NAMES),
        }),
        _ => Tmessage::Unlinkat(Tunlinkat {
            dirfid: fid(s),
            name: pick(s, NAMES),
            flags: if s.bool() {
                UnlinkFlags::empty()
            } else {
                UnlinkFlags::REMOVEDIR | UnlinkFlags::from_bits_retain(u32::from(s.u8() & 1))
            },
        }),
    }
}

fn version(msize: u32) -> Vec<u8> {
    Tmessage::Version(Tversion {
        msize,
        version: VERSION_9P2000_L.to_vec(),
    })
    .encode_frame(NOTAG)
}

fn attach(fid: u32, aname: &[u8]) -> Tmessage {
    Tmessage::Attach(Tattach {
        fid,
        afid: NOFID,
        uname: b"root".to_vec(),
        aname: aname.to_vec(),
        n_uname: 0,
    })
}

fn walk(fid: u32, newfid: u32, names: &[&[u8]]) -> Tmessage {
    Tmessage::Walk(Twalk {
        fid,
        newfid,
        wnames: names.iter().map(|n| n.to_vec()).collect(),
    })
}

fn session(config: SessionConfig, msgs: Vec<Tmessage>) -> SessionInput {
    let mut frames = vec![version(SERVER_MSIZE)];
    frames.extend(
        msgs.iter()
            .enumerate()
            .map(|(i, m)| m.encode_frame(i as u16 + 1)),
    );
    SessionInput { config, frames }
}

const SETATTR_NONE: Tsetattr = Tsetattr {
    fid: 0,
    valid: SetattrMask::empty(),
    mode: 0,
    uid: 0,
    gid: 0,
    size: 0,
    atime_sec: 0,
    atime_nsec: 0,
    mtime_sec: 0,
    mtime_nsec: 0,
};

const PLAIN: SessionConfig = SessionConfig {
    readonly: false,
    security_model: 0,
    openat2: true,
};

/// Named seeds for the `p9_session` corpus.
pub fn session_seeds() -> Vec<(&'static str, SessionInput)> {
    use Tmessage as T;
    let open = |fid, flags| T::Lopen(Tlopen { fid, flags });
    let read = |fid, offset, count| T::Read(Tread { fid, offset, count });
    let write = |fid, offset, data: &[u8]| {
        T::Write(Twrite {
            fid,
            offset,
            data: data.to_vec(),
        })
    };
    let clunk = |fid| T::Clunk(Tfid { fid });
    let getattr = |fid| {
        T::Getattr(Tgetattr {
            fid,
            request_mask: GetattrMask::ALL,
        })
    };
    let readdir = |fid| {
        T::Readdir(Treaddir {
            fid,
            offset: 0,
            count: 8192,
        })
    };
    let mkdir = |dfid, name: &[u8]| {
        T::Mkdir(Tmkdir {
            dfid,
            name: name.to_vec(),
            mode: 0o755,
            gid: 0,
        })
    };
    let lcreate = |fid, name: &[u8]| {
        T::Lcreate(Tlcreate {
            fid,
            name: name.to_vec(),
            flags: OpenFlags::RDWR,
            mode: 0o644,
            gid: 0,
        })
    };
    let mut out = vec![
        (
            "read-write",
            session(
                PLAIN,
                vec![
                    attach(0, b""),
                    walk(0, 1, &[b"file"]),
                    open(1, OpenFlags::RDWR),
                    write(1, 0, b"hello 9p"),
                    read(1, 0, 4096),
                    T::Fsync(Tfsync {
                        fid: 1,
                        datasync: 1,
                    }),
                    getattr(1),
                    clunk(1),
                    T::Statfs(Tfid { fid: 0 }),
                ],
            ),
        ),
        (
            "directories",
            session(
                PLAIN,
                vec![
                    attach(0, b""),
                    walk(0, 1, &[b"dir"]),
                    open(1, OpenFlags::RDONLY | OpenFlags::DIRECTORY),
                    readdir(1),
                    walk(0, 2, &[b"dir"]),
                    lcreate(2, b"new"),
                    write(2, 0, b"data"),
                    mkdir(0, b"new2"),
                    T::Renameat(Trenameat {
                        olddirfid: 0,
                        oldname: b"new2".to_vec(),
                        newdirfid: 0,
                        newname: b"new3".to_vec(),
                    }),
                    T::Unlinkat(Tunlinkat {
                        dirfid: 0,
                        name: b"new3".to_vec(),
                        flags: UnlinkFlags::REMOVEDIR,
                    }),
                    walk(0, 3, &[b"dir", b"new"]),
                    T::Remove(Tfid { fid: 3 }),
                ],
            ),
        ),
        (
            "escape-attempts",
            session(
                PLAIN,
                vec![
                    attach(0, b"../canary"),
                    attach(1, b""),
                    walk(1, 2, &[b".."]),
                    getattr(2),
                    walk(1, 3, &[b"up", b"secret"]),
                    walk(1, 4, &[b"abs"]),
                    open(4, OpenFlags::RDWR | OpenFlags::TRUNC),
                    walk(1, 5, &[b"up"]),
                    lcreate(5, b"planted"),
                    mkdir(5, b"planted"),
                    T::Symlink(Tsymlink {
                        fid: 1,
                        name: b"esc".to_vec(),
                        symtgt: b"../canary".to_vec(),
                        gid: 0,
                    }),
                    walk(1, 6, &[b"esc", b"secret"]),
                    walk(1, 7, &[b"up"]),
                    T::Link(Tlink {
                        dfid: 1,
                        fid: 7,
                        name: b"hard".to_vec(),
                    }),
                    T::Renameat(Trenameat {
                        olddirfid: 1,
                        oldname: b"file".to_vec(),
                        newdirfid: 1,
                        newname: b"../moved".to_vec(),
                    }),
                    T::Rename(Trename {
                        fid: 1,
                        dfid: 1,
                        name: b"x".to_vec(),
                    }),
                    T::Remove(Tfid { fid: 1 }),
                    T::Readlink(Tfid { fid: 5 }),
                    T::Setattr(Tsetattr {
                        fid: 5,
                        valid: SetattrMask::MODE | SetattrMask::SIZE,
                        mode: 0o777,
                        size: 0,
                        ..SETATTR_NONE
                    }),
                ],
            ),
        ),
        (
            "xattrs",
            session(
                PLAIN,
                vec![
                    attach(0, b""),
                    walk(0, 1, &[b"file"]),
                    T::Xattrcreate(Txattrcreate {
                        fid: 1,
                        name: b"user.fuzz".to_vec(),
                        attr_size: 5,
                        flags: 0,
                    }),
                    write(1, 0, b"value"),
                    clunk(1),
                    walk(0, 2, &[b"file"]),
                    T::Xattrwalk(Txattrwalk {
                        fid: 2,
                        newfid: 3,
                        name: b"user.fuzz".to_vec(),
                    }),
                    read(3, 0, 64),
                    T::Xattrwalk(Txattrwalk {
                        fid: 2,
                        newfid: 4,
                        name: Vec::new(),
                    }),
                    read(4, 0, 4096),
                ],
            ),
        ),
        (
            "locks",
            session(
                PLAIN,
                vec![
                    attach(0, b""),
                    walk(0, 1, &[b"file"]),
                    open(1, OpenFlags::RDWR),
                    T::Lock(Tlock {
                        fid: 1,
                        ty: LockType::Wrlck,
                        flags: LockFlags::BLOCK,
                        start: 0,
                        length: 10,
                        proc_id: 1,
                        client_id: b"guest".to_vec(),
                    }),
                    T::Getlock(Tgetlock {
                        fid: 1,
                        ty: LockType::Rdlck,
                        start: 0,
                        length: 0,
                        proc_id: 2,
                        client_id: b"other".to_vec(),
                    }),
                    T::Lock(Tlock {
                        fid: 1,
                        ty: LockType::Unlck,
                        flags: LockFlags::empty(),
                        start: 0,
                        length: 0,
                        proc_id: 1,
                        client_id: b"guest".to_vec(),
                    }),
                ],
            ),
        ),
        (
            "nodes-and-attrs",
            session(
                PLAIN,
                vec![
                    attach(0, b""),
                    T::Mknod(Tmknod {
                        dfid: 0,
                        name: b"fifo".to_vec(),
                        mode: 0o010644,
                        major: 0,
                        minor: 0,
                        gid: 0,
                    }),
                    walk(0, 1, &[b"fifo"]),
                    open(1, OpenFlags::RDONLY),
                    T::Symlink(Tsymlink {
                        fid: 0,
                        name: b"sl".to_vec(),
                        symtgt: b"file".to_vec(),
                        gid: 0,
                    }),
                    walk(0, 2, &[b"sl"]),
                    T::Readlink(Tfid { fid: 2 }),
                    walk(0, 3, &[b"file"]),
                    T::Setattr(Tsetattr {
                        fid: 3,
                        valid: SetattrMask::MODE
                            | SetattrMask::UID
                            | SetattrMask::GID
                            | SetattrMask::SIZE
                            | SetattrMask::MTIME
                            | SetattrMask::MTIME_SET,
                        mode: 0o600,
                        uid: 1000,
                        gid: 1000,
                        size: 1 << 20,
                        mtime_sec: 1,
                        ..SETATTR_NONE
                    }),
                    getattr(3),
                    walk(0, 4, &[b"loop"]),
                    open(4, OpenFlags::RDONLY),
                ],
            ),
        ),
        (
            "flush-and-reversion",
            session(
                PLAIN,
                vec![
                    attach(0, b""),
                    T::Flush(Tflush { oldtag: 1 }),
                    T::Version(Tversion {
                        msize: 4096,
                        version: b"9P2000.L".to_vec(),
                    }),
                    walk(0, 1, &[b"file"]),
                    attach(0, b""),
                    read(0, 0, 1 << 20),
                    T::Auth(Tauth {
                        afid: 5,
                        uname: b"u".to_vec(),
                        aname: Vec::new(),
                        n_uname: 0,
                    }),
                ],
            ),
        ),
    ];
    let mut readonly = session(
        SessionConfig {
            readonly: true,
            ..PLAIN
        },
        vec![
            attach(0, b""),
            walk(0, 1, &[b"file"]),
            open(1, OpenFlags::RDWR),
            lcreate(0, b"new"),
            mkdir(0, b"new2"),
        ],
    );
    readonly.frames.push(vec![0, 0, 0, 0, 0, 0, 0]);
    readonly
        .frames
        .push(b"\x0b\x00\x00\x00\x78\x01\x00\x00\x00\x00\x00".to_vec());
    out.push(("readonly-and-bad-frames", readonly));
    out.push((
        "mapped-xattr",
        session(
            SessionConfig {
                security_model: 1,
                openat2: false,
                ..PLAIN
            },
            vec![
                attach(0, b""),
                mkdir(0, b"m"),
                walk(0, 1, &[b"m"]),
                lcreate(1, b"f"),
                T::Setattr(Tsetattr {
                    fid: 1,
                    valid: SetattrMask::MODE | SetattrMask::UID,
                    mode: 0o4755,
                    uid: 1000,
                    ..SETATTR_NONE
                }),
                getattr(1),
                T::Mknod(Tmknod {
                    dfid: 0,
                    name: b"dev".to_vec(),
                    mode: 0o020644,
                    major: 1,
                    minor: 3,
                    gid: 0,
                }),
                walk(0, 2, &[b"dev"]),
                getattr(2),
            ],
        ),
    ));
    out
}

/// One frame of every request and reply type, for the `p9_decode` corpus.
pub fn decode_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, input) in session_seeds() {
        for (i, f) in input.frames.iter().enumerate() {
            out.push((format!("t-{name}-{i}"), f.clone()));
        }
    }
    let qid = Qid {
        ty: QidType::DIR,
        version: 1,
        path: 42,
    };
    let entry = DirEntry {
        qid,
        offset: 1,
        ty: 4,
        name: b"dir".to_vec(),
    };
    let mut dirents = Vec::new();
    entry.encode(&mut dirents);
    DirEntry {
        name: b"file".to_vec(),
        offset: 2,
        ty: 8,
        ..entry
    }
    .encode(&mut dirents);
    let replies = [
        Rmessage::Lerror(2),
        Rmessage::Version(Rversion {
            msize: 8192,
            version: VERSION_9P2000_L.to_vec(),
        }),
        Rmessage::Auth(qid),
        Rmessage::Attach(qid),
        Rmessage::Flush,
        Rmessage::Walk(vec![qid; 3]),
        Rmessage::Read(b"data".to_vec()),
        Rmessage::Write(4),
        Rmessage::Clunk,
        Rmessage::Remove,
        Rmessage::Statfs(Rstatfs {
            bsize: 4096,
            namelen: 255,
            ..Default::default()
        }),
        Rmessage::Lopen(qid, 0),
        Rmessage::Lcreate(qid, 8192),
        Rmessage::Symlink(qid),
        Rmessage::Mknod(qid),
        Rmessage::Rename,
        Rmessage::Readlink(b"../target".to_vec()),
        Rmessage::Getattr(Box::new(Rgetattr {
            valid: GetattrMask::BASIC,
            qid,
            mode: 0o40755,
            ..Default::default()
        })),
        Rmessage::Setattr,
        Rmessage::Xattrwalk(12),
        Rmessage::Xattrcreate,
        Rmessage::Readdir(dirents),
        Rmessage::Fsync,
        Rmessage::Lock(LockStatus::Success),
        Rmessage::Getlock(Rgetlock {
            ty: LockType::Unlck,
            start: 0,
            length: 0,
            proc_id: 7,
            client_id: b"c".to_vec(),
        }),
        Rmessage::Link,
        Rmessage::Mkdir(qid),
        Rmessage::Renameat,
        Rmessage::Unlinkat,
    ];
    for r in replies {
        out.push((format!("r-{}", u8::from(r.msg_type())), r.encode_frame(7)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_session_seeds_roundtrip_and_are_written() {
        let seeds = session_seeds();
        for (name, input) in &seeds {
            assert_eq!(&SessionInput::decode(&input.encode()), input, "seed {name}");
        }
        let n = crate::corpus::write("p9_session", seeds.iter().map(|(n, i)| (*n, i.encode())));
        assert_eq!(n, seeds.len());
    }

    #[test]
    fn test_decode_seeds_decode_and_are_written() {
        let seeds = decode_seeds();
        for (name, frame) in &seeds {
            let t = Tmessage::decode_frame(frame, MAX_MSIZE);
            let r = Rmessage::decode_frame(frame, MAX_MSIZE);
            assert!(
                t.is_ok() || r.is_ok() || name.contains("bad-frames"),
                "seed {name}"
            );
        }
        crate::corpus::write(
            "p9_decode",
            seeds.iter().map(|(n, b)| (n.as_str(), b.clone())),
        );
    }

    #[test]
    fn test_generated_requests_encode() {
        // Every generator arm, from deterministic bytes picking dictionary
        // names: each frame carries its type and decodes back to the message.
        let mut decoded = 0;
        for ty in 0..30u8 {
            let data = [ty, 3, 1, 2, 4, 1, 0, 5, 1, 1, 1, 1, 1, 1, 1, 1];
            let msg = generate(&mut ByteSource::new(&data));
            let frame = msg.encode_frame(1);
            assert_eq!(frame[4], msg.msg_type());
            if let Ok((tag, back)) = Tmessage::decode_frame(&frame, MAX_MSIZE) {
                assert_eq!((tag, &back), (1, &msg));
                decoded += 1;
            }
        }
        assert_eq!(decoded, 30);
    }

    #[test]
    fn test_fixed_size_frames() {
        let mut k = ByteSink::new();
        k.u8(0)
            .u8(1)
            .bytes(&[0xff, 0xff, 0xff, 0xff, 100, 0xff, 0xff]);
        let input = SessionInput::decode(&k.into_bytes());
        assert_eq!(input.frames, vec![vec![7, 0, 0, 0, 100, 0xff, 0xff]]);
    }
}
