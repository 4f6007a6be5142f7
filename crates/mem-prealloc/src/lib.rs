//! Multi-threaded preallocation of guest memory.
//!
//! A VMM that promises a guest its RAM up front must fault every page in
//! before the guest runs. One thread touching one page at a time takes
//! minutes per TiB; this crate splits the region across threads that start
//! together, uses `MADV_POPULATE_WRITE` where the kernel has it, and falls
//! back to touching each page while turning `SIGBUS` into an error.
//!
//! # Status
//!
//! This release contains the crate skeleton only. The planned API:
//!
//! - `preallocate(addr, len, &PreallocOptions) -> Result<PreallocReport>` for a
//!   raw region, and `start(...) -> PreallocJob` with `join()` for background
//!   jobs that run side by side.
//! - `PreallocOptions`: thread count (QEMU's formula without its hard cap of 16),
//!   `Method::{Auto, PopulateWrite, Touch}`, page size (detected through
//!   `fstatfs` on hugetlbfs, or given), CPU affinity, a progress callback and a
//!   cancellation token.
//! - With the `vm-memory` feature, one call preallocates every region of a
//!   `GuestMemoryMmap`.
//! - `Error`: unsupported mapping, hugetlbfs exhausted, cancelled, misaligned.
