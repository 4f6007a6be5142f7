// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A fake VMM for tests and benchmarks (feature `test-utils`): it connects
//! to a vhost-user backend with `vhost::vhost_user::Frontend`, shares a
//! memfd as guest memory, and plays the virtio driver on a split or a
//! packed ring ([`VmmOptions::packed`]): direct and indirect chains,
//! event-idx, and malformed chains. The rings are laid out, published and
//! read back by virtqueue-large's `MockDriver` and `MockPackedDriver`
//! through their common `MockRing`, the one driver-side ring
//! implementation of the workspace; the fake VMM adds
//! the vhost-user control path, its own buffer allocation and 9P calls.

use std::any::Any;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags,
    VhostUserHeaderFlag, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserDirtyLogRegion, VhostUserMemoryRegionInfo, VringConfigData};

use crate::protocol::{
    OpenFlags, Rmessage, Tattach, Tlopen, Tmessage, Tversion, Twalk, NOFID, NOTAG, VERSION_9P2000_L,
};
use virtio_bindings::virtio_config::VIRTIO_F_RING_PACKED;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtqueue_large::mock::{
    self as ring_mock, Buf, MockDriver, MockPackedDriver, MockRing, UsedEntry,
};
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Descriptor flag: the chain continues.
pub const DESC_F_NEXT: u16 = ring_mock::F_NEXT;
/// Descriptor flag: device-writable.
pub const DESC_F_WRITE: u16 = ring_mock::F_WRITE;
/// Descriptor flag: an indirect table.
pub const DESC_F_INDIRECT: u16 = ring_mock::F_INDIRECT;

/// Where the buffers of [`FakeVmm::alloc`] start: past the rings of the
/// largest queue (the mock drivers lay them out from guest address 0).
const DATA_START: u64 = 0x20_0000;

type Mem = GuestMemoryMmap<()>;

/// The driver side of the ring: virtqueue-large's `MockDriver` or
/// `MockPackedDriver` ([`VmmOptions::packed`]), owning the guest memory.
/// The fake VMM uses it only through [`MockRing`]; `Any` lets
/// [`FakeVmm::split_driver`] and [`FakeVmm::packed_driver`] hand out the
/// concrete mock for layout-specific patterns.
trait Driver: MockRing<Memory = Mem> + Any + Send {}

impl<T: MockRing<Memory = Mem> + Any + Send> Driver for T {}

/// Settings of a [`FakeVmm`]. Build one from [`VmmOptions::default`] and
/// set the fields that differ: the struct is `#[non_exhaustive]`.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct VmmOptions {
    /// Guest memory size in bytes (at least 4 MiB).
    pub mem_size: u64,
    /// Queue size (a power of two up to 32768).
    pub queue_size: u16,
    /// Negotiate `VIRTIO_RING_F_EVENT_IDX`.
    pub event_idx: bool,
    /// Negotiate `VIRTIO_RING_F_INDIRECT_DESC`.
    pub indirect: bool,
    /// Negotiate `VIRTIO_F_RING_PACKED` and drive a packed ring (buffer
    /// ids instead of head indices); otherwise the feature is declined
    /// and the ring is split.
    pub packed: bool,
    /// Split guest RAM into two memory regions (two mappings in the
    /// daemon) as a VMM does around its PCI hole: `Some((at, hole))` puts
    /// the first `at` bytes at guest address 0 and the rest at
    /// `at + hole` (`hole` 0: two adjacent regions). `at` must lie past
    /// the ring area (2 MiB) and be page aligned. The bump allocator
    /// ([`FakeVmm::alloc`]) only hands out the first region.
    pub split: Option<(u64, u64)>,
}

impl Default for VmmOptions {
    fn default() -> Self {
        VmmOptions {
            mem_size: 64 << 20,
            queue_size: 1024,
            event_idx: true,
            indirect: true,
            split: None,
            packed: false,
        }
    }
}

/// How a request's buffers are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// One descriptor for the request, one for the reply, in the ring.
    Direct,
    /// One indirect table; the reply is cut into descriptors of at most
    /// `seg` bytes (4096 gives 32768 descriptors for 128 MiB).
    Indirect {
        /// Bytes per reply descriptor.
        seg: u32,
    },
    /// A direct chain in the ring, as a driver without indirect
    /// descriptors sends it (a Linux guest under crosvm): one descriptor
    /// for the request, the reply cut into descriptors of at most `seg`
    /// bytes, all taken from the ring's free list.
    Chain {
        /// Bytes per reply descriptor.
        seg: u32,
    },
}

/// A request handed to the device.
#[derive(Debug, Clone, Copy)]
pub struct Submitted {
    /// The chain's head index (split) or buffer id (packed): what the
    /// used ring names it by.
    pub head: u16,
    /// Guest address of the request (contiguous).
    pub request_addr: u64,
    /// Guest address of the reply buffer (contiguous).
    pub reply_addr: u64,
    /// Its length.
    pub reply_len: u32,
}

/// Errors of the fake VMM (tests unwrap them).
pub type MockResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The fake VMM. See the module docs.
pub struct FakeVmm {
    frontend: Frontend,
    driver: Box<dyn Driver>,
    opts: VmmOptions,
    features: u64,
    kick: EventFd,
    call: EventFd,
    /// Ring descriptors taken by [`FakeVmm::take_desc`] for the raw chain
    /// the next [`FakeVmm::push_avail`] publishes.
    raw: Vec<u16>,
    bump: u64,
    /// Frontend virtual address of guest address 0.
    host: u64,
    /// Submitted chains by head, widened to the `id` of a [`UsedEntry`].
    pending: HashMap<u32, Submitted>,
    /// The ring base as QEMU knows it: the last one sent with
    /// SET_VRING_BASE or read with GET_VRING_BASE.
    known_base: u16,
    /// The dirty-page log ([`FakeVmm::start_dirty_log`]).
    log: Option<File>,
}

impl std::fmt::Debug for FakeVmm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeVmm").field("opts", &self.opts).finish()
    }
}

fn memfd(size: u64) -> MockResult<File> {
    // SAFETY: memfd_create with a static NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"fake-vmm-ram".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: a fresh fd we own.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(size)?;
    Ok(f)
}

impl FakeVmm {
    /// Connects to the backend socket at `path` and sets the device up:
    /// features, memory table, one queue, kick/call eventfds, enable.
    /// Retries the connection for up to 10 s (the daemon may be starting).
    pub fn connect(path: &Path, opts: VmmOptions) -> MockResult<FakeVmm> {
        let (mut frontend, offered) = open_frontend(path)?;
        let mut features = offered;
        if opts.packed && features & (1 << VIRTIO_F_RING_PACKED) == 0 {
            return Err("the device does not offer VIRTIO_F_RING_PACKED".into());
        }
        if !opts.packed {
            features &= !(1 << VIRTIO_F_RING_PACKED);
        }
        if !opts.event_idx {
            features &= !(1 << VIRTIO_RING_F_EVENT_IDX);
        }
        if !opts.indirect {
            features &= !(1 << VIRTIO_RING_F_INDIRECT_DESC);
        }
        // As QEMU: VHOST_F_LOG_ALL only while a migration logs dirty
        // memory (FakeVmm::start_dirty_log).
        features &= !VhostUserVirtioFeatures::LOG_ALL.bits();
        let proto = frontend.get_protocol_features()?;
        frontend.set_protocol_features(proto)?;
        frontend.set_features(features)?;

        let file = memfd(opts.mem_size)?;
        let ranges = match opts.split {
            None => vec![(
                GuestAddress(0),
                opts.mem_size as usize,
                Some(FileOffset::new(file, 0)),
            )],
            Some((at, hole)) => {
                if at < DATA_START || at >= opts.mem_size || at % 4096 != 0 || hole % 4096 != 0 {
                    return Err(format!("bad memory split at {at:#x}").into());
                }
                vec![
                    (
                        GuestAddress(0),
                        at as usize,
                        Some(FileOffset::new(file.try_clone()?, 0)),
                    ),
                    (
                        GuestAddress(at.checked_add(hole).ok_or("hole too large")?),
                        (opts.mem_size - at) as usize,
                        Some(FileOffset::new(file, at)),
                    ),
                ]
            }
        };
        let mem = GuestMemoryMmap::<()>::from_ranges_with_files(&ranges)?;
        let regions = mem
            .iter()
            .map(VhostUserMemoryRegionInfo::from_guest_region)
            .collect::<Result<Vec<_>, _>>()?;
        let host = mem.get_host_address(GuestAddress(0))? as u64;
        frontend.set_mem_table(&regions)?;

        let kick = EventFd::new(EFD_NONBLOCK)?;
        let call = EventFd::new(EFD_NONBLOCK)?;
        let (driver, known_base) = start_ring(&mut frontend, mem, &opts, host, &kick, &call, None)?;
        Ok(FakeVmm {
            frontend,
            driver,
            opts,
            features,
            kick,
            call,
            raw: Vec::new(),
            bump: DATA_START,
            host,
            pending: HashMap::new(),
            known_base,
            log: None,
        })
    }

    /// Stops the ring as a VMM does on a device reset or before
    /// migration (GET_VRING_BASE, with requests possibly in flight) and
    /// returns the base the device reports: the next available index
    /// (split), or the next available slot with its wrap counter in bit 15
    /// (packed).
    pub fn stop_ring(&mut self) -> MockResult<u32> {
        let base = self.frontend.get_vring_base(0)?;
        self.known_base = base as u16;
        Ok(base)
    }

    /// The base [`FakeVmm::stop_ring`] should report: the driver's
    /// available index (split), or its next available slot and wrap
    /// counter (packed).
    pub fn driver_ring_base(&self) -> u32 {
        u32::from(self.driver.avail_base())
    }

    /// Sets the queue size the next [`FakeVmm::restart_ring`] sends
    /// (SET_VRING_NUM), as a rebooted driver may choose another.
    pub fn set_queue_size(&mut self, size: u16) {
        self.opts.queue_size = size;
    }

    /// Starts the stopped ring again from scratch, as a driver does after
    /// a reset: fresh rings at base 0 in the same memory, new kick and
    /// call eventfds, enable. Chains that were in flight are forgotten.
    pub fn restart_ring(&mut self) -> MockResult<()> {
        self.restart_ring_at(None)
    }

    /// [`FakeVmm::restart_ring`], but SET_VRING_BASE sends `base` (any
    /// value, for a frontend that lies) instead of the fresh ring's.
    pub fn restart_ring_at(&mut self, base: Option<u16>) -> MockResult<()> {
        let mem = self.memory().clone();
        self.kick = EventFd::new(EFD_NONBLOCK)?;
        self.call = EventFd::new(EFD_NONBLOCK)?;
        (self.driver, self.known_base) = start_ring(
            &mut self.frontend,
            mem,
            &self.opts,
            self.host,
            &self.kick,
            &self.call,
            base,
        )?;
        self.pending.clear();
        self.raw.clear();
        self.bump = DATA_START;
        Ok(())
    }

    /// Starts the stopped ring again where the device left it, as QEMU
    /// does on `cont` after `stop`: SET_FEATURES, the same ring addresses,
    /// SET_VRING_BASE with `base` (what [`FakeVmm::stop_ring`] returned),
    /// new kick and call eventfds, enable. The driver carries on: its
    /// chains and replies are kept.
    pub fn resume_ring(&mut self, base: u32) -> MockResult<()> {
        self.frontend.set_features(self.features)?;
        self.program_at(base as u16)
    }

    /// Sends the driver's ring as it is, with SET_VRING_BASE at `base` and
    /// new kick and call eventfds, and enables it.
    fn program_at(&mut self, base: u16) -> MockResult<()> {
        self.kick = EventFd::new(EFD_NONBLOCK)?;
        self.call = EventFd::new(EFD_NONBLOCK)?;
        let addrs = self.driver.ring_addresses();
        program_ring(
            &mut self.frontend,
            self.opts.queue_size,
            addrs,
            self.host,
            base,
            &self.kick,
            &self.call,
        )?;
        self.known_base = base;
        Ok(())
    }

    /// Connects to a new backend at `path` after the old one went away, as
    /// QEMU's frontends with `reconnect-ms` do: the same guest memory and
    /// rings, features and memory table sent again, SET_VRING_BASE at the
    /// used position (QEMU's rewind when GET_VRING_BASE could not be
    /// asked), new eventfds. Collect the used entries first: chains the
    /// old backend took but never answered are offered again. Retries the
    /// connection for up to 10 s.
    pub fn reconnect(&mut self, path: &Path) -> MockResult<()> {
        let base = self.driver.used_base();
        self.reconnect_at(path, base)
    }

    /// [`FakeVmm::reconnect`] as QEMU 10 does it: a split ring starts at
    /// the used index (read from guest memory); a packed ring at the base
    /// QEMU last sent or read ([`FakeVmm::stop_ring`]), because it cannot
    /// read a packed ring's position back
    /// (`virtio_queue_packed_restore_last_avail_idx` does nothing). Unless
    /// the backend keeps the position itself, a packed ring is then
    /// stale: the device looks for chains where the driver made none
    /// available and writes used elements where the driver does not look.
    pub fn reconnect_like_qemu(&mut self, path: &Path) -> MockResult<()> {
        let base = if self.driver.is_packed() {
            self.known_base
        } else {
            self.driver.used_base()
        };
        self.reconnect_at(path, base)
    }

    /// A new connection to the backend at `path`, set up as this VMM's
    /// was: the protocol features offered, this VMM's features and its
    /// memory table. The ring is not set up.
    fn open_with_memory(&self, path: &Path) -> MockResult<Frontend> {
        let (mut frontend, _) = open_frontend(path)?;
        let proto = frontend.get_protocol_features()?;
        frontend.set_protocol_features(proto)?;
        frontend.set_features(self.features)?;
        let regions = self
            .memory()
            .iter()
            .map(VhostUserMemoryRegionInfo::from_guest_region)
            .collect::<Result<Vec<_>, _>>()?;
        frontend.set_mem_table(&regions)?;
        Ok(frontend)
    }

    /// [`FakeVmm::reconnect`] with SET_VRING_BASE at `base`: any value,
    /// for a frontend whose base is stale (QEMU's `last_avail_idx` of a
    /// ring it never processed is 0) or wrong.
    pub fn reconnect_at(&mut self, path: &Path, base: u16) -> MockResult<()> {
        self.frontend = self.open_with_memory(path)?;
        self.program_at(base)
    }

    /// Starts dirty-page logging as a VMM does when a live migration
    /// begins: SET_FEATURES with `VHOST_F_LOG_ALL`, then a shared log of
    /// one bit per 4 KiB guest page, all clear, sent with SET_LOG_BASE
    /// (`VHOST_USER_PROTOCOL_F_LOG_SHMFD`).
    /// [`FakeVmm::dirty_pages`] reads it.
    pub fn start_dirty_log(&mut self) -> MockResult<()> {
        let end = self
            .memory()
            .iter()
            .map(|r| r.start_addr().0 + r.len())
            .max()
            .unwrap_or(0);
        let size = (end / 4096).div_ceil(8).max(1).next_multiple_of(4096);
        let log = memfd(size)?;
        // As QEMU's vhost_dev_set_log: features with VHOST_F_LOG_ALL,
        // then the log.
        self.features |= VhostUserVirtioFeatures::LOG_ALL.bits();
        self.frontend.set_features(self.features)?;
        self.frontend.set_log_base(
            0,
            Some(VhostUserDirtyLogRegion {
                mmap_size: size,
                mmap_offset: 0,
                mmap_handle: log.as_raw_fd(),
            }),
        )?;
        self.log = Some(log);
        Ok(())
    }

    /// The guest page numbers (guest address / 4096) the device marked
    /// dirty since the last call, which clears them.
    pub fn dirty_pages(&mut self) -> MockResult<Vec<u64>> {
        let log = self.log.as_ref().ok_or("no dirty log started")?;
        let mut bytes = vec![0u8; log.metadata()?.len() as usize];
        std::os::unix::fs::FileExt::read_exact_at(log, &mut bytes, 0)?;
        std::os::unix::fs::FileExt::write_all_at(log, &vec![0u8; bytes.len()], 0)?;
        let mut pages = Vec::new();
        for (i, b) in bytes.iter().enumerate() {
            for bit in 0..8 {
                if b & (1 << bit) != 0 {
                    pages.push((i * 8 + bit) as u64);
                }
            }
        }
        Ok(pages)
    }

    /// The guest address ranges the device may write of the ring itself:
    /// the used ring (split), the descriptor ring and device event area
    /// (packed).
    pub fn ring_write_areas(&self) -> Vec<(u64, u64)> {
        let q = u64::from(self.opts.queue_size);
        let (desc, _driver, device) = self.driver.ring_addresses();
        if self.is_packed() {
            vec![(desc.0, 16 * q), (device.0, 4)]
        } else {
            vec![(device.0, 6 + 8 * q)]
        }
    }

    /// The source side of a live migration, after [`FakeVmm::stop_ring`]:
    /// SET_DEVICE_STATE_FD (save) with a pipe, the state read to its end,
    /// CHECK_DEVICE_STATE. The backend keeps serving this frontend if the
    /// migration is abandoned ([`FakeVmm::resume_ring`]).
    pub fn save_device_state(&mut self) -> MockResult<Vec<u8>> {
        let (r, w) = pipe()?;
        let back = self.frontend.set_device_state_fd(
            VhostTransferStateDirection::SAVE,
            VhostTransferStatePhase::STOPPED,
            w.into(),
        )?;
        let mut from = back.unwrap_or(r);
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut from, &mut out)?;
        self.frontend.check_device_state()?;
        Ok(out)
    }

    /// The destination side of a live migration: connects to the backend
    /// at `path` with this guest's memory and features, loads `state`
    /// (SET_DEVICE_STATE_FD, CHECK_DEVICE_STATE) and only then starts the
    /// ring at `base` (what [`FakeVmm::stop_ring`] returned on the
    /// source). If the destination refuses the state, this VMM stays on
    /// the source backend, as a failed migration leaves QEMU.
    pub fn migrate_to(&mut self, path: &Path, state: &[u8], base: u32) -> MockResult<()> {
        let frontend = self.open_with_memory(path)?;
        let (r, w) = pipe()?;
        let back = frontend.set_device_state_fd(
            VhostTransferStateDirection::LOAD,
            VhostTransferStatePhase::STOPPED,
            r.into(),
        )?;
        let mut to = back.unwrap_or(w);
        let data = state.to_vec();
        let writer = std::thread::spawn(move || {
            // A backend that refused early closes its end: ignore EPIPE.
            let _ = std::io::Write::write_all(&mut to, &data);
        });
        let _ = writer.join();
        frontend.check_device_state()?;
        self.frontend = frontend;
        self.resume_ring(base)
    }

    /// Resets the device as a driver does on unbind or reboot: RESET_DEVICE
    /// (VHOST_USER_PROTOCOL_F_RESET_DEVICE), then SET_FEATURES and a fresh
    /// ring ([`FakeVmm::restart_ring`]).
    pub fn reset_device(&mut self) -> MockResult<()> {
        self.frontend.reset_device()?;
        self.frontend.set_features(self.features)?;
        self.restart_ring()
    }

    /// Whether the ring is packed ([`VmmOptions::packed`]).
    pub fn is_packed(&self) -> bool {
        self.driver.is_packed()
    }

    /// The split ring's driver (`None` for a packed ring), for chains
    /// laid out by hand or [`Malicious`](ring_mock::Malicious) patterns.
    pub fn split_driver(&mut self) -> Option<&mut MockDriver<'static, Mem>> {
        let driver: &mut dyn Any = &mut *self.driver;
        driver.downcast_mut()
    }

    /// The packed ring's driver (`None` for a split ring), for
    /// [`PackedMalicious`](ring_mock::PackedMalicious) patterns.
    pub fn packed_driver(&mut self) -> Option<&mut MockPackedDriver<'static, Mem>> {
        let driver: &mut dyn Any = &mut *self.driver;
        driver.downcast_mut()
    }

    fn split_only(&mut self) -> MockResult<&mut MockDriver<'static, Mem>> {
        self.split_driver()
            .ok_or_else(|| "raw descriptor writes need a split ring".into())
    }

    /// The features the device offered and this driver acked.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// The guest memory.
    pub fn memory(&self) -> &GuestMemoryMmap<()> {
        self.driver.memory()
    }

    /// The frontend connection (for raw control messages).
    pub fn frontend(&mut self) -> &mut Frontend {
        &mut self.frontend
    }

    /// Reads `size` bytes of the device config space at `offset`.
    pub fn get_config(&mut self, offset: u32, size: u32) -> MockResult<Vec<u8>> {
        let buf = vec![0u8; size as usize];
        let (_, data) =
            self.frontend
                .get_config(offset, size, VhostUserConfigFlags::empty(), &buf)?;
        Ok(data)
    }

    /// Requests submitted and not yet used.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Bump-allocates guest memory for buffers (the next
    /// [`FakeVmm::submit`] with nothing pending starts over).
    pub fn alloc(&mut self, len: u64) -> MockResult<u64> {
        let addr = self.bump.next_multiple_of(64);
        let end = self.opts.split.map_or(self.opts.mem_size, |(at, _)| at);
        if addr + len > end {
            return Err(format!("fake guest memory exhausted ({len} bytes wanted)").into());
        }
        self.bump = addr + len;
        Ok(addr)
    }

    /// Writes a descriptor of the split ring's table.
    pub fn write_desc(
        &mut self,
        index: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) -> MockResult<()> {
        let d = self.split_only()?;
        d.write_desc(index, ring_mock::desc(addr, len, flags, next))?;
        Ok(())
    }

    /// Writes descriptor `i` of a split indirect table at `table`.
    pub fn write_table_desc(
        &mut self,
        table: u64,
        i: u32,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) -> MockResult<()> {
        let d = self.split_only()?;
        let at = GuestAddress(table + 16 * u64::from(i));
        d.write_table_at(at, &[ring_mock::desc(addr, len, flags, next)])?;
        Ok(())
    }

    /// Publishes `head` in the split ring's available ring (no kick); the
    /// descriptors taken with [`FakeVmm::take_desc`] since the last call
    /// go back to the free list when the device returns it.
    pub fn push_avail(&mut self, head: u16) -> MockResult<()> {
        let raw = std::mem::take(&mut self.raw);
        self.split_only()?.publish(head, raw)?;
        Ok(())
    }

    /// Sets the split ring's available index to any value (malformed-ring
    /// tests; the driver's own index is kept).
    pub fn set_avail_idx(&mut self, idx: u16) -> MockResult<()> {
        self.split_only()?.set_avail_idx(idx)?;
        Ok(())
    }

    /// Kicks the device.
    pub fn kick(&self) -> MockResult<()> {
        self.kick.write(1)?;
        Ok(())
    }

    /// Takes a free descriptor index of the split ring (for raw chains).
    pub fn take_desc(&mut self) -> MockResult<u16> {
        let i = self.split_only()?.alloc_ring(1)?[0];
        self.raw.push(i);
        Ok(i)
    }

    /// Lays out `request` and a `reply_len`-byte reply buffer as a chain and
    /// makes it available (no kick).
    pub fn submit(
        &mut self,
        request: &[u8],
        reply_len: u32,
        layout: Layout,
    ) -> MockResult<Submitted> {
        if self.pending.is_empty() {
            self.bump = DATA_START;
        }
        let req_addr = self.alloc(request.len() as u64)?;
        self.memory().write_slice(request, GuestAddress(req_addr))?;
        let reply_addr = self.alloc(u64::from(reply_len))?;
        let table = match layout {
            Layout::Direct | Layout::Chain { .. } => 0,
            Layout::Indirect { seg } => {
                let n = 1 + reply_len.div_ceil(seg.max(1));
                self.alloc(16 * u64::from(n))?
            }
        };
        self.submit_at(
            req_addr,
            request.len() as u32,
            reply_addr,
            reply_len,
            layout,
            table,
        )
    }

    /// Makes a chain of buffers already in guest memory available (no
    /// kick): the request at `req_addr`, the reply room at `reply_addr`;
    /// for [`Layout::Indirect`], `table` is room for the indirect table
    /// (16 bytes per descriptor; ignored otherwise). Benchmarks reuse their
    /// buffers this way.
    pub fn submit_at(
        &mut self,
        req_addr: u64,
        req_len: u32,
        reply_addr: u64,
        reply_len: u32,
        layout: Layout,
        table: u64,
    ) -> MockResult<Submitted> {
        let mut bufs = vec![Buf::r(req_len)];
        let mut addrs = vec![GuestAddress(req_addr)];
        let (ring_layout, seg) = match layout {
            Layout::Direct => (ring_mock::Layout::Direct, reply_len.max(1)),
            Layout::Chain { seg } => {
                if reply_len == 0 {
                    return Err("a chain needs room for a reply".into());
                }
                (ring_mock::Layout::Direct, seg.max(1))
            }
            Layout::Indirect { seg } => (ring_mock::Layout::Indirect, seg.max(1)),
        };
        let mut off = 0;
        loop {
            let len = seg.min(reply_len - off);
            bufs.push(Buf::w(len));
            addrs.push(GuestAddress(reply_addr + u64::from(off)));
            off += len;
            if off >= reply_len {
                break;
            }
        }
        let table = Some(GuestAddress(table));
        let chain = self
            .driver
            .add_chain_placed(ring_layout, &bufs, &addrs, table)?;
        let sub = Submitted {
            head: chain.head,
            request_addr: req_addr,
            reply_addr,
            reply_len,
        };
        self.pending.insert(u32::from(sub.head), sub);
        Ok(sub)
    }

    /// Waits until at least one chain is used (or `timeout`) and returns
    /// every entry used since the last call (`id` is
    /// [`Submitted::head`]); their descriptors go back to the free list.
    pub fn wait_used(&mut self, timeout: Duration) -> MockResult<Vec<UsedEntry>> {
        let deadline = Instant::now() + timeout;
        loop {
            let used = self.collect_used()?;
            if !used.is_empty() {
                return Ok(used);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            crate::sys::wait_readable(
                self.call.as_raw_fd(),
                (deadline - now).min(Duration::from_millis(100)),
            );
            let _ = self.call.read();
        }
    }

    /// Used entries so far, without waiting; their descriptors go back to
    /// the free list.
    pub fn collect_used(&mut self) -> MockResult<Vec<UsedEntry>> {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let event_idx = self.features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        let used = self.driver.take_used();
        if event_idx {
            // used_event: notify me at the next used entry.
            self.driver.notify_at_next_used()?;
        }
        for u in &used {
            self.pending.remove(&u.id);
        }
        Ok(used)
    }

    /// Reads `len` bytes of guest memory.
    pub fn read(&self, addr: u64, len: usize) -> MockResult<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.memory().read_slice(&mut v, GuestAddress(addr))?;
        Ok(v)
    }

    /// Submits one request, kicks, waits for it and returns the reply bytes.
    pub fn call(&mut self, request: &[u8], reply_len: u32, layout: Layout) -> MockResult<Vec<u8>> {
        let sub = self.submit(request, reply_len, layout)?;
        self.kick()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut got = None;
        while got.is_none() {
            if Instant::now() >= deadline {
                return Err(format!("no reply to chain {} within 60 s", sub.head).into());
            }
            for u in self.wait_used(Duration::from_secs(1))? {
                if u.id == u32::from(sub.head) {
                    got = Some(u.len);
                }
            }
        }
        let len = got.unwrap_or(0) as usize;
        self.read(sub.reply_addr, len)
    }

    /// Sends `msg` with `tag` ([`FakeVmm::call`], a direct chain and a
    /// 4 KiB reply buffer) and returns the reply; an `Rlerror` is an error.
    pub fn rpc(&mut self, tag: u16, msg: &Tmessage) -> MockResult<Rmessage> {
        let reply = self.call(&msg.encode_frame(tag), 4096, Layout::Direct)?;
        let (_, r) = Rmessage::decode_frame(&reply, 4096)
            .map_err(|e| format!("bad reply to {msg:?}: {e:?}"))?;
        match r {
            Rmessage::Lerror(errno) => Err(format!("{msg:?} answered errno {errno}").into()),
            r => Ok(r),
        }
    }

    /// The session a benchmark or test starts from: Tversion with `msize`
    /// (if given), Tattach as root on fid 0, Twalk to `name` as fid 1 and
    /// Tlopen of fid 1 with `flags`.
    pub fn open_file(
        &mut self,
        msize: Option<u32>,
        name: &str,
        flags: OpenFlags,
    ) -> MockResult<()> {
        if let Some(msize) = msize {
            self.rpc(
                NOTAG,
                &Tmessage::Version(Tversion {
                    msize,
                    version: VERSION_9P2000_L.to_vec(),
                }),
            )?;
        }
        self.rpc(
            1,
            &Tmessage::Attach(Tattach {
                fid: 0,
                afid: NOFID,
                uname: b"root".to_vec(),
                aname: Vec::new(),
                n_uname: 0,
            }),
        )?;
        self.rpc(
            2,
            &Tmessage::Walk(Twalk {
                fid: 0,
                newfid: 1,
                wnames: vec![name.as_bytes().to_vec()],
            }),
        )?;
        self.rpc(3, &Tmessage::Lopen(Tlopen { fid: 1, flags }))?;
        Ok(())
    }
}

/// Lays out a fresh ring of either layout in `mem` (from guest address 0,
/// as the mocks do) and starts it: size, addresses (packed: descriptor
/// ring, driver area and device area, which vhost-user carries as desc,
/// avail and used), base (the fresh ring's unless `base`), call and kick
/// eventfds, enable.
fn start_ring(
    frontend: &mut Frontend,
    mem: Mem,
    opts: &VmmOptions,
    host: u64,
    kick: &EventFd,
    call: &EventFd,
    base: Option<u16>,
) -> MockResult<(Box<dyn Driver>, u16)> {
    let q = opts.queue_size;
    let driver: Box<dyn Driver> = if opts.packed {
        Box::new(MockPackedDriver::new_owned(mem, q))
    } else {
        Box::new(MockDriver::new_owned(mem, q))
    };
    // A fresh ring's base: index 0 (split), or slot 0 with the wrap
    // counter (bit 15) set (packed).
    let (desc, avail, used) = driver.ring_addresses();
    let fresh_base = driver.avail_base();
    if used.0 + 8 * u64::from(q) + 6 > DATA_START {
        return Err(format!("queue size {q} does not fit below the data area").into());
    }
    let base = base.unwrap_or(fresh_base);
    program_ring(frontend, q, (desc, avail, used), host, base, kick, call)?;
    Ok((driver, base))
}

/// Connects to the backend at `path` (retrying for up to 10 s: the daemon
/// may be starting), asks for replies, and takes ownership; returns the
/// frontend and the features the backend offers.
/// A pipe: (read end, write end), as files.
fn pipe() -> MockResult<(File, File)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two fds pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: two fresh fds we own.
    Ok(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

fn open_frontend(path: &Path) -> MockResult<(Frontend, u64)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let frontend = loop {
        match Frontend::connect(path, 1) {
            Ok(f) => break f,
            Err(_) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.into()),
        }
    };
    frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    let offered = frontend.get_features()?;
    frontend.set_owner()?;
    Ok((frontend, offered))
}

/// Sends the ring's size, addresses and base, its eventfds, and enables it.
fn program_ring(
    frontend: &mut Frontend,
    q: u16,
    (desc, avail, used): (GuestAddress, GuestAddress, GuestAddress),
    host: u64,
    base: u16,
    kick: &EventFd,
    call: &EventFd,
) -> MockResult<()> {
    frontend.set_vring_num(0, q)?;
    frontend.set_vring_addr(
        0,
        &VringConfigData {
            queue_max_size: q,
            queue_size: q,
            flags: 0,
            desc_table_addr: host + desc.0,
            used_ring_addr: host + used.0,
            avail_ring_addr: host + avail.0,
            log_addr: None,
        },
    )?;
    frontend.set_vring_base(0, base)?;
    frontend.set_vring_call(0, call)?;
    frontend.set_vring_kick(0, kick)?;
    frontend.set_vring_enable(0, true)?;
    Ok(())
}

/// Protocol features a frontend sees (re-exported for tests).
pub fn offered_protocol_features() -> VhostUserProtocolFeatures {
    super::protocol_features()
}
