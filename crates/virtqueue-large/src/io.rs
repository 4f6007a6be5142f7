// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Zero-copy Reader and Writer over the segments of a validated chain.

use std::cell::RefCell;
use std::io;
use std::ops::Deref;
use std::os::fd::{AsFd, AsRawFd, RawFd};

use vm_memory::bitmap::{Bitmap, BS};
use vm_memory::{
    ByteValued, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress,
    VolatileSlice,
};

use crate::segments::{Segment, Shared};
use crate::{Error, Result};

/// The most iovecs one `preadv`/`pwritev` call takes on Linux (`UIO_MAXIOV`).
pub const IOV_MAX: usize = 1024;

/// The most bytes one read or write system call transfers on Linux
/// (`MAX_RW_COUNT`, `INT_MAX` rounded down to a page). Each call is capped
/// here, so that a short transfer always means a real short read or write
/// and never the kernel's silent clamp.
pub const MAX_RW_COUNT: usize = 0x7fff_f000;

thread_local! {
    // One iovec array per thread, reused by every file I/O call: no
    // allocation per call and no 16 KiB array on small coroutine stacks.
    static IOV_SCRATCH: RefCell<Vec<libc::iovec>> = RefCell::new(Vec::with_capacity(IOV_MAX));
}

/// One recorded file I/O system call (test builds only).
#[cfg(any(test, feature = "test-utils"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoCall {
    /// iovecs passed to the call.
    pub iovecs: usize,
    /// Bytes those iovecs cover.
    pub requested: usize,
    /// Bytes the call transferred.
    pub transferred: usize,
}

#[cfg(any(test, feature = "test-utils"))]
thread_local! {
    // `None` until the first `take_io_trace` on this thread.
    pub(crate) static IO_TRACE: RefCell<Option<Vec<IoCall>>> = const { RefCell::new(None) };
}

#[inline]
fn trace(_iovecs: usize, _requested: usize, _transferred: usize) {
    #[cfg(any(test, feature = "test-utils"))]
    IO_TRACE.with(|t| {
        if let Some(calls) = t.borrow_mut().as_mut() {
            calls.push(IoCall {
                iovecs: _iovecs,
                requested: _requested,
                transferred: _transferred,
            })
        }
    });
}

type Bs<'a, G> = BS<'a, <<G as GuestMemoryBackend>::R as GuestMemoryRegion>::B>;

/// The slice of guest memory behind `len` bytes at `addr`, which a
/// validated segment guarantees to lie inside one region.
fn translate<G: GuestMemoryBackend>(
    mem: &G,
    addr: u64,
    len: usize,
) -> io::Result<VolatileSlice<'_, Bs<'_, G>>> {
    let region = mem
        .find_region(GuestAddress(addr))
        .ok_or_else(|| io::Error::other(format!("guest address {addr:#x} not mapped")))?;
    region
        .get_slice(MemoryRegionAddress(addr - region.start_addr().0), len)
        .map_err(io::Error::other)
}

/// Walks `(address, length)` ranges from a cursor position.
struct Ranges<'a> {
    segs: &'a [Segment],
    idx: usize,
    off: usize,
    left: usize,
}

impl Iterator for Ranges<'_> {
    type Item = (u64, usize);

    fn next(&mut self) -> Option<(u64, usize)> {
        if self.left == 0 {
            return None;
        }
        let seg = self.segs.get(self.idx)?;
        let n = (seg.len() as usize - self.off).min(self.left);
        let addr = seg.raw_addr() + self.off as u64;
        self.idx += 1;
        self.off = 0;
        self.left -= n;
        Some((addr, n))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// Guest memory to the file.
    ToFile,
    /// The file to guest memory.
    FromFile,
}

/// Position and bounds shared by Reader and Writer.
#[derive(Debug, Clone)]
struct Cursor<M> {
    mem: M,
    segs: Shared,
    idx: usize,
    off: usize,
    remaining: usize,
    done: usize,
}

impl<M> Cursor<M>
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    /// A cursor at the start of segment `idx`, bounded to `len` bytes.
    fn new(mem: M, segs: Shared, idx: usize, len: usize) -> Self {
        Cursor {
            mem,
            segs,
            idx,
            off: 0,
            remaining: len,
            done: 0,
        }
    }

    fn ranges(&self, limit: usize) -> Ranges<'_> {
        Ranges {
            segs: self.segs.segs(),
            idx: self.idx,
            off: self.off,
            left: limit.min(self.remaining),
        }
    }

    fn advance(&mut self, n: usize) {
        debug_assert!(n <= self.remaining);
        self.remaining -= n;
        self.done += n;
        let segs = self.segs.segs();
        let mut n = n;
        while n > 0 {
            let left = segs[self.idx].len() as usize - self.off;
            if n < left {
                self.off += n;
                return;
            }
            n -= left;
            self.idx += 1;
            self.off = 0;
        }
    }

    fn split_at(&mut self, offset: usize) -> Result<Self> {
        if offset > self.remaining {
            return Err(Error::SplitOutOfBounds {
                offset,
                available: self.remaining,
            });
        }
        let mut tail = self.clone();
        tail.advance(offset);
        tail.done = 0;
        self.remaining = offset;
        Ok(tail)
    }

    fn read_into(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut done = 0;
        for (addr, n) in self.ranges(buf.len()) {
            let slice = translate(self.mem.deref(), addr, n)?;
            done += slice.copy_to(&mut buf[done..done + n]);
        }
        self.advance(done);
        Ok(done)
    }

    fn write_from(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut done = 0;
        for (addr, n) in self.ranges(buf.len()) {
            let slice = translate(self.mem.deref(), addr, n)?;
            // copy_from marks the dirty bitmap.
            slice.copy_from(&buf[done..done + n]);
            done += n;
        }
        self.advance(done);
        Ok(done)
    }

    /// Fills `iov` with the host addresses of up to `limit` bytes from the
    /// cursor, at most `max_iov` entries; segments adjacent in host memory
    /// share one entry. Returns the bytes covered. The cursor does not move.
    fn fill_iovecs(
        &self,
        limit: usize,
        max_iov: usize,
        iov: &mut Vec<libc::iovec>,
    ) -> io::Result<usize> {
        iov.clear();
        let mut bytes = 0usize;
        for (addr, n) in self.ranges(limit) {
            let slice = translate(self.mem.deref(), addr, n)?;
            // The guard is a no-op for regular mmap regions (the `xen`
            // feature of vm-memory is not supported).
            let base = slice.ptr_guard_mut().as_ptr();
            let full = iov.len() >= max_iov;
            match iov.last_mut() {
                // Both ranges are validated and mapped, so one iovec over
                // the two covers exactly the same bytes.
                Some(last)
                    if (last.iov_base as usize).checked_add(last.iov_len)
                        == Some(base as usize) =>
                {
                    last.iov_len += n
                }
                _ if full => break,
                _ => iov.push(libc::iovec {
                    iov_base: base.cast(),
                    iov_len: n,
                }),
            }
            bytes += n;
        }
        Ok(bytes)
    }

    /// Marks `n` bytes from the cursor dirty (after the kernel wrote them).
    fn mark_dirty(&self, n: usize) {
        for (addr, len) in self.ranges(n) {
            if let Ok(slice) = translate(self.mem.deref(), addr, len) {
                slice.bitmap().mark_dirty(0, len);
            }
        }
    }

    /// Vectored file I/O at the cursor, at most `IOV_MAX` iovecs and
    /// `MAX_RW_COUNT` bytes per call. Segments that are adjacent in host
    /// memory (a guest buffer spread over consecutive pages) share one
    /// iovec. Stops at the first short transfer; an error after some
    /// progress ends the loop with the progress made (the next call sees the
    /// error again).
    fn file_io(
        &mut self,
        fd: RawFd,
        count: usize,
        offset: Option<u64>,
        dir: Dir,
    ) -> io::Result<usize> {
        let want = count.min(self.remaining);
        let mut total = 0usize;
        IOV_SCRATCH.with(|cell| {
            let mut iov = cell.borrow_mut();
            while total < want {
                let bytes =
                    self.fill_iovecs((want - total).min(MAX_RW_COUNT), IOV_MAX, &mut iov)?;
                let pos = match offset {
                    Some(base) => Some(
                        base.checked_add(total as u64)
                            .and_then(|p| libc::off_t::try_from(p).ok())
                            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?,
                    ),
                    None => None,
                };
                let res = loop {
                    // SAFETY: every iovec points into a guest memory region
                    // that `self.mem` keeps mapped for the duration of the
                    // call, and covers `n` bytes that the walk validated to
                    // lie inside that region. The kernel only reads (ToFile)
                    // or writes (FromFile) those bytes; no Rust reference to
                    // guest memory exists, it is only accessed volatilely.
                    let r = unsafe {
                        let (ptr, cnt) = (iov.as_ptr(), iov.len() as libc::c_int);
                        match (dir, pos) {
                            (Dir::FromFile, Some(p)) => libc::preadv(fd, ptr, cnt, p),
                            (Dir::FromFile, None) => libc::readv(fd, ptr, cnt),
                            (Dir::ToFile, Some(p)) => libc::pwritev(fd, ptr, cnt, p),
                            (Dir::ToFile, None) => libc::writev(fd, ptr, cnt),
                        }
                    };
                    if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    break r;
                };
                if res < 0 {
                    let err = io::Error::last_os_error();
                    trace(iov.len(), bytes, 0);
                    if total == 0 {
                        return Err(err);
                    }
                    break;
                }
                let n = res as usize;
                trace(iov.len(), bytes, n);
                if dir == Dir::FromFile {
                    self.mark_dirty(n);
                }
                self.advance(n);
                total += n;
                if n < bytes {
                    break;
                }
            }
            Ok(total)
        })
    }
}

/// The remaining guest buffers of a [`Reader`] or [`Writer`] as host
/// iovecs, for a backend that does the I/O itself (io_uring, Linux AIO,
/// `process_vm_readv`, a virtio-blk style block layer).
///
/// # Lifetime
///
/// The view borrows its Reader or Writer mutably. While it lives:
///
/// - the cursor cannot move, so the iovecs stay exactly the bytes the next
///   transfer will cover;
/// - the Reader/Writer, and the memory handle `M` it owns (a
///   `&GuestMemoryMmap`, or a `GuestMemoryAtomic` snapshot that keeps a
///   replaced memory map alive), cannot be dropped, so every iovec points
///   into a mapping that stays mapped.
///
/// The iovecs are raw pointers: making them is safe, handing them to the
/// kernel is the caller's `unsafe`, and it is sound only while the view is
/// alive. An asynchronous submission must therefore keep the view (and so
/// the Reader/Writer and the chain's memory handle) until its completion
/// has been reaped, or until it is cancelled *and* reaped. Advancing is
/// explicit: [`advance`](Self::advance) with the completion's byte count
/// moves the cursor (and, for a Writer, marks those bytes dirty in the
/// guest memory bitmap); dropping the view without it leaves the cursor
/// where it was, as after a failed transfer. Device-readable buffers are
/// only to be read by the kernel, device-writable ones only written.
#[derive(Debug)]
pub struct IoVecs<'a, M> {
    cur: &'a mut Cursor<M>,
    iov: Vec<libc::iovec>,
    bytes: usize,
    writer: bool,
}

impl<M> IoVecs<'_, M>
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    fn new<'a>(
        cur: &'a mut Cursor<M>,
        max_bytes: usize,
        max_iovecs: usize,
        writer: bool,
    ) -> io::Result<IoVecs<'a, M>> {
        let mut iov = Vec::new();
        let bytes = cur.fill_iovecs(max_bytes, max_iovecs, &mut iov)?;
        Ok(IoVecs {
            cur,
            iov,
            bytes,
            writer,
        })
    }

    /// The iovecs, adjacent guest buffers merged.
    pub fn as_slice(&self) -> &[libc::iovec] {
        &self.iov
    }

    /// Bytes the iovecs cover.
    pub fn byte_len(&self) -> usize {
        self.bytes
    }

    /// Whether the view covers nothing (the Reader or Writer is exhausted).
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Moves the cursor past the first `n` bytes, which the I/O transferred
    /// (for a Writer, they are marked dirty). More than
    /// [`byte_len`](Self::byte_len) is refused and moves nothing.
    pub fn advance(self, n: usize) -> Result<()> {
        if n > self.bytes {
            return Err(Error::SplitOutOfBounds {
                offset: n,
                available: self.bytes,
            });
        }
        if self.writer {
            self.cur.mark_dirty(n);
        }
        self.cur.advance(n);
        Ok(())
    }
}

/// Reads the device-readable part of a chain, without copying when the data
/// goes to a file.
///
/// Owns its memory handle, so it can be moved to the coroutine or thread
/// that serves the request. Implements [`std::io::Read`].
#[derive(Debug, Clone)]
pub struct Reader<M> {
    cur: Cursor<M>,
}

impl<M> Reader<M>
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    pub(crate) fn new(mem: M, segs: Shared, idx: usize, len: usize) -> Self {
        Reader {
            cur: Cursor::new(mem, segs, idx, len),
        }
    }

    /// Bytes left to read.
    pub fn available_bytes(&self) -> usize {
        self.cur.remaining
    }

    /// Bytes read so far.
    pub fn bytes_read(&self) -> usize {
        self.cur.done
    }

    /// Reads one plain-data object (little-endian wire types are the caller's
    /// business).
    pub fn read_obj<T: ByteValued>(&mut self) -> io::Result<T> {
        // SAFETY: `ByteValued` types are plain data for which every bit
        // pattern, all zeroes included, is a valid value.
        let mut obj: T = unsafe { std::mem::zeroed() };
        io::Read::read_exact(self, obj.as_mut_slice())?;
        Ok(obj)
    }

    /// Splits at `offset`: `self` keeps the first `offset` bytes, the
    /// returned reader gets the rest.
    pub fn split_at(&mut self, offset: usize) -> Result<Reader<M>> {
        Ok(Reader {
            cur: self.cur.split_at(offset)?,
        })
    }

    /// Writes up to `count` bytes from the chain to `file` at `offset` with
    /// `pwritev`, straight from guest memory, at most [`IOV_MAX`] iovecs
    /// (buffers adjacent in host memory share one) and [`MAX_RW_COUNT`]
    /// bytes per call. Returns the bytes written; it stops early at the first short
    /// write (the cursor then sits exactly after the bytes written).
    pub fn write_to_file_at<F: AsFd>(
        &mut self,
        file: &F,
        count: usize,
        offset: u64,
    ) -> io::Result<usize> {
        self.cur
            .file_io(file.as_fd().as_raw_fd(), count, Some(offset), Dir::ToFile)
    }

    /// Like [`write_to_file_at`](Self::write_to_file_at) at the file's
    /// current position (`writev`), for pipes and sockets.
    pub fn write_to<F: AsFd>(&mut self, file: &F, count: usize) -> io::Result<usize> {
        self.cur
            .file_io(file.as_fd().as_raw_fd(), count, None, Dir::ToFile)
    }

    /// The next `max_bytes` (at most `max_iovecs` entries) of the readable
    /// buffers as iovecs for an asynchronous backend; see [`IoVecs`] for
    /// the lifetime rules. Advance with [`IoVecs::advance`].
    pub fn iovecs(&mut self, max_bytes: usize, max_iovecs: usize) -> io::Result<IoVecs<'_, M>> {
        IoVecs::new(&mut self.cur, max_bytes, max_iovecs, false)
    }
}

impl<M> io::Read for Reader<M>
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.cur.read_into(buf)
    }
}

/// Writes the device-writable part of a chain, without copying when the
/// data comes from a file.
///
/// Owns its memory handle, so it can be moved to the coroutine or thread
/// that serves the request. Implements [`std::io::Write`]; writes mark the
/// guest memory dirty bitmap.
#[derive(Debug, Clone)]
pub struct Writer<M> {
    cur: Cursor<M>,
}

impl<M> Writer<M>
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    pub(crate) fn new(mem: M, segs: Shared, idx: usize, len: usize) -> Self {
        Writer {
            cur: Cursor::new(mem, segs, idx, len),
        }
    }

    /// Bytes of room left.
    pub fn available_bytes(&self) -> usize {
        self.cur.remaining
    }

    /// Bytes written so far (by this writer, not by parts split off it).
    pub fn bytes_written(&self) -> usize {
        self.cur.done
    }

    /// Writes one plain-data object.
    pub fn write_obj<T: ByteValued>(&mut self, val: T) -> io::Result<()> {
        io::Write::write_all(self, val.as_slice())
    }

    /// Splits at `offset`: `self` keeps the first `offset` bytes, the
    /// returned writer gets the rest. A 9P server splits off the payload,
    /// fills it, then writes the header that carries its size into `self`.
    pub fn split_at(&mut self, offset: usize) -> Result<Writer<M>> {
        Ok(Writer {
            cur: self.cur.split_at(offset)?,
        })
    }

    /// Reads up to `count` bytes from `file` at `offset` into the chain with
    /// `preadv`, straight into guest memory, at most [`IOV_MAX`] iovecs
    /// (buffers adjacent in host memory share one) and [`MAX_RW_COUNT`]
    /// bytes per call. Returns the bytes read; 0 means end of file. It stops early at
    /// the first short read (end of file, or a pipe with less data), and the
    /// cursor then sits exactly after the bytes read.
    pub fn read_from_file_at<F: AsFd>(
        &mut self,
        file: &F,
        count: usize,
        offset: u64,
    ) -> io::Result<usize> {
        self.cur
            .file_io(file.as_fd().as_raw_fd(), count, Some(offset), Dir::FromFile)
    }

    /// Like [`read_from_file_at`](Self::read_from_file_at) at the file's
    /// current position (`readv`), for pipes and sockets.
    pub fn read_from<F: AsFd>(&mut self, file: &F, count: usize) -> io::Result<usize> {
        self.cur
            .file_io(file.as_fd().as_raw_fd(), count, None, Dir::FromFile)
    }

    /// The next `max_bytes` (at most `max_iovecs` entries) of the writable
    /// buffers as iovecs for an asynchronous backend; see [`IoVecs`] for
    /// the lifetime rules. Advance with [`IoVecs::advance`], which also
    /// marks the bytes dirty.
    pub fn iovecs(&mut self, max_bytes: usize, max_iovecs: usize) -> io::Result<IoVecs<'_, M>> {
        IoVecs::new(&mut self.cur, max_bytes, max_iovecs, true)
    }
}

impl<M> io::Write for Writer<M>
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.cur.write_from(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
