// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The virtio-9p device adapter: one type that owns the device's life, as
//! a VMM's device model sees it.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coro_pool::{PoolConfig, StackPool};
use log::{debug, error, warn};
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{Queue, QueueT};
use virtqueue_large::{AnyRing, PackedQueue};
use vm_memory::{GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::VirtioError;
use super::{packed_ring, validate_queue_size, DeviceConfig, RequestQueue, DEVICE_FEATURES};
use crate::engine::{EngineConfig, EngineError};
use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::server::{Server, Session};

/// The virtio device id of a 9P transport.
const VIRTIO_ID_9P: u32 = 9;
/// Leading bytes of a [`Device::snapshot`].
const SNAPSHOT_MAGIC: &[u8; 8] = b"V9PDEV\x00\x01";
/// Magic, flags (1), acked features (8), ring base (4), session length (4).
const SNAPSHOT_HEADER: usize = 8 + 1 + 8 + 4 + 4;
const HAS_FEATURES: u8 = 1;
const HAS_RING: u8 = 2;

/// What an activation handed the device.
struct Active<M: GuestMemoryBackend> {
    mem: GuestMemoryAtomic<M>,
    /// The ring configuration the driver wrote (and, for a split ring,
    /// the ring state itself).
    queue: Queue,
    /// The packed ring state, when the driver acked `VIRTIO_F_RING_PACKED`.
    packed: Option<PackedQueue>,
    interrupt: Box<dyn Fn() + Send>,
}

/// A virtio-9p device: offered features, the config space (mount tag),
/// activation with the driver's ring (split or packed), kicks, reset,
/// pause/resume and snapshot/restore, over one request queue.
///
/// It is shaped like a rust-vmm device model and maps onto
/// cloud-hypervisor's `VirtioDevice` trait method by method:
///
/// | `VirtioDevice`            | [`Device`]                                          |
/// |---------------------------|-----------------------------------------------------|
/// | `device_type`             | [`device_type`](Device::device_type) (9)            |
/// | `queue_max_sizes`         | [`queue_max_sizes`](Device::queue_max_sizes)        |
/// | `features`                | [`features`](Device::features)                      |
/// | `ack_features`            | [`ack_features`](Device::ack_features), once, with the whole 64-bit value at `FEATURES_OK` |
/// | `read_config`             | [`read_config`](Device::read_config)                |
/// | `write_config`            | [`write_config`](Device::write_config) (read-only space) |
/// | `activate`                | [`activate`](Device::activate) with the memory, the queue and the interrupt callback; the epoll thread calls [`process_queue`](Device::process_queue) or [`run`](Device::run) |
/// | `reset`                   | [`reset`](Device::reset)                            |
/// | `Pausable::pause`/`resume`| [`pause`](Device::pause) / [`resume`](Device::resume) |
/// | `Snapshottable::snapshot` | [`snapshot`](Device::snapshot) (paused)             |
/// | restore at creation       | [`restore`](Device::restore), then [`activate`](Device::activate) |
///
/// Driving it: either the VMM's own event loop adds its queue's kick
/// eventfd and the fds of [`fds`](Device::fds) and calls
/// [`process_queue`](Device::process_queue) when any is readable (after
/// reading its own kick eventfd), or it hands a thread over to
/// [`run`](Device::run), which does the same until a stop eventfd fires.
///
/// A driver that misbehaves gets an error, never a panic: features acked
/// twice or after activation, activation before features or with a ring
/// that is not set up (not ready, misaligned, outside guest memory) are
/// refused with [`VirtioError::DeviceState`] or [`VirtioError::Ring`]; a kick before
/// activation or while paused is ignored (the chains wait on the ring and
/// are served at activation or resume); a broken ring stops the queue
/// until the driver resets the device. After [`reset`](Device::reset)
/// nothing is written to the old ring or its buffers: requests in flight
/// are cancelled (a blocking call that does not return within the
/// engine's `quiesce_timeout` is given up on and can no longer touch
/// guest memory).
///
/// The device is not `Send` (its requests are coroutines of the thread
/// that drives it): build it on its event loop's thread.
pub struct Device<F: Filesystem + 'static, M: GuestMemoryBackend> {
    server: Arc<Server<F>>,
    config: DeviceConfig,
    queue_sizes: [u16; 1],
    quiesce: Duration,
    acked: Option<u64>,
    rq: RequestQueue<F>,
    active: Option<Active<M>>,
    paused: bool,
    /// The ring position of a restored snapshot, applied at activation.
    restored_ring: Option<u32>,
}

impl<F: Filesystem + 'static, M: GuestMemoryBackend> std::fmt::Debug for Device<F, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("config", &self.config)
            .field("acked", &self.acked)
            .field("active", &self.active.is_some())
            .field("paused", &self.paused)
            .finish()
    }
}

impl<F, M> Device<F, M>
where
    F: Filesystem + 'static,
    M: GuestMemoryBackend + Send + Sync + 'static,
{
    /// A device serving `server` under the mount `tag`, its requests run by
    /// an engine with `engine` (its `max_in_flight` is the queue size the
    /// device offers: a power of two up to
    /// [`MAX_QUEUE_SIZE`](super::MAX_QUEUE_SIZE)).
    pub fn new(server: Arc<Server<F>>, tag: &str, engine: &EngineConfig) -> Result<Self> {
        let config = DeviceConfig::new(tag)?;
        let size = validate_queue_size(u32::try_from(engine.max_in_flight).unwrap_or(u32::MAX))?;
        let pool = StackPool::new(PoolConfig::default()).map_err(EngineError::StackPool)?;
        let rq = RequestQueue::new(
            Arc::clone(&server),
            Arc::new(Session::new()),
            Arc::new(pool),
            engine,
            false,
        )?;
        Ok(Device {
            server,
            config,
            queue_sizes: [size],
            quiesce: engine.quiesce_timeout,
            acked: None,
            rq,
            active: None,
            paused: false,
            restored_ring: None,
        })
    }

    /// The virtio device id: 9, a 9P transport.
    pub fn device_type(&self) -> u32 {
        VIRTIO_ID_9P
    }

    /// The largest size of each queue (one request queue).
    pub fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    /// The features the device offers
    /// ([`DEVICE_FEATURES`](super::DEVICE_FEATURES)).
    pub fn features(&self) -> u64 {
        DEVICE_FEATURES
    }

    /// The features the driver acked, once it has.
    pub fn acked_features(&self) -> Option<u64> {
        self.acked
    }

    /// The driver's features, the whole 64-bit value it set before
    /// `FEATURES_OK`. Bits the device did not offer are dropped (and
    /// logged). A second ack before a reset, or one after activation, is
    /// refused and the first one stays.
    pub fn ack_features(&mut self, value: u64) -> Result<()> {
        if self.active.is_some() {
            return Err(VirtioError::DeviceState("features acked after activation").into());
        }
        if self.acked.is_some() {
            return Err(VirtioError::DeviceState("features acked twice").into());
        }
        let unknown = value & !DEVICE_FEATURES;
        if unknown != 0 {
            warn!("virtio-9p: the driver acked features {unknown:#x} that were not offered");
        }
        self.acked = Some(value & DEVICE_FEATURES);
        Ok(())
    }

    /// Reads the config space (`le16 tag_len` and the tag) at `offset`;
    /// bytes past its end read as zero.
    pub fn read_config(&self, offset: u64, data: &mut [u8]) {
        let offset = u32::try_from(offset).unwrap_or(u32::MAX);
        let bytes = self.config.read(offset, data.len() as u32);
        let n = bytes.len().min(data.len());
        data[..n].copy_from_slice(&bytes[..n]);
        data[n..].fill(0);
    }

    /// A driver write to the config space: it is read-only, so the write
    /// is ignored.
    pub fn write_config(&mut self, offset: u64, data: &[u8]) {
        debug!(
            "virtio-9p: ignored a {}-byte write at config offset {offset}",
            data.len()
        );
    }

    /// Starts the device on the ring the driver set up in `queue` (size,
    /// addresses, ready; the layout is packed when the driver acked
    /// `VIRTIO_F_RING_PACKED`, and `queue`'s three addresses are then the
    /// descriptor ring and the driver and device event areas), over the
    /// guest memory `mem`. `interrupt` is called when the used ring got
    /// entries and the driver wants to be told (the VMM raises the
    /// queue's interrupt there). Chains the driver made available before
    /// are served now.
    pub fn activate(
        &mut self,
        mem: GuestMemoryAtomic<M>,
        mut queue: Queue,
        interrupt: Box<dyn Fn() + Send>,
    ) -> Result<()> {
        if self.active.is_some() {
            return Err(VirtioError::DeviceState("activated twice").into());
        }
        let Some(acked) = self.acked else {
            return Err(
                VirtioError::DeviceState("activated before the driver acked features").into(),
            );
        };
        if !queue.ready() {
            return Err(VirtioError::DeviceState("activated with a ring that is not ready").into());
        }
        let event_idx = acked & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        queue.set_event_idx(event_idx);
        let packed = {
            let m = mem.memory();
            if packed_ring(acked) {
                let size = queue.size();
                let mut p = PackedQueue::new(
                    size,
                    GuestAddress(queue.desc_table()),
                    GuestAddress(queue.avail_ring()),
                    GuestAddress(queue.used_ring()),
                )
                .map_err(VirtioError::Ring)?;
                let (d, a, u) = p.addresses();
                if !m.check_range(d, 16 * usize::from(size))
                    || !m.check_range(a, 4)
                    || !m.check_range(u, 4)
                {
                    return Err(VirtioError::DeviceState(
                        "the packed ring is outside guest memory",
                    )
                    .into());
                }
                p.set_ready(true);
                p.set_event_idx(event_idx);
                if let Some(base) = self.restored_ring {
                    p.set_ring_base(base).map_err(VirtioError::Ring)?;
                }
                Some(p)
            } else {
                if !queue.is_valid(&*m) {
                    return Err(VirtioError::DeviceState(
                        "the split ring is not set up (size, alignment or guest memory)",
                    )
                    .into());
                }
                if let Some(base) = self.restored_ring {
                    queue.set_next_avail(base as u16);
                    queue.set_next_used((base >> 16) as u16);
                }
                None
            }
        };
        self.rq
            .reset(acked & (1 << VIRTIO_RING_F_INDIRECT_DESC) != 0)?;
        self.restored_ring = None;
        self.paused = false;
        self.active = Some(Active {
            mem,
            queue,
            packed,
            interrupt,
        });
        self.process_queue().map(|_| ())
    }

    /// Whether the device is activated (and not reset since).
    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// The device's own fds, for the VMM's event loop: when one is
    /// readable, call [`process_queue`](Device::process_queue). They stay
    /// the same for the device's life (through resets).
    pub fn fds(&self) -> [RawFd; 3] {
        let [wake, timer] = self.rq.engine().fds();
        [wake, timer, self.rq.more_fd()]
    }

    /// Serves the queue: the kick (call it after reading the queue's kick
    /// eventfd) and the readiness of any of [`fds`](Device::fds). Pops
    /// the available chains, resumes the requests whose calls finished,
    /// puts finished ones on the used ring and calls the interrupt
    /// callback if the driver wants it. Returns whether it did.
    ///
    /// Before activation and while paused it does nothing (a kick then is
    /// not lost: the chains wait on the ring). A broken ring is reported
    /// once as [`VirtioError::Ring`] and then ignored until a reset.
    pub fn process_queue(&mut self) -> Result<bool> {
        self.rq.clear_more();
        let Some(a) = self.active.as_mut() else {
            debug!("virtio-9p: kick before activation ignored");
            return Ok(false);
        };
        if self.paused {
            return Ok(false);
        }
        self.rq.poll();
        let m = a.mem.memory();
        let mut ring = match a.packed.as_mut() {
            Some(p) => AnyRing::Packed(p),
            None => AnyRing::Split(&mut a.queue),
        };
        let popped = self.rq.process_ring(&mut ring, m.clone().into_inner());
        let notify = match self.rq.complete_and_check_signal(&mut ring, &*m) {
            Ok(notify) => notify,
            Err(e) => {
                error!("virtio-9p: {e}");
                false
            }
        };
        if notify {
            (a.interrupt)();
        }
        popped.map(|()| notify)
    }

    /// Drives the device on the calling thread (a thread the VMM hands
    /// over) until `stop` is readable: `kick` is the queue's kick eventfd.
    /// Errors of the queue are logged and the device keeps serving; only
    /// a failing epoll ends it early. Call [`pause`](Device::pause),
    /// [`snapshot`](Device::snapshot) or [`reset`](Device::reset) after
    /// it returns, on the same thread.
    pub fn run(&mut self, kick: &EventFd, stop: &EventFd) -> Result<()> {
        const KICK: u64 = 0;
        const STOP: u64 = 1;
        const OWN: u64 = 2;
        let epoll = Epoll::new().map_err(Error::Transport)?;
        let add = |fd: RawFd, token: u64| {
            epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, token),
                )
                .map_err(Error::Transport)
        };
        add(kick.as_raw_fd(), KICK)?;
        add(stop.as_raw_fd(), STOP)?;
        for fd in self.fds() {
            add(fd, OWN)?;
        }
        let mut events = [EpollEvent::default(); 8];
        loop {
            let n = match epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::Transport(e)),
            };
            for ev in &events[..n] {
                match ev.data() {
                    STOP => {
                        let _ = stop.read();
                        return Ok(());
                    }
                    KICK => {
                        let _ = kick.read();
                    }
                    _ => {}
                }
            }
            if let Err(e) = self.process_queue() {
                error!("virtio-9p: {e}");
            }
        }
    }

    /// Pauses the device: every request in flight finishes (within the
    /// engine's `quiesce_timeout`) and its reply goes to the used ring,
    /// with the interrupt the driver asked for; then nothing more is
    /// popped or written until [`resume`](Device::resume). Fails, still
    /// running, if requests did not finish in time.
    pub fn pause(&mut self) -> Result<()> {
        if self.active.is_none() {
            return Err(VirtioError::DeviceState("paused before activation").into());
        }
        if self.paused {
            return Ok(());
        }
        let deadline = Instant::now() + self.quiesce;
        let left = self.rq.drain(|| Instant::now() >= deadline);
        // Completions go to the ring (and the interrupt) before the pause.
        let done = self.process_completions();
        if left > 0 {
            return Err(VirtioError::DeviceState("requests still in flight at pause").into());
        }
        done?;
        self.paused = true;
        Ok(())
    }

    /// Puts finished requests on the ring and raises the interrupt if the
    /// driver wants it, without popping anything.
    fn process_completions(&mut self) -> Result<()> {
        let Some(a) = self.active.as_mut() else {
            self.rq.discard_completed();
            return Ok(());
        };
        let m = a.mem.memory();
        let mut ring = match a.packed.as_mut() {
            Some(p) => AnyRing::Packed(p),
            None => AnyRing::Split(&mut a.queue),
        };
        if self.rq.complete_and_check_signal(&mut ring, &*m)? {
            (a.interrupt)();
        }
        Ok(())
    }

    /// Resumes a paused device and serves what the driver made available
    /// meanwhile.
    pub fn resume(&mut self) -> Result<()> {
        if !self.paused {
            return Ok(());
        }
        self.paused = false;
        self.process_queue().map(|_| ())
    }

    /// Whether the device is paused.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Resets the device, as a driver writing 0 to the status does: every
    /// request in flight is cancelled and nothing more is written to the
    /// ring or its buffers; the ring, the acked features and the 9P
    /// session (its fids) are forgotten. The device can be acked and
    /// activated again.
    pub fn reset(&mut self) {
        let leaked = self.rq.cancel_all();
        if leaked > 0 {
            warn!("virtio-9p: reset gave up on {leaked} requests still in a blocking call");
        }
        self.rq.discard_completed();
        if let Err(e) = self.rq.reset(false) {
            error!("virtio-9p: {e}");
        }
        self.rq.set_session(Arc::new(Session::new()));
        self.active = None;
        self.acked = None;
        self.paused = false;
        self.restored_ring = None;
    }

    /// The device's state as bytes, for a VMM snapshot or live migration:
    /// the acked features, the ring position and the 9P session
    /// ([`Server::save_session`]: msize, fids, open files, locks). Only
    /// while paused (nothing in flight) or not activated.
    pub fn snapshot(&self) -> Result<Vec<u8>> {
        if self.active.is_some() && !self.paused {
            return Err(
                VirtioError::DeviceState("snapshot of a running device: pause it first").into(),
            );
        }
        let session = self.server.save_session(self.rq.session())?;
        let mut flags = 0;
        let mut base = 0u32;
        if self.acked.is_some() {
            flags |= HAS_FEATURES;
        }
        if let Some(a) = self.active.as_ref() {
            flags |= HAS_RING;
            base = match a.packed.as_ref() {
                Some(p) => p.ring_base(),
                None => u32::from(a.queue.next_avail()) | u32::from(a.queue.next_used()) << 16,
            };
        }
        let mut out = Vec::with_capacity(SNAPSHOT_HEADER + session.len());
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.push(flags);
        out.extend_from_slice(&self.acked.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&base.to_le_bytes());
        out.extend_from_slice(&(session.len() as u32).to_le_bytes());
        out.extend_from_slice(&session);
        Ok(out)
    }

    /// Brings back a [`snapshot`](Device::snapshot) into a device that is
    /// not activated (a new one, or one just reset): the acked features,
    /// the 9P session, and the ring position, which the next
    /// [`activate`](Device::activate) applies. Bytes that are not a
    /// snapshot, or a session for another export, are refused and the
    /// device is left as it was.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        if self.active.is_some() {
            return Err(VirtioError::DeviceState("restore into an activated device").into());
        }
        let bad = || Error::from(VirtioError::DeviceState("not a virtio-9p device snapshot"));
        if bytes.len() < SNAPSHOT_HEADER || &bytes[..8] != SNAPSHOT_MAGIC {
            return Err(bad());
        }
        let flags = bytes[8];
        let word = |at: usize, n: usize| -> u64 {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(&bytes[at..at + n]);
            u64::from_le_bytes(b)
        };
        let acked = word(9, 8);
        let base = word(17, 4) as u32;
        let len = word(21, 4) as usize;
        if flags & !(HAS_FEATURES | HAS_RING) != 0
            || bytes.len() - SNAPSHOT_HEADER != len
            || acked & !DEVICE_FEATURES != 0
        {
            return Err(bad());
        }
        let session = self.server.restore_session(&bytes[SNAPSHOT_HEADER..])?;
        self.rq.set_session(Arc::new(session));
        self.acked = (flags & HAS_FEATURES != 0).then_some(acked);
        self.restored_ring = (flags & HAS_RING != 0).then_some(base);
        self.paused = false;
        Ok(())
    }
}
