// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Suite `virtio-9p-restart`: what keeping the session
//! crash-safe costs on the data path, and how long a guest waits when the
//! daemon is killed with SIGKILL and a new one takes over.
//!
//! - **Bookkeeping cost.** Two daemons in this process over the same file,
//!   one with a state directory (`BackendConfig::state_dir`, the binary's
//!   `--state-dir`) and one without, in alternating rounds: 4 KiB random
//!   reads with 64 in flight on the split and on the packed ring, and
//!   Tgetattr one at a time. With a state directory every chain taken and
//!   used is recorded in the mapped in-flight table (and on a packed ring
//!   the ring position); these requests change no fid, so the journal is
//!   not written. The target: at most 5 % slower. A Twalk to a
//!   new fid and its Tclunk, one at a time, change a fid each: each is a
//!   journal record too.
//! - **Kill to first reply.** The daemon runs in a child process
//!   (`vmm-benches __vhost-daemon DIR SOCK STATE`: the library's `Daemon`
//!   with the state directory, `Daemon::recover_crashed_session` first).
//!   The fake VMM opens a session with 1000 fids and an open file, puts 32
//!   reads on the ring and kicks; the child is killed with SIGKILL at once
//!   (some reads answered, some in flight), a new child starts on the same
//!   socket and state, the fake VMM reconnects as QEMU 10 does (packed: at
//!   its stale base) and asks for a Tgetattr. The figure is the time from
//!   the kill to the first used element the new daemon writes: the new
//!   process's start, the session's recovery from the snapshot and the
//!   journal, the vhost-user setup and the first request. The fake VMM
//!   retries its connection every 20 ms, as QEMU's `reconnect-ms` would
//!   every N ms (500 in ci/guest/restart.sh), so the figure has that
//!   granularity on top.

use std::error::Error;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_9p_server::engine::OffloadPolicy;
use virtio_9p_server::protocol::{GetattrMask, OpenFlags, Tgetattr, Tmessage, Tread, Twalk};
use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout, VmmOptions};
use virtio_9p_server::vhost_user::{Daemon, DaemonConfig, Listen};
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server};

use super::vhost::{call, per_request_us, random_4k, session, start_with, Res};
use crate::harness::{format_value, median, Ctx, SuiteReport, SuiteResult, Table};

/// One-line description.
pub const ABOUT: &str =
    "9P daemon restart: --state-dir bookkeeping cost (4 KiB IOPS, Tgetattr, Twalk + Tclunk) and kill -9 to the new daemon's first reply";
/// Ready to run.
pub const READY: bool = true;

/// Runs the suite.
pub fn run(ctx: &Ctx) -> SuiteResult {
    let mut report = SuiteReport::default();
    bookkeeping(ctx, &mut report).map_err(|e| -> Box<dyn Error> { e.to_string().into() })?;
    kill_to_first_reply(ctx, &mut report)
        .map_err(|e| -> Box<dyn Error> { e.to_string().into() })?;
    Ok(report)
}

/// A state directory on tmpfs (`/dev/shm`) as the daemon's docs ask,
/// else in the temporary directory.
fn state_dir() -> Res<tempfile::TempDir> {
    Ok(tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir())?)
}

fn state_fd(dir: &Path) -> Res<Arc<OwnedFd>> {
    Ok(Arc::new(OwnedFd::from(std::fs::File::open(dir)?)))
}

fn bookkeeping(ctx: &Ctx, report: &mut SuiteReport) -> Res<()> {
    let file_len: u64 = ctx.pick(256 << 20, 32 << 20);
    let dir = tempfile::tempdir()?;
    {
        use std::io::Write;
        let mut f = std::fs::File::create(dir.path().join("big"))?;
        let block: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        for _ in 0..file_len >> 20 {
            f.write_all(&block)?;
        }
    }
    let state = state_dir()?;
    let reps = ctx.reps();
    let dur = Duration::from_millis(ctx.pick(1500, 200));
    let n = ctx.pick(5000, 300);
    let getattr_frame = Tmessage::Getattr(Tgetattr {
        fid: 1,
        request_mask: GetattrMask::BASIC,
    })
    .encode_frame(10);
    // Per round and kind: [no state dir, the same again (the control),
    // state dir].
    let mut per: Vec<[[f64; 3]; 4]> = Vec::new();
    for round in 0..2 * reps.max(2) {
        // Three fresh daemons each round (so none keeps an advantage from
        // where its threads landed); each figure is taken on the three
        // back to back, in an order that rotates from round to round.
        let mut order = [0usize, 1, 2];
        order.rotate_left(round % 3);
        if round % 2 == 1 {
            order.reverse();
        }
        let mut running = Vec::new();
        for role in order {
            let state = if role == 2 {
                Some(state_fd(state.path())?)
            } else {
                None
            };
            let r = start_with(
                dir.path(),
                coro_pool::Policy::Bounded,
                OffloadPolicy::Auto,
                state,
            )?;
            running.push((role, r));
        }
        let mut v = [[0.0; 3]; 4];
        for (kind, row) in v.iter_mut().enumerate() {
            for (role, run) in &running {
                row[*role] = match kind {
                    0 => random_4k(run, file_len, 64, dur, false)?.0,
                    1 => random_4k(run, file_len, 64, dur, true)?.0,
                    2 => {
                        let mut vmm = session(run, 64 << 10, "big", OpenFlags::RDONLY)?;
                        per_request_us(&mut vmm, &getattr_frame, 256, n / 10)?;
                        per_request_us(&mut vmm, &getattr_frame, 256, n)?
                    }
                    _ => {
                        let mut vmm = session(run, 64 << 10, "big", OpenFlags::RDONLY)?;
                        walk_clunk_us(&mut vmm, n / 10)?;
                        walk_clunk_us(&mut vmm, n)?
                    }
                };
            }
        }
        per.push(v);
    }
    // Medians of the figures, and of the ratios taken within a round.
    let col =
        |kind: usize, role: usize| -> Vec<f64> { per.iter().map(|v| v[kind][role]).collect() };
    let ratios = |kind: usize, role: usize| -> Vec<f64> {
        per.iter().map(|v| v[kind][role] / v[kind][0]).collect()
    };
    let spread = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(0.0, f64::max);
        format!("{}..{}", format_value(lo), format_value(hi))
    };
    let names = [
        ("state_dir_iops_4k_ratio", "control_iops_4k_ratio"),
        (
            "state_dir_iops_4k_packed_ratio",
            "control_iops_4k_packed_ratio",
        ),
        ("state_dir_getattr_us_ratio", "control_getattr_us_ratio"),
        (
            "state_dir_walk_clunk_us_ratio",
            "control_walk_clunk_us_ratio",
        ),
    ];
    let mut t = Table::new(
        "crash-safe session state (--state-dir) vs none: medians, and of the ratios within a round",
        &[
            "what",
            "no state dir",
            "state dir",
            "with / without",
            "its range over the rounds",
            "control: without / without",
        ],
    );
    for (kind, label) in [
        "4 KiB random reads, 64 in flight, split ring, IOPS",
        "the same on a packed ring, IOPS",
        "Tgetattr, one at a time, split ring, µs",
        "Twalk to a new fid + Tclunk, one at a time, split ring, µs per pair",
    ]
    .iter()
    .enumerate()
    {
        let with = ratios(kind, 2);
        let control = ratios(kind, 1);
        report.metric(names[kind].0, median(&with));
        report.metric(names[kind].1, median(&control));
        t.row(&[
            label.to_string(),
            format_value(median(&col(kind, 0))),
            format_value(median(&col(kind, 2))),
            format_value(median(&with)),
            spread(&with),
            format_value(median(&control)),
        ]);
    }
    report.metric("iops_4k_no_state_dir", median(&col(0, 0)));
    report.metric("getattr_us_no_state_dir", median(&col(2, 0)));
    report.metric("walk_clunk_us_no_state_dir", median(&col(3, 0)));
    report.table(t);
    report.note(format!(
        "Bookkeeping: three daemons in this process (4 workers, queue size 1024, started afresh \
         each round) over a {} MiB file in the page cache, two without a state directory (the \
         second is the control: its ratio to the first is the noise of this run) and one with it \
         on {}; {} rounds, each figure taken on the three back to back in a rotating order ({} ms \
         of random reads per ring, {n} Tgetattr, {n} Twalk + Tclunk pairs).",
        file_len >> 20,
        fs_type(state.path()),
        2 * reps.max(2),
        dur.as_millis()
    ));
    Ok(())
}

/// µs per Twalk (fid 1 to a new fid, no names) and Tclunk of it, one
/// request at a time: each changes a fid, so each is journaled.
fn walk_clunk_us(vmm: &mut FakeVmm, n: usize) -> Res<f64> {
    let walk = Tmessage::Walk(Twalk {
        fid: 1,
        newfid: 77,
        wnames: Vec::new(),
    })
    .encode_frame(11);
    let clunk = Tmessage::Clunk(virtio_9p_server::protocol::Tfid { fid: 77 }).encode_frame(12);
    let t0 = Instant::now();
    for _ in 0..n {
        for frame in [&walk, &clunk] {
            vmm.submit(frame, 256, Layout::Direct)?;
            vmm.kick()?;
            // Rwalk of no names is 9 bytes, Rclunk 7; Rlerror 11.
            let len = super::vhost::wait_one(vmm)?.len;
            if len != 9 && len != 7 {
                return Err(format!("Twalk/Tclunk failed ({len}-byte reply)").into());
            }
        }
    }
    Ok(t0.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// The filesystem type of `p` as statfs names it (tmpfs or not).
fn fs_type(p: &Path) -> &'static str {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return "?";
    };
    // SAFETY: a zeroed statfs is a valid value; statfs writes it.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and statfs pointer for the call.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "?";
    }
    if st.f_type == libc::TMPFS_MAGIC {
        "tmpfs"
    } else {
        "a disk filesystem"
    }
}

/// The child process of the kill scenario: serves `dir` on `sock` with
/// the crash-safe state in `state`, taking over what a killed predecessor
/// left there. Runs until killed.
pub fn serve_vhost_daemon(dir: &Path, sock: &Path, state: &Path) -> Res<()> {
    let fs = PassthroughFs::new(PassthroughConfig::new(dir))?;
    let server = Arc::new(Server::new(fs, Config::default())?);
    let mut config = DaemonConfig::default();
    config.listen = Listen::Path(sock.to_path_buf());
    config.backend.tag = "bench".into();
    config.backend.engine.workers = 2;
    config.backend.state_dir = Some(state_fd(state)?);
    let mut daemon = Daemon::new(server, config)?;
    daemon.recover_crashed_session()?;
    daemon.run()?;
    Ok(())
}

struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_daemon(dir: &Path, sock: &Path, state: &Path) -> Res<Child> {
    let child = Command::new(std::env::current_exe()?)
        .arg("__vhost-daemon")
        .arg(dir)
        .arg(sock)
        .arg(state)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    Ok(Child(child))
}

/// One kill: returns the ms from SIGKILL to the new daemon's first used
/// element, and the reads answered before the kill.
fn one_kill(packed: bool, fids: u32) -> Res<(f64, usize)> {
    let dir = tempfile::tempdir()?;
    let run = state_dir()?;
    std::fs::write(dir.path().join("f"), vec![7u8; 1 << 20])?;
    let sock = run.path().join("vu.sock");
    let state = run.path().join("state");
    std::fs::create_dir(&state)?;
    let mut old = spawn_daemon(dir.path(), &sock, &state)?;
    let mut o = VmmOptions::default();
    o.mem_size = 16 << 20;
    o.queue_size = 256;
    o.packed = packed;
    let mut vmm = FakeVmm::connect(&sock, o)?;
    call(
        &mut vmm,
        0xffff,
        Tmessage::Version(virtio_9p_server::protocol::Tversion {
            msize: 65536,
            version: b"9P2000.L".to_vec(),
        }),
    )?;
    call(
        &mut vmm,
        1,
        Tmessage::Attach(virtio_9p_server::protocol::Tattach {
            fid: 0,
            afid: virtio_9p_server::protocol::NOFID,
            uname: b"root".to_vec(),
            aname: Vec::new(),
            n_uname: 0,
        }),
    )?;
    for fid in 1..=fids {
        call(
            &mut vmm,
            2,
            Tmessage::Walk(Twalk {
                fid: 0,
                newfid: fid,
                wnames: vec![b"f".to_vec()],
            }),
        )?;
    }
    call(
        &mut vmm,
        3,
        Tmessage::Lopen(virtio_9p_server::protocol::Tlopen {
            fid: 1,
            flags: OpenFlags::RDONLY,
        }),
    )?;
    for i in 0..32u16 {
        let read = Tmessage::Read(Tread {
            fid: 1,
            offset: u64::from(i) * 4096,
            count: 4096,
        });
        vmm.submit(&read.encode_frame(100 + i), 4096 + 64, Layout::Direct)?;
    }
    vmm.kick()?;
    let t0 = Instant::now();
    old.0.kill()?;
    old.0.wait()?;
    let before = vmm.collect_used()?.len();
    let _new = spawn_daemon(dir.path(), &sock, &state)?;
    vmm.reconnect_like_qemu(&sock)?;
    let getattr = Tmessage::Getattr(Tgetattr {
        fid: 1,
        request_mask: GetattrMask::BASIC,
    });
    vmm.submit(&getattr.encode_frame(200), 256, Layout::Direct)?;
    vmm.kick()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = loop {
        let n = vmm.wait_used(Duration::from_millis(1))?.len();
        if n > 0 {
            break n;
        }
        if Instant::now() > deadline {
            return Err("the new daemon did not answer within 30 s".into());
        }
    };
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    // Everything else comes too, once.
    let want = 33 - before;
    let deadline = Instant::now() + Duration::from_secs(30);
    while got < want && Instant::now() < deadline {
        got += vmm.wait_used(Duration::from_millis(100))?.len();
    }
    if got != want {
        return Err(format!(
            "{} ring: {got} replies after the restart, {want} expected ({before} before the kill)",
            if packed { "packed" } else { "split" }
        )
        .into());
    }
    Ok((ms, before))
}

fn kill_to_first_reply(ctx: &Ctx, report: &mut SuiteReport) -> Res<()> {
    let reps = ctx.reps().max(3);
    let fids = ctx.pick(1000, 100);
    let mut t = Table::new(
        "SIGKILL to the new daemon's first reply (child process, state directory, reconnect as QEMU 10)",
        &["ring", "median ms", "min ms", "max ms", "reads answered before the kill (of 32)"],
    );
    for packed in [false, true] {
        let mut ms = Vec::new();
        let mut before = Vec::new();
        for _ in 0..reps {
            let (m, b) = one_kill(packed, fids)?;
            ms.push(m);
            before.push(b as f64);
        }
        let name = if packed { "packed" } else { "split" };
        let med = median(&ms);
        report.metric(&format!("kill_to_first_reply_ms_{name}"), med);
        let min = ms.iter().copied().fold(f64::INFINITY, f64::min);
        let max = ms.iter().copied().fold(0.0, f64::max);
        t.row(&[
            name.to_string(),
            format_value(med),
            format_value(min),
            format_value(max),
            format!(
                "{}..{}",
                before.iter().copied().fold(f64::INFINITY, f64::min),
                before.iter().copied().fold(0.0, f64::max)
            ),
        ]);
    }
    report.table(t);
    report.note(format!(
        "Kill to first reply: {reps} kills per ring, a session of {fids} fids and one open file \
         (queue size 256), 32 reads of 4 KiB put on the ring just before the SIGKILL; the fake VMM \
         polls for the socket every 20 ms."
    ));
    Ok(())
}
