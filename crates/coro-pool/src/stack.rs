// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Raw stack mappings: mmap, guard page, page release, unmap, and the
//! intrusive free list that links idle stacks through their own memory.

use std::io;
use std::ptr::{self, NonNull};
use std::sync::OnceLock;

use crate::{Error, Result};

/// `MADV_GUARD_INSTALL` (Linux 6.13+). Not yet exported by the `libc` crate.
#[cfg(any(target_os = "linux", target_os = "android"))]
const MADV_GUARD_INSTALL: libc::c_int = 102;

/// Bytes reserved at the top of an idle stack for the free-list link.
const LINK_BYTES: usize = 16;

/// The system page size.
pub(crate) fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if size > 0 && (size as usize).is_power_of_two() {
            size as usize
        } else {
            4096
        }
    })
}

/// How the guard page below each stack is made inaccessible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GuardKind {
    /// `madvise(MADV_GUARD_INSTALL)`: the guard lives in the page tables, the
    /// stack stays one VMA.
    GuardInstall,
    /// `mprotect(PROT_NONE)`: the guard is a VMA of its own, two per stack.
    Mprotect,
}

impl GuardKind {
    /// VMAs one stack costs at most with this kind of guard.
    pub fn vmas_per_stack(self) -> usize {
        match self {
            GuardKind::GuardInstall => 1,
            GuardKind::Mprotect => 2,
        }
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            GuardKind::GuardInstall => "madvise(MADV_GUARD_INSTALL)",
            GuardKind::Mprotect => "mprotect(PROT_NONE)",
        }
    }

    pub(crate) fn to_u8(self) -> u8 {
        match self {
            GuardKind::GuardInstall => 1,
            GuardKind::Mprotect => 2,
        }
    }

    pub(crate) fn from_u8(v: u8) -> Self {
        if v == 1 {
            GuardKind::GuardInstall
        } else {
            GuardKind::Mprotect
        }
    }
}

/// Whether this kernel accepts `MADV_GUARD_INSTALL`, probed once per process
/// on a scratch mapping. Only a success counts: `EINVAL` (older kernel) and
/// any other failure select the `mprotect` fallback.
pub fn guard_install_supported() -> bool {
    static PROBE: OnceLock<bool> = OnceLock::new();
    *PROBE.get_or_init(probe_guard_install)
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn probe_guard_install() -> bool {
    let page = page_size();
    // SAFETY: a fresh anonymous private mapping that nothing else references.
    let addr = unsafe {
        libc::mmap(
            ptr::null_mut(),
            2 * page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        log::debug!(
            "coro-pool: guard-install probe could not map: {}",
            io::Error::last_os_error()
        );
        return false;
    }
    // SAFETY: the range is the first page of the mapping created above.
    let ret = unsafe { libc::madvise(addr, page, MADV_GUARD_INSTALL) };
    let supported = ret == 0;
    if !supported {
        log::debug!(
            "coro-pool: MADV_GUARD_INSTALL unavailable ({}), using mprotect guards",
            io::Error::last_os_error()
        );
    }
    // SAFETY: unmaps exactly the probe mapping, which holds no Rust objects.
    unsafe { libc::munmap(addr, 2 * page) };
    supported
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn probe_guard_install() -> bool {
    false
}

/// Geometry shared by every stack of one pool.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    /// Bytes of the inaccessible guard region at the low end.
    pub guard_len: usize,
    /// Usable bytes above the guard.
    pub usable_len: usize,
}

impl Layout {
    pub fn mmap_len(&self) -> usize {
        self.guard_len + self.usable_len
    }
}

fn map_flags() -> libc::c_int {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        // MAP_STACK keeps transparent huge pages off stacks (Linux 6.7+).
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS
    }
}

/// The outcome of the guard step, used to downgrade a pool whose stacks
/// cannot take `MADV_GUARD_INSTALL` (for example after `mlockall`).
pub(crate) enum GuardOutcome {
    Installed,
    FellBack,
}

/// Maps one stack with its guard page and returns its top (highest) address.
pub(crate) fn map_stack(layout: &Layout, kind: GuardKind) -> Result<(NonNull<u8>, GuardOutcome)> {
    let len = layout.mmap_len();
    // SAFETY: a fresh anonymous mapping; no existing memory is affected.
    let addr = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            map_flags(),
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(Error::Mmap {
            size: len,
            source: io::Error::last_os_error(),
        });
    }
    let mut outcome = GuardOutcome::Installed;
    let guard_result = match kind {
        GuardKind::GuardInstall => match guard_install(addr, layout.guard_len) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                outcome = GuardOutcome::FellBack;
                guard_mprotect(addr, layout.guard_len).map_err(|e| (GuardKind::Mprotect, e))
            }
            Err(e) => Err((kind, e)),
        },
        GuardKind::Mprotect => guard_mprotect(addr, layout.guard_len).map_err(|e| (kind, e)),
    };
    if let Err((used, source)) = guard_result {
        // SAFETY: unmaps exactly the mapping created above, which nothing
        // references yet.
        unsafe { libc::munmap(addr, len) };
        return Err(Error::Guard {
            method: used.name(),
            source,
        });
    }
    // SAFETY: addr is a valid mapping of len bytes, so addr + len is its end
    // and is not null.
    let top = unsafe { NonNull::new_unchecked(addr.cast::<u8>().add(len)) };
    Ok((top, outcome))
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn guard_install(addr: *mut libc::c_void, len: usize) -> io::Result<()> {
    // SAFETY: the range is the low end of a mapping this module just created.
    if unsafe { libc::madvise(addr, len, MADV_GUARD_INSTALL) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn guard_install(_addr: *mut libc::c_void, _len: usize) -> io::Result<()> {
    Err(io::Error::from_raw_os_error(libc::EINVAL))
}

fn guard_mprotect(addr: *mut libc::c_void, len: usize) -> io::Result<()> {
    // SAFETY: the range is the low end of a mapping this module just created;
    // nothing lives there yet.
    if unsafe { libc::mprotect(addr, len, libc::PROT_NONE) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Unmaps a stack.
///
/// # Safety
///
/// `top` must come from [`map_stack`] with the same layout, and no live
/// reference into the stack may remain.
pub(crate) unsafe fn unmap_stack(top: NonNull<u8>, layout: &Layout) -> io::Result<()> {
    let len = layout.mmap_len();
    // SAFETY: per the caller's contract, top - len is the start of the mapping.
    let addr = unsafe { top.as_ptr().sub(len) };
    // SAFETY: the whole mapping is unused, per the caller's contract.
    if unsafe { libc::munmap(addr.cast(), len) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Gives the pages of an idle stack back to the kernel, except its top page
/// (which holds the free-list link and is the first to be touched on reuse).
///
/// # Safety
///
/// `top` must be an idle stack of this layout that nothing is running on.
pub(crate) unsafe fn release_pages(top: NonNull<u8>, layout: &Layout) {
    let page = page_size();
    if layout.usable_len <= page {
        return;
    }
    let len = layout.usable_len - page;
    // SAFETY: [top - usable_len, top - page) lies inside the usable part of
    // the mapping, per the caller's contract.
    let start = unsafe { top.as_ptr().sub(layout.usable_len) };
    // SAFETY: the range is idle stack memory owned by the pool; dropping its
    // contents is harmless.
    let ret = unsafe { libc::madvise(start.cast(), len, libc::MADV_DONTNEED) };
    if ret != 0 {
        log::debug!(
            "coro-pool: MADV_DONTNEED on an idle stack failed: {}",
            io::Error::last_os_error()
        );
    }
}

/// An intrusive LIFO list of idle stacks: each idle stack stores the top of
/// the next one in its own top bytes, so pooling never allocates.
#[derive(Debug, Default)]
pub(crate) struct StackList {
    head: Option<NonNull<u8>>,
    len: usize,
}

// SAFETY: the list owns idle stack mappings, which are plain memory that any
// thread may use; no thread-affine state is attached to them.
unsafe impl Send for StackList {}

impl StackList {
    pub const fn new() -> Self {
        StackList { head: None, len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds an idle stack.
    ///
    /// # Safety
    ///
    /// `top` must be the top of an idle, writable stack mapping that is not
    /// in any other list and that nothing runs on.
    pub unsafe fn push(&mut self, top: NonNull<u8>) {
        let next = self.head.map_or(0usize, |p| p.as_ptr() as usize);
        // SAFETY: the top LINK_BYTES of an idle stack belong to the list, and
        // the stack top is page aligned, so the slot is aligned for usize.
        unsafe { top.as_ptr().sub(LINK_BYTES).cast::<usize>().write(next) };
        self.head = Some(top);
        self.len += 1;
    }

    /// Removes the most recently added stack.
    pub fn pop(&mut self) -> Option<NonNull<u8>> {
        let top = self.head?;
        // SAFETY: every stack in the list was linked by push(), which wrote
        // this slot; the mapping is alive while it is listed.
        let next = unsafe { top.as_ptr().sub(LINK_BYTES).cast::<usize>().read() };
        self.head = NonNull::new(next as *mut u8);
        self.len -= 1;
        Some(top)
    }

    /// Splits off up to `n` stacks into a new list.
    pub fn split_off(&mut self, n: usize) -> StackList {
        let mut out = StackList::new();
        for _ in 0..n {
            match self.pop() {
                // SAFETY: the stack just left this list, so it is idle and
                // listed nowhere else.
                Some(top) => unsafe { out.push(top) },
                None => break,
            }
        }
        out
    }

    /// Calls `f` on every listed stack top, without unlinking.
    pub fn for_each(&self, mut f: impl FnMut(NonNull<u8>)) {
        let mut cur = self.head;
        while let Some(top) = cur {
            // SAFETY: as in pop(): the slot was written by push().
            let next = unsafe { top.as_ptr().sub(LINK_BYTES).cast::<usize>().read() };
            f(top);
            cur = NonNull::new(next as *mut u8);
        }
    }

    /// Takes the whole list, leaving this one empty.
    pub fn take(&mut self) -> StackList {
        std::mem::take(self)
    }
}
