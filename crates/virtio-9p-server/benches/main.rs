// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
#![allow(missing_docs)]
//! Criterion benchmarks: strict decode and encode of common messages, and
//! one in-process Tgetattr through the server.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use virtio_9p_server::io::{SliceReader, SliceWriter};
use virtio_9p_server::protocol::*;
use virtio_9p_server::{Cancel, Config, Inline, PassthroughConfig, PassthroughFs, Server, Session};

fn codec(c: &mut Criterion) {
    let walk = Tmessage::Walk(Twalk {
        fid: 1,
        newfid: 2,
        wnames: vec![
            b"usr".to_vec(),
            b"share".to_vec(),
            b"doc".to_vec(),
            b"README".to_vec(),
        ],
    })
    .encode_frame(3);
    c.bench_function("decode_twalk_4", |b| {
        b.iter(|| Tmessage::decode_frame(black_box(&walk), MAX_MSIZE).unwrap())
    });
    let read = Tmessage::Read(Tread {
        fid: 1,
        offset: 4096,
        count: 65536,
    })
    .encode_frame(9);
    c.bench_function("decode_tread", |b| {
        b.iter(|| Tmessage::decode_frame(black_box(&read), MAX_MSIZE).unwrap())
    });
    let attr = Rmessage::Getattr(Box::default());
    c.bench_function("encode_rgetattr", |b| {
        b.iter(|| black_box(&attr).encode_frame(9))
    });
    let data = DirEntry {
        qid: Qid::default(),
        offset: 1,
        ty: 8,
        name: b"some-file-name.txt".to_vec(),
    };
    c.bench_function("encode_dirent", |b| {
        let mut out = Vec::with_capacity(64);
        b.iter(|| {
            out.clear();
            black_box(&data).encode(&mut out);
        })
    });
}

fn server_getattr(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    let server = Server::new(
        PassthroughFs::new(PassthroughConfig::new(dir.path())).unwrap(),
        Config::default(),
    )
    .unwrap();
    let session = Session::new();
    let mut reply = vec![0u8; 8192];
    let call = |frame: &[u8], reply: &mut [u8]| {
        server
            .handle(
                &session,
                &mut SliceReader::new(frame),
                &mut SliceWriter::new(reply),
                &Inline,
                &Cancel::new(),
            )
            .unwrap()
    };
    call(
        &Tmessage::Version(Tversion {
            msize: 8192,
            version: b"9P2000.L".to_vec(),
        })
        .encode_frame(NOTAG),
        &mut reply,
    );
    call(
        &Tmessage::Attach(Tattach {
            fid: 0,
            afid: NOFID,
            uname: vec![],
            aname: vec![],
            n_uname: 0,
        })
        .encode_frame(1),
        &mut reply,
    );
    call(
        &Tmessage::Walk(Twalk {
            fid: 0,
            newfid: 1,
            wnames: vec![b"f".to_vec()],
        })
        .encode_frame(1),
        &mut reply,
    );
    let getattr = Tmessage::Getattr(Tgetattr {
        fid: 1,
        request_mask: GetattrMask::BASIC,
    })
    .encode_frame(2);
    c.bench_function("server_tgetattr", |b| {
        b.iter(|| call(black_box(&getattr), &mut reply))
    });
}

criterion_group!(benches, codec, server_getattr);
criterion_main!(benches);
