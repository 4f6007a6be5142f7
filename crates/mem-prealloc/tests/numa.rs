// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! NUMA placement (`PreallocOptions::numa`): the policy is applied before
//! population and read back with `get_mempolicy`, the pages land on the
//! node, a missing node populates nothing, the workers run on the nodes'
//! CPUs, and the policy survives the touch fallback. This machine has one
//! node (0); the tests use whatever node 0 is.

mod common;

use std::sync::{Arc, Mutex};

use common::{
    memfd, node_of_page, policy_at, secretmem, skip, Mapping, MIB, MPOL_BIND, MPOL_DEFAULT,
    MPOL_INTERLEAVE, MPOL_PREFERRED,
};
use mem_prealloc::{preallocate, Error, Method, NumaPolicy, PreallocOptions, MAX_NODE};

fn node0_cpus() -> Vec<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/node/node0/cpulist").unwrap();
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

fn has_numa() -> bool {
    std::path::Path::new("/sys/devices/system/node/node0").is_dir()
}

#[test]
fn test_bound_pages_are_on_the_node() {
    if !has_numa() {
        return skip(
            "test_bound_pages_are_on_the_node",
            "no NUMA support in this kernel",
        );
    }
    for method in [Method::Auto, Method::PopulateWrite, Method::Touch] {
        let len = 16 * MIB;
        let file = memfd("numa", len, 0).unwrap();
        let map = Mapping::shared(&file, len);
        let opts = PreallocOptions::new()
            .method(method)
            .numa(NumaPolicy::Bind, [0]);
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let report = unsafe { preallocate(map.addr, len, &opts) }.unwrap();
        assert_eq!(report.bytes, len as u64);
        assert!(map.fully_resident(), "{method}");
        assert_eq!(policy_at(map.addr), (MPOL_BIND, 1), "{method}");
        for offset in (0..len).step_by(MIB) {
            // SAFETY: an address inside the mapping.
            let addr = unsafe { map.addr.add(offset) };
            assert_eq!(node_of_page(addr), Ok(0), "{method} offset {offset:#x}");
        }
    }
}

#[test]
fn test_every_policy_is_applied() {
    if !has_numa() {
        return skip(
            "test_every_policy_is_applied",
            "no NUMA support in this kernel",
        );
    }
    for (policy, mode) in [
        (NumaPolicy::Bind, MPOL_BIND),
        (NumaPolicy::Preferred, MPOL_PREFERRED),
        (NumaPolicy::Interleave, MPOL_INTERLEAVE),
    ] {
        let map = Mapping::anonymous(4 * MIB, libc::PROT_READ | libc::PROT_WRITE);
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        unsafe { preallocate(map.addr, map.len, &PreallocOptions::new().numa(policy, [0])) }
            .unwrap();
        assert_eq!(policy_at(map.addr), (mode, 1), "{policy}");
        assert!(map.fully_resident());
    }
}

#[test]
fn test_missing_node_is_an_error_and_nothing_is_populated() {
    let missing = (0..=MAX_NODE)
        .find(|n| !std::path::Path::new(&format!("/sys/devices/system/node/node{n}")).exists())
        .unwrap();
    let len = 8 * MIB;
    let file = memfd("numa-missing", len, 0).unwrap();
    let map = Mapping::shared(&file, len);
    for nodes in [vec![missing], vec![0, missing], vec![MAX_NODE + 1]] {
        let opts = PreallocOptions::new().numa(NumaPolicy::Bind, nodes.clone());
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let err = unsafe { preallocate(map.addr, len, &opts) }.unwrap_err();
        let Error::NumaNode { node } = err else {
            panic!("{nodes:?}: expected NumaNode, got {err}");
        };
        assert_eq!(node, *nodes.last().unwrap());
        assert_eq!(
            err.to_string(),
            format!("NUMA node {node} does not exist on this host")
        );
        assert_eq!(map.resident_pages(), 0);
        if has_numa() {
            assert_eq!(policy_at(map.addr).0, MPOL_DEFAULT, "policy left unchanged");
        }
    }
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err = unsafe {
        preallocate(
            map.addr,
            len,
            &PreallocOptions::new().numa(NumaPolicy::Interleave, []),
        )
    }
    .unwrap_err();
    assert!(matches!(err, Error::InvalidOption(_)), "{err}");
    assert_eq!(map.resident_pages(), 0);
}

#[test]
fn test_workers_run_on_the_node_cpus() {
    if !has_numa() {
        return skip(
            "test_workers_run_on_the_node_cpus",
            "no NUMA support in this kernel",
        );
    }
    let cpus = node0_cpus();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let len = 256 * MIB;
    let map = Mapping::anonymous(len, libc::PROT_READ | libc::PROT_WRITE);
    let opts = PreallocOptions::new()
        .numa(NumaPolicy::Bind, [0])
        .progress(move |_| {
            // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: a writable cpu_set_t of the size passed; 0 = this thread.
            let ret = unsafe {
                libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set)
            };
            assert_eq!(ret, 0);
            // SAFETY: CPU_ISSET reads one bit of `set` for cpu < CPU_SETSIZE.
            let mine: Vec<usize> = (0..1024)
                .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                .collect();
            sink.lock().unwrap().push(mine);
        });
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let report = unsafe { preallocate(map.addr, len, &opts) }.unwrap();
    assert!(report.threads <= cpus.len());
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    for mask in seen.iter() {
        assert_eq!(mask.len(), 1, "pinned to one cpu: {mask:?}");
        assert!(cpus.contains(&mask[0]), "{mask:?} not in node 0 {cpus:?}");
    }
}

#[test]
fn test_policy_survives_the_touch_fallback() {
    const TEST: &str = "test_policy_survives_the_touch_fallback";
    if !has_numa() {
        return skip(TEST, "no NUMA support in this kernel");
    }
    // memfd_secret refuses MADV_POPULATE_WRITE with EINVAL, so Auto touches.
    let len = 4 * MIB;
    let file = match secretmem(len) {
        Ok(file) => file,
        Err(why) => return skip(TEST, &why),
    };
    let map = Mapping::shared(&file, len);
    let opts = PreallocOptions::new().numa(NumaPolicy::Bind, [0]);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let report = unsafe { preallocate(map.addr, len, &opts) }.unwrap();
    assert_eq!(report.method, Method::Touch);
    assert_eq!(map.smaps_rss(), len);
    assert_eq!(policy_at(map.addr), (MPOL_BIND, 1));
    // The pages of a secret mapping cannot be looked up by get_mempolicy
    // (no GUP on secretmem); a touched memfd can.
    let file = memfd("numa-touch", len, 0).unwrap();
    let map = Mapping::shared(&file, len);
    let opts = opts.method(Method::Touch);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let report = unsafe { preallocate(map.addr, len, &opts) };
    assert_eq!(report.unwrap().method, Method::Touch);
    assert_eq!(policy_at(map.addr), (MPOL_BIND, 1));
    // SAFETY: an address inside the mapping.
    assert_eq!(node_of_page(unsafe { map.addr.add(len - 4096) }), Ok(0));
}

#[test]
fn test_refused_mbind_is_an_error_before_population() {
    if !has_numa() {
        return skip(
            "test_refused_mbind_is_an_error_before_population",
            "no NUMA support in this kernel",
        );
    }
    // A range with nothing mapped: mbind fails with EFAULT.
    let map = Mapping::anonymous(4 * MIB, libc::PROT_READ | libc::PROT_WRITE);
    let (addr, len) = (map.addr, map.len);
    drop(map);
    // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
    let err = unsafe {
        preallocate(
            addr,
            len,
            &PreallocOptions::new().numa(NumaPolicy::Bind, [0]),
        )
    }
    .unwrap_err();
    let Error::NumaBind { len: bound, .. } = &err else {
        panic!("expected NumaBind, got {err}");
    };
    assert_eq!(*bound, len as u64);
    assert_eq!(err.raw_os_error(), Some(libc::EFAULT));
    assert!(err.to_string().contains("cannot bind"), "{err}");
}

#[test]
fn test_hugetlbfs_pages_are_bound_to_the_node() {
    const TEST: &str = "test_hugetlbfs_pages_are_bound_to_the_node";
    if !has_numa() {
        return skip(TEST, "no NUMA support in this kernel");
    }
    let pool = match common::HugepagePool::grow(4) {
        Ok(pool) => pool,
        Err(why) => return skip(TEST, &why),
    };
    let len = 4 * 2 * MIB;
    let file = memfd("numa-huge", len, libc::MFD_HUGETLB).unwrap();
    let map = Mapping::shared(&file, len);
    for method in [Method::Auto, Method::Touch] {
        let opts = PreallocOptions::new()
            .method(method)
            .page_size_from_fd(&file)
            .unwrap()
            .numa(NumaPolicy::Bind, [0]);
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let report = unsafe { preallocate(map.addr, len, &opts) }.unwrap();
        assert_eq!(report.page_size, 2 * MIB);
        assert_eq!(policy_at(map.addr), (MPOL_BIND, 1), "{method}");
        // SAFETY: an address inside the mapping.
        assert_eq!(node_of_page(unsafe { map.addr.add(len - 4096) }), Ok(0));
    }
    drop(map);
    drop(file);
    drop(pool);
}
