// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Temporary unlocks for postcopy-like flows: the guard, and the
//! `unlock_temporarily`/`with_unlocked` of the process policy and of the
//! region locks. It sits above process.rs and region.rs, which lock and
//! never import it.

use log::{error, info};

use crate::policy::MlockPolicy;
#[cfg(feature = "vm-memory")]
use crate::region::GuestMemoryLock;
use crate::region::RegionLock;
use crate::{sys, Error, Result};

/// What a [`TemporaryUnlock`] unlocked.
#[derive(Debug)]
enum Target<'a> {
    /// The whole process, to be locked again under this policy.
    Process(MlockPolicy),
    /// Some regions, to be locked again one by one.
    Regions(&'a mut [RegionLock]),
}

/// Memory unlocked for a while; locks it again on [`relock`] or on drop.
///
/// Made by [`MlockPolicy::unlock_temporarily`] (process-wide) or
/// `unlock_temporarily` on a [`RegionLock`] or `GuestMemoryLock`. QEMU's
/// postcopy unlocks this way, since faults into userfaultfd-registered
/// memory must not be forced by the lock, and re-locks once the guest RAM
/// is complete.
///
/// Re-locking can fail (the limit may have been lowered, memory may be
/// short). [`relock`] returns that as [`Error::Relock`]; dropping the guard
/// without calling it re-locks too and logs a failure at `error!`. It never
/// panics.
///
/// [`relock`]: TemporaryUnlock::relock
#[derive(Debug)]
#[must_use = "dropping the guard re-locks the memory at once"]
pub struct TemporaryUnlock<'a> {
    target: Target<'a>,
    pending: bool,
}

impl<'a> TemporaryUnlock<'a> {
    /// Unlocks the whole process if the policy locks memory.
    pub(crate) fn process(policy: MlockPolicy) -> Result<TemporaryUnlock<'static>> {
        if policy.locks_memory() {
            sys::munlockall().map_err(|source| Error::Lock {
                op: "munlockall",
                source,
            })?;
            info!("memory unlocked temporarily (mem-lock={policy})");
        }
        Ok(TemporaryUnlock {
            target: Target::Process(policy),
            pending: policy.locks_memory(),
        })
    }

    /// Unlocks the locked ones among `regions`. If one fails, the ones
    /// already unlocked are locked again and the error is returned.
    pub(crate) fn regions(regions: &'a mut [RegionLock]) -> Result<TemporaryUnlock<'a>> {
        let mut failure = None;
        for region in regions.iter_mut() {
            if let Err(e) = region.suspend() {
                failure = Some(e);
                break;
            }
        }
        let mut guard = TemporaryUnlock {
            target: Target::Regions(regions),
            pending: true,
        };
        if let Some(e) = failure {
            guard.pending = false;
            if let Err(relock) = guard.lock_again() {
                error!("{relock}");
            }
            return Err(e);
        }
        Ok(guard)
    }

    /// Locks the memory again and reports whether that worked. After an
    /// error the memory stays unlocked (regions that could be re-locked
    /// are); a later `unlock_temporarily` and `relock` may try again.
    pub fn relock(mut self) -> Result<()> {
        self.pending = false;
        self.lock_again()
    }

    fn lock_again(&mut self) -> Result<()> {
        match &mut self.target {
            Target::Process(policy) => {
                policy
                    .apply_process()
                    .map_err(|e| Error::Relock(Box::new(e)))?;
                info!("memory locked again (mem-lock={policy})");
                Ok(())
            }
            Target::Regions(regions) => {
                // Try every region, so that one failure does not leave the
                // others unlocked; report the first failure.
                let mut first = None;
                for region in regions.iter_mut().filter(|r| r.is_suspended()) {
                    if let Err(e) = region.lock() {
                        first.get_or_insert(e);
                    }
                }
                match first {
                    None => Ok(()),
                    Some(e) => Err(Error::Relock(Box::new(e))),
                }
            }
        }
    }
}

impl Drop for TemporaryUnlock<'_> {
    fn drop(&mut self) {
        if self.pending {
            self.pending = false;
            if let Err(e) = self.lock_again() {
                error!("{e}");
            }
        }
    }
}

impl MlockPolicy {
    /// Unlocks the whole process (`munlockall`) until the returned guard is
    /// released, for postcopy-like flows that need unlocked memory for a
    /// while. [`TemporaryUnlock::relock`] re-applies the policy and reports
    /// a failure; dropping the guard re-applies it too and logs a failure.
    /// For `off` the guard does nothing. Meant for a process that applied
    /// the policy: the re-lock applies it whether or not it was applied
    /// before.
    ///
    /// `munlockall` also clears the locks of any [`RegionLock`] in the
    /// process.
    pub fn unlock_temporarily(self) -> Result<TemporaryUnlock<'static>> {
        TemporaryUnlock::process(self)
    }

    /// Runs `f` with the process unlocked and re-applies the policy after.
    /// A failed re-lock is [`Error::Relock`] (the value of `f` is then
    /// dropped: use [`unlock_temporarily`] to keep it). If `f` panics, the
    /// policy is re-applied while unwinding.
    ///
    /// [`unlock_temporarily`]: MlockPolicy::unlock_temporarily
    pub fn with_unlocked<T>(self, f: impl FnOnce() -> T) -> Result<T> {
        let guard = self.unlock_temporarily()?;
        let value = f();
        guard.relock()?;
        Ok(value)
    }
}

impl RegionLock {
    /// Unlocks the range until the returned guard re-locks it (explicitly
    /// with [`TemporaryUnlock::relock`], which reports failure, or on drop,
    /// which logs it).
    pub fn unlock_temporarily(&mut self) -> Result<TemporaryUnlock<'_>> {
        TemporaryUnlock::regions(std::slice::from_mut(self))
    }

    /// Runs `f` with the range unlocked and locks it again after; a failed
    /// re-lock is [`Error::Relock`]. If `f` panics, the range is re-locked
    /// while unwinding.
    pub fn with_unlocked<T>(&mut self, f: impl FnOnce() -> T) -> Result<T> {
        let guard = self.unlock_temporarily()?;
        let value = f();
        guard.relock()?;
        Ok(value)
    }
}

#[cfg(feature = "vm-memory")]
impl GuestMemoryLock {
    /// Unlocks every region until the guard re-locks them.
    pub fn unlock_temporarily(&mut self) -> Result<TemporaryUnlock<'_>> {
        TemporaryUnlock::regions(&mut self.regions)
    }

    /// Runs `f` with every region unlocked and locks them again after;
    /// a failed re-lock is [`Error::Relock`].
    pub fn with_unlocked<T>(&mut self, f: impl FnOnce() -> T) -> Result<T> {
        let guard = self.unlock_temporarily()?;
        let value = f();
        guard.relock()?;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_off_is_a_no_op() {
        MlockPolicy::Off.apply_process().unwrap();
        MlockPolicy::Off.release_process().unwrap();
        assert_eq!(MlockPolicy::Off.with_unlocked(|| 7).unwrap(), 7);
    }
}
