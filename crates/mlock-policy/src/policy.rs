// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The policy value, its parsing, and process-wide locking.

use std::fmt;
use std::io;
use std::str::FromStr;

use log::{debug, info};

use crate::preflight::{page_round_up, LockBudget};
use crate::status::LockStatus;
use crate::unlock::TemporaryUnlock;
use crate::{sys, Error, Result};

/// How a VMM locks guest memory, as in QEMU's `-overcommit mem-lock=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum MlockPolicy {
    /// Nothing is locked (`off`).
    #[default]
    Off,
    /// Everything is locked and faulted in now (`on`): `MCL_CURRENT |
    /// MCL_FUTURE`, or `mlock` per region. Resident memory jumps to the full
    /// size of every mapping.
    On,
    /// Pages are locked as they are first touched (`on-fault`):
    /// `MCL_ONFAULT`, or `mlock2(MLOCK_ONFAULT)` per region. Resident memory
    /// stays as it was; the lock accounting is still the full size.
    OnFault,
}

impl MlockPolicy {
    /// The accepted spellings, in order.
    pub const VALUES: [&'static str; 3] = ["off", "on", "on-fault"];

    /// The spelling `FromStr` accepts and `Display` prints.
    pub const fn as_str(self) -> &'static str {
        match self {
            MlockPolicy::Off => "off",
            MlockPolicy::On => "on",
            MlockPolicy::OnFault => "on-fault",
        }
    }

    /// Whether memory gets locked at all (`on` or `on-fault`). A consumer
    /// that cannot work with locked memory, as virtio-mem cannot, refuses to
    /// start when this is true.
    pub const fn locks_memory(self) -> bool {
        !matches!(self, MlockPolicy::Off)
    }

    /// Whether pages are locked only once touched (`on-fault`).
    pub const fn is_on_fault(self) -> bool {
        matches!(self, MlockPolicy::OnFault)
    }

    /// Whether discarding guest pages (balloon inflation, virtio-mem
    /// unplug, free page reporting) fits this policy. Only `off` allows it:
    /// `MADV_DONTNEED` fails with `EINVAL` on locked mappings, and giving
    /// locked memory back defeats the lock, under `on-fault` too. QEMU draws
    /// the same line.
    pub const fn allows_discard(self) -> bool {
        !self.locks_memory()
    }

    /// The `mlockall` flags of this policy; `None` for `off`.
    fn mlockall_flags(self) -> Option<libc::c_int> {
        match self {
            MlockPolicy::Off => None,
            MlockPolicy::On => Some(libc::MCL_CURRENT | libc::MCL_FUTURE),
            MlockPolicy::OnFault => Some(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT),
        }
    }

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
    ///
    /// [`RegionLock`]: crate::RegionLock
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

impl fmt::Display for MlockPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MlockPolicy {
    type Err = Error;

    /// Accepts exactly `off`, `on` and `on-fault`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "off" => Ok(MlockPolicy::Off),
            "on" => Ok(MlockPolicy::On),
            "on-fault" => Ok(MlockPolicy::OnFault),
            _ => {
                // Keep the message one readable line whatever was passed.
                const MAX: usize = 64;
                let shown: String = s.chars().take(MAX).collect();
                let shown = if shown.len() < s.len() {
                    format!("{shown}...")
                } else {
                    shown
                };
                Err(Error::InvalidPolicy(shown))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [MlockPolicy; 3] = [MlockPolicy::Off, MlockPolicy::On, MlockPolicy::OnFault];

    #[test]
    fn test_parse_accepted_values() {
        assert_eq!("off".parse::<MlockPolicy>().unwrap(), MlockPolicy::Off);
        assert_eq!("on".parse::<MlockPolicy>().unwrap(), MlockPolicy::On);
        assert_eq!(
            "on-fault".parse::<MlockPolicy>().unwrap(),
            MlockPolicy::OnFault
        );
    }

    #[test]
    fn test_display_round_trips() {
        for policy in ALL {
            assert_eq!(policy.to_string().parse::<MlockPolicy>().unwrap(), policy);
        }
        let shown: Vec<String> = ALL.iter().map(|p| p.to_string()).collect();
        assert_eq!(shown, MlockPolicy::VALUES);
    }

    #[test]
    fn test_parse_rejects_other_strings() {
        for bad in [
            "",
            "ON",
            "Off",
            "true",
            "false",
            "yes",
            "1",
            "onfault",
            "on_fault",
            "on-fault ",
            " on",
            "on-fault\n",
            "on-fault=1",
            "mem-lock=on",
            "o\u{301}n",
        ] {
            let err = bad.parse::<MlockPolicy>().unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("invalid mem-lock policy {bad:?}: expected one of off, on, on-fault"),
            );
        }
    }

    #[test]
    fn test_parse_error_truncates_long_input() {
        let long = "x".repeat(10_000);
        let msg = long.parse::<MlockPolicy>().unwrap_err().to_string();
        assert!(msg.len() < 150, "{msg}");
        assert!(msg.contains("...\""), "{msg}");
        // Multi-byte characters are cut on a character boundary.
        let wide = "\u{e9}".repeat(100);
        assert!(wide.parse::<MlockPolicy>().is_err());
    }

    #[test]
    fn test_queries() {
        assert!(!MlockPolicy::Off.locks_memory());
        assert!(MlockPolicy::On.locks_memory());
        assert!(MlockPolicy::OnFault.locks_memory());
        assert!(MlockPolicy::OnFault.is_on_fault());
        assert!(!MlockPolicy::On.is_on_fault());
        assert!(!MlockPolicy::Off.is_on_fault());
        assert!(MlockPolicy::Off.allows_discard());
        assert!(!MlockPolicy::On.allows_discard());
        assert!(!MlockPolicy::OnFault.allows_discard());
        assert_eq!(MlockPolicy::default(), MlockPolicy::Off);
    }

    #[test]
    fn test_off_is_a_no_op() {
        MlockPolicy::Off.apply_process().unwrap();
        MlockPolicy::Off.release_process().unwrap();
        assert_eq!(MlockPolicy::Off.with_unlocked(|| 7).unwrap(), 7);
    }

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

    #[test]
    fn test_parse_accepts_nothing_else_over_short_strings() {
        // Every string of up to 3 characters over an alphabet that can
        // spell the accepted values: only "on" and "off" may parse.
        let alphabet = ['o', 'n', 'f', '-', 'a', 'u', 'l', 't', 'O', ' '];
        let mut accepted = Vec::new();
        let mut check = |s: &str| {
            if let Ok(p) = s.parse::<MlockPolicy>() {
                assert_eq!(p.as_str(), s);
                accepted.push(s.to_string());
            }
        };
        check("");
        for a in alphabet {
            check(&a.to_string());
            for b in alphabet {
                check(&format!("{a}{b}"));
                for c in alphabet {
                    check(&format!("{a}{b}{c}"));
                }
            }
        }
        assert_eq!(accepted, ["on", "off"]);
    }
}
