// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A fake VMM for tests and benchmarks (feature `test-utils`): it connects
//! to a vhost-user backend with `vhost::vhost_user::Frontend`, shares a
//! memfd as guest memory, and plays the virtio driver on a split ring it
//! lays out itself: direct and indirect chains, event-idx, and raw
//! descriptor writes for malformed chains.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserProtocolFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::virtio::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

/// Descriptor flag: the chain continues.
pub const DESC_F_NEXT: u16 = 1;
/// Descriptor flag: device-writable.
pub const DESC_F_WRITE: u16 = 2;
/// Descriptor flag: an indirect table.
pub const DESC_F_INDIRECT: u16 = 4;

const DESC_TABLE: u64 = 0;
const AVAIL_RING: u64 = 0x10_0000;
const USED_RING: u64 = 0x12_0000;
const DATA_START: u64 = 0x20_0000;

/// Settings of a [`FakeVmm`].
#[derive(Debug, Clone, Copy)]
pub struct VmmOptions {
    /// Guest memory size in bytes (at least 4 MiB).
    pub mem_size: u64,
    /// Queue size (a power of two up to 32768).
    pub queue_size: u16,
    /// Negotiate `VIRTIO_RING_F_EVENT_IDX`.
    pub event_idx: bool,
    /// Negotiate `VIRTIO_RING_F_INDIRECT_DESC`.
    pub indirect: bool,
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
        }
    }
}

/// How a request's buffers are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// The chain's head index.
    pub head: u16,
    /// Guest address of the reply buffer (contiguous).
    pub reply_addr: u64,
    /// Its length.
    pub reply_len: u32,
    descs: u16,
}

/// Errors of the fake VMM (tests unwrap them).
pub type MockResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The fake VMM. See the module docs.
pub struct FakeVmm {
    frontend: Frontend,
    mem: GuestMemoryMmap<()>,
    opts: VmmOptions,
    features: u64,
    kick: EventFd,
    call: EventFd,
    free: Vec<u16>,
    avail_idx: u16,
    last_used: u16,
    bump: u64,
    pending: HashMap<u16, Submitted>,
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
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut frontend = loop {
            match Frontend::connect(path, 1) {
                Ok(f) => break f,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        };
        frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        let offered = frontend.get_features()?;
        frontend.set_owner()?;
        let mut features = offered;
        if !opts.event_idx {
            features &= !(1 << VIRTIO_RING_F_EVENT_IDX);
        }
        if !opts.indirect {
            features &= !(1 << VIRTIO_RING_F_INDIRECT_DESC);
        }
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

        let q = opts.queue_size;
        frontend.set_vring_num(0, q)?;
        frontend.set_vring_addr(
            0,
            &VringConfigData {
                queue_max_size: q,
                queue_size: q,
                flags: 0,
                desc_table_addr: host + DESC_TABLE,
                used_ring_addr: host + USED_RING,
                avail_ring_addr: host + AVAIL_RING,
                log_addr: None,
            },
        )?;
        frontend.set_vring_base(0, 0)?;
        let kick = EventFd::new(EFD_NONBLOCK)?;
        let call = EventFd::new(EFD_NONBLOCK)?;
        frontend.set_vring_call(0, &call)?;
        frontend.set_vring_kick(0, &kick)?;
        frontend.set_vring_enable(0, true)?;
        Ok(FakeVmm {
            frontend,
            mem,
            opts,
            features,
            kick,
            call,
            free: (0..q).rev().collect(),
            avail_idx: 0,
            last_used: 0,
            bump: DATA_START,
            pending: HashMap::new(),
        })
    }

    /// The features the device offered and this driver acked.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// The guest memory.
    pub fn memory(&self) -> &GuestMemoryMmap<()> {
        &self.mem
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

    /// Writes a descriptor of the ring's table.
    pub fn write_desc(
        &self,
        index: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) -> MockResult<()> {
        let at = GuestAddress(DESC_TABLE + 16 * u64::from(index));
        write_desc_at(&self.mem, at, addr, len, flags, next)
    }

    /// Writes descriptor `i` of an indirect table at `table`.
    pub fn write_table_desc(
        &self,
        table: u64,
        i: u32,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) -> MockResult<()> {
        write_desc_at(
            &self.mem,
            GuestAddress(table + 16 * u64::from(i)),
            addr,
            len,
            flags,
            next,
        )
    }

    /// Publishes `head` in the available ring (no kick).
    pub fn push_avail(&mut self, head: u16) -> MockResult<()> {
        let q = self.opts.queue_size;
        let slot = u64::from(self.avail_idx % q);
        self.mem
            .write_obj(head.to_le(), GuestAddress(AVAIL_RING + 4 + 2 * slot))?;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.mem
            .write_obj(self.avail_idx.to_le(), GuestAddress(AVAIL_RING + 2))?;
        Ok(())
    }

    /// Sets the available index to any value (malformed-ring tests).
    pub fn set_avail_idx(&mut self, idx: u16) -> MockResult<()> {
        self.avail_idx = idx;
        self.mem
            .write_obj(idx.to_le(), GuestAddress(AVAIL_RING + 2))?;
        Ok(())
    }

    /// Kicks the device.
    pub fn kick(&self) -> MockResult<()> {
        self.kick.write(1)?;
        Ok(())
    }

    /// Takes a free descriptor index out of the free list (for raw chains).
    pub fn take_desc(&mut self) -> MockResult<u16> {
        self.free.pop().ok_or_else(|| "no free descriptor".into())
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
        self.mem.write_slice(request, GuestAddress(req_addr))?;
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
        let sub = match layout {
            Layout::Direct => {
                if self.free.len() < 2 {
                    return Err("no free descriptors".into());
                }
                let d0 = self.take_desc()?;
                let d1 = self.take_desc()?;
                self.write_desc(d0, req_addr, req_len, DESC_F_NEXT, d1)?;
                self.write_desc(d1, reply_addr, reply_len, DESC_F_WRITE, 0)?;
                Submitted {
                    head: d0,
                    reply_addr,
                    reply_len,
                    descs: 2,
                }
            }
            Layout::Chain { seg } => {
                let seg = seg.max(1);
                let n = 1 + reply_len.div_ceil(seg);
                if reply_len == 0 {
                    return Err("a chain needs room for a reply".into());
                }
                if self.free.len() < n as usize || n > u32::from(u16::MAX) {
                    return Err(format!("{n} descriptors do not fit in the free ring").into());
                }
                let descs: Vec<u16> = (0..n).filter_map(|_| self.free.pop()).collect();
                self.write_desc(descs[0], req_addr, req_len, DESC_F_NEXT, descs[1])?;
                let mut off = 0u32;
                for i in 1..n as usize {
                    let len = seg.min(reply_len - off);
                    let last = i + 1 == descs.len();
                    let (flags, next) = if last {
                        (DESC_F_WRITE, 0)
                    } else {
                        (DESC_F_WRITE | DESC_F_NEXT, descs[i + 1])
                    };
                    self.write_desc(descs[i], reply_addr + u64::from(off), len, flags, next)?;
                    off += len;
                }
                Submitted {
                    head: descs[0],
                    reply_addr,
                    reply_len,
                    descs: n as u16,
                }
            }
            Layout::Indirect { seg } => {
                let seg = seg.max(1);
                let n = 1 + reply_len.div_ceil(seg);
                self.write_table_desc(table, 0, req_addr, req_len, DESC_F_NEXT, 1)?;
                let mut off = 0u32;
                for i in 1..n {
                    let len = seg.min(reply_len - off);
                    let flags = DESC_F_WRITE | if i + 1 < n { DESC_F_NEXT } else { 0 };
                    let next = if i + 1 < n { (i + 1) as u16 } else { 0 };
                    self.write_table_desc(table, i, reply_addr + u64::from(off), len, flags, next)?;
                    off += len;
                }
                let head = self.take_desc()?;
                self.write_desc(head, table, 16 * n, DESC_F_INDIRECT, 0)?;
                Submitted {
                    head,
                    reply_addr,
                    reply_len,
                    descs: 1,
                }
            }
        };
        self.pending.insert(sub.head, sub);
        self.push_avail(sub.head)?;
        Ok(sub)
    }

    /// Waits until at least one chain is used (or `timeout`) and returns
    /// every `(head, len)` used since the last call; their descriptors go
    /// back to the free list.
    pub fn wait_used(&mut self, timeout: Duration) -> MockResult<Vec<(u16, u32)>> {
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
            let mut pfd = libc::pollfd {
                fd: self.call.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = (deadline - now).as_millis().clamp(1, 100) as i32;
            // SAFETY: poll on one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, ms) };
            let _ = self.call.read();
        }
    }

    /// Used entries so far, without waiting.
    pub fn collect_used(&mut self) -> MockResult<Vec<(u16, u32)>> {
        let q = self.opts.queue_size;
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let used_idx = u16::from_le(self.mem.read_obj::<u16>(GuestAddress(USED_RING + 2))?);
        let mut out = Vec::new();
        while self.last_used != used_idx {
            let slot = u64::from(self.last_used % q);
            let base = USED_RING + 4 + 8 * slot;
            let id = u32::from_le(self.mem.read_obj::<u32>(GuestAddress(base))?);
            let len = u32::from_le(self.mem.read_obj::<u32>(GuestAddress(base + 4))?);
            self.last_used = self.last_used.wrapping_add(1);
            let head = id as u16;
            if let Some(sub) = self.pending.remove(&head) {
                self.release(head, sub.descs);
            }
            out.push((head, len));
        }
        if self.features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0 {
            // used_event: notify me at the next used entry.
            let at = AVAIL_RING + 4 + 2 * u64::from(q);
            self.mem
                .write_obj(self.last_used.to_le(), GuestAddress(at))?;
        }
        Ok(out)
    }

    fn release(&mut self, head: u16, descs: u16) {
        let mut i = head;
        for k in 0..descs {
            self.free.push(i);
            if k + 1 < descs {
                let at = GuestAddress(DESC_TABLE + 16 * u64::from(i) + 14);
                i = self.mem.read_obj::<u16>(at).map(u16::from_le).unwrap_or(0);
            }
        }
    }

    /// Returns a raw chain's descriptors to the free list after it was used.
    pub fn release_raw(&mut self, descs: &[u16]) {
        self.free.extend_from_slice(descs);
    }

    /// Reads `len` bytes of guest memory.
    pub fn read(&self, addr: u64, len: usize) -> MockResult<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(addr))?;
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
            for (h, len) in self.wait_used(Duration::from_secs(1))? {
                if h == sub.head {
                    got = Some(len);
                }
            }
        }
        let len = got.unwrap_or(0) as usize;
        self.read(sub.reply_addr, len)
    }
}

fn write_desc_at(
    mem: &GuestMemoryMmap<()>,
    at: GuestAddress,
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
) -> MockResult<()> {
    let mut d = [0u8; 16];
    d[0..8].copy_from_slice(&addr.to_le_bytes());
    d[8..12].copy_from_slice(&len.to_le_bytes());
    d[12..14].copy_from_slice(&flags.to_le_bytes());
    d[14..16].copy_from_slice(&next.to_le_bytes());
    mem.write_slice(&d, at)?;
    Ok(())
}

/// Protocol features a frontend sees (re-exported for tests).
pub fn offered_protocol_features() -> VhostUserProtocolFeatures {
    super::protocol_features()
}
