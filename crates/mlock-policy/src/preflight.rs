// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The pre-flight check: `RLIMIT_MEMLOCK` and `CAP_IPC_LOCK` against what a
//! lock needs, and the actionable error when they fall short.

use std::fmt;
use std::io;

use crate::status::LockStatus;
use crate::{sys, Error, MlockPolicy, Result};

/// What the kernel checks before it locks memory for this thread:
/// `RLIMIT_MEMLOCK` and `CAP_IPC_LOCK` (which bypasses the limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockBudget {
    soft_limit: Option<u64>,
    hard_limit: Option<u64>,
    cap_ipc_lock: bool,
}

impl LockBudget {
    /// Reads the limits of the process and the capabilities of the calling
    /// thread.
    pub fn current() -> Result<LockBudget> {
        let (soft_limit, hard_limit) = sys::memlock_limits().map_err(|source| Error::Probe {
            what: "getrlimit(RLIMIT_MEMLOCK)",
            source,
        })?;
        let cap_ipc_lock = sys::has_cap_ipc_lock().map_err(|source| Error::Probe {
            what: "capget",
            source,
        })?;
        Ok(LockBudget {
            soft_limit,
            hard_limit,
            cap_ipc_lock,
        })
    }

    /// The soft `RLIMIT_MEMLOCK` in bytes (the one enforced); `None` is
    /// unlimited.
    pub fn soft_limit(&self) -> Option<u64> {
        self.soft_limit
    }

    /// The hard `RLIMIT_MEMLOCK` in bytes: the most an unprivileged
    /// `ulimit -l` can raise the soft limit to; `None` is unlimited.
    pub fn hard_limit(&self) -> Option<u64> {
        self.hard_limit
    }

    /// Whether the thread has `CAP_IPC_LOCK`, which lifts the limit.
    pub fn has_cap_ipc_lock(&self) -> bool {
        self.cap_ipc_lock
    }

    /// Whether `bytes` of lock accounting (the kernel's `VmLck`) is allowed.
    pub fn allows(&self, bytes: u64) -> bool {
        self.cap_ipc_lock || self.soft_limit.is_none_or(|limit| bytes <= limit)
    }

    /// `Ok` if `needed` bytes fit, else the actionable
    /// [`Error::Insufficient`] for `op` under `policy`.
    pub fn check(&self, policy: MlockPolicy, op: &'static str, needed: u64) -> Result<()> {
        if self.allows(needed) {
            Ok(())
        } else {
            Err(self.shortfall(policy, op, needed, None))
        }
    }

    pub(crate) fn shortfall(
        &self,
        policy: MlockPolicy,
        op: &'static str,
        needed: u64,
        source: Option<io::Error>,
    ) -> Error {
        Error::Insufficient(Box::new(Shortfall {
            policy,
            op,
            needed,
            budget: *self,
            source,
        }))
    }
}

impl fmt::Display for LockBudget {
    /// For logs: `RLIMIT_MEMLOCK 8.0 MiB (8388608 bytes) (hard 8.0 MiB
    /// (8388608 bytes)), CAP_IPC_LOCK yes`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |limit: Option<u64>| match limit {
            Some(bytes) => Bytes(bytes).to_string(),
            None => "unlimited".to_string(),
        };
        write!(
            f,
            "RLIMIT_MEMLOCK {} (hard {}), CAP_IPC_LOCK {}",
            show(self.soft_limit),
            show(self.hard_limit),
            if self.cap_ipc_lock { "yes" } else { "no" }
        )
    }
}

/// Why memory could not be locked, with the remedies. Its `Display` is the
/// message a daemon prints before it exits.
#[derive(Debug)]
pub struct Shortfall {
    policy: MlockPolicy,
    op: &'static str,
    needed: u64,
    budget: LockBudget,
    source: Option<io::Error>,
}

impl Shortfall {
    /// The policy being applied.
    pub fn policy(&self) -> MlockPolicy {
        self.policy
    }

    /// Bytes of lock accounting the operation needs.
    pub fn needed(&self) -> u64 {
        self.needed
    }

    /// The limits in force when the check or the lock failed.
    pub fn budget(&self) -> LockBudget {
        self.budget
    }

    /// The failed system call's error, when a call failed (rather than the
    /// pre-flight check).
    pub fn os_error(&self) -> Option<&io::Error> {
        self.source.as_ref()
    }
}

impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = match self.budget.soft_limit {
            Some(limit) => Bytes(limit).to_string(),
            None => "unlimited".to_string(),
        };
        write!(
            f,
            "cannot lock memory for mem-lock={}: {} needs {} of locked memory \
             but RLIMIT_MEMLOCK is {} and the process lacks CAP_IPC_LOCK",
            self.policy,
            self.op,
            Bytes(self.needed),
            limit
        )?;
        if let Some(source) = &self.source {
            write!(f, " ({}: {})", self.op, source)?;
        }
        let kib = self.needed.div_ceil(1024);
        write!(
            f,
            "; to fix, raise the limit to at least {kib} KiB (`ulimit -l {kib}` \
             in the launching shell, or `LimitMEMLOCK={}` or `LimitMEMLOCK=infinity` \
             in the systemd unit)",
            kib * 1024
        )?;
        if let Some(hard) = self.budget.hard_limit.filter(|hard| *hard < self.needed) {
            write!(
                f,
                " [the hard limit is {}, so only root can raise it: `memlock` in \
                 /etc/security/limits.conf or `LimitMEMLOCK=`]",
                Bytes(hard)
            )?;
        }
        write!(
            f,
            ", or grant CAP_IPC_LOCK (`AmbientCapabilities=CAP_IPC_LOCK` in the \
             systemd unit, or `setcap cap_ipc_lock+ep` on the binary)"
        )
    }
}

/// A byte count shown as `2.0 GiB (2147483648 bytes)`.
pub(crate) struct Bytes(pub(crate) u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
        if self.0 < 1024 {
            return write!(f, "{} bytes", self.0);
        }
        let mut value = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        write!(f, "{value:.1} {} ({} bytes)", UNITS[unit], self.0)
    }
}

/// Rounds up to whole pages, saturating.
pub(crate) fn page_round_up(bytes: u64) -> u64 {
    let page = sys::page_size() as u64;
    bytes
        .checked_next_multiple_of(page)
        .unwrap_or(u64::MAX - (u64::MAX % page))
}

impl MlockPolicy {
    /// Checks, without locking anything, that [`apply_process`] will be
    /// allowed now and that `extra` more bytes can be mapped afterwards
    /// (guest RAM mapped later, as a vhost-user backend does on
    /// `SET_MEM_TABLE`; with `MCL_FUTURE` every new mapping is locked and
    /// checked against the limit, and `mmap` fails with `EAGAIN` past it).
    ///
    /// `on` and `on-fault` need the same limit: the kernel charges a
    /// lock-on-fault mapping in full even though it is not resident. For
    /// `on-fault` this also checks kernel support. `off` always passes.
    ///
    /// [`apply_process`]: MlockPolicy::apply_process
    pub fn preflight(self, extra: u64) -> Result<()> {
        if !self.locks_memory() {
            return Ok(());
        }
        self.probe_onfault_support()?;
        let status = LockStatus::current()?;
        let needed = page_round_up(status.vm_size().saturating_add(extra));
        LockBudget::current()?.check(self, "mlockall", needed)
    }

    /// Checks, without locking anything, that `bytes` more of guest RAM can
    /// be locked region by region ([`lock_region`]), on top of what this
    /// process has locked already. `off` always passes.
    ///
    /// [`lock_region`]: MlockPolicy::lock_region
    pub fn preflight_regions(self, bytes: u64) -> Result<()> {
        if !self.locks_memory() {
            return Ok(());
        }
        self.probe_onfault_support()?;
        let status = LockStatus::current()?;
        let needed = page_round_up(status.vm_lck().saturating_add(bytes));
        LockBudget::current()?.check(self, "mlock", needed)
    }

    /// For `on-fault`, checks that the kernel supports `MLOCK_ONFAULT`;
    /// other policies pass.
    fn probe_onfault_support(self) -> Result<()> {
        if self.is_on_fault() {
            sys::probe_onfault().map_err(|source| Error::OnFaultUnsupported {
                op: "mlock2(MLOCK_ONFAULT)",
                source,
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn budget(soft: Option<u64>, hard: Option<u64>, cap: bool) -> LockBudget {
        LockBudget {
            soft_limit: soft,
            hard_limit: hard,
            cap_ipc_lock: cap,
        }
    }

    #[test]
    fn test_bytes_display() {
        assert_eq!(Bytes(512).to_string(), "512 bytes");
        assert_eq!(Bytes(8 * MIB).to_string(), "8.0 MiB (8388608 bytes)");
        assert_eq!(Bytes(2 * GIB).to_string(), "2.0 GiB (2147483648 bytes)");
        assert_eq!(Bytes(1536).to_string(), "1.5 KiB (1536 bytes)");
    }

    #[test]
    fn test_budget_display() {
        assert_eq!(
            budget(Some(8 * MIB), None, true).to_string(),
            "RLIMIT_MEMLOCK 8.0 MiB (8388608 bytes) (hard unlimited), CAP_IPC_LOCK yes"
        );
    }

    #[test]
    fn test_budget_allows() {
        assert!(budget(Some(8 * MIB), Some(8 * MIB), false).allows(8 * MIB));
        assert!(!budget(Some(8 * MIB), Some(8 * MIB), false).allows(8 * MIB + 1));
        assert!(budget(Some(8 * MIB), Some(8 * MIB), true).allows(u64::MAX));
        assert!(budget(None, None, false).allows(u64::MAX));
        assert!(!budget(Some(0), Some(0), false).allows(1));
    }

    #[test]
    fn test_shortfall_message_names_amount_and_remedies() {
        let err = budget(Some(8 * MIB), None, false)
            .check(MlockPolicy::On, "mlockall", 2 * GIB)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot lock memory for mem-lock=on: mlockall needs 2.0 GiB (2147483648 bytes) \
             of locked memory but RLIMIT_MEMLOCK is 8.0 MiB (8388608 bytes) and the process \
             lacks CAP_IPC_LOCK; to fix, raise the limit to at least 2097152 KiB \
             (`ulimit -l 2097152` in the launching shell, or `LimitMEMLOCK=2147483648` or \
             `LimitMEMLOCK=infinity` in the systemd unit), or grant CAP_IPC_LOCK \
             (`AmbientCapabilities=CAP_IPC_LOCK` in the systemd unit, or \
             `setcap cap_ipc_lock+ep` on the binary)"
        );
    }

    #[test]
    fn test_shortfall_message_mentions_low_hard_limit_and_os_error() {
        let b = budget(Some(MIB), Some(4 * MIB), false);
        let err = b.shortfall(
            MlockPolicy::OnFault,
            "mlock2(MLOCK_ONFAULT)",
            64 * MIB,
            Some(io::Error::from_raw_os_error(libc::ENOMEM)),
        );
        let msg = err.to_string();
        assert!(
            msg.starts_with(
                "cannot lock memory for mem-lock=on-fault: mlock2(MLOCK_ONFAULT) needs \
                 64.0 MiB (67108864 bytes) of locked memory but RLIMIT_MEMLOCK is 1.0 MiB \
                 (1048576 bytes) and the process lacks CAP_IPC_LOCK (mlock2(MLOCK_ONFAULT): "
            ),
            "{msg}"
        );
        assert!(msg.contains("(os error 12)"), "{msg}");
        assert!(
            msg.contains(
                "[the hard limit is 4.0 MiB (4194304 bytes), so only root can raise it: \
                 `memlock` in /etc/security/limits.conf or `LimitMEMLOCK=`]"
            ),
            "{msg}"
        );
        match err {
            Error::Insufficient(s) => {
                assert_eq!(s.needed(), 64 * MIB);
                assert_eq!(s.policy(), MlockPolicy::OnFault);
                assert_eq!(s.budget().hard_limit(), Some(4 * MIB));
                assert_eq!(s.os_error().unwrap().raw_os_error(), Some(libc::ENOMEM));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn test_check_passes_with_capability() {
        budget(Some(0), Some(0), true)
            .check(MlockPolicy::On, "mlockall", 64 * GIB)
            .unwrap();
    }

    #[test]
    fn test_off_preflight_always_passes() {
        MlockPolicy::Off.preflight(u64::MAX).unwrap();
        MlockPolicy::Off.preflight_regions(u64::MAX).unwrap();
    }

    #[test]
    fn test_page_round_up() {
        let page = sys::page_size() as u64;
        assert_eq!(page_round_up(0), 0);
        assert_eq!(page_round_up(1), page);
        assert_eq!(page_round_up(page), page);
        assert!(page_round_up(u64::MAX) >= u64::MAX - page);
    }
}
