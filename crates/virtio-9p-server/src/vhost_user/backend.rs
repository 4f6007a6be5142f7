// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The `VhostUserBackend` of the virtio-9p device.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use coro_pool::StackPool;
use log::{debug, error, info, warn};
use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserProtocolFeatures,
    VhostUserVirtioFeatures,
};
use vhost_user_backend::{VhostUserBackend, VringEpollHandler, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_RING_PACKED;
use virtio_queue::QueueT;
use virtqueue_large::{AnyRing, PackedQueue};
use vm_memory::{
    GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::{DirtyLog, VhostUserError};
use crate::engine::{EngineConfig, DRAIN_LOG_EVERY, WORKER_JOIN_TIMEOUT};
use crate::fs::Filesystem;
use crate::persist::inflight_table::{InflightTable, USED};
use crate::server::{Server, Session};
use crate::virtio::{
    indirect_descriptors, packed_ring, DeviceConfig, RequestQueue, DEVICE_FEATURES,
};

/// Epoll data of the request queue's kick.
pub const QUEUE_EVENT: u16 = 0;
/// Epoll data of the engine's worker-completion eventfd (ids up to the
/// number of queues are reserved by vhost-user-backend).
pub const WAKE_EVENT: u16 = 2;
/// Epoll data of the engine's timer.
pub const TIMER_EVENT: u16 = 3;
/// Epoll data of the control eventfd (quiesce and shutdown requests).
pub const CONTROL_EVENT: u16 = 4;
/// Epoll data of the queue's resume eventfd: chains were left on the ring
/// when a round's work budget was spent; handled like a kick.
pub const MORE_EVENT: u16 = 5;

/// The vhost-user protocol features offered: CONFIG (the mount tag is read
/// from the backend), MQ, REPLY_ACK, CONFIGURE_MEM_SLOTS, RESET_DEVICE and
/// DEVICE_STATE and LOG_SHMFD (the 9P session crosses a live migration
/// and guest-memory writes are logged; see "Live migration" in the crate
/// README).
pub fn protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
        | VhostUserProtocolFeatures::RESET_DEVICE
        | VhostUserProtocolFeatures::DEVICE_STATE
        | VhostUserProtocolFeatures::LOG_SHMFD
}

/// Settings of one device. Build one from [`BackendConfig::default`] and
/// set the fields that differ: the struct is `#[non_exhaustive]`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct BackendConfig {
    /// The mount tag the guest sees.
    pub tag: String,
    /// Largest queue size the driver may set (the in-flight limit).
    pub queue_size: u16,
    /// Engine settings; `max_in_flight` is set to the queue size.
    pub engine: EngineConfig,
    /// Offer packed virtqueues (`VIRTIO_F_RING_PACKED`); the driver
    /// chooses. Without it every driver uses the split ring.
    pub packed_ring: bool,
    /// A directory (on tmpfs; an `O_PATH` fd will do) where the device
    /// keeps its 9P session crash-safe: a snapshot and a journal of every
    /// fid change (`session.snap`, `session.journal`; see "A session that
    /// outlives its daemon" in the design notes), from which
    /// [`Daemon::recover_crashed_session`](super::Daemon::recover_crashed_session)
    /// brings the session back after the daemon was killed. `None` (the
    /// default): nothing is kept, at no cost.
    pub state_dir: Option<Arc<OwnedFd>>,
}

impl Default for BackendConfig {
    /// Tag `share`, queue size
    /// [`DEFAULT_QUEUE_SIZE`](crate::virtio::DEFAULT_QUEUE_SIZE), the
    /// default [`EngineConfig`], packed rings offered.
    fn default() -> Self {
        BackendConfig {
            tag: "share".into(),
            queue_size: crate::virtio::DEFAULT_QUEUE_SIZE,
            engine: EngineConfig::default(),
            packed_ring: true,
            state_dir: None,
        }
    }
}

/// Guest memory with the dirty-page log of a live migration: a region's
/// bitmap ([`DirtyLog`]) is one atomic load per write until the frontend
/// sends SET_LOG_BASE (`VHOST_USER_PROTOCOL_F_LOG_SHMFD`), then every
/// write through vm-memory, and every raw write of virtqueue-large's
/// writer (which marks the pages itself), sets the written pages' bits in
/// the shared log.
pub(super) type Mem = GuestMemoryAtomic<GuestMemoryMmap<DirtyLog>>;

/// What the vring thread is asked to do, weakest first: when several
/// requests meet, the strongest is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ControlOp {
    None,
    /// GET_VRING_BASE: finish every request in flight, then stop.
    Stop,
    /// A handover: as `Stop`, and take no new chain afterwards.
    Freeze,
    /// RESET_DEVICE: end every request (bounded), forget the session.
    Reset,
    /// The frontend left or the daemon ends: end every request (bounded).
    Shutdown,
}

struct Control {
    op: ControlOp,
    requested: u64,
    done: u64,
}

/// The vring thread's state. The request queue holds coroutines, which
/// must stay on the thread that created them.
struct QueueCell<F: Filesystem> {
    owner: Option<ThreadId>,
    queue: Option<RequestQueue<F>>,
    /// The ring state when the driver acked `VIRTIO_F_RING_PACKED`: built
    /// from the vring's configuration on the first event after the queue
    /// is enabled, synced back for GET_VRING_BASE and dropped when the
    /// ring stops or the device resets. `None`: the split ring of the
    /// vring's `Queue` is used.
    packed: Option<PackedQueue>,
    /// The ring stopped with requests kept in flight (waiting Tlocks, see
    /// [`Virtio9pBackend::stop`]): the guest and ring they belong to.
    paused: Option<Paused>,
}

/// What a ring was when it stopped with requests in flight: when it
/// starts again, they go on only if it is the same guest's same ring.
struct Paused {
    /// Guest memory regions (guest address, length).
    regions: Vec<(u64, u64)>,
    /// Size, descriptor area, driver area, device area.
    ring: (u16, u64, u64, u64),
    /// The base GET_VRING_BASE reported.
    base: u16,
    /// The split ring's next used index (the guest's used index).
    used: u16,
    /// The packed ring state, with the chains in flight.
    packed: Option<PackedQueue>,
}

/// The regions of guest memory: a new memory table with other regions is
/// another guest for the requests a pause kept.
fn regions(mem: &Mem) -> Vec<(u64, u64)> {
    mem.memory()
        .iter()
        .map(|r| (r.start_addr().0, r.len()))
        .collect()
}

// SAFETY: the request queue (the only non-`Send` part) is created, used and
// dropped only on its owner thread: `with_queue` checks the thread on every
// access, and `Drop` leaks a queue that still has coroutines when it runs
// elsewhere. An empty queue holds only `Send` parts.
unsafe impl<F: Filesystem> Send for QueueCell<F> {}

impl<F: Filesystem> Drop for QueueCell<F> {
    fn drop(&mut self) {
        let here = std::thread::current().id();
        if let Some(q) = self.queue.take() {
            if self.owner != Some(here) && q.in_flight() > 0 {
                error!(
                    "virtio-9p: backend dropped off its vring thread with {} requests in flight; leaking them",
                    q.in_flight()
                );
                std::mem::forget(q);
            }
        }
    }
}

/// A virtio-9p device for vhost-user-backend: one request queue, the
/// mount tag in the config space, and a coroutine engine on the vring
/// thread. One backend serves one frontend connection (one 9P session).
///
/// After creating the `VhostUserDaemon`, call [`Virtio9pBackend::register`]
/// with its epoll handler; before dropping the daemon, call
/// [`Virtio9pBackend::shutdown`] so the engine ends on its own thread.
pub struct Virtio9pBackend<F: Filesystem> {
    server: Arc<Server<F>>,
    /// The 9P session of the current driver (a device reset starts a new
    /// one).
    session: Mutex<Arc<Session<F>>>,
    pool: Arc<StackPool>,
    config_space: DeviceConfig,
    queue_size: u16,
    engine: EngineConfig,
    features: u64,
    acked: AtomicU64,
    event_idx: AtomicBool,
    mem: RwLock<Option<Mem>>,
    cell: Mutex<QueueCell<F>>,
    epoll_fd: AtomicI32,
    control_fd: EventFd,
    control: Mutex<Control>,
    control_cv: Condvar,
    /// Set by [`Virtio9pBackend::shutdown`]: a stop still draining gives up.
    shutting_down: AtomicBool,
    /// Set by [`Virtio9pBackend::freeze`]: no chain is taken any more.
    frozen: AtomicBool,
    exit_fds: Mutex<Vec<RawFd>>,
    /// Requests leaked by resets and shutdowns (calls that never returned).
    leaked: AtomicU64,
    /// Where each session is kept crash-safe ([`BackendConfig::state_dir`]).
    state_dir: Option<Arc<OwnedFd>>,
    /// The session was recovered after a crash: the chains the killed
    /// daemon's in-flight table lists are served exactly once.
    recovering: AtomicBool,
    /// The session is a predecessor's ([`Virtio9pBackend::set_session`]):
    /// the packed ring position it recorded may replace a stale base.
    taken_over: AtomicBool,
    /// A device-state transfer of a live migration.
    transfer: super::migrate::Transfer,
    /// A migration's save released the session's host locks for the
    /// destination: if this ring starts again (the migration failed), they
    /// are taken again before any request runs.
    locks_released: AtomicBool,
}

impl<F: Filesystem> std::fmt::Debug for Virtio9pBackend<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Virtio9pBackend")
            .field("tag", &self.config_space)
            .field("queue_size", &self.queue_size)
            .finish()
    }
}

impl<F: Filesystem + 'static> Virtio9pBackend<F> {
    /// A device serving `server` with a fresh 9P session, its request
    /// coroutines on `pool`.
    pub fn new(
        server: Arc<Server<F>>,
        pool: Arc<StackPool>,
        config: &BackendConfig,
    ) -> crate::Result<Self> {
        let config_space = DeviceConfig::new(&config.tag)?;
        let queue_size = crate::virtio::validate_queue_size(u32::from(config.queue_size))?;
        let mut engine = config.engine.clone();
        engine.max_in_flight = usize::from(queue_size);
        Ok(Virtio9pBackend {
            server,
            session: Mutex::new(Arc::new(Session::new())),
            pool,
            config_space,
            queue_size,
            engine,
            features: if config.packed_ring {
                DEVICE_FEATURES
            } else {
                DEVICE_FEATURES & !(1 << VIRTIO_F_RING_PACKED)
            },
            acked: AtomicU64::new(0),
            event_idx: AtomicBool::new(false),
            mem: RwLock::new(None),
            cell: Mutex::new(QueueCell {
                owner: None,
                queue: None,
                packed: None,
                paused: None,
            }),
            epoll_fd: AtomicI32::new(-1),
            control_fd: EventFd::new(EFD_NONBLOCK).map_err(VhostUserError::BackendEvent)?,
            control: Mutex::new(Control {
                op: ControlOp::None,
                requested: 0,
                done: 0,
            }),
            control_cv: Condvar::new(),
            shutting_down: AtomicBool::new(false),
            frozen: AtomicBool::new(false),
            exit_fds: Mutex::new(Vec::new()),
            leaked: AtomicU64::new(0),
            state_dir: config.state_dir.clone(),
            recovering: AtomicBool::new(false),
            taken_over: AtomicBool::new(false),
            transfer: Default::default(),
            locks_released: AtomicBool::new(false),
        })
    }

    /// Hooks the backend into the daemon's (single) vring thread: registers
    /// the control eventfd and remembers the epoll fd for the engine's fds.
    pub fn register(&self, handler: &VringEpollHandler<Arc<Self>>) -> crate::Result<()> {
        self.epoll_fd.store(handler.as_raw_fd(), Ordering::Release);
        handler
            .register_listener(
                self.control_fd.as_raw_fd(),
                EventSet::IN,
                u64::from(CONTROL_EVENT),
            )
            .map_err(|e| VhostUserError::BackendEvent(e).into())
    }

    /// The 9P session of the current driver.
    pub fn session(&self) -> Arc<Session<F>> {
        Arc::clone(&self.session.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Makes this device serve `session` (a restored one) from its first
    /// request: call it before the frontend starts the ring. With a
    /// [`BackendConfig::state_dir`], a packed ring also goes on where the
    /// previous device left it, when the frontend can only give a stale
    /// base (QEMU after it lost its backend; see "Exactly once across a
    /// kill" in the design notes).
    pub fn set_session(&self, session: Arc<Session<F>>) {
        *self.session.lock().unwrap_or_else(|e| e.into_inner()) = session;
        self.taken_over.store(true, Ordering::Release);
    }

    /// With a [`BackendConfig::state_dir`], starts keeping the current
    /// session crash-safe there (its snapshot now, then a journal of its
    /// fid changes). Call it before the frontend starts the ring; a
    /// failure is logged and the device serves without it.
    pub fn start_journal(&self) {
        self.journal(&self.session());
    }

    fn journal(&self, session: &Session<F>) {
        let Some(dir) = &self.state_dir else {
            return;
        };
        if session.is_journaled() {
            return;
        }
        if let Err(e) = self.server.journal_session(session, Arc::clone(dir)) {
            error!("virtio-9p: the session is not kept crash-safe: {e}");
        }
    }

    /// Makes the first ring start serve the chains a killed daemon took
    /// and did not answer, from the in-flight table in the state
    /// directory (the session is one [`Daemon::recover_crashed_session`](super::Daemon::recover_crashed_session)
    /// brought back). Without it, that table is emptied at the first
    /// start.
    pub fn set_recovering(&self, recovering: bool) {
        self.recovering.store(recovering, Ordering::Release);
    }

    /// Gives the request queue its in-flight table (opened at the first
    /// start of the ring, with what a killed daemon left if recovering),
    /// or the ring's current configuration.
    fn inflight<Q: QueueT>(&self, q: &mut RequestQueue<F>, queue: &Q) -> std::io::Result<()> {
        let Some(dir) = &self.state_dir else {
            return Ok(());
        };
        let packed = self.packed();
        if q.has_inflight() {
            if q.table_fits(packed, queue.size()) {
                q.set_ring(packed, queue.size(), queue.desc_table());
                return Ok(());
            }
            // A new SET_VRING_NUM (or layout) after a stop, without a
            // reset: a guest reboot. What the table holds is the old
            // ring's, and its slots would collide: a new table.
            info!(
                "virtio-9p: the ring was started again with {} entries ({} ring): a new in-flight table, {} requests of the old ring forgotten",
                queue.size(),
                if packed { "packed" } else { "split" },
                q.in_flight()
            );
            let table = InflightTable::recreate(dir.as_fd(), queue.size(), packed)?;
            q.set_inflight(
                Arc::new(table),
                Vec::new(),
                None,
                packed,
                queue.size(),
                queue.desc_table(),
            );
            return Ok(());
        }
        let (table, old, ring) = InflightTable::open(dir.as_fd(), queue.size(), packed)?;
        let prior = ring.filter(|_| self.taken_over.swap(false, Ordering::AcqRel));
        let old = if self.recovering.swap(false, Ordering::AcqRel) {
            if !old.is_empty() {
                let open = old.iter().filter(|s| s.state != USED).count();
                info!(
                    "virtio-9p: the killed daemon's in-flight table: {open} chains taken and not answered, {} answered (passed over if offered again)",
                    old.len() - open
                );
            }
            old
        } else {
            table.clear();
            Vec::new()
        };
        q.set_inflight(
            Arc::new(table),
            old,
            prior,
            packed,
            queue.size(),
            queue.desc_table(),
        );
        Ok(())
    }

    /// With a [`BackendConfig::state_dir`], removes the crash-safe state
    /// (the session ended: its frontend left).
    pub fn end_journal(&self) {
        if let Some(dir) = &self.state_dir {
            if let Err(e) = self.server.clear_session_state(dir.as_fd(), false) {
                warn!("virtio-9p: cannot remove the crash-safe state: {e}");
            }
        }
    }

    /// For a handover: finishes every request in flight (their replies go
    /// to the used ring; a waiting Tlock answers BLOCKED) and takes no new
    /// chain afterwards, so the frontend's ring is left with every chain
    /// either answered or not taken. Returns once that is so.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::Release);
        self.control_request(ControlOp::Freeze);
    }

    /// Ends every request (bounded by the engine's `quiesce_timeout`) and
    /// drops the engine on the vring thread, writing nothing more to the
    /// ring. Call before the daemon (and with it the vring thread) goes
    /// away; a stop still draining gives up.
    pub fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        self.control_request(ControlOp::Shutdown);
    }

    /// Requests given up on by resets, disconnects and shutdowns because
    /// their filesystem call did not return within the engine's
    /// `quiesce_timeout` (they are leaked, never freed under the worker).
    pub fn leaked_requests(&self) -> u64 {
        self.leaked.load(Ordering::Acquire)
    }

    fn lock_control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks the vring thread to do `op` and waits until it has. A stop
    /// waits as long as the requests in flight take (the vring thread says
    /// what it waits for); the others are bounded.
    fn control_request(&self, op: ControlOp) {
        if self.epoll_fd.load(Ordering::Acquire) < 0 {
            return;
        }
        let mut c = self.lock_control();
        c.op = c.op.max(op);
        c.requested += 1;
        let ticket = c.requested;
        if let Err(e) = self.control_fd.write(1) {
            error!("virtio-9p: cannot signal the vring thread: {e}");
            return;
        }
        // The vring thread's bound (quiesce, then the worker join) plus
        // slack for the thread to get to the request.
        let bound = (!matches!(op, ControlOp::Stop | ControlOp::Freeze))
            .then(|| self.engine.quiesce_timeout + WORKER_JOIN_TIMEOUT + Duration::from_secs(2));
        let started = Instant::now();
        loop {
            let step = bound.unwrap_or(DRAIN_LOG_EVERY);
            let (guard, _) = self
                .control_cv
                .wait_timeout_while(c, step, |c| c.done < ticket)
                .unwrap_or_else(|e| e.into_inner());
            c = guard;
            if c.done >= ticket {
                return;
            }
            let waited = started.elapsed();
            if bound.is_some() {
                error!("virtio-9p: the vring thread did not answer a {op:?} request in {waited:?}");
                return;
            }
            if self.shutting_down.load(Ordering::Acquire) {
                return;
            }
            warn!("virtio-9p: GET_VRING_BASE still waiting for the vring thread after {waited:?}");
        }
    }

    fn indirect(&self) -> bool {
        indirect_descriptors(self.acked.load(Ordering::Acquire))
    }

    fn packed(&self) -> bool {
        packed_ring(self.acked.load(Ordering::Acquire))
    }

    fn memory(&self) -> Option<Mem> {
        self.mem.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn register_fd(&self, fd: RawFd, data: u16) -> std::io::Result<()> {
        let epfd = self.epoll_fd.load(Ordering::Acquire);
        if epfd < 0 {
            return Err(std::io::Error::other(
                "backend not registered with a vring thread",
            ));
        }
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: u64::from(data),
        };
        // SAFETY: epoll_ctl reads `ev`, valid for the call; both fds are
        // open (the epoll fd lives as long as the vring thread we run on).
        if unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn unregister_fd(&self, fd: RawFd) {
        let epfd = self.epoll_fd.load(Ordering::Acquire);
        if epfd < 0 {
            return;
        }
        // SAFETY: EPOLL_CTL_DEL ignores the event argument; both fds are
        // open (the queue owning `fd` is still alive).
        if unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) } < 0 {
            debug!(
                "virtio-9p: removing fd {fd} from the vring epoll: {}",
                std::io::Error::last_os_error()
            );
        }
    }

    fn handle(&self, device_event: u16, vrings: &[VringRwLock<Mem>]) -> std::io::Result<()> {
        let mut guard = self.cell.lock().unwrap_or_else(|e| e.into_inner());
        let cell = &mut *guard;
        let here = std::thread::current().id();
        match cell.owner {
            None => cell.owner = Some(here),
            Some(o) if o != here => {
                return Err(std::io::Error::other(
                    "virtio-9p backend driven from two threads",
                ));
            }
            Some(_) => {}
        }
        if device_event == CONTROL_EVENT {
            let _ = self.control_fd.read();
            let (op, ticket) = {
                let mut c = self.lock_control();
                let op = std::mem::replace(&mut c.op, ControlOp::None);
                (op, c.requested)
            };
            let result = match op {
                ControlOp::Stop => self.stop(cell, vrings, true),
                ControlOp::Freeze => self.stop(cell, vrings, false),
                ControlOp::Reset => {
                    if let Some(q) = cell.queue.as_mut() {
                        // The ring starts again from scratch.
                        q.clear_inflight();
                        q.forget_ring();
                    }
                    self.recovering.store(false, Ordering::Release);
                    self.taken_over.store(false, Ordering::Release);
                    self.locks_released.store(false, Ordering::Release);
                    self.end_queue(cell);
                    let fresh = Arc::new(Session::new());
                    self.journal(&fresh);
                    *self.session.lock().unwrap_or_else(|e| e.into_inner()) = fresh;
                    Ok(())
                }
                ControlOp::Shutdown => {
                    self.end_queue(cell);
                    Ok(())
                }
                ControlOp::None => Ok(()),
            };
            let mut c = self.lock_control();
            c.done = c.done.max(ticket);
            drop(c);
            self.control_cv.notify_all();
            return result;
        }
        let Some(mem) = self.memory() else {
            return Ok(());
        };
        if device_event == MORE_EVENT {
            if let Some(q) = cell.queue.as_ref() {
                q.clear_more();
            }
        }
        if cell.paused.is_some() {
            self.resume_paused(cell, vrings, &mem);
        }
        if (device_event == QUEUE_EVENT || device_event == MORE_EVENT)
            && self.locks_released.swap(false, Ordering::AcqRel)
        {
            // The ring runs again here after a migration's save: the
            // migration failed, the guest goes on with this device.
            let (taken, lost) = self.server.retake_locks(&self.session());
            warn!("virtio-9p: the ring started again after a migration's save: {taken} locks taken again, {lost} lost");
        }
        if (device_event == QUEUE_EVENT || device_event == MORE_EVENT)
            && self.frozen.load(Ordering::Acquire)
        {
            // Handed over: the chains left are the next daemon's.
            return Ok(());
        }
        if device_event == QUEUE_EVENT || device_event == MORE_EVENT {
            if cell.queue.is_none() {
                let q = RequestQueue::new(
                    Arc::clone(&self.server),
                    self.session(),
                    Arc::clone(&self.pool),
                    &self.engine,
                    self.indirect(),
                )
                .map_err(std::io::Error::other)?;
                self.register_fd(q.engine().wake_fd(), WAKE_EVENT)?;
                self.register_fd(q.engine().timer_fd(), TIMER_EVENT)?;
                self.register_fd(q.more_fd(), MORE_EVENT)?;
                cell.queue = Some(q);
            }
            let Some(q) = cell.queue.as_mut() else {
                return Ok(());
            };
            let Some(vring) = vrings.first() else {
                return Ok(());
            };
            {
                let mut st = vring.get_mut();
                if !st.get_queue().ready() {
                    return Ok(());
                }
                let fresh = cell.packed.is_none() && self.packed();
                if fresh {
                    match PackedQueue::from_queue(st.get_queue()) {
                        Ok(p) => {
                            debug!("virtio-9p: packed ring of {} entries", p.size());
                            cell.packed = Some(p);
                        }
                        Err(e) => {
                            error!("virtio-9p: cannot use the packed ring: {e}");
                            return Ok(());
                        }
                    }
                }
                if !self.packed() && self.taken_over.load(Ordering::Acquire) {
                    // A split ring taken over from a predecessor (a kill
                    // or a handover) started at an available index behind
                    // its used index: the device cannot have used chains
                    // it never took, so the base is stale (a frontend that
                    // lost its back-end and knows no better position, as
                    // QEMU's `last_avail_idx` of 0 for a ring it never
                    // processed). Its own rewind target is the used index.
                    let queue = st.get_queue_mut();
                    let (avail, used) = (queue.next_avail(), queue.next_used());
                    let behind = used.wrapping_sub(avail);
                    if behind != 0 && behind < 0x8000 {
                        warn!(
                            "virtio-9p: the ring was started at available index {avail}, behind its used index {used}: it starts at {used}"
                        );
                        queue.set_next_avail(used);
                    }
                }
                if let Err(e) = self.inflight(q, st.get_queue()) {
                    error!("virtio-9p: no in-flight table, requests are not kept crash-safe: {e}");
                }
                let m = mem.memory();
                if let (true, Some(p)) = (fresh, cell.packed.as_mut()) {
                    q.packed_started(p, st.get_queue().next_avail(), &*m);
                }
                let mut ring = any_ring(st.get_queue_mut(), cell.packed.as_mut());
                if let Err(e) = q.process_ring(&mut ring, m) {
                    error!("virtio-9p: request queue stopped: {e}");
                }
            }
            return Self::complete(q, cell.packed.as_mut(), vrings, Some(&mem), false);
        }
        if device_event == WAKE_EVENT || device_event == TIMER_EVENT {
            if let Some(q) = cell.queue.as_mut() {
                q.poll();
                return Self::complete(q, cell.packed.as_mut(), vrings, Some(&mem), false);
            }
            return Ok(());
        }
        debug!("virtio-9p: unknown device event {device_event}");
        Ok(())
    }

    /// The ring of a paused device is ready again: if it is the same
    /// guest's same ring (memory regions, size, addresses, the base the
    /// stop reported and, split, the guest's used index), the requests the
    /// pause kept go on (a waiting Tlock tries again at once); else they
    /// are discarded with one log line, no reply goes out and no guest
    /// memory is written.
    fn resume_paused(&self, cell: &mut QueueCell<F>, vrings: &[VringRwLock<Mem>], mem: &Mem) {
        let Some(vring) = vrings.first() else {
            return;
        };
        let st = vring.get_ref();
        let queue = st.get_queue();
        if !queue.ready() {
            return;
        }
        let Some(mut p) = cell.paused.take() else {
            return;
        };
        let ring = (
            queue.size(),
            queue.desc_table(),
            queue.avail_ring(),
            queue.used_ring(),
        );
        let why = if p.regions != regions(mem) {
            Some("a new memory table")
        } else if p.ring != ring {
            Some("new ring addresses or size")
        } else if p.packed.is_some() != self.packed() {
            Some("another ring layout")
        } else if queue.next_avail() != p.base {
            Some("another ring base")
        } else if p.packed.is_none()
            && queue
                .used_idx(&*mem.memory(), Ordering::Acquire)
                .ok()
                .map(|u| u.0)
                != Some(p.used)
        {
            Some("a used index that does not fit")
        } else {
            None
        };
        let Some(q) = cell.queue.as_mut() else {
            return;
        };
        match why {
            None => {
                if let Some(pk) = p.packed.as_mut() {
                    pk.set_ready(true);
                    pk.set_event_idx(queue.event_idx_enabled());
                }
                if p.packed.is_some() {
                    cell.packed = p.packed;
                }
                drop(st);
                info!(
                    "virtio-9p: the ring started again: {} requests kept across the pause go on",
                    q.in_flight()
                );
                q.resume_waits();
            }
            Some(why) => {
                drop(st);
                error!(
                    "virtio-9p: the ring started again with {why}: {} requests kept across the pause belong to another guest and are discarded (no reply, no guest memory written)",
                    q.in_flight()
                );
                q.clear_inflight();
                self.end_queue(cell);
            }
        }
    }

    /// GET_VRING_BASE, on the vring thread: every request in flight
    /// finishes and its reply goes to the used ring, with the notification
    /// the driver asked for, before the frontend gets the ring base; then
    /// the device is stopped and writes nothing until the ring starts
    /// again. The session (fids) stays: a stop is a pause. Blocking Tlocks
    /// waiting for a lock are the exception: they stay in flight, taken
    /// and not used (the base counts them as taken, as for any chain a
    /// device holds), make no attempt while the ring is stopped, and go
    /// on when it starts again for the same guest
    /// ([`Virtio9pBackend::resume_paused`]), so a guest waiting for a lock
    /// across `stop`/`cont` gets it as soon as the host frees it.
    /// `reported`: the frontend gets the ring base (GET_VRING_BASE; a
    /// handover's freeze tells it nothing, and answers waiting Tlocks
    /// BLOCKED, as does a stop while the frontend logs dirty memory for a
    /// live migration, `VHOST_F_LOG_ALL` acked).
    fn stop(
        &self,
        cell: &mut QueueCell<F>,
        vrings: &[VringRwLock<Mem>],
        reported: bool,
    ) -> std::io::Result<()> {
        if let Some(p) = cell.paused.take() {
            // Stopped again (a freeze after a pause): the kept requests
            // end on the ring they came from.
            if p.packed.is_some() {
                cell.packed = p.packed;
            }
        }
        // A stop while the frontend logs dirty memory (VHOST_F_LOG_ALL) is
        // a live migration's: the ring goes on in another back-end, so
        // nothing may stay in flight here; waiting Tlocks answer BLOCKED.
        let migrating =
            self.acked.load(Ordering::Acquire) & VhostUserVirtioFeatures::LOG_ALL.bits() != 0;
        let mut kept = 0;
        if let Some(q) = cell.queue.as_mut() {
            let give_up = || self.shutting_down.load(Ordering::Acquire);
            let left = if reported && !migrating {
                q.pause(give_up)
            } else {
                q.drain(give_up)
            };
            if reported && !migrating && !give_up() {
                kept = left;
            }
            if left == kept {
                Self::complete(
                    q,
                    cell.packed.as_mut(),
                    vrings,
                    self.memory().as_ref(),
                    true,
                )?;
            } else {
                // Shutting down: the shutdown that follows ends the rest.
                warn!("virtio-9p: stop abandoned with {left} requests in flight: shutting down");
            }
            if left == 0 {
                // Everything taken is on the used ring: nothing to recover.
                q.clear_inflight();
            }
            q.reset(self.indirect()).map_err(std::io::Error::other)?;
        }
        // The packed position goes where GET_VRING_BASE reads it, and the
        // next start builds the ring state afresh, unless requests were
        // kept: then the state with their slots goes on if the same ring
        // starts again.
        let mut packed = None;
        if let Some(p) = cell.packed.take() {
            if let Some(vring) = vrings.first() {
                p.sync_to(vring.get_mut().get_queue_mut());
            }
            if let (true, Some(q)) = (reported, cell.queue.as_mut()) {
                q.packed_stopped(p.avail_base());
            }
            packed = Some(p);
        }
        if kept > 0 {
            if let (Some(vring), Some(mem)) = (vrings.first(), self.memory()) {
                let st = vring.get_mut();
                let queue = st.get_queue();
                info!("virtio-9p: paused with {kept} waiting Tlocks kept in flight");
                cell.paused = Some(Paused {
                    regions: regions(&mem),
                    ring: (
                        queue.size(),
                        queue.desc_table(),
                        queue.avail_ring(),
                        queue.used_ring(),
                    ),
                    base: queue.next_avail(),
                    used: queue.next_used(),
                    packed,
                });
            }
        }
        Ok(())
    }

    /// Device reset and shutdown, on the vring thread: every request ends
    /// (cancelled; a call that does not return within the engine's
    /// `quiesce_timeout` is given up on and can no longer touch guest
    /// memory), nothing more goes to the ring (the driver forgot it), and
    /// the request queue with its engine and workers is dropped. The next
    /// start builds a new one.
    fn end_queue(&self, cell: &mut QueueCell<F>) {
        cell.paused = None;
        if let Some(mut q) = cell.queue.take() {
            let leaked = q.cancel_all();
            if leaked > 0 {
                self.leaked.fetch_add(leaked as u64, Ordering::AcqRel);
            }
            q.discard_completed();
            for fd in [q.engine().wake_fd(), q.engine().timer_fd(), q.more_fd()] {
                self.unregister_fd(fd);
            }
        }
        cell.packed = None;
    }

    /// Completions of coroutines and Tflush go to the ring the chains came
    /// from (split or packed), under the vring's lock. A ring that is not
    /// ready gets nothing except from the drain of a stop (`stopping`),
    /// which GET_VRING_BASE answers only afterwards.
    fn complete(
        q: &mut RequestQueue<F>,
        packed: Option<&mut PackedQueue>,
        vrings: &[VringRwLock<Mem>],
        mem: Option<&Mem>,
        stopping: bool,
    ) -> std::io::Result<()> {
        let (Some(vring), Some(mem)) = (vrings.first(), mem) else {
            q.discard_completed();
            return Ok(());
        };
        let mut st = vring.get_mut();
        if !st.get_queue().ready() && !stopping {
            // GET_VRING_BASE clears `ready` on the frontend's thread before
            // our stop runs here: completions that land in between wait in
            // the queue for the stop's drain. Dropping them would lose the
            // reply (split) or leave a hole the driver waits on forever
            // (packed). Reset and shutdown drop theirs in `end_queue`.
            return Ok(());
        }
        let m = mem.memory();
        let notify = {
            let mut ring = any_ring(st.get_queue_mut(), packed);
            match q.complete_and_check_signal(&mut ring, &*m) {
                Ok(notify) => notify,
                Err(e) => {
                    error!("virtio-9p: {e}");
                    false
                }
            }
        };
        if notify {
            st.signal_used_queue()?;
        }
        Ok(())
    }
}

/// The ring of the vring's queue: the packed state if the driver acked
/// packed rings, else the split ring of `queue`.
fn any_ring<'q, Q>(queue: &'q mut Q, packed: Option<&'q mut PackedQueue>) -> AnyRing<'q, Q> {
    match packed {
        Some(p) => AnyRing::Packed(p),
        None => AnyRing::Split(queue),
    }
}

/// Closes the exit-event fds handed to vhost-user-backend.
///
/// vhost-user-backend 0.24 registers the consumer half of
/// [`exit_event`](VhostUserBackend::exit_event) with `into_raw_fd()` and
/// never closes it: one fd would leak per `VhostUserDaemon`. Every part of
/// a `VhostUserDaemon` that could use that fd (its handler and vring epoll
/// threads) holds an `Arc` of this backend, so once the backend drops,
/// nothing owns the fds any more.
impl<F: Filesystem> Drop for Virtio9pBackend<F> {
    fn drop(&mut self) {
        for fd in self
            .exit_fds
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            // SAFETY: the daemon that leaked `fd` held an Arc of this
            // backend and is gone (see above); nothing else owns the fd.
            unsafe { libc::close(fd) };
        }
    }
}

impl<F: Filesystem + 'static> VhostUserBackend for Virtio9pBackend<F> {
    type Bitmap = DirtyLog;
    type Vring = VringRwLock<Mem>;

    fn num_queues(&self) -> usize {
        1
    }

    fn max_queue_size(&self) -> usize {
        usize::from(self.queue_size)
    }

    fn features(&self) -> u64 {
        // VHOST_F_LOG_ALL: every guest-memory write is logged once the
        // frontend gave a log (SET_LOG_BASE).
        self.features
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | VhostUserVirtioFeatures::LOG_ALL.bits()
    }

    fn acked_features(&self, features: u64) {
        // The guest conformance run greps this line for the ring layout.
        let ring = if packed_ring(features) {
            "packed"
        } else {
            "split"
        };
        info!("virtio-9p: driver acked features {features:#x} ({ring} ring)");
        self.acked.store(features, Ordering::Release);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        protocol_features()
    }

    fn reset_device(&self) {
        self.control_request(ControlOp::Reset);
        self.acked.store(0, Ordering::Release);
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Release);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        self.config_space.read(offset, size)
    }

    fn set_config(&self, _offset: u32, _buf: &[u8]) -> std::io::Result<()> {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the virtio-9p config space is read-only",
        ))
    }

    fn update_memory(&self, mem: Mem) -> std::io::Result<()> {
        *self.mem.write().unwrap_or_else(|e| e.into_inner()) = Some(mem);
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        vec![1]
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC) {
            Ok(pair) => {
                self.exit_fds
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(pair.0.as_raw_fd());
                Some(pair)
            }
            Err(e) => {
                error!("virtio-9p: cannot create the vring thread's exit event: {e}");
                None
            }
        }
    }

    /// SAVE: the session as [`Server::save_session`] saves it, written to
    /// `file` on a thread; refused while a stop kept waiting Tlocks in
    /// flight (they cannot cross yet). LOAD: `file` read on a thread;
    /// [`VhostUserBackend::check_device_state`] restores it.
    fn set_device_state_fd(
        &self,
        direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        file: std::fs::File,
    ) -> std::io::Result<Option<std::fs::File>> {
        match direction {
            VhostTransferStateDirection::SAVE => {
                let kept = self
                    .cell
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .paused
                    .is_some();
                if kept {
                    error!("virtio-9p: migration refused: Tlocks are waiting in flight");
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::ResourceBusy,
                        "Tlocks are waiting in flight",
                    ));
                }
                let bytes = self.server.save_session(&self.session()).map_err(|e| {
                    error!("virtio-9p: migration: cannot save the session: {e}");
                    std::io::Error::other(e)
                })?;
                info!(
                    "virtio-9p: migration: saving {} bytes of device state",
                    bytes.len()
                );
                self.transfer.start_save(bytes, file)?;
                // The destination takes the locks again; on one host or a
                // shared filesystem it can only once this process let go.
                let released = self.server.release_locks(&self.session());
                if released > 0 {
                    self.locks_released.store(true, Ordering::Release);
                    info!("virtio-9p: migration: released the host locks of {released} open files for the destination");
                }
            }
            VhostTransferStateDirection::LOAD => self.transfer.start_load(file)?,
        }
        Ok(None)
    }

    /// Waits for the transfer; after a LOAD, makes the session it carried
    /// this device's, or refuses it with one line naming why (truncated,
    /// damaged, another version, another export): the migration fails and
    /// nothing of the state is used.
    fn check_device_state(&self) -> std::io::Result<()> {
        let bytes = match self.transfer.finish() {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Ok(()),
            Err(e) => {
                error!("virtio-9p: migration: device state transfer failed: {e}");
                return Err(e);
            }
        };
        match self.server.restore_migrated_session(&bytes) {
            Ok(session) => {
                info!(
                    "virtio-9p: migration: session restored ({} bytes of device state)",
                    bytes.len()
                );
                let session = Arc::new(session);
                self.set_session(Arc::clone(&session));
                // With a state directory, the migrated session is kept
                // crash-safe from now on, as a fresh one is.
                self.journal(&session);
                Ok(())
            }
            Err(e) => {
                error!("virtio-9p: migration: device state refused: {e}");
                Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
            }
        }
    }

    fn stop_vring(&self, _queue_index: u32) -> std::io::Result<()> {
        self.control_request(ControlOp::Stop);
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock<Mem>],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        self.handle(device_event, vrings)
    }
}
