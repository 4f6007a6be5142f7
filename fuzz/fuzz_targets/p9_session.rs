// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A sequence of 9P2000.L requests against a server on a temporary export.
//!
//! The export and the canary directory beside it are
//! `vmm_fuzz_common::sandbox::Sandbox` (one per fuzzing process, on tmpfs;
//! the export is laid out again before an input when the one before changed
//! it).
//!
//! Checked after every request: the server returned a reply (or an error
//! only for a frame shorter than the header), the reply decodes strictly
//! within the negotiated msize, carries the request's tag and type + 1 (or
//! Rlerror with a real errno), and Rread/Rreaddir/Rwalk respect what was
//! asked. inotify watches on the directory holding the export and on the
//! canary tree report any open, read, change, creation or deletion outside
//! the export; after every input the canary tree is compared with its
//! snapshot (metadata, which every write or attribute change moves; contents
//! and extended attributes too every 64th input).

#![no_main]

use std::sync::{Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use virtio_9p_server::io::{SliceReader, SliceWriter};
use virtio_9p_server::protocol::*;
use virtio_9p_server::{Cancel, Inline, PassthroughFs, Server, Session};
use vmm_fuzz_common::p9::{SessionInput, SERVER_MSIZE};
use vmm_fuzz_common::sandbox::Sandbox;

/// The sandbox and a reply buffer, one per fuzzing process.
struct Env {
    sandbox: Sandbox,
    reply: Vec<u8>,
}

fn env() -> &'static Mutex<Env> {
    static ENV: OnceLock<Mutex<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        Mutex::new(Env {
            sandbox: Sandbox::new("p9-session").expect("fuzz sandbox"),
            reply: vec![0u8; SERVER_MSIZE as usize],
        })
    })
}

fn check_reply(frame: &[u8], reply: &[u8], limit: u32) {
    let h = Header::from_bytes(frame[..HEADER_SIZE].try_into().expect("header"));
    let (tag, msg) = Rmessage::decode_frame(reply, limit)
        .unwrap_or_else(|e| panic!("malformed reply {reply:02x?} to type {}: {e}", h.ty));
    assert_eq!(tag, h.tag, "reply tag");
    match &msg {
        Rmessage::Lerror(errno) => assert!((1..4096).contains(errno), "Rlerror with errno {errno}"),
        m => assert_eq!(
            u8::from(m.msg_type()),
            h.ty.wrapping_add(1),
            "reply type for request type {}",
            h.ty
        ),
    }
    let Ok((_, req)) = Tmessage::decode_frame(frame, MAX_MSIZE) else {
        return;
    };
    match (&req, &msg) {
        (Tmessage::Read(t), Rmessage::Read(data)) => assert!(data.len() <= t.count as usize),
        (Tmessage::Readdir(t), Rmessage::Readdir(data)) => {
            assert!(data.len() <= t.count as usize);
            DirEntry::decode_all(data).expect("Rreaddir entries decode");
        }
        (Tmessage::Walk(t), Rmessage::Walk(qids)) => {
            assert!(qids.len() <= t.wnames.len());
            assert!(
                t.wnames.is_empty() || !qids.is_empty(),
                "Rwalk with no qid for a non-empty walk"
            );
        }
        (Tmessage::Write(t), Rmessage::Write(n)) => assert!(*n as usize <= t.data.len()),
        (Tmessage::Version(t), Rmessage::Version(r)) => {
            assert!(r.msize <= t.msize.max(MIN_MSIZE) && r.msize <= SERVER_MSIZE);
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let input = SessionInput::decode(data);
    let mut env = env().lock().unwrap_or_else(|e| e.into_inner());
    env.sandbox
        .reset_export_if_changed()
        .expect("reset the export");
    let cfg = input.config.passthrough(env.sandbox.export());
    let fs = PassthroughFs::new(cfg).expect("open the export");
    let config = vmm_fuzz_common::p9::server_config();
    let server = Server::new(fs, config).expect("server");
    let session = Session::new();
    let mut reply = std::mem::take(&mut env.reply);
    for frame in &input.frames {
        let result = server.handle(
            &session,
            &mut SliceReader::new(frame),
            &mut SliceWriter::new(&mut reply),
            &Inline,
            &Cancel::new(),
        );
        match result {
            Ok(info) => {
                assert!(frame.len() >= HEADER_SIZE);
                let limit = session.frame_limit();
                assert!(
                    info.size <= limit,
                    "reply of {} bytes over msize {limit}",
                    info.size
                );
                let out = &reply[..info.size as usize];
                assert_eq!(out[4], info.reply_type);
                check_reply(frame, out, limit);
            }
            Err(e) => assert!(
                frame.len() < HEADER_SIZE,
                "no reply to a {}-byte frame: {e}",
                frame.len()
            ),
        }
        let bad = env.sandbox.violations();
        assert!(bad.is_empty(), "touched outside the export: {bad:?}");
    }
    drop(session);
    drop(server);
    assert!(
        env.sandbox.canary_unchanged(),
        "the canary beside the export changed"
    );
    env.reply = reply;
});
