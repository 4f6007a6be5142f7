// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The replies of one connection waiting to be written, in the order
//! their requests finished, and the writing of them: each reply's bytes,
//! then for a spliced Rread its pipe ("Zero-copy Rread" in the module
//! docs), without ever waiting for a full socket.

use std::collections::VecDeque;
use std::io;
use std::os::fd::BorrowedFd;

use super::pipes::{self, SharedPipes};
use super::splice::{self, rread_tail, set_rread_count, Filled, Tail};
use crate::protocol::Rmessage;
use crate::sys::send_fd;

/// A connection whose unwritten replies reach this many bytes reads no
/// further request until the client has taken some: a client that does not
/// read its replies makes the server stop reading, and the replies in the
/// making stay few (and warm in the cache) however many requests the client
/// keeps outstanding.
pub(crate) const OUT_HIGH_WATER: usize = 256 << 10;

/// One reply waiting to be written: `buf[..len]`, then the spliced data
/// of an Rread.
pub(super) struct Out {
    buf: Vec<u8>,
    len: usize,
    /// Whether `buf` came from the pool.
    pooled: bool,
    tail: Option<Tail>,
}

impl Out {
    /// The reply a request wrote into `buf[..len]` (a pooled buffer),
    /// followed by the data it `spliced`, if any.
    pub(super) fn reply(mut buf: Vec<u8>, len: usize, spliced: Option<Filled>) -> Out {
        let (len, tail) = match spliced {
            Some(f) => rread_tail(&mut buf, len, f),
            None => (len, None),
        };
        Out {
            buf,
            len,
            pooled: true,
            tail,
        }
    }

    /// An Rlerror for `tag`, answered without running anything.
    pub(super) fn error(tag: u16, errno: u32) -> Out {
        let buf = Rmessage::Lerror(errno).encode_frame(tag);
        Out {
            len: buf.len(),
            buf,
            pooled: false,
            tail: None,
        }
    }

    /// Bytes of the whole reply.
    fn total(&self) -> usize {
        self.len + self.tail.as_ref().map_or(0, |t| t.len)
    }

    /// The buffer, if it goes back to the pool.
    pub(super) fn into_pooled(self) -> Option<Vec<u8>> {
        self.pooled.then_some(self.buf)
    }
}

/// The replies of one connection waiting to be written.
#[derive(Default)]
pub(super) struct Output {
    queue: VecDeque<Out>,
    /// Bytes of the front reply already written.
    pos: usize,
    /// Bytes of the replies waiting.
    bytes: usize,
}

impl Output {
    /// Queues `out` after the others.
    pub(super) fn push(&mut self, out: Out) {
        self.bytes += out.total();
        self.queue.push_back(out);
    }

    /// Whether nothing waits to be written.
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether the replies waiting reach [`OUT_HIGH_WATER`].
    pub(super) fn is_full(&self) -> bool {
        self.bytes >= OUT_HIGH_WATER
    }

    /// Writes into `sock` what it takes. Each reply written in full is
    /// handed to `sent` (its pipe, if any, already back in `pipes`);
    /// `log` says whether to log a spliced Rread that lost bytes.
    pub(super) fn flush(
        &mut self,
        sock: BorrowedFd<'_>,
        pipes: &SharedPipes,
        log: impl Fn() -> bool,
        mut sent: impl FnMut(Out),
    ) -> io::Result<()> {
        while let Some(front) = self.queue.front_mut() {
            if self.pos == 0 {
                if let Some(t) = front.tail.as_mut() {
                    if t.left == t.len {
                        // Just before its header goes out: a file that
                        // shrank since the fill cuts the reply.
                        let old = t.len;
                        if let Some(len) = t.recount() {
                            self.bytes -= old - len;
                            set_rread_count(&mut front.buf, len);
                        }
                    }
                }
            }
            if self.pos < front.len {
                let more = front.tail.is_some();
                let Some(n) = send_fd(sock, &front.buf[self.pos..front.len], more)? else {
                    break;
                };
                self.pos += n;
                continue;
            }
            if let Some(t) = front.tail.as_mut().filter(|t| t.left > 0) {
                // The header is out: now the pipe (kept while the socket
                // is full).
                let Some(n) = splice::splice_out(t, sock, &log)? else {
                    break;
                };
                t.left -= n;
                continue;
            }
            self.pos = 0;
            self.bytes -= front.total();
            if let Some(mut o) = self.queue.pop_front() {
                if let Some((pipe, empty)) = o.tail.take().and_then(Tail::into_pipe) {
                    // Sent in full: empty, unless the reply was cut.
                    pipes::lock(pipes).put(pipe, empty);
                }
                sent(o);
            }
        }
        Ok(())
    }

    /// The replies never written (the connection closed).
    pub(super) fn into_unsent(self) -> impl Iterator<Item = Out> {
        self.queue.into_iter()
    }
}
