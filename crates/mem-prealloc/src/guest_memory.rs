// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Preallocation of vm-memory regions (feature `vm-memory`).
//!
//! - [`preallocate_guest_memory`] / [`start_guest_memory`]: every region of
//!   a `GuestMemoryMmap` at once, with one pool of workers.
//! - [`preallocate_region`] / [`start_region`]: one `GuestRegionMmap`.
//! - [`preallocate_mmap_region`] / [`start_mmap_region`]: a raw
//!   `MmapRegion`, for VMMs (cloud-hypervisor) that prefault a region before
//!   they wrap it in a `GuestRegionMmap`.
//!
//! These functions take vm-memory's types on purpose: that is what the
//! feature is for. vm-memory is then a public dependency of this module, and
//! a breaking vm-memory release is a breaking release of this crate.

use vm_memory::bitmap::Bitmap;
use vm_memory::mmap::MmapRegion;
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestRegionMmap};

use crate::error::Result;
use crate::job::{start, start_regions, PreallocJob, PreallocJobs, PreallocReport, Region};
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
fn region_page_size<B: Bitmap>(region: &MmapRegion<B>, options: &PreallocOptions) -> Result<usize> {
    if let Some(size) = options.page_size {
        return Ok(size);
    }
    if let Some(file_offset) = region.file_offset() {
        return page_size_of(file_offset.file());
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
            return Ok(size);
        }
    }
    Ok(sys::base_page_size())
}

/// The [`Region`] of an `MmapRegion`, with its detected page size.
///
/// # Safety
///
/// `region` stays mapped while a job over the result runs.
unsafe fn region_of<B: Bitmap>(
    region: &MmapRegion<B>,
    options: &PreallocOptions,
) -> Result<Region> {
    // SAFETY: an `MmapRegion` is writable RAM owned by its holder, who
    // keeps it mapped for the job's life (this function's contract).
    let r = unsafe { Region::new(region.as_ptr(), region.size()) };
    Ok(r.page_size(region_page_size(region, options)?))
}

/// Starts preallocating a raw `MmapRegion` in the background; the page size
/// is detected from the region unless the options give one.
///
/// If the region is only unmapped early, the job fails with
/// [`Error::NotMapped`](crate::Error::NotMapped).
///
/// # Safety
///
/// The job does not borrow the region: keep it mapped (do not drop the
/// region or the guest memory holding it) until the job is joined or
/// dropped, or its addresses could be reused by another mapping that the
/// workers then fault in; see [`start`](crate::start()). The blocking
/// `preallocate_*` functions hold the borrow until the job ends and are
/// safe.
pub unsafe fn start_mmap_region<B: Bitmap>(
    region: &MmapRegion<B>,
    options: &PreallocOptions,
) -> Result<PreallocJob> {
    let options = options
        .clone()
        .page_size(region_page_size(region, options)?);
    // SAFETY: an `MmapRegion` is writable RAM, kept mapped for the job's
    // life by the caller (this function's contract).
    unsafe { start(region.as_ptr(), region.size(), &options) }
}

/// Preallocates a raw `MmapRegion` and waits for it: what a VMM that
/// prefaults its regions before building the guest memory calls.
pub fn preallocate_mmap_region<B: Bitmap>(
    region: &MmapRegion<B>,
    options: &PreallocOptions,
) -> Result<PreallocReport> {
    // SAFETY: the region stays borrowed until the job is joined.
    unsafe { start_mmap_region(region, options) }?.join()
}

/// Starts preallocating one guest region in the background; see
/// [`start_mmap_region`].
///
/// # Safety
///
/// The job does not borrow the region: keep it mapped (do not drop the
/// region or the guest memory holding it) until the job is joined or
/// dropped, or its addresses could be reused by another mapping that the
/// workers then fault in; see [`start`](crate::start()). The blocking
/// `preallocate_*` functions hold the borrow until the job ends and are
/// safe.
pub unsafe fn start_region<B: Bitmap>(
    region: &GuestRegionMmap<B>,
    options: &PreallocOptions,
) -> Result<PreallocJob> {
    // SAFETY: the caller keeps the region mapped (this function's contract).
    unsafe { start_mmap_region(region, options) }
}

/// Preallocates one guest region and waits for it.
pub fn preallocate_region<B: Bitmap>(
    region: &GuestRegionMmap<B>,
    options: &PreallocOptions,
) -> Result<PreallocReport> {
    // SAFETY: the region stays borrowed until the job is joined.
    unsafe { start_region(region, options) }?.join()
}

/// Starts preallocating every region of `memory` at once with one pool of
/// workers (see [`start_regions`]); joining gives one result per region, in
/// region order. The progress callback sees the bytes done over all regions.
///
/// # Safety
///
/// The job does not borrow the region: keep it mapped (do not drop the
/// region or the guest memory holding it) until the job is joined or
/// dropped, or its addresses could be reused by another mapping that the
/// workers then fault in; see [`start`](crate::start()). The blocking
/// `preallocate_*` functions hold the borrow until the job ends and are
/// safe.
pub unsafe fn start_guest_memory<B: Bitmap>(
    memory: &GuestMemoryMmap<B>,
    options: &PreallocOptions,
) -> Result<PreallocJobs> {
    let regions = memory
        .iter()
        // SAFETY: the caller keeps the memory mapped (this function's
        // contract).
        .map(|region| unsafe { region_of(region, options) })
        .collect::<Result<Vec<_>>>()?;
    start_regions(&regions, options)
}

/// Preallocates every region of `memory` at once (the thread budget of the
/// options is spread over all regions, which fill up side by side) and
/// returns one report per region in region order.
///
/// The progress callback, if any, sees the bytes done across all regions, so
/// it stays monotonic and ends at the total size of the guest memory. A
/// failing region does not stop the others: every region is finished (or
/// failed) before the first error, in region order, is returned. Use
/// [`start_guest_memory`] for every region's own result.
pub fn preallocate_guest_memory<B: Bitmap>(
    memory: &GuestMemoryMmap<B>,
    options: &PreallocOptions,
) -> Result<Vec<PreallocReport>> {
    // SAFETY: the memory stays borrowed until the jobs are joined.
    unsafe { start_guest_memory(memory, options) }?
        .join()
        .into_iter()
        .collect()
}
