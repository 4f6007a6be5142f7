// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Part of suite `virtio-9p`: the vhost-user data path. An
//! in-process fake VMM (`virtio_9p_server::vhost_user::mock::FakeVmm`)
//! talks real vhost-user to the daemon over a unix socket and shares memfd
//! guest memory; the file is in the page cache.
//!
//! - sequential read and write throughput by msize (8 KiB to 128 MiB),
//!   with page-sized descriptors like a Linux guest's sg lists;
//! - the copy limits: `memcpy` of 128 MiB into guest memory, and one
//!   `read(2)` of 128 MiB of the cached file into the same guest memory
//!   (the kernel's page-cache copy, the ceiling of any read path), with
//!   the 128 MiB Tread against both; and, for information, a user-space
//!   copy out of a mapping of the file (`mmap` + `memcpy`), which the read
//!   path does not use;
//! - 4 KiB random reads, 64 in flight, with the coroutine stack pool and
//!   with `no_pool` (a fresh mmap'd stack per request), and the p99
//!   latency;
//! - the inline-vs-offload line: 4 KiB to 4 MiB reads with cached reads
//!   inline on the coroutine against every read on a worker, next to the
//!   bare copy (`read(2)` of the same size into guest memory).

use std::error::Error;
use std::hint::black_box;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use virtio_9p_server::engine::OffloadPolicy;
use virtio_9p_server::protocol::{GetattrMask, OpenFlags, Tgetattr, Tmessage, Tread, IOHDRSZ};
use virtio_9p_server::vhost_user::mock::{FakeVmm, Layout, VmmOptions};
use virtio_9p_server::vhost_user::{Daemon, DaemonConfig, Listen, StopHandle};
use virtio_9p_server::{Config, PassthroughConfig, PassthroughFs, Server};
use virtqueue_large::mock::UsedEntry;

use crate::harness::{format_value, median, Ctx, SuiteReport, Table};

pub(super) type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

const GIB: f64 = (1u64 << 30) as f64;
const MAX_MSIZE: u32 = 128 << 20;
/// Guest RAM of the fake VMM: one 128 MiB message, its table and rings.
const GUEST_MEM: u64 = 160 << 20;
const REQ_AREA: u64 = 0x30_0000;
const TABLE_AREA: u64 = 0x40_0000;
const DATA_AREA: u64 = 0x100_0000;

pub(super) struct Running {
    stop: StopHandle,
    thread: Option<JoinHandle<()>>,
    pub(super) socket: std::path::PathBuf,
    _sock_dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn start(dir: &Path, policy: coro_pool::Policy, offload: OffloadPolicy) -> Res<Running> {
    start_with(dir, policy, offload, None)
}

/// [`start`], keeping the session crash-safe in `state` if given.
pub(super) fn start_with(
    dir: &Path,
    policy: coro_pool::Policy,
    offload: OffloadPolicy,
    state: Option<Arc<std::os::fd::OwnedFd>>,
) -> Res<Running> {
    let sock_dir = tempfile::tempdir()?;
    let socket = sock_dir.path().join("vu.sock");
    let fs = PassthroughFs::new(PassthroughConfig::new(dir))?;
    let server = Arc::new(Server::new(fs, Config::default())?);
    let mut config = DaemonConfig::default();
    config.listen = Listen::Path(socket.clone());
    config.backend.tag = "bench".into();
    config.backend.engine.workers = 4;
    config.backend.engine.max_in_flight = 1024;
    config.backend.engine.offload = offload;
    config.stack_policy = policy;
    config.backend.state_dir = state;
    let mut daemon = Daemon::new(server, config)?;
    let stop = daemon.stop_handle();
    let thread = std::thread::spawn(move || {
        if let Err(e) = daemon.run() {
            eprintln!("virtio-9p vhost bench: daemon failed: {e}");
        }
    });
    Ok(Running {
        stop,
        thread: Some(thread),
        socket,
        _sock_dir: sock_dir,
    })
}

/// Sends one request through the ring and waits for it (setup messages).
pub(super) fn call(vmm: &mut FakeVmm, tag: u16, msg: Tmessage) -> Res<()> {
    let reply = vmm.call(&msg.encode_frame(tag), 4096, Layout::Direct)?;
    if reply.len() > 4 && reply[4] == 7 {
        return Err(format!("9P error reply to {msg:?}").into());
    }
    Ok(())
}

/// Connects (split ring), negotiates `msize` and opens `name` as fid 1
/// with `flags`.
pub(super) fn session(run: &Running, msize: u32, name: &str, flags: OpenFlags) -> Res<FakeVmm> {
    session_on(run, msize, name, flags, false)
}

/// [`session`] on a packed ring if `packed`.
pub(super) fn session_on(
    run: &Running,
    msize: u32,
    name: &str,
    flags: OpenFlags,
    packed: bool,
) -> Res<FakeVmm> {
    let mut vmm = FakeVmm::connect(&run.socket, {
        let mut o = VmmOptions::default();
        o.mem_size = GUEST_MEM;
        o.packed = packed;
        o
    })?;
    vmm.open_file(Some(msize), name, flags)?;
    Ok(vmm)
}

pub(super) fn wait_one(vmm: &mut FakeVmm) -> Res<UsedEntry> {
    let used = vmm.wait_used(Duration::from_secs(30))?;
    match used.as_slice() {
        [u] => Ok(*u),
        [] => Err("no completion within 30 s".into()),
        _ => Err("more completions than requests".into()),
    }
}

/// µs per request of `frame`, one at a time: submit, kick, wait for the
/// used entry (the fake VMM polls its call eventfd).
pub(super) fn per_request_us(
    vmm: &mut FakeVmm,
    frame: &[u8],
    reply_len: u32,
    n: usize,
) -> Res<f64> {
    let t0 = Instant::now();
    for _ in 0..n {
        vmm.submit(frame, reply_len, Layout::Direct)?;
        vmm.kick()?;
        let len = wait_one(vmm)?.len;
        if len < 11 {
            return Err(format!("short reply ({len} bytes)").into());
        }
    }
    Ok(t0.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// The floor of one vhost-user round trip, µs: an eventfd kick to a
/// thread waiting in `epoll_wait`, which reads it and writes a second
/// eventfd back, which the caller waits for with `poll` (as the fake
/// VMM does) and reads. No ring, no request.
fn eventfd_round_trip_us(n: usize) -> Res<f64> {
    use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
    let kick = EventFd::new(EFD_NONBLOCK)?;
    let call = EventFd::new(EFD_NONBLOCK)?;
    let stop = EventFd::new(EFD_NONBLOCK)?;
    let (k, c, st) = (kick.try_clone()?, call.try_clone()?, stop.try_clone()?);
    let epoll = Epoll::new()?;
    epoll.ctl(
        ControlOperation::Add,
        k.as_raw_fd(),
        EpollEvent::new(EventSet::IN, 0),
    )?;
    epoll.ctl(
        ControlOperation::Add,
        st.as_raw_fd(),
        EpollEvent::new(EventSet::IN, 1),
    )?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let mut events = [EpollEvent::default(); 4];
        loop {
            let n = match epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            for ev in &events[..n] {
                if ev.data() == 1 {
                    return Ok(());
                }
                let _ = k.read();
                c.write(1)?;
            }
        }
    });
    let wait_call = |call: &EventFd| -> Res<()> {
        loop {
            let mut pfd = libc::pollfd {
                fd: call.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll on one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, 30_000) };
            if r == 0 {
                return Err("no eventfd call back within 30 s".into());
            }
            if call.read().is_ok() {
                return Ok(());
            }
        }
    };
    for _ in 0..n / 10 {
        kick.write(1)?;
        wait_call(&call)?;
    }
    let t0 = Instant::now();
    for _ in 0..n {
        kick.write(1)?;
        wait_call(&call)?;
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    stop.write(1)?;
    server
        .join()
        .map_err(|_| "floor thread panicked")?
        .map_err(|e| format!("floor thread: {e}"))?;
    Ok(us)
}

/// Sequential Tread (or Twrite) of `total` bytes at `msize`, one request
/// at a time; returns GiB/s.
fn sequential(run: &Running, msize: u32, total: u64, file_len: u64, write: bool) -> Res<f64> {
    sequential_logged(run, msize, total, file_len, write, false)
}

/// [`sequential`], with the dirty-page log of a live migration on
/// (`VHOST_F_LOG_ALL` and SET_LOG_BASE) if `dirty_log`.
pub(super) fn sequential_logged(
    run: &Running,
    msize: u32,
    total: u64,
    file_len: u64,
    write: bool,
    dirty_log: bool,
) -> Res<f64> {
    let flags = if write {
        OpenFlags::RDWR
    } else {
        OpenFlags::RDONLY
    };
    let mut vmm = session(run, msize, if write { "out" } else { "big" }, flags)?;
    if dirty_log {
        vmm.start_dirty_log()?;
    }
    let chunk = msize - IOHDRSZ;
    let mem = vmm.memory().clone();
    if write {
        // Twrite header at DATA_AREA - 23, data right behind it: the
        // request is one readable descriptor, as the data is contiguous.
        let data = vec![0xa5u8; chunk as usize];
        mem.write_slice(&data, GuestAddress(DATA_AREA))?;
    }
    let mut done = 0u64;
    let mut offset = 0u64;
    let mut start = Instant::now();
    // One untimed round first: it faults the guest buffers in.
    let mut warm = true;
    while done < total {
        let this = u64::from(chunk).min(total - done) as u32;
        if write {
            let mut hdr = Vec::with_capacity(23);
            hdr.extend_from_slice(&(23 + this).to_le_bytes());
            hdr.push(118); // Twrite
            hdr.extend_from_slice(&7u16.to_le_bytes());
            hdr.extend_from_slice(&1u32.to_le_bytes());
            hdr.extend_from_slice(&offset.to_le_bytes());
            hdr.extend_from_slice(&this.to_le_bytes());
            mem.write_slice(&hdr, GuestAddress(DATA_AREA - 23))?;
            vmm.submit_at(DATA_AREA - 23, 23 + this, REQ_AREA, 64, Layout::Direct, 0)?;
        } else {
            let req = Tmessage::Read(Tread {
                fid: 1,
                offset,
                count: this,
            })
            .encode_frame(7);
            mem.write_slice(&req, GuestAddress(REQ_AREA))?;
            vmm.submit_at(
                REQ_AREA,
                req.len() as u32,
                DATA_AREA,
                this + 11,
                Layout::Indirect { seg: 4096 },
                TABLE_AREA,
            )?;
        }
        vmm.kick()?;
        let len = wait_one(&mut vmm)?.len;
        let expect = if write { 11 } else { this + 11 };
        if len != expect {
            return Err(format!("reply of {len} bytes, expected {expect} (msize {msize})").into());
        }
        if warm {
            warm = false;
            start = Instant::now();
            continue;
        }
        done += u64::from(this);
        offset = (offset + u64::from(this)) % file_len.max(1);
        if !write && offset + u64::from(chunk) > file_len {
            offset = 0;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(done as f64 / GIB / secs)
}

/// 4 KiB random reads with `depth` in flight for `dur` (on a packed ring
/// if `packed`); returns IOPS and the latencies in µs.
pub(super) fn random_4k(
    run: &Running,
    file_len: u64,
    depth: usize,
    dur: Duration,
    packed: bool,
) -> Res<(f64, Vec<f64>)> {
    let mut vmm = session_on(run, 65536, "big", OpenFlags::RDONLY, packed)?;
    let mem = vmm.memory().clone();
    let pages = (file_len / 4096).max(1);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next_offset = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % pages) * 4096
    };
    // One fixed request slot and reply buffer per in-flight request.
    let mut head_slot = std::collections::HashMap::new();
    let mut started = vec![Instant::now(); depth];
    let submit = |vmm: &mut FakeVmm, slot: usize, off: u64| -> Res<u32> {
        let req = Tmessage::Read(Tread {
            fid: 1,
            offset: off,
            count: 4096,
        })
        .encode_frame(slot as u16 + 10);
        let ra = REQ_AREA + 64 * slot as u64;
        mem.write_slice(&req, GuestAddress(ra))?;
        let sub = vmm.submit_at(
            ra,
            req.len() as u32,
            DATA_AREA + 8192 * slot as u64,
            4096 + 11,
            Layout::Direct,
            0,
        )?;
        Ok(u32::from(sub.head))
    };
    for (slot, t) in started.iter_mut().enumerate() {
        let h = submit(&mut vmm, slot, next_offset())?;
        head_slot.insert(h, slot);
        *t = Instant::now();
    }
    vmm.kick()?;
    let mut lat = Vec::new();
    let mut ops = 0u64;
    let t0 = Instant::now();
    while t0.elapsed() < dur {
        let used = vmm.wait_used(Duration::from_secs(30))?;
        if used.is_empty() {
            return Err("random reads stalled".into());
        }
        // Every used head first: the driver may hand a head (or buffer
        // id) of this batch to the next submit at once.
        let mut done = Vec::with_capacity(used.len());
        for u in used {
            if u.len != 4096 + 11 {
                return Err(format!("4 KiB read returned {} bytes", u.len).into());
            }
            let slot = head_slot.remove(&u.id).ok_or("unknown head")?;
            lat.push(started[slot].elapsed().as_secs_f64() * 1e6);
            ops += 1;
            done.push(slot);
        }
        for slot in done {
            let h = submit(&mut vmm, slot, next_offset())?;
            head_slot.insert(h, slot);
            started[slot] = Instant::now();
        }
        vmm.kick()?;
    }
    let secs = t0.elapsed().as_secs_f64();
    // Drain.
    while vmm.pending() > 0 {
        if vmm.wait_used(Duration::from_secs(30))?.is_empty() {
            break;
        }
    }
    Ok((ops as f64 / secs, lat))
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

/// The copy limit: 128 MiB from a heap buffer into the same kind of
/// memfd guest memory the reads fill (4 KiB shmem pages, already faulted
/// in), the cost a page-cache-to-guest `preadv` cannot avoid.
fn memcpy_gib_per_s(run: &Running, size: usize, reps: usize) -> Res<f64> {
    let vmm = session(run, 65536, "big", OpenFlags::RDONLY)?;
    let mem = vmm.memory().clone();
    let src = vec![0x5au8; size];
    mem.write_slice(&src, GuestAddress(DATA_AREA))?;
    let mut rates = Vec::new();
    for _ in 0..reps.max(3) {
        let t = Instant::now();
        mem.write_slice(black_box(&src), GuestAddress(DATA_AREA))?;
        rates.push(size as f64 / GIB / t.elapsed().as_secs_f64());
    }
    Ok(median(&rates))
}

/// The kernel's copy limit: one `read(2)` of `size` bytes of the cached
/// file straight into the same kind of memfd guest memory (what a single
/// `pread` of the whole message costs without any 9P, virtio or iovec
/// work). `rounds` reads at successive offsets after one untimed read;
/// returns GiB/s.
fn pread_gib_per_s(
    run: &Running,
    file: &Path,
    file_len: u64,
    size: usize,
    rounds: usize,
) -> Res<f64> {
    use std::io::{Seek, SeekFrom};
    let vmm = session(run, 65536, "big", OpenFlags::RDONLY)?;
    let mem = vmm.memory().clone();
    let mut f = std::fs::File::open(file)?;
    let read_at = |offset: u64| -> Res<()> {
        f.seek(SeekFrom::Start(offset))?;
        // One region: a single read(2) of `size` bytes (vm-memory's
        // ReadVolatile for File), retried only on a short read.
        mem.read_exact_volatile_from(GuestAddress(DATA_AREA), &mut f, size)?;
        Ok(())
    };
    rate_over_file(size, rounds, file_len, read_at)
}

/// The copy a read path could do in user space instead: map `size` bytes
/// of the cached file (`MAP_POPULATE`, so no page faults during the copy),
/// `memcpy` them into the same guest memory, unmap; `rounds` times after
/// one untimed round; returns GiB/s. Informative only: a daemon copying
/// from a mapping dies of SIGBUS when the file is truncated under it
/// (another fid of the guest can do that), so the read path does not.
fn mmap_copy_gib_per_s(
    run: &Running,
    file: &Path,
    file_len: u64,
    size: usize,
    rounds: usize,
) -> Res<f64> {
    use std::os::fd::AsRawFd;
    let vmm = session(run, 65536, "big", OpenFlags::RDONLY)?;
    let mem = vmm.memory().clone();
    let f = std::fs::File::open(file)?;
    let copy_at = |offset: u64| -> Res<()> {
        // SAFETY: the file is the bench's own and nothing writes or
        // truncates it while it is mapped.
        unsafe {
            crate::harness::with_file_mapped(f.as_raw_fd(), size, offset, |src| {
                mem.write_slice(src, GuestAddress(DATA_AREA))
            })
        }??;
        Ok(())
    };
    rate_over_file(size, rounds, file_len, copy_at)
}

/// GiB/s of `copy_at` over `rounds` consecutive `size`-byte pieces of a
/// file of `file_len` bytes (wrapping to the start), after one untimed
/// warm-up call at offset 0.
fn rate_over_file(
    size: usize,
    rounds: usize,
    file_len: u64,
    mut copy_at: impl FnMut(u64) -> Res<()>,
) -> Res<f64> {
    let mut offset = 0u64;
    copy_at(offset)?;
    let t = Instant::now();
    for _ in 0..rounds.max(1) {
        offset += size as u64;
        if offset + size as u64 > file_len {
            offset = 0;
        }
        copy_at(black_box(offset))?;
    }
    Ok((size * rounds.max(1)) as f64 / GIB / t.elapsed().as_secs_f64())
}

/// Split-ring descriptor flags.
const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;
/// The Rread header's own reply buffer in [`read_into_pages`].
const HDR_AREA: u64 = 0x38_0000;

/// Where a Tread's data pages sit in guest memory.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pages {
    /// In address order, one after the other.
    Adjacent,
    /// The same pages in a fixed random order, as a guest's page cache or
    /// user buffer hands them to the driver.
    Scattered,
}

/// Guest addresses of the 4 KiB pages that hold `count` bytes, in the
/// order of the chain: the pages of `[DATA_AREA, DATA_AREA + count)`,
/// shuffled for [`Pages::Scattered`] (fixed seed).
fn page_list(count: u32, layout: Pages) -> Vec<u64> {
    let n = u64::from(count.div_ceil(4096));
    let mut pages: Vec<u64> = (0..n).map(|i| DATA_AREA + i * 4096).collect();
    if layout == Pages::Scattered {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for i in (1..pages.len()).rev() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            pages.swap(i, (rng % (i as u64 + 1)) as usize);
        }
    }
    pages
}

/// Sequential Treads of `msize - IOHDRSZ` bytes, one at a time, into the
/// chain a Linux guest's zero-copy read sends: the request, the 11-byte
/// Rread header in its own buffer, then the data in the 4 KiB `pages`.
/// The indirect table is written once, so the fake VMM's work per request
/// is one descriptor, not 32768 (a guest driver builds its sg list in the
/// guest, not in the device's time). Returns GiB/s.
fn read_into_pages(
    run: &Running,
    msize: u32,
    total: u64,
    file_len: u64,
    pages: &[u64],
) -> Res<f64> {
    let mut vmm = session(run, msize, "big", OpenFlags::RDONLY)?;
    let chunk = msize - IOHDRSZ;
    let mem = vmm.memory().clone();
    let req_len = Tmessage::Read(Tread {
        fid: 1,
        offset: 0,
        count: chunk,
    })
    .encode_frame(7)
    .len() as u32;
    let n = 2 + pages.len() as u32;
    vmm.write_table_desc(TABLE_AREA, 0, REQ_AREA, req_len, F_NEXT, 1)?;
    vmm.write_table_desc(TABLE_AREA, 1, HDR_AREA, 11, F_WRITE | F_NEXT, 2)?;
    let mut left = chunk;
    for (i, &page) in pages.iter().enumerate() {
        let len = left.min(4096);
        left -= len;
        let idx = 2 + i as u32;
        let (flags, next) = if idx + 1 < n {
            (F_WRITE | F_NEXT, (idx + 1) as u16)
        } else {
            (F_WRITE, 0)
        };
        vmm.write_table_desc(TABLE_AREA, idx, page, len, flags, next)?;
    }
    let mut done = 0u64;
    let mut offset = 0u64;
    let mut start = Instant::now();
    let mut warm = true;
    while done < total {
        let req = Tmessage::Read(Tread {
            fid: 1,
            offset,
            count: chunk,
        })
        .encode_frame(7);
        mem.write_slice(&req, GuestAddress(REQ_AREA))?;
        let head = vmm.take_desc()?;
        vmm.write_desc(head, TABLE_AREA, 16 * n, F_INDIRECT, 0)?;
        vmm.push_avail(head)?;
        vmm.kick()?;
        let len = wait_one(&mut vmm)?.len;
        if len != chunk + 11 {
            return Err(format!(
                "reply of {len} bytes, expected {} (msize {msize})",
                chunk + 11
            )
            .into());
        }
        if warm {
            warm = false;
            start = Instant::now();
            continue;
        }
        done += u64::from(chunk);
        offset += u64::from(chunk);
        if offset + u64::from(chunk) > file_len {
            offset = 0;
        }
    }
    Ok(done as f64 / GIB / start.elapsed().as_secs_f64())
}

/// The kernel's ceiling for a page layout: `preadv` of `count` bytes of
/// the cached file into the same 4 KiB `pages` of guest memory, the iovec
/// list the descriptors describe (one iovec per page, `IOV_MAX` per
/// call), with no walker, no ring and no 9P; `rounds` reads at successive
/// offsets after one untimed read. Returns GiB/s.
fn preadv_pages_gib_per_s(
    run: &Running,
    file: &Path,
    file_len: u64,
    count: u32,
    pages: &[u64],
    rounds: usize,
) -> Res<f64> {
    let vmm = session(run, 65536, "big", OpenFlags::RDONLY)?;
    let mem = vmm.memory();
    let f = std::fs::File::open(file)?;
    let mut iov = Vec::with_capacity(pages.len());
    let mut left = count as usize;
    for &page in pages {
        let len = left.min(4096);
        left -= len;
        iov.push(libc::iovec {
            iov_base: mem.get_host_address(GuestAddress(page))?.cast(),
            iov_len: len,
        });
    }
    let read_at = |offset: u64| -> Res<()> {
        let mut at = offset;
        for batch in iov.chunks(1024) {
            let want: usize = batch.iter().map(|v| v.iov_len).sum();
            // SAFETY: every iovec points into the mapped guest memory of
            // `vmm`, which outlives the call, and nothing else accesses
            // those pages meanwhile.
            let n = unsafe {
                libc::preadv(
                    f.as_raw_fd(),
                    batch.as_ptr(),
                    batch.len() as i32,
                    at as libc::off_t,
                )
            };
            if n < 0 || n as usize != want {
                return Err(format!("preadv returned {n}, wanted {want}").into());
            }
            at += want as u64;
        }
        Ok(())
    };
    rate_over_file(count as usize, rounds, file_len, read_at)
}

/// The size of cpu0's level-`level` unified or data cache as sysfs
/// spells it ("1024K"), or "unknown".
fn cache_size(level: u32) -> String {
    (0..8)
        .map(|i| std::path::PathBuf::from(format!("/sys/devices/system/cpu/cpu0/cache/index{i}")))
        .find(|d| {
            std::fs::read_to_string(d.join("level")).is_ok_and(|l| l.trim() == level.to_string())
                && std::fs::read_to_string(d.join("type")).is_ok_and(|t| t.trim() != "Instruction")
        })
        .and_then(|d| std::fs::read_to_string(d.join("size")).ok())
        .map_or_else(|| "unknown".to_string(), |s| s.trim().to_string())
}

/// Adds the vhost-user metrics and tables to `report`.
pub fn run(ctx: &Ctx, report: &mut SuiteReport) -> Result<(), Box<dyn Error>> {
    run_inner(ctx, report).map_err(|e| e.to_string().into())
}

fn run_inner(ctx: &Ctx, report: &mut SuiteReport) -> Res<()> {
    let file_len: u64 = ctx.pick(1 << 30, 160 << 20);
    let dir = tempfile::tempdir()?;
    {
        // The file, written once and so in the page cache.
        use std::io::Write;
        let mut f = std::fs::File::create(dir.path().join("big"))?;
        let block: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
        for _ in 0..file_len >> 20 {
            f.write_all(&block)?;
        }
        std::fs::File::create(dir.path().join("out"))?;
    }
    let pooled = start(dir.path(), coro_pool::Policy::Bounded, OffloadPolicy::Auto)?;

    // msize sweep (reads), and the three headline sizes with repetitions.
    let per_point = |msize: u32| -> u64 {
        let base: u64 = ctx.pick(512 << 20, 32 << 20);
        base.max(4 * u64::from(msize))
            .min(ctx.pick(2 << 30, 512 << 20))
    };
    let sweep: [u32; 10] = [
        8 << 10,
        64 << 10,
        128 << 10,
        512 << 10,
        512_000,
        1 << 20,
        4 << 20,
        16 << 20,
        64 << 20,
        128 << 20,
    ];
    let mut table = Table::new(
        "vhost-user sequential read by msize (one request at a time, 4 KiB descriptors)",
        &["msize", "read GiB/s", "write GiB/s"],
    );
    let mut points = Vec::new();
    for &m in &sweep {
        let total = per_point(m);
        let r = sequential(&pooled, m, total, file_len, false)?;
        let w = sequential(
            &pooled,
            m,
            total.min(ctx.pick(512 << 20, 64 << 20)),
            file_len,
            true,
        )?;
        let label = if m == 512_000 {
            "500 KiB (Linux cap)".to_string()
        } else if m >= 1 << 20 {
            format!("{} MiB", m >> 20)
        } else {
            format!("{} KiB", m >> 10)
        };
        table.row(&[label, format_value(r), format_value(w)]);
        points.push((f64::from(m) / 1024.0, r));
    }
    report.table(table);
    report.series("msize_throughput", "ours (vhost-user)", points);

    // At 128 MiB the two copy limits run in the same rounds as the reads
    // (Tread, Twrite, memcpy, read(2), Tread, ...), so the ratios compare
    // figures taken under the same machine load.
    let reps = ctx.reps();
    let big = dir.path().join("big");
    let mut memcpy = Vec::new();
    let mut pread = Vec::new();
    let mut mmap_copy = Vec::new();
    let mut read128 = 0.0;
    for (name, m) in [("512k", 512u32 << 10), ("4m", 4 << 20), ("128m", MAX_MSIZE)] {
        let total = per_point(m);
        let mut r = Vec::new();
        let mut w = Vec::new();
        for _ in 0..reps {
            r.push(sequential(&pooled, m, total, file_len, false)?);
            w.push(sequential(
                &pooled,
                m,
                total.min(ctx.pick(512 << 20, 64 << 20)),
                file_len,
                true,
            )?);
            if m == MAX_MSIZE {
                memcpy.push(memcpy_gib_per_s(&pooled, 128 << 20, 3)?);
                let rounds = (total / u64::from(MAX_MSIZE)).max(1) as usize;
                pread.push(pread_gib_per_s(&pooled, &big, file_len, 128 << 20, rounds)?);
                mmap_copy.push(mmap_copy_gib_per_s(
                    &pooled,
                    &big,
                    file_len,
                    128 << 20,
                    rounds,
                )?);
            }
        }
        report.metric(&format!("read_gib_per_s_msize_{name}"), median(&r));
        report.metric(&format!("write_gib_per_s_msize_{name}"), median(&w));
        if m == MAX_MSIZE {
            read128 = median(&r);
        }
    }
    let (memcpy, pread) = (median(&memcpy), median(&pread));
    report.metric("memcpy_gib_per_s", memcpy);
    report.metric("pread_gib_per_s", pread);
    report.metric("read_128m_vs_memcpy", read128 / memcpy);
    // The kernel limit: page cache to guest memory in one read(2), against
    // memcpy; and how close the 128 MiB Tread gets to that limit.
    report.metric("pread_vs_memcpy", pread / memcpy);
    report.metric("read_128m_vs_pread", read128 / pread);
    // What a user-space copy from a file mapping would reach (not used by
    // the read path: SIGBUS on truncation).
    let mmap_copy = median(&mmap_copy);
    report.metric("mmap_copy_gib_per_s", mmap_copy);
    report.metric("mmap_copy_vs_memcpy", mmap_copy / memcpy);

    // Against the right ceiling: Treads into the chain a guest
    // sends (header buffer, then 4 KiB pages, adjacent or scattered) and
    // `preadv` of the same iovec list with no walker and no 9P, in the same
    // rounds, by msize. The ceiling's own fall from 4 MiB to 128 MiB shows
    // what the sweep above is: the destination outgrowing the caches.
    let mut pages_table = Table::new(
        "Tread into 4 KiB pages vs preadv of the same iovec list (one request at a time, GiB/s)",
        &[
            "msize",
            "Tread, adjacent pages",
            "preadv, adjacent",
            "ratio",
            "Tread, scattered pages",
            "preadv, scattered",
            "ratio",
            "pread, one buffer",
        ],
    );
    let mut ceil_points = Vec::new();
    let mut ceilings = Vec::new();
    for (name, m) in [
        ("512k", 512u32 << 10),
        ("4m", 4 << 20),
        ("16m", 16 << 20),
        ("64m", 64 << 20),
        ("128m", MAX_MSIZE),
    ] {
        let total = per_point(m);
        let count = m - IOHDRSZ;
        let rounds = (total / u64::from(m)).max(1) as usize;
        let adjacent = page_list(count, Pages::Adjacent);
        let scattered = page_list(count, Pages::Scattered);
        let mut v: [Vec<f64>; 5] = Default::default();
        for _ in 0..reps {
            v[0].push(read_into_pages(&pooled, m, total, file_len, &adjacent)?);
            v[1].push(preadv_pages_gib_per_s(
                &pooled, &big, file_len, count, &adjacent, rounds,
            )?);
            v[2].push(read_into_pages(&pooled, m, total, file_len, &scattered)?);
            v[3].push(preadv_pages_gib_per_s(
                &pooled, &big, file_len, count, &scattered, rounds,
            )?);
            v[4].push(pread_gib_per_s(
                &pooled,
                &big,
                file_len,
                count as usize,
                rounds,
            )?);
        }
        // Ratios per round (Tread and ceiling measured back to back), then
        // the median: steadier on a loaded machine than a ratio of medians.
        let paired = |a: &[f64], b: &[f64]| -> f64 {
            median(&a.iter().zip(b).map(|(x, y)| x / y).collect::<Vec<_>>())
        };
        let (ratio_a, ratio_s) = (paired(&v[0], &v[1]), paired(&v[2], &v[3]));
        let [ra, ca, rs, cs, pr] = v.map(|x| median(&x));
        if m == MAX_MSIZE {
            // Spelled out: the targets table names these.
            report.metric("read_pages_adjacent_gib_per_s_128m", ra);
            report.metric("preadv_adjacent_gib_per_s_128m", ca);
            report.metric("read_pages_scattered_gib_per_s_128m", rs);
            report.metric("preadv_scattered_gib_per_s_128m", cs);
            report.metric("pread_one_buffer_gib_per_s_128m", pr);
            report.metric("read_128m_vs_scattered_ceiling", ratio_s);
            report.metric("read_128m_vs_adjacent_ceiling", ratio_a);
        } else {
            report.metric(&format!("read_pages_adjacent_gib_per_s_{name}"), ra);
            report.metric(&format!("preadv_adjacent_gib_per_s_{name}"), ca);
            report.metric(&format!("read_pages_scattered_gib_per_s_{name}"), rs);
            report.metric(&format!("preadv_scattered_gib_per_s_{name}"), cs);
            report.metric(&format!("pread_one_buffer_gib_per_s_{name}"), pr);
        }
        ceilings.push((name, cs, pr));
        pages_table.row(&[
            if m >= 1 << 20 {
                format!("{} MiB", m >> 20)
            } else {
                format!("{} KiB", m >> 10)
            },
            format_value(ra),
            format_value(ca),
            format_value(ratio_a),
            format_value(rs),
            format_value(cs),
            format_value(ratio_s),
            format_value(pr),
        ]);
        ceil_points.push((f64::from(m) / 1024.0, cs));
    }
    report.table(pages_table);
    // The sweep's fall without any 9P: the kernel's own copy into a 4 MiB
    // destination against a 128 MiB one, on the same page layout.
    let at = |n: &str| ceilings.iter().find(|c| c.0 == n).map(|c| (c.1, c.2));
    if let (Some((c4, p4)), Some((c128, p128))) = (at("4m"), at("128m")) {
        report.metric("ceiling_scattered_4m_vs_128m", c4 / c128);
        report.metric("pread_one_buffer_4m_vs_128m", p4 / p128);
    }
    report.series(
        "msize_throughput",
        "preadv ceiling, scattered pages",
        ceil_points,
    );
    report.note(format!(
        "Tread into pages: the chain a Linux guest's zero-copy read sends (request, 11-byte Rread header \
         buffer, then 4 KiB data pages), its indirect table written once; preadv: the same pages as one \
         iovec each, 1024 per call, no walker and no 9P (the daemon merges adjacent pages into one \
         iovec, the adjacent preadv does not); scattered: the same pages in a fixed random order. \
         This machine's caches (sysfs, cpu0): L2 {}, L3 {}. A destination that fits the caches stays \
         there between requests, a larger one does not, and the ceiling falls with it.",
        cache_size(2),
        cache_size(3)
    ));

    // 4 KiB random reads, 64 in flight: pooled stacks vs no pool,
    // alternating.
    let nopool = start(dir.path(), coro_pool::Policy::NoPool, OffloadPolicy::Auto)?;
    let dur = Duration::from_millis(ctx.pick(1500, 200));
    let mut iops_pool = Vec::new();
    let mut iops_nopool = Vec::new();
    let mut lat_pool = Vec::new();
    for _ in 0..reps {
        let (i, lat) = random_4k(&pooled, file_len, 64, dur, false)?;
        iops_pool.push(i);
        lat_pool.extend(lat);
        iops_nopool.push(random_4k(&nopool, file_len, 64, dur, false)?.0);
    }
    let (p, n) = (median(&iops_pool), median(&iops_nopool));
    report.metric("iops_4k_pool", p);
    report.metric("iops_4k_nopool", n);
    report.metric("iops_pool_ratio", p / n);
    let mut iops = Table::new(
        "4 KiB random reads, 64 in flight: coroutine stack pool on vs off",
        &["stacks", "IOPS", "vs pool off"],
    );
    iops.row(&[
        "pooled (coro-pool, default policy)".to_string(),
        format_value(p),
        format_value(p / n),
    ])
    .row(&[
        "no pool (an mmap per coroutine)".to_string(),
        format_value(n),
        "1".to_string(),
    ]);
    report.table(iops);
    report.metric("p50_latency_us_4k", percentile(lat_pool.clone(), 0.5));
    report.metric("p99_latency_us_4k", percentile(lat_pool, 0.99));
    drop(nopool);

    // The same 4 KiB random reads, 64 in flight, on a packed ring against
    // the split ring, alternating on one daemon: the device's
    // packed walk, used-descriptor writes and event suppression against
    // the split ones, everything else equal.
    // An even number of rounds, each layout first in half of them, so
    // neither gains from going first or second.
    let mut iops_split = Vec::new();
    let mut iops_packed = Vec::new();
    let mut lat_packed = Vec::new();
    for round in 0..2 * reps.max(2) {
        for packed in [round % 2 == 1, round % 2 == 0] {
            let (i, lat) = random_4k(&pooled, file_len, 64, dur, packed)?;
            if packed {
                iops_packed.push(i);
                lat_packed.extend(lat);
            } else {
                iops_split.push(i);
            }
        }
    }
    let (sp, pk) = (median(&iops_split), median(&iops_packed));
    report.metric("iops_4k_split", sp);
    report.metric("iops_4k_packed", pk);
    report.metric("packed_vs_split_iops_4k", pk / sp);
    report.metric("p99_latency_us_4k_packed", percentile(lat_packed, 0.99));
    let mut rings = Table::new(
        "4 KiB random reads, 64 in flight: packed ring vs split ring",
        &["ring", "IOPS", "vs split"],
    );
    rings
        .row(&["split".to_string(), format_value(sp), "1".to_string()])
        .row(&[
            "packed (VIRTIO_F_RING_PACKED)".to_string(),
            format_value(pk),
            format_value(pk / sp),
        ]);
    report.table(rings);

    // The inline-vs-offload line: the same reads, cached reads inline on
    // the coroutine (Auto) vs every read on a worker (Always), one request
    // at a time, alternating; next to the bare copy of the same size (one
    // read(2) into guest memory), so the rest is the per-request cost of
    // the ring round trip (kick, wake-ups, used ring, call).
    let always = start(
        dir.path(),
        coro_pool::Policy::Bounded,
        OffloadPolicy::Always,
    )?;
    let mut line = Table::new(
        "inline vs offloaded cached reads (one request at a time, µs per request)",
        &[
            "read size",
            "inline µs",
            "offloaded µs",
            "hop µs",
            "hop share",
            "bare copy µs",
        ],
    );
    for size in [4u32 << 10, 64 << 10, 512 << 10, 1 << 20, 4 << 20] {
        // About 256 MiB per run (at least 500 requests), quick: 100 requests.
        let requests = ctx.pick(((256u64 << 20) / u64::from(size)).clamp(500, 20_000), 100);
        let total = u64::from(size) * requests;
        let m = size + IOHDRSZ;
        let mut gi = Vec::new();
        let mut go = Vec::new();
        let mut gc = Vec::new();
        for _ in 0..reps {
            gi.push(sequential(&pooled, m, total, file_len, false)?);
            go.push(sequential(&always, m, total, file_len, false)?);
            let rounds = requests.min(ctx.pick(2000, 100)) as usize;
            gc.push(pread_gib_per_s(
                &pooled,
                &big,
                file_len,
                size as usize,
                rounds,
            )?);
        }
        let us = |g: f64| f64::from(size) / GIB / g * 1e6;
        let (ui, uo, uc) = (us(median(&gi)), us(median(&go)), us(median(&gc)));
        line.row(&[
            format!("{} KiB", size >> 10),
            format_value(ui),
            format_value(uo),
            format_value(uo - ui),
            format!("{:.0}%", (uo - ui).max(0.0) / uo * 100.0),
            format_value(uc),
        ]);
        if size == 4 << 10 {
            report.metric("thread_hop_us", uo - ui);
            report.metric("inline_read_us_4k", ui);
        }
    }
    report.table(line);
    drop(always);

    // The floor of one vhost-user round trip, in the same rounds as a
    // Tgetattr and an inline 4 KiB Tread over vhost-user (alternating).
    // For where the time goes, Tgetattr also runs with every call inline
    // on the vring thread (OffloadPolicy::Never) in the same rounds. The
    // export is a local directory, so the default policy runs Tgetattr
    // inline too (Filesystem::metadata_is_local): the two should match,
    // and a gap would be a worker hop coming back.
    let never = start(dir.path(), coro_pool::Policy::Bounded, OffloadPolicy::Never)?;
    let mut floor = Vec::new();
    let mut getattr = Vec::new();
    let mut getattr_inline = Vec::new();
    let mut read4k = Vec::new();
    let n = ctx.pick(5000, 300);
    {
        let mut vmm = session(&pooled, 64 << 10, "big", OpenFlags::RDONLY)?;
        let mut inline_vmm = session(&never, 64 << 10, "big", OpenFlags::RDONLY)?;
        let getattr_frame = Tmessage::Getattr(Tgetattr {
            fid: 1,
            request_mask: GetattrMask::BASIC,
        })
        .encode_frame(10);
        let read_frame = Tmessage::Read(Tread {
            fid: 1,
            offset: 0,
            count: 4096,
        })
        .encode_frame(11);
        // Warm up the ring, the engine and the page cache.
        per_request_us(&mut vmm, &getattr_frame, 256, n / 10)?;
        per_request_us(&mut vmm, &read_frame, 4096 + IOHDRSZ, n / 10)?;
        per_request_us(&mut inline_vmm, &getattr_frame, 256, n / 10)?;
        for _ in 0..reps {
            floor.push(eventfd_round_trip_us(n)?);
            getattr.push(per_request_us(&mut vmm, &getattr_frame, 256, n)?);
            read4k.push(per_request_us(&mut vmm, &read_frame, 4096 + IOHDRSZ, n)?);
            getattr_inline.push(per_request_us(&mut inline_vmm, &getattr_frame, 256, n)?);
        }
    }
    drop(never);
    let (floor, getattr, read4k) = (median(&floor), median(&getattr), median(&read4k));
    let getattr_inline = median(&getattr_inline);
    report.metric("roundtrip_floor_us", floor);
    report.metric("getattr_vhost_us", getattr);
    report.metric("getattr_inline_vhost_us", getattr_inline);
    report.metric("getattr_inline_vs_floor", getattr_inline / floor);
    report.metric("read_4k_vhost_us", read4k);
    report.metric("getattr_vs_floor", getattr / floor);
    report.metric("read_4k_vs_floor", read4k / floor);
    let mut ft = Table::new(
        "per-request cost over vhost-user against the round-trip floor (one request at a time)",
        &["what", "µs", "vs floor"],
    );
    ft.row(&[
        "floor: eventfd kick to a thread in epoll_wait, eventfd back".to_string(),
        format_value(floor),
        "1".to_string(),
    ])
    .row(&[
        "Tgetattr".to_string(),
        format_value(getattr),
        format_value(getattr / floor),
    ])
    .row(&[
        "Tgetattr inline on the vring thread (OffloadPolicy::Never)".to_string(),
        format_value(getattr_inline),
        format_value(getattr_inline / floor),
    ])
    .row(&[
        "Tread 4 KiB, cached, inline".to_string(),
        format_value(read4k),
        format_value(read4k / floor),
    ]);
    report.table(ft);

    report.note(format!(
        "vhost-user part: in-process fake VMM over a real vhost-user socket and memfd guest memory, \
         {} MiB file in the page cache, 4 workers, queue size 1024; reads use 4 KiB indirect descriptors \
         (32768 of them at 128 MiB), writes one contiguous descriptor. Medians of {reps} runs.",
        file_len >> 20
    ));
    Ok(())
}
