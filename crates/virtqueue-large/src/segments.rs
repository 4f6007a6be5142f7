// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Validated buffer segments and the pool that recycles their storage.

use std::sync::{Arc, Mutex};

use vm_memory::GuestAddress;

/// One validated piece of a chain: a guest range that lies inside a single
/// guest memory region. A descriptor that straddles two regions becomes two
/// segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    addr: u64,
    len: u32,
}

impl Segment {
    pub(crate) fn new(addr: u64, len: u32) -> Self {
        Segment { addr, len }
    }

    /// Guest physical address of the segment.
    pub fn addr(&self) -> GuestAddress {
        GuestAddress(self.addr)
    }

    /// Length in bytes (never zero).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u32 {
        self.len
    }

    pub(crate) fn raw_addr(&self) -> u64 {
        self.addr
    }
}

/// Storage for the segments of one chain, shared by its Reader, Writer and
/// their split-off parts.
#[derive(Debug, Default)]
pub(crate) struct SegBuf {
    pub(crate) segs: Vec<Segment>,
}

/// Largest segment buffer (in segments, 16 bytes each) the pool keeps: a
/// buffer that grew beyond it for one huge chain is freed, not kept, so the
/// pool holds at most `max_pooled` x 16 KiB.
pub const MAX_POOLED_SEGMENTS: usize = 1024;

/// Recycles segment buffers so that steady-state chains allocate nothing.
#[derive(Debug)]
pub(crate) struct Pool {
    free: Mutex<Vec<Arc<SegBuf>>>,
    max_pooled: usize,
}

impl Pool {
    pub(crate) fn new(max_pooled: usize) -> Arc<Self> {
        Arc::new(Pool {
            free: Mutex::new(Vec::with_capacity(max_pooled)),
            max_pooled,
        })
    }

    /// A buffer from the pool (empty, with its old capacity) or a new one.
    pub(crate) fn take(self: &Arc<Self>) -> Shared {
        let buf = self
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default();
        Shared {
            buf: Some(buf),
            pool: Some(Arc::clone(self)),
        }
    }

    fn put(&self, buf: Arc<SegBuf>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.max_pooled {
            free.push(buf);
        }
    }

    pub(crate) fn pooled(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A reference-counted segment buffer that goes back to its pool when the
/// last holder drops it. Cloning does not allocate.
#[derive(Debug)]
pub(crate) struct Shared {
    buf: Option<Arc<SegBuf>>,
    pool: Option<Arc<Pool>>,
}

impl Shared {
    /// Mutable access while the walk fills the buffer (sole owner).
    pub(crate) fn get_mut(&mut self) -> &mut SegBuf {
        Arc::get_mut(self.buf.as_mut().expect("buffer present until drop"))
            .expect("segment buffer shared while being filled")
    }

    pub(crate) fn segs(&self) -> &[Segment] {
        &self.buf.as_ref().expect("buffer present until drop").segs
    }
}

impl Clone for Shared {
    fn clone(&self) -> Self {
        Shared {
            buf: self.buf.clone(),
            pool: self.pool.clone(),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let (Some(mut buf), Some(pool)) = (self.buf.take(), self.pool.take()) else {
            return;
        };
        // Only the last holder can get mutable access; if two holders drop
        // at the same time on two threads both may fail, and the buffer is
        // simply freed instead of recycled.
        if let Some(inner) = Arc::get_mut(&mut buf) {
            if inner.segs.capacity() <= MAX_POOLED_SEGMENTS {
                inner.segs.clear();
                pool.put(buf);
            }
        }
    }
}
