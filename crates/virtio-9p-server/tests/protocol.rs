// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Encode/decode round trips of every message (proptest) and every decode
//! error path.

use proptest::prelude::*;
use virtio_9p_server::protocol::*;

fn s() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(1u8..=255, 0..40)
}

fn qid() -> impl Strategy<Value = Qid> {
    (any::<u8>(), any::<u32>(), any::<u64>()).prop_map(|(ty, version, path)| Qid {
        ty: QidType::from_bits_retain(ty),
        version,
        path,
    })
}

fn lock_type() -> impl Strategy<Value = LockType> {
    prop::sample::select(vec![LockType::Rdlck, LockType::Wrlck, LockType::Unlck])
}

fn lock_status() -> impl Strategy<Value = LockStatus> {
    prop::sample::select(vec![
        LockStatus::Success,
        LockStatus::Blocked,
        LockStatus::Error,
        LockStatus::Grace,
    ])
}

/// The type byte of `t`.
fn t(t: MsgType) -> u8 {
    t.into()
}

fn tmessage() -> impl Strategy<Value = Tmessage> {
    let a = prop_oneof![
        (any::<u32>(), s())
            .prop_map(|(msize, version)| Tmessage::Version(Tversion { msize, version })),
        (any::<u32>(), s(), s(), any::<u32>()).prop_map(|(afid, uname, aname, n_uname)| {
            Tmessage::Auth(Tauth {
                afid,
                uname,
                aname,
                n_uname,
            })
        }),
        (any::<u32>(), any::<u32>(), s(), s(), any::<u32>()).prop_map(
            |(fid, afid, uname, aname, n_uname)| {
                Tmessage::Attach(Tattach {
                    fid,
                    afid,
                    uname,
                    aname,
                    n_uname,
                })
            }
        ),
        any::<u16>().prop_map(|oldtag| Tmessage::Flush(Tflush { oldtag })),
        (
            any::<u32>(),
            any::<u32>(),
            prop::collection::vec(s(), 0..=MAXWELEM)
        )
            .prop_map(|(fid, newfid, wnames)| Tmessage::Walk(Twalk {
                fid,
                newfid,
                wnames
            })),
        (any::<u32>(), any::<u64>(), any::<u32>())
            .prop_map(|(fid, offset, count)| Tmessage::Read(Tread { fid, offset, count })),
        (
            any::<u32>(),
            any::<u64>(),
            prop::collection::vec(any::<u8>(), 0..300)
        )
            .prop_map(|(fid, offset, data)| Tmessage::Write(Twrite { fid, offset, data })),
        any::<u32>().prop_map(|fid| Tmessage::Clunk(Tfid { fid })),
        any::<u32>().prop_map(|fid| Tmessage::Remove(Tfid { fid })),
        any::<u32>().prop_map(|fid| Tmessage::Statfs(Tfid { fid })),
        (any::<u32>(), any::<u32>()).prop_map(|(fid, flags)| Tmessage::Lopen(Tlopen {
            fid,
            flags: OpenFlags::from_bits_retain(flags),
        })),
        (any::<u32>(), s(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
            |(fid, name, flags, mode, gid)| Tmessage::Lcreate(Tlcreate {
                fid,
                name,
                flags: OpenFlags::from_bits_retain(flags),
                mode,
                gid
            })
        ),
        (any::<u32>(), s(), s(), any::<u32>()).prop_map(|(fid, name, symtgt, gid)| {
            Tmessage::Symlink(Tsymlink {
                fid,
                name,
                symtgt,
                gid,
            })
        }),
    ];
    let b = prop_oneof![
        (
            any::<u32>(),
            s(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>()
        )
            .prop_map(
                |(dfid, name, mode, major, minor, gid)| Tmessage::Mknod(Tmknod {
                    dfid,
                    name,
                    mode,
                    major,
                    minor,
                    gid
                })
            ),
        (any::<u32>(), any::<u32>(), s()).prop_map(|(fid, dfid, name)| Tmessage::Rename(Trename {
            fid,
            dfid,
            name
        })),
        any::<u32>().prop_map(|fid| Tmessage::Readlink(Tfid { fid })),
        (any::<u32>(), any::<u64>()).prop_map(|(fid, mask)| Tmessage::Getattr(Tgetattr {
            fid,
            request_mask: GetattrMask::from_bits_retain(mask),
        })),
        (any::<[u32; 5]>(), any::<[u64; 5]>()).prop_map(|(a, b)| Tmessage::Setattr(Tsetattr {
            fid: a[0],
            valid: SetattrMask::from_bits_retain(a[1]),
            mode: a[2],
            uid: a[3],
            gid: a[4],
            size: b[0],
            atime_sec: b[1],
            atime_nsec: b[2],
            mtime_sec: b[3],
            mtime_nsec: b[4],
        })),
        (any::<u32>(), any::<u32>(), s())
            .prop_map(|(fid, newfid, name)| Tmessage::Xattrwalk(Txattrwalk { fid, newfid, name })),
        (any::<u32>(), s(), any::<u64>(), any::<u32>()).prop_map(
            |(fid, name, attr_size, flags)| {
                Tmessage::Xattrcreate(Txattrcreate {
                    fid,
                    name,
                    attr_size,
                    flags,
                })
            }
        ),
        (any::<u32>(), any::<u64>(), any::<u32>())
            .prop_map(|(fid, offset, count)| Tmessage::Readdir(Treaddir { fid, offset, count })),
        (any::<u32>(), any::<u32>())
            .prop_map(|(fid, datasync)| Tmessage::Fsync(Tfsync { fid, datasync })),
        (
            any::<u32>(),
            lock_type(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            s()
        )
            .prop_map(
                |(fid, ty, flags, start, length, proc_id, client_id)| Tmessage::Lock(Tlock {
                    fid,
                    ty,
                    flags: LockFlags::from_bits_retain(flags),
                    start,
                    length,
                    proc_id,
                    client_id
                })
            ),
        (
            any::<u32>(),
            lock_type(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            s()
        )
            .prop_map(
                |(fid, ty, start, length, proc_id, client_id)| Tmessage::Getlock(Tgetlock {
                    fid,
                    ty,
                    start,
                    length,
                    proc_id,
                    client_id
                })
            ),
        (any::<u32>(), any::<u32>(), s()).prop_map(|(dfid, fid, name)| Tmessage::Link(Tlink {
            dfid,
            fid,
            name
        })),
        (any::<u32>(), s(), any::<u32>(), any::<u32>()).prop_map(|(dfid, name, mode, gid)| {
            Tmessage::Mkdir(Tmkdir {
                dfid,
                name,
                mode,
                gid,
            })
        }),
        (any::<u32>(), s(), any::<u32>(), s()).prop_map(
            |(olddirfid, oldname, newdirfid, newname)| {
                Tmessage::Renameat(Trenameat {
                    olddirfid,
                    oldname,
                    newdirfid,
                    newname,
                })
            }
        ),
        (any::<u32>(), s(), any::<u32>()).prop_map(|(dirfid, name, flags)| Tmessage::Unlinkat(
            Tunlinkat {
                dirfid,
                name,
                flags: UnlinkFlags::from_bits_retain(flags)
            }
        )),
    ];
    prop_oneof![a, b]
}

fn rmessage() -> impl Strategy<Value = Rmessage> {
    let a = prop_oneof![
        any::<u32>().prop_map(Rmessage::Lerror),
        (any::<u32>(), s())
            .prop_map(|(msize, version)| Rmessage::Version(Rversion { msize, version })),
        qid().prop_map(Rmessage::Auth),
        qid().prop_map(Rmessage::Attach),
        Just(Rmessage::Flush),
        prop::collection::vec(qid(), 0..=MAXWELEM).prop_map(Rmessage::Walk),
        prop::collection::vec(any::<u8>(), 0..300).prop_map(Rmessage::Read),
        any::<u32>().prop_map(Rmessage::Write),
        Just(Rmessage::Clunk),
        Just(Rmessage::Remove),
        (any::<[u32; 3]>(), any::<[u64; 6]>()).prop_map(|(a, b)| Rmessage::Statfs(Rstatfs {
            ty: a[0],
            bsize: a[1],
            blocks: b[0],
            bfree: b[1],
            bavail: b[2],
            files: b[3],
            ffree: b[4],
            fsid: b[5],
            namelen: a[2],
        })),
        (qid(), any::<u32>()).prop_map(|(q, i)| Rmessage::Lopen(q, i)),
        (qid(), any::<u32>()).prop_map(|(q, i)| Rmessage::Lcreate(q, i)),
        qid().prop_map(Rmessage::Symlink),
    ];
    let b = prop_oneof![
        qid().prop_map(Rmessage::Mknod),
        Just(Rmessage::Rename),
        s().prop_map(Rmessage::Readlink),
        (qid(), any::<[u32; 3]>(), any::<[u64; 16]>()).prop_map(|(qid, a, b)| Rmessage::Getattr(
            Box::new(Rgetattr {
                valid: GetattrMask::from_bits_retain(b[0]),
                qid,
                mode: a[0],
                uid: a[1],
                gid: a[2],
                nlink: b[1],
                rdev: b[2],
                size: b[3],
                blksize: b[4],
                blocks: b[5],
                atime_sec: b[6],
                atime_nsec: b[7],
                mtime_sec: b[8],
                mtime_nsec: b[9],
                ctime_sec: b[10],
                ctime_nsec: b[11],
                btime_sec: b[12],
                btime_nsec: b[13],
                gen: b[14],
                data_version: b[15],
            })
        )),
        Just(Rmessage::Setattr),
        any::<u64>().prop_map(Rmessage::Xattrwalk),
        Just(Rmessage::Xattrcreate),
        prop::collection::vec((qid(), any::<u64>(), any::<u8>(), s()), 0..8).prop_map(|entries| {
            let mut data = Vec::new();
            for (qid, offset, ty, name) in entries {
                DirEntry {
                    qid,
                    offset,
                    ty,
                    name,
                }
                .encode(&mut data);
            }
            Rmessage::Readdir(data)
        }),
        Just(Rmessage::Fsync),
        lock_status().prop_map(Rmessage::Lock),
        (lock_type(), any::<u64>(), any::<u64>(), any::<u32>(), s()).prop_map(
            |(ty, start, length, proc_id, client_id)| Rmessage::Getlock(Rgetlock {
                ty,
                start,
                length,
                proc_id,
                client_id
            })
        ),
        Just(Rmessage::Link),
        qid().prop_map(Rmessage::Mkdir),
        Just(Rmessage::Renameat),
        Just(Rmessage::Unlinkat),
    ];
    prop_oneof![a, b]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn test_tmessage_round_trip(msg in tmessage(), tag in any::<u16>()) {
        let frame = msg.encode_frame(tag);
        let (t, back) = Tmessage::decode_frame(&frame, MAX_MSIZE).unwrap();
        prop_assert_eq!(t, tag);
        prop_assert_eq!(&back, &msg);
        prop_assert_eq!(frame[4], msg.msg_type());
        // Every strict prefix fails cleanly.
        let cut = frame.len() / 2;
        let mut short = frame[..cut].to_vec();
        if short.len() >= 4 {
            short[..4].copy_from_slice(&(cut as u32).to_le_bytes());
        }
        prop_assert!(Tmessage::decode_frame(&short, MAX_MSIZE).is_err());
    }

    #[test]
    fn test_rmessage_round_trip(msg in rmessage(), tag in any::<u16>()) {
        let frame = msg.encode_frame(tag);
        let (t, back) = Rmessage::decode_frame(&frame, MAX_MSIZE).unwrap();
        prop_assert_eq!(t, tag);
        prop_assert_eq!(back, msg);
    }

    #[test]
    fn test_decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200), ty in any::<u8>()) {
        let _ = Tmessage::decode_body(ty, &bytes);
        let _ = Rmessage::decode_body(ty, &bytes);
        let _ = Tmessage::decode_frame(&bytes, MAX_MSIZE);
        let _ = DirEntry::decode_all(&bytes);
    }
}

fn frame(ty: u8, body: &[u8]) -> Vec<u8> {
    let mut f = Header {
        size: (HEADER_SIZE + body.len()) as u32,
        ty,
        tag: 1,
    }
    .to_bytes()
    .to_vec();
    f.extend_from_slice(body);
    f
}

#[test]
fn test_decode_error_short_frame() {
    assert_eq!(
        Tmessage::decode_frame(&[1, 2, 3], MAX_MSIZE).unwrap_err(),
        DecodeError::ShortFrame(3)
    );
}

#[test]
fn test_decode_error_size_too_small() {
    let mut f = frame(t(MsgType::Tclunk), &[0; 4]);
    f[..4].copy_from_slice(&3u32.to_le_bytes());
    assert_eq!(
        Tmessage::decode_frame(&f, MAX_MSIZE).unwrap_err(),
        DecodeError::SizeTooSmall(3)
    );
}

#[test]
fn test_decode_error_size_over_msize() {
    let f = frame(t(MsgType::Twrite), &[0; 5000]);
    assert_eq!(
        Tmessage::decode_frame(&f, 4096).unwrap_err(),
        DecodeError::SizeOverMsize {
            size: 5007,
            msize: 4096
        }
    );
    assert_eq!(
        DecodeError::SizeOverMsize { size: 1, msize: 1 }.errno(),
        libc::EMSGSIZE as u32
    );
}

#[test]
fn test_decode_error_size_mismatch() {
    let mut f = frame(t(MsgType::Tclunk), &[0; 4]);
    f.push(0);
    assert_eq!(
        Tmessage::decode_frame(&f, MAX_MSIZE).unwrap_err(),
        DecodeError::SizeMismatch {
            declared: 11,
            actual: 12
        }
    );
}

#[test]
fn test_decode_error_unknown_and_not_dotl_types() {
    assert_eq!(
        Tmessage::decode_body(200, &[]).unwrap_err(),
        DecodeError::UnknownType(200)
    );
    assert_eq!(
        Tmessage::decode_body(t(MsgType::Rlerror), &[0; 4]).unwrap_err(),
        DecodeError::UnknownType(t(MsgType::Rlerror))
    );
    // Topen, Tcreate, Tstat, Twstat and Terror of 9P2000.
    for ty in [112, 114, 124, 126, 106] {
        assert_eq!(
            Tmessage::decode_body(ty, &[]).unwrap_err(),
            DecodeError::NotDotL(ty)
        );
    }
    assert_eq!(DecodeError::UnknownType(1).errno(), libc::EOPNOTSUPP as u32);
    assert_eq!(
        Rmessage::decode_body(t(MsgType::Tclunk), &[]).unwrap_err(),
        DecodeError::UnknownType(t(MsgType::Tclunk))
    );
}

#[test]
fn test_decode_error_truncated() {
    assert_eq!(
        Tmessage::decode_body(t(MsgType::Tgetattr), &[0; 10]).unwrap_err(),
        DecodeError::Truncated { needed: 8, left: 6 }
    );
    // A string longer than the body.
    let mut body = 7u32.to_le_bytes().to_vec();
    body.extend_from_slice(&[10, 0, b'a']);
    assert_eq!(
        Tmessage::decode_body(t(MsgType::Tversion), &body).unwrap_err(),
        DecodeError::Truncated {
            needed: 10,
            left: 1
        }
    );
    assert_eq!(
        DecodeError::Truncated { needed: 1, left: 0 }.errno(),
        libc::EPROTO as u32
    );
}

#[test]
fn test_decode_error_trailing_bytes() {
    assert_eq!(
        Tmessage::decode_body(t(MsgType::Tclunk), &[0; 6]).unwrap_err(),
        DecodeError::TrailingBytes(2)
    );
    assert_eq!(
        Rmessage::decode_body(t(MsgType::Rclunk), &[0]).unwrap_err(),
        DecodeError::TrailingBytes(1)
    );
}

#[test]
fn test_decode_error_nul_in_string() {
    let mut body = 1u32.to_le_bytes().to_vec();
    body.extend_from_slice(&[3, 0, b'a', 0, b'b']);
    body.extend_from_slice(&[0; 12]);
    assert_eq!(
        Tmessage::decode_body(t(MsgType::Tlcreate), &body).unwrap_err(),
        DecodeError::NulInString
    );
}

#[test]
fn test_decode_error_too_many_walk_elements() {
    let mut body = vec![0; 8];
    body.extend_from_slice(&17u16.to_le_bytes());
    for _ in 0..17 {
        body.extend_from_slice(&[1, 0, b'a']);
    }
    assert_eq!(
        Tmessage::decode_body(t(MsgType::Twalk), &body).unwrap_err(),
        DecodeError::TooManyWalkElements(17)
    );
    let mut rbody = 17u16.to_le_bytes().to_vec();
    rbody.extend_from_slice(&[0; 17 * QID_SIZE]);
    assert_eq!(
        Rmessage::decode_body(t(MsgType::Rwalk), &rbody).unwrap_err(),
        DecodeError::TooManyWalkElements(17)
    );
}

#[test]
fn test_decode_error_count_mismatch() {
    let mut body = vec![0; 12];
    body.extend_from_slice(&10u32.to_le_bytes());
    body.extend_from_slice(&[0; 4]);
    assert_eq!(
        Tmessage::decode_body(t(MsgType::Twrite), &body).unwrap_err(),
        DecodeError::CountMismatch { count: 10, left: 4 }
    );
    let raw: [u8; 16] = body[..16].try_into().unwrap();
    assert_eq!(
        TwriteHeader::decode(&raw, 4).unwrap_err(),
        DecodeError::CountMismatch { count: 10, left: 4 }
    );
    let mut rbody = 5u32.to_le_bytes().to_vec();
    rbody.push(1);
    assert_eq!(
        Rmessage::decode_body(t(MsgType::Rread), &rbody).unwrap_err(),
        DecodeError::CountMismatch { count: 5, left: 1 }
    );
}

#[test]
fn test_error_messages_are_pinned() {
    assert_eq!(
        DecodeError::SizeOverMsize {
            size: 9000,
            msize: 8192
        }
        .to_string(),
        "declared size 9000 exceeds msize 8192"
    );
    assert_eq!(
        DecodeError::TooManyWalkElements(20).to_string(),
        "walk of 20 elements exceeds the limit of 16"
    );
}

mod server_fuzz {
    use super::*;
    use virtio_9p_server::io::{SliceReader, SliceWriter};
    use virtio_9p_server::{
        Cancel, Config, Inline, PassthroughConfig, PassthroughFs, Server, Session,
    };

    fn types() -> Vec<u8> {
        vec![
            t(MsgType::Tstatfs),
            t(MsgType::Tlopen),
            t(MsgType::Tlcreate),
            t(MsgType::Tsymlink),
            t(MsgType::Tmknod),
            t(MsgType::Trename),
            t(MsgType::Treadlink),
            t(MsgType::Tgetattr),
            t(MsgType::Tsetattr),
            t(MsgType::Txattrwalk),
            t(MsgType::Txattrcreate),
            t(MsgType::Treaddir),
            t(MsgType::Tfsync),
            t(MsgType::Tlock),
            t(MsgType::Tgetlock),
            t(MsgType::Tlink),
            t(MsgType::Tmkdir),
            t(MsgType::Trenameat),
            t(MsgType::Tunlinkat),
            t(MsgType::Tversion),
            t(MsgType::Tauth),
            t(MsgType::Tattach),
            t(MsgType::Tflush),
            t(MsgType::Twalk),
            t(MsgType::Tread),
            t(MsgType::Twrite),
            t(MsgType::Tclunk),
            t(MsgType::Tremove),
            0,
            255,
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

        /// Arbitrary well-framed requests against a live session (fids 0..4
        /// exist, small numbers are likely) always get a reply, never a panic.
        #[test]
        fn test_server_answers_arbitrary_requests(
            ty in prop::sample::select(types()),
            body in prop::collection::vec(prop_oneof![Just(0u8), Just(1), Just(2), any::<u8>()], 0..64),
            room in 11usize..300,
        ) {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("f"), b"data").unwrap();
            let fs = PassthroughFs::new(PassthroughConfig::new(dir.path())).unwrap();
            let server = Server::new(fs, {
                let mut cfg = Config::default();
                cfg.lock_wait = Some(std::time::Duration::ZERO);
                cfg
            }).unwrap();
            let s = Session::new();
            let setup = |m: Tmessage| {
                let f = m.encode_frame(1);
                let mut reply = vec![0u8; 8192];
                server.handle(&s, &mut SliceReader::new(&f), &mut SliceWriter::new(&mut reply), &Inline, &Cancel::new()).unwrap();
            };
            setup(Tmessage::Version(Tversion { msize: 8192, version: b"9P2000.L".to_vec() }));
            setup(Tmessage::Attach(Tattach { fid: 0, afid: NOFID, uname: vec![], aname: vec![], n_uname: 0 }));
            setup(Tmessage::Walk(Twalk { fid: 0, newfid: 1, wnames: vec![b"f".to_vec()] }));
            setup(Tmessage::Walk(Twalk { fid: 0, newfid: 2, wnames: vec![b"f".to_vec()] }));
            setup(Tmessage::Lopen(Tlopen { fid: 2, flags: OpenFlags::RDWR }));
            let mut frame = Header { size: (HEADER_SIZE + body.len()) as u32, ty, tag: 3 }.to_bytes().to_vec();
            frame.extend_from_slice(&body);
            let mut reply = vec![0u8; room];
            let out = server
                .handle(&s, &mut SliceReader::new(&frame), &mut SliceWriter::new(&mut reply), &Inline, &Cancel::new())
                .unwrap();
            let (tag, _) = Rmessage::decode_frame(&reply[..out.size as usize], u32::MAX).unwrap();
            prop_assert_eq!(tag, 3);
            prop_assert!(out.size as usize <= room);
        }
    }
}
