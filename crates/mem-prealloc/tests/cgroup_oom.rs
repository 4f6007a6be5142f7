// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A memfd larger than its memory cgroup allows: each populate method must
//! come back with `Error::OutOfMemory`, never `SIGBUS` nor a kill.
//!
//! The test runs itself again as a child process inside a new child of this
//! process's memory cgroup (v1 `memory.limit_in_bytes` with the OOM killer
//! disabled, so a charge from a fault the kernel takes on the task's behalf
//! fails with `ENOMEM`; or v2 `memory.max`, with `oom_score_adj` -1000 so
//! that the cgroup's OOM killer finds no victim and the charge fails
//! instead). Root only (and, on v2, `CAP_SYS_RESOURCE`); elsewhere it
//! prints a notice and skips.
//!
//! Once the memfd has filled the cgroup, any page the child's own code
//! faults in by a CPU access (heap or stack growth on the error path) waits
//! for memory (v1, OOM killer disabled) or retries the fault (v2). The
//! parent sees that (`under_oom` in v1; an `oom` event not followed by the
//! child's exit within seconds in v2) and lifts the limit: the populate
//! calls, which failed with `ENOMEM` at once, are over by then.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{memfd, skip, Mapping, MIB};
use mem_prealloc::{preallocate, Error, Method, PreallocOptions};

const TEST: &str = "test_memfd_over_a_memory_cgroup_limit_is_an_error";
/// Set in the child: the method to run.
const CHILD_ENV: &str = "MEM_PREALLOC_CGROUP_CHILD";
/// Set in the child: the cgroup directory to join.
const CGROUP_ENV: &str = "MEM_PREALLOC_CGROUP_DIR";
/// What the child prints once it got the expected error.
const CHILD_OK: &str = "mem-prealloc-cgroup-child: out of memory as expected";
/// What the child prints when it cannot run (v2 without `CAP_SYS_RESOURCE`).
const CHILD_SKIP: &str = "mem-prealloc-cgroup-child: cannot set oom_score_adj";
const LIMIT: usize = 32 * MIB;
const LEN: usize = 128 * MIB;

/// The directory of this process's memory cgroup, and whether it is
/// cgroup v2.
fn own_memory_cgroup() -> Option<(PathBuf, bool)> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "memory") {
            return Some((Path::new("/sys/fs/cgroup/memory").join(path), false));
        }
        if controllers.is_empty() {
            let dir = Path::new("/sys/fs/cgroup").join(path);
            let available = fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").ok()?;
            if available.split_whitespace().any(|c| c == "memory") {
                return Some((dir, true));
            }
        }
    }
    None
}

/// A child memory cgroup with a limit of `LIMIT`, removed on drop.
struct LimitedCgroup(PathBuf, bool);

impl LimitedCgroup {
    fn create(tag: &str) -> Result<Self, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root to create a memory cgroup".into());
        }
        let (parent, v2) = own_memory_cgroup().ok_or("no memory cgroup controller")?;
        if v2 {
            // The child needs the memory controller delegated to it.
            let _ = fs::write(parent.join("cgroup.subtree_control"), "+memory");
        }
        let dir = parent.join(format!("mem-prealloc-test-{}-{tag}", std::process::id()));
        fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cgroup = LimitedCgroup(dir, v2);
        let limit = LIMIT.to_string();
        let set = |file: &str, value: &str| {
            fs::write(cgroup.0.join(file), value)
                .map_err(|e| format!("cannot write {value} to {file}: {e}"))
        };
        if v2 {
            set("memory.max", &limit)?;
            let _ = set("memory.swap.max", "0");
        } else {
            set("memory.limit_in_bytes", &limit)?;
            // With the OOM killer disabled, a charge from a fault taken by
            // the kernel on the task's behalf (not a user fault) fails
            // with ENOMEM instead of waiting.
            set("memory.oom_control", "1")?;
        }
        Ok(cgroup)
    }
}

impl LimitedCgroup {
    /// Whether a task of the cgroup waits for memory (v1), or the cgroup
    /// has hit its limit (v2: an `oom` event).
    fn under_oom(&self) -> bool {
        let (file, key) = if self.1 {
            ("memory.events", "oom ")
        } else {
            ("memory.oom_control", "under_oom ")
        };
        fs::read_to_string(self.0.join(file)).is_ok_and(|text| {
            text.lines()
                .filter_map(|l| l.strip_prefix(key))
                .any(|n| n.trim() != "0")
        })
    }

    /// Lets the cgroup's tasks run on.
    fn lift_limit(&self) {
        let (file, value) = if self.1 {
            ("memory.max", "max")
        } else {
            ("memory.limit_in_bytes", "-1")
        };
        let _ = fs::write(self.0.join(file), value);
    }
}

impl Drop for LimitedCgroup {
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.0);
    }
}

fn method_named(name: &str) -> Method {
    match name {
        "populate-write" => Method::PopulateWrite,
        "touch" => Method::Touch,
        _ => Method::Auto,
    }
}

/// In the child: join the cgroup, preallocate more than it allows.
fn child(method: Method) {
    let dir = std::env::var_os(CGROUP_ENV).expect("cgroup directory");
    fs::write(Path::new(&dir).join("cgroup.procs"), "0").expect("join the cgroup");
    let v2 = own_memory_cgroup().is_some_and(|(_, v2)| v2);
    if let Err(e) = fs::write("/proc/self/oom_score_adj", "-1000") {
        // v1 with the OOM killer disabled does not need it.
        if v2 {
            println!("{CHILD_SKIP}: {e}");
            return;
        }
    }
    let file = memfd("over-limit", LEN, 0).unwrap();
    let map = Mapping::shared(&file, LEN);
    let opts = PreallocOptions::new().threads(2).method(method);
    // SAFETY: `map` is a live shared mapping of `LEN` bytes that nothing
    // else uses while it is populated.
    let err = unsafe { preallocate(map.addr, LEN, &opts) }.unwrap_err();
    let Error::OutOfMemory { offset, .. } = err else {
        panic!("{method}: expected OutOfMemory, got {err}");
    };
    assert!(
        offset > 0 && offset < LEN as u64,
        "{method}: offset {offset:#x}"
    );
    assert!(
        err.to_string().starts_with("out of memory at offset"),
        "{err}"
    );
    println!("{CHILD_OK} ({method}: {err})");
}

#[test]
fn test_memfd_over_a_memory_cgroup_limit_is_an_error() {
    if let Ok(name) = std::env::var(CHILD_ENV) {
        return child(method_named(&name));
    }
    for name in ["auto", "populate-write", "touch"] {
        let cgroup = match LimitedCgroup::create(name) {
            Ok(cgroup) => cgroup,
            Err(why) => return skip(TEST, &why),
        };
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, name)
            .env(CGROUP_ENV, &cgroup.0)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let mut oom_since = None;
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > Duration::from_secs(120) {
                let _ = child.kill();
                break;
            }
            if cgroup.under_oom() {
                let since = *oom_since.get_or_insert_with(Instant::now);
                // v1 reports a waiting task; v2 only that the limit was
                // hit, so give the child time to finish on its own first.
                if !cgroup.1 || since.elapsed() > Duration::from_secs(3) {
                    cgroup.lift_limit();
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if let Some(line) = stdout
            .lines()
            .find_map(|l| l.find(CHILD_SKIP).map(|i| &l[i..]))
        {
            return skip(TEST, line);
        }
        assert!(
            out.status.success() && stdout.contains(CHILD_OK),
            "{name}: child {:?} (a signal here would be SIGBUS or the OOM killer)\n\
             stdout: {stdout}\nstderr: {stderr}",
            out.status
        );
        for line in stdout
            .lines()
            .filter_map(|l| l.find(CHILD_OK).map(|i| &l[i..]))
        {
            let lifted = oom_since.is_some();
            eprintln!("{line} (limit lifted for the child's own faults: {lifted})");
        }
        drop(cgroup);
    }
}
