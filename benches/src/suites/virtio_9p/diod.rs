// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Part of suite `virtio-9p` (issue #10): the socket transport against
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
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_9p_server::client::{Client, StreamTransport};
use virtio_9p_server::protocol::{
    GetattrMask, LockFlags, LockStatus, LockType, MsgType, OpenFlags, Rmessage, Tattach, Tfid,
    Tgetattr, Tlock, Tmessage, Tread, Twalk, IOHDRSZ, NOFID,
};
use virtio_9p_server::transport::socket::{ListenAddr, Listener, SocketLimits};
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server};

use crate::harness::{alternate, format_value, Ctx, SuiteReport, Table};

type Res<T> = Result<T, Box<dyn Error>>;

const GIB: f64 = (1u64 << 30) as f64;
const KIB: u32 = 1024;
/// 9P message types the lean loop checks by number.
const RGETATTR: u8 = MsgType::Rgetattr as u8;
const RLOCK: u8 = MsgType::Rlock as u8;
const RREAD: u8 = MsgType::Rread as u8;

const ROOT: u32 = 0;
const BIG: u32 = 1;
const SMALL: u32 = 2;
const WALKED: u32 = 3;

/// Our socket server on a listener of this process: `Listener::serve_with`,
/// what `virtio-9p-server --listen unix:PATH` runs (socket threads on the
/// request engine, the default limits). Its accept thread runs until the
/// bench process exits.
struct OursSocket {
    path: PathBuf,
}

impl OursSocket {
    fn new(dir: &Path, sock: PathBuf) -> Res<Self> {
        Self::with_limits(dir, sock, SocketLimits::default())
    }

    fn with_limits(dir: &Path, sock: PathBuf, limits: SocketLimits) -> Res<Self> {
        let fs = PassthroughFs::new(PassthroughConfig::new(dir))?;
        let server = Arc::new(Server::new(fs, Config::default())?);
        let listener = Listener::bind(&ListenAddr::Unix(sock.clone()))?;
        std::thread::Builder::new()
            .name("ours-accept".into())
            .spawn(move || listener.serve_with(server, limits))?;
        Ok(OursSocket { path: sock })
    }

    fn connect(&mut self) -> Res<UnixStream> {
        Ok(UnixStream::connect(&self.path)?)
    }
}

/// Serves `dir` on the unix socket `sock` in this process, forever: the
/// child process whose memory the idle-RSS figure reads
/// (`vmm-benches __socket-server DIR SOCK`).
pub fn serve_socket_forever(dir: &Path, sock: &Path) -> Res<()> {
    let fs = PassthroughFs::new(PassthroughConfig::new(dir))?;
    let server = Arc::new(Server::new(fs, Config::default())?);
    let listener = Listener::bind(&ListenAddr::Unix(sock.to_path_buf()))?;
    listener.serve_with(server, SocketLimits::default())?;
    Ok(())
}

/// Our server in a child process (see [`serve_socket_forever`]).
struct OursProcess {
    child: Child,
    sock: PathBuf,
}

impl OursProcess {
    fn start(dir: &Path, sock: PathBuf) -> Res<Self> {
        let child = Command::new(std::env::current_exe()?)
            .arg("__socket-server")
            .arg(dir)
            .arg(&sock)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let me = OursProcess { child, sock };
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&me.sock).is_err() {
            if Instant::now() > deadline {
                return Err("our socket server did not listen within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(me)
    }
}

impl Drop for OursProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// VmRSS of process `pid`, MiB.
fn rss_mib(pid: u32) -> Res<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or("no VmRSS")?;
    Ok(kib / 1024.0)
}

/// A diod process, killed and reaped on drop.
struct Diod {
    child: Child,
    sock: PathBuf,
    log: PathBuf,
}

impl Drop for Diod {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// `diod` on `PATH`, or in the sbin directories a non-root `PATH` may lack.
fn find_diod() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|d| d.join("diod"))
        .find(|p| p.is_file())
}

fn diod_version(path: &Path) -> String {
    // diod has no --version; the Debian package records it.
    Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", "diod"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|v| format!("diod {v}"))
        .unwrap_or_else(|| format!("diod ({})", path.display()))
}

impl Diod {
    fn start(path: &Path, dir: &Path, sock: PathBuf, log: PathBuf) -> Res<Self> {
        let child = Command::new(path)
            .args(["-f", "-n", "-N", "-L", "stderr", "-l"])
            .arg(&sock)
            .arg("-e")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log)?)
            .spawn()?;
        let mut diod = Diod { child, sock, log };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = diod.child.try_wait()? {
                return Err(format!("diod exited with {status}: {}", diod.log_text()).into());
            }
            if UnixStream::connect(&diod.sock).is_ok() {
                return Ok(diod);
            }
            if Instant::now() > deadline {
                return Err(format!("diod did not listen within 10 s: {}", diod.log_text()).into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn connect(&self) -> Res<UnixStream> {
        Ok(UnixStream::connect(&self.sock)?)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log)
            .map(|s| s.trim().chars().take(400).collect())
            .unwrap_or_default()
    }
}

/// One negotiated session of the load generator.
struct Session {
    client: Client<StreamTransport<UnixStream>>,
    msize: u32,
    reply: Vec<u8>,
    offset: u64,
    file_len: u64,
}

impl Session {
    /// Tversion, Tattach as root to `aname`, walks to "big" (opened for
    /// reading) and "f".
    fn open(stream: UnixStream, msize: u32, aname: &[u8], file_len: u64) -> Res<Self> {
        let mut client = Client::new(StreamTransport(stream));
        let granted = client.version(msize)?;
        match client.rpc(&Tmessage::Attach(Tattach {
            fid: ROOT,
            afid: NOFID,
            uname: b"root".to_vec(),
            aname: aname.to_vec(),
            n_uname: 0,
        }))? {
            Rmessage::Attach(_) => {}
            r => return Err(format!("attach: unexpected reply {r:?}").into()),
        }
        client.walk(ROOT, BIG, &[b"big"])?;
        client.lopen(BIG, OpenFlags::RDONLY)?;
        client.walk(ROOT, SMALL, &[b"f"])?;
        Ok(Session {
            client,
            msize: granted,
            reply: vec![0u8; granted as usize],
            offset: 0,
            file_len,
        })
    }

    /// Sends `frame` and reads the reply into the reused buffer; returns
    /// the reply's type and its length.
    fn call(&mut self, frame: &[u8]) -> Res<(u8, usize)> {
        let stream = &mut self.client.transport().0;
        stream.write_all(frame)?;
        stream.read_exact(&mut self.reply[..4])?;
        let size = u32::from_le_bytes(self.reply[..4].try_into()?) as usize;
        if size < 7 || size > self.reply.len() {
            return Err(format!("reply of {size} bytes at msize {}", self.msize).into());
        }
        stream.read_exact(&mut self.reply[4..size])?;
        let ty = self.reply[4];
        if ty == MsgType::Rlerror {
            let errno = u32::from_le_bytes(self.reply[7..11].try_into()?);
            return Err(format!("Rlerror {errno}").into());
        }
        Ok((ty, size))
    }

    /// Sequential Treads of `msize - IOHDRSZ` bytes until `total` bytes
    /// came back; GiB/s.
    fn read(&mut self, total: u64) -> Res<f64> {
        let count = self.msize - IOHDRSZ;
        let mut done = 0u64;
        let start = Instant::now();
        while done < total {
            let frame = self.next_read(1);
            let (ty, size) = self.call(&frame)?;
            let got = u32::from_le_bytes(self.reply[7..11].try_into()?);
            if ty != MsgType::Rread || got != count || size != 11 + count as usize {
                return Err(format!("Tread of {count}: reply type {ty}, {got} bytes").into());
            }
            done += u64::from(got);
        }
        Ok(done as f64 / GIB / start.elapsed().as_secs_f64())
    }

    /// µs per Tgetattr (basic attributes) of a small file.
    fn getattr_us(&mut self, iters: usize) -> Res<f64> {
        let frame = Tmessage::Getattr(Tgetattr {
            fid: SMALL,
            request_mask: GetattrMask::BASIC,
        })
        .encode_frame(2);
        let start = Instant::now();
        for _ in 0..iters {
            let (ty, _) = self.call(&frame)?;
            if ty != MsgType::Rgetattr {
                return Err(format!("Tgetattr: reply type {ty}").into());
            }
        }
        Ok(start.elapsed().as_secs_f64() * 1e6 / iters as f64)
    }

    /// Sends one frame.
    fn send(&mut self, frame: &[u8]) -> Res<()> {
        self.client.transport().0.write_all(frame)?;
        Ok(())
    }

    /// Reads one reply into the reused buffer: (tag, type, size).
    fn recv(&mut self) -> Res<(u16, u8, usize)> {
        let stream = &mut self.client.transport().0;
        stream.read_exact(&mut self.reply[..4])?;
        let size = u32::from_le_bytes(self.reply[..4].try_into()?) as usize;
        if size < 7 || size > self.reply.len() {
            return Err(format!("reply of {size} bytes at msize {}", self.msize).into());
        }
        stream.read_exact(&mut self.reply[4..size])?;
        let tag = u16::from_le_bytes(self.reply[5..7].try_into()?);
        Ok((tag, self.reply[4], size))
    }

    /// The next sequential Tread of `msize - IOHDRSZ` bytes, as a frame
    /// with `tag`.
    fn next_read(&mut self, tag: u16) -> Vec<u8> {
        let count = self.msize - IOHDRSZ;
        if self.offset + u64::from(count) > self.file_len {
            self.offset = 0;
        }
        let frame = Tmessage::Read(Tread {
            fid: BIG,
            offset: self.offset,
            count,
        })
        .encode_frame(tag);
        self.offset += u64::from(count);
        frame
    }

    /// Sequential Treads with `depth` outstanding on this connection until
    /// `total` bytes came back; GiB/s.
    fn read_depth(&mut self, depth: u16, total: u64) -> Res<f64> {
        let count = u64::from(self.msize - IOHDRSZ);
        let n = total.div_ceil(count);
        let start = Instant::now();
        let mut sent = 0u64;
        for tag in 1..=depth {
            if sent < n {
                let f = self.next_read(tag);
                self.send(&f)?;
                sent += 1;
            }
        }
        let mut done = 0u64;
        for _ in 0..n {
            let (tag, ty, size) = self.recv()?;
            let got = u32::from_le_bytes(self.reply[7..11].try_into()?);
            if ty != RREAD || u64::from(got) != count || size != 11 + count as usize {
                return Err(format!("Tread of {count}: reply type {ty}, {got} bytes").into());
            }
            done += u64::from(got);
            if sent < n {
                let f = self.next_read(tag);
                self.send(&f)?;
                sent += 1;
            }
        }
        Ok(done as f64 / GIB / start.elapsed().as_secs_f64())
    }

    /// µs per Tgetattr with `depth` outstanding (wall time / requests).
    fn getattr_depth_us(&mut self, depth: u16, iters: usize) -> Res<f64> {
        let frames: Vec<Vec<u8>> = (1..=depth)
            .map(|tag| {
                Tmessage::Getattr(Tgetattr {
                    fid: SMALL,
                    request_mask: GetattrMask::BASIC,
                })
                .encode_frame(tag)
            })
            .collect();
        let start = Instant::now();
        let mut sent = 0usize;
        for f in &frames {
            if sent < iters {
                self.send(f)?;
                sent += 1;
            }
        }
        for _ in 0..iters {
            let (tag, ty, _) = self.recv()?;
            if ty != RGETATTR {
                return Err(format!("Tgetattr: reply type {ty}").into());
            }
            if sent < iters {
                self.send(&frames[usize::from(tag) - 1])?;
                sent += 1;
            }
        }
        Ok(start.elapsed().as_secs_f64() * 1e6 / iters as f64)
    }

    /// Tgetattr latencies (µs), one at a time, `iters` of them; with
    /// `slow_fid`, a blocking Tlock on it (tag 100) stays outstanding the
    /// whole time on the same connection (re-sent whenever the server
    /// answers BLOCKED).
    fn getattr_latencies(&mut self, iters: usize, slow_fid: Option<u32>) -> Res<Vec<f64>> {
        const SLOW_TAG: u16 = 100;
        let getattr = Tmessage::Getattr(Tgetattr {
            fid: SMALL,
            request_mask: GetattrMask::BASIC,
        })
        .encode_frame(1);
        let tlock = slow_fid.map(|fid| {
            Tmessage::Lock(Tlock {
                fid,
                ty: LockType::Wrlck,
                flags: LockFlags::BLOCK,
                start: 0,
                length: 0,
                proc_id: 2,
                client_id: b"bench".to_vec(),
            })
            .encode_frame(SLOW_TAG)
        });
        if let Some(t) = &tlock {
            self.send(t)?;
        }
        let mut out = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t0 = Instant::now();
            self.send(&getattr)?;
            loop {
                let (tag, ty, _) = self.recv()?;
                if tag == SLOW_TAG && ty == RLOCK {
                    // BLOCKED after the server's lock wait: ask again.
                    if let Some(t) = &tlock {
                        self.send(t)?;
                    }
                    continue;
                }
                if ty != RGETATTR {
                    return Err(format!("Tgetattr: reply type {ty}").into());
                }
                break;
            }
            out.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        if tlock.is_some() {
            // Leave the connection without an outstanding lock.
            self.send(
                &Tmessage::Flush(virtio_9p_server::protocol::Tflush { oldtag: SLOW_TAG })
                    .encode_frame(101),
            )?;
            loop {
                let (tag, _, _) = self.recv()?;
                if tag == 101 {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// µs per Twalk of one name plus the Tclunk of the new fid.
    fn walk_clunk_us(&mut self, iters: usize) -> Res<f64> {
        let walk = Tmessage::Walk(Twalk {
            fid: ROOT,
            newfid: WALKED,
            wnames: vec![b"f".to_vec()],
        })
        .encode_frame(3);
        let clunk = Tmessage::Clunk(Tfid { fid: WALKED }).encode_frame(3);
        let start = Instant::now();
        for _ in 0..iters {
            self.call(&walk)?;
            self.call(&clunk)?;
        }
        Ok(start.elapsed().as_secs_f64() * 1e6 / iters as f64)
    }
}

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
    check_issue19_metrics(report, diod.is_some())?;

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

/// The metrics of issue 19 this part reports (the `diod_` and `ratio_`
/// ones only when diod runs); checked at the end of the part.
const ISSUE19_METRICS: &[&str] = &[
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
const ISSUE19_DIOD_METRICS: &[&str] = &[
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

/// Fails if a metric of issue 19 is missing from `report`.
fn check_issue19_metrics(report: &SuiteReport, with_diod: bool) -> Res<()> {
    let names: Vec<&str> = report.metrics().iter().map(|(n, _)| n.as_str()).collect();
    let wanted = ISSUE19_METRICS
        .iter()
        .chain(if with_diod { ISSUE19_DIOD_METRICS } else { &[] });
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

/// A session on a trivial server thread that answers every Tread with a
/// canned Rread of `msize - IOHDRSZ` bytes written from memory, and
/// anything else with nothing: the ceiling of the load generator itself.
fn trivial_session(msize: u32, file_len: u64) -> Res<Session> {
    let (ours, mut theirs) = UnixStream::pair()?;
    let count = msize - IOHDRSZ;
    let mut canned = Vec::with_capacity(11 + count as usize);
    canned.extend_from_slice(&(11 + count).to_le_bytes());
    canned.push(RREAD);
    canned.extend_from_slice(&[0, 0]);
    canned.extend_from_slice(&count.to_le_bytes());
    canned.resize(11 + count as usize, 0);
    std::thread::Builder::new()
        .name("trivial-9p".into())
        .spawn(move || {
            let mut frame = vec![0u8; 64 * KIB as usize];
            // Ends when the session is dropped (EOF or an error).
            while theirs.read_exact(&mut frame[..4]).is_ok() {
                let size = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
                if !(7..=frame.len()).contains(&size)
                    || theirs.read_exact(&mut frame[4..size]).is_err()
                {
                    break;
                }
                if frame[4] == MsgType::Tread as u8 {
                    canned[5..7].copy_from_slice(&frame[5..7]);
                    if theirs.write_all(&canned).is_err() {
                        break;
                    }
                }
            }
        })?;
    Ok(Session {
        client: Client::new(StreamTransport(ours)),
        msize,
        reply: vec![0u8; msize as usize],
        offset: 0,
        file_len,
    })
}

/// Sequential reads on each of `sessions` at once, `depth` outstanding on
/// each, `total` bytes in all; aggregate GiB/s.
fn par_read(sessions: &mut [Session], depth: u16, total: u64) -> Res<f64> {
    let per = total / sessions.len() as u64;
    let start = Instant::now();
    let results: Vec<Result<f64, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = sessions
            .iter_mut()
            .map(|se| s.spawn(move || se.read_depth(depth, per).map_err(|e| e.to_string())))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("reader panicked".into())))
            .collect()
    });
    for r in results {
        r?;
    }
    Ok(per as f64 * sessions.len() as f64 / GIB / start.elapsed().as_secs_f64())
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or(f64::NAN)
}

fn median_of(mut v: Vec<f64>) -> f64 {
    percentile(std::mem::take(&mut v), 0.5)
}

/// Issue 19: requests outstanding on one connection, both servers at
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

/// Issue 19: the RSS of a server process after `n` connections each did
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
        "Issue 19 figures: depth N keeps N requests outstanding on one connection (tags 1..N, \
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

/// Sends `total` bytes of `file` (cached) into a unix socket whose peer
/// drains it, `chunk` bytes per Rread-sized step: by `pread` into one
/// buffer and `send` (what the socket transport does), or by `splice`
/// through a pipe (file to pipe, pipe to socket: no user-space copy).
/// GiB/s.
fn rread_to_socket(file: &File, total: u64, chunk: usize, splice: bool) -> Res<f64> {
    use std::os::fd::AsRawFd;
    let (tx, mut rx) = UnixStream::pair()?;
    let drain = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        while let Ok(n) = rx.read(&mut buf) {
            if n == 0 {
                break;
            }
            got += n as u64;
        }
        got
    });
    let len = file.metadata()?.len();
    let fd = file.as_raw_fd();
    let mut pipe = [0i32; 2];
    if splice {
        // SAFETY: pipe2 writes two fds into the array.
        if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        // SAFETY: F_SETPIPE_SZ on the pipe just made.
        unsafe { libc::fcntl(pipe[1], libc::F_SETPIPE_SZ, chunk.max(1 << 16) as i32) };
    }
    let mut buf = vec![0u8; chunk];
    let start = Instant::now();
    let (mut done, mut off) = (0u64, 0u64);
    while done < total {
        if off + chunk as u64 > len {
            off = 0;
        }
        if splice {
            let mut left = chunk;
            let mut o = off as libc::loff_t;
            while left > 0 {
                // SAFETY: splice between fds we hold; `o` is valid for the call.
                let n = unsafe {
                    libc::splice(
                        fd,
                        &mut o,
                        pipe[1],
                        std::ptr::null_mut(),
                        left,
                        libc::SPLICE_F_MOVE,
                    )
                };
                if n <= 0 {
                    return Err(std::io::Error::last_os_error().into());
                }
                let mut out = n as usize;
                while out > 0 {
                    // SAFETY: as above, no offsets.
                    let m = unsafe {
                        libc::splice(
                            pipe[0],
                            std::ptr::null_mut(),
                            tx.as_raw_fd(),
                            std::ptr::null_mut(),
                            out,
                            libc::SPLICE_F_MOVE,
                        )
                    };
                    if m <= 0 {
                        return Err(std::io::Error::last_os_error().into());
                    }
                    out -= m as usize;
                }
                left -= n as usize;
            }
        } else {
            std::os::unix::fs::FileExt::read_exact_at(file, &mut buf, off)?;
            (&tx).write_all(&buf)?;
        }
        done += chunk as u64;
        off += chunk as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    if splice {
        // SAFETY: closing the pipe fds made above.
        unsafe {
            libc::close(pipe[0]);
            libc::close(pipe[1]);
        }
    }
    drop(tx);
    let _ = drain.join();
    Ok(done as f64 / GIB / secs)
}

/// Issue 19: is splicing Rread data into the socket faster than the copy?
/// Issue 19, zero-copy Rread end to end: the same socket server with
/// Rread data spliced (the default) and copied through the reply buffer
/// (`SocketLimits::splice_reads` false), sequential reads at msize 64 KiB
/// with 1, 4 and 16 outstanding, in alternation.
fn splice_e2e_part(
    ctx: &Ctx,
    report: &mut SuiteReport,
    table: &mut Table,
    spliced: &mut OursSocket,
    copied: &mut OursSocket,
    aname: &[u8],
    file_len: u64,
) -> Res<()> {
    let msize = 64 * KIB;
    let total: u64 = ctx.pick(512 << 20, 16 << 20);
    for depth in [1u16, 4, 16] {
        let mut a = Session::open(spliced.connect()?, msize, aname, file_len)?;
        let mut b = Session::open(copied.connect()?, msize, aname, file_len)?;
        a.read_depth(depth, total / 8)?;
        b.read_depth(depth, total / 8)?;
        let [s, c] = alternate(
            ctx.reps(),
            &mut [&mut || a.read_depth(depth, total), &mut || {
                b.read_depth(depth, total)
            }],
        )?;
        report
            .metric(&format!("sock_read_gib_per_s_depth{depth}_copy"), c)
            .metric(&format!("sock_splice_vs_copy_depth{depth}"), s / c);
        table.row(&[
            format!("sequential read, {depth} outstanding: spliced / copied Rread (GiB/s)"),
            format!("{} / {}", format_value(s), format_value(c)),
            "-".into(),
            format!("x{}", format_value(s / c)),
        ]);
    }
    Ok(())
}

fn splice_part(ctx: &Ctx, report: &mut SuiteReport, export: &Path) -> Res<()> {
    let file = File::open(export.join("big"))?;
    let total: u64 = ctx.pick(1 << 30, 32 << 20);
    let chunk = 64 << 10;
    rread_to_socket(&file, total / 8, chunk, false)?;
    rread_to_socket(&file, total / 8, chunk, true)?;
    let [copy, splice] = alternate(
        ctx.reps(),
        &mut [
            &mut || rread_to_socket(&file, total, chunk, false),
            &mut || rread_to_socket(&file, total, chunk, true),
        ],
    )?;
    report
        .metric("rread_copy_gib_per_s", copy)
        .metric("rread_splice_gib_per_s", splice)
        .metric("rread_splice_vs_copy", splice / copy);
    report.note(format!(
        "Rread by splice: 64 KiB of a cached file into a unix socket whose peer drains it, \
         {} MiB per run: pread into one buffer and send (the socket transport's path) \
         {copy:.2} GiB/s, splice file -> pipe -> socket {splice:.2} GiB/s ({:.2}x).",
        total >> 20,
        splice / copy
    ));
    Ok(())
}
