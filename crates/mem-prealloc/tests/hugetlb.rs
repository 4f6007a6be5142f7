// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! hugetlbfs-backed regions (2 MiB pages): page-size detection, success, and
//! exhaustion of the hugepage pool under every method; and exhaustion of
//! the 1 GiB pool. These tests grow the pool through
//! /proc/sys/vm/nr_hugepages (the 1 GiB one through
//! /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages), root only,
//! and shrink it back; where that is impossible they print a notice and
//! skip.

mod common;

use common::{memfd, skip, HugepagePool, Mapping, MIB};
use mem_prealloc::{page_size_of, preallocate, Error, Method, PreallocOptions};

const HUGE: usize = 2 * MIB;

#[test]
fn test_hugetlbfs_memfd_is_preallocated_with_2m_pages() {
    for method in [Method::PopulateWrite, Method::Touch] {
        let pages = 8;
        let pool = match HugepagePool::grow(pages) {
            Ok(pool) => pool,
            Err(why) => return skip("test_hugetlbfs_memfd_is_preallocated_with_2m_pages", &why),
        };
        let len = pages * HUGE;
        let file = memfd("huge", len, libc::MFD_HUGETLB).unwrap();
        assert_eq!(page_size_of(&file).unwrap(), HUGE);
        // A shared hugetlbfs mapping reserves its pages up front.
        let map = Mapping::shared(&file, len);
        // SAFETY: inside the mapping; faults in one page with data.
        unsafe { map.addr.add(HUGE + 8).write_volatile(0x42) };
        let opts = PreallocOptions::new()
            .method(method)
            .page_size_from_fd(&file)
            .unwrap();
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let report = unsafe { preallocate(map.addr, len, &opts) }.unwrap();
        assert_eq!(report.page_size, HUGE);
        assert_eq!(report.bytes, len as u64);
        assert_eq!(report.method, method);
        assert!(map.fully_resident(), "{method}");
        assert_eq!(map.as_slice()[HUGE + 8], 0x42, "{method}: data preserved");
        // A length that is not a whole number of hugepages is refused.
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let err = unsafe { preallocate(map.addr, len - 4096, &opts) }.unwrap_err();
        assert!(
            matches!(err, Error::Misaligned { what: "length", .. }),
            "{err}"
        );
        drop(map);
        drop(file);
        drop(pool);
    }
}

#[test]
fn test_hugetlbfs_exhaustion_is_an_error() {
    for method in [Method::Auto, Method::PopulateWrite, Method::Touch] {
        // Two pages of our own so that the run makes progress before failing.
        let (pool, available) = match HugepagePool::for_exhaustion(2) {
            Ok(found) => found,
            Err(why) => return skip("test_hugetlbfs_exhaustion_is_an_error", &why),
        };
        // Four pages more than the pool can give. MAP_NORESERVE skips the
        // reservation at mmap time, so the shortage shows at fault time,
        // where a CPU access would raise SIGBUS.
        let len = (available + 4) * HUGE;
        let file = memfd("exhaust", len, libc::MFD_HUGETLB).unwrap();
        let map = Mapping::new(
            Some(&file),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE,
        )
        .unwrap();
        let opts = PreallocOptions::new()
            .threads(2)
            .method(method)
            .page_size_from_fd(&file)
            .unwrap();
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let err = unsafe { preallocate(map.addr, len, &opts) }.unwrap_err();
        let Error::HugepagesExhausted { offset, .. } = err else {
            panic!("{method}: expected HugepagesExhausted, got {err}");
        };
        assert_eq!(offset % HUGE as u64, 0);
        assert!(
            err.to_string().contains("hugetlbfs pool exhausted"),
            "{err}"
        );
        // Free the pages before giving them back.
        drop(map);
        drop(file);
        drop(pool);
    }
}

#[test]
fn test_gigantic_hugetlbfs_exhaustion_is_an_error() {
    const GIGANTIC: usize = 1 << 30;
    for method in [Method::Auto, Method::PopulateWrite, Method::Touch] {
        // One page of our own, so that the run makes progress before it
        // fails: 1 GiB of memory for the length of the test.
        let (pool, available) = match HugepagePool::gigantic_for_exhaustion(1) {
            Ok(found) => found,
            Err(why) => return skip("test_gigantic_hugetlbfs_exhaustion_is_an_error", &why),
        };
        // Two pages more than the pool can give, unreserved as above.
        let len = (available + 2) * GIGANTIC;
        let file = memfd("exhaust-1g", len, libc::MFD_HUGETLB | libc::MFD_HUGE_1GB).unwrap();
        assert_eq!(page_size_of(&file).unwrap(), GIGANTIC);
        let map = Mapping::new(
            Some(&file),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE,
        )
        .unwrap();
        let opts = PreallocOptions::new()
            .threads(2)
            .method(method)
            .page_size_from_fd(&file)
            .unwrap();
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let err = unsafe { preallocate(map.addr, len, &opts) }.unwrap_err();
        let Error::HugepagesExhausted { offset, .. } = err else {
            panic!("{method}: expected HugepagesExhausted, got {err}");
        };
        assert_eq!(offset % GIGANTIC as u64, 0, "{method}");
        assert!(offset < len as u64, "{method}");
        drop(map);
        drop(file);
        drop(pool);
    }
}
