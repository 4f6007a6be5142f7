// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Request and reply buffers: the pool of one socket thread and the
//! budget all threads share ("Memory" in the module docs).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::protocol::{MsgType, HEADER_SIZE};

/// Twrite frames larger than this are streamed from the socket to the file
/// instead of being buffered, and buffers up to this size are not charged
/// to the shared budget (so a client always gets a reply of this size,
/// whatever others hold).
pub(crate) const KEEP_BUFFER: usize = 64 << 10;

/// How long a free buffer stays in a socket thread's pool before it is
/// freed (and the heap trimmed).
pub(crate) const IDLE_RELEASE: Duration = Duration::from_millis(20);

/// The smallest buffer: every reply other than Rread/Rreaddir fits (the
/// largest is an Rgetlock or Rreadlink with a
/// [`MAX_PATH_LEN`](crate::protocol::MAX_PATH_LEN) string), and so do most
/// requests.
pub(crate) const SMALL_BUFFER: usize = 8 << 10;

/// The reply room a request can use: Tread and Treaddir ask for `count`
/// bytes of data (both carry `fid[4] offset[8] count[4]`); any other reply
/// is small. `frame` starts with the 7-byte header.
fn reply_room(frame: &[u8], limit: u32) -> usize {
    let ty = frame.get(4).and_then(|&t| MsgType::try_from(t).ok());
    let need = match (ty, frame.get(HEADER_SIZE + 12..HEADER_SIZE + 16)) {
        (Some(MsgType::Tread | MsgType::Treaddir), Some(c)) => {
            // size[4] type[1] tag[2] count[4] before the data.
            HEADER_SIZE + 4 + u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize
        }
        _ => SMALL_BUFFER,
    };
    need.min(limit as usize)
        .max(SMALL_BUFFER.min(limit as usize))
}

/// The shared budget for large buffers.
#[derive(Debug)]
pub(super) struct BufferBudget {
    pub(super) used: AtomicUsize,
    pub(super) max: usize,
}

impl BufferBudget {
    pub(super) fn new(max: usize) -> Arc<Self> {
        Arc::new(BufferBudget {
            used: AtomicUsize::new(0),
            max,
        })
    }

    pub(super) fn try_take(&self, n: usize) -> bool {
        crate::server::try_add(&self.used, n, self.max)
    }

    pub(super) fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// The buffer pool of one socket thread. A buffer's length is its size
/// (it is zeroed once, when allocated); one above `KEEP_BUFFER` is
/// charged to the budget for as long as it exists, in use or pooled.
pub(super) struct BufPool {
    /// Free buffers and when each was put back.
    pub(super) free: Vec<(Vec<u8>, Instant)>,
    pub(super) budget: Arc<BufferBudget>,
}

impl BufPool {
    /// A buffer of at least `n` bytes (at least `SMALL_BUFFER`), or
    /// `None` when a new one would exceed the budget.
    pub(super) fn take(&mut self, n: usize) -> Option<Vec<u8>> {
        let n = n.max(SMALL_BUFFER);
        // The smallest free buffer that fits, if it is not far too big.
        let best = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, (b, _))| b.len() >= n && b.len() <= n.saturating_mul(4))
            .min_by_key(|(_, (b, _))| b.len())
            .map(|(i, _)| i);
        if let Some(i) = best {
            return Some(self.free.swap_remove(i).0);
        }
        if n > KEEP_BUFFER && !self.budget.try_take(n) {
            return None;
        }
        // calloc: pages are only touched as the request uses them.
        Some(vec![0u8; n])
    }

    /// The reply buffer for the request `frame` and the bytes of it the
    /// reply may use: what [`reply_room`] asks, or a shorter Rread or
    /// Rreaddir when that is over the budget (as POSIX allows); `None`
    /// when not even that fits.
    pub(super) fn take_reply(&mut self, frame: &[u8], limit: u32) -> Option<(Vec<u8>, usize)> {
        let room = reply_room(frame, limit);
        if let Some(r) = self.take(room) {
            return Some((r, room));
        }
        let room = KEEP_BUFFER.min(limit as usize);
        self.take(room).map(|r| (r, room))
    }

    /// Returns `buf`, keeping at most `keep` free buffers.
    pub(super) fn put(&mut self, buf: Vec<u8>, keep: usize) {
        if self.free.len() < keep {
            self.free.push((buf, Instant::now()));
        } else {
            self.release(buf);
        }
    }

    pub(super) fn release(&self, buf: Vec<u8>) {
        if buf.len() > KEEP_BUFFER {
            self.budget.give(buf.len());
        }
    }

    /// Frees every pooled buffer; true if there were any.
    pub(super) fn clear(&mut self) -> bool {
        let any = !self.free.is_empty();
        for (b, _) in std::mem::take(&mut self.free) {
            self.release(b);
        }
        any
    }

    /// Frees the buffers unused for `IDLE_RELEASE`; true if any.
    pub(super) fn expire(&mut self) -> bool {
        let before = self.free.len();
        let mut kept = Vec::with_capacity(before);
        for (b, since) in std::mem::take(&mut self.free) {
            if since.elapsed() >= IDLE_RELEASE {
                self.release(b);
            } else {
                kept.push((b, since));
            }
        }
        self.free = kept;
        self.free.len() < before
    }

    /// How long until the oldest free buffer expires.
    pub(super) fn next_expiry(&self) -> Option<Duration> {
        self.free
            .iter()
            .map(|(_, since)| IDLE_RELEASE.saturating_sub(since.elapsed()))
            .min()
    }
}

impl Drop for BufPool {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Hands freed heap pages back to the kernel: glibc otherwise keeps freed
/// chunks below its (dynamic, up to 32 MiB) mmap threshold resident.
pub(super) fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free allocator memory to the
    // kernel; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}
