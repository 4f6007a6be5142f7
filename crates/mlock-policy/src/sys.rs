// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Thin wrappers over the locking system calls. Each returns the raw
//! `io::Error` so that the callers can turn it into an actionable error.

use std::io;

/// `CAP_IPC_LOCK` from `<linux/capability.h>`.
pub(crate) const CAP_IPC_LOCK: u32 = 14;
/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit capability sets in two words.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Converts a `-1` return into the thread's `errno`.
fn check(ret: libc::c_int) -> io::Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Converts a raw `syscall()` return into the thread's `errno`.
fn check_long(ret: libc::c_long) -> io::Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `mlockall(flags)`.
pub(crate) fn mlockall(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: mlockall takes no pointers; it only changes the locking state
    // of this process's mappings.
    check(unsafe { libc::mlockall(flags) })
}

/// `munlockall()`.
pub(crate) fn munlockall() -> io::Result<()> {
    // SAFETY: munlockall takes no arguments and only clears lock flags.
    check(unsafe { libc::munlockall() })
}

/// `mlock(addr, len)`: locks and populates the range.
pub(crate) fn mlock(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: mlock never reads or writes the range through this pointer on
    // our behalf; the kernel validates it and fails with ENOMEM for
    // unmapped parts. Faulting pages in does not change their contents.
    check(unsafe { libc::mlock(addr as *const libc::c_void, len) })
}

/// `mlock2(addr, len, MLOCK_ONFAULT)`: locks pages as they are faulted in.
/// Called through `syscall()` so that it works with any libc; kernels older
/// than 4.4 answer `ENOSYS`.
pub(crate) fn mlock2_onfault(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: as for mlock; the kernel validates the range, and with
    // MLOCK_ONFAULT it does not even fault pages in.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_mlock2,
            addr as *const libc::c_void,
            len,
            libc::MLOCK_ONFAULT,
        )
    })
}

/// `munlock(addr, len)`.
pub(crate) fn munlock(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: munlock only clears the lock flag of the range; the kernel
    // validates the range.
    check(unsafe { libc::munlock(addr as *const libc::c_void, len) })
}

/// Whether the kernel knows `MLOCK_ONFAULT`/`MCL_ONFAULT` (Linux 4.4+, where
/// both arrived together). A zero-length `mlock2` validates the flags and
/// locks nothing.
pub(crate) fn probe_onfault() -> io::Result<()> {
    // The start must be page-aligned: the kernel rounds an unaligned
    // zero-length range up to a whole page and would lock it.
    let anchor = 0u8;
    let page_start = (std::ptr::addr_of!(anchor) as usize) & !(page_size() - 1);
    match mlock2_onfault(page_start, 0) {
        Ok(()) => Ok(()),
        // The flag check comes before the permission check, so EPERM
        // (RLIMIT_MEMLOCK of 0 without CAP_IPC_LOCK) still means "supported".
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The soft and hard `RLIMIT_MEMLOCK` in bytes; `None` means unlimited.
pub(crate) fn memlock_limits() -> io::Result<(Option<u64>, Option<u64>)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit that outlives the call.
    check(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) })?;
    // rlim_t is 32 bits wide on some 32-bit targets.
    #[allow(clippy::unnecessary_cast)]
    let conv = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v as u64);
    Ok((conv(lim.rlim_cur), conv(lim.rlim_max)))
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

/// Whether the calling thread has `CAP_IPC_LOCK` in its effective set.
/// Capabilities are per thread, so this asks `capget` rather than
/// `/proc/self/status` (which shows the main thread).
pub(crate) fn has_cap_ipc_lock() -> io::Result<bool> {
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: `header` and `data` are valid for the duration of the call and
    // have the layout of `__user_cap_header_struct` and two
    // `__user_cap_data_struct`, which version 3 requires.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_capget,
            std::ptr::addr_of_mut!(header),
            data.as_mut_ptr(),
        )
    })?;
    Ok(data[0].effective & (1 << CAP_IPC_LOCK) != 0)
}

/// The system page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as usize
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_probe_onfault_supported_on_this_kernel() {
        // Every kernel this crate supports (4.4+) knows MLOCK_ONFAULT.
        probe_onfault().unwrap();
    }

    #[test]
    fn test_probe_onfault_locks_nothing() {
        let smaps_marker = 0u8;
        probe_onfault().unwrap();
        // The probe's page is on this thread's stack: that VMA must not
        // have become locked ("lo", "lf" in VmFlags).
        let here = std::ptr::addr_of!(smaps_marker) as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((start, end)) = range.split_once('-') {
                    if let (Ok(start), Ok(end)) = (
                        usize::from_str_radix(start, 16),
                        usize::from_str_radix(end, 16),
                    ) {
                        inside = (start..end).contains(&here);
                        continue;
                    }
                }
            }
            if inside && line.starts_with("VmFlags:") {
                assert!(!line.contains(" lo") && !line.contains(" lf"), "{line}");
                return;
            }
        }
        panic!("the stack VMA was not found in smaps");
    }

    #[test]
    fn test_capget_answers() {
        has_cap_ipc_lock().unwrap();
    }

    #[test]
    fn test_page_size_is_power_of_two() {
        assert!(page_size().is_power_of_two());
    }
}
