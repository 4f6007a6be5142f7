// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The fd syscalls the transports and the server share, in one place (as
//! virtiofsd's `oslib`): positional reads and writes retried on `EINTR`,
//! the page-cache check, nonblocking socket reads and sends, the one
//! `poll(2)` wait, and the soft `RLIMIT_NOFILE` that the fid and path-fd
//! budgets start from. The passthrough's own path calls are in
//! `fs/passthrough/sys.rs`; the pipe calls of the zero-copy Rread stay in
//! `transport/socket/splice.rs`.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

/// `pread` retrying on EINTR.
pub(crate) fn pread(file: BorrowedFd<'_>, buf: &mut [u8], off: u64) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is a valid writable buffer of `buf.len()` bytes and
        // the fd is borrowed for the duration of the call.
        let n = unsafe {
            libc::pread64(
                file.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                off as libc::off64_t,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// `preadv2(RWF_NOWAIT)`: reads what is in the page cache without
/// blocking; `EAGAIN` (or any error) when nothing is.
pub(crate) fn pread_nowait(file: BorrowedFd<'_>, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    loop {
        // SAFETY: one iovec over `buf`, valid and writable for the call;
        // the fd is borrowed.
        let n = unsafe {
            libc::preadv2(
                file.as_raw_fd(),
                &iov,
                1,
                off as libc::off64_t,
                libc::RWF_NOWAIT,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Repeats `op(done)` (a syscall moving at most `len - done` bytes, its
/// raw return value) until `len` bytes moved, it returns 0, or it fails:
/// `EINTR` is retried, and an error after some progress returns the
/// progress.
pub(crate) fn repeat_io(len: usize, mut op: impl FnMut(usize) -> isize) -> io::Result<usize> {
    let mut done = 0usize;
    while done < len {
        let n = op(done);
        if n > 0 {
            done += n as usize;
            continue;
        }
        if n == 0 {
            break;
        }
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if done > 0 {
            break;
        }
        return Err(err);
    }
    Ok(done)
}

/// `pwrite` until everything is written, a zero-length write, or an error
/// after some progress (then the progress is returned).
pub(crate) fn pwrite_all(file: BorrowedFd<'_>, buf: &[u8], off: u64) -> io::Result<usize> {
    repeat_io(buf.len(), |done| {
        let rest = &buf[done..];
        // SAFETY: `rest` is a valid readable buffer and the fd is borrowed.
        unsafe {
            libc::pwrite64(
                file.as_raw_fd(),
                rest.as_ptr().cast(),
                rest.len(),
                (off + done as u64) as libc::off64_t,
            )
        }
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

/// Waits up to `timeout` (at least 1 ms) for any of `fds` to become
/// readable, and returns each fd's `revents` (all 0 on a timeout or an
/// interrupted wait). The one `poll(2)` of the crate.
pub(crate) fn poll_in<const N: usize>(fds: [RawFd; N], timeout: Duration) -> io::Result<[i16; N]> {
    let mut pfds = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: poll reads and writes the `N` pollfds we pass, valid for the
    // call.
    let r = unsafe { libc::poll(pfds.as_mut_ptr(), N as libc::nfds_t, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
        return Ok([0; N]);
    }
    Ok(pfds.map(|p| p.revents))
}

/// Waits up to `timeout` for `fd` to become readable.
pub(crate) fn wait_readable(fd: RawFd, timeout: Duration) {
    let _ = poll_in([fd], timeout);
}

/// Sets `O_NONBLOCK` on `fd`.
pub(crate) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on an fd we own; no memory is involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `read(2)` on a nonblocking socket: `Ok(None)` for `EAGAIN`.
pub(crate) fn read_some(sock: &File, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        match (&*sock).read(buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// `send(2)` without SIGPIPE: `Ok(None)` for `EAGAIN`; with `more`, the
/// rest of the message follows (`MSG_MORE`).
pub(crate) fn send_fd(sock: BorrowedFd<'_>, buf: &[u8], more: bool) -> io::Result<Option<usize>> {
    let more = if more { libc::MSG_MORE } else { 0 };
    loop {
        // SAFETY: `buf` is valid for reads of its length for the call; the
        // fd is borrowed.
        let n = unsafe {
            libc::send(
                sock.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT | more,
            )
        };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(None),
            io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
}

/// The soft `RLIMIT_NOFILE` (1024 if it cannot be read).
pub(crate) fn soft_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out pointer for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        1024
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
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

    #[test]
    fn test_poll_in_reports_the_readable_fd() {
        let quiet = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        let ready = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
        let none = poll_in([quiet.as_raw_fd()], Duration::from_millis(1)).unwrap();
        assert_eq!(none, [0]);
        ready.write(1).unwrap();
        let got = poll_in(
            [quiet.as_raw_fd(), ready.as_raw_fd()],
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(got[0], 0);
        assert_ne!(got[1] & libc::POLLIN, 0);
    }
}
