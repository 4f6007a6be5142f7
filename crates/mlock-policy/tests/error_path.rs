// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The actionable errors, in child processes without CAP_IPC_LOCK and with
//! a small RLIMIT_MEMLOCK.

mod common;

use common::*;
use mlock_policy::{Error, MlockPolicy};

/// Checks that `err` is the actionable shortfall error for `op`, needing at
/// least `min_needed` bytes, against a limit of `limit`.
fn assert_actionable(err: &Error, policy: MlockPolicy, op: &str, min_needed: u64, limit: &str) {
    let msg = err.to_string();
    println!("{msg}");
    let Error::Insufficient(shortfall) = err else {
        panic!("expected Error::Insufficient, got {err:?}");
    };
    assert!(shortfall.needed() >= min_needed, "{msg}");
    let kib = shortfall.needed().div_ceil(1024);
    let prefix = format!("cannot lock memory for mem-lock={policy}: {op} needs ");
    assert!(msg.starts_with(&prefix), "{msg}");
    for part in [
        format!(
            "of locked memory but RLIMIT_MEMLOCK is {limit} and the process lacks CAP_IPC_LOCK"
        ),
        format!("raise the limit to at least {kib} KiB"),
        format!("`ulimit -l {kib}`"),
        format!("`LimitMEMLOCK={}`", kib * 1024),
        "or grant CAP_IPC_LOCK".to_string(),
    ] {
        assert!(msg.contains(&part), "missing {part:?} in {msg}");
    }
}

#[test]
fn test_without_cap_ipc_lock_errors_name_the_remedies() {
    in_child("test_without_cap_ipc_lock_errors_name_the_remedies", || {
        let ram = Mapping::new(64 << 20);
        set_memlock_limit(MIB);
        if is_root() {
            drop_cap_ipc_lock();
        }
        let limit = "1.0 MiB (1048576 bytes)";

        // The pre-flight checks fail before anything is locked.
        for policy in [MlockPolicy::On, MlockPolicy::OnFault] {
            let err = policy.preflight(GIB).unwrap_err();
            assert_actionable(&err, policy, "mlockall", GIB, limit);
            let err = policy.preflight_regions(GIB).unwrap_err();
            assert_actionable(&err, policy, "mlock", GIB, limit);
        }
        MlockPolicy::Off.preflight(GIB).unwrap();

        // Process-wide: mlockall fails with ENOMEM, turned into the
        // actionable error that also carries the OS error.
        for policy in [MlockPolicy::On, MlockPolicy::OnFault] {
            let err = policy.apply_process().unwrap_err();
            assert_actionable(&err, policy, "mlockall", 64 * MIB, limit);
            assert!(
                err.to_string()
                    .contains("(mlockall: Cannot allocate memory (os error 12))"),
                "{err}"
            );
        }
        assert_eq!(status().vm_lck(), 0);

        // Per region.
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let err = unsafe { MlockPolicy::On.lock_region(ram.ptr(), ram.len()) }.unwrap_err();
        assert_actionable(&err, MlockPolicy::On, "mlock", 64 * MIB, limit);
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let err = unsafe { MlockPolicy::OnFault.lock_region(ram.ptr(), ram.len()) }.unwrap_err();
        assert_actionable(
            &err,
            MlockPolicy::OnFault,
            "mlock2(MLOCK_ONFAULT)",
            64 * MIB,
            limit,
        );
        assert_eq!(status().vm_lck(), 0);

        // What fits under the limit still works.
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let small = unsafe { MlockPolicy::OnFault.lock_region(ram.ptr(), 512 << 10) }.unwrap();
        assert_eq!(status().vm_lck(), 512 << 10);
        drop(small);
    });
}

#[test]
fn test_zero_limit_eperm_is_actionable() {
    in_child("test_zero_limit_eperm_is_actionable", || {
        let ram = Mapping::new(4 << 20);
        set_memlock_limit(0);
        if is_root() {
            drop_cap_ipc_lock();
        }
        let err = MlockPolicy::On.apply_process().unwrap_err();
        assert_actionable(&err, MlockPolicy::On, "mlockall", 4 * MIB, "0 bytes");
        assert!(err.to_string().contains("(os error 1)"), "{err}");
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let err = unsafe { MlockPolicy::OnFault.lock_region(ram.ptr(), ram.len()) }.unwrap_err();
        assert_actionable(
            &err,
            MlockPolicy::OnFault,
            "mlock2(MLOCK_ONFAULT)",
            4 * MIB,
            "0 bytes",
        );
        assert!(err.to_string().contains("(os error 1)"), "{err}");
    });
}

#[test]
fn test_unprivileged_user_gets_the_actionable_error() {
    in_child("test_unprivileged_user_gets_the_actionable_error", || {
        set_memlock_limit(2 * MIB);
        if is_root() {
            // Switching to nobody (65534) clears every capability.
            // SAFETY: setgid/setuid have no memory-safety preconditions;
            // glibc applies them to every thread.
            unsafe {
                assert_eq!(libc::setgid(65534), 0);
                assert_eq!(libc::setuid(65534), 0);
            }
        }
        let budget = mlock_policy::LockBudget::current().unwrap();
        assert!(!budget.has_cap_ipc_lock());
        assert_eq!(budget.soft_limit(), Some(2 * MIB));
        let err = MlockPolicy::On.apply_process().unwrap_err();
        assert_actionable(
            &err,
            MlockPolicy::On,
            "mlockall",
            2 * MIB,
            "2.0 MiB (2097152 bytes)",
        );
        let err = MlockPolicy::OnFault.preflight(GIB).unwrap_err();
        assert_actionable(
            &err,
            MlockPolicy::OnFault,
            "mlockall",
            GIB,
            "2.0 MiB (2097152 bytes)",
        );
    });
}

#[cfg(feature = "vm-memory")]
#[test]
fn test_guest_memory_shortfall_names_the_total() {
    use vm_memory::{GuestAddress, GuestMemoryMmap};
    in_child("test_guest_memory_shortfall_names_the_total", || {
        let mem: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 16 << 20),
            (GuestAddress(1 << 32), 16 << 20),
        ])
        .unwrap();
        set_memlock_limit(MIB);
        if is_root() {
            drop_cap_ipc_lock();
        }
        let err = MlockPolicy::OnFault.lock_guest_memory(&mem).unwrap_err();
        assert_actionable(
            &err,
            MlockPolicy::OnFault,
            "mlock",
            32 * MIB,
            "1.0 MiB (1048576 bytes)",
        );
        assert_eq!(status().vm_lck(), 0);
    });
}
