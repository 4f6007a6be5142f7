// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Process-wide locking with `mlockall`.

use std::io;

use log::{debug, info};

use crate::policy::MlockPolicy;
use crate::preflight::{page_round_up, LockBudget};
use crate::status::LockStatus;
use crate::{sys, Error, Result};

impl MlockPolicy {
    /// Applies the policy to the whole process with `mlockall`: every
    /// current and future mapping is locked (`on`: and faulted in now;
    /// `on-fault`: as pages are touched). `off` does nothing.
    ///
    /// Call it early, before serving: with `MCL_FUTURE` every later mapping
    /// is charged to `RLIMIT_MEMLOCK` too, so see [`preflight`] for guest RAM
    /// that arrives later. A kernel without `MCL_ONFAULT` (before 4.4) gives
    /// [`Error::OnFaultUnsupported`]; a limit that is too low gives
    /// [`Error::Insufficient`], which names the amount and the remedies.
    /// On success the call does not allocate.
    ///
    /// [`preflight`]: MlockPolicy::preflight
    pub fn apply_process(self) -> Result<()> {
        let Some(flags) = self.mlockall_flags() else {
            return Ok(());
        };
        match sys::mlockall(flags) {
            Ok(()) => {
                debug!("mlockall applied for mem-lock={self}");
                Ok(())
            }
            Err(e) => Err(self.diagnose_mlockall(e)),
        }
    }

    /// Turns an `mlockall` failure into the most useful error.
    fn diagnose_mlockall(self, e: io::Error) -> Error {
        const OP: &str = "mlockall";
        match e.raw_os_error() {
            Some(libc::EINVAL) if self.is_on_fault() => Error::OnFaultUnsupported {
                op: "mlockall(MCL_ONFAULT)",
                source: e,
            },
            Some(libc::ENOMEM | libc::EPERM | libc::EAGAIN) => {
                match (LockBudget::current(), LockStatus::current()) {
                    (Ok(budget), Ok(status)) => {
                        let needed = page_round_up(status.vm_size());
                        if budget.allows(needed) && e.raw_os_error() != Some(libc::EPERM) {
                            Error::Lock { op: OP, source: e }
                        } else {
                            budget.shortfall(self, OP, needed, Some(e))
                        }
                    }
                    _ => Error::Lock { op: OP, source: e },
                }
            }
            _ => Error::Lock { op: OP, source: e },
        }
    }

    /// Undoes [`apply_process`](MlockPolicy::apply_process) for good
    /// (`munlockall`); for `off` it does nothing.
    pub fn release_process(self) -> Result<()> {
        if !self.locks_memory() {
            return Ok(());
        }
        sys::munlockall().map_err(|source| Error::Lock {
            op: "munlockall",
            source,
        })?;
        info!("memory unlocked (mem-lock={self} released)");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_mlockall_einval_under_on_fault_is_unsupported() {
        let err =
            MlockPolicy::OnFault.diagnose_mlockall(io::Error::from_raw_os_error(libc::EINVAL));
        assert!(matches!(err, Error::OnFaultUnsupported { .. }));
        assert!(
            err.to_string().starts_with(
                "mem-lock=on-fault needs lock-on-fault support (Linux 4.4 or later), \
                 which this kernel lacks: mlockall(MCL_ONFAULT) failed: "
            ),
            "{err}"
        );
        let err = MlockPolicy::On.diagnose_mlockall(io::Error::from_raw_os_error(libc::EINVAL));
        assert!(matches!(err, Error::Lock { op: "mlockall", .. }), "{err}");
    }
}
