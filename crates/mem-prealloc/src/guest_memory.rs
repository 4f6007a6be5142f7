//! Preallocation of vm-memory regions (feature `vm-memory`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vm_memory::bitmap::Bitmap;
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap};

use crate::error::Result;
use crate::job::{start, PreallocJob, PreallocReport};
use crate::options::{page_size_of, PreallocOptions};
use crate::sys;

/// `MAP_HUGE_SHIFT`/`MAP_HUGE_MASK` from <linux/mman.h>.
const MAP_HUGE_SHIFT: i32 = 26;
const MAP_HUGE_MASK: i32 = 0x3f;

/// The default hugepage size from `/proc/meminfo`.
fn default_hugepage_size() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("Hugepagesize:"))?;
    let kib: usize = line.split_ascii_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The page size of a region: the explicit option, else the hugetlbfs page
/// size of its file (`fstatfs`), else the `MAP_HUGE_*` size of an anonymous
/// `MAP_HUGETLB` mapping, else the base page size.
fn region_options<B: Bitmap>(
    region: &GuestRegionMmap<B>,
    options: &PreallocOptions,
) -> Result<PreallocOptions> {
    if options.page_size.is_some() {
        return Ok(options.clone());
    }
    if let Some(file_offset) = region.file_offset() {
        return Ok(options.clone().page_size(page_size_of(file_offset.file())?));
    }
    let flags = region.flags();
    if flags & libc::MAP_HUGETLB != 0 {
        let encoded = (flags >> MAP_HUGE_SHIFT) & MAP_HUGE_MASK;
        let size = if encoded != 0 {
            Some(1usize << encoded)
        } else {
            default_hugepage_size()
        };
        if let Some(size) = size {
            return Ok(options.clone().page_size(size));
        }
    }
    Ok(options.clone().page_size(sys::base_page_size()))
}

/// Starts preallocating one region in the background; the page size is
/// detected from the region unless the options give one.
///
/// The job does not borrow the region: keep the region mapped until the job
/// is joined (if it is unmapped early the job fails with
/// [`Error::NotMapped`](crate::Error::NotMapped); nothing unsound happens).
pub fn start_region<B: Bitmap>(
    region: &GuestRegionMmap<B>,
    options: &PreallocOptions,
) -> Result<PreallocJob> {
    let options = region_options(region, options)?;
    start(region.as_ptr(), region.size(), &options)
}

/// Preallocates one region and waits for it.
pub fn preallocate_region<B: Bitmap>(
    region: &GuestRegionMmap<B>,
    options: &PreallocOptions,
) -> Result<PreallocReport> {
    start_region(region, options)?.join()
}

/// Preallocates every region of `memory`, one after the other (each region
/// uses all the workers), and returns one report per region in region order.
///
/// The progress callback, if any, sees the bytes done across all regions, so
/// it stays monotonic and ends at the total size of the guest memory. The
/// first error stops the remaining regions.
pub fn preallocate_guest_memory<B: Bitmap>(
    memory: &GuestMemoryMmap<B>,
    options: &PreallocOptions,
) -> Result<Vec<PreallocReport>> {
    let base = Arc::new(AtomicU64::new(0));
    let mut reports = Vec::with_capacity(memory.num_regions());
    for region in memory.iter() {
        let mut region_opts = options.clone();
        if let Some(callback) = options.progress.clone() {
            let base = Arc::clone(&base);
            region_opts =
                region_opts.progress(move |done| callback(base.load(Ordering::Acquire) + done));
        }
        let report = preallocate_region(region, &region_opts)?;
        base.fetch_add(report.bytes, Ordering::AcqRel);
        reports.push(report);
    }
    Ok(reports)
}
