// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Suite `mem-prealloc`: preallocation GiB/s of a memfd by thread count,
//! against the kernel's own `MAP_POPULATE` of the same size (the limit) and,
//! when `qemu-system-x86_64` is on `PATH`, against QEMU's
//! `memory-backend-memfd,prealloc=on,prealloc-threads=T`.
//!
//! Next to `speedup_2t` it measures the ceilings that bound it on the machine
//! at hand: the same preallocation on anonymous private memory
//! (`anon_speedup_2t`, no shared file), two threads on two memfds of half the
//! size each (`two_memfds_speedup_2t`, no shared inode), and two threads
//! zeroing already-resident memory (`ceiling_2t_memset`, pure store
//! bandwidth, which the kernel's page clearing cannot beat).
//!
//! Every contender gets a fresh memfd, faults it in, and frees it before the
//! next one runs, so only one region is resident at a time. QEMU is timed from
//! spawn until it answers `qmp_capabilities` on `-qmp stdio` (its main loop,
//! and so the monitor, only runs once the backend is preallocated); the same
//! command without prealloc is timed too and its median subtracted.

use std::error::Error;
use std::ffi::CString;
use std::fs::File;
use std::hint::black_box;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use mem_prealloc::{
    preallocate, preallocate_regions, start, thread_count, Method, PreallocOptions, Region,
};

use crate::harness::{alternate, format_value, median, Ctx, SuiteReport, SuiteResult, Table};
use crate::machine::cpu_seconds;

/// One-line description.
pub const ABOUT: &str = "preallocation GiB/s by threads vs MAP_POPULATE and QEMU";
/// Ready to run.
pub const READY: bool = true;

const GIB: f64 = (1u64 << 30) as f64;

type BoxResult<T> = Result<T, Box<dyn Error>>;

/// A memfd of `len` bytes.
fn memfd(len: usize) -> BoxResult<File> {
    let name = CString::new("vmm-benches-prealloc")?;
    // SAFETY: a NUL-terminated name; the fd is owned by the File below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()).into());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(len as u64)?;
    Ok(file)
}

/// A shared read-write mapping of `file`, unmapped on drop.
struct Mapping {
    addr: *mut libc::c_void,
    len: usize,
}

// SAFETY: a Mapping owns its pages alone (nothing else holds `addr`), so
// it may be dropped, i.e. unmapped, on another thread.
unsafe impl Send for Mapping {}

impl Mapping {
    fn new(file: &File, len: usize, extra_flags: i32) -> BoxResult<Self> {
        Self::at(file, 0, len, extra_flags)
    }

    /// A shared read-write mapping of `len` bytes of `file` from `offset`.
    fn at(file: &File, offset: usize, len: usize, extra_flags: i32) -> BoxResult<Self> {
        // SAFETY: a new mapping at an address chosen by the kernel.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | extra_flags,
                file.as_raw_fd(),
                libc::off_t::try_from(offset)?,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()).into());
        }
        Ok(Mapping { addr, len })
    }

    /// A private anonymous read-write mapping with 4 KiB pages, as the memfd
    /// has (shmem without huge pages), whatever the THP policy says.
    fn anonymous(len: usize, extra_flags: i32) -> BoxResult<Self> {
        // SAFETY: a new mapping at an address chosen by the kernel.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()).into());
        }
        let map = Mapping { addr, len };
        // SAFETY: only changes the THP policy of our own fresh mapping.
        if unsafe { libc::madvise(addr, len, libc::MADV_NOHUGEPAGE) } != 0 {
            return Err(format!("madvise: {}", std::io::Error::last_os_error()).into());
        }
        Ok(map)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly this mapping, which nothing else uses.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

/// Wall seconds for this crate to preallocate a fresh memfd of `len` bytes;
/// the CPU seconds it took are pushed to `cpu`.
fn ours(len: usize, threads: usize, method: Method, cpu: &mut Vec<f64>) -> BoxResult<f64> {
    let file = memfd(len)?;
    let map = Mapping::new(&file, len, 0)?;
    timed_preallocate(&map, threads, method, cpu)
}

/// Wall seconds for this crate to preallocate all of `map` with `threads`
/// threads and `method`; the CPU seconds are pushed to `cpu`.
fn timed_preallocate(
    map: &Mapping,
    threads: usize,
    method: Method,
    cpu: &mut Vec<f64>,
) -> BoxResult<f64> {
    let opts = PreallocOptions::new().threads(threads).method(method);
    let cpu_start = cpu_seconds();
    let start = Instant::now();
    // SAFETY: the bench owns the mapping and keeps it while the job or guard lives.
    let report = unsafe { preallocate(map.addr.cast(), map.len, &opts) }?;
    let secs = start.elapsed().as_secs_f64();
    cpu.push(cpu_seconds() - cpu_start);
    if report.threads != threads || report.bytes != map.len as u64 {
        return Err(format!("unexpected report {report:?}").into());
    }
    Ok(secs)
}

/// Wall seconds for this crate (`MADV_POPULATE_WRITE`) to preallocate a
/// fresh private anonymous mapping of `len` bytes with 4 KiB pages: the same
/// work without a shared file (no inode, page-cache or file-time updates);
/// the CPU seconds are pushed to `cpu`.
fn ours_anon(len: usize, threads: usize, cpu: &mut Vec<f64>) -> BoxResult<f64> {
    let map = Mapping::anonymous(len, 0)?;
    timed_preallocate(&map, threads, Method::PopulateWrite, cpu)
}

/// Wall seconds for two background jobs of one thread each to preallocate
/// two fresh memfds of `len / 2` bytes at once: two threads, as in
/// `speedup_2t`, but each on its own inode.
fn ours_two_memfds(len: usize) -> BoxResult<f64> {
    let half = len / 2;
    let (file_a, file_b) = (memfd(half)?, memfd(half)?);
    let (map_a, map_b) = (
        Mapping::new(&file_a, half, 0)?,
        Mapping::new(&file_b, half, 0)?,
    );
    let opts = PreallocOptions::new().threads(1).method(Method::Auto);
    let start_time = Instant::now();
    // SAFETY: the bench owns the mapping and keeps it while the job or guard lives.
    let job_a = unsafe { start(map_a.addr.cast(), half, &opts) }?;
    // SAFETY: the bench owns the mapping and keeps it while the job or guard lives.
    let job_b = unsafe { start(map_b.addr.cast(), half, &opts) }?;
    let (report_a, report_b) = (job_a.join()?, job_b.join()?);
    let secs = start_time.elapsed().as_secs_f64();
    if report_a.bytes + report_b.bytes != 2 * half as u64 {
        return Err(format!("unexpected reports {report_a:?} {report_b:?}").into());
    }
    Ok(secs)
}

/// Zeroes `[addr, addr + len)` one 4 KiB page at a time, as the kernel
/// clears a newly allocated page.
///
/// # Safety
///
/// The range must be writable memory that nothing else accesses meanwhile.
unsafe fn zero_pages(addr: usize, len: usize) {
    for offset in (0..len).step_by(4096) {
        let n = 4096.min(len - offset);
        // black_box keeps the compiler from merging the calls into one
        // large memset, which glibc would do with non-temporal stores.
        let page = black_box(addr + offset) as *mut u8;
        // SAFETY: inside the range the caller hands over exclusively.
        unsafe { std::ptr::write_bytes(page, 0, n) };
    }
}

/// Wall seconds for `threads` threads to zero already-resident anonymous
/// memory of `len` bytes, each its own contiguous part: the store bandwidth
/// that bounds any page clearing, with no page fault involved.
fn memset(len: usize, threads: usize) -> BoxResult<f64> {
    let map = Mapping::anonymous(len, libc::MAP_POPULATE)?;
    Ok(zero_resident(&map, threads))
}

/// Wall seconds for `threads` threads to zero all of the resident `map`,
/// each its own contiguous part, page by page.
fn zero_resident(map: &Mapping, threads: usize) -> f64 {
    let (base, len) = (map.addr as usize, map.len);
    let per_thread = (len / threads).div_ceil(4096) * 4096;
    let start = Instant::now();
    std::thread::scope(|scope| {
        for i in 0..threads {
            let from = (i * per_thread).min(len);
            let to = ((i + 1) * per_thread).min(len);
            // SAFETY: each thread zeroes its own disjoint part of a mapping
            // the caller owns and nothing else reads meanwhile.
            // SAFETY: the bench owns the mapping and keeps it while the job or guard lives.
            scope.spawn(move || unsafe { zero_pages(base + from, to - from) });
        }
    });
    start.elapsed().as_secs_f64()
}

/// Seconds for `mmap(MAP_POPULATE)` of a fresh memfd of `len` bytes; the CPU
/// seconds it took are pushed to `cpu`.
fn map_populate(len: usize, cpu: &mut Vec<f64>) -> BoxResult<f64> {
    let file = memfd(len)?;
    let cpu_start = cpu_seconds();
    let start = Instant::now();
    let map = Mapping::new(&file, len, libc::MAP_POPULATE)?;
    let secs = start.elapsed().as_secs_f64();
    cpu.push(cpu_seconds() - cpu_start);
    drop(map);
    Ok(secs)
}

/// Seconds for two threads to `mmap(MAP_POPULATE)` one half each of a
/// fresh memfd of `len` bytes at once: the kernel's own populate with the
/// thread count and the shared inode of `ratio_vs_qemu_2t`, the ceiling
/// of both preallocators there. The CPU seconds are pushed to `cpu`.
fn map_populate_2t(len: usize, cpu: &mut Vec<f64>) -> BoxResult<f64> {
    let file = memfd(len)?;
    let half = (len / 2).div_ceil(4096) * 4096;
    let cpu_start = cpu_seconds();
    let start = Instant::now();
    let file = &file;
    // Each thread hands back its mapping, unmapped only after the clock
    // stopped (a boxed error is not `Send`: its text crosses instead).
    let parts = std::thread::scope(|scope| {
        [(0, half), (half, len - half)]
            .map(|(offset, part)| {
                scope.spawn(move || {
                    Mapping::at(file, offset, part, libc::MAP_POPULATE).map_err(|e| e.to_string())
                })
            })
            .map(|t| t.join())
    });
    let secs = start.elapsed().as_secs_f64();
    cpu.push(cpu_seconds() - cpu_start);
    for part in parts {
        part.map_err(|_| "a MAP_POPULATE thread panicked")??;
    }
    Ok(secs)
}

/// `qemu-system-x86_64` on `PATH`.
fn find_qemu() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("qemu-system-x86_64"))
            .find(|path| path.is_file())
    })
}

/// Kills and reaps the child if it is still running when dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// CPU seconds (user + system, exited threads included) of process `pid`.
fn process_cpu_seconds(pid: u32) -> BoxResult<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').ok_or("bad /proc/pid/stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of proc(5), counted from the state (field 3).
    let ticks: f64 = fields.get(11).ok_or("no utime")?.parse::<f64>()?
        + fields.get(12).ok_or("no stime")?.parse::<f64>()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks / hz)
}

/// Seconds from spawning QEMU with a memfd backend of `len` bytes until its
/// QMP monitor answers; `threads == 0` means without prealloc. The CPU
/// seconds QEMU used up to that point are pushed to `cpu`.
fn qemu(qemu: &PathBuf, len: usize, threads: usize, cpu: &mut Vec<f64>) -> BoxResult<f64> {
    let backend = format!("memory-backend-memfd,id=m,size={len}");
    qemu_backend(qemu, backend, threads, cpu)
}

/// [`qemu`] with any `-object` backend; `,prealloc=on,prealloc-threads=T`
/// is appended when `threads > 0`.
fn qemu_backend(
    qemu: &PathBuf,
    mut backend: String,
    threads: usize,
    cpu: &mut Vec<f64>,
) -> BoxResult<f64> {
    if threads > 0 {
        backend.push_str(&format!(",prealloc=on,prealloc-threads={threads}"));
    }
    let start = Instant::now();
    let child = Command::new(qemu)
        .args(["-machine", "none", "-nodefaults", "-display", "none", "-S"])
        .args(["-object", &backend, "-qmp", "stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut child = Reaped(child);
    let mut stdin = child.0.stdin.take().ok_or("no stdin")?;
    stdin.write_all(b"{\"execute\": \"qmp_capabilities\"}\n")?;
    stdin.flush()?;
    let mut stdout = BufReader::new(child.0.stdout.take().ok_or("no stdout")?);
    let mut line = String::new();
    let secs = loop {
        line.clear();
        if stdout.read_line(&mut line)? == 0 {
            let mut stderr = String::new();
            if let Some(mut err) = child.0.stderr.take() {
                let _ = err.read_to_string(&mut stderr);
            }
            return Err(
                format!("QEMU exited before its monitor answered: {}", stderr.trim()).into(),
            );
        }
        if line.contains("\"return\"") {
            break start.elapsed().as_secs_f64();
        }
        if line.contains("\"error\"") {
            return Err(format!("QMP error: {}", line.trim()).into());
        }
    };
    cpu.push(process_cpu_seconds(child.0.id())?);
    stdin.write_all(b"{\"execute\": \"quit\"}\n")?;
    stdin.flush()?;
    drop(stdin);
    // Wait for the exit so that its memory is freed before the next run.
    child.0.wait()?;
    Ok(secs)
}

fn qemu_version(qemu: &PathBuf) -> String {
    Command::new(qemu)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_else(|| "unknown version".into())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// The hugepage pool of one page size, grown for the suite and shrunk back
/// on drop (also when a contender fails or panics).
struct HugepageReservation {
    dir: String,
    /// Pages this guard added to `nr_hugepages`.
    added: usize,
    /// `nr_hugepages` before.
    before: usize,
    /// Pages free for the suite.
    usable: usize,
}

/// Attempts at growing a hugepage pool: the kernel allocates what it can
/// at each write of `nr_hugepages`, and compacting memory in between
/// frees the contiguous ranges a page needs (a 1 GiB page needs 1 GiB).
const GROW_ATTEMPTS: usize = 3;

impl HugepageReservation {
    /// Grows the pool of `page_kib` pages so that up to `want` pages are
    /// free and unreserved; `usable` says how many the kernel gave. Where
    /// the first write of `nr_hugepages` falls short, memory is compacted
    /// (`/proc/sys/vm/compact_memory`) and the write repeated, up to
    /// [`GROW_ATTEMPTS`] times.
    fn grow(page_kib: usize, want: usize) -> BoxResult<Self> {
        let dir = format!("/sys/kernel/mm/hugepages/hugepages-{page_kib}kB");
        let read = |name: &str| -> BoxResult<usize> {
            let dir = format!("/sys/kernel/mm/hugepages/hugepages-{page_kib}kB");
            Ok(std::fs::read_to_string(format!("{dir}/{name}"))?
                .trim()
                .parse()?)
        };
        let usable = || -> BoxResult<usize> {
            Ok(read("free_hugepages")?.saturating_sub(read("resv_hugepages")?))
        };
        let before = read("nr_hugepages")?;
        let mut guard = HugepageReservation {
            dir,
            added: 0,
            before,
            usable: usable()?.min(want),
        };
        for attempt in 0..GROW_ATTEMPTS {
            let free = usable()?;
            if free >= want {
                break;
            }
            if attempt > 0 {
                // Best effort: without it the write below still tries.
                let _ = std::fs::write("/proc/sys/vm/compact_memory", "1\n");
            }
            let now = read("nr_hugepages")?;
            std::fs::write(
                format!("{}/nr_hugepages", guard.dir),
                format!("{}\n", now + want - free),
            )
            .map_err(|e| format!("cannot grow the pool: {e} (needs root)"))?;
            guard.added = read("nr_hugepages")?.saturating_sub(before);
        }
        guard.usable = usable()?.min(want);
        Ok(guard)
    }
}

impl Drop for HugepageReservation {
    fn drop(&mut self) {
        if self.added == 0 {
            return;
        }
        // Take back what was added (so that a concurrent change by someone
        // else is kept); without one that is the old value.
        let path = format!("{}/nr_hugepages", self.dir);
        let now = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(self.before + self.added);
        let _ = std::fs::write(&path, format!("{}\n", now.saturating_sub(self.added)));
    }
}

/// A hugetlbfs mount for one page size: an existing one, or a private one
/// in a temporary directory, unmounted on drop.
struct HugetlbfsMount {
    path: PathBuf,
    private: Option<tempfile::TempDir>,
}

impl HugetlbfsMount {
    fn new(page_kib: usize) -> BoxResult<Self> {
        let default_kib = std::fs::read_to_string("/proc/meminfo")?
            .lines()
            .find_map(|l| l.strip_prefix("Hugepagesize:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<usize>().ok());
        let mounts = std::fs::read_to_string("/proc/mounts")?;
        for line in mounts.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 4 || fields[2] != "hugetlbfs" {
                continue;
            }
            let size = fields[3]
                .split(',')
                .find_map(|o| o.strip_prefix("pagesize="))
                .and_then(parse_page_size_kib)
                .or(default_kib);
            if size == Some(page_kib) {
                return Ok(HugetlbfsMount {
                    path: PathBuf::from(fields[1]),
                    private: None,
                });
            }
        }
        let dir = tempfile::tempdir()?;
        let target = CString::new(dir.path().as_os_str().as_encoded_bytes())?;
        let options = CString::new(format!("pagesize={page_kib}K"))?;
        // SAFETY: NUL-terminated strings that outlive the call; mounts a
        // new hugetlbfs on our own empty temporary directory.
        let ret = unsafe {
            libc::mount(
                c"vmm-benches".as_ptr(),
                target.as_ptr(),
                c"hugetlbfs".as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        if ret != 0 {
            return Err(format!("mount -t hugetlbfs: {}", std::io::Error::last_os_error()).into());
        }
        Ok(HugetlbfsMount {
            path: dir.path().to_path_buf(),
            private: Some(dir),
        })
    }
}

impl Drop for HugetlbfsMount {
    fn drop(&mut self) {
        if self.private.is_some() {
            if let Ok(target) = CString::new(self.path.as_os_str().as_encoded_bytes()) {
                // SAFETY: unmounts the hugetlbfs this guard mounted.
                unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

/// `2M`, `2048k`, `1G` (hugetlbfs mount options) in KiB.
fn parse_page_size_kib(text: &str) -> Option<usize> {
    let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit())?);
    let n: usize = digits.parse().ok()?;
    match unit.to_ascii_lowercase().as_str() {
        "k" => Some(n),
        "m" => Some(n << 10),
        "g" => Some(n << 20),
        _ => None,
    }
}

/// A fresh, unlinked file of `len` bytes on the hugetlbfs mount, mapped
/// shared (as a vhost-user guest's RAM).
fn huge_mapping(mount: &HugetlbfsMount, len: usize) -> BoxResult<(File, Mapping)> {
    let file = tempfile::tempfile_in(&mount.path)?;
    file.set_len(len as u64)?;
    let map = Mapping::new(&file, len, 0)?;
    Ok((file, map))
}

/// Wall seconds for this crate to preallocate a fresh hugetlbfs file; the
/// CPU seconds it took are pushed to `cpu`.
fn ours_huge(
    mount: &HugetlbfsMount,
    len: usize,
    page: usize,
    threads: usize,
    cpu: &mut Vec<f64>,
) -> BoxResult<f64> {
    let (_file, map) = huge_mapping(mount, len)?;
    let opts = PreallocOptions::new().threads(threads).page_size(page);
    let cpu_start = cpu_seconds();
    let start = Instant::now();
    // SAFETY: the bench owns the mapping and keeps it while the job or guard lives.
    let report = unsafe { preallocate(map.addr.cast(), len, &opts) }?;
    let secs = start.elapsed().as_secs_f64();
    cpu.push(cpu_seconds() - cpu_start);
    if report.threads != threads || report.bytes != len as u64 || report.page_size != page {
        return Err(format!("unexpected report {report:?}").into());
    }
    Ok(secs)
}

/// Wall seconds for `threads` threads to zero a fresh hugetlbfs file once
/// it is resident (preallocated first, untimed): the floor of page clearing.
/// The CPU seconds of the zeroing are pushed to `cpu`.
fn zero_huge(
    mount: &HugetlbfsMount,
    len: usize,
    page: usize,
    threads: usize,
    cpu: &mut Vec<f64>,
) -> BoxResult<f64> {
    let (_file, map) = huge_mapping(mount, len)?;
    // SAFETY: the bench owns the mapping and keeps it while the job or guard lives.
    unsafe {
        preallocate(
            map.addr.cast(),
            len,
            &PreallocOptions::new().page_size(page),
        )
    }?;
    let cpu_start = cpu_seconds();
    let secs = zero_resident(&map, threads);
    cpu.push(cpu_seconds() - cpu_start);
    Ok(secs)
}

/// The metric names of the hugetlbfs rows of one page size (spelled out,
/// so that the targets can find them in this file).
struct HugeMetrics {
    page_kib: usize,
    label: &'static str,
    prefix: &'static str,
    gib_1t: &'static str,
    gib_2t: &'static str,
    speedup: &'static str,
    zero_1t: &'static str,
    zero_2t: &'static str,
    zero_gib_2t: &'static str,
    hugepages: &'static str,
    qemu_gib_2t: &'static str,
    qemu_speedup: &'static str,
    qemu_1t: &'static str,
    qemu_2t: &'static str,
    /// QEMU's two-thread time over the zeroing floor's: the ceiling of
    /// `qemu_2t` when both preallocators run at the floor.
    qemu_zero_2t: &'static str,
    first_run: &'static str,
    cpu_1t: &'static str,
    cpu_2t: &'static str,
    cpu_zero_1t: &'static str,
    cpu_zero_2t: &'static str,
}

const HUGE_2M: HugeMetrics = HugeMetrics {
    page_kib: 2048,
    label: "2 MiB",
    prefix: "huge_",
    gib_1t: "huge_gib_per_s_1t",
    gib_2t: "huge_gib_per_s_2t",
    speedup: "huge_speedup_2t",
    zero_1t: "huge_ratio_vs_zeroing_1t",
    zero_2t: "huge_ratio_vs_zeroing_2t",
    zero_gib_2t: "huge_zeroing_gib_per_s_2t",
    hugepages: "huge_hugepages",
    qemu_gib_2t: "huge_qemu_gib_per_s_2t",
    qemu_speedup: "huge_qemu_speedup_2t",
    qemu_1t: "huge_ratio_vs_qemu_1t",
    qemu_2t: "huge_ratio_vs_qemu_2t",
    qemu_zero_2t: "huge_qemu_ratio_vs_zeroing_2t",
    first_run: "huge_first_run_s",
    cpu_1t: "huge_cpu_utilisation_1t",
    cpu_2t: "huge_cpu_utilisation_2t",
    cpu_zero_1t: "huge_cpu_ratio_vs_zeroing_1t",
    cpu_zero_2t: "huge_cpu_ratio_vs_zeroing_2t",
};

const HUGE_1G: HugeMetrics = HugeMetrics {
    page_kib: 1 << 20,
    label: "1 GiB",
    prefix: "huge1g_",
    gib_1t: "huge1g_gib_per_s_1t",
    gib_2t: "huge1g_gib_per_s_2t",
    speedup: "huge1g_speedup_2t",
    zero_1t: "huge1g_ratio_vs_zeroing_1t",
    zero_2t: "huge1g_ratio_vs_zeroing_2t",
    zero_gib_2t: "huge1g_zeroing_gib_per_s_2t",
    hugepages: "huge1g_hugepages",
    qemu_gib_2t: "huge1g_qemu_gib_per_s_2t",
    qemu_speedup: "huge1g_qemu_speedup_2t",
    qemu_1t: "huge1g_ratio_vs_qemu_1t",
    qemu_2t: "huge1g_ratio_vs_qemu_2t",
    qemu_zero_2t: "huge1g_qemu_ratio_vs_zeroing_2t",
    first_run: "huge1g_first_run_s",
    cpu_1t: "huge1g_cpu_utilisation_1t",
    cpu_2t: "huge1g_cpu_utilisation_2t",
    cpu_zero_1t: "huge1g_cpu_ratio_vs_zeroing_1t",
    cpu_zero_2t: "huge1g_cpu_ratio_vs_zeroing_2t",
};

/// The hugetlbfs rows for one page size: this crate with 1 and 2 threads,
/// QEMU's `memory-backend-file` on the same mount, and the zeroing floor.
/// Metrics are named `{prefix}gib_per_s_1t` and so on. Without hugepages
/// the suite says so and skips the rows.
fn hugetlbfs_rows(
    ctx: &Ctx,
    report: &mut SuiteReport,
    qemu_path: Option<&PathBuf>,
    names: &HugeMetrics,
    max_len: usize,
) -> BoxResult<()> {
    let (page_kib, label, prefix) = (names.page_kib, names.label, names.prefix);
    let page = page_kib << 10;
    let want = max_len / page;
    // Half of it at least (and two pages, one per thread): on fewer pages
    // a run lasts a few QEMU start-up jitters and its ratios mean nothing.
    let need = (want / 2).max(2);
    let pool = match HugepageReservation::grow(page_kib, want) {
        Ok(pool) if pool.usable >= need => pool,
        Ok(pool) => {
            report.note(format!(
                "hugetlbfs {label}: SKIPPED, only {} of the {want} hugepages wanted could be \
                 reserved here ({need} needed; nr_hugepages {} -> {} and back, after \
                 compacting memory); the {prefix}* rows are not measured. As root, free memory \
                 first or reserve the pages early after boot (echo N > \
                 /sys/kernel/mm/hugepages/hugepages-{page_kib}kB/nr_hugepages, or boot with \
                 hugepagesz=1G hugepages=N for 1 GiB pages).",
                pool.usable,
                pool.before,
                pool.before + pool.added,
            ));
            return Ok(());
        }
        Err(err) => {
            report.note(format!(
                "hugetlbfs {label}: SKIPPED, cannot reserve hugepages ({err}); the {prefix}* \
                 rows are not measured."
            ));
            return Ok(());
        }
    };
    let mount = HugetlbfsMount::new(page_kib)?;
    let len = pool.usable * page;
    // Two threads only where QEMU's formula gives both contenders two.
    let threads2 = thread_count(len, page, 2, Some(2), None);
    let gib = len as f64 / GIB;
    // One untimed run over the whole pool first: in a VM, the first touch
    // of guest-physical memory the hypervisor has not backed yet also pays
    // the host's faults, which would land on whichever contender runs
    // first. Reported as {prefix}first_run_s.
    let first_run = ours_huge(&mount, len, page, threads2, &mut Vec::new())?;
    report.metric(names.first_run, first_run);
    let backend = format!(
        "memory-backend-file,id=m,size={len},mem-path={},share=on",
        mount.path.display()
    );
    let run_qemu = |threads| match qemu_path {
        Some(path) => qemu_backend(path, backend.clone(), threads, &mut Vec::new()),
        None => Ok(f64::NAN),
    };
    let (mut cpu1, mut cpu2) = (Vec::new(), Vec::new());
    let mut ours_1t = || ours_huge(&mount, len, page, 1, &mut cpu1);
    let mut ours_2t = || ours_huge(&mount, len, page, threads2, &mut cpu2);
    let (mut zcpu1, mut zcpu2) = (Vec::new(), Vec::new());
    let mut zero_1t = || zero_huge(&mount, len, page, 1, &mut zcpu1);
    let mut zero_2t = || zero_huge(&mount, len, page, threads2, &mut zcpu2);
    let mut q0 = || run_qemu(0);
    let mut q1 = || run_qemu(1);
    let mut q2 = || run_qemu(threads2);
    let [t1, t2, z1, z2, s0, s1, s2] = alternate(
        ctx.reps(),
        &mut [
            &mut ours_1t,
            &mut ours_2t,
            &mut zero_1t,
            &mut zero_2t,
            &mut q0,
            &mut q1,
            &mut q2,
        ],
    )?;
    let mut table = Table::new(
        &format!("hugetlbfs, {label} pages"),
        &["contender", "seconds", "GiB/s"],
    );
    let mut row = |name: &str, secs: f64| {
        table.row(&[name, &format_value(secs), &format_value(gib / secs)]);
    };
    row("mem-prealloc, 1 thread", t1);
    row(&format!("mem-prealloc, {threads2} threads"), t2);
    row("zeroing it once resident, 1 thread", z1);
    row(&format!("zeroing it once resident, {threads2} threads"), z2);
    report
        .metric(names.gib_1t, gib / t1)
        .metric(names.gib_2t, gib / t2)
        .metric(names.speedup, t1 / t2)
        .metric(names.zero_1t, t1 / z1)
        .metric(names.zero_2t, t2 / z2)
        .metric(names.zero_gib_2t, gib / z2)
        .metric(names.hugepages, pool.usable as f64)
        .metric(names.cpu_1t, median(&cpu1) / t1)
        .metric(names.cpu_2t, median(&cpu2) / t2)
        .metric(names.cpu_zero_1t, median(&cpu1) / median(&zcpu1))
        .metric(names.cpu_zero_2t, median(&cpu2) / median(&zcpu2));
    if qemu_path.is_some() {
        let floor = 1e-3;
        let (p1, p2) = ((s1 - s0).max(floor), (s2 - s0).max(floor));
        row("QEMU memory-backend-file prealloc-threads=1", p1);
        row(
            &format!("QEMU memory-backend-file prealloc-threads={threads2}"),
            p2,
        );
        report
            .metric(names.qemu_gib_2t, gib / p2)
            .metric(names.qemu_speedup, p1 / p2)
            .metric(names.qemu_1t, t1 / p1)
            .metric(names.qemu_2t, t2 / p2)
            .metric(names.qemu_zero_2t, p2 / z2);
    }
    report.table(table).note(format!(
        "hugetlbfs {label}: {} hugepages reserved ({} MiB, nr_hugepages {} -> {} and back), \
         {} file on {} mapped MAP_SHARED, {threads2} threads for the 2t rows, median of {} \
         alternating runs, each on a fresh file freed before the next; QEMU \
         `-object {backend},prealloc=on,prealloc-threads=T`, timed as for the memfd. The \
         zeroing floor zeroes the same kind of file once it is resident, page by page, with \
         the same thread count. Before the timed runs one untimed {threads2}-thread run \
         touches the whole pool ({prefix}first_run_s = {} s): in a VM the first touch of \
         fresh guest-physical memory also pays the hypervisor's faults.",
        pool.usable,
        len >> 20,
        pool.before,
        pool.before + pool.added,
        if mount.private.is_some() {
            "a private mount"
        } else {
            "the existing mount"
        },
        mount.path.display(),
        ctx.reps(),
        format_value(first_run),
    ));
    drop(mount);
    drop(pool);
    Ok(())
}

/// Sequential against concurrent preallocation of four memfds of unequal
/// size (as a guest below and above the PCI hole plus hotplug slots),
/// totalling `len`, with the same two-thread budget.
fn four_regions(len: usize, concurrent: bool) -> BoxResult<f64> {
    let sizes = [len / 2, len / 4, len / 4 - len / 64, len / 64];
    let files = sizes
        .iter()
        .map(|&l| memfd(l))
        .collect::<BoxResult<Vec<_>>>()?;
    let maps = files
        .iter()
        .zip(sizes)
        .map(|(f, l)| Mapping::new(f, l, 0))
        .collect::<BoxResult<Vec<_>>>()?;
    let opts = PreallocOptions::new().threads(2);
    let start_time = Instant::now();
    if concurrent {
        // SAFETY: the bench owns the mapping and keeps it while the job or guard lives.
        let regions: Vec<Region> = maps
            .iter()
            .map(|m| unsafe { Region::new(m.addr.cast(), m.len) })
            .collect();
        for result in preallocate_regions(&regions, &opts)? {
            result?;
        }
    } else {
        for map in &maps {
            // SAFETY: the bench owns the mapping and keeps it while the job or guard lives.
            unsafe { preallocate(map.addr.cast(), map.len, &opts) }?;
        }
    }
    Ok(start_time.elapsed().as_secs_f64())
}

/// Measures every contender alternately and reports GiB/s and ratios.
pub fn run(ctx: &Ctx) -> SuiteResult {
    let len: usize = ctx.pick(4 << 30, 128 << 20);
    let gib = len as f64 / GIB;
    let load_before = load_average();
    let mut report = SuiteReport::default();

    // One probe so that a QEMU that cannot run here is a note, not a failure.
    let qemu_path = match find_qemu() {
        None => {
            report.note("qemu-system-x86_64 is not on PATH: the QEMU metrics are skipped.");
            None
        }
        Some(path) => {
            let version = qemu_version(&path);
            match qemu(&path, len, 0, &mut Vec::new()) {
                Err(err) => {
                    report.note(format!(
                        "{version} failed to start ({err}): QEMU metrics skipped."
                    ));
                    None
                }
                Ok(_) => Some((path, version)),
            }
        }
    };

    // All contenders in one alternation, so that the (heavy, shared) machine
    // load hits each of them alike. Without QEMU its slots return NaN.
    let (mut cpu1, mut cpu2, mut cpu_pop) = (Vec::new(), Vec::new(), Vec::new());
    let mut scratch = Vec::new();
    let mut ours_1t = || ours(len, 1, Method::Auto, &mut cpu1);
    let mut ours_2t = || ours(len, 2, Method::Auto, &mut cpu2);
    let mut touch_1t = || ours(len, 1, Method::Touch, &mut scratch);
    let mut populate = || map_populate(len, &mut cpu_pop);
    let mut cpu_pop2 = Vec::new();
    let mut populate_2t = || map_populate_2t(len, &mut cpu_pop2);
    let (mut cpu_anon1, mut cpu_anon2) = (Vec::new(), Vec::new());
    let mut anon_1t = || ours_anon(len, 1, &mut cpu_anon1);
    let mut anon_2t = || ours_anon(len, 2, &mut cpu_anon2);
    let mut two_memfds = || ours_two_memfds(len);
    let mut memset_1t = || memset(len, 1);
    let mut memset_2t = || memset(len, 2);
    let (mut qcpu0, mut qcpu1, mut qcpu2) = (Vec::new(), Vec::new(), Vec::new());
    let run_qemu = |threads, cpu: &mut Vec<f64>| match &qemu_path {
        Some((path, _)) => qemu(path, len, threads, cpu),
        None => Ok(f64::NAN),
    };
    let mut q0 = || run_qemu(0, &mut qcpu0);
    let mut q1 = || run_qemu(1, &mut qcpu1);
    let mut q2 = || run_qemu(2, &mut qcpu2);
    let [t1, t2, touch1, tpop, tpop2, anon1, anon2, two_files, zero1, zero2, s0, s1, s2] =
        alternate(
            ctx.reps(),
            &mut [
                &mut ours_1t,
                &mut ours_2t,
                &mut touch_1t,
                &mut populate,
                &mut populate_2t,
                &mut anon_1t,
                &mut anon_2t,
                &mut two_memfds,
                &mut memset_1t,
                &mut memset_2t,
                &mut q0,
                &mut q1,
                &mut q2,
            ],
        )?;
    let (c1, c2, cpop) = (median(&cpu1), median(&cpu2), median(&cpu_pop));
    let cpop2 = median(&cpu_pop2);
    let (ca1, ca2) = (median(&cpu_anon1), median(&cpu_anon2));

    let mut contenders = Table::new("contenders", &["contender", "seconds", "GiB/s"]);
    let mut row = |name: &str, secs: f64| {
        contenders.row(&[name, &format_value(secs), &format_value(gib / secs)]);
    };
    row("mem-prealloc, 1 thread (populate-write)", t1);
    row("mem-prealloc, 2 threads (populate-write)", t2);
    row("mem-prealloc, 1 thread (touch fallback)", touch1);
    row("mmap(MAP_POPULATE)", tpop);
    row("mmap(MAP_POPULATE), 2 threads, one half each", tpop2);
    row("mem-prealloc, anonymous memory, 1 thread", anon1);
    row("mem-prealloc, anonymous memory, 2 threads", anon2);
    row(
        "mem-prealloc, two memfds of half the size, 1 thread each",
        two_files,
    );
    row("zeroing resident memory (memset), 1 thread", zero1);
    row("zeroing resident memory (memset), 2 threads", zero2);

    report
        .metric("gib_per_s_1t", gib / t1)
        .metric("gib_per_s_2t", gib / t2)
        .metric("speedup_2t", t1 / t2)
        .metric("anon_speedup_2t", anon1 / anon2)
        .metric("two_memfds_speedup_2t", t1 / two_files)
        .metric("ceiling_2t_memset", zero1 / zero2)
        .metric("cpu_s_2t_vs_1t", c2 / c1)
        .metric("anon_cpu_s_2t_vs_1t", ca2 / ca1)
        .metric("anon_gib_per_s_1t", gib / anon1)
        .metric("anon_gib_per_s_2t", gib / anon2)
        .metric("memset_gib_per_s_1t", gib / zero1)
        .metric("memset_gib_per_s_2t", gib / zero2)
        .metric("touch_gib_per_s_1t", gib / touch1)
        .metric("map_populate_gib_per_s", gib / tpop)
        .metric("ratio_vs_map_populate_1t", t1 / tpop)
        .metric("map_populate_gib_per_s_2t", gib / tpop2)
        .metric("ratio_vs_map_populate_2t", t2 / tpop2)
        .metric("cpu_s_map_populate_2t", cpop2)
        .metric("cpu_ratio_vs_map_populate_2t", c2 / cpop2)
        .metric("cpu_s_1t", c1)
        .metric("cpu_s_2t", c2)
        .metric("cpu_s_map_populate", cpop)
        .metric("cpu_ratio_vs_map_populate_1t", c1 / cpop)
        .metric("cpu_utilisation_1t", c1 / t1)
        .metric("cpu_utilisation_2t", c2 / t2);
    report
        .series(
            "prealloc_threads",
            "ours (mem-prealloc)",
            vec![(1.0, gib / t1), (2.0, gib / t2)],
        )
        .series(
            "prealloc_threads",
            "ours, anonymous memory",
            vec![(1.0, gib / anon1), (2.0, gib / anon2)],
        )
        .series(
            "prealloc_threads",
            "MAP_POPULATE (kernel, one half per thread)",
            vec![(1.0, gib / tpop), (2.0, gib / tpop2)],
        );

    if let Some((_, version)) = &qemu_path {
        // Prealloc time alone; keep it positive on a noisy machine.
        let floor = 1e-3;
        let (p1, p2) = ((s1 - s0).max(floor), (s2 - s0).max(floor));
        row("QEMU prealloc-threads=1", p1);
        row("QEMU prealloc-threads=2", p2);
        if s1 - s0 > floor && s2 - s0 > floor {
            // Not drawn when start-up noise swamps the prealloc time.
            report.series(
                "prealloc_threads",
                "QEMU prealloc-threads",
                vec![(1.0, gib / p1), (2.0, gib / p2)],
            );
        }
        let qc0 = median(&qcpu0);
        let (qc1, qc2) = (median(&qcpu1) - qc0, median(&qcpu2) - qc0);
        report
            .metric("qemu_startup_s", s0)
            .metric("qemu_gib_per_s_1t", gib / p1)
            .metric("qemu_gib_per_s_2t", gib / p2)
            .metric("qemu_speedup_2t", p1 / p2)
            .metric("ratio_vs_qemu_1t", t1 / p1)
            .metric("ratio_vs_qemu_2t", t2 / p2)
            .metric("qemu_ratio_vs_map_populate_2t", p2 / tpop2)
            .metric("qemu_cpu_s_1t", qc1)
            .metric("qemu_cpu_s_2t", qc2)
            .metric("cpu_ratio_vs_qemu_2t", c2 / qc2)
            .note(format!(
                "QEMU: {version}, timed to its QMP answer minus the same command without \
                 prealloc ({} s); its CPU seconds are read from /proc/PID/stat at that moment (10 ms \
                 ticks) minus those of the run without prealloc.",
                format_value(s0)
            ));
    }
    report.note(
        "Ceilings for speedup_2t: anon_speedup_2t is the same preallocation of private \
         anonymous memory (4 KiB pages, no file), two_memfds_speedup_2t gives each of the two \
         threads its own memfd of half the size (one thread on the whole memfd is the \
         baseline), ceiling_2t_memset zeroes already-resident memory page by page (store \
         bandwidth only). cpu_s_2t_vs_1t above 1 is CPU time the second thread adds per byte; \
         with a fully used second CPU, speedup_2t cannot exceed 2 / cpu_s_2t_vs_1t. \
         ratio_vs_map_populate_2t and qemu_ratio_vs_map_populate_2t set us and QEMU against \
         the kernel's own populate of the same memfd by two threads (each mmap(MAP_POPULATE) \
         of one half at once): the ceiling of ratio_vs_qemu_2t.",
    );
    report.table(contenders);
    let mut seq = || four_regions(len, false);
    let mut conc = || four_regions(len, true);
    let [t_seq, t_conc] = alternate(ctx.reps(), &mut [&mut seq, &mut conc])?;
    report
        .metric("regions4_sequential_s", t_seq)
        .metric("regions4_concurrent_s", t_conc)
        .metric("regions4_concurrent_vs_sequential", t_conc / t_seq)
        .note(
            "regions4_*: four memfds of 1/2, 1/4, 1/4 - 1/64 and 1/64 of the size, two \
             threads, one preallocate per region in turn (sequential) against one \
             preallocate_regions job (concurrent).",
        );
    let qemu_bin = qemu_path.as_ref().map(|(path, _)| path);
    hugetlbfs_rows(ctx, &mut report, qemu_bin, &HUGE_2M, len)?;
    // At least two gigantic pages, so that two threads have one each.
    hugetlbfs_rows(ctx, &mut report, qemu_bin, &HUGE_1G, len.max(2 << 30))?;
    report.note(format!(
        "memfd of {} MiB, 4 KiB pages, median of {} alternating runs; load average {} at the \
         start, {} at the end. cpu_utilisation_* is CPU seconds per wall second (2.0 = two \
         threads ran all the time); well below that, the scheduler gave this process less than \
         the CPUs it asked for, which bounds speedup_2t and makes the wall-time ratios noisy. \
         cpu_s_1t hardly depends on the load; cpu_s_2t drops under load because the two \
         threads seldom run at the same time and so contend less.",
        len >> 20,
        ctx.reps(),
        load_before,
        load_average()
    ));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_zero_pages_clears_exactly_the_range() {
        let mut buf = vec![0xa5u8; 3 * 4096 + 100];
        let base = buf.as_mut_ptr() as usize;
        // SAFETY: a range inside `buf`, which nothing else touches meanwhile.
        unsafe { zero_pages(base + 1, 2 * 4096 + 10) };
        assert_eq!(buf[0], 0xa5);
        assert!(buf[1..=2 * 4096 + 10].iter().all(|&b| b == 0));
        assert!(buf[2 * 4096 + 11..].iter().all(|&b| b == 0xa5));
    }

    #[test]
    fn test_hugetlbfs_page_sizes_parse() {
        assert_eq!(parse_page_size_kib("2M"), Some(2048));
        assert_eq!(parse_page_size_kib("2048k"), Some(2048));
        assert_eq!(parse_page_size_kib("1G"), Some(1 << 20));
        assert_eq!(parse_page_size_kib("1T"), None);
        assert_eq!(parse_page_size_kib("12"), None);
    }

    #[test]
    fn test_four_regions_run_both_ways() {
        for concurrent in [false, true] {
            assert!(four_regions(64 << 20, concurrent).unwrap() > 0.0);
        }
    }

    #[test]
    fn test_ceiling_contenders_run_on_small_regions() {
        // Two threads need 64 MiB each (QEMU's size / 64 MiB term).
        let len = 128 << 20;
        let mut cpu = Vec::new();
        for threads in [1, 2] {
            assert!(ours_anon(len, threads, &mut cpu).unwrap() > 0.0);
            assert!(memset(len, threads).unwrap() > 0.0);
        }
        assert_eq!(cpu.len(), 2);
        assert!(ours_two_memfds(len).unwrap() > 0.0);
    }

    #[test]
    fn test_map_populate_2t_runs_on_an_odd_page_count() {
        let mut cpu = Vec::new();
        // An odd number of pages: the second half is the shorter.
        assert!(map_populate_2t((16 << 20) + 4096, &mut cpu).unwrap() > 0.0);
        assert_eq!(cpu.len(), 1);
    }
}
