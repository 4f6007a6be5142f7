// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! [`RequestReader`]/[`ReplyWriter`] over the two halves of a descriptor
//! chain: zero-copy file I/O straight between guest memory and
//! `preadv`/`pwritev` (chunked at `IOV_MAX` by `virtqueue-large`).
//!
//! # No late write into guest memory
//!
//! On the engine's thread a request is alive by construction: a request
//! given up on by a bounded teardown is never resumed. A worker thread is
//! different: its call may return after the teardown, when the guest has
//! reused the chain's pages. So a [`ChainWriter`] or [`ChainReader`] used
//! off the engine's thread never hands guest memory to a call that can
//! block: file data is read into the worker's bounce buffer first (Rread),
//! or Twrite data copied out of guest memory into it before the `pwrite`,
//! and each copy into or out of guest memory runs under the request's
//! [`Cancel::guest_access`], which the teardown revokes
//! ([`Cancel::abandon`]) before the chain goes back.

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::ops::Deref;
use std::os::fd::BorrowedFd;

use virtqueue_large::{Reader, Writer};
use vm_memory::GuestMemoryBackend;

use crate::engine;
use crate::exec::{Blocking, Cancel, Inline};
use crate::io::{ReplyWriter, RequestReader};
use crate::sys::range_cached;

/// Largest piece a worker reads into its bounce buffer before copying it
/// into guest memory (see the module docs).
const BOUNCE_CHUNK: usize = 256 << 10;

thread_local! {
    /// The bounce buffer of a worker thread (see the module docs); one per
    /// thread, reused, at most [`BOUNCE_CHUNK`] bytes.
    static BOUNCE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The device-readable part of a chain: one 9P request, and the request's
/// [`Cancel`] token, which guards reads of guest memory from other
/// threads.
#[derive(Debug)]
pub struct ChainReader<M>(pub Reader<M>, pub Cancel);

/// The device-writable part of a chain: room for one 9P reply, the
/// request's [`Cancel`] token that guards writes from other threads, and
/// the executor the request runs on, which places file reads
/// ([`Blocking::read_at`]).
#[derive(Debug)]
pub struct ChainWriter<M, B = Inline> {
    writer: Writer<M>,
    token: Cancel,
    exec: B,
}

impl<M, B> ChainWriter<M, B> {
    /// The reply room `writer` of the request whose token is `token`,
    /// run on `exec`.
    pub fn new(writer: Writer<M>, token: Cancel, exec: B) -> Self {
        ChainWriter {
            writer,
            token,
            exec,
        }
    }
}

/// The error of a write for a request that was given up on.
fn abandoned() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the request was given up on: its guest memory is off limits",
    )
}

impl<M> Read for ChainReader<M>
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl<M> RequestReader for ChainReader<M>
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    fn available_bytes(&self) -> usize {
        self.0.available_bytes()
    }

    fn read_to_file_at(
        &mut self,
        file: BorrowedFd<'_>,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        if engine::on_coroutine() {
            if self.1.is_gone() {
                return Err(abandoned());
            }
            return self.0.write_to_file_at(&file, count, off);
        }
        write_file(&mut self.0, &self.1, file, count, off)
    }
}

/// Writes request data to a file off the engine's thread: each piece is
/// copied out of guest memory into the worker's bounce buffer (under the
/// request's [`Cancel::guest_access`]) before the `pwrite`, which may
/// block for as long as the filesystem likes with no guest page in it
/// (module docs). The reader advances by exactly the bytes written.
fn write_file<M>(
    r: &mut Reader<M>,
    token: &Cancel,
    file: BorrowedFd<'_>,
    count: usize,
    off: u64,
) -> io::Result<usize>
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    let count = count.min(r.available_bytes());
    BOUNCE.with(|bounce| {
        let mut buf = bounce.borrow_mut();
        let chunk = count.min(BOUNCE_CHUNK);
        if buf.len() < chunk {
            buf.resize(chunk, 0);
        }
        let mut done = 0usize;
        while done < count {
            let want = (count - done).min(chunk);
            let data = &mut buf[..want];
            let mut peek = r.clone();
            token
                .guest_access(|| peek.read_exact(data))
                .unwrap_or_else(|| Err(abandoned()))?;
            let wrote = match crate::sys::pwrite_all(file, data, off + done as u64) {
                Ok(n) => n,
                Err(_) if done > 0 => break,
                Err(e) => return Err(e),
            };
            let rest = r
                .split_at(wrote)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            *r = rest;
            done += wrote;
            if wrote < want {
                break;
            }
        }
        Ok(done)
    })
}

impl<M, B> Write for ChainWriter<M, B>
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if engine::on_coroutine() {
            // The engine's thread abandons, so no access is in progress.
            if self.token.is_gone() {
                return Err(abandoned());
            }
            return self.writer.write(buf);
        }
        let w = &mut self.writer;
        self.token
            .guest_access(|| w.write(buf))
            .unwrap_or_else(|| Err(abandoned()))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<M, B> ReplyWriter for ChainWriter<M, B>
where
    B: Blocking + Clone,
    M: Deref + Clone + Send,
    M::Target: GuestMemoryBackend + Sized,
{
    fn available_bytes(&self) -> usize {
        self.writer.available_bytes()
    }

    fn bytes_written(&self) -> usize {
        self.writer.bytes_written()
    }

    fn split_at(&mut self, offset: usize) -> io::Result<Self> {
        self.writer
            .split_at(offset)
            .map(|writer| ChainWriter::new(writer, self.token.clone(), self.exec.clone()))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    }

    fn write_from_file_at(
        &mut self,
        file: BorrowedFd<'_>,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        // The executor decides where the read runs; the hint is whether
        // the range is in the page cache (then a copy right here is cheaper
        // than a thread hop).
        let w = &mut self.writer;
        let token = &self.token;
        self.exec.read_at(
            || range_cached(file, count, off),
            move || read_file(w, token, file, count, off),
        )
    }
}

/// Reads file data into the reply: straight into guest memory on the
/// engine's thread, through the bounce buffer elsewhere (module docs).
fn read_file<M>(
    w: &mut Writer<M>,
    token: &Cancel,
    file: BorrowedFd<'_>,
    count: usize,
    off: u64,
) -> io::Result<usize>
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    if engine::on_coroutine() {
        if token.is_gone() {
            return Err(abandoned());
        }
        return w.read_from_file_at(&file, count, off);
    }
    let count = count.min(w.available_bytes());
    BOUNCE.with(|bounce| {
        let mut buf = bounce.borrow_mut();
        let chunk = count.min(BOUNCE_CHUNK);
        if buf.len() < chunk {
            buf.resize(chunk, 0);
        }
        let mut done = 0usize;
        while done < count {
            let want = (count - done).min(chunk);
            // May block for as long as the filesystem likes: guest memory
            // is not involved.
            let got = crate::sys::pread(file, &mut buf[..want], off + done as u64)?;
            if got == 0 {
                break;
            }
            let data = &buf[..got];
            token
                .guest_access(|| w.write_all(data))
                .unwrap_or_else(|| Err(abandoned()))?;
            done += got;
            if got < want {
                break;
            }
        }
        Ok(done)
    })
}
