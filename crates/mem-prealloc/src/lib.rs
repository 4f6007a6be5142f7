// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Multi-threaded preallocation of guest memory.
//!
//! A VMM that promises a guest its RAM up front must fault every page in
//! before the guest runs. One thread faulting one page at a time takes
//! minutes per TiB. This crate splits a region across worker threads that
//! start together behind a barrier, faults pages in with
//! `MADV_POPULATE_WRITE` where the kernel has it, and otherwise with a
//! kernel-side atomic write per page that can fail but never raises `SIGBUS`.
//!
//! - [`preallocate`] faults `[addr, addr + len)` in and returns a
//!   [`PreallocReport`] (bytes, threads, method, page size, elapsed time).
//! - [`start`] does the same in the background and returns a
//!   [`PreallocJob`]; [`PreallocJob::join`] returns the result.
//! - [`start_regions`] / [`preallocate_regions`] fill several [`Region`]s
//!   at once with one pool of workers (one thread budget, chunks taken from
//!   the regions in turn) and give one result per region: a region that
//!   fails (say, the hugetlbfs pool runs out) does not stop the others.
//! - [`PreallocOptions`] sets the thread count ([`thread_count`]: QEMU's
//!   formula without its hard cap of 16, which stays available as
//!   [`PreallocOptions::qemu_thread_cap`]), the [`Method`], the page size
//!   (given, or detected from the backing file with `fstatfs`), the CPUs to
//!   pin the workers to, NUMA placement ([`PreallocOptions::numa`]: `mbind`
//!   before population, workers on the nodes' CPUs), a progress callback
//!   and a [`CancelToken`].
//! - With the `vm-memory` feature, `guest_memory::preallocate_guest_memory`
//!   prepares every region of a `GuestMemoryMmap` at once,
//!   `guest_memory::preallocate_region` a single `GuestRegionMmap`, and
//!   `guest_memory::preallocate_mmap_region` a raw `MmapRegion` before it is
//!   wrapped.
//! - [`Error`] converts into `std::io::Error` for VMMs whose set-up code
//!   returns those.
//!
//! # Example
//!
//! ```
//! use mem_prealloc::{preallocate, CancelToken, Method, PreallocOptions};
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::sync::Arc;
//!
//! let len = 8 << 20;
//! // SAFETY: a fresh anonymous mapping, unmapped below.
//! let addr = unsafe {
//!     libc::mmap(
//!         std::ptr::null_mut(),
//!         len,
//!         libc::PROT_READ | libc::PROT_WRITE,
//!         libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
//!         -1,
//!         0,
//!     )
//! };
//! assert_ne!(addr, libc::MAP_FAILED);
//!
//! let seen = Arc::new(AtomicU64::new(0));
//! let seen_in_callback = Arc::clone(&seen);
//! let options = PreallocOptions::new()
//!     .threads(2)
//!     .method(Method::Auto)
//!     .progress(move |done| seen_in_callback.store(done, Ordering::Relaxed))
//!     .cancel_token(CancelToken::new());
//! // SAFETY: the mapping above is ours and stays mapped until after the call.
//! let report = unsafe { preallocate(addr.cast(), len, &options) }?;
//! assert_eq!(report.bytes, len as u64);
//! assert_eq!(seen.load(Ordering::Relaxed), len as u64);
//!
//! // SAFETY: unmaps the mapping created above; nothing refers to it.
//! unsafe { libc::munmap(addr, len) };
//! # Ok::<(), mem_prealloc::Error>(())
//! ```
//!
//! # How a fault becomes an error instead of `SIGBUS`
//!
//! When a page cannot be provided (the hugetlbfs pool is exhausted, the
//! backing file was truncated below the mapping, the page is poisoned) a CPU
//! access to it raises `SIGBUS`. QEMU's touch fallback installs a process-wide
//! `SIGBUS` handler and `siglongjmp`s out of it. That pattern is not sound in
//! Rust: jumping over Rust frames skips destructors and breaks the
//! assumptions the compiler makes about control flow, and a process-wide
//! handler would also steal `SIGBUS` from the rest of the VMM.
//!
//! This crate never lets the CPU fault on the target memory from user space.
//! Both methods ask the kernel to take the write fault on our behalf, through
//! paths that turn an unresolvable fault into an errno:
//!
//! - [`Method::PopulateWrite`] calls `madvise(MADV_POPULATE_WRITE)` per chunk
//!   (Linux 5.14+). The kernel faults each page in as a write would, writes
//!   nothing, and returns `EFAULT` where a CPU access would have raised
//!   `SIGBUS`. On failure the chunk is retried page by page to report the
//!   exact offset.
//! - [`Method::Touch`] (any kernel) issues one `futex(FUTEX_WAKE_OP)` per page
//!   whose operation is an atomic `*page += 0`. The kernel performs the add
//!   with page faults disabled; when the page is missing it resolves the write
//!   fault with `fixup_user_fault()` and retries. An unresolvable fault
//!   returns `EFAULT` (or `ENOMEM`), with no signal. The store is an atomic
//!   add of zero, so the contents are preserved even if another thread (or a
//!   running guest) writes the page at the same moment; QEMU's read-then-write
//!   touch would lose such a store. The wake half of the operation targets a
//!   private stack word of the worker that nobody waits on; the only possible
//!   side effect is one spurious wake-up of a private futex waiter on the
//!   first word of a page, which futex users must tolerate anyway.
//!
//! Because no path writes a byte of the range or lets a signal be delivered,
//! [`preallocate`] and [`start`] are safe functions: a bad, unmapped or
//! read-only range, or one unmapped while a job runs, gives an [`Error`].
//!
//! [`Method::Auto`] uses `MADV_POPULATE_WRITE` when the kernel has it (probed
//! once on a private page) and the touch method otherwise. When a kernel
//! that has it refuses it on one mapping with `EINVAL` (`memfd_secret`,
//! `VM_PFNMAP` mappings), that region falls back to touching, as QEMU does,
//! but only where touching is correct: the mapping is writable and not
//! `VM_IO` (`VmFlags` in `/proc/self/smaps`). A read-only or `VM_IO`
//! mapping stays an [`Error::UnsupportedMapping`]. The report's `method`
//! says `Touch` for a region that fell back.
//!
//! # Threads
//!
//! The workers claim chunks of 2 to 32 MiB from a shared counter, so a worker
//! slowed down by other load does not hold the others back, and cancellation
//! and progress act within one chunk. They check in at a start gate and
//! begin together once all have been created (and pinned), so thread
//! creation, which maps stacks under `mmap_lock`, does not contend with the
//! page faults.
//!
//! How far threads scale depends on the backing more than on this crate. On
//! anonymous memory a page fault mostly touches per-CPU state and the lock
//! of its own page-table page, and two threads come close to twice one. On a memfd or tmpfs file
//! (shmem) every new page also goes through per-file state that all the
//! threads share: the page-cache insertion under the mapping's `xa_lock`,
//! the inode's block accounting and the file-time update of a shared write
//! fault. On a 2-vCPU VM with Linux 6.18 that per-file work makes two
//! threads on one memfd only 1.4 to 1.5 times as fast as one, for this
//! crate and for QEMU alike, while two threads on two memfds of half the
//! size each reach about 1.85, and on anonymous memory about 1.95. A VMM that wants the most from its preallocation threads
//! on shmem can back guest RAM with several memfds (one per NUMA node, or a
//! few per node) and preallocate them as concurrent jobs with [`start`].
//! The crate README has the measurements.
//!
//! # Limits
//!
//! - Without an explicit page size or a backing fd, the base page size is
//!   assumed. That is correct for hugetlbfs too, only slower with the touch
//!   method, and an alignment error for a hugetlbfs range is then not caught
//!   up front (the kernel reports `EINVAL`).
//! - Preallocation of a `MAP_PRIVATE` file mapping breaks copy-on-write, as
//!   any write would: later changes to the file are no longer seen.
//! - Linux only.

#![cfg(target_os = "linux")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The README is the crate's crates.io page: its example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme_doctest {}

mod error;
#[cfg(feature = "vm-memory")]
#[cfg_attr(docsrs, doc(cfg(feature = "vm-memory")))]
pub mod guest_memory;
mod job;
mod options;
mod sys;

pub use error::{Error, Result};
pub use job::{
    preallocate, preallocate_regions, start, start_regions, PreallocJob, PreallocJobs,
    PreallocReport, Region, MAX_CHUNK_BYTES, MIN_CHUNK_BYTES,
};
pub use options::{
    page_size_of, thread_count, CancelToken, Method, NumaPolicy, PreallocOptions, MAX_CPU,
    MAX_NODE, MIN_BYTES_PER_THREAD, QEMU_MAX_THREADS,
};

/// The base page size of the machine (`sysconf(_SC_PAGESIZE)`).
pub fn base_page_size() -> usize {
    sys::base_page_size()
}
