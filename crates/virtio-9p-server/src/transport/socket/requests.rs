// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The requests of one socket thread on the engine: what each runs (a
//! request read whole, or a streamed Twrite), what it hands back to its
//! thread when it finishes, and the table of those in flight by engine
//! token.

use std::cell::Cell;
use std::fs::File;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use log::warn;

use super::buffers::SMALL_BUFFER;
use super::limits::RateFloor;
use super::splice::{Filled, Splicer};
use super::stream::{StreamRequest, StreamState, TWRITE_HEAD};
use super::writer::SockWriter;
use crate::engine::{self, EngineExec};
use crate::fs::Filesystem;
use crate::io::SliceReader;
use crate::server::{Cancel, Reply, Server, Session};

/// What a request hands back to its socket thread when it finishes.
#[derive(Default)]
pub(super) struct Handoff {
    pub(super) request: Cell<Option<Vec<u8>>>,
    pub(super) reply: Cell<Option<Vec<u8>>>,
    /// An Rread's data, spliced into a pipe.
    pub(super) spliced: Cell<Option<Filled>>,
}

/// What a request runs on its coroutine: it serves the request, hands
/// its buffers back through `back` and returns the reply's length (0:
/// no reply).
pub(super) trait Job {
    fn run(self, exec: EngineExec, back: &Handoff, cancel: &Cancel) -> u32;
}

/// A request read whole into `frame[..size]`, with its reply buffer.
pub(super) struct Buffered<F: Filesystem> {
    pub(super) server: Arc<Server<F>>,
    pub(super) session: Arc<Session<F>>,
    pub(super) frame: Vec<u8>,
    pub(super) size: usize,
    pub(super) reply: Vec<u8>,
    /// Bytes of `reply` the reply may use.
    pub(super) room: usize,
    /// For an Rread that may go out as its header plus a spliced range.
    pub(super) splicer: Option<Splicer>,
}

impl<F: Filesystem> Job for Buffered<F> {
    fn run(self, exec: EngineExec, back: &Handoff, cancel: &Cancel) -> u32 {
        let Buffered {
            server,
            session,
            frame,
            size,
            mut reply,
            room,
            splicer,
        } = self;
        let r = server.handle(
            &session,
            &mut SliceReader::new(&frame[..size]),
            &mut SockWriter::new(&mut reply[..room], splicer.as_ref(), exec),
            &exec,
            cancel,
        );
        back.request.set(Some(frame));
        back.reply.set(Some(reply));
        back.spliced.set(splicer.as_ref().and_then(Splicer::take));
        reply_len(r, cancel)
    }
}

/// A large Twrite whose data the request reads from the socket itself
/// ([`StreamRequest`]), with its chunk and reply buffers.
pub(super) struct Streamed<F: Filesystem> {
    pub(super) server: Arc<Server<F>>,
    pub(super) session: Arc<Session<F>>,
    pub(super) head: [u8; TWRITE_HEAD],
    pub(super) sock: Arc<File>,
    pub(super) state: Arc<StreamState>,
    /// When the frame's first byte arrived.
    pub(super) frame_start: Instant,
    pub(super) floor: RateFloor,
    pub(super) chunk: Vec<u8>,
    /// At least `SMALL_BUFFER` bytes: a Twrite's reply is small.
    pub(super) reply: Vec<u8>,
}

impl<F: Filesystem> Job for Streamed<F> {
    fn run(self, exec: EngineExec, back: &Handoff, cancel: &Cancel) -> u32 {
        let Streamed {
            server,
            session,
            head,
            sock,
            state,
            frame_start,
            floor,
            chunk,
            mut reply,
        } = self;
        let mut req =
            StreamRequest::new(head, chunk, sock, state, frame_start, floor, cancel.clone());
        let r = server.handle(
            &session,
            &mut req,
            &mut SockWriter::new(&mut reply[..SMALL_BUFFER], None, exec),
            &exec,
            cancel,
        );
        back.request.set(Some(req.into_chunk()));
        back.reply.set(Some(reply));
        reply_len(r, cancel)
    }
}

/// The length of the reply to send for `r`: 0 when the request was
/// flushed before it answered, or could not be answered at all.
fn reply_len<E: std::fmt::Display>(r: Result<Reply, E>, cancel: &Cancel) -> u32 {
    match r {
        Ok(reply) if engine::flushed_silently(reply.reply_type, cancel) => 0,
        Ok(reply) => reply.size,
        Err(e) => {
            warn!("9p: request not answered: {e}");
            0
        }
    }
}

/// A request in flight, by its engine token.
pub(super) struct Req {
    pub(super) conn: u32,
    pub(super) handoff: Rc<Handoff>,
    /// For a streamed Twrite: what it shares with the thread.
    pub(super) stream: Option<Arc<StreamState>>,
    /// It counts against the thread's worker turns.
    pub(super) on_worker: bool,
}

/// The requests of a socket thread in flight, by engine token.
#[derive(Default)]
pub(super) struct Requests {
    reqs: Vec<Option<Req>>,
    free: Vec<u16>,
}

impl Requests {
    /// Files `req` under a free token, or `None` when all are taken.
    pub(super) fn insert(&mut self, req: Req) -> Option<u16> {
        let t = match self.free.pop() {
            Some(t) => t,
            None if self.reqs.len() < usize::from(u16::MAX) => {
                self.reqs.push(None);
                (self.reqs.len() - 1) as u16
            }
            None => return None,
        };
        self.reqs[usize::from(t)] = Some(req);
        Some(t)
    }

    /// Takes the request of `token` out, freeing the token.
    pub(super) fn remove(&mut self, token: u16) -> Option<Req> {
        let req = self
            .reqs
            .get_mut(usize::from(token))
            .and_then(Option::take)?;
        self.free.push(token);
        Some(req)
    }
}
