// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Capability dropping (`--modcaps`).
//!
//! The daemon keeps only what its security model needs ([`for_model`]),
//! plus `CAP_IPC_LOCK` when `--mlock` is on, then `--modcaps`. Everything
//! else leaves the effective, permitted, inheritable, ambient and bounding
//! sets.
//!
//! | capability | passthrough | mapped-xattr, none | read-only | needed by |
//! |---|---|---|---|---|
//! | `chown` | yes | - | - | Tsetattr uid/gid, guest owner on Tlcreate, Tmkdir, Tmknod, Tsymlink |
//! | `dac_override` | yes | yes | yes | any guest user's I/O on files the daemon does not own |
//! | `dac_read_search` | yes | yes | yes | Tlink (`linkat(AT_EMPTY_PATH)`), walks into unreadable directories |
//! | `fowner` | yes | yes | yes | Tsetattr times and mode, xattrs on files the daemon does not own |
//! | `fsetid` | yes | - | - | guest set-group-ID bits on files of a group the daemon is not in |
//! | `mknod` | yes | - | - | Tmknod of character and block devices |
//!
//! No model keeps `setfcap`: passthrough and none refuse
//! `security.capability` (as QEMU does) and mapped-xattr stores it as
//! `user.virtfs.security.capability`. Mapped-xattr keeps every guest
//! attribute in `user.virtfs.*` on files the daemon owns, and none
//! refuses device nodes and set-id bits itself, so neither needs
//! `chown`, `fsetid` or `mknod` either.

use super::{sys_err, Error, Result};
use virtio_9p_server::SecurityModel;

/// Capability names and numbers (linux/capability.h).
pub const CAP_NAMES: &[(&str, u32)] = &[
    ("chown", 0),
    ("dac_override", 1),
    ("dac_read_search", 2),
    ("fowner", 3),
    ("fsetid", 4),
    ("kill", 5),
    ("setgid", 6),
    ("setuid", 7),
    ("setpcap", 8),
    ("linux_immutable", 9),
    ("net_bind_service", 10),
    ("net_broadcast", 11),
    ("net_admin", 12),
    ("net_raw", 13),
    ("ipc_lock", 14),
    ("ipc_owner", 15),
    ("sys_module", 16),
    ("sys_rawio", 17),
    ("sys_chroot", 18),
    ("sys_ptrace", 19),
    ("sys_pacct", 20),
    ("sys_admin", 21),
    ("sys_boot", 22),
    ("sys_nice", 23),
    ("sys_resource", 24),
    ("sys_time", 25),
    ("sys_tty_config", 26),
    ("mknod", 27),
    ("lease", 28),
    ("audit_write", 29),
    ("audit_control", 30),
    ("setfcap", 31),
    ("mac_override", 32),
    ("mac_admin", 33),
    ("syslog", 34),
    ("wake_alarm", 35),
    ("block_suspend", 36),
    ("audit_read", 37),
    ("perfmon", 38),
    ("bpf", 39),
    ("checkpoint_restore", 40),
];

/// `CAP_IPC_LOCK`, added for `--mlock on|on-fault`.
pub const CAP_IPC_LOCK: u32 = 14;

/// What a writable passthrough export keeps: change ownership (`chown`),
/// bypass file permissions for any guest user (`dac_override`,
/// `dac_read_search`, which `linkat(AT_EMPTY_PATH)` needs), act as owner
/// (`fowner`), keep set-id bits (`fsetid`) and create device nodes
/// (`mknod`). The server never switches ids, so `setuid`/`setgid` are not
/// kept, and it refuses `security.capability`, so `setfcap` is not either.
pub const DEFAULT_CAPS: &[u32] = &[0, 1, 2, 3, 4, 27];

/// What a writable mapped-xattr export keeps: `dac_override`,
/// `dac_read_search` and `fowner`, for files in the export the daemon
/// does not own (created on the host). Ownership, set-id bits, device
/// nodes and capabilities are `user.virtfs.*` attributes.
pub const MAPPED_CAPS: &[u32] = &[1, 2, 3];

/// What a writable none export keeps: the same as [`MAPPED_CAPS`]; chown
/// failures are ignored and set-id bits, device nodes, `security.*` and
/// `trusted.*` are refused by the model.
pub const NONE_CAPS: &[u32] = &[1, 2, 3];

/// What a read-only export keeps, in every model.
pub const READONLY_CAPS: &[u32] = &[1, 2, 3];

/// The capabilities an export in `model` keeps (see the module table).
pub fn for_model(model: SecurityModel, readonly: bool) -> &'static [u32] {
    match model {
        _ if readonly => READONLY_CAPS,
        SecurityModel::Passthrough => DEFAULT_CAPS,
        SecurityModel::MappedXattr => MAPPED_CAPS,
        SecurityModel::None => NONE_CAPS,
        // A model added later keeps the default set until it gets its own.
        _ => DEFAULT_CAPS,
    }
}

/// The name of a capability number.
pub fn cap_name(cap: u32) -> String {
    CAP_NAMES
        .iter()
        .find(|(_, n)| *n == cap)
        .map_or_else(|| format!("cap_{cap}"), |(s, _)| (*s).to_string())
}

fn cap_number(name: &str) -> Option<u32> {
    let name = name.trim().to_ascii_lowercase();
    let name = name.strip_prefix("cap_").unwrap_or(&name);
    CAP_NAMES.iter().find(|(s, _)| *s == name).map(|(_, n)| *n)
}

/// A set of capabilities as a bit mask (bit N = capability N).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CapSet(pub u64);

impl CapSet {
    /// The set of these capabilities.
    pub fn of(caps: &[u32]) -> Self {
        CapSet(caps.iter().fold(0, |m, c| m | (1u64 << c)))
    }

    /// Whether `cap` is in the set.
    pub fn contains(self, cap: u32) -> bool {
        cap < 64 && self.0 & (1u64 << cap) != 0
    }

    /// Applies `--modcaps`: comma- or colon-separated `+name` / `-name`
    /// (`cap_` prefix optional), for example `+sys_admin,-mknod`.
    pub fn modify(self, spec: &str) -> Result<Self> {
        let mut m = self.0;
        for item in spec.split([',', ':']).filter(|s| !s.trim().is_empty()) {
            let item = item.trim();
            // strip_prefix, not split_at(1): a multi-byte first character
            // must be an error, not a panic.
            let (add, name) = if let Some(n) = item.strip_prefix('+') {
                (true, n)
            } else if let Some(n) = item.strip_prefix('-') {
                (false, n)
            } else {
                return Err(Error::ModcapsSyntax(item.to_owned()));
            };
            let cap = cap_number(name).ok_or_else(|| Error::UnknownCapability(name.to_owned()))?;
            if add {
                m |= 1 << cap;
            } else {
                m &= !(1 << cap);
            }
        }
        Ok(CapSet(m))
    }

    /// The names in the set, comma separated.
    pub fn names(self) -> String {
        (0..64)
            .filter(|c| self.contains(*c))
            .map(cap_name)
            .collect::<Vec<_>>()
            .join(",")
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_V3: u32 = 0x2008_0522;

/// The highest capability the running kernel knows, probed with
/// `PR_CAPBSET_READ` (which fails with `EINVAL` past it), as libcap does.
/// It needs no `/proc`, so it is right after `pivot_root` too, where
/// `/proc/sys` is not reachable.
pub fn last_cap() -> u32 {
    let known = |cap: u32| {
        // SAFETY: prctl with integer arguments; it only reads.
        unsafe { libc::prctl(libc::PR_CAPBSET_READ, libc::c_ulong::from(cap), 0, 0, 0) >= 0 }
    };
    // Binary search over 0..64 for the first unknown capability.
    let (mut lo, mut hi) = (0u32, 64u32);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if known(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo.saturating_sub(1)
}

/// The calling thread's permitted set.
pub fn permitted() -> Result<CapSet> {
    let mut hdr = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget with a v3 header and two data structs, as it requires.
    if unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) } != 0 {
        return Err(sys_err("capget"));
    }
    Ok(CapSet(
        u64::from(data[0].permitted) | (u64::from(data[1].permitted) << 32),
    ))
}

/// Reduces every capability set of the process to `keep` (intersected
/// with what it holds): the bounding set first (needs `CAP_SETPCAP`, which
/// is dropped last), then the ambient set, then effective, permitted and
/// inheritable with `capset`. Returns the set kept. Call it before any
/// thread starts: capabilities are per thread.
pub fn drop_to(keep: CapSet) -> Result<CapSet> {
    let held = permitted()?;
    let keep = CapSet(keep.0 & held.0);
    let last = last_cap();
    log::debug!("kernel capabilities 0..={last}");
    for cap in 0..=last {
        if keep.contains(cap) {
            continue;
        }
        // SAFETY: prctl with integer arguments.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            // EINVAL: a capability this kernel lacks; EPERM: no CAP_SETPCAP
            // (unprivileged), where the bounding set cannot matter.
            if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EPERM)) {
                return Err(Error::BoundingSet {
                    cap: cap_name(cap),
                    source: e,
                });
            }
        }
    }
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    let mut hdr = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let lo = keep.0 as u32;
    let hi = (keep.0 >> 32) as u32;
    let data = [
        CapData {
            effective: lo,
            permitted: lo,
            inheritable: 0,
        },
        CapData {
            effective: hi,
            permitted: hi,
            inheritable: 0,
        },
    ];
    // SAFETY: capset with a v3 header and two data structs.
    if unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) } != 0 {
        return Err(sys_err("capset"));
    }
    Ok(keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_modcaps_parsing() {
        let base = CapSet::of(DEFAULT_CAPS);
        let m = base
            .modify("+sys_admin,-mknod:+CAP_SETFCAP,-setfcap")
            .unwrap();
        assert!(m.contains(21) && !m.contains(27) && !m.contains(31) && m.contains(0));
        assert!(base.modify("sys_admin").is_err());
        assert!(base.modify("+nonsense").is_err());
        assert_eq!(base.modify("").unwrap(), base);
        assert_eq!(
            base.names(),
            "chown,dac_override,dac_read_search,fowner,fsetid,mknod"
        );
    }

    #[test]
    fn test_modcaps_non_ascii_is_an_error() {
        let base = CapSet::of(DEFAULT_CAPS);
        for spec in ["é", "ésys_admin", "+sys_admin,€mknod", "\u{1F600}"] {
            let e = base.modify(spec).unwrap_err();
            assert!(
                e.to_string().contains("expected +name or -name"),
                "{spec}: {e}"
            );
        }
        let e = base.modify("+é").unwrap_err();
        assert_eq!(
            e.to_string(),
            "sandbox: --modcaps: unknown capability \"é\""
        );
    }

    #[test]
    fn test_last_cap_matches_the_kernel() {
        let want: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(last_cap(), want);
    }

    #[test]
    fn test_caps_follow_the_model() {
        let privileged = [0u32, 4, 27, 31];
        for model in [SecurityModel::MappedXattr, SecurityModel::None] {
            let set = CapSet::of(for_model(model, false));
            assert!(privileged.iter().all(|c| !set.contains(*c)), "{model}");
            assert_eq!(set.names(), "dac_override,dac_read_search,fowner");
        }
        assert_eq!(for_model(SecurityModel::Passthrough, false), DEFAULT_CAPS);
        for model in [
            SecurityModel::Passthrough,
            SecurityModel::MappedXattr,
            SecurityModel::None,
        ] {
            assert_eq!(for_model(model, true), READONLY_CAPS);
        }
    }
}
