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
//! reused the chain's pages. So a [`ChainWriter`] used off the engine's
//! thread never hands guest memory to a call that can block: file data is
//! read into the worker's bounce buffer first, and each copy into guest
//! memory runs under the request's [`Cancel::guest_access`], which the
//! teardown revokes ([`Cancel::abandon`]) before the chain goes back.

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::ops::Deref;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU8, Ordering};

use virtqueue_large::{Reader, Writer};
use vm_memory::GuestMemoryBackend;

use crate::engine;
use crate::io::{ReplyWriter, RequestReader};
use crate::server::Cancel;

/// Largest piece a worker reads into its bounce buffer before copying it
/// into guest memory (see the module docs).
const BOUNCE_CHUNK: usize = 256 << 10;

thread_local! {
    /// The bounce buffer of a worker thread (see the module docs); one per
    /// thread, reused, at most [`BOUNCE_CHUNK`] bytes.
    static BOUNCE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The device-readable part of a chain: one 9P request.
#[derive(Debug)]
pub struct ChainReader<M>(pub Reader<M>);

/// The device-writable part of a chain: room for one 9P reply, and the
/// request's [`Cancel`] token that guards writes from other threads.
#[derive(Debug)]
pub struct ChainWriter<M> {
    writer: Writer<M>,
    token: Cancel,
}

impl<M> ChainWriter<M> {
    /// The reply room `writer` of the request whose token is `token`.
    pub fn new(writer: Writer<M>, token: Cancel) -> Self {
        ChainWriter { writer, token }
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
        self.0.write_to_file_at(&file, count, off)
    }
}

impl<M> Write for ChainWriter<M>
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if engine::on_coroutine() {
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

impl<M> ReplyWriter for ChainWriter<M>
where
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
            .map(|writer| ChainWriter::new(writer, self.token.clone()))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    }

    fn write_from_file_at(
        &mut self,
        file: BorrowedFd<'_>,
        count: usize,
        off: u64,
    ) -> io::Result<usize> {
        // The engine decides where the read runs; the hint is whether the
        // range is in the page cache (then a copy right here is cheaper
        // than a thread hop).
        let w = &mut self.writer;
        let token = &self.token;
        engine::offload_read(
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
            let got = crate::io::pread(file, &mut buf[..want], off + done as u64)?;
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

/// `cachestat(2)` support: 0 unknown, 1 yes, 2 no.
static CACHESTAT: AtomicU8 = AtomicU8::new(0);

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const SYS_CACHESTAT: libc::c_long = 451;

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// Whether every page of `[off, off + count)` that lies inside the file is
/// in the page cache. False when unknown (no `cachestat(2)`, Linux < 6.5),
/// so the caller offloads.
pub(crate) fn range_cached(file: BorrowedFd<'_>, count: usize, off: u64) -> bool {
    if count == 0 {
        return true;
    }
    if CACHESTAT.load(Ordering::Relaxed) == 2 {
        return false;
    }
    let range = CachestatRange {
        off,
        len: count as u64,
    };
    let mut cs = Cachestat::default();
    // SAFETY: cachestat reads `range` and writes `cs`, both valid for the
    // call; the fd is borrowed.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const CachestatRange,
            &mut cs as *mut Cachestat,
            0u32,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSYS) {
            CACHESTAT.store(2, Ordering::Relaxed);
        }
        return false;
    }
    CACHESTAT.store(1, Ordering::Relaxed);
    let page = page_size();
    let end = off.saturating_add(count as u64);
    let wanted = |end: u64| end.div_ceil(page).saturating_sub(off / page);
    if cs.nr_cache >= wanted(end) {
        return true;
    }
    // Part of the range may lie past the end of the file.
    // SAFETY: fstat writes into `st`, valid for the call.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the fd is borrowed.
    if unsafe { libc::fstat64(file.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    let size = st.st_size.max(0) as u64;
    if size <= off {
        return true;
    }
    cs.nr_cache >= wanted(end.min(size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn test_range_cached_after_write() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![7u8; 64 << 10]).unwrap();
        // Just written: in the page cache (where cachestat exists).
        let cached = range_cached(f.as_fd(), 64 << 10, 0);
        if CACHESTAT.load(Ordering::Relaxed) == 1 {
            assert!(cached);
            // Past the end of the file: nothing to read, nothing to wait for.
            assert!(range_cached(f.as_fd(), 4096, 1 << 20));
            // A range straddling the end counts only what exists.
            assert!(range_cached(f.as_fd(), 1 << 20, 32 << 10));
        } else {
            eprintln!("cachestat(2) unavailable: reads are always offloaded");
            assert!(!cached);
        }
    }
}
