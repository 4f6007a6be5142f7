// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! [`DirtyLog`], the bitmap of the device's guest memory: the dirty-page
//! log of a live migration (`VHOST_USER_PROTOCOL_F_LOG_SHMFD`).
//!
//! vhost-user-backend's own `BitmapMmapRegion` does the same job, but
//! every write into guest memory pays for it with logging off: each
//! slice of guest memory clones an `Arc` (two atomic read-modify-writes)
//! and each dirty marking takes an `RwLock` for reading (two more), per
//! 4 KiB page of a request. Here a slice borrows the region's bitmap
//! (vm-memory's `RefSlice`), and a marking with no log set is one atomic
//! load. With a log set, a marking takes the lock for reading and sets
//! the pages' bits, as `BitmapMmapRegion` does.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use vhost_user_backend::bitmap::{AtomicBitmapMmap, BitmapReplace, MemRegionBitmap, MmapLogReg};
use vm_memory::bitmap::{Bitmap, RefSlice, WithBitmapSlice};
use vm_memory::mmap::NewBitmap;
use vm_memory::{Address, GuestMemoryRegion};

/// The guest memory a bit of the log stands for (`VHOST_LOG_PAGE`).
const LOG_PAGE: usize = 4096;

/// The bitmap of one guest memory region: nothing until the frontend
/// sends a log (SET_LOG_BASE), then the region's pages' bits in it.
/// Clones share the log, as vhost-user-backend's `BitmapReplace`
/// expects. Name it in the memory type of a `VhostUserDaemon` that runs
/// a [`Virtio9pBackend`](super::Virtio9pBackend):
/// `GuestMemoryAtomic<GuestMemoryMmap<DirtyLog>>`.
#[derive(Debug, Default, Clone)]
pub struct DirtyLog(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    /// A log is set: checked before the lock, so that a write with
    /// logging off costs one load.
    on: AtomicBool,
    log: RwLock<Option<RegionLog>>,
}

/// The bits of one region's pages in the frontend's shared log.
#[derive(Debug)]
pub struct RegionLog {
    logmem: Arc<MmapLogReg>,
    /// The region's guest address.
    start: usize,
    /// The region's length.
    len: usize,
}

fn invalid<E>(_: E) -> io::Error {
    io::Error::from(io::ErrorKind::InvalidData)
}

impl MemRegionBitmap for RegionLog {
    fn new<R: GuestMemoryRegion>(region: &R, logmem: Arc<MmapLogReg>) -> io::Result<Self> {
        // vhost-user-backend's own log checks that the log covers the
        // page of the region's last byte and that the region's end does
        // not overflow (a frontend's log too small is refused here, not
        // met later as an index out of bounds), and refuses an empty
        // region.
        AtomicBitmapMmap::new(region, Arc::clone(&logmem))?;
        Ok(RegionLog {
            logmem,
            start: usize::try_from(region.start_addr().raw_value()).map_err(invalid)?,
            len: usize::try_from(region.len()).map_err(invalid)?,
        })
    }
}

impl RegionLog {
    /// Sets the bits of the guest pages that `len` bytes at `offset`
    /// (from the start of the region) touch; bytes past the region are
    /// ignored.
    fn mark(&self, offset: usize, len: usize) {
        let end = offset.saturating_add(len).min(self.len);
        if offset >= end {
            return;
        }
        // No overflow and in bounds: `new` checked the region's last
        // byte, and these pages are at or before its page.
        let first = (self.start + offset) / LOG_PAGE;
        let last = (self.start + end - 1) / LOG_PAGE;
        for page in first..=last {
            self.logmem[page / 8].fetch_or(1 << (page % 8), Ordering::Relaxed);
        }
    }

    fn is_marked(&self, offset: usize) -> bool {
        if offset >= self.len {
            return false;
        }
        let page = (self.start + offset) / LOG_PAGE;
        self.logmem[page / 8].load(Ordering::Relaxed) & (1 << (page % 8)) != 0
    }
}

impl DirtyLog {
    fn log(&self) -> Option<std::sync::RwLockReadGuard<'_, Option<RegionLog>>> {
        if !self.0.on.load(Ordering::Acquire) {
            return None;
        }
        Some(self.0.log.read().unwrap_or_else(|e| e.into_inner()))
    }
}

impl<'a> WithBitmapSlice<'a> for DirtyLog {
    type S = RefSlice<'a, DirtyLog>;
}

impl Bitmap for DirtyLog {
    fn mark_dirty(&self, offset: usize, len: usize) {
        if let Some(log) = self.log() {
            if let Some(log) = log.as_ref() {
                log.mark(offset, len);
            }
        }
    }

    fn dirty_at(&self, offset: usize) -> bool {
        self.log()
            .is_some_and(|log| log.as_ref().is_some_and(|log| log.is_marked(offset)))
    }

    fn slice_at(&self, offset: usize) -> <Self as WithBitmapSlice<'_>>::S {
        RefSlice::new(self, offset)
    }
}

impl BitmapReplace for DirtyLog {
    type InnerBitmap = RegionLog;

    fn replace(&self, log: RegionLog) {
        *self.0.log.write().unwrap_or_else(|e| e.into_inner()) = Some(log);
        self.0.on.store(true, Ordering::Release);
    }
}

impl NewBitmap for DirtyLog {
    fn with_len(_len: usize) -> Self {
        Self::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

    #[test]
    fn test_no_log_marks_nothing() {
        let mem: GuestMemoryMmap<DirtyLog> =
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 * LOG_PAGE)]).unwrap();
        mem.write_slice(&[1u8; 3 * LOG_PAGE], GuestAddress(100))
            .unwrap();
        let region = mem.find_region(GuestAddress(0)).unwrap();
        let bitmap = region.bitmap();
        assert!((0..16).all(|p| !bitmap.dirty_at(p * LOG_PAGE)));
        assert!(!bitmap.slice_at(LOG_PAGE).dirty_at(0));
        let log = DirtyLog::default();
        log.mark_dirty(0, 4 * LOG_PAGE);
        assert!(!log.dirty_at(0));
        assert!(!log.0.on.load(Ordering::Acquire));
        assert!(log.0.log.read().unwrap().is_none());
    }

    #[test]
    fn test_clones_share_the_log_state() {
        let a = DirtyLog::default();
        let b = a.clone();
        assert!(Arc::ptr_eq(&a.0, &b.0));
    }
}
