// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The streamed Twrite ("Slow senders" in the module docs): a Twrite
//! larger than `KEEP_BUFFER` reads its data from the socket itself.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::buffers::KEEP_BUFFER;
use super::limits::{too_slow_error, RateFloor};
use crate::engine;
use crate::io::RequestReader;
use crate::protocol::HEADER_SIZE;
use crate::server::Cancel;
use crate::sys::read_some;

/// Header plus `fid[4] offset[8] count[4]` of a Twrite: what the socket
/// thread reads before the request streams the rest.
pub(super) const TWRITE_HEAD: usize = HEADER_SIZE + 16;

/// What a streamed Twrite shares with its socket thread.
pub(super) struct StreamState {
    /// The frame's size.
    size: usize,
    /// Bytes of the frame still in the socket (the thread skips them if
    /// the request ends early).
    unread: AtomicUsize,
    /// The data arrived below the minimum rate: the thread closes the
    /// connection.
    too_slow: AtomicBool,
}

impl StreamState {
    /// The state of a streamed Twrite of `size` bytes whose head
    /// ([`TWRITE_HEAD`]) was read.
    pub(super) fn new(size: usize) -> Arc<Self> {
        Arc::new(StreamState {
            size,
            unread: AtomicUsize::new(size - TWRITE_HEAD),
            too_slow: AtomicBool::new(false),
        })
    }

    /// Bytes of the frame received so far.
    pub(super) fn got(&self) -> usize {
        self.size - self.unread()
    }

    /// Bytes of the frame still in the socket.
    pub(super) fn unread(&self) -> usize {
        self.unread.load(Ordering::Acquire)
    }

    /// Whether the request gave up on data arriving below the minimum rate.
    pub(super) fn too_slow(&self) -> bool {
        self.too_slow.load(Ordering::Acquire)
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
    head: [u8; TWRITE_HEAD],
    pos: usize,
    /// Received bytes `chunk[start..end]` not consumed yet.
    chunk: Vec<u8>,
    start: usize,
    end: usize,
    sock: Arc<File>,
    state: Arc<StreamState>,
    /// When the frame's first byte arrived.
    frame_start: Instant,
    floor: RateFloor,
    cancel: Cancel,
}

impl StreamRequest {
    /// The request of the Twrite whose `head` was read, its rest still
    /// in `sock`; `chunk` is its buffer for the data.
    pub(super) fn new(
        head: [u8; TWRITE_HEAD],
        chunk: Vec<u8>,
        sock: Arc<File>,
        state: Arc<StreamState>,
        frame_start: Instant,
        floor: RateFloor,
        cancel: Cancel,
    ) -> Self {
        StreamRequest {
            head,
            pos: 0,
            chunk,
            start: 0,
            end: 0,
            sock,
            state,
            frame_start,
            floor,
            cancel,
        }
    }

    /// The chunk buffer, once the request is done.
    pub(super) fn into_chunk(self) -> Vec<u8> {
        self.chunk
    }

    fn unread(&self) -> usize {
        self.state.unread()
    }

    /// Whether the frame so far arrived below the minimum rate.
    fn too_slow(&self) -> bool {
        self.floor
            .too_slow(self.frame_start, self.state.got(), Instant::now())
    }

    /// Fills the empty chunk with the next bytes of the frame: all of the
    /// chunk (or of the frame's rest), or at least `KEEP_BUFFER` when the
    /// socket runs dry.
    fn fill(&mut self) -> io::Result<()> {
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
