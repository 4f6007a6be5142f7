// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Memory locking policy for VMMs: `off`, `on` or `on-fault`, process-wide
//! or per guest region, with errors that say what to do.
//!
//! Locking guest memory keeps the kernel from swapping or migrating it (for
//! example kcompactd moving pages under a device that DMAs into them). QEMU's
//! `-overcommit mem-lock=on` calls `mlockall(MCL_CURRENT | MCL_FUTURE)`,
//! which also faults in every mapping at once: with a 2 GiB guest, resident
//! memory goes from 35 MB to 3.2 GB. `on-fault` (`MCL_ONFAULT`) locks pages
//! only as they are touched. crosvm locks only guest RAM, per region, with
//! `mlock2(MLOCK_ONFAULT)`. This crate offers both ways behind one policy
//! value.
//!
//! - [`MlockPolicy`]: `off`, `on` or `on-fault` (`FromStr`/`Display`), with
//!   the queries consumers need: [`locks_memory`], [`is_on_fault`],
//!   [`allows_discard`].
//! - Process-wide: [`apply_process`] (`mlockall`, with `MCL_ONFAULT` for
//!   `on-fault`; a kernel without it gives [`Error::OnFaultUnsupported`]).
//! - Per region: [`lock_region`] returns a [`RegionLock`] that unlocks on
//!   drop; with the `vm-memory` feature, `lock_guest_memory` locks every
//!   region of a `GuestMemoryMmap`.
//! - Temporary unlock for postcopy-like flows: `with_unlocked(|| ...)`, or
//!   a [`TemporaryUnlock`] guard whose `relock()` reports failure.
//! - Pre-flight: [`preflight`] and [`preflight_regions`] compare
//!   `RLIMIT_MEMLOCK` and `CAP_IPC_LOCK` ([`LockBudget`]) with what the
//!   policy needs. A shortfall, found there or by a failed lock, is
//!   [`Error::Insufficient`]: it names the amount and the remedies
//!   (`ulimit -l`, systemd `LimitMEMLOCK=`, `CAP_IPC_LOCK`), never a bare
//!   `ENOMEM` or `EPERM`.
//! - Status: [`LockStatus`] reads `VmLck`, `VmRSS` and `VmSize` from
//!   `/proc/<pid>/status`, plus the resident locked memory.
//!
//! # Example
//!
//! ```
//! use mlock_policy::{LockStatus, MlockPolicy};
//!
//! // What a VMM gets from `--mem-lock on-fault`.
//! let policy: MlockPolicy = "on-fault".parse()?;
//! assert!(policy.locks_memory() && !policy.allows_discard());
//!
//! // 16 MiB of guest RAM (a VMM would lock its GuestMemoryMmap instead).
//! let len = 16 << 20;
//! // SAFETY: a fresh anonymous mapping; checked below, unmapped at the end.
//! let ram = unsafe {
//!     libc::mmap(
//!         std::ptr::null_mut(),
//!         len,
//!         libc::PROT_READ | libc::PROT_WRITE,
//!         libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
//!         -1,
//!         0,
//!     )
//! };
//! assert_ne!(ram, libc::MAP_FAILED);
//!
//! match policy.preflight_regions(len as u64) {
//!     Ok(()) => {
//!         // SAFETY: the mapping is ours and outlives the guard.
//!         let mut lock = unsafe { policy.lock_region(ram as *const u8, len) }?;
//!         assert!(lock.is_locked());
//!         // Nothing was touched, so nothing became resident.
//!         let status = LockStatus::current()?;
//!         assert!(status.vm_lck() >= len as u64);
//!         // A postcopy-like phase with the region unlocked.
//!         lock.with_unlocked(|| { /* ... */ })?;
//!         assert!(lock.is_locked());
//!     } // the lock is dropped here: the region is unlocked
//!     // Without CAP_IPC_LOCK and with a small RLIMIT_MEMLOCK: the message
//!     // says how much is needed and how to allow it.
//!     Err(e) => eprintln!("{e}"),
//! }
//! // SAFETY: `ram` is the mapping made above; the lock is gone.
//! unsafe { libc::munmap(ram, len) };
//! # Ok::<(), mlock_policy::Error>(())
//! ```
//!
//! A daemon applies the policy process-wide before it serves:
//!
//! ```no_run
//! # fn main() -> Result<(), mlock_policy::Error> {
//! # let cli = "on-fault";
//! # let guest_ram_bytes = 2u64 << 30;
//! let policy: mlock_policy::MlockPolicy = cli.parse()?;
//! // Guest RAM arrives later (SET_MEM_TABLE): MCL_FUTURE charges it too.
//! policy.preflight(guest_ram_bytes)?;
//! policy.apply_process()?;
//! # Ok(()) }
//! ```
//!
//! [`locks_memory`]: MlockPolicy::locks_memory
//! [`is_on_fault`]: MlockPolicy::is_on_fault
//! [`allows_discard`]: MlockPolicy::allows_discard
//! [`apply_process`]: MlockPolicy::apply_process
//! [`lock_region`]: MlockPolicy::lock_region
//! [`preflight`]: MlockPolicy::preflight
//! [`preflight_regions`]: MlockPolicy::preflight_regions

#![cfg(target_os = "linux")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The README is the crate's crates.io page: its example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme_doctest {}

mod policy;
mod preflight;
mod process;
mod region;
mod status;
mod sys;
mod unlock;

use std::io;

pub use policy::MlockPolicy;
pub use preflight::{LockBudget, Shortfall};
#[cfg(feature = "vm-memory")]
pub use region::GuestMemoryLock;
pub use region::RegionLock;
pub use status::LockStatus;
pub use unlock::TemporaryUnlock;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A policy string other than `off`, `on` or `on-fault`.
    #[error("invalid mem-lock policy {0:?}: expected one of off, on, on-fault")]
    InvalidPolicy(String),
    /// The kernel rejects lock-on-fault (`MCL_ONFAULT`, `MLOCK_ONFAULT`;
    /// Linux 4.4 or later has them).
    #[error(
        "mem-lock=on-fault needs lock-on-fault support (Linux 4.4 or later), \
         which this kernel lacks: {op} failed: {source}"
    )]
    OnFaultUnsupported {
        /// The call that was refused.
        op: &'static str,
        /// Its error (`EINVAL` or `ENOSYS`).
        source: io::Error,
    },
    /// `RLIMIT_MEMLOCK` is too low and `CAP_IPC_LOCK` is missing; the
    /// message names the amount needed and the remedies.
    #[error("{0}")]
    Insufficient(Box<Shortfall>),
    /// A process-wide lock call failed for another reason.
    #[error("{op} failed: {source}")]
    Lock {
        /// The call that failed.
        op: &'static str,
        /// Its error.
        source: io::Error,
    },
    /// A region lock call failed for another reason (`ENOMEM` here
    /// usually means part of the range is not mapped).
    #[error("{op} of {len} bytes at {addr:#x} failed: {source}")]
    LockRegion {
        /// The call that failed.
        op: &'static str,
        /// Start of the range.
        addr: usize,
        /// Length of the range.
        len: usize,
        /// Its error.
        source: io::Error,
    },
    /// A range that cannot be locked as given.
    #[error("invalid region of {len} bytes at {addr:#x}: it {reason}")]
    InvalidRegion {
        /// Start of the range.
        addr: usize,
        /// Length of the range.
        len: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Locking again after a temporary unlock failed; the memory stays
    /// unlocked.
    #[error("re-locking memory after a temporary unlock failed, it stays unlocked: {0}")]
    Relock(Box<Error>),
    /// Reading the limits or capabilities failed.
    #[error("cannot query {what}: {source}")]
    Probe {
        /// What was being read.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// Reading a `/proc` status file failed.
    #[error("cannot read {path}: {source}")]
    Status {
        /// The file.
        path: String,
        /// The error.
        source: io::Error,
    },
    /// A `/proc` status file lacks a field or has a malformed value.
    #[error("cannot parse process status field {field}: {reason}")]
    StatusFormat {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A guest memory region has no host mapping to lock.
    #[cfg(feature = "vm-memory")]
    #[cfg_attr(docsrs, doc(cfg(feature = "vm-memory")))]
    #[error("guest memory region at {guest_addr:#x} has no host mapping to lock: {source}")]
    GuestMemory {
        /// Guest physical start of the region.
        guest_addr: u64,
        /// The vm-memory error (vm-memory's own type, on purpose: the
        /// feature exists to work on vm-memory's guest memory, whose
        /// users already match on it).
        source: vm_memory::GuestMemoryError,
    },
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync + 'static>() {}

    #[test]
    fn test_types_are_send_and_sync() {
        // A daemon keeps the guards in its memory-table state shared across
        // threads, and CLI parsers box the error.
        assert_send_sync::<Error>();
        assert_send_sync::<MlockPolicy>();
        assert_send_sync::<RegionLock>();
        assert_send_sync::<LockStatus>();
        assert_send_sync::<LockBudget>();
        #[cfg(feature = "vm-memory")]
        assert_send_sync::<GuestMemoryLock>();
        let boxed: Box<dyn std::error::Error + Send + Sync> =
            "bogus".parse::<MlockPolicy>().unwrap_err().into();
        assert!(boxed.to_string().contains("bogus"));
    }
}
