// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The lock status of a process, read from `/proc/<pid>/status` and
//! `/proc/<pid>/smaps_rollup`.

use std::io;

use crate::{Error, Result};

/// Memory figures of one process, in bytes.
///
/// `VmLck` is the kernel's lock *accounting* (`mm->locked_vm`, the figure
/// checked against `RLIMIT_MEMLOCK`): it counts the whole size of every
/// locked mapping as soon as it is locked, including lock-on-fault mappings
/// whose pages were never touched. The resident locked memory, which grows
/// as lock-on-fault pages are touched, is `Locked:` in `smaps_rollup`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockStatus {
    vm_size: u64,
    vm_rss: u64,
    vm_lck: u64,
    locked_resident: Option<u64>,
}

impl LockStatus {
    /// Reads the status of the calling process.
    pub fn current() -> Result<LockStatus> {
        Self::read("/proc/self/status", "/proc/self/smaps_rollup")
    }

    /// Reads the status of another process (for example a peer VMM); needs
    /// the usual ptrace-read permission for `smaps_rollup`, and leaves
    /// `locked_resident()` empty without it.
    pub fn of_pid(pid: u32) -> Result<LockStatus> {
        Self::read(
            &format!("/proc/{pid}/status"),
            &format!("/proc/{pid}/smaps_rollup"),
        )
    }

    fn read(status_path: &str, rollup_path: &str) -> Result<LockStatus> {
        let text = std::fs::read_to_string(status_path).map_err(|source| Error::Status {
            path: status_path.to_string(),
            source,
        })?;
        let mut status = Self::parse(&text)?;
        match std::fs::read_to_string(rollup_path) {
            Ok(rollup) => status.locked_resident = field_kib(&rollup, "Locked"),
            // smaps_rollup appeared in Linux 4.14; reading another
            // process's may be refused. Both leave the figure unknown.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
                ) => {}
            Err(source) => {
                return Err(Error::Status {
                    path: rollup_path.to_string(),
                    source,
                })
            }
        }
        Ok(status)
    }

    /// Parses the text of a `/proc/<pid>/status` file. Needs `VmSize`,
    /// `VmRSS` and `VmLck` (kernel threads have none of them). Does not
    /// allocate on success.
    pub fn parse(status: &str) -> Result<LockStatus> {
        let get = |field: &'static str| {
            field_kib(status, field).ok_or(Error::StatusFormat {
                field,
                reason: "missing or not a `<number> kB` value",
            })
        };
        Ok(LockStatus {
            vm_size: get("VmSize")?,
            vm_rss: get("VmRSS")?,
            vm_lck: get("VmLck")?,
            locked_resident: None,
        })
    }

    /// `VmSize`: the size of every mapping. `mlockall(MCL_CURRENT)` needs
    /// this much `RLIMIT_MEMLOCK`.
    pub fn vm_size(&self) -> u64 {
        self.vm_size
    }

    /// `VmRSS`: resident memory.
    pub fn vm_rss(&self) -> u64 {
        self.vm_rss
    }

    /// `VmLck`: the locked-memory accounting checked against
    /// `RLIMIT_MEMLOCK` (whole locked mappings, touched or not).
    pub fn vm_lck(&self) -> u64 {
        self.vm_lck
    }

    /// Resident pages of locked mappings (`Locked:` in `smaps_rollup`), or
    /// `None` where the kernel or permissions do not provide it. Under
    /// `on-fault` this grows as pages are touched.
    pub fn locked_resident(&self) -> Option<u64> {
        self.locked_resident
    }
}

/// Finds `<name>: <n> kB` in a `/proc` text and returns `n` KiB in bytes.
fn field_kib(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        if key != name {
            return None;
        }
        let number = value.trim().strip_suffix("kB")?.trim_end();
        number.parse::<u64>().ok()?.checked_mul(1024)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "Name:\tcat\nUmask:\t0022\nState:\tR (running)\n\
        VmPeak:\t    3776 kB\nVmSize:\t    3760 kB\nVmLck:\t       8 kB\n\
        VmPin:\t       0 kB\nVmHWM:\t    2184 kB\nVmRSS:\t    2184 kB\n\
        CapEff:\t000001fffeffffff\n";

    #[test]
    fn test_parse_status_fields() {
        let s = LockStatus::parse(SAMPLE).unwrap();
        assert_eq!(s.vm_size(), 3760 * 1024);
        assert_eq!(s.vm_rss(), 2184 * 1024);
        assert_eq!(s.vm_lck(), 8 * 1024);
        assert_eq!(s.locked_resident(), None);
    }

    #[test]
    fn test_parse_status_missing_field_is_an_error() {
        let text = SAMPLE.replace("VmLck", "VmXyz");
        let err = LockStatus::parse(&text).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot parse process status field VmLck: missing or not a `<number> kB` value"
        );
    }

    #[test]
    fn test_parse_status_rejects_garbage_values() {
        for bad in [
            "VmSize:\t-1 kB\nVmRSS:\t1 kB\nVmLck:\t0 kB\n",
            "VmSize:\t1\nVmRSS:\t1 kB\nVmLck:\t0 kB\n",
            "VmSize:\t99999999999999999999 kB\nVmRSS:\t1 kB\nVmLck:\t0 kB\n",
            "VmSize:\t18446744073709551615 kB\nVmRSS:\t1 kB\nVmLck:\t0 kB\n",
            "",
        ] {
            assert!(
                matches!(
                    LockStatus::parse(bad),
                    Err(Error::StatusFormat {
                        field: "VmSize",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn test_field_prefix_does_not_match() {
        // "VmLckX" must not be taken for "VmLck".
        assert_eq!(
            field_kib("VmLckX:\t5 kB\nVmLck:\t7 kB\n", "VmLck"),
            Some(7 * 1024)
        );
    }

    #[test]
    fn test_current_status_reads_this_process() {
        let s = LockStatus::current().unwrap();
        assert!(s.vm_rss() > 0);
        assert!(s.vm_size() >= s.vm_rss());
    }

    #[test]
    fn test_of_missing_pid_is_a_status_error() {
        // PIDs never reach u32::MAX (pid_max is at most 2^22).
        let err = LockStatus::of_pid(u32::MAX).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot read /proc/4294967295/status: "),
            "{err}"
        );
    }

    #[test]
    fn test_parse_never_panics_on_mutated_input() {
        // A deterministic xorshift mutates bytes of a real status text;
        // every outcome must be a value or an error, never a panic.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let base = SAMPLE.as_bytes();
        for _ in 0..5000 {
            let mut bytes = base.to_vec();
            for _ in 0..(next() % 8 + 1) {
                let i = (next() as usize) % bytes.len();
                match next() % 3 {
                    0 => bytes[i] = next() as u8,
                    1 => {
                        bytes.remove(i);
                    }
                    _ => {
                        let pool = b"0123456789: kB\n\t-";
                        bytes.insert(i, pool[(next() as usize) % pool.len()]);
                    }
                }
            }
            if let Ok(text) = std::str::from_utf8(&bytes) {
                if let Ok(status) = LockStatus::parse(text) {
                    assert!(status.vm_size() % 1024 == 0);
                }
            }
        }
    }
}
