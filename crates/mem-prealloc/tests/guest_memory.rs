// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The vm-memory integration: whole `GuestMemoryMmap`s and single regions.
#![cfg(feature = "vm-memory")]

mod common;

use std::sync::{Arc, Mutex};

use common::{memfd, MIB};
use mem_prealloc::guest_memory::{
    preallocate_guest_memory, preallocate_mmap_region, preallocate_region, start_guest_memory,
    start_mmap_region, start_region,
};
use mem_prealloc::{Error, Method, PreallocOptions};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestRegionMmap};

fn resident(addr: *mut u8, len: usize) -> usize {
    let page = mem_prealloc::base_page_size();
    let mut vec = vec![0u8; len / page];
    // SAFETY: vec has one byte per page.
    let ret = unsafe { libc::mincore(addr.cast(), len, vec.as_mut_ptr()) };
    assert_eq!(ret, 0);
    vec.iter().filter(|&&b| b & 1 != 0).count() * page
}

#[test]
fn test_every_region_of_guest_memory_is_preallocated() {
    let mem: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), 16 * MIB),
        (GuestAddress(1 << 32), 8 * MIB),
    ])
    .unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&calls);
    let opts = PreallocOptions::new().progress(move |done| sink.lock().unwrap().push(done));
    let reports = preallocate_guest_memory(&mem, &opts).unwrap();
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[0].bytes, 16 * MIB as u64);
    assert_eq!(reports[1].bytes, 8 * MIB as u64);
    for region in mem.iter() {
        assert_eq!(resident(region.as_ptr(), region.size()), region.size());
    }
    let calls = calls.lock().unwrap();
    assert!(calls.windows(2).all(|w| w[0] < w[1]), "{calls:?}");
    assert_eq!(*calls.last().unwrap(), 24 * MIB as u64);
}

#[test]
fn test_file_backed_region_uses_the_file_page_size() {
    let len = 8 * MIB;
    let file = memfd("region", len, 0).unwrap();
    let region: GuestRegionMmap =
        GuestRegionMmap::from_range(GuestAddress(0), len, Some(FileOffset::new(file, 0))).unwrap();
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let job =
        unsafe { start_region(&region, &PreallocOptions::new().method(Method::Touch)) }.unwrap();
    let report = job.join().unwrap();
    assert_eq!(report.page_size, mem_prealloc::base_page_size());
    assert_eq!(report.method, Method::Touch);
    assert_eq!(resident(region.as_ptr(), len), len);
    // Again, now that everything is resident: still fine.
    let report = preallocate_region(&region, &PreallocOptions::new()).unwrap();
    assert_eq!(report.bytes, len as u64);
}

#[test]
fn test_guest_memory_reports_invalid_options() {
    let mem: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), 4 * MIB),
        (GuestAddress(1 << 30), 4 * MIB),
    ])
    .unwrap();
    let opts = PreallocOptions::new().threads(0);
    let err = preallocate_guest_memory(&mem, &opts).unwrap_err();
    assert!(matches!(err, Error::InvalidOption(_)), "{err}");
}

#[test]
fn test_hugetlbfs_regions_use_their_hugepage_size() {
    use vm_memory::mmap::MmapRegionBuilder;
    const HUGE: usize = 2 * MIB;
    let pool = match common::HugepagePool::grow(4) {
        Ok(pool) => pool,
        Err(why) => {
            return common::skip("test_hugetlbfs_regions_use_their_hugepage_size", &why);
        }
    };
    // File-backed: detected with fstatfs on the region's file.
    let file = memfd("huge-region", 2 * HUGE, libc::MFD_HUGETLB).unwrap();
    let region: GuestRegionMmap =
        GuestRegionMmap::from_range(GuestAddress(0), 2 * HUGE, Some(FileOffset::new(file, 0)))
            .unwrap();
    let report = preallocate_region(&region, &PreallocOptions::new()).unwrap();
    assert_eq!(report.page_size, HUGE);
    assert_eq!(resident(region.as_ptr(), 2 * HUGE), 2 * HUGE);
    // Anonymous MAP_HUGETLB: detected from the mapping flags.
    let mapping = MmapRegionBuilder::new(2 * HUGE)
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB)
        .with_hugetlbfs(true)
        .build()
        .unwrap();
    let region: GuestRegionMmap = GuestRegionMmap::new(mapping, GuestAddress(0)).unwrap();
    let report =
        preallocate_region(&region, &PreallocOptions::new().method(Method::Touch)).unwrap();
    assert_eq!(report.page_size, HUGE);
    assert_eq!(resident(region.as_ptr(), 2 * HUGE), 2 * HUGE);
    drop(region);
    drop(pool);
}

#[test]
fn test_raw_mmap_region_is_prefaulted_before_it_is_wrapped() {
    use vm_memory::mmap::MmapRegion;
    let len = 8 * MIB;
    let file = memfd("raw-region", len, 0).unwrap();
    // What cloud-hypervisor does: build the MmapRegion, prefault it, wrap it.
    let mapping: MmapRegion = MmapRegion::from_file(FileOffset::new(file, 0), len).unwrap();
    let report = preallocate_mmap_region(&mapping, &PreallocOptions::new().threads(2)).unwrap();
    assert_eq!(report.bytes, len as u64);
    assert_eq!(report.page_size, mem_prealloc::base_page_size());
    assert_eq!(resident(mapping.as_ptr(), len), len);
    let anon: MmapRegion = MmapRegion::new(len).unwrap();
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let job =
        unsafe { start_mmap_region(&anon, &PreallocOptions::new().method(Method::Touch)) }.unwrap();
    assert_eq!(job.join().unwrap().method, Method::Touch);
    assert_eq!(resident(anon.as_ptr(), len), len);
    let region: GuestRegionMmap = GuestRegionMmap::new(mapping, GuestAddress(0)).unwrap();
    assert_eq!(region.size(), len);
}

#[test]
fn test_guest_memory_regions_are_filled_at_once_with_their_own_results() {
    // A read-only region among writable ones: its error is its own, the
    // other regions are complete.
    use vm_memory::mmap::MmapRegionBuilder;
    let read_only = MmapRegionBuilder::new(4 * MIB)
        .with_mmap_prot(libc::PROT_READ)
        .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS)
        .build()
        .unwrap();
    let regions = vec![
        GuestRegionMmap::from_range(GuestAddress(0), 16 * MIB, None).unwrap(),
        GuestRegionMmap::new(read_only, GuestAddress(1 << 30)).unwrap(),
        GuestRegionMmap::from_range(GuestAddress(1 << 32), 16 * MIB, None).unwrap(),
    ];
    let mem: GuestMemoryMmap = GuestMemoryMmap::from_regions(regions).unwrap();
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let job = unsafe { start_guest_memory(&mem, &PreallocOptions::new().threads(2)) }.unwrap();
    assert_eq!(job.total_bytes(), 36 * MIB as u64);
    let results = job.join();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0].as_ref().unwrap().bytes, 16 * MIB as u64);
    assert!(
        matches!(results[1], Err(Error::UnsupportedMapping { .. })),
        "{:?}",
        results[1]
    );
    assert_eq!(results[2].as_ref().unwrap().bytes, 16 * MIB as u64);
    for (i, region) in mem.iter().enumerate().filter(|(i, _)| *i != 1) {
        assert_eq!(
            resident(region.as_ptr(), region.size()),
            region.size(),
            "{i}"
        );
    }
    // The blocking form finishes every region, then gives the first error.
    let err = preallocate_guest_memory(&mem, &PreallocOptions::new()).unwrap_err();
    assert!(matches!(err, Error::UnsupportedMapping { .. }), "{err}");
}
