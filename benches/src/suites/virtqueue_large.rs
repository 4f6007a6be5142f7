//! Suite `virtqueue-large`: the validating walk of a 32768-descriptor
//! indirect chain against virtio-queue's own `DescriptorChain` iteration of
//! the same chain, and `preadv` of a cached 128 MiB file into that chain
//! against a plain memcpy of the same amount into the same guest memory.

use std::error::Error;
use std::hint::black_box;
use std::os::unix::fs::FileExt;

use virtio_queue::{Queue, QueueT};
use virtqueue_large::mock::{guest_memory, Buf, Layout, MockDriver};
use virtqueue_large::{ChainLimits, ChainWalker};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use crate::harness::{alternate, format_value, time, Ctx, SuiteReport, SuiteResult, Table};

/// One-line description.
pub const ABOUT: &str =
    "32768-descriptor chain walk vs virtio-queue, preadv into a chain vs memcpy";
/// Ready to run.
pub const READY: bool = true;

const PAGE: usize = 4096;

/// Measures and reports the six metrics of issue #6.
pub fn run(ctx: &Ctx) -> SuiteResult {
    let descs: usize = ctx.pick(32768, 4096);
    let walks: usize = ctx.pick(40, 5);
    let bytes = descs * PAGE;

    let mem = guest_memory(bytes + (16 << 20));
    let mut driver = MockDriver::new(&mem, 256);
    let mut queue: Queue = driver.create_queue();
    let layout = driver.add_chain(Layout::Indirect, &vec![Buf::w(PAGE as u32); descs])?;
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
    ours()?;
    peer()?;
    let [walk_ns, vq_ns] = alternate(ctx.reps(), &mut [&mut ours, &mut peer])?;

    // A cached file of the chain's size.
    let file = tempfile::tempfile()?;
    let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    file.write_all_at(&data, 0)?;
    let mut sink = vec![0u8; bytes];
    file.read_exact_at(&mut sink, 0)?;
    drop(sink);
    queue.set_next_avail(0);
    let chain = walker.pop(&mut queue, &mem)?.ok_or("no chain")?;
    let (first, _, _) = layout.buffers[0];
    let region = mem.find_region(first).ok_or("no region")?;
    let dst = region.get_slice(MemoryRegionAddress(first.0 - region.start_addr().0), bytes)?;

    let mut preadv = || -> Result<f64, Box<dyn Error>> {
        let mut w = chain.writer();
        let (n, elapsed) = time(|| w.read_from_file_at(&file, bytes, 0));
        if n? != bytes {
            return Err("short preadv".into());
        }
        Ok(bytes as f64 / elapsed.as_secs_f64() / f64::from(1u32 << 30))
    };
    let mut memcpy = || -> Result<f64, Box<dyn Error>> {
        let ((), elapsed) = time(|| dst.copy_from(black_box(&data[..])));
        Ok(bytes as f64 / elapsed.as_secs_f64() / f64::from(1u32 << 30))
    };
    // The kernel's own limit: one pread into the same memory as one buffer.
    let mut pread = || -> Result<f64, Box<dyn Error>> {
        let ptr = dst.ptr_guard_mut().as_ptr();
        let (res, elapsed) = time(|| {
            let mut done = 0usize;
            while done < bytes {
                // SAFETY: `ptr` points at `bytes` bytes of mapped guest memory
                // (`dst`), which nothing else accesses during the call.
                let n = unsafe {
                    libc::pread(
                        std::os::fd::AsRawFd::as_raw_fd(&file),
                        ptr.add(done).cast(),
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
        Ok(bytes as f64 / elapsed.as_secs_f64() / f64::from(1u32 << 30))
    };
    // Fault in the destination and warm every path before timing.
    memcpy()?;
    pread()?;
    preadv()?;
    let [file_gib, pread_gib, memcpy_gib] =
        alternate(ctx.reps(), &mut [&mut preadv, &mut pread, &mut memcpy])?;
    // Guest memory really holds the file.
    let mut check = vec![0u8; 4096];
    vm_memory::Bytes::read_slice(
        &mem,
        &mut check,
        GuestAddress(first.0 + (bytes - 4096) as u64),
    )?;
    if check[..] != data[bytes - 4096..] {
        return Err("preadv data mismatch".into());
    }

    let mut walk_table = Table::new("chain walk", &["contender", "ns per descriptor"]);
    walk_table
        .row(&["virtqueue-large (validated)", &format_value(walk_ns)])
        .row(&["virtio-queue DescriptorChain", &format_value(vq_ns)]);
    let mut io_table = Table::new("128 MiB into a chain", &["contender", "GiB/s"]);
    io_table
        .row(&["preadv, IOV_MAX chunks", &format_value(file_gib)])
        .row(&[
            "pread into one buffer (kernel limit)",
            &format_value(pread_gib),
        ])
        .row(&["memcpy", &format_value(memcpy_gib)]);
    let mut report = SuiteReport::default();
    report
        .table(walk_table)
        .table(io_table)
        .metric("walk_ns_per_desc", walk_ns)
        .metric("virtio_queue_ns_per_desc", vq_ns)
        .metric("ratio_vs_virtio_queue", walk_ns / vq_ns)
        .metric("file_read_gib_per_s_128m", file_gib)
        .metric("memcpy_gib_per_s", memcpy_gib)
        .metric("ratio_vs_memcpy", file_gib / memcpy_gib)
        .metric("pread_one_buffer_gib_per_s", pread_gib)
        .metric("ratio_vs_pread", file_gib / pread_gib)
        .note(format!(
            "{descs}-descriptor indirect chain of 4 KiB buffers ({} MiB) on a 256-entry ring, \
             large policy. Walk: pop + full validation (bounds, limits, region lookup, segment \
             list) vs virtio-queue 0.18 pop + iteration (no buffer validation), {walks} pops per \
             sample. File: preadv of a page-cached tempfile, {} calls of at most 1024 iovecs, vs \
             one pread of the whole file into the same guest memory as one buffer (the \
             kernel's page-cache copy without iovecs), vs one memcpy into it. Median of {} alternating runs.",
            bytes >> 20,
            descs.div_ceil(1024),
            ctx.reps()
        ));
    Ok(report)
}
