// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Locking in child processes: each policy process-wide and per region,
//! with 1 GiB regions, and the temporary unlocks.

mod common;

use common::*;
use mlock_policy::{Error, LockBudget, MlockPolicy};

/// 1 GiB, the size of a small guest's RAM.
const REGION: usize = 1 << 30;
/// The part touched to watch lock-on-fault grow.
const TOUCH: usize = 256 << 20;
/// Slack for what the test binary itself faults in or locks.
const SLACK: u64 = 64 * MIB;

#[test]
fn test_process_on_locks_and_faults_in_everything() {
    in_child("test_process_on_locks_and_faults_in_everything", || {
        let ram = Mapping::new(REGION);
        let before = status();
        if !can_lock(before.vm_size() + SLACK, "mem-lock=on") {
            return;
        }
        MlockPolicy::On.apply_process().unwrap();
        let after = status();
        println!("on: before {before:?}, after {after:?}");
        let rss_growth = after.vm_rss() - before.vm_rss();
        assert!(rss_growth >= GIB * 95 / 100, "RSS grew by {rss_growth}");
        assert!(rss_growth <= GIB + 256 * MIB, "RSS grew by {rss_growth}");
        assert!(after.vm_lck() >= GIB, "VmLck {}", after.vm_lck());
        assert!(locked_resident() >= GIB * 95 / 100);
        MlockPolicy::On.release_process().unwrap();
        assert_eq!(status().vm_lck(), 0);
        drop(ram);
    });
}

#[test]
fn test_process_on_fault_locks_pages_as_touched() {
    in_child("test_process_on_fault_locks_pages_as_touched", || {
        let ram = Mapping::new(REGION);
        let before = status();
        if !can_lock(before.vm_size() + SLACK, "mem-lock=on-fault") {
            return;
        }
        MlockPolicy::OnFault.apply_process().unwrap();
        let after = status();
        println!("on-fault: before {before:?}, after {after:?}");
        // Nothing was faulted in ...
        assert!(
            after.vm_rss() < before.vm_rss() + SLACK,
            "RSS grew by {}",
            after.vm_rss() - before.vm_rss()
        );
        // ... but the whole mapping is charged to the lock accounting.
        assert!(after.vm_lck() >= GIB, "VmLck {}", after.vm_lck());
        let locked_before = locked_resident();
        assert!(locked_before < after.vm_rss() + 1, "{locked_before}");
        // Touched pages become resident and locked.
        ram.touch(TOUCH);
        let touched = status();
        let locked_after = locked_resident();
        println!("on-fault after touching {TOUCH}: {touched:?}, locked {locked_after}");
        assert!(locked_after >= locked_before + TOUCH as u64 * 95 / 100);
        assert!(touched.vm_rss() >= after.vm_rss() + TOUCH as u64 * 95 / 100);
        assert!(touched.vm_rss() < after.vm_rss() + TOUCH as u64 + SLACK);
        MlockPolicy::OnFault.release_process().unwrap();
        assert_eq!(status().vm_lck(), 0);
    });
}

#[test]
fn test_process_off_locks_nothing() {
    in_child("test_process_off_locks_nothing", || {
        let ram = Mapping::new(REGION);
        let before = status();
        MlockPolicy::Off.apply_process().unwrap();
        ram.touch(TOUCH);
        let after = status();
        assert_eq!(after.vm_lck(), 0);
        assert_eq!(locked_resident(), 0);
        assert!(after.vm_rss() >= before.vm_rss() + TOUCH as u64 * 95 / 100);
        assert!(after.vm_rss() < before.vm_rss() + TOUCH as u64 + SLACK);
    });
}

#[test]
fn test_region_on_locks_faults_in_and_unlocks_on_drop() {
    in_child("test_region_on_locks_faults_in_and_unlocks_on_drop", || {
        let ram = Mapping::new(REGION);
        if !can_lock(GIB, "region lock (on)") {
            return;
        }
        let before = status();
        assert_eq!(before.vm_lck(), 0);
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let lock = unsafe { MlockPolicy::On.lock_region(ram.ptr(), ram.len()) }.unwrap();
        assert!(lock.is_locked());
        let after = status();
        // Only the region is locked, and it is all resident.
        assert_eq!(after.vm_lck(), GIB);
        assert!(after.vm_rss() >= before.vm_rss() + GIB * 95 / 100);
        assert!(locked_resident() >= GIB * 95 / 100);
        drop(lock);
        assert_eq!(status().vm_lck(), 0);
        assert_eq!(locked_resident(), 0);
    });
}

#[test]
fn test_region_on_fault_locks_pages_as_touched() {
    in_child("test_region_on_fault_locks_pages_as_touched", || {
        let ram = Mapping::new(REGION);
        if !can_lock(GIB, "region lock (on-fault)") {
            return;
        }
        let before = status();
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let lock = unsafe { MlockPolicy::OnFault.lock_region(ram.ptr(), ram.len()) }.unwrap();
        let after = status();
        assert_eq!(after.vm_lck(), GIB);
        assert!(after.vm_rss() < before.vm_rss() + SLACK);
        assert!(locked_resident() < SLACK);
        ram.touch(TOUCH);
        let locked = locked_resident();
        assert!(locked >= TOUCH as u64 * 95 / 100, "locked {locked}");
        assert!(locked < TOUCH as u64 + SLACK, "locked {locked}");
        drop(lock);
        assert_eq!(status().vm_lck(), 0);
        assert_eq!(locked_resident(), 0);
    });
}

#[test]
fn test_region_off_locks_nothing() {
    in_child("test_region_off_locks_nothing", || {
        let ram = Mapping::new(64 << 20);
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let lock = unsafe { MlockPolicy::Off.lock_region(ram.ptr(), ram.len()) }.unwrap();
        assert!(!lock.is_locked());
        ram.touch(ram.len());
        assert_eq!(status().vm_lck(), 0);
        assert_eq!(locked_resident(), 0);
    });
}

#[test]
fn test_process_with_unlocked_restores_the_lock() {
    in_child("test_process_with_unlocked_restores_the_lock", || {
        let _ram = Mapping::new(64 << 20);
        if !can_lock(status().vm_size() + SLACK, "process with_unlocked") {
            return;
        }
        let policy = MlockPolicy::OnFault;
        policy.apply_process().unwrap();
        let locked = status().vm_lck();
        assert!(locked >= 64 * MIB);
        let inside = policy.with_unlocked(|| status().vm_lck()).unwrap();
        assert_eq!(inside, 0);
        assert!(status().vm_lck() >= locked);

        // The explicit guard.
        let guard = policy.unlock_temporarily().unwrap();
        assert_eq!(status().vm_lck(), 0);
        guard.relock().unwrap();
        assert!(status().vm_lck() >= locked);

        // A panic inside re-locks while unwinding.
        let caught = std::panic::catch_unwind(|| {
            policy
                .with_unlocked(|| {
                    assert_eq!(status().vm_lck(), 0);
                    panic!("postcopy failed");
                })
                .unwrap()
        });
        assert!(caught.is_err());
        assert!(status().vm_lck() >= locked);
        policy.release_process().unwrap();
    });
}

#[test]
fn test_region_with_unlocked_restores_the_lock() {
    in_child("test_region_with_unlocked_restores_the_lock", || {
        let ram = Mapping::new(64 << 20);
        if !can_lock(64 * MIB, "region with_unlocked") {
            return;
        }
        for policy in [MlockPolicy::On, MlockPolicy::OnFault] {
            // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
            let mut lock = unsafe { policy.lock_region(ram.ptr(), ram.len()) }.unwrap();
            assert_eq!(status().vm_lck(), 64 * MIB);
            let inside = lock
                .with_unlocked(|| (status().vm_lck(), locked_resident()))
                .unwrap();
            assert_eq!(inside, (0, 0));
            assert!(lock.is_locked());
            assert_eq!(status().vm_lck(), 64 * MIB);

            let guard = lock.unlock_temporarily().unwrap();
            assert_eq!(status().vm_lck(), 0);
            drop(guard); // re-locks on drop
            assert!(lock.is_locked());
            assert_eq!(status().vm_lck(), 64 * MIB);
            drop(lock);
            assert_eq!(status().vm_lck(), 0);
        }
    });
}

#[test]
fn test_failed_relock_is_reported_not_panicked() {
    in_child("test_failed_relock_is_reported_not_panicked", || {
        let ram = Mapping::new(64 << 20);
        if !LockBudget::current().unwrap().has_cap_ipc_lock() {
            println!("SKIP: needs CAP_IPC_LOCK to lock first and drop it later");
            return;
        }
        // SAFETY: the test owns the mapping and keeps it while the job or guard lives.
        let mut lock = unsafe { MlockPolicy::OnFault.lock_region(ram.ptr(), ram.len()) }.unwrap();
        MlockPolicy::OnFault.apply_process().unwrap();
        let guard = MlockPolicy::OnFault.unlock_temporarily().unwrap();
        // munlockall cleared the region lock too; the region guard does
        // not know, which is the documented limit of mixing both.
        assert_eq!(status().vm_lck(), 0);
        set_memlock_limit(MIB);
        drop_cap_ipc_lock();
        let err = guard.relock().unwrap_err();
        let msg = err.to_string();
        println!("{msg}");
        assert!(
            msg.starts_with(
                "re-locking memory after a temporary unlock failed, it stays unlocked: \
                 cannot lock memory for mem-lock=on-fault: mlockall needs "
            ),
            "{msg}"
        );
        assert!(matches!(&err, Error::Relock(inner) if matches!(**inner, Error::Insufficient(_))));
        assert_eq!(status().vm_lck(), 0);

        // The same through a region guard: reported, and the region stays
        // unlocked (and is not unlocked twice on drop).
        let guard = lock.unlock_temporarily().unwrap();
        let err = guard.relock().unwrap_err();
        assert!(
            err.to_string()
                .contains("mlock2(MLOCK_ONFAULT) needs 64.0 MiB"),
            "{err}"
        );
        assert!(!lock.is_locked());
        // Dropping a guard whose re-lock fails logs instead of panicking.
        drop(lock.unlock_temporarily().unwrap());
        assert!(!lock.is_locked());
    });
}

#[cfg(feature = "vm-memory")]
#[test]
fn test_guest_memory_regions_lock_and_unlock() {
    use vm_memory::{GuestAddress, GuestMemoryMmap};
    in_child("test_guest_memory_regions_lock_and_unlock", || {
        if !can_lock(128 * MIB, "guest memory lock") {
            return;
        }
        let mem: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 32 << 20),
            (GuestAddress(1 << 32), 64 << 20),
        ])
        .unwrap();
        let mut lock = MlockPolicy::OnFault.lock_guest_memory(&mem).unwrap();
        assert_eq!(lock.regions().len(), 2);
        assert_eq!(lock.total_len(), 96 * MIB);
        assert!(lock.regions().iter().all(|r| r.is_locked()));
        assert_eq!(status().vm_lck(), 96 * MIB);
        assert!(locked_resident() < SLACK);
        let inside = lock.with_unlocked(|| status().vm_lck()).unwrap();
        assert_eq!(inside, 0);
        assert_eq!(status().vm_lck(), 96 * MIB);
        drop(lock);
        assert_eq!(status().vm_lck(), 0);

        let lock = MlockPolicy::On.lock_guest_memory(&mem).unwrap();
        assert_eq!(status().vm_lck(), 96 * MIB);
        assert!(locked_resident() >= 96 * MIB);
        drop(lock);

        let lock = MlockPolicy::Off.lock_guest_memory(&mem).unwrap();
        assert!(lock.regions().iter().all(|r| !r.is_locked()));
        assert_eq!(status().vm_lck(), 0);
    });
}
