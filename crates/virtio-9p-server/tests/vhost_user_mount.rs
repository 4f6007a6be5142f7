// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! vhost-user integration: the mount sequence byte-for-byte, the config
//! space and the feature bits, played by a fake VMM on memfd memory.

mod vhost_user_support;

use std::io::Write;

use vhost_user_support::*;
use virtio_9p_server::engine::OffloadPolicy;
use virtio_9p_server::io::{SliceReader, SliceWriter};
use virtio_9p_server::protocol::*;
use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout, VmmOptions};
use virtio_9p_server::{Cancel, Inline, Session};

#[test]
fn test_config_space_and_features() {
    let d = TestDaemon::start(2);
    let mut vmm = d.connect(VmmOptions::default());
    assert_eq!(vmm.get_config(0, 7).unwrap(), b"\x05\x00share");
    let f = vmm.features();
    for bit in [0u32, 28, 29, 30, 32] {
        assert_ne!(f & (1 << bit), 0, "feature bit {bit} missing in {f:#x}");
    }
    // Packed rings are offered, and declined by a split-ring driver.
    assert_eq!(f & (1 << 34), 0, "{f:#x}");
    assert!(!vmm.is_packed());
    drop(vmm);
    let vmm = d.connect({
        let mut o = VmmOptions::default();
        o.packed = true;
        o
    });
    assert_ne!(vmm.features() & (1 << 34), 0);
    assert!(vmm.is_packed());
    drop(vmm);
    d.stop();
}

#[test]
fn test_packed_ring_not_offered_when_turned_off() {
    let d = TestDaemon::start_offering(2, 1024, OffloadPolicy::Auto, false);
    let e = FakeVmm::connect(&d.socket, {
        let mut o = VmmOptions::default();
        o.packed = true;
        o
    })
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "the device does not offer VIRTIO_F_RING_PACKED"
    );
    // A split-ring driver is still served.
    let mut vmm = d.connect(VmmOptions::default());
    assert_eq!(vmm.features() & (1 << 34), 0);
    assert_eq!(version(&mut vmm, 8192), 8192);
    drop(vmm);
    d.stop();
}

#[test]
fn test_mount_sequence_byte_for_byte() {
    let d = TestDaemon::start(2);
    std::fs::File::create(d.dir.path().join("hello.txt"))
        .unwrap()
        .write_all(b"hello, 9p over vhost-user\n")
        .unwrap();
    std::fs::create_dir(d.dir.path().join("sub")).unwrap();
    let mtime = std::fs::metadata(d.dir.path().join("hello.txt"))
        .unwrap()
        .modified()
        .unwrap();

    let msize = 512_000u32;
    let sequence: Vec<(u16, Tmessage, u32)> = vec![
        (
            NOTAG,
            Tmessage::Version(Tversion {
                msize,
                version: b"9P2000.L".to_vec(),
            }),
            64,
        ),
        (
            1,
            Tmessage::Attach(Tattach {
                fid: 0,
                afid: NOFID,
                uname: b"root".to_vec(),
                aname: Vec::new(),
                n_uname: 0,
            }),
            64,
        ),
        (
            2,
            Tmessage::Walk(Twalk {
                fid: 0,
                newfid: 1,
                wnames: vec![b"hello.txt".to_vec()],
            }),
            64,
        ),
        (
            3,
            Tmessage::Lopen(Tlopen {
                fid: 1,
                flags: OpenFlags::RDWR,
            }),
            64,
        ),
        (
            4,
            Tmessage::Read(Tread {
                fid: 1,
                offset: 0,
                count: 4096,
            }),
            8192,
        ),
        (
            5,
            Tmessage::Write(Twrite {
                fid: 1,
                offset: 26,
                data: b"appended\n".to_vec(),
            }),
            64,
        ),
        (
            6,
            Tmessage::Read(Tread {
                fid: 1,
                offset: 0,
                count: 4096,
            }),
            8192,
        ),
        (
            7,
            Tmessage::Walk(Twalk {
                fid: 0,
                newfid: 2,
                wnames: Vec::new(),
            }),
            64,
        ),
        (
            8,
            Tmessage::Lopen(Tlopen {
                fid: 2,
                flags: OpenFlags::RDONLY | OpenFlags::DIRECTORY,
            }),
            64,
        ),
        (
            9,
            Tmessage::Readdir(Treaddir {
                fid: 2,
                offset: 0,
                count: 4096,
            }),
            8192,
        ),
        (10, Tmessage::Clunk(Tfid { fid: 2 }), 64),
        (11, Tmessage::Clunk(Tfid { fid: 1 }), 64),
    ];

    // Over vhost-user: a direct chain per request.
    let mut vmm = d.connect(VmmOptions::default());
    let mut virtio_replies = Vec::new();
    for (tag, msg, room) in &sequence {
        let reply = vmm
            .call(&frame(*tag, msg.clone()), *room, Layout::Direct)
            .unwrap();
        virtio_replies.push(reply);
    }
    // Reset the file (content and mtime, which the qid version follows)
    // so the reference run sees the same state.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(d.dir.path().join("hello.txt"))
        .unwrap();
    f.set_len(26).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);

    // The same server through the in-memory reference transport.
    let session = Session::new();
    for (i, (tag, msg, room)) in sequence.iter().enumerate() {
        let req = frame(*tag, msg.clone());
        let mut out = vec![0u8; *room as usize];
        let info = d
            .server
            .handle(
                &session,
                &mut SliceReader::new(&req),
                &mut SliceWriter::new(&mut out),
                &Inline,
                &Cancel::new(),
            )
            .unwrap();
        assert_eq!(
            virtio_replies[i],
            &out[..info.size as usize],
            "reply {i} ({msg:?}) differs between vhost-user and the reference"
        );
    }

    // And the content is what a mount expects.
    let (_, v) = decode(&virtio_replies[0]);
    assert_eq!(
        v,
        Rmessage::Version(Rversion {
            msize,
            version: b"9P2000.L".to_vec()
        })
    );
    assert_eq!(
        decode(&virtio_replies[4]).1,
        Rmessage::Read(b"hello, 9p over vhost-user\n".to_vec())
    );
    assert_eq!(decode(&virtio_replies[5]).1, Rmessage::Write(9));
    assert_eq!(
        decode(&virtio_replies[6]).1,
        Rmessage::Read(b"hello, 9p over vhost-user\nappended\n".to_vec())
    );
    match decode(&virtio_replies[9]).1 {
        Rmessage::Readdir(raw) => {
            let has = |n: &[u8]| raw.windows(n.len()).any(|w| w == n);
            assert!(has(b"hello.txt") && has(b"sub"), "{raw:?}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(decode(&virtio_replies[11]).1, Rmessage::Clunk);
    drop(vmm);
    d.stop();
}

#[test]
fn test_reads_through_indirect_chains_without_event_idx() {
    let d = TestDaemon::start(2);
    let data: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(d.dir.path().join("f"), &data).unwrap();
    let mut vmm = d.connect({
        let mut o = VmmOptions::default();
        o.event_idx = false;
        o
    });
    assert_eq!(version(&mut vmm, 512_000), 512_000);
    let attach = Tmessage::Attach(Tattach {
        fid: 0,
        afid: NOFID,
        uname: b"root".to_vec(),
        aname: Vec::new(),
        n_uname: 0,
    });
    vmm.call(&frame(1, attach), 64, Layout::Direct).unwrap();
    let walk = Tmessage::Walk(Twalk {
        fid: 0,
        newfid: 1,
        wnames: vec![b"f".to_vec()],
    });
    vmm.call(&frame(2, walk), 64, Layout::Direct).unwrap();
    vmm.call(
        &frame(
            3,
            Tmessage::Lopen(Tlopen {
                fid: 1,
                flags: OpenFlags::RDONLY,
            }),
        ),
        64,
        Layout::Direct,
    )
    .unwrap();
    // 125 data descriptors of 4 KiB, like the Linux guest's 128-entry sg lists.
    let count = 512_000 - IOHDRSZ;
    let reply = vmm
        .call(
            &frame(
                4,
                Tmessage::Read(Tread {
                    fid: 1,
                    offset: 0,
                    count,
                }),
            ),
            512_000,
            Layout::Indirect { seg: 4096 },
        )
        .unwrap();
    assert_eq!(
        decode(&reply).1,
        Rmessage::Read(data[..count as usize].to_vec())
    );
    drop(vmm);
    d.stop();
}
