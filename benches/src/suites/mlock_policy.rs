// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Suite `mlock-policy`: resident memory of a process that maps guest RAM
//! (2 GiB) and applies each mem-lock policy, against QEMU's
//! `-overcommit mem-lock=off|on|on-fault` with a 2 GiB memory backend.
//!
//! Our figures come from child processes (`fork`) that map the region
//! (`MAP_PRIVATE | MAP_ANONYMOUS`, like QEMU's `memory-backend-ram`), apply
//! the policy through `mlock-policy` (process-wide with `apply_process`, or
//! only the region with `lock_region`) and read their own
//! `/proc/self/status`. The child's work between `fork` and `_exit` is
//! system calls and parsing into stack buffers, so it does not allocate
//! unless a lock fails. QEMU's figure is `VmRSS` of the QEMU process once
//! its main loop has answered a QMP `query-status`.

use std::cell::RefCell;
use std::error::Error;
use std::io::{BufRead, BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mlock_policy::{LockBudget, LockStatus, MlockPolicy};

use crate::harness::{alternate, format_value, median, Ctx, SuiteReport, SuiteResult, Table};

/// One-line description.
pub const ABOUT: &str = "RSS with mem-lock off/on/on-fault (process-wide and per region) vs QEMU";
/// Ready to run.
pub const READY: bool = true;

const MIB: f64 = (1u64 << 20) as f64;

/// How a child applies the policy.
#[derive(Debug, Clone, Copy)]
enum Scope {
    /// `apply_process()`: mlockall.
    Process,
    /// `lock_region()` on the guest RAM only.
    Region,
}

/// What one run reports.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    rss: f64,
    lck: f64,
    apply_ms: f64,
}

/// Child failure codes sent through the pipe.
const CHILD_OK: u64 = 0;
const CHILD_MMAP_FAILED: u64 = 1;
const CHILD_LOCK_FAILED: u64 = 2;
const CHILD_STATUS_FAILED: u64 = 3;

/// The child's side: map, lock, read the status. Allocation-free on success.
fn child_measure(policy: MlockPolicy, scope: Scope, size: usize) -> [u64; 4] {
    // SAFETY: a fresh anonymous mapping with no address hint; checked.
    let ram = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if ram == libc::MAP_FAILED {
        return [CHILD_MMAP_FAILED, 0, 0, 0];
    }
    let start = Instant::now();
    let locked = match scope {
        Scope::Process => policy.apply_process().is_ok(),
        // SAFETY: the bench owns the mapping and keeps it while the guard
        // lives (until the process exits).
        Scope::Region => match unsafe { policy.lock_region(ram as *const u8, size) } {
            // The process exits right after; keep the lock until then.
            Ok(lock) => {
                std::mem::forget(lock);
                true
            }
            Err(_) => false,
        },
    };
    let apply_ns = start.elapsed().as_nanos() as u64;
    if !locked {
        return [CHILD_LOCK_FAILED, 0, 0, 0];
    }
    let mut buf = [0u8; 8192];
    // SAFETY: a NUL-terminated path literal.
    let fd = unsafe { libc::open(c"/proc/self/status".as_ptr(), libc::O_RDONLY) };
    if fd < 0 {
        return [CHILD_STATUS_FAILED, 0, 0, 0];
    }
    let mut len = 0;
    while len < buf.len() {
        // SAFETY: reads into the unused tail of `buf`.
        let n = unsafe { libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - len) };
        if n <= 0 {
            break;
        }
        len += n as usize;
    }
    // SAFETY: `fd` was opened above.
    unsafe { libc::close(fd) };
    match std::str::from_utf8(&buf[..len])
        .ok()
        .and_then(|text| LockStatus::parse(text).ok())
    {
        Some(status) => [CHILD_OK, status.vm_rss(), status.vm_lck(), apply_ns],
        None => [CHILD_STATUS_FAILED, 0, 0, 0],
    }
}

/// Runs one child and returns its figures.
fn measure_child(
    policy: MlockPolicy,
    scope: Scope,
    size: usize,
) -> Result<Figures, Box<dyn Error>> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe2: {}", std::io::Error::last_os_error()).into());
    }
    let [read_fd, write_fd] = fds;
    // SAFETY: the child only runs `child_measure` (system calls and stack
    // buffers), writes to the pipe and calls `_exit`; it never returns into
    // the harness.
    // SAFETY: the bench owns the mapping and keeps it while the job or guard lives.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let err = std::io::Error::last_os_error();
        // SAFETY: closing our own pipe ends.
        unsafe {
            libc::close(read_fd);
            libc::close(write_fd);
        }
        return Err(format!("fork: {err}").into());
    }
    if pid == 0 {
        let words = child_measure(policy, scope, size);
        let mut bytes = [0u8; 32];
        for (chunk, word) in bytes.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        // SAFETY: writes our stack buffer to the pipe and leaves at once
        // without running the parent's exit handlers.
        unsafe {
            libc::write(write_fd, bytes.as_ptr().cast(), bytes.len());
            libc::_exit(0);
        }
    }
    // SAFETY: the parent does not write; closing its copy lets read() see
    // EOF if the child dies.
    // SAFETY: the bench owns the mapping and keeps it while the job or guard lives.
    unsafe { libc::close(write_fd) };
    let mut bytes = [0u8; 32];
    let mut got = 0;
    while got < bytes.len() {
        // SAFETY: reads into the unused tail of `bytes`.
        let n = unsafe { libc::read(read_fd, bytes[got..].as_mut_ptr().cast(), bytes.len() - got) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            break;
        }
        got += n as usize;
    }
    let mut wstatus = 0;
    // SAFETY: reaps the child forked above; closes our read end.
    unsafe {
        libc::close(read_fd);
        libc::waitpid(pid, &mut wstatus, 0);
    }
    if got != bytes.len() {
        return Err(format!("measuring child died (wait status {wstatus:#x})").into());
    }
    let word = |i: usize| u64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
    match word(0) {
        CHILD_OK => Ok(Figures {
            rss: word(1) as f64 / MIB,
            lck: word(2) as f64 / MIB,
            apply_ms: word(3) as f64 / 1e6,
        }),
        CHILD_LOCK_FAILED => {
            // Explain with the pre-flight check, run here where allocating
            // is fine (the child inherited our limits and capabilities).
            let why = match scope {
                Scope::Process => policy.preflight(size as u64),
                Scope::Region => policy.preflight_regions(size as u64),
            };
            Err(match why {
                Err(e) => format!("mem-lock={policy} failed in the child: {e}"),
                Ok(()) => format!("mem-lock={policy} failed in the child"),
            }
            .into())
        }
        CHILD_MMAP_FAILED => Err(format!("child could not map {size} bytes").into()),
        code => Err(format!("child could not read its status (code {code})").into()),
    }
}

/// `qemu-system-x86_64` on PATH, if any.
fn find_qemu() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("qemu-system-x86_64"))
        .find(|p| p.is_file())
}

/// A QEMU process, killed and reaped on drop.
struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends one QMP command and waits for its `return` line.
fn qmp(
    stream: &mut UnixStream,
    reader: &mut impl BufRead,
    command: &str,
) -> Result<(), Box<dyn Error>> {
    stream.write_all(format!("{{\"execute\": \"{command}\"}}\n").as_bytes())?;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(format!("QMP closed before answering {command}").into());
        }
        if line.starts_with("{\"return\"") {
            return Ok(());
        }
        if line.starts_with("{\"error\"") {
            return Err(format!("QMP {command}: {}", line.trim()).into());
        }
    }
}

/// Starts QEMU with `mem-lock=<mode>` and a RAM backend of `size_mib`, waits
/// until its main loop answers QMP, and reads its status.
fn measure_qemu(qemu: &Path, mode: MlockPolicy, size_mib: u64) -> Result<Figures, Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let sock = dir.path().join("qmp.sock");
    let start = Instant::now();
    let mut child = Qemu(
        Command::new(qemu)
            .args(["-machine", "none", "-nodefaults", "-display", "none", "-S"])
            .args(["-overcommit", &format!("mem-lock={mode}")])
            .args([
                "-object",
                &format!("memory-backend-ram,id=ram0,size={size_mib}M"),
            ])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", sock.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut stream = loop {
        if let Some(status) = child.0.try_wait()? {
            let mut err = String::new();
            if let Some(mut stderr) = child.0.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut stderr, &mut err);
            }
            return Err(format!("QEMU exited with {status}: {}", err.trim()).into());
        }
        if let Ok(stream) = UnixStream::connect(&sock) {
            break stream;
        }
        if Instant::now() > deadline {
            return Err("QEMU's QMP socket did not appear within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // `mem-lock=on` faults in everything before the main loop runs; on a
    // loaded machine that takes a while.
    stream.set_read_timeout(Some(Duration::from_secs(300)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut greeting = String::new();
    reader.read_line(&mut greeting)?;
    if !greeting.contains("\"QMP\"") {
        return Err(format!("unexpected QMP greeting {greeting:?}").into());
    }
    // The monitor has its own thread; a main-loop command proves that
    // start-up, including the lock, is over.
    qmp(&mut stream, &mut reader, "qmp_capabilities")?;
    qmp(&mut stream, &mut reader, "query-status")?;
    let ready = start.elapsed();
    let status = LockStatus::of_pid(child.0.id())?;
    drop(child);
    Ok(Figures {
        rss: status.vm_rss() as f64 / MIB,
        lck: status.vm_lck() as f64 / MIB,
        apply_ms: ready.as_secs_f64() * 1e3,
    })
}

/// The QEMU version line, for the notes.
fn qemu_version(qemu: &Path) -> String {
    Command::new(qemu)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_else(|| "unknown version".to_string())
}

/// Wraps a measurement for `alternate`: records all its figures in `sink`
/// and hands back the RSS.
fn recorder<'a>(
    run: &'a dyn Fn() -> Result<Figures, Box<dyn Error>>,
    sink: &'a RefCell<Vec<Figures>>,
) -> impl FnMut() -> Result<f64, Box<dyn Error>> + 'a {
    move || {
        let figures = run()?;
        sink.borrow_mut().push(figures);
        Ok(figures.rss)
    }
}

/// The median of each figure over the recorded runs (zeros if none).
fn medians(sink: RefCell<Vec<Figures>>) -> Figures {
    let samples = sink.into_inner();
    if samples.is_empty() {
        return Figures::default();
    }
    let pick = |f: fn(&Figures) -> f64| median(&samples.iter().map(f).collect::<Vec<_>>());
    Figures {
        rss: pick(|f| f.rss),
        lck: pick(|f| f.lck),
        apply_ms: pick(|f| f.apply_ms),
    }
}

/// Measures every contender and reports RSS, VmLck and time to apply.
pub fn run(ctx: &Ctx) -> SuiteResult {
    let size_mib: u64 = ctx.pick(2048, 64);
    let size = (size_mib << 20) as usize;
    let reps = ctx.reps();

    // Locking needs CAP_IPC_LOCK or a RLIMIT_MEMLOCK above the whole
    // address space (QEMU's is about 1.2 GiB more than its backend). Without
    // either, only the `off` contenders run.
    let budget = LockBudget::current()?;
    let lock_check = budget.check(MlockPolicy::On, "mlockall", size as u64 + (4 << 30));
    let mut report = SuiteReport::default();
    let mut table = Table::new(
        &format!("{size_mib} MiB of guest RAM, median of {reps} alternating runs"),
        &[
            "contender",
            "RSS MiB",
            "VmLck MiB",
            "time to apply or ready, ms",
        ],
    );
    let row = |table: &mut Table, name: &str, f: &Figures| {
        table.row(&[
            name.to_string(),
            format_value(f.rss),
            format_value(f.lck),
            format_value(f.apply_ms),
        ]);
    };

    let off = || measure_child(MlockPolicy::Off, Scope::Process, size);
    if let Err(e) = &lock_check {
        let sink = RefCell::default();
        alternate(reps, &mut [&mut recorder(&off, &sink)])?;
        let off = medians(sink);
        report.metric("rss_mib_off", off.rss);
        row(&mut table, "mlock-policy off", &off);
        report.note(format!(
            "Skipped every locking contender (ours and QEMU's) since this process \
             cannot lock that much ({budget}): {e}"
        ));
        if let Some(qemu) = find_qemu() {
            let q_off = || measure_qemu(&qemu, MlockPolicy::Off, size_mib);
            let sink = RefCell::default();
            alternate(reps, &mut [&mut recorder(&q_off, &sink)])?;
            let q_off = medians(sink);
            report.metric("qemu_rss_mib_off", q_off.rss);
            row(&mut table, "QEMU mem-lock=off", &q_off);
        }
        report.table(table);
        return Ok(report);
    }
    let on = || measure_child(MlockPolicy::On, Scope::Process, size);
    let on_fault = || measure_child(MlockPolicy::OnFault, Scope::Process, size);
    let region_on_fault = || measure_child(MlockPolicy::OnFault, Scope::Region, size);
    let region_on = || measure_child(MlockPolicy::On, Scope::Region, size);
    let sinks: [RefCell<Vec<Figures>>; 5] = Default::default();
    alternate(
        reps,
        &mut [
            &mut recorder(&off, &sinks[0]),
            &mut recorder(&on, &sinks[1]),
            &mut recorder(&on_fault, &sinks[2]),
            &mut recorder(&region_on_fault, &sinks[3]),
            &mut recorder(&region_on, &sinks[4]),
        ],
    )?;
    let [off, on, on_fault, region_on_fault, region_on] = sinks.map(medians);

    report
        .metric("rss_mib_off", off.rss)
        .metric("rss_mib_on", on.rss)
        .metric("rss_mib_on_fault", on_fault.rss)
        .metric("rss_mib_region_on_fault", region_on_fault.rss)
        .metric("rss_mib_region_on", region_on.rss)
        .metric("on_fault_over_off_mib", on_fault.rss - off.rss)
        .metric(
            "region_on_fault_over_off_mib",
            region_on_fault.rss - off.rss,
        );

    row(&mut table, "mlock-policy off", &off);
    row(&mut table, "mlock-policy on (mlockall)", &on);
    row(&mut table, "mlock-policy on-fault (mlockall)", &on_fault);
    row(
        &mut table,
        "mlock-policy on-fault, region only (mlock2)",
        &region_on_fault,
    );
    row(
        &mut table,
        "mlock-policy on, region only (mlock)",
        &region_on,
    );

    let target = if on_fault.rss - off.rss <= 5.0 && region_on_fault.rss - off.rss <= 5.0 {
        "met"
    } else {
        "MISSED"
    };
    report.note(format!(
        "Target on-fault within +5 MiB of off: {target} (process-wide {:+.1} MiB, \
         region {:+.1} MiB). Our figures are forked children of the harness, so \
         they include the pages they share with it.",
        on_fault.rss - off.rss,
        region_on_fault.rss - off.rss
    ));

    match find_qemu() {
        Some(qemu) => {
            let version = qemu_version(&qemu);
            // mem-lock=on faults in all of QEMU (about 3.2 GB with a 2 GiB
            // backend) and takes seconds; quick mode leaves it out.
            let q_off = || measure_qemu(&qemu, MlockPolicy::Off, size_mib);
            let q_on_fault = || measure_qemu(&qemu, MlockPolicy::OnFault, size_mib);
            let q_on = || measure_qemu(&qemu, MlockPolicy::On, size_mib);
            let sinks: [RefCell<Vec<Figures>>; 3] = Default::default();
            if ctx.quick {
                alternate(
                    reps,
                    &mut [
                        &mut recorder(&q_off, &sinks[0]),
                        &mut recorder(&q_on_fault, &sinks[1]),
                    ],
                )?;
            } else {
                alternate(
                    reps,
                    &mut [
                        &mut recorder(&q_off, &sinks[0]),
                        &mut recorder(&q_on_fault, &sinks[1]),
                        &mut recorder(&q_on, &sinks[2]),
                    ],
                )?;
            }
            let [q_off, q_on_fault, q_on] = sinks.map(medians);
            let q_on = (!ctx.quick).then_some(q_on);
            report.metric("qemu_rss_mib_off", q_off.rss);
            if let Some(q_on) = &q_on {
                report.metric("qemu_rss_mib_on", q_on.rss);
            }
            report
                .metric("qemu_rss_mib_on_fault", q_on_fault.rss)
                .metric("qemu_on_fault_over_off_mib", q_on_fault.rss - q_off.rss);
            row(&mut table, "QEMU mem-lock=off", &q_off);
            if let Some(q_on) = &q_on {
                row(&mut table, "QEMU mem-lock=on", q_on);
            }
            row(&mut table, "QEMU mem-lock=on-fault", &q_on_fault);
            report.note(format!(
                "QEMU: {version}, `-machine none -nodefaults -display none -S -overcommit \
                 mem-lock=... -object memory-backend-ram,size={size_mib}M`, VmRSS once QMP \
                 query-status answers (the time column is start to ready).{}",
                if q_on.is_none() {
                    " Quick mode skips QEMU mem-lock=on (it faults in all of QEMU)."
                } else {
                    ""
                }
            ));
        }
        None => {
            report.note("qemu-system-x86_64 is not on PATH: the qemu_* metrics are skipped.");
        }
    }
    report.table(table);
    Ok(report)
}
