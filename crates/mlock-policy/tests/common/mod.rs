// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Helpers shared by the integration tests: child processes, mappings,
//! privilege dropping.

#![allow(dead_code)]

use std::process::Command;

use mlock_policy::{LockBudget, LockStatus};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Environment variable naming the test a child process should run.
const CHILD_ENV: &str = "MLOCK_POLICY_TEST_CHILD";

/// Runs `body` in a fresh copy of this test binary, since locking memory
/// affects the whole process. In the parent, re-executes the binary with
/// only the test `name` selected and the child role set, forwards its
/// output, and fails if the child failed or did not run the test.
pub fn in_child(name: &str, body: impl FnOnce()) {
    if std::env::var_os(CHILD_ENV).is_some_and(|v| v == name) {
        body();
        return;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let out = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .output()
        .expect("spawn the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    eprint!("{stderr}");
    assert!(
        out.status.success(),
        "child for {name} failed: {}",
        out.status
    );
    assert!(
        stdout.contains("1 passed"),
        "child for {name} did not run the test"
    );
}

/// An anonymous private mapping, unmapped on drop.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    /// Maps `len` bytes of anonymous read-write memory, nothing resident.
    pub fn new(len: usize) -> Mapping {
        // SAFETY: a fresh anonymous mapping with no address hint; checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap of {len} bytes");
        Mapping {
            ptr: ptr.cast(),
            len,
        }
    }

    pub fn ptr(&self) -> *const u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Writes one byte in each page of the first `bytes`.
    pub fn touch(&self, bytes: usize) {
        assert!(bytes <= self.len);
        for off in (0..bytes).step_by(4096) {
            // SAFETY: `off` is inside the mapping, which is writable and
            // only accessed through raw pointers.
            unsafe { self.ptr.add(off).write_volatile(1) };
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no references into it remain.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The current status; panics on failure.
pub fn status() -> LockStatus {
    LockStatus::current().expect("read /proc/self/status")
}

/// Resident locked bytes; panics where the kernel does not report them.
pub fn locked_resident() -> u64 {
    status()
        .locked_resident()
        .expect("smaps_rollup has a Locked: field")
}

/// Whether `bytes` of lock accounting are allowed; prints a skip notice if
/// not.
pub fn can_lock(bytes: u64, what: &str) -> bool {
    let budget = LockBudget::current().unwrap();
    if budget.allows(bytes) {
        true
    } else {
        println!(
            "SKIP {what}: needs {bytes} bytes of RLIMIT_MEMLOCK or CAP_IPC_LOCK \
             (limit {:?}, CAP_IPC_LOCK {})",
            budget.soft_limit(),
            budget.has_cap_ipc_lock()
        );
        false
    }
}

/// Sets the soft and hard RLIMIT_MEMLOCK (lowering needs no privilege).
pub fn set_memlock_limit(bytes: u64) {
    let lim = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: bytes as libc::rlim_t,
    };
    // SAFETY: `lim` is a valid rlimit for the duration of the call.
    let ret = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
    assert_eq!(ret, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_IPC_LOCK: u32 = 14;

/// Removes CAP_IPC_LOCK from the calling thread's effective, permitted and
/// inheritable sets (for good).
pub fn drop_cap_ipc_lock() {
    let mut header = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: header and two data structs, as capability version 3 needs.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_capget,
            std::ptr::addr_of_mut!(header),
            data.as_mut_ptr(),
        )
    };
    assert_eq!(ret, 0, "capget: {}", std::io::Error::last_os_error());
    let mask = !(1u32 << CAP_IPC_LOCK);
    data[0].effective &= mask;
    data[0].permitted &= mask;
    data[0].inheritable &= mask;
    // SAFETY: as above; capset only lowers this thread's capabilities.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_capset,
            std::ptr::addr_of_mut!(header),
            data.as_ptr(),
        )
    };
    assert_eq!(ret, 0, "capset: {}", std::io::Error::last_os_error());
    assert!(!LockBudget::current().unwrap().has_cap_ipc_lock());
}

/// Whether the process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
