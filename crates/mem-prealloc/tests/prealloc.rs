// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Preallocation of memfd and anonymous regions: residency, preserved
//! contents, the thread formula, progress, cancellation, background jobs and
//! every error the raw API can return.

mod common;

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Barrier, Mutex};

use common::{check_pattern, first_allowed_cpu, memfd, write_pattern, Mapping, MIB};
use mem_prealloc::{
    preallocate, start, thread_count, CancelToken, Error, Method, PreallocOptions,
    MIN_BYTES_PER_THREAD, QEMU_MAX_THREADS,
};

const METHODS: [Method; 3] = [Method::Auto, Method::PopulateWrite, Method::Touch];

#[test]
fn test_memfd_region_is_fully_resident() {
    for method in METHODS {
        let len = 64 * MIB;
        let file = memfd("resident", len, 0).unwrap();
        let map = Mapping::shared(&file, len);
        assert_eq!(map.resident_pages(), 0);
        let opts = PreallocOptions::new().threads(2).method(method);
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let report = unsafe { preallocate(map.addr, len, &opts) }.unwrap();
        assert_eq!(report.bytes, len as u64, "{method}");
        assert!(map.fully_resident(), "{method}: mincore");
        assert_eq!(map.smaps_rss(), len, "{method}: smaps Rss");
        assert_ne!(report.method, Method::Auto);
        if method != Method::Auto {
            assert_eq!(report.method, method);
        }
        assert_eq!(report.page_size, mem_prealloc::base_page_size());
        assert!(report.threads >= 1 && report.threads <= 2);
    }
}

/// A page size larger than the mapping's own pages (2 MiB asked for a
/// 4 KiB memfd) still populates every base page: the huge-page path faults
/// each page at its last base page first (so that the kernel clears a real
/// huge page in ascending order), then over its whole length.
#[test]
fn test_page_size_larger_than_the_mapping_populates_every_page() {
    let huge = 2 * MIB;
    let len = 8 * MIB;
    let file = memfd("oversized-page", len, 0).unwrap();
    // A 2 MiB-aligned window for the file inside a reservation that owns
    // the whole range (one owner, so nothing is unmapped twice).
    let window = Mapping::new(
        None,
        len + huge,
        libc::PROT_NONE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
    )
    .unwrap();
    let aligned = (window.addr as usize).next_multiple_of(huge);
    // SAFETY: replaces part of the reservation this test owns.
    let addr = unsafe {
        libc::mmap(
            aligned as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_eq!(addr as usize, aligned);
    let view = std::mem::ManuallyDrop::new(Mapping {
        addr: addr.cast(),
        len,
    });
    assert_eq!(view.resident_pages(), 0);
    let opts = PreallocOptions::new()
        .threads(2)
        .page_size(huge)
        .method(Method::PopulateWrite);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let report = unsafe { preallocate(view.addr, len, &opts) }.unwrap();
    assert_eq!(report.page_size, huge);
    assert_eq!(report.bytes, len as u64);
    assert!(view.fully_resident(), "every 4 KiB page populated");
    drop(window);
}

#[test]
fn test_anonymous_private_region_is_fully_resident() {
    for method in [Method::PopulateWrite, Method::Touch] {
        let len = 16 * MIB;
        let map = Mapping::anonymous(len, libc::PROT_READ | libc::PROT_WRITE);
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        unsafe { preallocate(map.addr, len, &PreallocOptions::new().method(method)) }.unwrap();
        assert!(map.fully_resident(), "{method}");
        assert_eq!(map.smaps_rss(), len, "{method}");
    }
}

#[test]
fn test_existing_data_is_preserved() {
    for method in [Method::Touch, Method::PopulateWrite] {
        let len = 32 * MIB;
        let file = memfd("preserve", len, 0).unwrap();
        // Every third page holds data; the others are holes.
        let stride = 3 * mem_prealloc::base_page_size();
        write_pattern(&file, len, stride);
        let map = Mapping::shared(&file, len);
        // Some pages are already mapped and dirty through the mapping too.
        // SAFETY: within the mapping; nothing else accesses it yet.
        unsafe { map.addr.add(len - 8).write_volatile(0xa5) };
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        unsafe {
            preallocate(
                map.addr,
                len,
                &PreallocOptions::new().threads(2).method(method),
            )
        }
        .unwrap();
        assert!(map.fully_resident(), "{method}");
        check_pattern(&map, stride);
        assert_eq!(map.as_slice()[len - 8], 0xa5, "{method}");
        assert_eq!(
            map.as_slice()[mem_prealloc::base_page_size()],
            0,
            "{method}: hole"
        );
    }
}

#[test]
fn test_touch_preserves_concurrent_writes() {
    let len = 16 * MIB;
    let page = mem_prealloc::base_page_size();
    let file = memfd("concurrent", len, 0).unwrap();
    let map = Arc::new(Mapping::shared(&file, len));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(Barrier::new(2));
    let writer = {
        let (map, stop, started) = (Arc::clone(&map), Arc::clone(&stop), Arc::clone(&started));
        std::thread::spawn(move || {
            let mut rounds = 0u32;
            started.wait();
            while !stop.load(Ordering::Relaxed) || rounds == 0 {
                for off in (0..map.len).step_by(page) {
                    // SAFETY: in bounds and 4-byte aligned; every access to
                    // this word is atomic.
                    let word = unsafe { AtomicU32::from_ptr(map.addr.add(off).cast()) };
                    word.fetch_add(1, Ordering::Relaxed);
                }
                rounds += 1;
            }
            rounds
        })
    };
    let opts = PreallocOptions::new().threads(1).method(Method::Touch);
    started.wait();
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    unsafe { preallocate(map.addr, len, &opts) }.unwrap();
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    for off in (0..len).step_by(page) {
        // SAFETY: as in the writer, which has finished.
        let word = unsafe { AtomicU32::from_ptr(map.addr.add(off).cast()) };
        assert_eq!(
            word.load(Ordering::Relaxed),
            rounds,
            "lost store at {off:#x}"
        );
    }
}

#[test]
fn test_thread_count_formula() {
    const GIB: usize = 1 << 30;
    let page = 4096;
    // QEMU without the hard cap: one thread per CPU for large regions.
    assert_eq!(thread_count(64 * GIB, page, 64, None, None), 64);
    assert_eq!(
        thread_count(64 * GIB, page, 64, None, Some(QEMU_MAX_THREADS)),
        16
    );
    assert_eq!(thread_count(64 * GIB, page, 64, Some(8), None), 8);
    assert_eq!(thread_count(64 * GIB, page, 4, Some(8), None), 4);
    // size / 64 MiB.
    assert_eq!(
        thread_count(3 * MIN_BYTES_PER_THREAD, page, 64, None, None),
        3
    );
    assert_eq!(
        thread_count(MIN_BYTES_PER_THREAD - page, page, 64, None, None),
        1
    );
    // Never more threads than pages (1 GiB pages).
    assert_eq!(thread_count(2 * GIB, GIB, 64, None, None), 2);
    // Degenerate inputs still give one thread.
    assert_eq!(thread_count(0, page, 64, None, None), 1);
    assert_eq!(thread_count(4 * GIB, page, 0, None, None), 1);
}

#[test]
fn test_report_uses_the_formula_and_the_cpu_list() {
    let len = 4 * MIN_BYTES_PER_THREAD;
    let map = Mapping::new(
        None,
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
    )
    .unwrap();
    let cpus = std::thread::available_parallelism().unwrap().get();
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let report = unsafe { preallocate(map.addr, len, &PreallocOptions::new()) }.unwrap();
    assert_eq!(report.threads, cpus.min(4));
    // Three threads requested on one CPU: the CPU list bounds the default only.
    let cpu = first_allowed_cpu();
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let report =
        unsafe { preallocate(map.addr, len, &PreallocOptions::new().cpus([cpu])) }.unwrap();
    assert_eq!(report.threads, 1);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let report = unsafe {
        preallocate(
            map.addr,
            len,
            &PreallocOptions::new().cpus([cpu]).threads(3),
        )
    }
    .unwrap();
    assert_eq!(
        report.threads, 1,
        "requested threads still bounded by the list"
    );
}

#[test]
fn test_workers_run_on_the_given_cpu() {
    let len = 16 * MIB;
    let file = memfd("affinity", len, 0).unwrap();
    let map = Mapping::shared(&file, len);
    let cpus_seen = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&cpus_seen);
    let cpu = first_allowed_cpu();
    let opts = PreallocOptions::new().cpus([cpu]).progress(move |_| {
        // SAFETY: sched_getcpu has no preconditions.
        seen.lock().unwrap().push(unsafe { libc::sched_getcpu() });
    });
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    unsafe { preallocate(map.addr, len, &opts) }.unwrap();
    let seen = cpus_seen.lock().unwrap();
    assert!(!seen.is_empty());
    assert!(
        seen.iter().all(|&seen_cpu| seen_cpu == cpu as i32),
        "{seen:?}"
    );
}

#[test]
fn test_progress_is_monotonic_and_reaches_total() {
    for method in [Method::PopulateWrite, Method::Touch] {
        let len = 96 * MIB;
        let file = memfd("progress", len, 0).unwrap();
        let map = Mapping::shared(&file, len);
        let calls = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&calls);
        let opts = PreallocOptions::new()
            .threads(2)
            .method(method)
            .progress(move |done| sink.lock().unwrap().push(done));
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        unsafe { preallocate(map.addr, len, &opts) }.unwrap();
        let calls = calls.lock().unwrap();
        assert!(calls.len() > 1, "{method}: {calls:?}");
        assert!(calls.windows(2).all(|w| w[0] < w[1]), "{method}: {calls:?}");
        assert_eq!(*calls.last().unwrap(), len as u64, "{method}");
    }
}

#[test]
fn test_cancel_from_progress_stops_early() {
    for method in [Method::PopulateWrite, Method::Touch] {
        let len = 128 * MIB;
        let file = memfd("cancel", len, 0).unwrap();
        let map = Mapping::shared(&file, len);
        let token = CancelToken::new();
        let cancel = token.clone();
        let opts = PreallocOptions::new()
            .threads(1)
            .method(method)
            .cancel_token(token)
            .progress(move |_| cancel.cancel());
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let err = unsafe { preallocate(map.addr, len, &opts) }.unwrap_err();
        let Error::Cancelled { done, total } = err else {
            panic!("{method}: {err}");
        };
        assert_eq!(total, len as u64);
        assert!(done > 0 && done < total, "{method}: {done}");
        assert_eq!(
            map.resident_pages() * mem_prealloc::base_page_size(),
            done as usize
        );
        assert_eq!(
            Error::Cancelled { done, total }.to_string(),
            format!("preallocation cancelled after {done} of {total} bytes")
        );
    }
}

#[test]
fn test_cancelled_token_touches_nothing() {
    let len = 8 * MIB;
    let file = memfd("precancel", len, 0).unwrap();
    let map = Mapping::shared(&file, len);
    let token = CancelToken::new();
    token.cancel();
    let opts = PreallocOptions::new().cancel_token(token);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err = unsafe { preallocate(map.addr, len, &opts) }.unwrap_err();
    assert!(matches!(err, Error::Cancelled { done: 0, .. }), "{err}");
    assert_eq!(map.resident_pages(), 0);
}

#[test]
fn test_job_cancel_and_drop() {
    let len = 256 * MIB;
    let file = memfd("jobcancel", len, 0).unwrap();
    let map = Mapping::shared(&file, len);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let job = unsafe { start(map.addr, len, &PreallocOptions::new().threads(1)) }.unwrap();
    job.cancel();
    match job.join() {
        Err(Error::Cancelled { done, total }) => assert!(done < total),
        // On a fast machine the job may finish before it sees the flag.
        Ok(report) => assert_eq!(report.bytes, len as u64),
        Err(err) => panic!("{err}"),
    }
    // Dropping a running job stops and joins it; the mapping outlives it.
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let job = unsafe { start(map.addr, len, &PreallocOptions::new()) }.unwrap();
    assert_eq!(job.total_bytes(), len as u64);
    drop(job);
}

#[test]
fn test_two_async_jobs_run_at_once() {
    let len = 64 * MIB;
    let files = [
        memfd("job-a", len, 0).unwrap(),
        memfd("job-b", len, 0).unwrap(),
    ];
    let maps: Vec<Mapping> = files.iter().map(|f| Mapping::shared(f, len)).collect();
    let opts = PreallocOptions::new().threads(2).method(Method::Touch);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let jobs: Vec<_> = maps
        .iter()
        .map(|m| unsafe { start(m.addr, m.len, &opts) }.unwrap())
        .collect();
    // Both are running before either is joined.
    assert!(jobs
        .iter()
        .all(|j| j.threads() >= 1 && j.method() == Method::Touch));
    for job in jobs {
        let report = job.join().unwrap();
        assert_eq!(report.bytes, len as u64);
    }
    assert!(maps.iter().all(Mapping::fully_resident));
}

#[test]
fn test_empty_region_succeeds_without_threads() {
    let map = Mapping::anonymous(4096, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let report = unsafe { preallocate(map.addr, 0, &PreallocOptions::new()) }.unwrap();
    assert_eq!((report.bytes, report.threads), (0, 0));
}

#[test]
fn test_misaligned_address_and_length_are_rejected() {
    let map = Mapping::anonymous(8 * MIB, libc::PROT_READ | libc::PROT_WRITE);
    let page = mem_prealloc::base_page_size();
    // SAFETY: the mapping is this test's own; the address stays inside it.
    let err = unsafe { preallocate(map.addr.add(1), page, &PreallocOptions::new()) }.unwrap_err();
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
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err = unsafe { preallocate(map.addr, page + 1, &PreallocOptions::new()) }.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "length {:#x} is not a multiple of the page size {page:#x}",
            page + 1
        )
    );
    // With 2 MiB pages, 3 MiB is not a whole number of pages (QEMU's check).
    let opts = PreallocOptions::new().page_size(2 * MIB);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err = unsafe { preallocate(map.addr, 3 * MIB, &opts) }.unwrap_err();
    assert!(matches!(err, Error::Misaligned { .. }), "{err}");
}

#[test]
fn test_invalid_options_are_rejected() {
    let map = Mapping::anonymous(MIB, libc::PROT_READ | libc::PROT_WRITE);
    let cases = [
        (
            PreallocOptions::new().threads(0),
            "thread count must be at least 1",
        ),
        (
            PreallocOptions::new().max_threads(0),
            "maximum thread count must be at least 1",
        ),
        (PreallocOptions::new().cpus([5000]), "cpu 5000 is beyond"),
        (
            PreallocOptions::new().page_size(3 << 12),
            "is not a power of two",
        ),
        (
            PreallocOptions::new().page_size(512),
            "is not a power of two",
        ),
    ];
    for (opts, message) in cases {
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let err = unsafe { preallocate(map.addr, MIB, &opts) }.unwrap_err();
        assert!(matches!(err, Error::InvalidOption(_)), "{err}");
        assert!(err.to_string().contains(message), "{err}");
    }
}

#[test]
fn test_invalid_range_is_rejected() {
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err =
        unsafe { preallocate(std::ptr::null_mut(), 4096, &PreallocOptions::new()) }.unwrap_err();
    assert!(
        matches!(err, Error::InvalidRange { addr: 0, len: 4096 }),
        "{err}"
    );
    let top = (usize::MAX - 4095) as *mut u8;
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err = unsafe { preallocate(top, 8192, &PreallocOptions::new()) }.unwrap_err();
    assert!(matches!(err, Error::InvalidRange { .. }), "{err}");
}

#[test]
fn test_unmapped_range_is_an_error() {
    for method in [Method::PopulateWrite, Method::Touch] {
        let map = Mapping::anonymous(8 * MIB, libc::PROT_READ | libc::PROT_WRITE);
        // Punch a hole in the middle.
        // SAFETY: unmaps part of our own mapping, which nothing else uses.
        let ret = unsafe { libc::munmap(map.addr.add(4 * MIB).cast(), MIB) };
        assert_eq!(ret, 0);
        let opts = PreallocOptions::new().threads(1).method(method);
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let err = unsafe { preallocate(map.addr, 8 * MIB, &opts) }.unwrap_err();
        let Error::NotMapped { offset, .. } = err else {
            panic!("{method}: {err}");
        };
        assert_eq!(offset, 4 * MIB as u64, "{method}");
    }
}

#[test]
fn test_read_only_mapping_is_unsupported() {
    for method in METHODS {
        let len = 4 * MIB;
        let file = memfd("readonly", len, 0).unwrap();
        let map = Mapping::new(Some(&file), len, libc::PROT_READ, libc::MAP_SHARED).unwrap();
        let opts = PreallocOptions::new().method(method);
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let err = unsafe { preallocate(map.addr, len, &opts) }.unwrap_err();
        assert!(
            matches!(err, Error::UnsupportedMapping { offset: 0, .. }),
            "{method}: {err}"
        );
        assert!(err.raw_os_error().is_some());
        assert!(
            err.to_string()
                .starts_with("mapping at offset 0x0 cannot be preallocated ("),
            "{err}"
        );
    }
}

#[test]
fn test_offline_cpu_is_an_affinity_error() {
    let map = Mapping::anonymous(MIB, libc::PROT_READ | libc::PROT_WRITE);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err =
        unsafe { preallocate(map.addr, MIB, &PreallocOptions::new().cpus([1000])) }.unwrap_err();
    assert!(matches!(err, Error::Affinity { cpu: 1000, .. }), "{err}");
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    // Nothing was touched: the workers wait at the gate until all are pinned.
    assert_eq!(map.resident_pages(), 0);
}

#[test]
fn test_panicking_progress_callback_fails_the_job() {
    let len = 8 * MIB;
    let file = memfd("panic", len, 0).unwrap();
    let map = Mapping::shared(&file, len);
    let opts = PreallocOptions::new()
        .threads(2)
        .progress(|_| panic!("progress callback panics on purpose"));
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err = unsafe { preallocate(map.addr, len, &opts) }.unwrap_err();
    assert!(matches!(err, Error::WorkerPanicked), "{err}");
}
