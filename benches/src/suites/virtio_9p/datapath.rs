// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Suite `virtio-9p-datapath`: what two guarantees cost on the data path,
//! each against its control in the same rounds.
//!
//! - **The dirty-log bitmap** (live migration): guest memory carries a
//!   bitmap, so every write into it goes through the region's bitmap,
//!   also with logging off. The daemon is not generic over the bitmap, so
//!   the bitmap's own cost is measured on virtqueue-large's Reader and
//!   Writer, the daemon's data path, over the same 4 KiB pages of memory
//!   typed `()`, typed with vhost-user-backend's `BitmapMmapRegion` (what
//!   the daemon used first: an `Arc` clone per slice and an `RwLock` per
//!   marking) and typed with the daemon's `DirtyLog` (one load per
//!   marking with no log), logging off: `preadv` into the pages (Tread),
//!   `pwritev` from them (Twrite), and the copies in and out of them (a
//!   worker's bounce buffer), plus one 8-byte `write_obj` (a used-ring
//!   entry). Logging on is measured through the daemon: sequential Tread
//!   and Twrite over vhost-user at 64 KiB, 1 MiB and 128 MiB msize, with
//!   and without the fake VMM's dirty log (`VHOST_F_LOG_ALL`,
//!   SET_LOG_BASE).
//! - **The worker's bounce copy** (no guest memory read after
//!   GET_VRING_BASE or reset): a Twrite served off the engine's thread
//!   copies the guest's bytes into a bounce buffer under the request's
//!   guard, then `pwrite`s them. Against it, the zero-copy `pwritev`
//!   straight from guest memory that a worker used before (the control,
//!   kept here only), on the same thread, chain and file, at 4 KiB,
//!   64 KiB and 1 MiB.
//!
//! `VMM_BENCH_DATAPATH_PARTS=bitmap,logging,bounce` (any subset) runs
//! only the parts named.

use std::error::Error;
use std::io::{Read, Write};
use std::sync::Arc;

use vhost_user_backend::bitmap::BitmapMmapRegion;
use virtio_queue::Queue;
use virtqueue_large::mock::{Buf, Layout as Placement, MockDriver};
use virtqueue_large::{Chain, ChainLimits, ChainWalker};
use vm_memory::bitmap::Bitmap;
use vm_memory::mmap::NewBitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use virtio_9p_server::engine::OffloadPolicy;
use virtio_9p_server::vhost_user::DirtyLog;
use virtio_9p_server::virtio::ChainReader;
use virtio_9p_server::{Cancel, RequestReader};

use super::vhost::{sequential_logged, start_with, Res};
use crate::harness::{format_value, median, Ctx, SuiteReport, SuiteResult, Table};

/// One-line description.
pub const ABOUT: &str = "data-path costs: dirty-log bitmap (off vs no bitmap, on vs off) and a worker Twrite's bounce copy vs zero-copy pwritev";
/// Ready to run.
pub const READY: bool = true;

const GIB: f64 = (1u64 << 30) as f64;
const PAGE: usize = 4096;

/// Runs the three parts.
pub fn run(ctx: &Ctx) -> SuiteResult {
    let mut report = SuiteReport::default();
    run_inner(ctx, &mut report).map_err(|e| -> Box<dyn Error> { e.to_string().into() })?;
    Ok(report)
}

fn run_inner(ctx: &Ctx, report: &mut SuiteReport) -> Res<()> {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    // `VMM_BENCH_DATAPATH_PARTS=bitmap,logging,bounce` (a subset) runs
    // only those parts, for a quicker look at one of them.
    let parts = std::env::var("VMM_BENCH_DATAPATH_PARTS")
        .unwrap_or_else(|_| "bitmap,logging,bounce".to_string());
    let wants = |part: &str| parts.split(',').any(|p| p.trim() == part);
    if wants("bitmap") {
        bitmap_off(ctx, report)?;
    }
    if wants("logging") {
        logging_on(ctx, report)?;
    }
    if wants("bounce") {
        bounce(ctx, report)?;
    }
    report.note(format!(
        "Load average at the start (/proc/loadavg): {}. Ratios are paired per round \
         (contender / control of the same round, then the median of {} rounds), \
         > 1 means the contender is slower.",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        ctx.reps()
    ));
    Ok(())
}

/// The calling thread's CPU time (user and system, `CLOCK_THREAD_CPUTIME_ID`):
/// the single-thread parts time their work with it, so that another
/// process taking the CPU (this machine is shared) is not counted, while
/// the system calls of the thread are.
#[derive(Clone, Copy)]
struct CpuClock(f64);

impl CpuClock {
    fn read() -> f64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec, which is valid.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }

    fn now() -> Self {
        CpuClock(Self::read())
    }

    /// CPU seconds since `now`.
    fn secs(self) -> f64 {
        (Self::read() - self.0).max(1e-9)
    }
}

/// `(label, bytes)` of the sizes measured: full and quick mode.
fn sizes(ctx: &Ctx) -> Vec<(&'static str, usize)> {
    ctx.pick(
        vec![("64k", 64 << 10), ("1m", 1 << 20), ("128m", 128 << 20)],
        vec![("64k", 64 << 10), ("1m", 1 << 20), ("4m", 4 << 20)],
    )
}

/// A file of `len` bytes, written once, so in the page cache.
fn cached_file(path: &std::path::Path, len: usize) -> Res<std::fs::File> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    let block: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    let mut left = len;
    while left > 0 {
        let n = left.min(block.len());
        f.write_all(&block[..n])?;
        left -= n;
    }
    f.sync_all()?;
    Ok(f)
}

/// The ratios of each round (`a[i] / b[i]`), their median.
fn paired(a: &[f64], b: &[f64]) -> f64 {
    median(&a.iter().zip(b).map(|(x, y)| x / y).collect::<Vec<_>>())
}

/// Guest memory typed with bitmap `B`, and two chains over the same
/// `size / 4096` pages of it in a scattered order (as a guest's page
/// cache hands them to the driver): one device-writable (a Tread's
/// reply), one device-readable (a Twrite's data).
struct Pages<B: Bitmap + 'static> {
    mem: Arc<GuestMemoryMmap<B>>,
    writable: Chain<Arc<GuestMemoryMmap<B>>>,
    readable: Chain<Arc<GuestMemoryMmap<B>>>,
    size: usize,
}

impl<B: Bitmap + NewBitmap + Send + Sync + 'static> Pages<B> {
    fn new(size: usize) -> Res<Self> {
        let pages = size / PAGE;
        let mem: Arc<GuestMemoryMmap<B>> = Arc::new(GuestMemoryMmap::from_ranges(&[(
            GuestAddress(0),
            size + 32 * pages + (16 << 20),
        )])?);
        let mut driver = MockDriver::new(&*mem, 256);
        let mut queue: Queue = driver.create_queue();
        // Page-aligned block, then its pages in a fixed random order.
        let base = driver
            .alloc_data((size + PAGE) as u64)?
            .0
            .next_multiple_of(PAGE as u64);
        let mut addrs: Vec<GuestAddress> = (0..pages)
            .map(|i| GuestAddress(base + (i * PAGE) as u64))
            .collect();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in (1..addrs.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            addrs.swap(i, (x % (i as u64 + 1)) as usize);
        }
        driver.add_chain_placed(
            Placement::Indirect,
            &vec![Buf::w(PAGE as u32); pages],
            &addrs,
            None,
        )?;
        driver.add_chain_placed(
            Placement::Indirect,
            &vec![Buf::r(PAGE as u32); pages],
            &addrs,
            None,
        )?;
        let mut walker = ChainWalker::new(ChainLimits::large())?;
        let writable = walker
            .pop(&mut queue, Arc::clone(&mem))?
            .ok_or("no chain")?;
        let readable = walker
            .pop(&mut queue, Arc::clone(&mem))?
            .ok_or("no chain")?;
        drop(driver);
        // Fault the pages in.
        writable.writer().write_all(&vec![0x5a; size])?;
        Ok(Pages {
            mem,
            writable,
            readable,
            size,
        })
    }

    /// GiB/s of `iters` `preadv`s of the whole file into the pages.
    fn preadv(&self, file: &std::fs::File, iters: usize) -> Res<f64> {
        let t = CpuClock::now();
        for _ in 0..iters {
            let n = self
                .writable
                .writer()
                .read_from_file_at(file, self.size, 0)?;
            if n != self.size {
                return Err(format!("short preadv: {n} of {}", self.size).into());
            }
        }
        Ok(self.rate(iters, t))
    }

    /// GiB/s of `iters` `pwritev`s of the pages to the file.
    fn pwritev(&self, file: &std::fs::File, iters: usize) -> Res<f64> {
        let t = CpuClock::now();
        for _ in 0..iters {
            let n = self
                .readable
                .reader()
                .write_to_file_at(file, self.size, 0)?;
            if n != self.size {
                return Err(format!("short pwritev: {n} of {}", self.size).into());
            }
        }
        Ok(self.rate(iters, t))
    }

    /// GiB/s of `iters` copies of `buf` into the pages (`Write`).
    fn copy_in(&self, buf: &[u8], iters: usize) -> Res<f64> {
        let t = CpuClock::now();
        for _ in 0..iters {
            self.writable
                .writer()
                .write_all(std::hint::black_box(&buf[..self.size]))?;
        }
        Ok(self.rate(iters, t))
    }

    /// GiB/s of `iters` copies of the pages into `buf` (`Read`).
    fn copy_out(&self, buf: &mut [u8], iters: usize) -> Res<f64> {
        let t = CpuClock::now();
        for _ in 0..iters {
            self.readable.reader().read_exact(&mut buf[..self.size])?;
        }
        std::hint::black_box(&buf[..]);
        Ok(self.rate(iters, t))
    }

    /// ns per 8-byte `write_obj` into guest memory (what a used-ring
    /// entry costs through vm-memory), over `n` writes.
    fn write_obj_ns(&self, n: usize) -> Res<f64> {
        let t = CpuClock::now();
        for i in 0..n {
            let at = GuestAddress(0x1000 + ((i % 512) * 8) as u64);
            self.mem.write_obj(std::hint::black_box(i as u64), at)?;
        }
        Ok(t.secs() * 1e9 / n as f64)
    }

    fn rate(&self, iters: usize, t: CpuClock) -> f64 {
        (self.size * iters) as f64 / GIB / t.secs()
    }
}

/// The four transfers of one memory type, GiB/s each.
fn transfers<B: Bitmap + NewBitmap + Send + Sync + 'static>(
    p: &Pages<B>,
    src: &std::fs::File,
    dst: &std::fs::File,
    buf: &mut [u8],
    iters: usize,
) -> Res<[f64; 4]> {
    Ok([
        p.preadv(src, iters)?,
        p.pwritev(dst, iters)?,
        p.copy_in(buf, iters)?,
        p.copy_out(buf, iters)?,
    ])
}

/// The four transfers and the small write on the three memory types
/// (no bitmap, vhost-user-backend's `BitmapMmapRegion`, the daemon's
/// `DirtyLog`), logging off, in the same rounds.
fn bitmap_off(ctx: &Ctx, report: &mut SuiteReport) -> Res<()> {
    let dir = tempfile::tempdir()?;
    let sizes = sizes(ctx);
    let max = sizes.iter().map(|s| s.1).max().unwrap_or(PAGE);
    let src = cached_file(&dir.path().join("src"), max)?;
    let dst = cached_file(&dir.path().join("dst"), max)?;
    let mut buf = vec![0xa5u8; max];
    let reps = ctx.reps();
    let moved: usize = ctx.pick(256 << 20, 16 << 20);
    let mut table = Table::new(
        "guest memory with a dirty-log bitmap, logging off, vs no bitmap (time ratio; > 1: the bitmap costs)",
        &[
            "size (4 KiB pages)",
            "bitmap",
            "preadv (Tread)",
            "pwritev (Twrite)",
            "copy in (bounce Rread)",
            "copy out (bounce Twrite)",
        ],
    );
    let label = |size: usize| {
        if size >= 1 << 20 {
            format!("{} MiB", size >> 20)
        } else {
            format!("{} KiB", size >> 10)
        }
    };
    for &(name, size) in &sizes {
        let unit: Pages<()> = Pages::new(size)?;
        let upstream: Pages<BitmapMmapRegion> = Pages::new(size)?;
        let ours: Pages<DirtyLog> = Pages::new(size)?;
        let iters = (moved / size).max(2);
        // [memory type][op] samples, GiB/s.
        let mut s: [[Vec<f64>; 4]; 3] = Default::default();
        for round in 0..reps {
            // The order rotates, so no type always goes first.
            for k in 0..3 {
                let t = (round + k) % 3;
                let f = match t {
                    0 => transfers(&unit, &src, &dst, &mut buf, iters)?,
                    1 => transfers(&upstream, &src, &dst, &mut buf, iters)?,
                    _ => transfers(&ours, &src, &dst, &mut buf, iters)?,
                };
                for (op, v) in f.into_iter().enumerate() {
                    s[t][op].push(v);
                }
            }
        }
        // Time ratio bitmap / unit = rate unit / rate bitmap.
        let up: Vec<f64> = (0..4).map(|op| paired(&s[0][op], &s[1][op])).collect();
        let our: Vec<f64> = (0..4).map(|op| paired(&s[0][op], &s[2][op])).collect();
        for (op, (&r, &u)) in ["preadv", "pwritev", "copy_in", "copy_out"]
            .iter()
            .zip(our.iter().zip(&up))
        {
            let key = format!("bitmap_off_vs_unit_{op}_{name}");
            // Spelled out: the targets table names these.
            match key.as_str() {
                "bitmap_off_vs_unit_preadv_1m" => report.metric("bitmap_off_vs_unit_preadv_1m", r),
                "bitmap_off_vs_unit_copy_in_1m" => {
                    report.metric("bitmap_off_vs_unit_copy_in_1m", r)
                }
                "bitmap_off_vs_unit_pwritev_1m" => {
                    report.metric("bitmap_off_vs_unit_pwritev_1m", r)
                }
                _ => report.metric(&key, r),
            };
            match key.as_str() {
                "bitmap_off_vs_unit_preadv_1m" => {
                    report.metric("upstream_bitmap_off_vs_unit_preadv_1m", u)
                }
                _ => report.metric(&format!("upstream_{key}"), u),
            };
        }
        report.metric(&format!("unit_preadv_gib_per_s_{name}"), median(&s[0][0]));
        for (what, r) in [
            ("DirtyLog (the daemon's)", &our),
            ("BitmapMmapRegion (vhost-user-backend's)", &up),
        ] {
            table.row(&[
                label(size),
                what.to_string(),
                format_value(r[0]),
                format_value(r[1]),
                format_value(r[2]),
                format_value(r[3]),
            ]);
        }
    }
    report.table(table);
    // The bitmap's own cost on one small write.
    let unit: Pages<()> = Pages::new(64 << 10)?;
    let upstream: Pages<BitmapMmapRegion> = Pages::new(64 << 10)?;
    let ours: Pages<DirtyLog> = Pages::new(64 << 10)?;
    let n = ctx.pick(2_000_000, 100_000);
    let mut v: [Vec<f64>; 3] = Default::default();
    for round in 0..reps {
        for k in 0..3 {
            let t = (round + k) % 3;
            v[t].push(match t {
                0 => unit.write_obj_ns(n)?,
                1 => upstream.write_obj_ns(n)?,
                _ => ours.write_obj_ns(n)?,
            });
        }
    }
    let [u, up, our] = v.map(|x| median(&x));
    report.metric("unit_write_obj_ns", u);
    report.metric("bitmap_off_write_obj_extra_ns", our - u);
    report.metric("upstream_bitmap_off_write_obj_extra_ns", up - u);
    report.note(
        "Bitmap part: virtqueue-large's Writer/Reader (the daemon's data path) over one indirect chain \
         of scattered 4 KiB pages, on GuestMemoryMmap<()>, GuestMemoryMmap<BitmapMmapRegion> \
         (vhost-user-backend's dirty-log bitmap, which the daemon used until this suite came) and \
         GuestMemoryMmap<DirtyLog> (the daemon's), no log set, in rotating order; files in the page \
         cache. bitmap_off_* metrics are DirtyLog's, upstream_* BitmapMmapRegion's. write_obj: one \
         8-byte vm-memory write, as a used-ring entry. Timed in the thread's CPU time \
         (CLOCK_THREAD_CPUTIME_ID, system calls included), not wall time.",
    );
    Ok(())
}

/// Sequential Tread and Twrite through the daemon, dirty logging on
/// against off, in the same rounds.
fn logging_on(ctx: &Ctx, report: &mut SuiteReport) -> Res<()> {
    let file_len: u64 = ctx.pick(512 << 20, 160 << 20);
    let dir = tempfile::tempdir()?;
    cached_file(&dir.path().join("big"), file_len as usize)?;
    cached_file(&dir.path().join("out"), 0)?;
    let run = start_with(
        dir.path(),
        coro_pool::Policy::Bounded,
        OffloadPolicy::Auto,
        None,
    )?;
    let reps = ctx.reps();
    let mut table = Table::new(
        "vhost-user sequential Tread/Twrite, dirty logging on vs off (GiB/s; ratio: time on / time off)",
        &[
            "msize",
            "Tread off",
            "Tread on",
            "ratio",
            "Twrite off",
            "Twrite on",
            "ratio",
        ],
    );
    let msizes: [(&str, u32); 3] = [("64k", 64 << 10), ("1m", 1 << 20), ("128m", 128 << 20)];
    for (name, msize) in msizes {
        let msize = if ctx.quick { msize.min(4 << 20) } else { msize };
        let total: u64 = ctx
            .pick(512u64 << 20, 32 << 20)
            .max(4 * u64::from(msize))
            .min(ctx.pick(1 << 30, 256 << 20));
        let wtotal = total.min(ctx.pick(512 << 20, 64 << 20));
        // [read off, read on, write off, write on]
        let mut v: [Vec<f64>; 4] = Default::default();
        for round in 0..reps {
            for on in [round % 2 == 1, round % 2 == 0] {
                v[usize::from(on)]
                    .push(sequential_logged(&run, msize, total, file_len, false, on)?);
                v[2 + usize::from(on)]
                    .push(sequential_logged(&run, msize, wtotal, file_len, true, on)?);
            }
        }
        let (rr, wr) = (paired(&v[0], &v[1]), paired(&v[2], &v[3]));
        let [ro, rn, wo, wn] = v.map(|x| median(&x));
        if name == "1m" {
            // Spelled out: the targets table names these.
            report.metric("log_on_vs_off_read_1m", rr);
            report.metric("log_on_vs_off_write_1m", wr);
        } else {
            report.metric(&format!("log_on_vs_off_read_{name}"), rr);
            report.metric(&format!("log_on_vs_off_write_{name}"), wr);
        }
        report.metric(&format!("read_gib_per_s_log_off_{name}"), ro);
        report.metric(&format!("write_gib_per_s_log_off_{name}"), wo);
        table.row(&[
            if msize >= 1 << 20 {
                format!("{} MiB", msize >> 20)
            } else {
                format!("{} KiB", msize >> 10)
            },
            format_value(ro),
            format_value(rn),
            format_value(rr),
            format_value(wo),
            format_value(wn),
            format_value(wr),
        ]);
    }
    report.table(table);
    report.note(
        "Logging part: the daemon in process, a fake VMM over real vhost-user, memfd guest memory; \
         Tread replies into 4 KiB indirect descriptors, Twrite data in one descriptor (on a worker: \
         the default policy runs every Twrite there). 'on': the fake VMM acked VHOST_F_LOG_ALL and \
         sent SET_LOG_BASE before the first request, as QEMU does when a migration starts.",
    );
    Ok(())
}

/// A worker's Twrite: the bounce copy the daemon does against the
/// zero-copy `pwritev` it did before, on one worker thread.
fn bounce(ctx: &Ctx, report: &mut SuiteReport) -> Res<()> {
    let dir = tempfile::tempdir()?;
    let sizes: [(&str, usize); 3] = [("4k", 4 << 10), ("64k", 64 << 10), ("1m", 1 << 20)];
    let file = cached_file(&dir.path().join("out"), 1 << 20)?;
    let reps = ctx.reps();
    let moved: usize = ctx.pick(256 << 20, 16 << 20);
    let mut table = Table::new(
        "a worker's Twrite: bounce copy under the request's guard vs zero-copy pwritev from guest memory (µs per call)",
        &["size (4 KiB pages)", "zero-copy (control)", "bounce copy", "ratio"],
    );
    for (name, size) in sizes {
        let iters = (moved / size).clamp(1000, 200_000);
        let figures = std::thread::scope(|s| {
            s.spawn(|| -> Res<[Vec<f64>; 2]> {
                // The daemon's memory type, logging off.
                let pages: Pages<DirtyLog> = Pages::new(size)?;
                let token = Cancel::new();
                let zero_copy = || -> Res<f64> {
                    let t = CpuClock::now();
                    for _ in 0..iters {
                        let mut r = pages.readable.reader();
                        if r.write_to_file_at(&file, size, 0)? != size {
                            return Err("short pwritev".into());
                        }
                    }
                    Ok(t.secs() * 1e6 / iters as f64)
                };
                let bounced = || -> Res<f64> {
                    use std::os::fd::AsFd;
                    let t = CpuClock::now();
                    for _ in 0..iters {
                        let mut r = ChainReader(pages.readable.reader(), token.clone());
                        if r.read_to_file_at(file.as_fd(), size, 0)? != size {
                            return Err("short bounced write".into());
                        }
                    }
                    Ok(t.secs() * 1e6 / iters as f64)
                };
                let mut v: [Vec<f64>; 2] = Default::default();
                for round in 0..reps {
                    for zc in [round % 2 == 0, round % 2 == 1] {
                        if zc {
                            v[0].push(zero_copy()?);
                        } else {
                            v[1].push(bounced()?);
                        }
                    }
                }
                Ok(v)
            })
            .join()
            .map_err(|_| -> Box<dyn Error + Send + Sync> { "bounce worker panicked".into() })?
        })?;
        let ratio = paired(&figures[1], &figures[0]);
        let (zc, bc) = (median(&figures[0]), median(&figures[1]));
        // Spelled out: the targets table names these.
        match name {
            "4k" => report.metric("bounce_vs_zero_copy_twrite_4k", ratio),
            "64k" => report.metric("bounce_vs_zero_copy_twrite_64k", ratio),
            _ => report
                .metric("bounce_vs_zero_copy_twrite_1m", ratio)
                .metric("zero_copy_twrite_us_1m", zc),
        };
        if name != "1m" {
            report.metric(&format!("zero_copy_twrite_us_{name}"), zc);
        }
        report.metric(&format!("bounce_twrite_us_{name}"), bc);
        table.row(&[
            if size >= 1 << 20 {
                format!("{} MiB", size >> 20)
            } else {
                format!("{} KiB", size >> 10)
            },
            format_value(zc),
            format_value(bc),
            format_value(ratio),
        ]);
    }
    report.table(table);
    report.note(
        "Bounce part: one plain thread (not a coroutine: the daemon's worker), a Twrite's data as \
         scattered 4 KiB readable pages of GuestMemoryMmap<DirtyLog>, overwriting the start \
         of a cached file. Bounce: virtio-9p-server's ChainReader::read_to_file_at as a worker runs \
         it; zero-copy: virtqueue-large's Reader::write_to_file_at (pwritev from guest memory). \
         Timed in the thread's CPU time (system calls included), not wall time.",
    );
    Ok(())
}
