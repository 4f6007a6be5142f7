// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Several regions in one job (`start_regions`): side-by-side filling, one
//! thread budget, per-region results, a failing region (hugetlbfs
//! exhaustion included) that does not stop the others, the rounded-down
//! tail and the `io::Error` conversion.

mod common;

use std::io;
use std::sync::{Arc, Mutex};

use common::{memfd, skip, HugepagePool, Mapping, MIB};
use mem_prealloc::{
    preallocate, preallocate_regions, start_regions, thread_count, Error, Method, PreallocOptions,
    Region,
};

const HUGE: usize = 2 * MIB;

fn rw_anon(len: usize) -> Mapping {
    Mapping::anonymous(len, libc::PROT_READ | libc::PROT_WRITE)
}

#[test]
fn test_regions_fill_side_by_side() {
    // One thread, so the order of the chunks is deterministic: 4 MiB chunks
    // taken from the two regions in turn.
    let (a, b) = (Arc::new(rw_anon(16 * MIB)), Arc::new(rw_anon(16 * MIB)));
    let at_half = Arc::new(Mutex::new(None));
    let (ca, cb, sink) = (Arc::clone(&a), Arc::clone(&b), Arc::clone(&at_half));
    let opts = PreallocOptions::new()
        .threads(1)
        .method(Method::PopulateWrite)
        .progress(move |done| {
            let mut slot = sink.lock().unwrap();
            if done >= 16 * MIB as u64 && slot.is_none() {
                *slot = Some((ca.resident_pages(), cb.resident_pages()));
            }
        });
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let results = preallocate_regions(
        &[unsafe { Region::new(a.addr, a.len) }, unsafe {
            Region::new(b.addr, b.len)
        }],
        &opts,
    )
    .unwrap();
    for result in &results {
        let report = result.as_ref().unwrap();
        assert_eq!(report.bytes, 16 * MIB as u64);
        assert_eq!(report.threads, 1);
    }
    let pages = 8 * MIB / mem_prealloc::base_page_size();
    assert_eq!(*at_half.lock().unwrap(), Some((pages, pages)));
    assert!(a.fully_resident() && b.fully_resident());
}

#[test]
fn test_regions_share_one_thread_budget() {
    let maps: Vec<Mapping> = [64 * MIB, 32 * MIB, 16 * MIB, 16 * MIB]
        .into_iter()
        .map(rw_anon)
        .collect();
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let regions: Vec<Region> = maps
        .iter()
        .map(|m| unsafe { Region::new(m.addr, m.len) })
        .collect();
    let opts = PreallocOptions::new().threads(2);
    let job = start_regions(&regions, &opts).unwrap();
    let expected = thread_count(128 * MIB, 4096, 2, Some(2), None).min(
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
    );
    assert_eq!(job.threads(), expected);
    assert_eq!(job.total_bytes(), 128 * MIB as u64);
    let results = job.join();
    assert_eq!(results.len(), 4);
    for (result, map) in results.iter().zip(&maps) {
        let report = result.as_ref().unwrap();
        assert_eq!(report.bytes, map.len as u64);
        assert_eq!(report.threads, expected);
        assert_eq!(report.method, Method::PopulateWrite);
        assert!(map.fully_resident());
    }
}

#[test]
fn test_a_failing_region_does_not_stop_the_others() {
    let good_a = rw_anon(32 * MIB);
    let bad = Mapping::anonymous(8 * MIB, libc::PROT_READ);
    let good_b = rw_anon(32 * MIB);
    for method in [Method::Auto, Method::PopulateWrite, Method::Touch] {
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let results = preallocate_regions(
            &[
                unsafe { Region::new(good_a.addr, good_a.len) },
                unsafe { Region::new(bad.addr, bad.len) },
                unsafe { Region::new(good_b.addr, good_b.len) },
            ],
            &PreallocOptions::new().threads(2).method(method),
        )
        .unwrap();
        assert_eq!(results[0].as_ref().unwrap().bytes, 32 * MIB as u64);
        let err = results[1].as_ref().unwrap_err();
        assert!(
            matches!(err, Error::UnsupportedMapping { offset: 0, .. }),
            "{method}: {err}"
        );
        assert_eq!(results[2].as_ref().unwrap().bytes, 32 * MIB as u64);
        assert!(good_a.fully_resident() && good_b.fully_resident());
    }
}

#[test]
fn test_hugetlbfs_exhaustion_in_a_concurrent_job_fails_only_that_region() {
    const TEST: &str = "test_hugetlbfs_exhaustion_in_a_concurrent_job_fails_only_that_region";
    for method in [Method::Auto, Method::Touch] {
        let (pool, available) = match HugepagePool::for_exhaustion(4) {
            Ok(found) => found,
            Err(why) => return skip(TEST, &why),
        };
        // The hugetlbfs region wants 4 pages more than the pool has
        // (MAP_NORESERVE: the shortage shows at fault time).
        let huge_len = (available + 4) * HUGE;
        let huge_file = memfd("exhaust-multi", huge_len, libc::MFD_HUGETLB).unwrap();
        let huge = Mapping::new(
            Some(&huge_file),
            huge_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE,
        )
        .unwrap();
        let shm_file = memfd("beside", 64 * MIB, 0).unwrap();
        let shm = Mapping::shared(&shm_file, 64 * MIB);
        let anon = rw_anon(64 * MIB);
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let results = preallocate_regions(
            &[
                unsafe { Region::new(shm.addr, shm.len) },
                unsafe { Region::new(huge.addr, huge.len) }.page_size(HUGE),
                unsafe { Region::new(anon.addr, anon.len) },
            ],
            &PreallocOptions::new().threads(2).method(method),
        )
        .unwrap();
        let err = results[1].as_ref().unwrap_err();
        let Error::HugepagesExhausted { offset, .. } = err else {
            panic!("{method}: expected HugepagesExhausted, got {err}");
        };
        assert_eq!(offset % HUGE as u64, 0);
        assert!(*offset >= (available * HUGE) as u64 / 2, "{offset:#x}");
        for (i, map) in [(0, &shm), (2, &anon)] {
            assert_eq!(
                results[i].as_ref().unwrap().bytes,
                map.len as u64,
                "{method}"
            );
            assert!(map.fully_resident(), "{method}: region {i}");
        }
        drop(huge);
        drop(huge_file);
        drop(pool);
    }
}

#[test]
fn test_an_invalid_region_populates_nothing() {
    let good = rw_anon(8 * MIB);
    let other = rw_anon(8 * MIB);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err = start_regions(
        &[
            unsafe { Region::new(good.addr, good.len) },
            // SAFETY: only an address computation inside the mapping.
            unsafe { Region::new(other.addr.add(100), 4 * MIB) },
        ],
        &PreallocOptions::new(),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Misaligned {
                what: "address",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(good.resident_pages(), 0);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err = start_regions(
        &[unsafe { Region::new(good.addr, good.len) }.page_size(3000)],
        &PreallocOptions::new(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidOption(_)), "{err}");
    assert_eq!(good.resident_pages(), 0);
}

#[test]
fn test_cancelled_regions_report_cancelled() {
    let a = rw_anon(64 * MIB);
    let b = rw_anon(64 * MIB);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let job = start_regions(
        &[unsafe { Region::new(a.addr, a.len) }, unsafe {
            Region::new(b.addr, b.len)
        }],
        &PreallocOptions::new().threads(1).method(Method::Touch),
    )
    .unwrap();
    job.cancel();
    let results = job.join();
    let mut done = 0;
    for result in results {
        match result {
            Err(Error::Cancelled { done: d, total }) => {
                assert_eq!(total, 64 * MIB as u64);
                done += d;
            }
            Ok(report) => done += report.bytes,
            Err(err) => panic!("{err}"),
        }
    }
    assert!(done < 128 * MIB as u64, "cancel had no effect");
}

#[test]
fn test_no_regions_and_empty_regions_succeed() {
    assert!(preallocate_regions(&[], &PreallocOptions::new())
        .unwrap()
        .is_empty());
    let map = rw_anon(4 * MIB);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let results = preallocate_regions(
        &[unsafe { Region::new(map.addr, 0) }],
        &PreallocOptions::new(),
    )
    .unwrap();
    let report = results[0].as_ref().unwrap();
    assert_eq!((report.bytes, report.threads), (0, 0));
}

#[test]
fn test_round_down_length_reports_the_tail() {
    let map = rw_anon(8 * MIB);
    let len = 4 * MIB + 100;
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err = unsafe { preallocate(map.addr, len, &PreallocOptions::new()) }.unwrap_err();
    assert!(
        matches!(err, Error::Misaligned { what: "length", .. }),
        "{err}"
    );
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let report = unsafe {
        preallocate(
            map.addr,
            len,
            &PreallocOptions::new().round_down_length(true),
        )
    }
    .unwrap();
    assert_eq!(report.bytes, 4 * MIB as u64);
    assert_eq!(report.tail, 100);
    assert_eq!(
        map.resident_pages() * mem_prealloc::base_page_size(),
        4 * MIB
    );
    // Shorter than one page: nothing to do, everything is tail.
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let report = unsafe {
        preallocate(
            map.addr,
            100,
            &PreallocOptions::new().round_down_length(true),
        )
    }
    .unwrap();
    assert_eq!((report.bytes, report.tail), (0, 100));
}

#[test]
fn test_errors_convert_to_io_errors() {
    let bad = Mapping::anonymous(MIB, libc::PROT_READ);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err = unsafe { preallocate(bad.addr, bad.len, &PreallocOptions::new()) }.unwrap_err();
    let errno = err.raw_os_error();
    let message = err.to_string();
    let io_err = io::Error::from(err);
    assert_eq!(
        Some(io_err.kind()),
        errno.map(|e| io::Error::from_raw_os_error(e).kind())
    );
    assert_eq!(io_err.to_string(), message);
    assert!(io_err.get_ref().unwrap().downcast_ref::<Error>().is_some());

    let io_err: io::Error = Error::InvalidOption("x".into()).into();
    assert_eq!(io_err.kind(), io::ErrorKind::InvalidInput);
    let io_err: io::Error = Error::Cancelled { done: 1, total: 2 }.into();
    assert_eq!(io_err.kind(), io::ErrorKind::Interrupted);
    let io_err: io::Error = Error::NumaNode { node: 7 }.into();
    assert_eq!(io_err.kind(), io::ErrorKind::InvalidInput);
}
