// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The streamed Twrite ("Slow senders" in the module docs): a Twrite
//! larger than `KEEP_BUFFER` reads its data from the socket itself.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::BorrowedFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::warn;

use super::buffers::{KEEP_BUFFER, SMALL_BUFFER};
use super::connection::{reply_len, Handoff, Input, Loop, TWRITE_HEAD};
use super::limits::{too_slow_error, RateFloor, DUPLICATE_TAG_ERRNO};
use super::writer::SockWriter;
use crate::engine::{self};
use crate::fs::Filesystem;
use crate::io::RequestReader;
use crate::protocol::{Header, HEADER_SIZE};
use crate::server::Cancel;
use crate::sys::read_some;

impl<F: Filesystem + 'static> Loop<F> {
    /// Runs a large Twrite whose data the request reads from the socket
    /// itself, chunk by chunk, as it arrives ("Slow senders").
    pub(super) fn start_stream(&mut self, id: u32, head: [u8; TWRITE_HEAD]) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let h = Header::from_bytes(head[..HEADER_SIZE].try_into().unwrap_or(&[0; HEADER_SIZE]));
        let frame_start = c.frame_start.unwrap_or_else(Instant::now);
        if self.engine.has_tag(id, h.tag) {
            if self.shared.server.log_limit().admit() {
                warn!("9p: connection {id}: tag {} is already in flight", h.tag);
            }
            self.unreserve(id);
            // Skip its data, then answer.
            if let Some(c) = self.conns.get_mut(&id) {
                c.input = Input::Skip {
                    left: (h.size as usize - TWRITE_HEAD) as u64,
                    answer: Some((h.tag, DUPLICATE_TAG_ERRNO as u32)),
                };
            }
            return;
        }
        // Small buffers are never refused.
        let reply = self
            .bufs
            .take(SMALL_BUFFER)
            .unwrap_or_else(|| vec![0u8; SMALL_BUFFER]);
        let chunk = self
            .bufs
            .take(STREAM_CHUNK)
            .or_else(|| self.bufs.take(KEEP_BUFFER))
            .unwrap_or_else(|| vec![0u8; KEEP_BUFFER]);
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let server = Arc::clone(&self.shared.server);
        let session = Arc::clone(&c.session);
        let sock = Arc::clone(&c.sock);
        let exec = self.exec;
        let handoff = Rc::new(Handoff::default());
        let back = Rc::clone(&handoff);
        let state = Arc::new(StreamState {
            unread: AtomicUsize::new(h.size as usize - TWRITE_HEAD),
            too_slow: AtomicBool::new(false),
        });
        let size = h.size as usize;
        let stream_state = Arc::clone(&state);
        let floor = RateFloor::of(&self.shared.limits);
        let task = move |cancel: Cancel| {
            let mut reply = reply;
            let mut req = StreamRequest {
                head,
                pos: 0,
                chunk,
                start: 0,
                end: 0,
                sock,
                size,
                state: stream_state,
                frame_start,
                floor,
                cancel: cancel.clone(),
            };
            let r = server.handle(
                &session,
                &mut req,
                &mut SockWriter::new(&mut reply[..SMALL_BUFFER], None, exec),
                &exec,
                &cancel,
            );
            back.request.set(Some(req.chunk));
            back.reply.set(Some(reply));
            reply_len(r, &cancel)
        };
        self.spawn(id, h.tag, handoff, Some((state, size)), false, task);
    }
}

/// What a streamed Twrite shares with its socket thread.
pub(super) struct StreamState {
    /// Bytes of the frame still in the socket (the thread skips them if
    /// the request ends early).
    pub(super) unread: AtomicUsize,
    /// The data arrived below the minimum rate: the thread closes the
    /// connection.
    pub(super) too_slow: AtomicBool,
}

impl StreamState {
    /// Bytes of the frame of `size` received so far.
    pub(super) fn got(&self, size: usize) -> usize {
        size - self.unread.load(Ordering::Acquire)
    }
}

/// Bytes a streamed Twrite receives before it hands them to a filesystem
/// call (charged to the shared budget; 64 KiB when the budget is spent).
pub(crate) const STREAM_CHUNK: usize = 256 << 10;

/// The first pause of a streamed Twrite whose socket has nothing for it,
/// and the longest (the pause doubles while nothing comes).
pub(super) const STREAM_PAUSE_MIN: Duration = Duration::from_micros(50);
pub(super) const STREAM_PAUSE_MAX: Duration = Duration::from_millis(10);

/// A large Twrite whose data the request reads from the socket itself
/// ("Slow senders" in the module docs): the head already read, then the
/// rest of the frame in chunks. [`RequestReader::wait_ready`] fills the
/// next chunk on the request's coroutine, from the nonblocking socket,
/// pausing on the engine's timer (no thread held) while nothing comes;
/// reads and file writes then take only bytes already in the chunk, so
/// neither a socket thread nor a worker ever waits for the peer. The
/// frame must keep up the minimum rate
/// ([`SocketLimits::min_request_rate`](super::SocketLimits::min_request_rate)) once its grace has passed.
pub(super) struct StreamRequest {
    pub(super) head: [u8; TWRITE_HEAD],
    pub(super) pos: usize,
    /// Received bytes `chunk[start..end]` not consumed yet.
    pub(super) chunk: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) sock: Arc<File>,
    /// The frame's size.
    pub(super) size: usize,
    pub(super) state: Arc<StreamState>,
    /// When the frame's first byte arrived.
    pub(super) frame_start: Instant,
    pub(super) floor: RateFloor,
    pub(super) cancel: Cancel,
}

impl StreamRequest {
    pub(super) fn unread(&self) -> usize {
        self.state.unread.load(Ordering::Acquire)
    }

    /// Whether the frame so far arrived below the minimum rate.
    pub(super) fn too_slow(&self) -> bool {
        let got = self.size - self.unread();
        self.floor.too_slow(self.frame_start, got, Instant::now())
    }

    /// Fills the empty chunk with the next bytes of the frame: all of the
    /// chunk (or of the frame's rest), or at least `KEEP_BUFFER` when the
    /// socket runs dry.
    pub(super) fn fill(&mut self) -> io::Result<()> {
        self.start = 0;
        self.end = 0;
        let goal = self.chunk.len().min(self.unread());
        let mut pause = STREAM_PAUSE_MIN;
        while self.end < goal {
            if self.cancel.is_cancelled() {
                return Err(io::Error::from_raw_os_error(libc::EINTR));
            }
            match read_some(&self.sock, &mut self.chunk[self.end..goal])? {
                Some(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "client hung up mid-message",
                    ))
                }
                Some(n) => {
                    self.end += n;
                    self.state.unread.fetch_sub(n, Ordering::AcqRel);
                    pause = STREAM_PAUSE_MIN;
                }
                None if self.end >= KEEP_BUFFER => break,
                None => {
                    if self.too_slow() {
                        self.state.too_slow.store(true, Ordering::Release);
                        return Err(too_slow_error());
                    }
                    // On the request's coroutine: a timer, no thread.
                    engine::sleep(pause);
                    pause = (pause * 2).min(STREAM_PAUSE_MAX);
                }
            }
        }
        Ok(())
    }
}

impl Read for StreamRequest {
    /// The head, then bytes already received; never waits (`EAGAIN` when
    /// the chunk is empty: call `wait_ready` first).
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.pos < TWRITE_HEAD {
            let n = buf.len().min(TWRITE_HEAD - self.pos);
            buf[..n].copy_from_slice(&self.head[self.pos..self.pos + n]);
            self.pos += n;
            return Ok(n);
        }
        if self.start == self.end {
            if self.unread() == 0 {
                return Ok(0);
            }
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        let n = buf.len().min(self.end - self.start);
        buf[..n].copy_from_slice(&self.chunk[self.start..self.start + n]);
        self.start += n;
        Ok(n)
    }
}

impl RequestReader for StreamRequest {
    fn available_bytes(&self) -> usize {
        (TWRITE_HEAD - self.pos) + (self.end - self.start) + self.unread()
    }

    fn wait_ready(&mut self) -> io::Result<usize> {
        if self.pos < TWRITE_HEAD {
            return Ok(TWRITE_HEAD - self.pos);
        }
        if self.start == self.end && self.unread() > 0 {
            self.fill()?;
        }
        Ok(self.end - self.start)
    }

    /// Writes bytes already received straight from the chunk.
    fn read_to_file_at(
        &mut self,
        file: BorrowedFd<'_>,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        if self.pos < TWRITE_HEAD {
            return Err(io::Error::other("Twrite data read before its head"));
        }
        let n = count.min(self.end - self.start);
        let w = crate::sys::pwrite_all(file, &self.chunk[self.start..self.start + n], off)?;
        self.start += w;
        Ok(w)
    }
}
