//! Memory locking policy for VMMs: `off`, `on` or `on-fault`, process-wide
//! or per guest region.
//!
//! Locking guest memory keeps pages from being swapped or migrated, but
//! `mlockall(MCL_CURRENT | MCL_FUTURE)` also faults in every mapping at once.
//! `on-fault` locks pages only as they are touched. This crate makes the
//! policy a typed value, applies it, and turns `ENOMEM`/`EPERM` into errors
//! that say how much memory is needed and how to allow it.
//!
//! # Status
//!
//! This release contains the crate skeleton only. The planned API:
//!
//! - `MlockPolicy { Off, On, OnFault }` with `FromStr`/`Display` for exactly
//!   `off`, `on` and `on-fault`, and the queries `locks_memory()`,
//!   `is_on_fault()` and `allows_discard()`.
//! - `apply_process()`: `mlockall`, with a probe for `MCL_ONFAULT` support.
//! - `RegionLock`: `mlock2(MLOCK_ONFAULT)` or `mlock` on a guest region,
//!   unlocked on drop; with the `vm-memory` feature, for a `GuestMemoryMmap`.
//! - `with_unlocked(|| ...)`: a temporary unlock for postcopy-like flows.
//! - `preflight()`: RLIMIT_MEMLOCK and CAP_IPC_LOCK checks with remedies.
//! - `LockStatus`: `VmLck` and `VmRSS` from `/proc/self/status`.
