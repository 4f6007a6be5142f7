// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Part of suite `virtio-9p`: the socket transport against
//! diod, the 9P2000.L server Debian ships, with one load generator.
//!
//! The load generator is a plain 9P client on a unix socket (the
//! `test-utils` client of `virtio-9p-server` for the session set-up, and a
//! lean Tread/Tgetattr loop over the same stream that reuses one reply
//! buffer). It talks to:
//!
//! - ours: `virtio_9p_server::transport::socket::Listener::serve_with` in
//!   this process (socket threads on the request engine), exactly what
//!   `virtio-9p-server --listen unix:PATH` runs;
//! - diod: `diod -f -n -N -l SOCK -e DIR`, a separate process.
//!
//! Both export the same directory, attach as uid 0 with the export path as
//! the aname (diod selects its export by aname), and are measured at the
//! msizes each supports: 8 KiB and 64 KiB for both (diod caps msize at
//! 64 KiB), larger ones for ours only. Contenders alternate; medians of
//! `ctx.reps()` runs.

use std::error::Error;
use std::fs::File;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use virtio_9p_server::protocol::{LockFlags, LockStatus, LockType, OpenFlags, IOHDRSZ};
use virtio_9p_server::transport::socket::SocketLimits;

use super::peers::{diod_version, find_diod, rss_mib, Diod, OursProcess, OursSocket};
use super::socket_client::{par_read, trivial_session, Session, ROOT};
use super::splice::{splice_e2e_part, splice_part};
use crate::harness::{alternate, format_value, Ctx, SuiteReport, Table};

type Res<T> = Result<T, Box<dyn Error>>;

const KIB: u32 = 1024;

fn size_label(msize: u32) -> String {
    if msize >= 1 << 20 {
        format!("{} MiB", msize >> 20)
    } else {
        format!("{} KiB", msize >> 10)
    }
}

fn size_key(msize: u32) -> String {
    if msize >= 1 << 20 {
        format!("{}m", msize >> 20)
    } else {
        format!("{}k", msize >> 10)
    }
}

/// Adds the socket-vs-diod metrics, table and plot lines to `report`.
pub fn run(ctx: &Ctx, report: &mut SuiteReport) -> Res<()> {
    let dir = tempfile::tempdir()?;
    let export = std::fs::canonicalize(dir.path())?;
    let file_len: u64 = ctx.pick(256 << 20, 16 << 20);
    {
        let mut f = File::create(export.join("big"))?;
        let block: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        for _ in 0..file_len >> 20 {
            f.write_all(&block)?;
        }
        std::fs::write(export.join("f"), b"small file")?;
    }
    let sock_dir = tempfile::tempdir()?;
    let aname = export.as_os_str().as_encoded_bytes().to_vec();
    let reps = ctx.reps();
    let per_point = |msize: u32| -> u64 {
        let base: u64 = ctx.pick(256 << 20, 8 << 20);
        base.max(16 * u64::from(msize))
    };
    let iters = ctx.pick(20_000, 1_000);
    let warm: u64 = ctx.pick(32 << 20, 2 << 20);

    let mut ours = OursSocket::new(&export, sock_dir.path().join("ours.sock"))?;
    let diod = match find_diod() {
        None => {
            report.note(
                "diod is not installed (apt-get install diod): the diod_* socket metrics are skipped.",
            );
            None
        }
        Some(path) => match Diod::start(
            &path,
            &export,
            sock_dir.path().join("diod.sock"),
            sock_dir.path().join("diod.log"),
        ) {
            Ok(d) => Some((d, diod_version(&path))),
            Err(e) => {
                report.note(format!(
                    "diod failed to start ({e}): diod_* metrics skipped."
                ));
                None
            }
        },
    };

    let mut table = Table::new(
        "socket transport vs diod: the same 9P client over a unix socket",
        &["operation", "ours (socket)", "diod", "ours / diod"],
    );
    let mut ours_points = Vec::new();
    let mut diod_points = Vec::new();

    // Both servers: 8 KiB and 64 KiB, alternating.
    for msize in [8 * KIB, 64 * KIB] {
        let key = size_key(msize);
        let mut mine = Session::open(ours.connect()?, msize, &aname, file_len)?;
        mine.read(warm)?; // warm the session (the file is in the page cache)
        let theirs = match &diod {
            Some((d, _)) => {
                let mut s = Session::open(d.connect()?, msize, &aname, file_len)?;
                if s.msize != msize {
                    return Err(format!("diod granted msize {} for {msize}", s.msize).into());
                }
                s.read(warm)?;
                Some(s)
            }
            None => None,
        };
        let total = per_point(msize);
        let [a, b] = match theirs {
            Some(mut theirs) => alternate(
                reps,
                &mut [&mut || mine.read(total), &mut || theirs.read(total)],
            )?,
            None => [
                alternate(reps, &mut [&mut || mine.read(total)])?[0],
                f64::NAN,
            ],
        };
        report.metric(&format!("sock_read_gib_per_s_{key}"), a);
        ours_points.push((f64::from(msize) / 1024.0, a));
        if !b.is_nan() {
            report
                .metric(&format!("diod_read_gib_per_s_{key}"), b)
                .metric(&format!("ratio_read_vs_diod_{key}"), a / b);
            diod_points.push((f64::from(msize) / 1024.0, b));
            table.row(&[
                format!("sequential read, msize {} (GiB/s)", size_label(msize)),
                format_value(a),
                format_value(b),
                format_value(a / b),
            ]);
        } else {
            table.row(&[
                format!("sequential read, msize {} (GiB/s)", size_label(msize)),
                format_value(a),
                "-".to_string(),
                "-".to_string(),
            ]);
        }
    }

    // Small requests at 64 KiB msize.
    {
        let mut mine = Session::open(ours.connect()?, 64 * KIB, &aname, file_len)?;
        mine.getattr_us(iters / 10)?;
        let mut theirs = match &diod {
            Some((d, _)) => {
                let mut s = Session::open(d.connect()?, 64 * KIB, &aname, file_len)?;
                s.getattr_us(iters / 10)?;
                Some(s)
            }
            None => None,
        };
        let mut rows: Vec<(&str, &str, f64, f64)> = Vec::new();
        for (what, key) in [
            ("Tgetattr (µs)", "getattr"),
            ("Twalk + Tclunk (µs)", "walk_clunk"),
        ] {
            let walk = key == "walk_clunk";
            let n = if walk { iters / 2 } else { iters };
            let mut run_mine = || {
                if walk {
                    mine.walk_clunk_us(n)
                } else {
                    mine.getattr_us(n)
                }
            };
            let [a, b] = match theirs.as_mut() {
                Some(theirs) => {
                    let mut run_theirs = || {
                        if walk {
                            theirs.walk_clunk_us(n)
                        } else {
                            theirs.getattr_us(n)
                        }
                    };
                    alternate(reps, &mut [&mut run_mine, &mut run_theirs])?
                }
                None => [alternate(reps, &mut [&mut run_mine])?[0], f64::NAN],
            };
            rows.push((what, key, a, b));
        }
        for (what, key, a, b) in rows {
            report.metric(&format!("sock_{key}_us"), a);
            if b.is_nan() {
                table.row(&[what.to_string(), format_value(a), "-".into(), "-".into()]);
            } else {
                report
                    .metric(&format!("diod_{key}_us"), b)
                    .metric(&format!("ratio_{key}_vs_diod"), a / b);
                table.row(&[
                    what.to_string(),
                    format_value(a),
                    format_value(b),
                    format_value(a / b),
                ]);
            }
        }
    }

    depth_part(
        ctx,
        report,
        &mut table,
        &mut ours,
        diod.as_ref().map(|(d, _)| d),
        &aname,
        file_len,
    )?;
    idle_rss_part(
        ctx,
        report,
        &export,
        sock_dir.path(),
        diod.as_ref().map(|(d, _)| d),
        &aname,
        file_len,
    )?;
    let mut copy_limits = SocketLimits::default();
    copy_limits.splice_reads = false;
    let mut ours_copy =
        OursSocket::with_limits(&export, sock_dir.path().join("copy.sock"), copy_limits)?;
    splice_e2e_part(
        ctx,
        report,
        &mut table,
        &mut ours,
        &mut ours_copy,
        &aname,
        file_len,
    )?;
    splice_part(ctx, report, &export)?;
    check_socket_metrics(report, diod.is_some())?;

    // Ours only, past diod's cap.
    let larger: Vec<u32> = ctx.pick(
        vec![128 * KIB, 512 * KIB, 1 << 20, 4 << 20, 16 << 20],
        vec![1 << 20],
    );
    for msize in larger {
        let mut mine = Session::open(ours.connect()?, msize, &aname, file_len)?;
        mine.read(warm.max(4 * u64::from(msize)))?;
        let total = per_point(msize);
        let [a] = alternate(reps, &mut [&mut || mine.read(total)])?;
        report.metric(&format!("sock_read_gib_per_s_{}", size_key(msize)), a);
        ours_points.push((f64::from(msize) / 1024.0, a));
        table.row(&[
            format!("sequential read, msize {} (GiB/s)", size_label(msize)),
            format_value(a),
            "-".to_string(),
            "past diod's 64 KiB cap".to_string(),
        ]);
    }

    report.table(table);
    report.series("msize_throughput", "ours (socket)", ours_points);
    if diod_points.len() >= 2 {
        report.series("msize_throughput", "diod (socket)", diod_points);
    }
    let peer = diod
        .as_ref()
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| "diod (not run)".into());
    report.note(format!(
        "Socket part: one load generator (a 9P client on a unix socket, one request at a time unless a row says how many are outstanding) \
         against our socket transport (`Listener::serve_with` in the bench process, as \
         `--listen unix:PATH` runs it) and {peer} (`diod -f -n -N -l SOCK -e DIR`, its own \
         process, attached as uid 0 with the export as aname). {} MiB file in the page cache; \
         reads of msize - 24 bytes, {} MiB or more per run; {iters} Tgetattr, {} walk+clunk pairs \
         at msize 64 KiB; medians of {reps} alternating runs.",
        file_len >> 20,
        per_point(8 * KIB) >> 20,
        iters / 2,
    ));
    drop(diod);
    Ok(())
}

/// The metrics this part reports (the `diod_` and `ratio_`
/// ones only when diod runs); checked at the end of the part.
const SOCKET_METRICS: &[&str] = &[
    "sock_read_gib_per_s_depth1",
    "sock_read_gib_per_s_depth4",
    "sock_read_gib_per_s_depth16",
    "sock_read_gib_per_s_4conns",
    "sock_depth4_vs_depth1",
    "sock_getattr_us_depth1",
    "sock_getattr_us_depth4",
    "sock_getattr_us_depth16",
    "sock_getattr_p99_us_idle",
    "sock_getattr_p99_us_with_slow",
    "sock_getattr_p99_slow_vs_idle",
    "sock_idle_rss_mib",
    "rread_copy_gib_per_s",
    "rread_splice_gib_per_s",
    "rread_splice_vs_copy",
    "sock_read_gib_per_s_depth1_copy",
    "sock_read_gib_per_s_depth4_copy",
    "sock_read_gib_per_s_depth16_copy",
    "sock_splice_vs_copy_depth1",
    "sock_splice_vs_copy_depth4",
    "sock_splice_vs_copy_depth16",
];
/// The same against diod.
const DIOD_METRICS: &[&str] = &[
    "diod_read_gib_per_s_depth1",
    "diod_read_gib_per_s_depth4",
    "diod_read_gib_per_s_depth16",
    "diod_read_gib_per_s_4conns",
    "diod_getattr_us_depth1",
    "diod_getattr_us_depth4",
    "diod_getattr_us_depth16",
    "diod_idle_rss_mib",
    "ratio_read_vs_diod_depth1",
    "ratio_read_vs_diod_depth4",
    "ratio_read_vs_diod_depth16",
    "ratio_read_vs_diod_4conns",
    "ratio_getattr_vs_diod_depth1",
    "ratio_getattr_vs_diod_depth4",
    "ratio_getattr_vs_diod_depth16",
];

/// Fails if a metric of this part is missing from `report`.
fn check_socket_metrics(report: &SuiteReport, with_diod: bool) -> Res<()> {
    let names: Vec<&str> = report.metrics().iter().map(|(n, _)| n.as_str()).collect();
    let wanted = SOCKET_METRICS
        .iter()
        .chain(if with_diod { DIOD_METRICS } else { &[] });
    for m in wanted {
        if !names.contains(m) {
            return Err(format!("metric {m} was not reported").into());
        }
    }
    Ok(())
}

/// Runs `mine` and, if there is one, `theirs` in alternation; NaN for a
/// missing peer.
fn pair(
    reps: usize,
    mine: &mut dyn FnMut() -> Res<f64>,
    theirs: Option<&mut dyn FnMut() -> Res<f64>>,
) -> Res<[f64; 2]> {
    match theirs {
        Some(t) => alternate(reps, &mut [mine, t]),
        None => Ok([alternate(reps, &mut [mine])?[0], f64::NAN]),
    }
}

/// One measurement on a session.
type SessionOp<'a> = dyn Fn(&mut Session) -> Res<f64> + 'a;

/// `op` on our session and diod's (if any) in alternation; NaN for a
/// missing peer.
fn versus(
    reps: usize,
    mine: &mut Session,
    theirs: Option<&mut Session>,
    op: &SessionOp,
) -> Res<[f64; 2]> {
    let mut m = || op(mine);
    match theirs {
        Some(t) => {
            let mut th = || op(t);
            alternate(reps, &mut [&mut m, &mut th])
        }
        None => Ok([alternate(reps, &mut [&mut m])?[0], f64::NAN]),
    }
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or(f64::NAN)
}

fn median_of(mut v: Vec<f64>) -> f64 {
    percentile(std::mem::take(&mut v), 0.5)
}

/// Requests outstanding on one connection, both servers at
/// msize 64 KiB (diod's cap), and a slow request beside a Tgetattr stream.
#[allow(clippy::too_many_arguments)]
fn depth_part(
    ctx: &Ctx,
    report: &mut SuiteReport,
    table: &mut Table,
    ours: &mut OursSocket,
    diod: Option<&Diod>,
    aname: &[u8],
    file_len: u64,
) -> Res<()> {
    let msize = 64 * KIB;
    let total: u64 = ctx.pick(512 << 20, 16 << 20);
    let iters = ctx.pick(20_000, 1_000);
    let reps = ctx.reps();
    let open = |stream: Res<UnixStream>| Session::open(stream?, msize, aname, file_len);
    // The load generator's own depth scaling, in this run: a trivial
    // server answering every Tread from memory (no file, no 9P server).
    let mut c1 = trivial_session(msize, file_len)?;
    let mut c4 = trivial_session(msize, file_len)?;
    c1.read_depth(1, total / 8)?;
    c4.read_depth(4, total / 8)?;
    let [d1, d4] = alternate(
        reps,
        &mut [&mut || c1.read_depth(1, total), &mut || {
            c4.read_depth(4, total)
        }],
    )?;
    report
        .metric("ceiling_read_gib_per_s_depth1", d1)
        .metric("ceiling_read_gib_per_s_depth4", d4);
    report.metric("ceiling_depth4_vs_depth1", d4 / d1);
    table.row(&[
        "ceiling: the same client against a trivial server, depth 1 / depth 4 (GiB/s)".into(),
        format!("{} / {}", format_value(d1), format_value(d4)),
        "-".into(),
        format!("x{}", format_value(d4 / d1)),
    ]);
    drop((c1, c4));

    let mut row = |report: &mut SuiteReport, what: String, key: &str, a: f64, b: f64| {
        report.metric(&format!("sock_{key}"), a);
        if b.is_nan() {
            table.row(&[what, format_value(a), "-".into(), "-".into()]);
        } else {
            report.metric(&format!("diod_{key}"), b);
            table.row(&[what, format_value(a), format_value(b), format_value(a / b)]);
        }
    };
    let mut depth1 = f64::NAN;
    for depth in [1u16, 4, 16] {
        let mut mine = open(ours.connect())?;
        let mut theirs = match diod {
            Some(d) => Some(open(d.connect())?),
            None => None,
        };
        let read = |s: &mut Session| s.read_depth(depth, total);
        let getattr = |s: &mut Session| s.getattr_depth_us(depth, iters);
        // Warm both sessions with a shorter run of each.
        for s in std::iter::once(&mut mine).chain(theirs.as_mut()) {
            s.read_depth(depth, total / 8)?;
            s.getattr_depth_us(depth, iters / 10)?;
        }
        let cases: [(String, &str, &str, &SessionOp); 2] = [
            (
                format!("sequential read, {depth} outstanding, msize 64 KiB (GiB/s)"),
                "read_gib_per_s_depth",
                "ratio_read_vs_diod_depth",
                &read,
            ),
            (
                format!("Tgetattr, {depth} outstanding (µs per request)"),
                "getattr_us_depth",
                "ratio_getattr_vs_diod_depth",
                &getattr,
            ),
        ];
        for (what, key, ratio, op) in cases {
            let [a, b] = versus(reps, &mut mine, theirs.as_mut(), op)?;
            row(report, what, &format!("{key}{depth}"), a, b);
            if !b.is_nan() {
                report.metric(&format!("{ratio}{depth}"), a / b);
            }
            if key.starts_with("read") && depth == 1 {
                depth1 = a;
            }
            if key.starts_with("read") && depth == 4 {
                report.metric("sock_depth4_vs_depth1", a / depth1);
            }
        }
    }

    // 4 connections of 4 outstanding each.
    let mut mine: Vec<Session> = (0..4).map(|_| open(ours.connect())).collect::<Res<_>>()?;
    par_read(&mut mine, 4, total / 8)?;
    let mut theirs: Option<Vec<Session>> = match diod {
        Some(d) => {
            let mut v: Vec<Session> = (0..4).map(|_| open(d.connect())).collect::<Res<_>>()?;
            par_read(&mut v, 4, total / 8)?;
            Some(v)
        }
        None => None,
    };
    let mut t_par = theirs.as_mut().map(|t| move || par_read(t, 4, total));
    let [a, b] = pair(
        reps,
        &mut || par_read(&mut mine, 4, total),
        t_par.as_mut().map(|f| f as &mut dyn FnMut() -> Res<f64>),
    )?;
    row(
        report,
        "sequential read, 4 connections x 4 outstanding, msize 64 KiB (GiB/s)".into(),
        "read_gib_per_s_4conns",
        a,
        b,
    );
    if !b.is_nan() {
        report.metric("ratio_read_vs_diod_4conns", a / b);
    }
    drop(mine);
    drop(theirs);

    // A slow request (a Tlock blocked by another connection's lock) on the
    // connection that runs a Tgetattr stream.
    let mut holder = open(ours.connect())?;
    holder.client.walk(ROOT, 5, &[b"f"])?;
    holder.client.lopen(5, OpenFlags::RDWR)?;
    if holder
        .client
        .lock(5, LockType::Wrlck, LockFlags::empty(), 0, 0)?
        != LockStatus::Success
    {
        return Err("the lock holder did not get its lock".into());
    }
    let mut m = open(ours.connect())?;
    m.client.walk(ROOT, 6, &[b"f"])?;
    m.client.lopen(6, OpenFlags::RDWR)?;
    let n = ctx.pick(5_000, 300);
    m.getattr_latencies(n / 5, None)?;
    let (mut idle, mut slow) = (Vec::new(), Vec::new());
    for _ in 0..reps.max(1) {
        idle.push(percentile(m.getattr_latencies(n, None)?, 0.99));
        slow.push(percentile(m.getattr_latencies(n, Some(6))?, 0.99));
    }
    let (idle, slow) = (median_of(idle), median_of(slow));
    report
        .metric("sock_getattr_p99_us_idle", idle)
        .metric("sock_getattr_p99_us_with_slow", slow)
        .metric("sock_getattr_p99_slow_vs_idle", slow / idle);
    table.row(&[
        "Tgetattr p99, alone on its connection (µs)".into(),
        format_value(idle),
        "-".into(),
        "-".into(),
    ]);
    table.row(&[
        "Tgetattr p99, beside a blocked Tlock on the same connection (µs)".into(),
        format_value(slow),
        "-".into(),
        format!("{} x alone", format_value(slow / idle)),
    ]);
    Ok(())
}

/// The RSS of a server process after `n` connections each did
/// one 16 MiB read and went idle (ours at msize 16 MiB: one Tread; diod at
/// its 64 KiB cap: 256 of them).
fn idle_rss_part(
    ctx: &Ctx,
    report: &mut SuiteReport,
    export: &Path,
    sock_dir: &Path,
    diod: Option<&Diod>,
    aname: &[u8],
    file_len: u64,
) -> Res<()> {
    let n = ctx.pick(64, 8);
    let read: u64 = ctx.pick(16 << 20, 1 << 20);
    let ours = OursProcess::start(export, sock_dir.join("rss.sock"))?;
    let mut keep = Vec::new();
    for _ in 0..n {
        let stream = UnixStream::connect(&ours.sock)?;
        let mut s = Session::open(stream, read as u32 + IOHDRSZ, aname, file_len)?;
        s.read(read)?;
        // The load generator's own buffer is not what is measured.
        s.reply = Vec::new();
        keep.push(s);
    }
    std::thread::sleep(Duration::from_millis(300));
    let rss = rss_mib(ours.child.id())?;
    report.metric("sock_idle_rss_mib", rss);
    drop(keep);
    if let Some(d) = diod {
        let mut keep = Vec::new();
        for _ in 0..n {
            let mut s = Session::open(d.connect()?, 64 * KIB, aname, file_len)?;
            s.read(read)?;
            s.reply = Vec::new();
            keep.push(s);
        }
        std::thread::sleep(Duration::from_millis(300));
        report.metric("diod_idle_rss_mib", rss_mib(d.child.id())?);
    }
    report.note(format!(
        "Socket figures: depth N keeps N requests outstanding on one connection (tags 1..N, \
         a new request as each reply arrives), msize 64 KiB for both servers; 4conns is four \
         connections of 4 outstanding each at once. The p99 pair runs {} Tgetattr one at a time \
         on one connection, alone and beside a blocking Tlock (held off by another \
         connection's lock, re-sent at each BLOCKED) on the same connection. Idle RSS: VmRSS \
         of a server process (ours: `Listener::serve_with` in a child process) after {n} \
         connections each read {} MiB and went idle for 300 ms.",
        ctx.pick(5_000, 300),
        read >> 20
    ));
    Ok(())
}
