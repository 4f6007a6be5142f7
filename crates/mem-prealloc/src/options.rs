// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! What a caller can tune: threads, method, page size, affinity, progress and
//! cancellation.

use std::fmt;
use std::num::NonZeroUsize;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::sys;

/// QEMU's hard cap on preallocation threads (`MAX_MEM_PREALLOC_THREAD_COUNT`).
/// This crate applies it only when asked, through
/// [`PreallocOptions::max_threads`] or [`PreallocOptions::qemu_thread_cap`].
pub const QEMU_MAX_THREADS: usize = 16;

/// Below this many bytes per thread another thread is not worth starting
/// (QEMU's `size / 64 MiB` term).
pub const MIN_BYTES_PER_THREAD: usize = 64 << 20;

/// The largest CPU number accepted in an affinity list (`CPU_SETSIZE - 1`).
pub const MAX_CPU: usize = sys::LAST_CPU;

/// The largest NUMA node number accepted (`MAX_NUMNODES - 1` of a kernel
/// built with `NODES_SHIFT = 10`).
pub const MAX_NODE: usize = 1023;

/// How [`PreallocOptions::numa`] places the pages on the host nodes, as
/// `mbind(2)` modes. QEMU's `policy=` of a memory backend maps one to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NumaPolicy {
    /// `MPOL_BIND`: only from these nodes; a node running out fails the
    /// allocation (QEMU `policy=bind`).
    Bind,
    /// `MPOL_PREFERRED` (one node) or `MPOL_PREFERRED_MANY` (several, Linux
    /// 5.15+): these nodes first, others when they are full (QEMU
    /// `policy=preferred`).
    Preferred,
    /// `MPOL_INTERLEAVE`: page by page round-robin over the nodes (QEMU
    /// `policy=interleave`).
    Interleave,
}

impl fmt::Display for NumaPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NumaPolicy::Bind => "bind",
            NumaPolicy::Preferred => "preferred",
            NumaPolicy::Interleave => "interleave",
        })
    }
}

/// A NUMA placement: a policy and a set of host nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Numa {
    pub(crate) policy: NumaPolicy,
    pub(crate) nodes: Vec<usize>,
}

impl Numa {
    /// The `mbind(2)` mode of this placement.
    pub(crate) fn mode(&self) -> libc::c_int {
        match self.policy {
            NumaPolicy::Bind => sys::MPOL_BIND,
            NumaPolicy::Preferred if self.nodes.len() > 1 => sys::MPOL_PREFERRED_MANY,
            NumaPolicy::Preferred => sys::MPOL_PREFERRED,
            NumaPolicy::Interleave => sys::MPOL_INTERLEAVE,
        }
    }
}

/// How pages are faulted in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Method {
    /// `PopulateWrite` when the kernel has it (Linux 5.14+), `Touch` on older
    /// kernels. Where a kernel that has `MADV_POPULATE_WRITE` refuses it for
    /// one mapping with `EINVAL` (`memfd_secret`, `VM_PFNMAP` mappings), that
    /// region falls back to `Touch` if touching is correct there: the
    /// mapping is writable and not `VM_IO` (device memory, where an access
    /// can have side effects). Otherwise the error stays
    /// [`Error::UnsupportedMapping`]. The report names the method used.
    #[default]
    Auto,
    /// `madvise(MADV_POPULATE_WRITE)` per chunk, with no fallback.
    PopulateWrite,
    /// One kernel-side atomic write fault per page (see the crate docs); works
    /// on every kernel, preserves contents, never raises `SIGBUS`.
    Touch,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Auto => "auto",
            Method::PopulateWrite => "populate-write",
            Method::Touch => "touch",
        })
    }
}

/// A shareable flag that asks running jobs to stop at the next chunk.
///
/// Clones share the flag. Cancelling is sticky: a cancelled token stays
/// cancelled, and jobs started with it stop before touching anything.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks every job that holds this token to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The progress callback: receives the bytes done so far.
pub(crate) type ProgressFn = Arc<dyn Fn(u64) + Send + Sync>;

/// Options for [`preallocate`](crate::preallocate) and
/// [`start`](crate::start). The defaults match QEMU without its hard thread
/// cap: automatic method, base page size, no pinning.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct PreallocOptions {
    pub(crate) threads: Option<usize>,
    pub(crate) max_threads: Option<usize>,
    pub(crate) method: Method,
    pub(crate) page_size: Option<usize>,
    pub(crate) cpus: Vec<usize>,
    pub(crate) progress: Option<ProgressFn>,
    pub(crate) cancel: Option<CancelToken>,
    pub(crate) numa: Option<Numa>,
    pub(crate) round_down: bool,
}

impl fmt::Debug for PreallocOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreallocOptions")
            .field("threads", &self.threads)
            .field("max_threads", &self.max_threads)
            .field("method", &self.method)
            .field("page_size", &self.page_size)
            .field("cpus", &self.cpus)
            .field("progress", &self.progress.is_some())
            .field("cancel", &self.cancel)
            .field("numa", &self.numa)
            .field("round_down", &self.round_down)
            .finish()
    }
}

impl PreallocOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requested thread count (QEMU's `prealloc-threads`). The formula still
    /// lowers it for small regions; see [`thread_count`].
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads);
        self
    }

    /// An upper bound on the thread count. None by default.
    pub fn max_threads(mut self, max: usize) -> Self {
        self.max_threads = Some(max);
        self
    }

    /// Applies QEMU's hard cap of [`QEMU_MAX_THREADS`] threads.
    pub fn qemu_thread_cap(self) -> Self {
        self.max_threads(QEMU_MAX_THREADS)
    }

    /// How pages are faulted in.
    pub fn method(mut self, method: Method) -> Self {
        self.method = method;
        self
    }

    /// The page size of the mapping. Without it the base page size is
    /// assumed, which is correct but slower for a hugetlbfs mapping. It must
    /// not exceed the real page size of the mapping: [`Method::Touch`] faults
    /// one address per page, and would skip pages if told they were larger.
    pub fn page_size(mut self, page_size: usize) -> Self {
        self.page_size = Some(page_size);
        self
    }

    /// Sets the page size from the file backing the mapping: the hugepage
    /// size on hugetlbfs (`fstatfs`), the base page size otherwise.
    pub fn page_size_from_fd(self, fd: impl AsFd) -> Result<Self> {
        let size = page_size_of(fd)?;
        Ok(self.page_size(size))
    }

    /// Pins the workers: worker `i` runs on `cpus[i % cpus.len()]`. The
    /// number of distinct CPUs in the list takes the place of the CPUs
    /// available to the process in [`thread_count`], so it also bounds an
    /// explicit thread count. Pass the CPUs of the guest's NUMA node to have
    /// the pages allocated there.
    pub fn cpus(mut self, cpus: impl IntoIterator<Item = usize>) -> Self {
        self.cpus = cpus.into_iter().collect();
        self
    }

    /// Called from the workers with the bytes done so far. Calls are
    /// serialised, strictly increasing, and the last one of a successful run
    /// reports the full length. Keep it cheap: workers wait while it runs.
    pub fn progress(mut self, progress: impl Fn(u64) + Send + Sync + 'static) -> Self {
        self.progress = Some(Arc::new(progress));
        self
    }

    /// A token that stops the workers at the next chunk boundary.
    pub fn cancel_token(mut self, token: CancelToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// Binds every region to the host `nodes` with `policy` through
    /// `mbind(2)` (flags `MPOL_MF_STRICT | MPOL_MF_MOVE`, as QEMU's
    /// `host-nodes=`/`policy=`) before any page is faulted in, so the pages
    /// are allocated there by either method. Unless [`cpus`](Self::cpus)
    /// gives CPUs, the workers are pinned to the CPUs of these nodes
    /// (`/sys/devices/system/node/nodeN/cpulist`, within the process's
    /// affinity mask) so that they zero the pages next to them.
    ///
    /// A node that does not exist is an [`Error::NumaNode`] before anything
    /// is touched; a refused `mbind` is an [`Error::NumaBind`].
    pub fn numa(mut self, policy: NumaPolicy, nodes: impl IntoIterator<Item = usize>) -> Self {
        let mut nodes: Vec<usize> = nodes.into_iter().collect();
        nodes.sort_unstable();
        nodes.dedup();
        self.numa = Some(Numa { policy, nodes });
        self
    }

    /// With `true`, a length that is not a multiple of the page size is
    /// rounded down to whole pages instead of being refused with
    /// [`Error::Misaligned`]; the bytes left out are reported in
    /// [`PreallocReport::tail`](crate::PreallocReport::tail). The default
    /// (`false`) refuses: a mapping always spans whole pages (mmap rounds
    /// the length up, and hugetlbfs refuses a misaligned one), so a length
    /// that is not is a sign that the page size in force is not that of the
    /// mapping, or that the range is not the whole mapping.
    pub fn round_down_length(mut self, round_down: bool) -> Self {
        self.round_down = round_down;
        self
    }

    /// Checks the options that do not depend on the region.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.threads == Some(0) {
            return Err(Error::InvalidOption(
                "thread count must be at least 1".into(),
            ));
        }
        if self.max_threads == Some(0) {
            return Err(Error::InvalidOption(
                "maximum thread count must be at least 1".into(),
            ));
        }
        if let Some(&cpu) = self.cpus.iter().find(|&&cpu| cpu > MAX_CPU) {
            return Err(Error::InvalidOption(format!(
                "cpu {cpu} is beyond the largest cpu number {MAX_CPU}"
            )));
        }
        if let Some(numa) = &self.numa {
            if numa.nodes.is_empty() {
                return Err(Error::InvalidOption("the NUMA node set is empty".into()));
            }
            for &node in &numa.nodes {
                if node > MAX_NODE || !sys::node_exists(node) {
                    return Err(Error::NumaNode { node });
                }
            }
        }
        if let Some(size) = self.page_size {
            if !size.is_power_of_two() || size < sys::base_page_size() {
                return Err(Error::InvalidOption(format!(
                    "page size {size:#x} is not a power of two of at least {:#x}",
                    sys::base_page_size()
                )));
            }
        }
        Ok(())
    }

    /// The page size in force.
    pub(crate) fn effective_page_size(&self) -> usize {
        self.page_size.unwrap_or_else(sys::base_page_size)
    }

    /// The CPUs to pin the workers to, in order: the given ones, else those
    /// of the NUMA nodes (within the affinity mask), else none.
    pub(crate) fn worker_cpus(&self) -> Result<Vec<usize>> {
        if !self.cpus.is_empty() {
            return Ok(self.cpus.clone());
        }
        let Some(numa) = &self.numa else {
            return Ok(Vec::new());
        };
        let allowed = sys::allowed_cpus();
        let mut cpus = Vec::new();
        for &node in &numa.nodes {
            let list = sys::node_cpus(node).map_err(|_| Error::NumaNode { node })?;
            cpus.extend(
                list.into_iter()
                    .filter(|cpu| allowed.as_ref().is_none_or(|a| a.contains(cpu))),
            );
        }
        cpus.sort_unstable();
        cpus.dedup();
        if cpus.is_empty() {
            log::debug!(
                "nodes {:?} have no CPU this process may use: not pinning",
                numa.nodes
            );
        }
        Ok(cpus)
    }

    /// The number of CPUs the workers may use with the pinning list `cpus`
    /// (empty: no pinning).
    pub(crate) fn available_cpus_of(&self, cpus: &[usize]) -> usize {
        if cpus.is_empty() {
            std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
        } else {
            let mut distinct = cpus.to_vec();
            distinct.sort_unstable();
            distinct.dedup();
            distinct.len()
        }
    }
}

/// The page size of the file behind `fd`: the hugepage size for hugetlbfs
/// (also `memfd_create(MFD_HUGETLB)`), the base page size for anything else.
pub fn page_size_of(fd: impl AsFd) -> Result<usize> {
    sys::fd_page_size(fd).map_err(Error::PageSize)
}

/// The number of worker threads for `len` bytes of `page_size` pages:
///
/// `min(cpus, requested, max, pages, max(1, len / 64 MiB))`, at least 1.
///
/// This is QEMU's formula without its hard cap of 16, which callers can keep
/// by passing `max = Some(QEMU_MAX_THREADS)`. `None` means unbounded.
pub fn thread_count(
    len: usize,
    page_size: usize,
    cpus: usize,
    requested: Option<usize>,
    max: Option<usize>,
) -> usize {
    let pages = len / page_size.max(1);
    let by_size = (len / MIN_BYTES_PER_THREAD).max(1);
    [
        cpus,
        requested.unwrap_or(usize::MAX),
        max.unwrap_or(usize::MAX),
        pages,
        by_size,
    ]
    .into_iter()
    .min()
    .unwrap_or(1)
    .max(1)
}
