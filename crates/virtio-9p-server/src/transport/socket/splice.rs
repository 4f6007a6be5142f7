// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Zero-copy Rread for the socket transport: file pages go through a pipe
//! into the socket (`splice(2)` twice) instead of being copied into a
//! reply buffer and out of it.
//!
//! The split, request by request:
//!
//! 1. **Fill, on the request's coroutine.** The reply writer of a socket
//!    request (`SockWriter`, writer.rs) carries a [`Splicer`] as its
//!    strategy for file ranges. When the filesystem asks it for a file
//!    range ([`ReplyWriter::write_from_file_at`](crate::io::ReplyWriter::write_from_file_at)) and that range is the
//!    whole data of the reply, [`Splicer::splice_range`] takes a pipe from
//!    its socket thread's [`PipePool`](super::pipes::PipePool) and splices the range into it
//!    (file -> pipe: page references, no copy). Where that runs is the executor's decision,
//!    as for every Tread read ([`Blocking::read_at`]): inline when the range is
//!    in the page cache (`cachestat(2)`) and the file's filesystem
//!    promises non-blocking reads (a 1-byte `preadv2(RWF_NOWAIT)`
//!    probe), else on a worker, where a read of the disk or of a hung
//!    export may block. The count the writer returns is the number of
//!    bytes now in the pipe, so the Rread header the server encodes
//!    afterwards is exact: a file that shrinks before or during the fill
//!    only shortens the count.
//! 2. **Send, on the socket thread.** The reply goes out as its 11-byte
//!    header from the reply buffer, then the pipe's contents
//!    ([`splice_out`], pipe -> socket with `SPLICE_F_NONBLOCK`; unix and
//!    TCP sockets take the pages with `MSG_SPLICE_PAGES`, no copy). A full
//!    socket answers `EAGAIN`: the transport waits for `EPOLLOUT` with
//!    the rest still in the pipe. No file is touched here, so the send
//!    never waits on a disk or an export.
//!
//! The server and the filesystem see a plain
//! [`ReplyWriter`](crate::io::ReplyWriter); only the
//! transport knows about pipes. The file need not stay open after the
//! fill: the pipe holds the pages.
//!
//! Everything else takes the copy path of
//! [`SliceWriter`](crate::io::SliceWriter): a filesystem that is not
//! fd-backed (it never calls `write_from_file_at`), Treaddir, xattr
//! reads, ranges below [`SPLICE_MIN`] or above [`MAX_PIPE`], files that
//! are not regular, a writer that has other bytes before or after the
//! range (a spliced range is then read back into the buffer,
//! [`Splicer::read_back`]), and a pool without a pipe to give (at
//! [`MAX_PIPES`](super::pipes::MAX_PIPES), or `pipe2`/`F_SETPIPE_SZ` failing, e.g. `EMFILE`).
//!
//! No invented bytes. A file can shrink between the fill and the send.
//! The reply keeps a duplicate of the file's fd, and just before its
//! header goes out the file's size is checked again ([`Tail::recount`]):
//! a reply whose range now runs past the end is cut to the bytes still
//! there, header count included (a short read, as a read at that moment
//! would give). A truncation after the header went out can still take
//! pages out of the pipe (the kernel refuses to splice a truncated page
//! that is not up to date), and the socket splice then comes up short:
//! the rest is sent from the file itself ([`splice_out`], a
//! non-blocking `pread`, as the file is now), and when the file no longer
//! has those bytes the connection is closed, since a promised count can
//! neither be taken back nor honestly filled. Never zeros.

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};

use log::{debug, error};

use super::pipes::{lock, Pipe, SharedPipes, MAX_PIPE};
use crate::exec::Blocking;
use crate::protocol::{MsgType, Rmessage, HEADER_SIZE};
use crate::sys::{pread_nowait, range_cached};

/// Smallest range spliced. A spliced Rread makes four more syscalls than
/// a copied one (`fstat`, `cachestat`, the `RWF_NOWAIT` probe, a second
/// splice); below 16 KiB (four pages) they are taken to cost more than
/// the copy they save. Chosen, not measured: the suite measures 64 KiB.
pub(crate) const SPLICE_MIN: usize = 16 << 10;

/// A range spliced into a pipe: the reply's data, and where it came
/// from (a duplicate of the file's fd, which outlives the fid).
#[derive(Debug)]
pub(crate) struct Filled {
    pub(crate) pipe: Pipe,
    pub(crate) len: usize,
    pub(crate) file: OwnedFd,
    pub(crate) off: u64,
}

/// What the writers of one request share: the thread's pipes and the
/// spliced range, if any (taken by the transport when the request ends).
#[derive(Debug)]
pub(crate) struct Splicer {
    pipes: SharedPipes,
    filled: Mutex<Option<Filled>>,
}

impl Splicer {
    /// A splicer taking pipes from `pipes`.
    pub(crate) fn new(pipes: SharedPipes) -> Self {
        Splicer {
            pipes,
            filled: Mutex::new(None),
        }
    }

    fn slot(&self) -> MutexGuard<'_, Option<Filled>> {
        self.filled.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The spliced range of the finished request.
    pub(crate) fn take(&self) -> Option<Filled> {
        self.slot().take()
    }

    /// Splices `[off, off + count)` of `file` into a pipe, the fill run
    /// where `exec` places file reads; returns the bytes now in the pipe,
    /// or `None` when the range is not for splicing (the caller copies).
    pub(crate) fn splice_range<B: Blocking>(
        &self,
        exec: &B,
        file: BorrowedFd<'_>,
        count: usize,
        off: u64,
    ) -> Option<io::Result<usize>> {
        if count < SPLICE_MIN {
            return None;
        }
        let size = regular_size(file)?;
        let len = (count as u64).min(size.checked_sub(off)?) as usize;
        if !(SPLICE_MIN..=MAX_PIPE).contains(&len) {
            return None;
        }
        if self.slot().is_some() {
            return None;
        }
        // The reply keeps the file for the check before it is sent (the
        // fid may be clunked meanwhile); no fd to spare means a copy.
        let dup = dup_fd(file)?;
        let pipe = lock(&self.pipes).take(len)?;
        let r = exec.read_at(
            || range_cached(file, len, off) && nowait_reads(file, off),
            || fill(&pipe, file, off, len),
        );
        match r {
            Ok(n) if n > 0 => {
                *self.slot() = Some(Filled {
                    pipe,
                    len: n,
                    file: dup,
                    off,
                });
                Some(Ok(n))
            }
            Ok(_) => {
                lock(&self.pipes).put(pipe, true);
                Some(Ok(0))
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                lock(&self.pipes).put(pipe, true);
                Some(Err(e))
            }
            Err(e) => {
                // A filesystem without splice support, for one: copy.
                debug!("9p: splice of a file failed: {e}; copying instead");
                lock(&self.pipes).put(pipe, true);
                None
            }
        }
    }

    /// Reads the range `filled` (taken from this splicer) out of its pipe
    /// into `out`, so that a write after it keeps the bytes in order.
    pub(crate) fn read_back(&self, filled: Filled, out: &mut impl Write) -> io::Result<()> {
        let mut chunk = vec![0u8; filled.len.min(64 << 10)];
        let mut left = filled.len;
        while left > 0 {
            let want = left.min(chunk.len());
            // SAFETY: `chunk` is valid for writes of `want` bytes; the pipe
            // is ours.
            let n =
                unsafe { libc::read(filled.pipe.r.as_raw_fd(), chunk.as_mut_ptr().cast(), want) };
            let got = match n {
                n if n > 0 => n as usize,
                n if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {
                    continue
                }
                _ => {
                    // Pages gone from the pipe (truncated): the count the
                    // caller was given cannot be kept with real bytes.
                    error!("9p: a spliced range lost {left} bytes; failing the read");
                    return Err(io::Error::from_raw_os_error(libc::EIO));
                }
            };
            out.write_all(&chunk[..got])?;
            left -= got;
        }
        lock(&self.pipes).put(filled.pipe, true);
        Ok(())
    }
}

/// A close-on-exec duplicate of `fd`, or `None` (`EMFILE`, say).
fn dup_fd(fd: BorrowedFd<'_>) -> Option<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC touches no memory; the fd is borrowed.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if r < 0 {
        debug!(
            "9p: cannot duplicate a file fd: {}; copying instead",
            io::Error::last_os_error()
        );
        return None;
    }
    // SAFETY: fcntl returned a new fd that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(r) })
}

/// The size of `file` as the kernel has it cached (`statx` with
/// `AT_STATX_DONT_SYNC`): no round trip to a network filesystem's server,
/// so the socket thread never waits on one.
fn cached_size(file: BorrowedFd<'_>) -> Option<u64> {
    // SAFETY: a zeroed statx is a valid value for statx to fill.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: an empty C string with AT_EMPTY_PATH names the fd itself;
    // statx writes into `st`, valid for the call.
    let r = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_SIZE,
            &mut st,
        )
    };
    (r == 0 && st.stx_mask & libc::STATX_SIZE != 0).then_some(st.stx_size)
}

/// The size of `file` if it is a regular file.
fn regular_size(file: BorrowedFd<'_>) -> Option<u64> {
    // SAFETY: fstat writes into `st`, valid for the call; the fd is
    // borrowed.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat64(file.as_raw_fd(), &mut st) } != 0 {
        return None;
    }
    (st.st_mode & libc::S_IFMT == libc::S_IFREG).then_some(st.st_size.max(0) as u64)
}

/// Whether the file's filesystem answers `RWF_NOWAIT` reads at `off`
/// (NFS and FUSE, for example, do not: their cached pages may still need
/// a round trip, so their reads go to a worker).
fn nowait_reads(file: BorrowedFd<'_>, off: u64) -> bool {
    crate::sys::pread_nowait(file, &mut [0u8; 1], off).is_ok()
}

/// Splices up to `len` bytes of `file` at `off` into the empty `pipe`.
/// Returns the bytes now in the pipe (fewer at end of file); an error
/// only when nothing was spliced.
fn fill(pipe: &Pipe, file: BorrowedFd<'_>, off: u64, len: usize) -> io::Result<usize> {
    // A full pipe (EAGAIN; it was sized for `len`) ends it like an error.
    crate::sys::repeat_io(len, |done| {
        let mut o = (off + done as u64) as libc::loff_t;
        // SAFETY: splice between two fds we hold; `o` is valid for the call.
        unsafe {
            libc::splice(
                file.as_raw_fd(),
                &mut o,
                pipe.w.as_raw_fd(),
                std::ptr::null_mut(),
                len - done,
                libc::SPLICE_F_NONBLOCK,
            )
        }
    })
}

/// Blocks `SIGPIPE` on the calling thread while it lives (the mask it
/// found is restored on drop). A splice into a socket whose peer is gone
/// raises `SIGPIPE` (there is no `MSG_NOSIGNAL` for splice); blocked, it
/// stays pending on this thread and [`clear_sigpipe`] takes it, so an
/// embedder that did not ignore `SIGPIPE` is not killed.
pub(crate) struct SigpipeBlocked {
    old: libc::sigset_t,
}

impl SigpipeBlocked {
    pub(crate) fn new() -> Self {
        // SAFETY: the sigsets are plain values initialised by
        // sigemptyset/pthread_sigmask before use.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            if libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) != 0 {
                error!("9p: cannot block SIGPIPE on a socket thread");
            }
            SigpipeBlocked { old }
        }
    }
}

impl Drop for SigpipeBlocked {
    fn drop(&mut self) {
        clear_sigpipe();
        // SAFETY: restores the mask saved by `new`.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut());
        }
    }
}

/// Takes a pending `SIGPIPE` of this thread, if any (after an `EPIPE`).
pub(crate) fn clear_sigpipe() {
    // SAFETY: plain sigset values; a zero timeout never blocks.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        while libc::sigtimedwait(&set, std::ptr::null_mut(), &zero) == libc::SIGPIPE {}
    }
}

/// The spliced part of a reply waiting to be sent.
#[derive(Debug)]
pub(crate) struct Tail {
    /// `None` once the pipe came up short: the rest comes from `file`.
    pub(crate) pipe: Option<Pipe>,
    /// Bytes still to send.
    pub(crate) left: usize,
    /// Bytes of data in all.
    pub(crate) len: usize,
    /// The file the data came from, and the offset of its first byte.
    file: OwnedFd,
    off: u64,
    /// The pipe holds bytes that will not be sent ([`Tail::recount`] cut
    /// the reply): close it rather than reuse it.
    extra: bool,
    /// Bytes read from `file` after the pipe came up short, and how many
    /// of them are sent.
    bounce: Vec<u8>,
    sent: usize,
}

impl Tail {
    /// The data of `f`, to be sent whole.
    pub(crate) fn new(f: Filled) -> Tail {
        Tail {
            pipe: Some(f.pipe),
            left: f.len,
            len: f.len,
            file: f.file,
            off: f.off,
            extra: false,
            bounce: Vec::new(),
            sent: 0,
        }
    }

    /// Checks the file's size just before the reply's header is sent:
    /// when the file now ends inside the range, the reply is cut to the
    /// bytes still there. Returns the new length if it changed.
    pub(crate) fn recount(&mut self) -> Option<usize> {
        let size = cached_size(self.file.as_fd())?;
        let end = self.off.checked_add(self.len as u64)?;
        if size >= end {
            return None;
        }
        let len = size.saturating_sub(self.off) as usize;
        self.len = len;
        self.left = len;
        self.extra = true;
        Some(len)
    }

    /// The pipe, once the reply was sent in full, and whether it is empty
    /// (and may be reused).
    pub(crate) fn into_pipe(self) -> Option<(Pipe, bool)> {
        let extra = self.extra;
        self.pipe.map(|p| (p, !extra))
    }

    /// The next bytes of the rest from the file, as it is now (without
    /// blocking); an error when it no longer has them.
    fn refill_from_file(&mut self) -> io::Result<()> {
        let want = self.left.min(FILE_CHUNK);
        self.bounce.resize(want, 0);
        self.sent = 0;
        let at = self.off + (self.len - self.left) as u64;
        let mut got = 0;
        while got < want {
            match pread_nowait(self.file.as_fd(), &mut self.bounce[got..], at + got as u64) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        if got < want {
            self.bounce.clear();
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "a spliced Rread lost bytes that its file no longer has (truncated under it)",
            ));
        }
        Ok(())
    }
}

/// Bytes of bytes in a pipe (`FIONREAD`).
fn pipe_bytes_queued(pipe: &Pipe) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int into `n`.
    if unsafe { libc::ioctl(pipe.r.as_raw_fd(), libc::FIONREAD, &mut n) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as usize)
}

/// How much of a short pipe's rest is read from the file at a time.
const FILE_CHUNK: usize = 64 << 10;

/// Sends the rest of `tail` from its file (the pipe came up short).
fn send_from_file(tail: &mut Tail, sock: BorrowedFd<'_>) -> io::Result<Option<usize>> {
    if tail.sent == tail.bounce.len() {
        tail.refill_from_file()?;
    }
    let r = crate::sys::send_fd(sock, &tail.bounce[tail.sent..], false)?;
    if let Some(n) = r {
        tail.sent += n;
    }
    Ok(r)
}

/// Sends some of `tail` into `sock`: `Ok(None)` when the socket is full
/// (wait for `EPOLLOUT`), `Ok(Some(n))` for `n` bytes sent. A pipe that
/// holds fewer bytes than are left (its pages were truncated away) is
/// closed and the rest is read from the file; an error (the connection
/// ends) when the file no longer has them. `log` says whether to log it.
pub(crate) fn splice_out(
    tail: &mut Tail,
    sock: BorrowedFd<'_>,
    log: impl FnOnce() -> bool,
) -> io::Result<Option<usize>> {
    let Some(pipe) = &tail.pipe else {
        return send_from_file(tail, sock);
    };
    loop {
        // SAFETY: splice between two fds we hold, no offsets.
        let n = unsafe {
            libc::splice(
                pipe.r.as_raw_fd(),
                std::ptr::null_mut(),
                sock.as_raw_fd(),
                std::ptr::null_mut(),
                tail.left,
                libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE,
            )
        };
        if n > 0 {
            return Ok(Some(n as usize));
        }
        let short = if n == 0 {
            true
        } else {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                // A full socket, or (never expected) an empty pipe.
                io::ErrorKind::WouldBlock => {
                    if pipe_bytes_queued(pipe)? > 0 {
                        return Ok(None);
                    }
                    true
                }
                _ => {
                    if e.raw_os_error() == Some(libc::EPIPE) {
                        clear_sigpipe();
                    }
                    return Err(e);
                }
            }
        };
        if short {
            if log() {
                error!(
                    "9p: a spliced Rread lost {} of its {} bytes (file truncated?); sending them from the file",
                    tail.left, tail.len
                );
            }
            tail.pipe = None;
            return send_from_file(tail, sock);
        }
    }
}

/// An Rread whose data was spliced into a pipe: the bytes of `buf` to
/// send (its header) and the pipe to send after them. A reply that is not
/// that Rread (the filesystem failed after the splice, or reported
/// another count) drops the pipe; a mismatched Rread becomes an `EIO`
/// Rlerror, since its data is not in the buffer.
pub(super) fn rread_tail(buf: &mut [u8], len: usize, f: Filled) -> (usize, Option<Tail>) {
    const RHDR: usize = HEADER_SIZE + 4;
    let is_rread = buf.get(4) == Some(&u8::from(MsgType::Rread));
    let count = buf
        .get(HEADER_SIZE..RHDR)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize);
    if is_rread && len == RHDR + f.len && count == Some(f.len) {
        return (RHDR, Some(Tail::new(f)));
    }
    if !is_rread {
        return (len, None);
    }
    error!("9p: an Rread's count does not match its spliced data; answering EIO");
    let tag = u16::from_le_bytes([buf[5], buf[6]]);
    let frame = Rmessage::Lerror(libc::EIO as u32).encode_frame(tag);
    buf[..frame.len()].copy_from_slice(&frame);
    (frame.len(), None)
}

/// Rewrites the size and count of the Rread header in `buf` for `len`
/// bytes of data.
pub(super) fn set_rread_count(buf: &mut [u8], len: usize) {
    const RHDR: usize = HEADER_SIZE + 4;
    buf[..4].copy_from_slice(&((RHDR + len) as u32).to_le_bytes());
    buf[HEADER_SIZE..RHDR].copy_from_slice(&(len as u32).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::transport::socket::pipes::PipePool;

    /// A tail whose pipe holds only the first 10 of its bytes, for a
    /// file of `file_len` bytes.
    fn short_tail(file_len: usize) -> (Tail, Vec<u8>) {
        let data: Vec<u8> = (0..100u8).map(|i| i + 1).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data[..file_len]).unwrap();
        let mut pool = PipePool::new(1);
        let pipe = pool.take(SPLICE_MIN).unwrap();
        let mut w = std::fs::File::from(pipe.w.try_clone().unwrap());
        w.write_all(&data[..10]).unwrap();
        let tail = Tail::new(Filled {
            pipe,
            len: 100,
            file: OwnedFd::from(f),
            off: 0,
        });
        (tail, data)
    }

    #[test]
    fn test_short_pipe_is_completed_from_the_file() {
        // The pipe lost its last 90 bytes: they come from the file, as it
        // is now, never as zeros.
        let (mut tail, data) = short_tail(100);
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut logged = 0;
        while tail.left > 0 {
            let n = splice_out(&mut tail, a.as_fd(), || {
                logged += 1;
                true
            })
            .unwrap()
            .expect("the socket has room");
            tail.left -= n;
        }
        assert!(tail.pipe.is_none(), "the short pipe is dropped");
        assert_eq!(logged, 1);
        let mut got = [0u8; 100];
        b.read_exact(&mut got).unwrap();
        assert_eq!(got[..], data[..]);
    }

    #[test]
    fn test_short_pipe_of_a_shrunk_file_fails_instead_of_padding() {
        let (mut tail, _) = short_tail(50);
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let n = splice_out(&mut tail, a.as_fd(), || true).unwrap().unwrap();
        assert_eq!(n, 10);
        tail.left -= n;
        let e = splice_out(&mut tail, a.as_fd(), || true).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }

    #[test]
    fn test_recount_cuts_a_reply_to_the_file() {
        let (mut tail, _) = short_tail(40);
        assert_eq!(tail.recount(), Some(40));
        assert_eq!((tail.len, tail.left), (40, 40));
        assert!(!tail.into_pipe().unwrap().1, "a cut pipe is not reused");
        let (mut tail, _) = short_tail(100);
        assert_eq!(tail.recount(), None);
        assert!(tail.into_pipe().unwrap().1);
    }
}
