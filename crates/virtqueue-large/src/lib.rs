//! Strictly validated virtio descriptor chains of up to 32768 descriptors,
//! with zero-copy, `IOV_MAX`-chunked file I/O.
//!
//! Virtio ties the descriptors per request to the queue size, so a 9p or
//! block device cannot move more than a few MiB per request. This crate
//! keeps the ring small and lets one chain carry up to 32768 descriptors
//! (128 MiB of 4 KiB pages) under an explicit policy, reports every chain
//! fault as an error instead of ending the chain silently, and splits file
//! I/O at `IOV_MAX` so host syscalls never see too many iovecs.
//!
//! # Status
//!
//! This release contains the crate skeleton only. The planned API:
//!
//! - `ChainLimits { max_descriptors, max_bytes, indirect, chained_indirect }`
//!   with a spec-strict default and a large policy.
//! - A validating chain walk built on `virtio-queue` that returns `Result`,
//!   with one `Error` variant per fault.
//! - Zero-copy `Reader`/`Writer` over guest memory with `read_from_file_at` /
//!   `write_to_file_at` on `preadv`/`pwritev`.
//! - A driver-side `mock` (feature `test-utils`) that lays out direct,
//!   indirect and malicious chains in a real `GuestMemoryMmap`.
