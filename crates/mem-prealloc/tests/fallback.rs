// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The per-mapping fallback: `MADV_POPULATE_WRITE` refused with `EINVAL`
//! on one mapping falls back to touching where that is correct
//! (`memfd_secret`: writable, no `VM_IO`) and keeps the error where it is
//! not (a perf ring buffer, `VM_IO | VM_PFNMAP`; a read-only mapping).

mod common;

use std::io;

use common::{raw_populate_write, secretmem, skip, Mapping, MIB};
use mem_prealloc::{preallocate, Error, Method, PreallocOptions};

#[test]
fn test_einval_mapping_falls_back_to_touch() {
    const TEST: &str = "test_einval_mapping_falls_back_to_touch";
    let len = 8 * MIB;
    let file = match secretmem(len) {
        Ok(file) => file,
        Err(why) => return skip(TEST, &why),
    };
    let map = Mapping::shared(&file, len);
    // The kernel really refuses it (check_vma_flags: no GUP on secretmem).
    assert_eq!(raw_populate_write(map.addr, 4096), Err(libc::EINVAL));
    // SAFETY: inside the mapping; one page gets data before the run.
    unsafe { map.addr.add(MIB + 8).write_volatile(0x42) };

    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err = unsafe {
        preallocate(
            map.addr,
            len,
            &PreallocOptions::new().method(Method::PopulateWrite),
        )
    }
    .unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedMapping { offset: 0, .. }),
        "{err}"
    );

    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let report = unsafe { preallocate(map.addr, len, &PreallocOptions::new().threads(2)) }.unwrap();
    assert_eq!(
        report.method,
        Method::Touch,
        "the report names the fallback"
    );
    assert_eq!(report.bytes, len as u64);
    assert_eq!(map.smaps_rss(), len);
    assert_eq!(map.as_slice()[MIB + 8], 0x42, "data preserved");
}

#[test]
fn test_vm_io_mapping_keeps_the_error() {
    const TEST: &str = "test_vm_io_mapping_keeps_the_error";
    // perf_event_attr, PERF_ATTR_SIZE_VER0 (64 bytes; libc has no binding):
    // type PERF_TYPE_SOFTWARE (1), size, config PERF_COUNT_SW_DUMMY (9),
    // flags (offset 40) with `disabled` (bit 0).
    let mut attr = [0u64; 8];
    attr[0] = 1 | (64 << 32);
    attr[1] = 9;
    attr[5] = 1;
    const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
    // SAFETY: a valid attr of the size it states; the fd is closed below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            0,
            -1,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    } as i32;
    if fd < 0 {
        return skip(
            TEST,
            &format!("perf_event_open: {}", io::Error::last_os_error()),
        );
    }
    // A ring buffer: one control page and 8 data pages, VM_IO | VM_PFNMAP.
    let len = 9 * 4096;
    // SAFETY: a new mapping of the perf fd at an address the kernel picks.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    assert_ne!(addr, libc::MAP_FAILED, "{}", io::Error::last_os_error());
    let addr = addr.cast::<u8>();
    assert_eq!(raw_populate_write(addr, len), Err(libc::EINVAL));
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err = unsafe { preallocate(addr, len, &PreallocOptions::new()) }.unwrap_err();
    let Error::UnsupportedMapping { offset, reason, .. } = &err else {
        panic!("expected UnsupportedMapping, got {err}");
    };
    assert_eq!(*offset, 0);
    assert!(reason.contains("VM_IO"), "{reason}");
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    // SAFETY: unmaps the ring created above, then closes its fd.
    unsafe {
        libc::munmap(addr.cast(), len);
        libc::close(fd);
    }
}

#[test]
fn test_read_only_mapping_is_not_touched() {
    let map = Mapping::anonymous(4 * MIB, libc::PROT_READ);
    assert_eq!(raw_populate_write(map.addr, map.len), Err(libc::EINVAL));
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err = unsafe { preallocate(map.addr, map.len, &PreallocOptions::new()) }.unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedMapping { offset: 0, .. }),
        "{err}"
    );
    assert_eq!(map.resident_pages(), 0);
}
