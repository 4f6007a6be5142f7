// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Raw bytes into every 9P2000.L decoder of virtio-9p-server. Whatever
//! decodes must encode back to the same bytes; whatever fails must fail
//! with an error that maps to an errno.

#![no_main]

use libfuzzer_sys::fuzz_target;
use virtio_9p_server::protocol::wire::Decoder;
use virtio_9p_server::protocol::*;

fuzz_target!(|data: &[u8]| {
    // Whole request frames, as a server sees them.
    match Tmessage::decode_frame(data, MAX_MSIZE) {
        Ok((tag, msg)) => {
            assert_eq!(
                msg.encode_frame(tag),
                data,
                "request re-encodes differently"
            );
            // The same frame under a smaller msize is refused.
            let small = data.len() as u32 - 1;
            assert_eq!(
                Tmessage::decode_frame(data, small),
                Err(DecodeError::SizeOverMsize {
                    size: data.len() as u32,
                    msize: small
                })
            );
        }
        Err(e) => {
            let _ = e.errno();
            let _ = e.to_string();
        }
    }
    // Whole reply frames, as a client sees them.
    match Rmessage::decode_frame(data, MAX_MSIZE) {
        Ok((tag, msg)) => assert_eq!(msg.encode_frame(tag), data, "reply re-encodes differently"),
        Err(e) => {
            let _ = e.errno();
        }
    }
    // Bodies without a frame: the first byte is the type.
    if let Some((&ty, body)) = data.split_first() {
        if let Ok(msg) = Tmessage::decode_body(ty, body) {
            let frame = msg.encode_frame(0);
            assert_eq!(frame[4], ty);
            assert_eq!(
                &frame[HEADER_SIZE..],
                body,
                "request body re-encodes differently"
            );
        }
        if let Ok(msg) = Rmessage::decode_body(ty, body) {
            assert_eq!(msg.msg_type(), ty);
            let mut out = Vec::new();
            msg.encode_body(&mut out);
            assert_eq!(out, body, "reply body re-encodes differently");
        }
    }
    // Rreaddir data.
    if let Ok(entries) = DirEntry::decode_all(data) {
        let mut out = Vec::new();
        for e in &entries {
            let before = out.len();
            e.encode(&mut out);
            assert_eq!(out.len() - before, e.size());
        }
        assert_eq!(out, data, "directory entries re-encode differently");
    }
    // The fixed part of a Twrite, as the zero-copy path decodes it.
    if let Some(fixed) = data.get(..TwriteHeader::SIZE) {
        let fixed: &[u8; TwriteHeader::SIZE] = fixed.try_into().expect("16 bytes");
        let rest = data.len() - TwriteHeader::SIZE;
        if let Ok(h) = TwriteHeader::decode(fixed, rest) {
            assert_eq!(h.count as usize, rest);
            let whole = Tmessage::Write(Twrite {
                fid: h.fid,
                offset: h.offset,
                data: data[16..].to_vec(),
            });
            assert_eq!(&whole.encode_frame(0)[HEADER_SIZE..], data);
        }
    }
    // Header and wire primitives.
    if let Some(hdr) = data.get(..HEADER_SIZE) {
        let hdr: &[u8; HEADER_SIZE] = hdr.try_into().expect("7 bytes");
        let h = Header::from_bytes(hdr);
        assert_eq!(&h.to_bytes(), hdr);
        let _ = h.check_size(data.len() as u32);
    }
    let mut d = Decoder::new(data);
    while d.remaining() > 0 {
        let before = d.remaining();
        match d.string() {
            Ok(s) => assert!(!s.contains(&0) && before - d.remaining() == s.len() + 2),
            Err(_) => {
                let _ = d.u8();
            }
        }
    }
});
