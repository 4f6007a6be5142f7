// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Instruction-count aid for the virtio-9p suite's in-process Tgetattr:
//! the same frames as `inproc.rs`, against our server or crosvm's p9, in a
//! loop for `valgrind --tool=callgrind` (the hosts have no PMU for `perf
//! stat -e instructions`). Usage:
//! `valgrind --tool=callgrind target/release/examples/getattr_profile ours|p9 [CALLS]`;
//! the difference of two call counts divided by their difference is the
//! user-space instructions of one Tgetattr.

use std::error::Error;
use std::hint::black_box;
use std::sync::Arc;

use virtio_9p_server::io::{SliceReader, SliceWriter};
use virtio_9p_server::protocol::{
    GetattrMask, Tattach, Tgetattr, Tmessage, Tversion, Twalk, NOFID,
};
use virtio_9p_server::{Cancel, Config, Inline, PassthroughConfig, PassthroughFs, Server, Session};

type Res<T> = Result<T, Box<dyn Error>>;

const MSIZE: u32 = 64 * 1024 + 24;

fn setup_frames() -> Vec<Vec<u8>> {
    vec![
        Tmessage::Version(Tversion {
            msize: MSIZE,
            version: b"9P2000.L".to_vec(),
        })
        .encode_frame(1),
        Tmessage::Attach(Tattach {
            fid: 1,
            afid: NOFID,
            uname: b"root".to_vec(),
            aname: Vec::new(),
            n_uname: 0,
        })
        .encode_frame(1),
        Tmessage::Walk(Twalk {
            fid: 1,
            newfid: 2,
            wnames: vec![b"f".to_vec()],
        })
        .encode_frame(1),
    ]
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let who = args.get(1).map(String::as_str).unwrap_or("ours");
    let calls: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("f"), b"small file")?;
    let getattr = Tmessage::Getattr(Tgetattr {
        fid: 2,
        request_mask: GetattrMask::BASIC,
    })
    .encode_frame(5);
    let mut reply = vec![0u8; MSIZE as usize];
    match who {
        "ours" => {
            let fs = PassthroughFs::new(PassthroughConfig::new(dir.path()))?;
            let server = Arc::new(Server::new(fs, Config::default())?);
            let session = Session::new();
            let cancel = Cancel::new();
            for f in setup_frames()
                .iter()
                .chain(std::iter::repeat_n(&getattr, calls))
            {
                let out = server.handle(
                    &session,
                    &mut SliceReader::new(f),
                    &mut SliceWriter::new(&mut reply),
                    &Inline,
                    &cancel,
                )?;
                black_box(out.size);
            }
        }
        "p9" => {
            let mut server = p9::Server::new(dir.path(), Default::default(), Default::default())?;
            for f in setup_frames()
                .iter()
                .chain(std::iter::repeat_n(&getattr, calls))
            {
                reply.clear();
                let mut reader = f.as_slice();
                server.handle_message(&mut reader, &mut reply)?;
                black_box(reply.len());
            }
        }
        other => return Err(format!("{other}: ours or p9").into()),
    }
    Ok(())
}
