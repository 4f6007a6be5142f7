//! Stackful coroutines on pooled, guard-paged stacks that never exhaust
//! `vm.max_map_count`.
//!
//! Every coroutine stack is an `mmap` with a guard page: two VMAs with
//! `mprotect`, one with `MADV_GUARD_INSTALL` (Linux 6.13+). A server that keeps
//! thousands of requests in flight needs a pool of such stacks, and a pool
//! that grows without bound per thread runs into the kernel's mapping limit.
//! This crate bounds the pool by demand and by the mapping budget, and gives
//! memory back after bursts.
//!
//! # Status
//!
//! This release contains the crate skeleton only. The planned API:
//!
//! - `StackPool` / `PoolConfig`: a global pool of stack batches behind one lock,
//!   per-thread local pools capped at two batches, a hard cap derived from
//!   `/proc/sys/vm/max_map_count`, and `reserve(n)` returning an RAII
//!   reservation that raises the pool's maximum while it lives.
//! - `Coroutine`: resume/yield with a return value (built on `corosensei`),
//!   whose stack goes back to the pool when it finishes or is dropped.
//! - `trim()` and an optional background trimmer that free idle stacks above
//!   the recent high-water mark of demand.
//! - `Stats`: live coroutines, pooled stacks, creations, reuses, frees and VMAs.
//! - `Error`: mmap, guard and mapping-budget failures, never an abort.
