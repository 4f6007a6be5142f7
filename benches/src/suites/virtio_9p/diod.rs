// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Part of suite `virtio-9p` (issue #10): the socket transport against
//! diod, the 9P2000.L server Debian ships, with one load generator.
//!
//! The load generator is a plain 9P client on a unix socket (the
//! `test-utils` client of `virtio-9p-server` for the session set-up, and a
//! lean Tread/Tgetattr loop over the same stream that reuses one reply
//! buffer). It talks to:
//!
//! - ours: `virtio_9p_server::transport::socket::serve_connection` on a
//!   thread of this process, one per connection, exactly what
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
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use virtio_9p_server::client::{Client, StreamTransport};
use virtio_9p_server::protocol::{
    GetattrMask, MsgType, OpenFlags, Rmessage, Tattach, Tfid, Tgetattr, Tmessage, Tread, Twalk,
    IOHDRSZ, NOFID,
};
use virtio_9p_server::transport::socket::serve_connection;
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server};

use crate::harness::{alternate, format_value, Ctx, SuiteReport, Table};

type Res<T> = Result<T, Box<dyn Error>>;

const GIB: f64 = (1u64 << 30) as f64;
const KIB: u32 = 1024;

const ROOT: u32 = 0;
const BIG: u32 = 1;
const SMALL: u32 = 2;
const WALKED: u32 = 3;

/// Our socket server on a listener of this process.
struct OursSocket {
    listener: UnixListener,
    path: PathBuf,
    server: Arc<Server<PassthroughFs>>,
    threads: Vec<JoinHandle<()>>,
}

impl OursSocket {
    fn new(dir: &Path, sock: PathBuf) -> Res<Self> {
        let fs = PassthroughFs::new(PassthroughConfig::new(dir))?;
        let server = Arc::new(Server::new(fs, Config::default())?);
        let listener = UnixListener::bind(&sock)?;
        Ok(OursSocket {
            listener,
            path: sock,
            server,
            threads: Vec::new(),
        })
    }

    /// A new client connection, served on its own thread until it hangs up.
    fn connect(&mut self) -> Res<UnixStream> {
        let client = UnixStream::connect(&self.path)?;
        let (conn, _) = self.listener.accept()?;
        let server = Arc::clone(&self.server);
        self.threads.push(std::thread::spawn(move || {
            if let Err(e) = serve_connection(&server, conn) {
                eprintln!("virtio-9p diod part: our connection ended: {e}");
            }
        }));
        Ok(client)
    }
}

impl Drop for OursSocket {
    fn drop(&mut self) {
        // The clients are gone by now (sessions are dropped first), so each
        // connection thread sees end-of-stream and returns.
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
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
            if self.offset + u64::from(count) > self.file_len {
                self.offset = 0;
            }
            let frame = Tmessage::Read(Tread {
                fid: BIG,
                offset: self.offset,
                count,
            })
            .encode_frame(1);
            let (ty, size) = self.call(&frame)?;
            let got = u32::from_le_bytes(self.reply[7..11].try_into()?);
            if ty != MsgType::Rread || got != count || size != 11 + count as usize {
                return Err(format!("Tread of {count}: reply type {ty}, {got} bytes").into());
            }
            done += u64::from(got);
            self.offset += u64::from(got);
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
        "Socket part: one load generator (a 9P client on a unix socket, one request at a time) \
         against our socket transport (serve_connection on a thread of the bench process, as \
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
