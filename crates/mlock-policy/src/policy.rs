// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The policy value and its parsing.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

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
    pub(crate) fn mlockall_flags(self) -> Option<libc::c_int> {
        match self {
            MlockPolicy::Off => None,
            MlockPolicy::On => Some(libc::MCL_CURRENT | libc::MCL_FUTURE),
            MlockPolicy::OnFault => Some(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT),
        }
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
