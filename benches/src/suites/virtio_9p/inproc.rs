// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! In-process 9P request costs: the same request frames against
//! `virtio_9p_server::Server` (passthrough, inline executor) and crosvm's
//! `p9::Server::handle_message`, alternating, plus a bare `statx` as the
//! floor of a Tgetattr.

use std::error::Error;
use std::hint::black_box;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use virtio_9p_server::io::{SliceReader, SliceWriter};
use virtio_9p_server::protocol::{
    GetattrMask, OpenFlags, Rmessage, Tattach, Tfid, Tgetattr, Tlopen, Tmessage, Tread, Tversion,
    Twalk, NOFID,
};
use virtio_9p_server::{Cancel, Config, Inline, PassthroughConfig, PassthroughFs, Server, Session};

use crate::harness::{alternate, format_value, time, Ctx, SuiteReport, SuiteResult, Table};

/// p9's largest msize: 64 KiB of payload plus 24 bytes of header.
const MSIZE: u32 = 64 * 1024 + 24;
/// Bytes per Tread.
const READ_SIZE: u32 = 64 * 1024;

const ROOT: u32 = 1;
const FILE: u32 = 2;
const BIG: u32 = 3;
const WALKED: u32 = 4;

type Res<T> = Result<T, Box<dyn Error>>;

/// One side of the comparison: answers a request frame into `reply`.
trait Contender {
    fn call(&mut self, frame: &[u8], reply: &mut Vec<u8>) -> Res<()>;
}

struct Ours {
    server: Arc<Server<PassthroughFs>>,
    session: Session<PassthroughFs>,
    cancel: Cancel,
}

impl Contender for Ours {
    fn call(&mut self, frame: &[u8], reply: &mut Vec<u8>) -> Res<()> {
        let cap = reply.capacity().max(MSIZE as usize);
        // A zeroed buffer of msize is kept across calls.
        if reply.len() != cap {
            reply.resize(cap, 0);
        }
        let out = self.server.handle(
            &self.session,
            &mut SliceReader::new(frame),
            &mut SliceWriter::new(reply),
            &Inline,
            &self.cancel,
        )?;
        black_box(out.size);
        Ok(())
    }
}

struct Crosvm(p9::Server);

impl Contender for Crosvm {
    fn call(&mut self, frame: &[u8], reply: &mut Vec<u8>) -> Res<()> {
        reply.clear();
        let mut reader = frame;
        self.0.handle_message(&mut reader, reply)?;
        black_box(reply.len());
        Ok(())
    }
}

fn expect_ok(c: &mut dyn Contender, msg: &Tmessage, what: &str) -> Res<()> {
    let mut reply = Vec::with_capacity(MSIZE as usize);
    c.call(&msg.encode_frame(1), &mut reply)?;
    let size = u32::from_le_bytes(reply[..4].try_into()?) as usize;
    match Rmessage::decode_frame(&reply[..size], u32::MAX) {
        Ok((_, Rmessage::Lerror(e))) => Err(format!("{what}: Rlerror {e}").into()),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("{what}: bad reply: {e}").into()),
    }
}

/// Version, attach, walk to "f" (FILE) and open "big" (BIG).
fn setup(c: &mut dyn Contender) -> Res<()> {
    let version = Tmessage::Version(Tversion {
        msize: MSIZE,
        version: b"9P2000.L".to_vec(),
    });
    expect_ok(c, &version, "version")?;
    let attach = Tmessage::Attach(Tattach {
        fid: ROOT,
        afid: NOFID,
        uname: b"root".to_vec(),
        aname: Vec::new(),
        n_uname: 0,
    });
    expect_ok(c, &attach, "attach")?;
    for (fid, name) in [(FILE, "f"), (BIG, "big")] {
        let walk = Tmessage::Walk(Twalk {
            fid: ROOT,
            newfid: fid,
            wnames: vec![name.as_bytes().to_vec()],
        });
        expect_ok(c, &walk, "walk")?;
    }
    let open = Tmessage::Lopen(Tlopen {
        fid: BIG,
        flags: OpenFlags::RDONLY,
    });
    expect_ok(c, &open, "lopen")
}

/// Batches per measurement: each contender reports its best batch, which
/// keeps scheduler noise of a loaded machine out of the comparison.
const BATCHES: usize = 20;

fn ns_per_op(c: &mut dyn Contender, frames: &[Vec<u8>], iters: usize) -> Res<f64> {
    let mut reply = Vec::with_capacity(MSIZE as usize);
    let per_batch = (iters / BATCHES).max(1);
    let mut best = f64::INFINITY;
    for _ in 0..BATCHES {
        let (res, elapsed) = time(|| -> Res<()> {
            for _ in 0..per_batch {
                for f in frames {
                    c.call(f, &mut reply)?;
                }
            }
            Ok(())
        });
        res?;
        best = best.min(elapsed.as_nanos() as f64 / per_batch as f64);
    }
    Ok(best)
}

fn read_gib_per_s(c: &mut dyn Contender, file_size: u64, passes: usize) -> Res<f64> {
    let frames: Vec<Vec<u8>> = (0..file_size / READ_SIZE as u64)
        .map(|i| {
            Tmessage::Read(Tread {
                fid: BIG,
                offset: i * READ_SIZE as u64,
                count: READ_SIZE,
            })
            .encode_frame(7)
        })
        .collect();
    let mut reply = Vec::with_capacity(MSIZE as usize);
    let mut best = 0f64;
    for _ in 0..passes {
        let (res, elapsed) = time(|| -> Res<()> {
            for f in &frames {
                c.call(f, &mut reply)?;
            }
            Ok(())
        });
        res?;
        let bytes = (frames.len() * READ_SIZE as usize) as f64;
        best = best.max(bytes / elapsed.as_secs_f64() / (1u64 << 30) as f64);
    }
    Ok(best)
}

fn statx_ns(path: &Path, iters: usize) -> Res<f64> {
    let fd: OwnedFd = std::fs::File::open(path)?.into();
    // SAFETY: statx is plain old data; zeroed is a valid value.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let per_batch = (iters / BATCHES).max(1);
    let mut best = f64::INFINITY;
    for _ in 0..BATCHES {
        let (_, elapsed) = time(|| {
            for _ in 0..per_batch {
                // SAFETY: valid fd, empty C string with AT_EMPTY_PATH and a
                // valid out pointer.
                let r = unsafe {
                    libc::statx(
                        fd.as_raw_fd(),
                        c"".as_ptr(),
                        libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                        libc::STATX_BASIC_STATS | libc::STATX_BTIME,
                        &mut st,
                    )
                };
                black_box(r);
            }
        });
        best = best.min(elapsed.as_nanos() as f64 / per_batch as f64);
    }
    Ok(best)
}

/// Runs the in-process comparison.
pub fn run(ctx: &Ctx) -> SuiteResult {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("f"), b"small file")?;
    let big_size: u64 = ctx.pick(64 << 20, 4 << 20);
    std::fs::write(dir.path().join("big"), vec![0x5au8; big_size as usize])?;

    let fs = PassthroughFs::new(PassthroughConfig::new(dir.path()))?;
    let server = Arc::new(Server::new(fs, Config::default())?);
    let mut ours = Ours {
        server,
        session: Session::new(),
        cancel: Cancel::new(),
    };
    let mut theirs = Crosvm(p9::Server::new(
        dir.path(),
        Default::default(),
        Default::default(),
    )?);
    setup(&mut ours)?;
    setup(&mut theirs)?;

    let getattr = vec![Tmessage::Getattr(Tgetattr {
        fid: FILE,
        request_mask: GetattrMask::BASIC,
    })
    .encode_frame(5)];
    let walk_clunk = vec![
        Tmessage::Walk(Twalk {
            fid: ROOT,
            newfid: WALKED,
            wnames: vec![b"f".to_vec()],
        })
        .encode_frame(6),
        Tmessage::Clunk(Tfid { fid: WALKED }).encode_frame(6),
    ];
    let iters = ctx.pick(200_000, 20_000);
    let passes = ctx.pick(16, 4);
    let reps = ctx.reps();

    // Warm the page cache and both servers once.
    read_gib_per_s(&mut ours, big_size, 1)?;
    read_gib_per_s(&mut theirs, big_size, 1)?;

    let [getattr_ns, p9_getattr_ns] = alternate(
        reps,
        &mut [&mut || ns_per_op(&mut ours, &getattr, iters), &mut || {
            ns_per_op(&mut theirs, &getattr, iters)
        }],
    )?;
    let [walk_clunk_ns, p9_walk_clunk_ns] = alternate(
        reps,
        &mut [
            &mut || ns_per_op(&mut ours, &walk_clunk, iters / 2),
            &mut || ns_per_op(&mut theirs, &walk_clunk, iters / 2),
        ],
    )?;
    let [read_64k, p9_read_64k] = alternate(
        reps,
        &mut [
            &mut || read_gib_per_s(&mut ours, big_size, passes),
            &mut || read_gib_per_s(&mut theirs, big_size, passes),
        ],
    )?;
    let [statx] = alternate(reps, &mut [&mut || statx_ns(&dir.path().join("f"), iters)])?;

    let mut table = Table::new(
        "in process, same request stream",
        &["operation", "ours", "p9 0.3.2", "ours / p9"],
    );
    table
        .row(&[
            "Tgetattr (ns)",
            &format_value(getattr_ns),
            &format_value(p9_getattr_ns),
            &format_value(getattr_ns / p9_getattr_ns),
        ])
        .row(&[
            "Twalk + Tclunk (ns)",
            &format_value(walk_clunk_ns),
            &format_value(p9_walk_clunk_ns),
            &format_value(walk_clunk_ns / p9_walk_clunk_ns),
        ])
        .row(&[
            "64 KiB Tread (GiB/s)",
            &format_value(read_64k),
            &format_value(p9_read_64k),
            &format_value(read_64k / p9_read_64k),
        ])
        .row(&["bare statx (ns)", &format_value(statx), "-", "-"]);
    let mut report = SuiteReport::default();
    report
        .table(table)
        .metric("getattr_ns", getattr_ns)
        .metric("p9_getattr_ns", p9_getattr_ns)
        .metric("ratio_getattr_vs_p9", getattr_ns / p9_getattr_ns)
        .metric("walk_clunk_ns", walk_clunk_ns)
        .metric("p9_walk_clunk_ns", p9_walk_clunk_ns)
        .metric("read_64k_gib_per_s", read_64k)
        .metric("p9_read_64k_gib_per_s", p9_read_64k)
        .metric("statx_ns", statx)
        .series(
            "msize_throughput",
            "ours (in process)",
            vec![(f64::from(READ_SIZE) / 1024.0, read_64k)],
        )
        .series(
            "msize_throughput",
            "crosvm p9 (in process)",
            vec![(f64::from(READ_SIZE) / 1024.0, p9_read_64k)],
        )
        .note(format!(
            "In process, msize {MSIZE} for both (p9's maximum), median of {reps} alternating runs, each the best \
             of {BATCHES} batches; {iters} Tgetattr, {} walk+clunk pairs, best of {passes} passes of 64 KiB Treads \
             over a {} MiB cached file. \
             Ours: passthrough model, inline executor (no thread hop). statx_ns is the syscall a Tgetattr cannot avoid.",
            iters / 2,
            big_size >> 20
        ));
    Ok(report)
}
