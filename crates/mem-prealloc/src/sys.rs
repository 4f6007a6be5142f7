// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The system calls behind the crate, each wrapped so that it can only fail
//! with an errno: none of them lets the CPU touch the target memory from user
//! space, so none of them can raise `SIGBUS` or `SIGSEGV` in this process.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::OnceLock;

// Linux uapi <linux/futex.h>; defined here because not every libc target
// exports them.
const FUTEX_WAKE_OP: libc::c_int = 5;
const FUTEX_PRIVATE_FLAG: libc::c_int = 128;
const FUTEX_OP_ADD: u32 = 1;
const FUTEX_OP_CMP_EQ: u32 = 0;

/// `MADV_POPULATE_WRITE` (Linux 5.14).
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// `HUGETLBFS_MAGIC` from <linux/magic.h>.
const HUGETLBFS_MAGIC: u64 = 0x9584_58f6;

/// How often a transient `EINTR`/`EAGAIN` is retried before it is reported.
const MAX_RETRIES: u32 = 64;

/// The largest CPU number a `cpu_set_t` holds (`CPU_SETSIZE - 1`).
pub(crate) const LAST_CPU: usize = libc::CPU_SETSIZE as usize - 1;

/// The errno of the last failed call.
fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// The base page size of the machine.
pub(crate) fn base_page_size() -> usize {
    static SIZE: OnceLock<usize> = OnceLock::new();
    *SIZE.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(size)
            .ok()
            .filter(|s| s.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// The page size of the file behind `fd`: the hugepage size on hugetlbfs
/// (including `memfd_create(MFD_HUGETLB)`), the base page size otherwise.
pub(crate) fn fd_page_size(fd: impl AsFd) -> io::Result<usize> {
    let mut buf = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: the fd is open for the duration of the call (it is borrowed),
    // and `buf` is a writable statfs the kernel fills in.
    let ret = unsafe { libc::fstatfs(fd.as_fd().as_raw_fd(), buf.as_mut_ptr()) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatfs succeeded, so it initialised the whole struct.
    let st = unsafe { buf.assume_init() };
    // f_type's width differs between targets; compare as u32 bits.
    if st.f_type as u32 as u64 == HUGETLBFS_MAGIC {
        usize::try_from(st.f_bsize)
            .ok()
            .filter(|s| s.is_power_of_two())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
    } else {
        Ok(base_page_size())
    }
}

/// Faults `[addr, addr + len)` in for writing with `MADV_POPULATE_WRITE`.
///
/// The kernel allocates (or COW-breaks) every page exactly as a write fault
/// would, but writes nothing: existing contents are preserved. A fault that
/// would raise `SIGBUS`/`SIGSEGV` makes the call fail with `EFAULT` instead.
pub(crate) fn populate_write(addr: usize, len: usize) -> Result<(), i32> {
    let mut retries = 0;
    loop {
        // SAFETY: MADV_POPULATE_WRITE never changes the contents of the range
        // nor the mapping itself; on an unmapped or unsuitable range it fails
        // with an errno. No Rust object's memory can be invalidated by it.
        let ret = unsafe { libc::madvise(addr as *mut libc::c_void, len, MADV_POPULATE_WRITE) };
        if ret == 0 {
            return Ok(());
        }
        let err = errno();
        if (err == libc::EINTR || err == libc::EAGAIN) && retries < MAX_RETRIES {
            retries += 1;
            continue;
        }
        return Err(err);
    }
}

/// Faults in the page holding the 4-byte aligned `addr` for writing, from the
/// kernel side, and leaves its contents unchanged.
///
/// `FUTEX_WAKE_OP` performs an atomic `*addr += 0` (`lock xadd` on x86) inside
/// the kernel with page faults disabled. When the page is missing the kernel
/// calls `fault_in_user_writeable()`, which runs the write fault through
/// `fixup_user_fault()` and retries. A fault that cannot be resolved (no
/// hugepage left, offset beyond the end of the file, no write permission)
/// comes back as `EFAULT`/`ENOMEM`; no signal is sent. The add is atomic, so a
/// concurrent writer (a running guest) never loses a store.
///
/// The wake half of the operation is harmless: `uaddr1` is a stack variable
/// nobody waits on, and at most one private waiter on `addr` itself could be
/// woken spuriously, which futex users must tolerate anyway.
pub(crate) fn touch_page(addr: usize) -> Result<(), i32> {
    let dummy: u32 = 0;
    // op = ADD, cmp = EQ, oparg = 0, cmparg = 0 (see futex(2)).
    let op = (FUTEX_OP_ADD << 28) | (FUTEX_OP_CMP_EQ << 24);
    let mut retries = 0;
    loop {
        // SAFETY: the kernel accesses `addr` only through its own fault-safe
        // user-access helpers, and the only store it makes adds zero
        // atomically, so the contents seen by every other thread are
        // unchanged. `dummy` outlives the call and is only used as a key.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_futex,
                &dummy as *const u32,
                FUTEX_WAKE_OP | FUTEX_PRIVATE_FLAG,
                0 as libc::c_int,
                0 as libc::c_ulong,
                addr as *mut u32,
                op,
            )
        };
        if ret >= 0 {
            return Ok(());
        }
        let err = errno();
        if (err == libc::EINTR || err == libc::EAGAIN) && retries < MAX_RETRIES {
            retries += 1;
            continue;
        }
        return Err(err);
    }
}

/// Whether the running kernel implements `MADV_POPULATE_WRITE`, probed once
/// on a private anonymous page of our own.
pub(crate) fn kernel_has_populate_write() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        let page = base_page_size();
        // SAFETY: a fresh anonymous mapping that nothing else references.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            // Cannot tell; assume a modern kernel and let the real call decide.
            return true;
        }
        let supported = populate_write(ptr as usize, page) != Err(libc::EINVAL);
        // SAFETY: unmaps exactly the mapping created above.
        unsafe { libc::munmap(ptr, page) };
        supported
    })
}

/// Pins the calling thread to one CPU.
pub(crate) fn pin_current_thread(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes one bit inside `set`; the caller validated
    // cpu < CPU_SETSIZE, so the bit is within the struct.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the
    // calling thread.
    let ret = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

// Linux uapi <linux/mempolicy.h>.
pub(crate) const MPOL_PREFERRED: libc::c_int = 1;
pub(crate) const MPOL_BIND: libc::c_int = 2;
pub(crate) const MPOL_INTERLEAVE: libc::c_int = 3;
pub(crate) const MPOL_PREFERRED_MANY: libc::c_int = 5;
const MPOL_MF_STRICT: libc::c_uint = 1;
const MPOL_MF_MOVE: libc::c_uint = 1 << 1;

const NODE_DIR: &str = "/sys/devices/system/node";

/// Whether host NUMA node `node` exists.
pub(crate) fn node_exists(node: usize) -> bool {
    std::path::Path::new(&format!("{NODE_DIR}/node{node}")).is_dir()
}

/// The CPUs of host NUMA node `node`.
pub(crate) fn node_cpus(node: usize) -> io::Result<Vec<usize>> {
    let text = std::fs::read_to_string(format!("{NODE_DIR}/node{node}/cpulist"))?;
    parse_cpu_list(&text).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Parses a kernel CPU list such as `0-3,8,10-11` (empty for a node
/// without CPUs).
fn parse_cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((from, to)) => {
                let (from, to): (usize, usize) = (from.parse().ok()?, to.parse().ok()?);
                if from > to || to > LAST_CPU {
                    return None;
                }
                cpus.extend(from..=to);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// The CPUs in the calling thread's affinity mask, if it can be read.
pub(crate) fn allowed_cpus() -> Option<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a writable cpu_set_t of the size passed; pid 0 is the
    // calling thread.
    let ret =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if ret != 0 {
        return None;
    }
    // SAFETY: CPU_ISSET reads one bit inside `set` for cpu < CPU_SETSIZE.
    Some(
        (0..=LAST_CPU)
            .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
            .collect(),
    )
}

/// `mbind(addr, len, mode, nodes, MPOL_MF_STRICT | MPOL_MF_MOVE)`, `mode`
/// one of the `MPOL_*` above.
pub(crate) fn mbind(addr: usize, len: usize, mode: libc::c_int, nodes: &[usize]) -> io::Result<()> {
    let bits = libc::c_ulong::BITS as usize;
    let max = nodes.iter().copied().max().unwrap_or(0);
    let mut mask = vec![0 as libc::c_ulong; max / bits + 1];
    for &node in nodes {
        mask[node / bits] |= 1 << (node % bits);
    }
    // The kernel reads maxnode - 1 bits (a historical off-by-one that
    // glibc's numa_* wrappers and QEMU compensate for the same way).
    let maxnode = (mask.len() * bits + 1) as libc::c_ulong;
    // SAFETY: mbind only changes the memory policy of the range (and may
    // migrate pages already there, keeping their contents); `mask` is a
    // readable array of `maxnode - 1` bits that outlives the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len,
            mode,
            mask.as_ptr(),
            maxnode,
            MPOL_MF_STRICT | MPOL_MF_MOVE,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether touching the page at `addr` in place of `MADV_POPULATE_WRITE`
/// is correct: its mapping is writable and not `VM_IO` (device memory,
/// where even an atomic add of zero is an access with side effects).
/// Read from the `VmFlags` line of `/proc/self/smaps`, on the error path
/// only; `false` when it cannot be read.
pub(crate) fn touch_is_correct(addr: usize) -> bool {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return false;
    };
    vm_flags_in(&smaps, addr).is_some_and(|flags| {
        let mut flags = flags.split_ascii_whitespace();
        flags.clone().any(|flag| flag == "wr") && !flags.any(|flag| flag == "io")
    })
}

/// The `VmFlags:` of the mapping holding `addr` in an smaps text.
fn vm_flags_in(smaps: &str, addr: usize) -> Option<&str> {
    let mut inside = false;
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if inside {
                return Some(flags);
            }
            continue;
        }
        let Some((range, _)) = line.split_once(' ') else {
            continue;
        };
        if let Some((start, end)) = range.split_once('-') {
            if let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            ) {
                inside = (start..end).contains(&addr);
            }
        }
    }
    None
}

/// What `/proc/self/maps` says about the mapping holding `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MappingState {
    /// No mapping contains the address.
    Unmapped,
    /// Mapped, but not writable.
    ReadOnly,
    /// Mapped and writable.
    Writable,
    /// `/proc/self/maps` could not be read.
    Unknown,
}

/// Looks `addr` up in `/proc/self/maps`; used only to explain a failure.
pub(crate) fn mapping_state(addr: usize) -> MappingState {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return MappingState::Unknown;
    };
    mapping_state_in(&maps, addr)
}

fn mapping_state_in(maps: &str, addr: usize) -> MappingState {
    for line in maps.lines() {
        let mut fields = line.split_ascii_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        if (start..end).contains(&addr) {
            return if perms.as_bytes().get(1) == Some(&b'w') {
                MappingState::Writable
            } else {
                MappingState::ReadOnly
            };
        }
    }
    MappingState::Unmapped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_mapping_state_parses_maps() {
        let maps = "00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/x\n\
                    7f0000000000-7f0000200000 rw-s 00000000 00:01 1 /memfd:m (deleted)\n";
        assert_eq!(mapping_state_in(maps, 0x400000), MappingState::ReadOnly);
        assert_eq!(
            mapping_state_in(maps, 0x7f00001fffff),
            MappingState::Writable
        );
        assert_eq!(
            mapping_state_in(maps, 0x7f0000200000),
            MappingState::Unmapped
        );
        assert_eq!(
            mapping_state_in("garbage\n", 0x1000),
            MappingState::Unmapped
        );
    }

    #[test]
    fn test_cpu_list_parses() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0,2-4,7"), Some(vec![0, 2, 3, 4, 7]));
        assert_eq!(parse_cpu_list("\n"), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(parse_cpu_list("0-5000"), None);
    }

    #[test]
    fn test_vm_flags_of_the_mapping_holding_an_address() {
        let smaps = "7f0000000000-7f0000001000 rw-s 00000000 00:01 1 /perf\n\
                     Rss:                   4 kB\n\
                     VmFlags: rd wr sh mr mw ms pf io dc de dd\n\
                     7f0000001000-7f0000003000 rw-s 00000000 00:01 2 /secretmem (deleted)\n\
                     VmFlags: rd wr sh mr mw ms lo dd\n";
        assert_eq!(
            vm_flags_in(smaps, 0x7f0000000800),
            Some(" rd wr sh mr mw ms pf io dc de dd")
        );
        assert_eq!(
            vm_flags_in(smaps, 0x7f0000002000),
            Some(" rd wr sh mr mw ms lo dd")
        );
        assert_eq!(vm_flags_in(smaps, 0x7f0000003000), None);
    }

    #[test]
    fn test_base_page_size_is_power_of_two() {
        assert!(base_page_size().is_power_of_two());
        assert!(base_page_size() >= 4096);
    }

    #[test]
    fn test_touch_page_on_unmapped_address_returns_efault() {
        // Address 0 is never mapped for a normal process (mmap_min_addr).
        assert_eq!(touch_page(0), Err(libc::EFAULT));
    }
}
