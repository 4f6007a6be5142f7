// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The error type of the crate.

use std::io;

/// Everything that can go wrong while preallocating a region.
///
/// Offsets are relative to the start of the region that was passed in, so
/// they stay meaningful whatever address the mapping got.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An option is out of range (a thread count of zero, an empty or
    /// oversized CPU list, a page size that is not a power of two, ...).
    #[error("invalid preallocation option: {0}")]
    InvalidOption(String),
    /// The start address or the length is not a multiple of the page size.
    #[error("{what} {value:#x} is not a multiple of the page size {page_size:#x}")]
    Misaligned {
        /// `"address"` or `"length"`.
        what: &'static str,
        /// The offending value.
        value: u64,
        /// The page size in force.
        page_size: usize,
    },
    /// The range is null or wraps around the address space.
    #[error("invalid range: {len:#x} bytes at {addr:#x}")]
    InvalidRange {
        /// Start address.
        addr: u64,
        /// Length in bytes.
        len: u64,
    },
    /// `fstatfs` on the backing file failed while detecting its page size.
    #[error("cannot detect the page size of the backing file: {0}")]
    PageSize(#[source] io::Error),
    /// The mapping cannot be faulted in for writing: it is read-only, or an
    /// I/O or PFN mapping (`EINVAL` from `MADV_POPULATE_WRITE`).
    #[error("mapping at offset {offset:#x} cannot be preallocated ({reason}): {source}")]
    UnsupportedMapping {
        /// First offset that failed.
        offset: u64,
        /// What is wrong with the mapping.
        reason: &'static str,
        /// The errno the kernel returned.
        #[source]
        source: io::Error,
    },
    /// Part of the range is not mapped at all.
    #[error("offset {offset:#x} of the range is not mapped: {source}")]
    NotMapped {
        /// First offset that failed.
        offset: u64,
        /// The errno the kernel returned.
        #[source]
        source: io::Error,
    },
    /// A hugetlbfs-backed page could not be allocated: the hugepage pool is
    /// exhausted (or the hugetlbfs file is shorter than the mapping). A CPU
    /// access would have raised `SIGBUS`.
    #[error(
        "hugepage at offset {offset:#x} cannot be allocated: hugetlbfs pool exhausted \
         or file shorter than the mapping (an access would raise SIGBUS): {source}"
    )]
    HugepagesExhausted {
        /// First offset that failed.
        offset: u64,
        /// The errno the kernel returned.
        #[source]
        source: io::Error,
    },
    /// The page could not be faulted in and a CPU access would have raised
    /// `SIGBUS` (the backing file was truncated, the page is poisoned, ...).
    #[error(
        "page at offset {offset:#x} cannot be faulted in \
         (backing file truncated or memory poisoned; an access would raise SIGBUS): {source}"
    )]
    Fault {
        /// First offset that failed.
        offset: u64,
        /// The errno the kernel returned.
        #[source]
        source: io::Error,
    },
    /// The kernel ran out of memory while faulting a page in.
    #[error("out of memory at offset {offset:#x}: {source}")]
    OutOfMemory {
        /// First offset that failed.
        offset: u64,
        /// The errno the kernel returned.
        #[source]
        source: io::Error,
    },
    /// Any other errno from the kernel.
    #[error("{call} failed at offset {offset:#x}: {source}")]
    Os {
        /// The system call that failed.
        call: &'static str,
        /// First offset that failed.
        offset: u64,
        /// The errno the kernel returned.
        #[source]
        source: io::Error,
    },
    /// The job was cancelled through its [`CancelToken`](crate::CancelToken)
    /// before it completed. Pages counted in `done` are resident.
    #[error("preallocation cancelled after {done} of {total} bytes")]
    Cancelled {
        /// Bytes faulted in before the workers stopped.
        done: u64,
        /// Bytes in the region.
        total: u64,
    },
    /// A worker could not be pinned to a CPU of the affinity list.
    #[error("cannot pin a preallocation thread to cpu {cpu}: {source}")]
    Affinity {
        /// The CPU from the affinity list.
        cpu: usize,
        /// The errno from `sched_setaffinity`.
        #[source]
        source: io::Error,
    },
    /// A NUMA node of [`PreallocOptions::numa`](crate::PreallocOptions::numa)
    /// does not exist on this host (no `/sys/devices/system/node/nodeN`).
    /// Nothing was populated.
    #[error("NUMA node {node} does not exist on this host")]
    NumaNode {
        /// The node number.
        node: usize,
    },
    /// `mbind(2)` refused the NUMA placement of a region (for example a
    /// node without memory under `bind`, or a kernel without NUMA support).
    /// Nothing was populated.
    #[error("cannot bind {len:#x} bytes at {addr:#x} to the NUMA nodes: {source}")]
    NumaBind {
        /// Start address of the region.
        addr: u64,
        /// Length of the region.
        len: u64,
        /// The errno from `mbind`.
        #[source]
        source: io::Error,
    },
    /// A worker thread could not be spawned.
    #[error("cannot spawn a preallocation thread: {0}")]
    Spawn(#[source] io::Error),
    /// A worker thread panicked, which only the progress callback can cause.
    #[error("a preallocation thread panicked (in the progress callback)")]
    WorkerPanicked,
}

impl Error {
    /// The errno behind the error, when the kernel reported one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::PageSize(e) | Error::Spawn(e) => e.raw_os_error(),
            Error::UnsupportedMapping { source, .. }
            | Error::NotMapped { source, .. }
            | Error::HugepagesExhausted { source, .. }
            | Error::Fault { source, .. }
            | Error::OutOfMemory { source, .. }
            | Error::Os { source, .. }
            | Error::Affinity { source, .. }
            | Error::NumaBind { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

impl From<Error> for io::Error {
    /// The kind follows the errno where the kernel gave one (`EFAULT`,
    /// `ENOMEM`, ...), else the nature of the error; the crate error stays
    /// the message and is reachable with `get_ref()`/`into_inner()`
    /// (and its errno with [`Error::raw_os_error`]).
    fn from(err: Error) -> Self {
        let kind = match &err {
            Error::InvalidOption(_)
            | Error::Misaligned { .. }
            | Error::InvalidRange { .. }
            | Error::NumaNode { .. } => io::ErrorKind::InvalidInput,
            Error::Cancelled { .. } => io::ErrorKind::Interrupted,
            Error::WorkerPanicked => io::ErrorKind::Other,
            other => match other.raw_os_error() {
                Some(errno) => io::Error::from_raw_os_error(errno).kind(),
                None => io::ErrorKind::Other,
            },
        };
        io::Error::new(kind, err)
    }
}

/// The result type of the crate.
pub type Result<T> = std::result::Result<T, Error>;
