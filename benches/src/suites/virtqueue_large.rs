// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Suite `virtqueue-large`: the validating walk of a 32768-descriptor
//! indirect chain against virtio-queue's own `DescriptorChain` iteration of
//! the same chain, and `preadv` of a cached 128 MiB file into that chain
//! against a plain memcpy of the same amount into the same guest memory.

use std::error::Error;
use std::hint::black_box;
use std::os::unix::fs::FileExt;

use virtio_queue::{Queue, QueueT};
use virtqueue_large::mock::{guest_memory, Buf, Layout, MockDriver, MockPackedDriver};
use virtqueue_large::{ChainLimits, ChainWalker, DeviceRing, PackedQueue};
use vm_memory::GuestMemoryMmap;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use crate::harness::{
    alternate, format_value, time, with_file_mapped, Ctx, SuiteReport, SuiteResult, Table,
};

/// One-line description.
pub const ABOUT: &str =
    "32768-descriptor chain walk (split and packed) vs virtio-queue, preadv into a chain vs memcpy";
/// Ready to run.
pub const READY: bool = true;

const PAGE: usize = 4096;
/// File I/O samples are short: they run this many times the usual repetitions.
const FILE_REPS_FACTOR: usize = 3;

/// Measures and reports the suite's metrics: walk cost against
/// virtio-queue, file I/O against memcpy and the kernel's ceilings.
pub fn run(ctx: &Ctx) -> SuiteResult {
    let descs: usize = ctx.pick(32768, 4096);
    let walks: usize = ctx.pick(40, 5);
    let bytes = descs * PAGE;

    let mem = guest_memory(bytes + (16 << 20));
    let mut driver = MockDriver::new(&mem, 256);
    let mut queue: Queue = driver.create_queue();
    driver.add_chain(Layout::Indirect, &vec![Buf::w(PAGE as u32); descs])?;
    let mut walker = ChainWalker::new(ChainLimits::large())?;

    // Both contenders pop the same chain from the same queue and rewind.
    let mut ours = || -> Result<f64, Box<dyn Error>> {
        let (total, elapsed) = time(|| -> Result<u64, Box<dyn Error>> {
            let mut total = 0u64;
            for _ in 0..walks {
                queue.set_next_avail(0);
                let chain = walker.pop(&mut queue, &mem)?.ok_or("no chain")?;
                total += u64::from(black_box(&chain).writable_len());
            }
            Ok(total)
        });
        if total? != (walks * bytes) as u64 {
            return Err("walk lost bytes".into());
        }
        Ok(elapsed.as_nanos() as f64 / (walks * descs) as f64)
    };
    let mut queue_vq: Queue = driver.create_queue();
    let mut peer = || -> Result<f64, Box<dyn Error>> {
        let (total, elapsed) = time(|| -> Result<u64, Box<dyn Error>> {
            let mut total = 0u64;
            for _ in 0..walks {
                queue_vq.set_next_avail(0);
                let chain = queue_vq.pop_descriptor_chain(&mem).ok_or("no chain")?;
                for d in chain {
                    total += u64::from(black_box(d).len());
                }
            }
            Ok(total)
        });
        if total? != (walks * bytes) as u64 {
            return Err("virtio-queue iteration lost bytes".into());
        }
        Ok(elapsed.as_nanos() as f64 / (walks * descs) as f64)
    };
    // The same chain as one direct chain on a ring of its size (split),
    // and both layouts on packed rings.
    let mem_direct = guest_memory(bytes + (16 << 20));
    let mut driver_direct = MockDriver::new(&mem_direct, descs as u16);
    let mut queue_direct: Queue = driver_direct.create_queue();
    driver_direct.add_chain(Layout::Direct, &vec![Buf::w(PAGE as u32); descs])?;
    let mut walker_direct = ChainWalker::new(ChainLimits::large())?;
    let mut split_direct = || -> Result<f64, Box<dyn Error>> {
        let (total, elapsed) = time(|| -> Result<u64, Box<dyn Error>> {
            let mut total = 0u64;
            for _ in 0..walks {
                queue_direct.set_next_avail(0);
                let chain = walker_direct
                    .pop(&mut queue_direct, &mem_direct)?
                    .ok_or("no chain")?;
                total += u64::from(black_box(&chain).writable_len());
            }
            Ok(total)
        });
        if total? != (walks * bytes) as u64 {
            return Err("split direct walk lost bytes".into());
        }
        Ok(elapsed.as_nanos() as f64 / (walks * descs) as f64)
    };
    let mem_pd = guest_memory(bytes + (16 << 20));
    let mut driver_pd = MockPackedDriver::new(&mem_pd, descs as u16);
    let mut queue_pd = driver_pd.create_queue();
    driver_pd.add_chain(Layout::Direct, &vec![Buf::w(PAGE as u32); descs])?;
    let mem_pi = guest_memory(bytes + (16 << 20));
    let mut driver_pi = MockPackedDriver::new(&mem_pi, 256);
    let mut queue_pi = driver_pi.create_queue();
    driver_pi.add_chain(Layout::Indirect, &vec![Buf::w(PAGE as u32); descs])?;
    let mut packed_walker = ChainWalker::new(ChainLimits::large())?;
    let start_pd = queue_pd.ring_base();
    let mut packed_direct = || {
        packed_walk(
            &mut packed_walker,
            &mut queue_pd,
            start_pd,
            &mem_pd,
            walks,
            descs,
        )
    };
    let mut packed_walker_i = ChainWalker::new(ChainLimits::large())?;
    let start_pi = queue_pi.ring_base();
    let mut packed_indirect = || {
        packed_walk(
            &mut packed_walker_i,
            &mut queue_pi,
            start_pi,
            &mem_pi,
            walks,
            descs,
        )
    };

    ours()?;
    peer()?;
    split_direct()?;
    packed_direct()?;
    packed_indirect()?;
    let [walk_ns, vq_ns, split_direct_ns, packed_direct_ns, packed_indirect_ns] = alternate(
        ctx.reps(),
        &mut [
            &mut ours,
            &mut peer,
            &mut split_direct,
            &mut packed_direct,
            &mut packed_indirect,
        ],
    )?;

    drop(driver);
    drop(mem);
    drop((driver_direct, driver_pd, driver_pi));
    drop((mem_direct, mem_pd, mem_pi));

    // A cached file of the chain's size (ext4 keeps it in large folios).
    let file = tempfile::tempfile()?;
    let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    file.write_all_at(&data, 0)?;
    let mut sink = vec![0u8; bytes];
    file.read_exact_at(&mut sink, 0)?;
    drop(sink);
    let small = file_io(ctx, &file, &data, Backing::SmallPages)?;
    let thp = file_io(ctx, &file, &data, Backing::Thp)?;
    let mut walk_table = Table::new("chain walk", &["contender", "ns per descriptor"]);
    walk_table
        .row(&["virtqueue-large (validated)", &format_value(walk_ns)])
        .row(&["virtio-queue DescriptorChain", &format_value(vq_ns)])
        .row(&[
            "virtqueue-large split, direct (32768-entry ring)",
            &format_value(split_direct_ns),
        ])
        .row(&[
            "virtqueue-large packed, direct (32768-entry ring)",
            &format_value(packed_direct_ns),
        ])
        .row(&[
            "virtqueue-large packed, indirect (256-entry ring)",
            &format_value(packed_indirect_ns),
        ]);
    let io_title = format!("{} MiB from a cached file into guest memory", bytes >> 20);
    let mut io_table = Table::new(
        &io_title,
        &["contender", "4 KiB pages, GiB/s", "THP, GiB/s"],
    );
    for (i, name) in IoFigures::NAMES.iter().enumerate() {
        io_table.row(&[
            name.to_string(),
            format_value(small.all()[i]),
            format_value(thp.all()[i]),
        ]);
    }
    let mut report = SuiteReport::default();
    report
        .table(walk_table)
        .table(io_table)
        .metric("walk_ns_per_desc", walk_ns)
        .metric("virtio_queue_ns_per_desc", vq_ns)
        .metric("ratio_vs_virtio_queue", walk_ns / vq_ns)
        .metric("split_direct_ns_per_desc", split_direct_ns)
        .metric("packed_direct_ns_per_desc", packed_direct_ns)
        .metric("packed_indirect_ns_per_desc", packed_indirect_ns)
        .metric("packed_vs_split_direct", packed_direct_ns / split_direct_ns)
        .metric("packed_vs_split_indirect", packed_indirect_ns / walk_ns)
        .metric("file_read_gib_per_s_128m", small.scattered)
        .metric("memcpy_gib_per_s", small.memcpy)
        .metric("ratio_vs_memcpy", small.scattered / small.memcpy)
        .metric("pread_one_buffer_gib_per_s", small.pread)
        .metric("ratio_vs_pread", small.scattered / small.pread)
        .metric("pread_ceiling_vs_memcpy", small.pread / small.memcpy)
        .metric("file_read_adjacent_gib_per_s", small.adjacent)
        .metric("adjacent_ratio_vs_memcpy", small.adjacent / small.memcpy)
        .metric("rep_movsb_gib_per_s", small.rep_movsb)
        .metric("pread_vs_rep_movsb", small.pread / small.rep_movsb)
        .metric("mmap_copy_gib_per_s", small.mmap_copy)
        .metric("thp_file_read_gib_per_s", thp.scattered)
        .metric("thp_memcpy_gib_per_s", thp.memcpy)
        .metric("thp_ratio_vs_memcpy", thp.scattered / thp.memcpy)
        .metric("thp_pread_ceiling_vs_memcpy", thp.pread / thp.memcpy)
        .metric("thp_backed_mib", thp.huge_mib)
        .note(format!(
            "{descs}-descriptor indirect chain of 4 KiB buffers ({} MiB) on a 256-entry ring, \
             large policy. Walk: pop + full validation (bounds, limits, region lookup, segment \
             list) vs virtio-queue 0.18 pop + iteration (no buffer validation), {walks} pops per \
             sample. Split direct: the same chain as one direct chain on a \
             32768-entry split ring. Packed: the same chain direct on a 32768-entry \
             packed ring and indirect on a 256-entry one, pop_chain with full validation \
             (wrap counters, buffer id, in-flight table), each pop timed alone (the ring-base \
             rewind between pops, which clears the in-flight table, is not counted). File: preadv of a page-cached tempfile into the chain. Scattered: the \
             buffers sit at shuffled guest pages (no two consecutive descriptors adjacent), so \
             every call carries 1024 iovecs of 4 KiB ({} calls); this is the headline figure. \
             Adjacent: the same chain over consecutive pages, which the Writer merges into one \
             iovec. Peers into the same guest memory: one pread of the whole file as one buffer \
             (the kernel's page-cache copy without iovecs, the ceiling of any iovec strategy); \
             one memcpy (glibc switches to non-temporal stores above its \
             x86_non_temporal_threshold, see `ld.so --list-tunables`); one user-space `rep \
             movsb` (the instruction the kernel's copy_to_user runs); and a memcpy from a fresh \
             MAP_POPULATE mapping of the file (faster than any read system call, but a \
             concurrent truncate turns it into SIGBUS, so a device must not use it on files a \
             guest can shrink). 4 KiB pages: guest memory with MADV_NOHUGEPAGE; THP: with \
             MADV_HUGEPAGE as QEMU does ({:.0} MiB huge-page backed). Medians of {} alternating \
             runs (walk) and {} (file).",
            bytes >> 20,
            descs.div_ceil(1024),
            thp.huge_mib,
            ctx.reps(),
            FILE_REPS_FACTOR * ctx.reps()
        ));
    Ok(report)
}

/// ns per descriptor of `walks` pops of the one chain on a packed queue,
/// each pop timed alone; the queue is rewound to the ring base `start`
/// before each pop.
fn packed_walk(
    walker: &mut ChainWalker,
    queue: &mut PackedQueue,
    start: u32,
    mem: &GuestMemoryMmap,
    walks: usize,
    descs: usize,
) -> Result<f64, Box<dyn Error>> {
    let mut elapsed = std::time::Duration::ZERO;
    let mut total = 0u64;
    for _ in 0..walks {
        queue.set_ring_base(start)?;
        let (chain, t) = time(|| queue.pop_chain(walker, mem));
        elapsed += t;
        let chain = chain?.ok_or("no packed chain")?;
        total += u64::from(black_box(&chain).writable_len());
    }
    if total != (walks * descs * PAGE) as u64 {
        return Err("packed walk lost bytes".into());
    }
    Ok(elapsed.as_nanos() as f64 / (walks * descs) as f64)
}

/// How the guest memory of a file I/O run is backed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Backing {
    /// MADV_NOHUGEPAGE: 4 KiB pages whatever the system THP setting.
    SmallPages,
    /// MADV_HUGEPAGE, as QEMU does for anonymous guest RAM.
    Thp,
}

/// GiB/s of each contender moving the file into one guest memory.
struct IoFigures {
    scattered: f64,
    adjacent: f64,
    pread: f64,
    memcpy: f64,
    rep_movsb: f64,
    mmap_copy: f64,
    /// Anonymous huge pages in the process after the run, MiB.
    huge_mib: f64,
}

impl IoFigures {
    const NAMES: [&'static str; 6] = [
        "preadv, scattered pages (1024 iovecs per call)",
        "preadv, adjacent pages (merged into one iovec)",
        "pread into one buffer (kernel ceiling)",
        "memcpy (glibc)",
        "rep movsb (what copy_to_user runs)",
        "mmap + MAP_POPULATE + memcpy (not used: SIGBUS if the file shrinks)",
    ];

    fn all(&self) -> [f64; 6] {
        [
            self.scattered,
            self.adjacent,
            self.pread,
            self.memcpy,
            self.rep_movsb,
            self.mmap_copy,
        ]
    }
}

fn gib_per_s(bytes: usize, elapsed: std::time::Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64() / f64::from(1u32 << 30)
}

/// `AnonHugePages` of this process, in MiB.
fn anon_huge_mib() -> f64 {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("AnonHugePages:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Copies `len` bytes with `rep movsb` (x86-64), or `ptr::copy` elsewhere.
///
/// # Safety
///
/// `src` and `dst` must be valid for `len` bytes and must not overlap.
unsafe fn rep_movsb(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller guarantees both ranges are valid and disjoint; the
    // direction flag is clear per the ABI, and the registers are declared.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rdi") dst => _,
            inout("rsi") src => _,
            inout("rcx") len => _,
            options(nostack, preserves_flags)
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as above.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len);
    }
}

/// The file I/O contenders on guest memory backed as `backing`: two chains
/// of the file's size (scattered and adjacent pages) in one memory.
fn file_io(
    ctx: &Ctx,
    file: &std::fs::File,
    data: &[u8],
    backing: Backing,
) -> Result<IoFigures, Box<dyn Error>> {
    let bytes = data.len();
    let descs = bytes / PAGE;
    let mem = guest_memory(2 * bytes + (16 << 20));
    let host = mem.get_host_address(GuestAddress(0))?;
    let advice = match backing {
        Backing::SmallPages => libc::MADV_NOHUGEPAGE,
        Backing::Thp => libc::MADV_HUGEPAGE,
    };
    // SAFETY: madvise on the one mapping of `mem`, which is still untouched
    // apart from the ring pages the driver writes later; the advice changes
    // no contents.
    let rc = unsafe { libc::madvise(host.cast(), mem.last_addr().0 as usize + 1, advice) };
    if rc != 0 {
        return Err(format!("madvise: {}", std::io::Error::last_os_error()).into());
    }
    let mut driver = MockDriver::new(&mem, 256);
    let mut queue: Queue = driver.create_queue();
    let bufs = vec![Buf::w(PAGE as u32); descs];
    let scattered_layout = driver.add_chain_scattered(Layout::Indirect, &bufs, 0x9e37_79b9)?;
    let adjacent_layout = driver.add_chain(Layout::Indirect, &bufs)?;
    let mut walker = ChainWalker::new(ChainLimits::large())?;
    let scattered = walker.pop(&mut queue, &mem)?.ok_or("no chain")?;
    let adjacent = walker.pop(&mut queue, &mem)?.ok_or("no chain")?;
    // The scattered chain's pages form one block: the peers' destination.
    let first = scattered_layout
        .buffers
        .iter()
        .map(|b| b.0)
        .min()
        .ok_or("empty chain")?;
    let region = mem.find_region(first).ok_or("no region")?;
    let dst = region.get_slice(MemoryRegionAddress(first.0 - region.start_addr().0), bytes)?;
    let dst_ptr = dst.ptr_guard_mut().as_ptr();
    let fd = std::os::fd::AsRawFd::as_raw_fd(file);

    let preadv = |chain: &virtqueue_large::Chain<&vm_memory::GuestMemoryMmap>| {
        let mut w = chain.writer();
        let (n, elapsed) = time(|| w.read_from_file_at(file, bytes, 0));
        if n? != bytes {
            return Err::<f64, Box<dyn Error>>("short preadv".into());
        }
        Ok(gib_per_s(bytes, elapsed))
    };
    let mut scattered_run = || preadv(&scattered);
    let mut adjacent_run = || preadv(&adjacent);
    let mut memcpy = || -> Result<f64, Box<dyn Error>> {
        let ((), elapsed) = time(|| dst.copy_from(black_box(data)));
        Ok(gib_per_s(bytes, elapsed))
    };
    let mut rep = || -> Result<f64, Box<dyn Error>> {
        // SAFETY: `dst_ptr` points at `bytes` bytes of mapped guest memory
        // (`dst`) that nothing else accesses during the copy, and `data` is
        // a separate heap buffer of `bytes` bytes.
        let ((), elapsed) = time(|| unsafe { rep_movsb(dst_ptr, black_box(data).as_ptr(), bytes) });
        Ok(gib_per_s(bytes, elapsed))
    };
    let mut pread = || -> Result<f64, Box<dyn Error>> {
        let (res, elapsed) = time(|| {
            let mut done = 0usize;
            while done < bytes {
                // SAFETY: `dst_ptr` points at `bytes` bytes of mapped guest
                // memory (`dst`), which nothing else accesses during the call.
                let n = unsafe {
                    libc::pread(
                        fd,
                        dst_ptr.add(done).cast(),
                        bytes - done,
                        done as libc::off_t,
                    )
                };
                if n <= 0 {
                    return Err(std::io::Error::last_os_error());
                }
                done += n as usize;
            }
            Ok(done)
        });
        res?;
        Ok(gib_per_s(bytes, elapsed))
    };
    // Copying from a mapping of the page cache in user space: what a
    // device could do instead of pread, were a concurrent truncate not a
    // SIGBUS. Mapping, population and unmapping are timed.
    let mut mmap_copy = || -> Result<f64, Box<dyn Error>> {
        let (res, elapsed) = time(|| {
            // SAFETY: a private temporary file of `bytes` bytes that nothing
            // writes or truncates during the copy.
            unsafe { with_file_mapped(fd, bytes, 0, |src| dst.copy_from(src)) }
        });
        res?;
        Ok(gib_per_s(bytes, elapsed))
    };
    // Fault in the destinations and warm every path before timing.
    for run in [
        &mut memcpy as &mut dyn FnMut() -> Result<f64, Box<dyn Error>>,
        &mut adjacent_run,
        &mut pread,
        &mut rep,
        &mut mmap_copy,
        &mut scattered_run,
    ] {
        run()?;
    }
    // Each sample is a few tens of milliseconds and this machine is noisy:
    // three times the usual repetitions for steadier medians.
    let [scattered_gib, adjacent_gib, pread_gib, memcpy_gib, rep_gib, mmap_gib] = alternate(
        FILE_REPS_FACTOR * ctx.reps(),
        &mut [
            &mut scattered_run,
            &mut adjacent_run,
            &mut pread,
            &mut memcpy,
            &mut rep,
            &mut mmap_copy,
        ],
    )?;
    // Guest memory really holds the file, through both chains (cleared
    // first: the peers wrote the same bytes into the scattered block).
    let zeros = vec![0u8; bytes];
    dst.copy_from(&zeros[..]);
    vm_memory::Bytes::write_slice(&mem, &zeros, adjacent_layout.buffers[0].0)?;
    scattered_run()?;
    adjacent_run()?;
    if driver.read_writable(&scattered_layout)? != data {
        return Err("preadv data mismatch (scattered)".into());
    }
    if driver.read_writable(&adjacent_layout)? != data {
        return Err("preadv data mismatch (adjacent)".into());
    }
    let huge_mib = anon_huge_mib();
    Ok(IoFigures {
        scattered: scattered_gib,
        adjacent: adjacent_gib,
        pread: pread_gib,
        memcpy: memcpy_gib,
        rep_movsb: rep_gib,
        mmap_copy: mmap_gib,
        huge_mib,
    })
}
