// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Transport-agnostic request and reply buffers with zero-copy file hooks.
//!
//! The [`Server`](crate::Server) reads one request from a [`RequestReader`]
//! and writes one reply into a [`ReplyWriter`]. A transport over guest
//! memory implements both so that Twrite data goes from guest memory
//! straight into `pwritev` ([`RequestReader::read_to_file_at`]) and Rread
//! data from `preadv` straight into guest memory
//! ([`ReplyWriter::write_from_file_at`]). The default methods copy through
//! a bounce buffer, which is right for plain byte buffers.
//!
//! [`SliceReader`] and [`SliceWriter`] implement them over byte slices (the
//! socket transport and the in-process client use them).

use std::io::{self, Read, Write};
use std::os::fd::BorrowedFd;

use crate::exec::{Blocking, Inline};
use crate::sys::{pread, pread_nowait, pwrite_all};

/// Bounce-buffer size of the default copying implementations.
const COPY_CHUNK: usize = 64 << 10;

/// The bytes of one request.
pub trait RequestReader: Read {
    /// Bytes left to read.
    fn available_bytes(&self) -> usize;

    /// Bytes that can be read now without waiting, after waiting for some
    /// when none are there yet. A request whose bytes are all in memory
    /// (the default: every transport but one) returns
    /// [`available_bytes`](RequestReader::available_bytes) at once. The
    /// socket transport's streamed Twrite ("Slow senders" in
    /// [`crate::transport::socket`]) receives its data while the request
    /// runs: it waits here, on the request's coroutine and holding no
    /// thread, for the next chunk, and fails with `EINTR` once the request
    /// is cancelled, or when the peer sends too slowly or hangs up. The
    /// server reads at most this many bytes before it asks again, so no
    /// read of the request ever waits for the network.
    fn wait_ready(&mut self) -> io::Result<usize> {
        Ok(self.available_bytes())
    }

    /// Moves up to `count` bytes of the request into `file` at offset `off`
    /// (a `pwritev` from the request buffers for zero-copy transports).
    /// Returns the bytes written to the file, which may be short; the
    /// request is advanced by exactly that amount.
    fn read_to_file_at(
        &mut self,
        file: BorrowedFd<'_>,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        let mut done = 0usize;
        let mut buf = vec![0u8; count.min(COPY_CHUNK)];
        while done < count {
            let want = (count - done).min(buf.len());
            let got = self.read(&mut buf[..want])?;
            if got == 0 {
                break;
            }
            let written = pwrite_all(file, &buf[..got], off + done as u64)?;
            done += written;
            if written < got {
                break;
            }
        }
        Ok(done)
    }
}

/// Room for one reply.
pub trait ReplyWriter: Write + Sized {
    /// Bytes of room left.
    fn available_bytes(&self) -> usize;

    /// Bytes written so far through this writer.
    fn bytes_written(&self) -> usize;

    /// Splits off everything from `offset` (relative to the current write
    /// position) into a new writer; `self` keeps the first `offset` bytes.
    /// The server uses it to write Rread data before its header.
    fn split_at(&mut self, offset: usize) -> io::Result<Self>;

    /// Reads up to `count` bytes of `file` at `off` straight into the reply
    /// (`preadv` into the reply buffers for zero-copy transports). Returns
    /// the bytes read; fewer than `count` means end of file or a short read.
    fn write_from_file_at(
        &mut self,
        file: BorrowedFd<'_>,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        let count = count.min(self.available_bytes());
        let mut done = 0usize;
        let mut buf = vec![0u8; count.min(COPY_CHUNK)];
        while done < count {
            let want = (count - done).min(buf.len());
            let got = pread(file, &mut buf[..want], off + done as u64)?;
            if got == 0 {
                break;
            }
            self.write_all(&buf[..got])?;
            done += got;
            if got < want {
                break;
            }
        }
        Ok(done)
    }
}

/// A [`RequestReader`] over a byte slice.
#[derive(Debug)]
pub struct SliceReader<'a> {
    buf: &'a [u8],
}

impl<'a> SliceReader<'a> {
    /// A reader over `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        SliceReader { buf }
    }
}

impl Read for SliceReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        self.buf.read(out)
    }
}

impl RequestReader for SliceReader<'_> {
    fn available_bytes(&self) -> usize {
        self.buf.len()
    }

    fn read_to_file_at(
        &mut self,
        file: BorrowedFd<'_>,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        let count = count.min(self.buf.len());
        let n = pwrite_all(file, &self.buf[..count], off)?;
        self.buf = &self.buf[n..];
        Ok(n)
    }
}

/// A [`ReplyWriter`] over a mutable byte slice, whose file reads the
/// executor `B` places ([`Blocking::read_at`]).
#[derive(Debug)]
pub struct SliceWriter<'a, B = Inline> {
    buf: &'a mut [u8],
    pos: usize,
    exec: B,
}

impl<'a> SliceWriter<'a> {
    /// A writer filling `buf` from its start; its file reads run on the
    /// calling thread.
    pub fn new(buf: &'a mut [u8]) -> Self {
        SliceWriter::with_exec(buf, Inline)
    }
}

impl<'a, B: Blocking + Clone> SliceWriter<'a, B> {
    /// A writer filling `buf` from its start, whose file reads `exec`
    /// places: the executor the request runs on.
    pub fn with_exec(buf: &'a mut [u8], exec: B) -> Self {
        SliceWriter { buf, pos: 0, exec }
    }

    /// The executor that places this writer's file reads.
    pub(crate) fn exec(&self) -> &B {
        &self.exec
    }
}

impl<B> Write for SliceWriter<'_, B> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(self.buf.len() - self.pos);
        if n == 0 && !data.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "reply buffer is full",
            ));
        }
        self.buf[self.pos..self.pos + n].copy_from_slice(&data[..n]);
        self.pos += n;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<B: Blocking + Clone> ReplyWriter for SliceWriter<'_, B> {
    fn available_bytes(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn bytes_written(&self) -> usize {
        self.pos
    }

    fn split_at(&mut self, offset: usize) -> io::Result<Self> {
        let at = self
            .pos
            .checked_add(offset)
            .filter(|at| *at <= self.buf.len())
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "split beyond the reply buffer")
            })?;
        let buf = std::mem::take(&mut self.buf);
        let (head, tail) = buf.split_at_mut(at);
        self.buf = head;
        Ok(SliceWriter::with_exec(tail, self.exec.clone()))
    }

    /// Reads straight into the slice, where the executor says
    /// ([`Blocking::read_at`]): when it asks, the part already in the page
    /// cache is read first (`preadv2(RWF_NOWAIT)`), and only the rest may
    /// go to a worker.
    fn write_from_file_at(
        &mut self,
        file: BorrowedFd<'_>,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        let count = count.min(self.available_bytes());
        // The slice, the bytes read so far, and whether the rest needs no
        // blocking read (both closures reach it; only one runs at a time).
        let state = std::sync::Mutex::new((&mut self.buf[self.pos..self.pos + count], 0, false));
        let n = self.exec.read_at(
            || {
                let mut g = state.lock().unwrap_or_else(|e| e.into_inner());
                let (buf, done, complete) = &mut *g;
                if let Ok(n) = pread_nowait(file, buf, off) {
                    // 0: end of file (nothing would block).
                    (*done, *complete) = (n, n == buf.len() || n == 0);
                }
                *complete
            },
            || {
                let mut g = state.lock().unwrap_or_else(|e| e.into_inner());
                let (buf, done, complete) = &mut *g;
                let (mut done, complete) = (*done, *complete);
                while !complete && done < buf.len() {
                    match pread(file, &mut buf[done..], off + done as u64)? {
                        0 => break,
                        n => done += n,
                    }
                }
                Ok::<_, io::Error>(done)
            },
        )?;
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn test_slice_writer_split_keeps_head() {
        let mut buf = [0u8; 8];
        let mut w = SliceWriter::new(&mut buf);
        let mut tail = w.split_at(3).unwrap();
        tail.write_all(b"tail").unwrap();
        w.write_all(b"hea").unwrap();
        assert!(w.write_all(b"x").is_err());
        assert_eq!(tail.bytes_written(), 4);
        assert_eq!(&buf[..7], b"heatail");
    }

    #[test]
    fn test_slice_writer_split_beyond_end_fails() {
        let mut buf = [0u8; 4];
        let mut w = SliceWriter::new(&mut buf);
        assert!(w.split_at(5).is_err());
    }

    #[test]
    fn test_slice_io_file_round_trip() {
        let f = tempfile::tempfile().unwrap();
        let mut r = SliceReader::new(b"hello world");
        assert_eq!(r.read_to_file_at(f.as_fd(), 5, 10).unwrap(), 5);
        assert_eq!(r.available_bytes(), 6);
        let mut buf = [0u8; 32];
        let mut w = SliceWriter::new(&mut buf);
        assert_eq!(w.write_from_file_at(f.as_fd(), 100, 10).unwrap(), 5);
        assert_eq!(&buf[..5], b"hello");
    }

    struct CopyWriter(Vec<u8>);
    impl Write for CopyWriter {
        fn write(&mut self, d: &[u8]) -> io::Result<usize> {
            self.0.extend_from_slice(d);
            Ok(d.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    impl ReplyWriter for CopyWriter {
        fn available_bytes(&self) -> usize {
            1 << 20
        }
        fn bytes_written(&self) -> usize {
            self.0.len()
        }
        fn split_at(&mut self, _offset: usize) -> io::Result<Self> {
            Ok(CopyWriter(Vec::new()))
        }
    }
    struct CopyReader<'a>(&'a [u8]);
    impl Read for CopyReader<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            self.0.read(out)
        }
    }
    impl RequestReader for CopyReader<'_> {
        fn available_bytes(&self) -> usize {
            self.0.len()
        }
    }

    #[test]
    fn test_default_copy_paths() {
        let f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let mut r = CopyReader(&data);
        assert_eq!(
            r.read_to_file_at(f.as_fd(), data.len(), 0).unwrap(),
            data.len()
        );
        let mut w = CopyWriter(Vec::new());
        assert_eq!(
            w.write_from_file_at(f.as_fd(), 300_000, 0).unwrap(),
            data.len()
        );
        assert_eq!(w.0, data);
    }
}
