// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The framing of a connection's input: where the socket thread is in
//! the frame being read, and one read of the socket, which says what
//! arrived (a part, a whole header, a whole frame, the head of a large
//! Twrite, the end of a frame being skipped).

use std::fs::File;
use std::io;

use super::stream::TWRITE_HEAD;
use crate::protocol::{Header, HEADER_SIZE};
use crate::sys::read_some;

/// Why a connection ends.
pub(super) enum Close {
    /// The client hung up.
    HungUp,
    /// A framing or socket error.
    Failed(io::Error),
}

/// The input state of a connection.
pub(super) enum Input {
    /// Reading the 7-byte header (`have` 0: between frames).
    Header { hdr: [u8; HEADER_SIZE], have: usize },
    /// Reading the rest of a frame into `buf`.
    Body {
        buf: Vec<u8>,
        size: usize,
        have: usize,
    },
    /// Reading the fixed part of a large Twrite (streamed after it).
    TwriteHead {
        head: [u8; TWRITE_HEAD],
        have: usize,
    },
    /// A streamed Twrite owns the socket's input until it finishes.
    Streaming,
    /// Dropping `left` bytes of a frame, then answering `tag` with
    /// `errno` (if any).
    Skip {
        left: u64,
        answer: Option<(u16, u32)>,
    },
}

/// What one read of a connection's socket brought.
pub(super) enum Arrived {
    /// Nothing now (or the input belongs to a streamed Twrite).
    Nothing,
    /// `n` more bytes of a frame, not the end of a step.
    Part(usize),
    /// The header is whole (its last `n` bytes came now); the caller
    /// picks how to read the rest.
    Header([u8; HEADER_SIZE], usize),
    /// The frame `buf[..size]` is whole; the input is between frames.
    Frame(Vec<u8>, usize),
    /// The head of a large Twrite is whole (its last `n` bytes came now);
    /// the input is the streamed request's.
    TwriteHead([u8; TWRITE_HEAD], usize),
    /// The frame being skipped is gone (its last `n` bytes came now), to
    /// be answered with `(tag, errno)` if any; the input is between
    /// frames.
    Skipped(usize, Option<(u16, u32)>),
}

impl Input {
    /// Between frames.
    pub(super) fn header() -> Input {
        Input::Header {
            hdr: [0; HEADER_SIZE],
            have: 0,
        }
    }

    /// The fixed part of a large Twrite whose header `hdr` was read.
    pub(super) fn twrite_head(hdr: [u8; HEADER_SIZE]) -> Input {
        let mut head = [0u8; TWRITE_HEAD];
        head[..HEADER_SIZE].copy_from_slice(&hdr);
        Input::TwriteHead {
            head,
            have: HEADER_SIZE,
        }
    }

    /// Between two frames: the next byte starts a new request.
    pub(super) fn at_boundary(&self) -> bool {
        matches!(self, Input::Header { have: 0, .. })
    }

    /// Reads what `sock` has for the step the input is at (one read).
    pub(super) fn read(&mut self, sock: &File) -> Result<Arrived, Close> {
        match self {
            Input::Header { hdr, have } => {
                let Some(n) = read_into(sock, &mut hdr[*have..])? else {
                    return Ok(Arrived::Nothing);
                };
                *have += n;
                if *have < HEADER_SIZE {
                    return Ok(Arrived::Part(n));
                }
                Ok(Arrived::Header(*hdr, n))
            }
            Input::Body { buf, size, have } => {
                let Some(n) = read_into(sock, &mut buf[*have..*size])? else {
                    return Ok(Arrived::Nothing);
                };
                *have += n;
                if *have < *size {
                    return Ok(Arrived::Part(n));
                }
                let frame = Arrived::Frame(std::mem::take(buf), *size);
                *self = Input::header();
                Ok(frame)
            }
            Input::TwriteHead { head, have } => {
                let Some(n) = read_into(sock, &mut head[*have..])? else {
                    return Ok(Arrived::Nothing);
                };
                *have += n;
                if *have < TWRITE_HEAD {
                    return Ok(Arrived::Part(n));
                }
                let head = *head;
                *self = Input::Streaming;
                Ok(Arrived::TwriteHead(head, n))
            }
            Input::Skip { left, answer } => {
                let mut n = 0;
                if *left > 0 {
                    let mut scratch = [0u8; 8192];
                    let want = scratch.len().min(*left as usize);
                    let Some(got) = read_into(sock, &mut scratch[..want])? else {
                        return Ok(Arrived::Nothing);
                    };
                    *left -= got as u64;
                    n = got;
                }
                if *left > 0 {
                    return Ok(Arrived::Part(n));
                }
                let answer = answer.take();
                *self = Input::header();
                Ok(Arrived::Skipped(n, answer))
            }
            Input::Streaming => Ok(Arrived::Nothing),
        }
    }
}

/// The size of the frame that `h` starts, if the connection can take it:
/// at least a header, at most `limit` (a Tversion may announce any msize,
/// but the frame itself is tiny). Otherwise the stream cannot be
/// resynchronised and the connection ends.
pub(super) fn frame_size(h: &Header, limit: u32) -> io::Result<usize> {
    let size = h.size as usize;
    if size < HEADER_SIZE || h.size > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame size {size} outside 7..={limit}"),
        ));
    }
    Ok(size)
}

/// Reads into `buf`: the bytes read, `None` when the socket has none now,
/// an error when the client hung up.
fn read_into(sock: &File, buf: &mut [u8]) -> Result<Option<usize>, Close> {
    match read_some(sock, buf).map_err(Close::Failed)? {
        None => Ok(None),
        Some(0) => Err(Close::HungUp),
        Some(n) => Ok(Some(n)),
    }
}
