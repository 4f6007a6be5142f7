// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Per-region locking of guest RAM, crosvm style: only the guest memory is
//! locked, never the VMM's own heap, stacks or libraries.

use std::io;

use log::{debug, error};

use crate::policy::MlockPolicy;
use crate::preflight::{page_round_up, LockBudget};
use crate::status::LockStatus;
use crate::{sys, Error, Result};

/// The state of one region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The policy is `off`: nothing to lock or unlock.
    Inactive,
    /// Locked by us.
    Locked,
    /// Locked under the policy, but unlocked for now by a
    /// [`TemporaryUnlock`](crate::TemporaryUnlock) (or left unlocked by a
    /// failed re-lock).
    Suspended,
}

/// A locked range of guest RAM, unlocked when dropped.
///
/// Made by [`MlockPolicy::lock_region`]: `on` uses `mlock` (the range is
/// faulted in now), `on-fault` uses `mlock2(MLOCK_ONFAULT)` (pages are
/// locked as they are touched), and `off` gives a guard that does nothing.
///
/// Linux does not count locks: if two guards cover the same pages, dropping
/// either unlocks them, and `munlockall` (a process-wide
/// [`TemporaryUnlock`](crate::TemporaryUnlock)) unlocks every region. Keep
/// one guard per guest region and lock either per region or process-wide,
/// not both.
#[derive(Debug)]
pub struct RegionLock {
    addr: usize,
    len: usize,
    policy: MlockPolicy,
    state: State,
}

impl MlockPolicy {
    /// Locks `len` bytes of guest RAM at `addr` under this policy.
    ///
    /// `addr` must be page-aligned and `len` non-zero (it is rounded up to
    /// whole pages). The range should be a mapping that outlives the guard:
    /// if it is unmapped first, the unlock on drop fails and is logged. The
    /// memory is never read or written through `addr`, but `on` faults every
    /// page in (write-faulting private writable mappings), so do not lock
    /// ranges that fault into a userfaultfd handler on this thread.
    ///
    /// Errors: [`Error::InvalidRegion`] for a bad range,
    /// [`Error::Insufficient`] when `RLIMIT_MEMLOCK` is too low (naming the
    /// amount and the remedies), [`Error::OnFaultUnsupported`] for
    /// `on-fault` on kernels before 4.4, and [`Error::LockRegion`] for the
    /// rest (for example `ENOMEM` when part of the range is not mapped).
    ///
    /// # Safety
    ///
    /// `[addr, addr + len)` must be a mapping the caller owns for the
    /// guard's whole life: `on` faults it in (writing private writable
    /// pages), and the guard's `suspend`/`resume`/drop lock and unlock
    /// whatever is mapped there, so the range must not be unmapped and its
    /// addresses reused by another owner's mapping while the guard lives.
    /// For guest memory, the safe
    /// [`lock_guest_memory`](MlockPolicy::lock_guest_memory) ties the
    /// guard to the regions.
    pub unsafe fn lock_region(self, addr: *const u8, len: usize) -> Result<RegionLock> {
        let addr = addr as usize;
        let page = sys::page_size();
        let invalid = |reason| Error::InvalidRegion { addr, len, reason };
        if len == 0 {
            return Err(invalid("is empty"));
        }
        if addr == 0 {
            return Err(invalid("starts at the null address"));
        }
        if !addr.is_multiple_of(page) {
            return Err(invalid("does not start on a page boundary"));
        }
        let len = len
            .checked_next_multiple_of(page)
            .filter(|len| addr.checked_add(*len).is_some())
            .ok_or_else(|| invalid("wraps around the address space"))?;
        let mut region = RegionLock {
            addr,
            len,
            policy: self,
            state: if self.locks_memory() {
                State::Suspended
            } else {
                State::Inactive
            },
        };
        if self.locks_memory() {
            region.lock()?;
        }
        Ok(region)
    }
}

impl RegionLock {
    /// Start of the range.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Length of the range in bytes, rounded up to whole pages.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: empty ranges are refused. Present for API symmetry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The policy the range was locked under.
    pub fn policy(&self) -> MlockPolicy {
        self.policy
    }

    /// Whether the range is locked right now (false under `off`, during a
    /// temporary unlock, and after a failed re-lock).
    pub fn is_locked(&self) -> bool {
        self.state == State::Locked
    }

    /// Locks a suspended region; no-op otherwise.
    pub(crate) fn lock(&mut self) -> Result<()> {
        if self.state != State::Suspended {
            return Ok(());
        }
        let (op, res) = if self.policy.is_on_fault() {
            (
                "mlock2(MLOCK_ONFAULT)",
                sys::mlock2_onfault(self.addr, self.len),
            )
        } else {
            ("mlock", sys::mlock(self.addr, self.len))
        };
        match res {
            Ok(()) => {
                self.state = State::Locked;
                debug!(
                    "locked {} bytes at {:#x} (mem-lock={})",
                    self.len, self.addr, self.policy
                );
                Ok(())
            }
            Err(e) => {
                // mlock stops at the first failure and leaves what it locked
                // before it; undo that so a failed lock leaves nothing behind.
                let _ = sys::munlock(self.addr, self.len);
                Err(self.diagnose(op, e))
            }
        }
    }

    /// Unlocks a locked region for now; no-op otherwise.
    pub(crate) fn suspend(&mut self) -> Result<()> {
        if self.state != State::Locked {
            return Ok(());
        }
        sys::munlock(self.addr, self.len).map_err(|source| Error::LockRegion {
            op: "munlock",
            addr: self.addr,
            len: self.len,
            source,
        })?;
        self.state = State::Suspended;
        Ok(())
    }

    /// Whether a re-lock is owed.
    pub(crate) fn is_suspended(&self) -> bool {
        self.state == State::Suspended
    }

    /// Turns a lock failure into the most useful error.
    fn diagnose(&self, op: &'static str, e: io::Error) -> Error {
        let region_error = |source| Error::LockRegion {
            op,
            addr: self.addr,
            len: self.len,
            source,
        };
        match e.raw_os_error() {
            Some(libc::EINVAL | libc::ENOSYS) if self.policy.is_on_fault() => {
                Error::OnFaultUnsupported { op, source: e }
            }
            Some(errno @ (libc::ENOMEM | libc::EPERM)) => {
                match (LockBudget::current(), LockStatus::current()) {
                    (Ok(budget), Ok(status)) => {
                        let needed = page_round_up(status.vm_lck().saturating_add(self.len as u64));
                        // ENOMEM with room to spare means an unmapped hole.
                        if errno == libc::ENOMEM && budget.allows(needed) {
                            region_error(e)
                        } else {
                            budget.shortfall(self.policy, op, needed, Some(e))
                        }
                    }
                    _ => region_error(e),
                }
            }
            _ => region_error(e),
        }
    }
}

impl Drop for RegionLock {
    fn drop(&mut self) {
        if self.state == State::Locked {
            if let Err(e) = sys::munlock(self.addr, self.len) {
                error!(
                    "munlock of {} bytes at {:#x} failed: {e}",
                    self.len, self.addr
                );
            }
        }
    }
}

#[cfg(feature = "vm-memory")]
mod guest_memory {
    use vm_memory::{Address, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

    use super::RegionLock;
    use crate::{Error, MlockPolicy, Result};

    /// The locks of every region of a guest memory map, unlocked on drop.
    /// Made by [`MlockPolicy::lock_guest_memory`].
    #[derive(Debug)]
    #[cfg_attr(docsrs, doc(cfg(feature = "vm-memory")))]
    pub struct GuestMemoryLock {
        pub(crate) regions: Vec<RegionLock>,
    }

    impl MlockPolicy {
        /// Locks every region of `mem` (for example a `GuestMemoryMmap`)
        /// with [`lock_region`](MlockPolicy::lock_region). It checks the
        /// total against `RLIMIT_MEMLOCK` first, so a shortfall names the
        /// whole amount, and locks all regions or none.
        ///
        /// Hold the guard for as long as the memory map; lock the new map
        /// again after a memory table update.
        #[cfg_attr(docsrs, doc(cfg(feature = "vm-memory")))]
        pub fn lock_guest_memory<M: GuestMemoryBackend>(self, mem: &M) -> Result<GuestMemoryLock> {
            let mut spans = Vec::new();
            for region in mem.iter() {
                let start = region.start_addr().raw_value();
                let host = region
                    .get_host_address(MemoryRegionAddress(0))
                    .map_err(|source| Error::GuestMemory {
                        guest_addr: start,
                        source,
                    })?;
                let len = usize::try_from(region.len()).map_err(|_| Error::InvalidRegion {
                    addr: host as usize,
                    len: usize::MAX,
                    reason: "is larger than the address space",
                })?;
                spans.push((host as *const u8, len));
            }
            let total = spans
                .iter()
                .fold(0u64, |acc, (_, len)| acc.saturating_add(*len as u64));
            self.preflight_regions(total)?;
            let regions = spans
                .into_iter()
                // SAFETY: each span is a region of `mem`, guest RAM mapped
                // by its owner. mlock and munlock change no byte; a guard
                // that outlives `mem` fails to unlock (logged), as this
                // function's doc says.
                .map(|(host, len)| unsafe { self.lock_region(host, len) })
                .collect::<Result<Vec<_>>>()?;
            Ok(GuestMemoryLock { regions })
        }
    }

    impl GuestMemoryLock {
        /// The per-region guards, in the memory map's order.
        pub fn regions(&self) -> &[RegionLock] {
            &self.regions
        }

        /// Total bytes covered.
        pub fn total_len(&self) -> u64 {
            self.regions.iter().map(|r| r.len() as u64).sum()
        }
    }
}

#[cfg(feature = "vm-memory")]
pub use guest_memory::GuestMemoryLock;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_region_validation() {
        let page = sys::page_size();
        let cases: [(usize, usize, &str); 4] = [
            (page, 0, "is empty"),
            (0, page, "starts at the null address"),
            (page + 1, page, "does not start on a page boundary"),
            (
                usize::MAX - page + 1,
                2 * page,
                "wraps around the address space",
            ),
        ];
        for (addr, len, reason) in cases {
            // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
            let err = unsafe { MlockPolicy::On.lock_region(addr as *const u8, len) }.unwrap_err();
            assert!(
                matches!(err, Error::InvalidRegion { reason: r, .. } if r == reason),
                "{err}"
            );
            assert_eq!(
                err.to_string(),
                format!("invalid region of {len} bytes at {addr:#x}: it {reason}")
            );
        }
    }

    #[test]
    fn test_off_region_is_inert() {
        let page = sys::page_size();
        // Under `off` nothing is locked, so even an unmapped range is fine.
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let lock =
            unsafe { MlockPolicy::Off.lock_region(page as *const u8, 3 * page - 1) }.unwrap();
        assert!(!lock.is_locked());
        assert_eq!(lock.len(), 3 * page);
        assert_eq!(lock.addr(), page);
        assert!(!lock.is_empty());
        assert_eq!(lock.policy(), MlockPolicy::Off);
    }

    #[test]
    fn test_range_with_a_hole_is_a_region_error() {
        // Three pages with the middle one unmapped: the lock fails at the
        // hole with ENOMEM, and the first page must not stay locked.
        let page = sys::page_size();
        // SAFETY: anonymous mapping with no address hint; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        let base = ptr as usize;
        // SAFETY: the middle page belongs to the mapping above and nothing
        // refers to it.
        let ret = unsafe { libc::munmap((base + page) as *mut libc::c_void, page) };
        assert_eq!(ret, 0);
        let budget = LockBudget::current().unwrap();
        for policy in [MlockPolicy::On, MlockPolicy::OnFault] {
            // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
            let err = unsafe { policy.lock_region(base as *const u8, 3 * page) }.unwrap_err();
            if budget.has_cap_ipc_lock() {
                assert!(matches!(err, Error::LockRegion { .. }), "{err}");
                assert!(err.to_string().contains("(os error 12)"), "{err}");
            }
        }
        // SAFETY: unmaps what is left of our own mapping.
        assert_eq!(unsafe { libc::munmap(ptr, 3 * page) }, 0);
    }
}
