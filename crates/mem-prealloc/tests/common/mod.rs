// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Helpers shared by the integration tests: memfds, mappings, residency
//! checks and a hugepage pool guard.

#![allow(dead_code)]

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;

pub const MIB: usize = 1 << 20;

/// A memfd.
pub fn memfd(name: &str, len: usize, flags: libc::c_uint) -> io::Result<File> {
    let name = CString::new(name).unwrap();
    // SAFETY: a NUL-terminated name; the returned fd is owned by the File.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len as u64)?;
    Ok(file)
}

/// An mmap that is unmapped on drop.
pub struct Mapping {
    pub addr: *mut u8,
    pub len: usize,
}

// SAFETY: the mapping is plain memory; tests synchronise their own accesses.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub fn new(file: Option<&File>, len: usize, prot: i32, flags: i32) -> io::Result<Self> {
        let fd = file.map_or(-1, |f| f.as_raw_fd());
        // SAFETY: a new mapping at an address chosen by the kernel.
        let addr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            addr: addr.cast(),
            len,
        })
    }

    /// A private anonymous mapping with protection `prot`.
    pub fn anonymous(len: usize, prot: i32) -> Self {
        Self::new(None, len, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS).unwrap()
    }

    /// A shared read-write mapping of `file`.
    pub fn shared(file: &File, len: usize) -> Self {
        Self::new(
            Some(file),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
        )
        .unwrap()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is readable and lives as long as self.
        unsafe { std::slice::from_raw_parts(self.addr, self.len) }
    }

    /// Pages resident according to mincore.
    pub fn resident_pages(&self) -> usize {
        let page = mem_prealloc::base_page_size();
        let mut vec = vec![0u8; self.len.div_ceil(page)];
        // SAFETY: vec has one byte per page of the range.
        let ret = unsafe { libc::mincore(self.addr.cast(), self.len, vec.as_mut_ptr()) };
        assert_eq!(ret, 0, "mincore: {}", io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    pub fn fully_resident(&self) -> bool {
        self.resident_pages() * mem_prealloc::base_page_size() == self.len
    }

    /// `Rss` of this mapping in /proc/self/smaps, in bytes.
    pub fn smaps_rss(&self) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{:x}-", self.addr as usize);
        let mut in_vma = false;
        for line in smaps.lines() {
            if line.starts_with(&start) {
                in_vma = true;
            } else if in_vma && line.starts_with("Rss:") {
                let kib: usize = line
                    .split_ascii_whitespace()
                    .nth(1)
                    .unwrap()
                    .parse()
                    .unwrap();
                return kib * 1024;
            }
        }
        panic!("mapping {start} not found in smaps");
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly this mapping.
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}

/// Writes a recognisable pattern at every `stride` bytes through the fd
/// (not through a mapping), so that the mapping starts with no pages mapped.
pub fn write_pattern(file: &File, len: usize, stride: usize) {
    for off in (0..len).step_by(stride) {
        file.write_all_at(&pattern_at(off), off as u64).unwrap();
    }
}

pub fn pattern_at(off: usize) -> [u8; 8] {
    ((off as u64) ^ 0x5a5a_1234_dead_beef).to_le_bytes()
}

pub fn check_pattern(map: &Mapping, stride: usize) {
    let bytes = map.as_slice();
    for off in (0..map.len).step_by(stride) {
        assert_eq!(&bytes[off..off + 8], &pattern_at(off), "offset {off:#x}");
    }
}

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

/// Reads a field of /proc/meminfo (in its own unit).
pub fn meminfo(field: &str) -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// The 1 GiB hugepage pool's directory in sysfs.
const GIGANTIC_DIR: &str = "/sys/kernel/mm/hugepages/hugepages-1048576kB";

fn read_count(path: &str) -> Option<usize> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn write_count(path: &str, n: usize) -> io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(format!("{n}\n").as_bytes())
}

/// Adds pages to a hugepage pool (2 MiB, or 1 GiB with
/// [`HugepagePool::grow_gigantic`]) for the duration of a test and removes
/// the same number on drop (so concurrent changes by others are kept).
/// Holds a file lock so that the hugepage tests of this crate, which
/// nextest runs in parallel processes, take turns.
pub struct HugepagePool {
    added: usize,
    nr_path: String,
    _lock: File,
}

impl HugepagePool {
    /// Grows the 2 MiB pool by `extra` pages, or explains why that is
    /// impossible.
    pub fn grow(extra: usize) -> Result<Self, String> {
        if meminfo("Hugepagesize:") != Some(2048) {
            return Err("the default hugepage size is not 2 MiB".into());
        }
        Self::grow_at(NR_HUGEPAGES, extra)
    }

    /// Grows the 1 GiB pool by `extra` pages (memory is compacted first,
    /// as a gigantic page needs 1 GiB of contiguous memory), or explains
    /// why that is impossible.
    pub fn grow_gigantic(extra: usize) -> Result<Self, String> {
        if !std::path::Path::new(GIGANTIC_DIR).is_dir() {
            return Err("this kernel has no 1 GiB hugepages".into());
        }
        // Best effort, root only; the grow below says if it was not enough.
        let _ = std::fs::write("/proc/sys/vm/compact_memory", "1\n");
        Self::grow_at(&format!("{GIGANTIC_DIR}/nr_hugepages"), extra)
    }

    fn grow_at(nr_path: &str, extra: usize) -> Result<Self, String> {
        let lock =
            File::create("/tmp/mem-prealloc-hugetlb-tests.lock").map_err(|e| e.to_string())?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(format!("flock: {}", io::Error::last_os_error()));
        }
        let before = read_count(nr_path).ok_or(format!("cannot read {nr_path}"))?;
        write_count(nr_path, before + extra).map_err(|e| format!("cannot write {nr_path}: {e}"))?;
        let after = read_count(nr_path).unwrap_or(before);
        let pool = HugepagePool {
            added: after.saturating_sub(before),
            nr_path: nr_path.to_string(),
            _lock: lock,
        };
        if pool.added < extra {
            return Err(format!(
                "the kernel gave {} of {extra} extra hugepages ({nr_path})",
                pool.added
            ));
        }
        Ok(pool)
    }

    /// For the exhaustion tests: grows the pool by `extra` pages and returns
    /// it with the number of hugepages free, or why the test cannot run
    /// here (overcommit on, no root, or too many free pages to exhaust
    /// without disturbing others).
    pub fn for_exhaustion(extra: usize) -> Result<(Self, usize), String> {
        if meminfo("HugePages_Surp:").is_none()
            || std::fs::read_to_string("/proc/sys/vm/nr_overcommit_hugepages")
                .map(|s| s.trim() != "0")
                .unwrap_or(true)
        {
            return Err("hugepage overcommit is enabled or unknown".into());
        }
        let pool = Self::grow(extra)?;
        let available = Self::available();
        if available > 64 {
            return Err(format!(
                "{available} hugepages are free; exhausting them would disturb others"
            ));
        }
        Ok((pool, available))
    }

    /// [`Self::for_exhaustion`] for the 1 GiB pool.
    pub fn gigantic_for_exhaustion(extra: usize) -> Result<(Self, usize), String> {
        if read_count(&format!("{GIGANTIC_DIR}/nr_overcommit_hugepages")) != Some(0) {
            return Err("1 GiB hugepage overcommit is enabled or unknown".into());
        }
        let pool = Self::grow_gigantic(extra)?;
        let read = |f: &str| read_count(&format!("{GIGANTIC_DIR}/{f}")).unwrap_or(0);
        let available = read("free_hugepages").saturating_sub(read("resv_hugepages"));
        if available > 4 {
            return Err(format!(
                "{available} 1 GiB hugepages are free; exhausting them would disturb others"
            ));
        }
        Ok((pool, available))
    }

    /// Hugepages free and not reserved by anyone.
    pub fn available() -> usize {
        meminfo("HugePages_Free:")
            .unwrap_or(0)
            .saturating_sub(meminfo("HugePages_Rsvd:").unwrap_or(0))
    }
}

impl Drop for HugepagePool {
    fn drop(&mut self) {
        if self.added > 0 {
            if let Some(now) = read_count(&self.nr_path) {
                let _ = write_count(&self.nr_path, now.saturating_sub(self.added));
            }
        }
    }
}

/// Prints the skip notice of a test that cannot run here.
pub fn skip(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
}

/// The lowest CPU this process may run on.
pub fn first_allowed_cpu() -> usize {
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a writable cpu_set_t of the size passed.
    let ret =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(ret, 0, "sched_getaffinity: {}", io::Error::last_os_error());
    // SAFETY: CPU_ISSET reads one bit inside `set`; cpu < CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize)
        .find(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .expect("no allowed cpu")
}

pub const MPOL_DEFAULT: i32 = 0;
pub const MPOL_PREFERRED: i32 = 1;
pub const MPOL_BIND: i32 = 2;
pub const MPOL_INTERLEAVE: i32 = 3;
const MPOL_F_NODE: libc::c_ulong = 1;
const MPOL_F_ADDR: libc::c_ulong = 2;

/// The policy mode and node mask (first word) of the mapping at `addr`
/// (`get_mempolicy(MPOL_F_ADDR)`).
pub fn policy_at(addr: *mut u8) -> (i32, libc::c_ulong) {
    let mut mode: libc::c_int = -1;
    let mut mask = [0 as libc::c_ulong; 16];
    // SAFETY: `mode` and `mask` (16 words = 1024 bits) are writable and
    // outlive the call; get_mempolicy only reads the policy of the range.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            mask.as_mut_ptr(),
            (mask.len() * 64) as libc::c_ulong,
            addr,
            MPOL_F_ADDR,
        )
    };
    assert_eq!(ret, 0, "get_mempolicy: {}", io::Error::last_os_error());
    (mode, mask[0])
}

/// The node holding the page at `addr` (`get_mempolicy(MPOL_F_NODE |
/// MPOL_F_ADDR)`), or the errno.
pub fn node_of_page(addr: *mut u8) -> Result<i32, i32> {
    let mut node: libc::c_int = -1;
    // SAFETY: `node` is writable and outlives the call; with MPOL_F_NODE |
    // MPOL_F_ADDR the kernel looks the page up and writes its node.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut node as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_ulong>(),
            0 as libc::c_ulong,
            addr,
            MPOL_F_NODE | MPOL_F_ADDR,
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    Ok(node)
}

/// A `memfd_secret` of `len` bytes, or why there is none.
pub fn secretmem(len: usize) -> Result<File, String> {
    // SAFETY: memfd_secret(2) takes flags only; the fd is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_memfd_secret, libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(format!(
            "memfd_secret: {} (boot with secretmem.enable=1)",
            io::Error::last_os_error()
        ));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let file = unsafe { File::from_raw_fd(fd as i32) };
    file.set_len(len as u64).map_err(|e| e.to_string())?;
    Ok(file)
}

/// `madvise(MADV_POPULATE_WRITE)` on the range, as the kernel answers it.
pub fn raw_populate_write(addr: *mut u8, len: usize) -> Result<(), i32> {
    // SAFETY: MADV_POPULATE_WRITE changes no contents; it fails with an
    // errno on an unsuitable range.
    let ret = unsafe { libc::madvise(addr.cast(), len, 23) };
    if ret != 0 {
        return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    Ok(())
}
