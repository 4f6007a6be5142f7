// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The pipes of one socket thread for spliced Rreads ("Zero-copy Rread",
//! "Pipes" in the module docs): at most [`MAX_PIPES`], each sized to its
//! reply, kept free for [`PIPE_IDLE_RELEASE`] and then closed.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use log::debug;

use super::buffers::IDLE_RELEASE;

/// Largest range spliced (and largest pipe, the default
/// `/proc/sys/fs/pipe-max-size`); larger Rreads are copied. The Linux
/// client's msize is at most 512000.
pub(crate) const MAX_PIPE: usize = 1 << 20;

/// Most pipes one socket thread holds, in use or free (two fds each):
/// further spliceable Rreads take the copy path until one is returned.
pub(crate) const MAX_PIPES: usize = 16;

/// How long a free pipe stays in the pool before it is closed.
pub(crate) const PIPE_IDLE_RELEASE: Duration = IDLE_RELEASE;

const PAGE: usize = 4096;

/// Bytes a pipe needs for a range of `len` bytes: one slot per page the
/// range touches (a range that does not start on a page boundary touches
/// one more), rounded by the kernel to a power of two of pages.
fn pipe_bytes(len: usize) -> usize {
    (len.div_ceil(PAGE) + 1) * PAGE
}

/// One pipe: its two ends, its capacity in bytes, and the count of pipes
/// open in its pool (decremented when it is closed, wherever that is).
pub(crate) struct Pipe {
    pub(super) r: OwnedFd,
    pub(super) w: OwnedFd,
    cap: usize,
    open: Arc<AtomicUsize>,
}

impl Drop for Pipe {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Pipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipe")
            .field("r", &self.r.as_raw_fd())
            .field("w", &self.w.as_raw_fd())
            .field("cap", &self.cap)
            .finish()
    }
}

fn set_pipe_size(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<usize> {
    let want =
        libc::c_int::try_from(bytes).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: F_SETPIPE_SZ takes an int and touches no memory of ours.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, want) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// The pipes of one socket thread.
#[derive(Debug)]
pub(crate) struct PipePool {
    /// Free (empty) pipes and when each was put back.
    free: Vec<(Pipe, Instant)>,
    /// Pipes open, free or in use.
    open: Arc<AtomicUsize>,
    max: usize,
}

impl PipePool {
    /// A pool of at most `max` pipes.
    pub(crate) fn new(max: usize) -> Self {
        PipePool {
            free: Vec::new(),
            open: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// Pipes open now (each is two fds).
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// An empty pipe that holds `len` bytes of file pages, or `None`
    /// (the caller copies instead).
    pub(crate) fn take(&mut self, len: usize) -> Option<Pipe> {
        let need = pipe_bytes(len);
        if need > MAX_PIPE + PAGE {
            return None;
        }
        let fit = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, (p, _))| p.cap >= need)
            .min_by_key(|(_, (p, _))| p.cap)
            .map(|(i, _)| i);
        let mut pipe = match fit {
            Some(i) => return Some(self.free.swap_remove(i).0),
            // Grow the largest free one.
            None if !self.free.is_empty() => {
                let i = (0..self.free.len()).max_by_key(|&i| self.free[i].0.cap)?;
                self.free.swap_remove(i).0
            }
            None => self.create()?,
        };
        match set_pipe_size(pipe.w.as_fd(), need) {
            Ok(cap) if cap >= need => {
                pipe.cap = cap;
                Some(pipe)
            }
            Ok(_) => None,
            Err(e) => {
                debug!("9p: cannot size a pipe to {need} bytes: {e}; copying instead");
                None
            }
        }
    }

    fn create(&mut self) -> Option<Pipe> {
        if self.open() >= self.max {
            return None;
        }
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two fds into `fds`, valid for the call.
        let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if r != 0 {
            debug!(
                "9p: cannot create a pipe: {}; copying instead",
                io::Error::last_os_error()
            );
            return None;
        }
        self.open.fetch_add(1, Ordering::AcqRel);
        // SAFETY: pipe2 succeeded: both fds are open and owned by nobody else.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Some(Pipe {
            r,
            w,
            // The kernel default; F_SETPIPE_SZ follows.
            cap: 16 * PAGE,
            open: Arc::clone(&self.open),
        })
    }

    /// Returns a pipe. Only an empty pipe is kept (and only below the
    /// cap); one that may hold data is closed.
    pub(crate) fn put(&mut self, pipe: Pipe, empty: bool) {
        if empty && self.free.len() < self.max {
            self.free.push((pipe, Instant::now()));
        }
    }

    /// Closes the free pipes unused for [`PIPE_IDLE_RELEASE`]; true if any.
    pub(crate) fn expire(&mut self) -> bool {
        let before = self.free.len();
        self.free
            .retain(|(_, since)| since.elapsed() < PIPE_IDLE_RELEASE);
        self.free.len() < before
    }

    /// How long until the oldest free pipe expires.
    pub(crate) fn next_expiry(&self) -> Option<Duration> {
        self.free
            .iter()
            .map(|(_, since)| PIPE_IDLE_RELEASE.saturating_sub(since.elapsed()))
            .min()
    }
}

/// A pool shared by a socket thread and its requests' writers (which may
/// run on a worker).
pub(crate) type SharedPipes = Arc<Mutex<PipePool>>;

/// Locks the pool, whatever a panicking holder left.
pub(crate) fn lock(p: &SharedPipes) -> MutexGuard<'_, PipePool> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_pipe_pool_caps_and_reuses() {
        let mut p = PipePool::new(2);
        let a = p.take(64 << 10).unwrap();
        assert!(a.cap >= pipe_bytes(64 << 10));
        let b = p.take(20 << 10).unwrap();
        assert_eq!(p.open(), 2);
        assert!(p.take(4096).is_none(), "over the cap");
        p.put(a, true);
        p.put(b, false);
        assert_eq!(p.open(), 1, "a pipe that may hold data is closed");
        let c = p.take(16 << 10).unwrap();
        assert_eq!(p.open(), 1, "reused");
        drop(c);
        assert_eq!(p.open(), 0);
        assert!(p.take(MAX_PIPE * 2).is_none());
    }
}
