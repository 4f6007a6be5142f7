// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Serving one request queue: pop, start a coroutine per chain, complete.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use coro_pool::StackPool;
use log::{error, warn};
use virtio_queue::QueueT;
use virtqueue_large::{ChainWalker, DeviceRing, SplitRing, WalkerStats};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::io::{ChainReader, ChainWriter};
use super::VirtioError;
use crate::engine::{self, Engine, EngineConfig, EngineExec, EngineStats};
use crate::error::Result;
use crate::fs::Filesystem;
use crate::persist::inflight_table::{
    request_digest, InflightTable, Left, RequestRecord, RingRecord, Slot, INTENT, USED,
};
use crate::protocol::{Header, MsgType, HEADER_SIZE};
use crate::server::{Cancel, Server, Session};

/// Descriptors one [`RequestQueue::process`] call walks at most (a chain
/// fault counts as a full chain, 32768 + 3 descriptors).
/// The rest of the ring waits for the next round of the event loop, which
/// [`RequestQueue::more_fd`] triggers: one kick cannot make the device walk
/// queue size x 32768 descriptors before it serves anything else.
pub const KICK_BUDGET: u32 = 65_536;

/// Segments (16 bytes each) the chains in flight may hold together: 4 MiB.
/// While they hold more, no further chain is popped; completions resume
/// the queue through [`RequestQueue::more_fd`].
pub const MAX_IN_FLIGHT_SEGMENTS: usize = 1 << 18;

/// A request's slot in the in-flight table.
struct SlotRecord {
    table: Arc<InflightTable>,
    pos: u32,
}

impl RequestRecord for SlotRecord {
    fn intent(&self, time: u64, qid: u64) {
        self.table.intent(self.pos, time, qid);
    }

    fn commit(&self, reply: &[u8]) {
        self.table.commit(self.pos, reply);
    }
}

/// The crash bookkeeping of a queue kept in a state directory: every
/// chain taken and used goes to the in-flight table, and the chains a
/// killed instance left are served exactly once (see
/// [`RequestQueue::set_inflight`]).
struct Book {
    table: Arc<InflightTable>,
    packed: bool,
    size: u16,
    desc_area: u64,
    /// The position of each chain in flight, by head index or buffer id.
    pos_of: Vec<u32>,
    /// What a killed instance left, by position, with whether its reply
    /// reached the driver; until served or passed over.
    old: HashMap<u32, (Slot, bool)>,
    /// Whether `old` was sorted against the ring's first positions.
    classified: bool,
    /// Chains a killed instance took and did not answer, before the
    /// position the frontend rewound to: served without being offered.
    adopt: Vec<Slot>,
    /// A packed ring's position as recorded in the table (kept current
    /// on the data path); `None` on a split ring.
    ring: Option<RingRecord>,
    /// The packed ring position the previous instance recorded, until
    /// the first start of the ring weighs it against the frontend's base.
    prior: Option<RingRecord>,
}

impl Book {
    fn modulus(&self) -> u32 {
        if self.packed {
            2 * u32::from(self.size)
        } else {
            1 << 16
        }
    }

    /// A ring position (the split index, or the packed slot with its wrap
    /// counter in bit 15) as a count modulo [`Book::modulus`].
    fn lin(&self, enc: u16) -> u32 {
        if self.packed {
            let slot = u32::from(enc & 0x7fff);
            if enc & 0x8000 != 0 {
                slot
            } else {
                slot + u32::from(self.size)
            }
        } else {
            u32::from(enc)
        }
    }

    /// Stores the ring word after the next available or next used
    /// position moved (packed rings only).
    fn ring_moved(&mut self, avail: u32, used: u16) {
        if let Some(r) = self.ring.as_mut() {
            r.avail = avail as u16;
            r.used = used;
            self.table.store_ring_word(r.word());
        }
    }

    /// Where a packed ring the previous instance served goes on, when the
    /// frontend starts it at a base that can only be stale: the base
    /// `started` is the one that instance recorded as the frontend's
    /// knowledge (what it started the ring with, or reported at its last
    /// stop), the ring is the same (size and addresses), and the recorded
    /// position differs. QEMU does exactly this: when GET_VRING_BASE
    /// fails because the backend is gone, it cannot read a packed ring's
    /// position back (`virtio_queue_packed_restore_last_avail_idx` does
    /// nothing) and sends the base it last knew at the reconnect. A used
    /// element written after the ring word (a kill between the two) is
    /// counted in; a ring whose slot before the recorded used position is
    /// not a used descriptor of that lap (a driver that reset and laid out
    /// a fresh ring at the same address) is not resumed.
    fn resume_base<G: GuestMemoryBackend>(
        &self,
        prior: &RingRecord,
        started: u16,
        addrs: [u64; 3],
        mem: &G,
    ) -> Option<u32> {
        if prior.addrs != addrs || prior.started != started {
            return None;
        }
        let size = self.size;
        let desc = |slot: u16| -> Option<(u16, u16)> {
            let at = GuestAddress(self.desc_area + 16 * u64::from(slot));
            let mut d = [0u8; 16];
            mem.read_slice(&mut d, at).ok()?;
            Some((
                u16::from_le_bytes([d[12], d[13]]),
                u16::from_le_bytes([d[14], d[15]]),
            ))
        };
        let (avail_flag, used_flag) = (1u16 << 7, 1u16 << 15);
        let (mut slot, mut wrap) = (prior.used & 0x7fff, prior.used & 0x8000 != 0);
        if slot >= size || prior.avail & 0x7fff >= size {
            return None;
        }
        // Used elements past the recorded used position.
        for _ in 0..size {
            let (id, flags) = desc(slot)?;
            let lap = if wrap { avail_flag | used_flag } else { 0 };
            if flags & (avail_flag | used_flag) != lap {
                break;
            }
            let here = self.lin(encode(slot, wrap));
            let Some((s, _)) = self
                .old
                .values()
                .find(|(s, _)| s.state == USED && s.used == here && s.id == id)
            else {
                break;
            };
            let next = u32::from(slot) + u32::from(s.slots.max(1));
            if next >= u32::from(size) {
                wrap = !wrap;
            }
            slot = (next % u32::from(size)) as u16;
        }
        // The slot before it was made available in that lap (it may hold
        // a used element since, or be available again for the next lap):
        // neither flag can differ from that lap's wrap counter. A zeroed
        // ring in the first lap fails this.
        let (prev, prev_wrap) = if slot == 0 {
            (size - 1, !wrap)
        } else {
            (slot - 1, wrap)
        };
        if (slot, wrap) != (0, true) {
            let (_, flags) = desc(prev)?;
            if (flags & avail_flag != 0) != prev_wrap && (flags & used_flag != 0) != prev_wrap {
                log::warn!(
                    "9p: the packed ring does not hold what this device recorded: it starts at the frontend's base"
                );
                return None;
            }
        }
        // Taken again from the used position, as a split ring's rewind
        // does: the chains after it are still in their ring slots (the
        // table sorts out which were answered), and a chain spread over
        // several slots can only be walked from there. Unless that
        // position is not a chain's first slot (chains of several slots
        // answered out of order): then from the recorded available one.
        let used = encode(slot, wrap);
        let head = self.lin(used);
        let avail = if head == self.lin(prior.avail) || self.old.contains_key(&head) {
            used
        } else {
            prior.avail
        };
        let base = u32::from(avail) | u32::from(used) << 16;
        (base != u32::from(started) | u32::from(started) << 16).then_some(base)
    }

    /// Whether position `a` comes before `b` (less than a ring apart).
    fn before(&self, a: u32, b: u32) -> bool {
        let m = self.modulus();
        let d = (b + m - a % m) % m;
        d != 0 && d <= u32::from(self.size)
    }

    /// Forgets everything a killed instance left (its table belongs to
    /// another guest, or another run of this one: `why`), with one log
    /// line: no recorded reply goes out, no recorded chain is walked, and
    /// the slots are emptied so that a later crash does not find them.
    fn discard_old(&mut self, why: &str) {
        let n = self.old.len() + self.adopt.len();
        if n == 0 {
            return;
        }
        for pos in self.old.keys() {
            self.table.forget(*pos);
        }
        for s in &self.adopt {
            self.table.forget(s.pos);
        }
        self.old.clear();
        self.adopt.clear();
        self.prior = None;
        log::error!(
            "9p: the in-flight table the killed daemon left is not this guest's ({why}): its {n} requests are discarded, none is answered or run"
        );
    }

    /// Whether every slot a killed instance left sits where a chain of
    /// this ring can be, around the next used position `used`: taken and
    /// not yet used (less than a ring ahead of it), or at most a ring
    /// behind it (the table keeps one lap). A split ring's positions run
    /// modulo 65536, so a guest that started afresh (used index 0) rarely
    /// fits a table of a run that had gone further; a packed ring's run
    /// modulo twice its size, where every position fits.
    fn old_fits(&self, used: u32) -> bool {
        let m = self.modulus();
        let size = u32::from(self.size);
        self.old.values().all(|(s, _)| {
            let ahead = (s.pos + m - used % m) % m;
            let behind = (used + m - s.pos % m) % m;
            // A used element is at most at the used position (written,
            // its index not yet published), never past it.
            let used_fits = s.state != USED || s.used % m == used % m || self.before(s.used, used);
            (ahead < size || behind <= size) && used_fits
        })
    }

    /// Sorts what a killed instance left against the ring's positions now
    /// (before anything is taken): `avail` the next chain the frontend
    /// offers, `used` the next used position.
    fn classify(&mut self, avail: u32, used: u32) {
        self.classified = true;
        if !self.old_fits(used) {
            self.discard_old("positions or used elements that do not fit the ring's used index");
            return;
        }
        let old = std::mem::take(&mut self.old);
        for (pos, (s, _)) in old {
            let delivered = s.state == USED && self.before(s.used, used);
            let offered = !self.before(pos, avail);
            match (delivered, offered) {
                (true, true) => {
                    self.old.insert(pos, (s, true));
                }
                (true, false) => self.table.forget(pos),
                (false, true) => {
                    self.old.insert(pos, (s, false));
                }
                (false, false) => self.adopt.push(s),
            }
        }
        self.adopt.sort_by_key(|s| s.pos);
        let passed = self.old.values().filter(|(_, d)| *d).count();
        log::info!(
            "9p: recovery at position {avail} (used {used}): {passed} answered chains offered again are passed over, {} taken chains are offered again, {} are served from the table",
            self.old.len() - passed,
            self.adopt.len()
        );
    }
}

/// The request queue of one virtio-9p device: chain walker, engine and the
/// 9P session of the device.
///
/// It is not `Send` (its coroutines belong to the thread that drives it):
/// create and drive it on the vring thread.
pub struct RequestQueue<F: Filesystem> {
    server: Arc<Server<F>>,
    session: Arc<Session<F>>,
    walker: ChainWalker,
    indirect: bool,
    engine: Engine,
    exec: EngineExec,
    done: Vec<(u16, u32)>,
    broken: bool,
    /// Signalled when chains were left on the ring (see [`KICK_BUDGET`]).
    more: EventFd,
    /// Chains were left on the ring because of the in-flight segment limit.
    stalled: bool,
    /// Segments of the chains in flight, and of each one by head index.
    segments: usize,
    segments_of: Vec<u32>,
    /// The in-flight table, with a state directory.
    book: Option<Book>,
}

impl<F: Filesystem> std::fmt::Debug for RequestQueue<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestQueue")
            .field("engine", &self.engine)
            .field("broken", &self.broken)
            .finish()
    }
}

impl<F: Filesystem> RequestQueue<F> {
    /// Requests in flight.
    pub fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }
}

impl<F: Filesystem + 'static> RequestQueue<F> {
    /// A queue serving `session` of `server`, its coroutines on `pool`.
    /// `indirect`: the driver acked indirect descriptors.
    pub fn new(
        server: Arc<Server<F>>,
        session: Arc<Session<F>>,
        pool: Arc<StackPool>,
        config: &EngineConfig,
        indirect: bool,
    ) -> Result<Self> {
        let walker =
            ChainWalker::new(super::chain_limits(indirect)).map_err(VirtioError::ChainLimits)?;
        Ok(RequestQueue {
            server,
            session,
            walker,
            indirect,
            engine: Engine::new(pool, config)?,
            exec: EngineExec::new(config.offload),
            done: Vec::new(),
            broken: false,
            more: EventFd::new(EFD_NONBLOCK).map_err(VirtioError::ResumeFd)?,
            stalled: false,
            segments: 0,
            segments_of: Vec::new(),
            book: None,
        })
    }

    #[cfg_attr(not(feature = "vhost-user"), allow(dead_code))]
    /// Records every chain this queue takes and uses in `table` (the
    /// crash bookkeeping of a device with a state directory), and serves
    /// the chains `old` lists, which a killed instance took and did not
    /// answer, exactly once: a chain whose used element the driver has
    /// is passed over when offered again; one whose reply was recorded
    /// gets that reply; the others run (see `persist::exactly_once`). Call it
    /// before the first [`RequestQueue::process_ring`], with the ring
    /// configuration: `packed` layout, `size` entries, descriptors at
    /// guest address `desc_area`.
    pub(crate) fn set_inflight(
        &mut self,
        table: Arc<InflightTable>,
        old: Vec<Slot>,
        prior: Option<RingRecord>,
        packed: bool,
        size: u16,
        desc_area: u64,
    ) {
        self.book = Some(Book {
            table,
            packed,
            size,
            desc_area,
            pos_of: vec![0; usize::from(size)],
            old: old.into_iter().map(|s| (s.pos, (s, false))).collect(),
            classified: false,
            adopt: Vec::new(),
            ring: None,
            prior,
        });
    }

    #[cfg_attr(not(feature = "vhost-user"), allow(dead_code))]
    /// A packed ring `p` starts, at the frontend's base `started` (its
    /// `SET_VRING_BASE`): at its first start after a predecessor, the
    /// position that predecessor recorded replaces a stale base (see
    /// `Book::resume_base`); then the ring's position is recorded.
    pub(crate) fn packed_started<G: GuestMemoryBackend>(
        &mut self,
        p: &mut virtqueue_large::PackedQueue,
        started: u16,
        mem: &G,
    ) {
        let Some(b) = self.book.as_mut() else {
            return;
        };
        let (d, a, u) = p.addresses();
        let addrs = [d.0, a.0, u.0];
        if let Some(prior) = b.prior.take() {
            if let Some(base) = b.resume_base(&prior, started, addrs, mem) {
                match p.set_ring_base(base) {
                    Ok(()) => log::info!(
                        "9p: the frontend started the packed ring at its stale base {started:#x}: it goes on where this device's predecessor left it ({base:#x})"
                    ),
                    Err(e) => warn!("9p: the recorded packed ring position is not usable: {e}"),
                }
            }
        }
        let (slot, wrap) = p.next_used();
        let rec = RingRecord {
            avail: p.avail_base(),
            used: encode(slot, wrap),
            started,
            addrs,
        };
        b.table.set_ring(&rec);
        b.ring = Some(rec);
    }

    #[cfg_attr(not(feature = "vhost-user"), allow(dead_code))]
    /// The packed ring stopped and the frontend was told `reported` as
    /// its base (GET_VRING_BASE): what it knows from now on.
    pub(crate) fn packed_stopped(&mut self, reported: u16) {
        if let Some(b) = self.book.as_mut() {
            if let Some(r) = b.ring.as_mut() {
                r.started = reported;
                b.table.store_ring_word(r.word());
            }
        }
    }

    #[cfg_attr(not(feature = "vhost-user"), allow(dead_code))]
    /// Forgets the ring position (the device was reset: the next ring is
    /// a fresh one).
    pub(crate) fn forget_ring(&mut self) {
        if let Some(b) = self.book.as_mut() {
            b.ring = None;
            b.prior = None;
            b.table.forget_ring();
        }
    }

    #[cfg_attr(not(feature = "vhost-user"), allow(dead_code))]
    /// Whether [`RequestQueue::set_inflight`] was called.
    pub(crate) fn has_inflight(&self) -> bool {
        self.book.is_some()
    }

    #[cfg_attr(not(feature = "vhost-user"), allow(dead_code))]
    /// Whether the in-flight table is laid out for a ring of `size`
    /// entries and `packed` layout (its slots are positions modulo the
    /// size: a table of another size would let chains collide).
    pub(crate) fn table_fits(&self, packed: bool, size: u16) -> bool {
        self.book
            .as_ref()
            .is_none_or(|b| b.packed == packed && b.table.queue_size() == size)
    }

    #[cfg_attr(not(feature = "vhost-user"), allow(dead_code))]
    /// A new ring configuration (the ring started again after a stop), of
    /// the size and layout of the table ([`RequestQueue::table_fits`];
    /// else give the queue a new table with
    /// [`RequestQueue::set_inflight`]).
    pub(crate) fn set_ring(&mut self, packed: bool, size: u16, desc_area: u64) {
        if let Some(b) = self.book.as_mut() {
            debug_assert!(b.packed == packed && b.table.queue_size() == size);
            b.desc_area = desc_area;
        }
    }

    #[cfg_attr(not(feature = "vhost-user"), allow(dead_code))]
    /// Forgets every chain in the in-flight table (the ring stopped with
    /// nothing in flight, or was reset).
    pub(crate) fn clear_inflight(&mut self) {
        if let Some(b) = self.book.as_mut() {
            b.table.clear();
            b.old.clear();
            b.adopt.clear();
        }
    }

    /// Serves `session` from now on (a device reset starts a fresh one, a
    /// restore brings back a saved one). Call with nothing in flight.
    pub(crate) fn set_session(&mut self, session: Arc<Session<F>>) {
        self.session = session;
    }

    /// The 9P session the queue serves.
    pub(crate) fn session(&self) -> &Arc<Session<F>> {
        &self.session
    }

    /// An eventfd that becomes readable when the queue left chains on the
    /// ring and wants [`RequestQueue::process`] called again. Poll it
    /// beside the kick; when readable, read it and process as for a kick.
    pub fn more_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.more.as_raw_fd()
    }

    /// Reads [`RequestQueue::more_fd`] (call before processing for it).
    pub fn clear_more(&self) {
        let _ = self.more.read();
    }

    /// Segments held by the chains in flight.
    pub fn segments_in_flight(&self) -> usize {
        self.segments
    }

    /// Asks for another round of the event loop.
    fn resume_later(&self) {
        if let Err(e) = self.more.write(1) {
            error!("9p: cannot signal the queue's resume eventfd: {e}");
        }
    }

    /// Accounts the chains in `done` as finished.
    fn finish_done(&mut self) {
        for (head, _) in &self.done {
            if let Some(n) = self.segments_of.get_mut(usize::from(*head)) {
                self.segments -= std::mem::take(n) as usize;
            }
        }
        if self.stalled && self.segments < MAX_IN_FLIGHT_SEGMENTS {
            self.stalled = false;
            self.resume_later();
        }
    }

    /// The engine (its fds must be polled: [`Engine::wake_fd`],
    /// [`Engine::timer_fd`]).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Engine counters.
    pub fn engine_stats(&self) -> EngineStats {
        self.engine.stats()
    }

    /// Chain walker counters (chains, faults, ring errors).
    pub fn walker_stats(&self) -> WalkerStats {
        self.walker.stats()
    }

    /// Whether a ring-level error stopped the queue.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Forgets a ring-level error (the driver reset the queue).
    pub fn reset(&mut self, indirect: bool) -> Result<()> {
        self.broken = false;
        if self.engine.in_flight() == 0 {
            self.segments = 0;
            self.segments_of.clear();
            self.stalled = false;
        }
        if indirect != self.indirect {
            self.walker = ChainWalker::new(super::chain_limits(indirect))
                .map_err(VirtioError::ChainLimits)?;
            self.indirect = indirect;
        }
        Ok(())
    }

    /// Pops every available chain of a split queue and starts its
    /// request: [`process_ring`](Self::process_ring) on a
    /// [`SplitRing`].
    pub fn process<Q, M>(&mut self, queue: &mut Q, mem: M) -> Result<()>
    where
        Q: QueueT,
        M: Deref + Clone + Send + 'static,
        M::Target: GuestMemoryBackend + Sized,
    {
        self.process_ring(&mut SplitRing(queue), mem)
    }

    /// Pops every available chain of `ring` (split or packed) and starts
    /// its request. With event-idx the avail event is rearmed and the ring
    /// rechecked, so no kick is lost. Finished requests are left for
    /// [`RequestQueue::complete_ring`].
    pub fn process_ring<R, M>(&mut self, ring: &mut R, mem: M) -> Result<()>
    where
        R: DeviceRing,
        M: Deref + Clone + Send + 'static,
        M::Target: GuestMemoryBackend + Sized,
    {
        if self.broken {
            return Ok(());
        }
        if let Some(b) = self.book.as_mut() {
            if !b.classified {
                let (avail, used) = (b.lin(ring.ring_base() as u16), b.lin(ring.used_position()));
                b.classify(avail, used);
            }
        }
        let mut budget = KICK_BUDGET;
        loop {
            ring.disable_kicks(mem.deref()).map_err(VirtioError::Used)?;
            loop {
                // Notifications stay disabled when chains are left: the
                // queue resumes itself through `more`.
                if self.segments >= MAX_IN_FLIGHT_SEGMENTS {
                    self.stalled = true;
                    return Ok(());
                }
                if budget == 0 {
                    self.resume_later();
                    return Ok(());
                }
                let pos = match self.book.as_mut() {
                    None => None,
                    Some(b) => {
                        let p = b.lin(ring.ring_base() as u16);
                        let left = if b.old.is_empty() {
                            None
                        } else {
                            b.old.get(&p)
                        };
                        if let Some((s, true)) = left {
                            // Its used element is the driver's already.
                            let slots = s.slots.max(1);
                            if ring
                                .skip_available(mem.deref(), slots)
                                .map_err(VirtioError::Used)?
                            {
                                b.old.remove(&p);
                                b.ring_moved(ring.ring_base(), ring.used_position());
                                continue;
                            }
                            break;
                        }
                        Some(p)
                    }
                };
                match ring.pop_chain(&mut self.walker, mem.clone()) {
                    Ok(Some(chain)) => {
                        budget = budget.saturating_sub(chain.descriptor_count());
                        let book = pos.map(|p| self.took(p, ring, mem.deref()));
                        self.start(chain, book);
                        if let Some(b) = self.book.as_mut() {
                            b.ring_moved(ring.ring_base(), ring.used_position());
                        }
                    }
                    Ok(None) => {
                        self.adopt_left(ring, &mem);
                        break;
                    }
                    // Logged and consumed by the walker (length-0 used entry).
                    Err(e) if e.is_chain_fault() => {
                        budget = budget.saturating_sub(super::MAX_CHAIN_DESCRIPTORS);
                        continue;
                    }
                    Err(e) => {
                        self.broken = true;
                        return Err(VirtioError::Ring(e).into());
                    }
                }
            }
            match ring.enable_kicks(mem.deref()) {
                Ok(true) => continue,
                Ok(false) => return Ok(()),
                Err(e) => return Err(VirtioError::Used(e).into()),
            }
        }
    }

    /// Resumes requests whose blocking calls finished or whose sleep ended
    /// (call when [`Engine::wake_fd`] or [`Engine::timer_fd`] is readable).
    pub fn poll(&mut self) {
        self.engine.poll();
    }

    /// Puts finished requests on the used ring of a split queue:
    /// [`complete_ring`](Self::complete_ring) on a [`SplitRing`]. The
    /// caller signals the driver if `queue.needs_notification()` says so.
    pub fn complete<Q, G>(&mut self, queue: &mut Q, mem: &G) -> Result<bool>
    where
        Q: QueueT,
        G: GuestMemoryBackend,
    {
        self.complete_ring(&mut SplitRing(queue), mem)
    }

    /// Puts finished requests on the used ring of `ring` (split or
    /// packed; for packed, the buffer id of each chain). Returns true if
    /// any, in which case the caller signals the driver if
    /// [`DeviceRing::notify_needed`] says so (or when it fails: a driver
    /// with a broken event area is signalled rather than left waiting).
    pub fn complete_ring<R, G>(&mut self, ring: &mut R, mem: &G) -> Result<bool>
    where
        R: DeviceRing,
        G: GuestMemoryBackend,
    {
        self.engine.take_completed(&mut self.done);
        self.finish_done();
        let any = !self.done.is_empty();
        for (head, len) in self.done.drain(..) {
            if let Some(b) = self.book.as_ref() {
                if let Some(&pos) = b.pos_of.get(usize::from(head)) {
                    b.table.used(pos, b.lin(ring.used_position()));
                }
            }
            ring.push_used(mem, head, len).map_err(VirtioError::Used)?;
            if let Some(b) = self.book.as_mut() {
                b.ring_moved(ring.ring_base(), ring.used_position());
            }
        }
        Ok(any)
    }

    /// [`complete_ring`](Self::complete_ring), then whether to signal the
    /// driver: what [`DeviceRing::notify_needed`] says, or yes when it
    /// fails (a broken event suppression area gets a signal rather than a
    /// driver left waiting).
    pub(crate) fn complete_and_check_signal<R, G>(&mut self, ring: &mut R, mem: &G) -> Result<bool>
    where
        R: DeviceRing,
        G: GuestMemoryBackend,
    {
        Ok(self.complete_ring(ring, mem)? && ring.notify_needed(mem).unwrap_or(true))
    }

    /// Drops the finished requests without touching the ring (the queue
    /// was stopped).
    pub fn discard_completed(&mut self) {
        self.engine.take_completed(&mut self.done);
        self.finish_done();
        self.done.clear();
    }

    /// Cancels what is waiting and lets running calls finish (up to
    /// `timeout`); returns the requests still in flight.
    pub fn quiesce(&mut self, timeout: Duration) -> usize {
        self.engine.quiesce(timeout)
    }

    /// Finishes every request in flight without cancelling any, as a
    /// stopping device must ([`Engine::drain`]); returns early when
    /// `give_up` says so. Their completions then go to the ring with
    /// [`RequestQueue::complete_ring`]. Returns the requests left.
    pub fn drain(&mut self, give_up: impl Fn() -> bool) -> usize {
        self.engine.drain(give_up)
    }

    /// Cancels every request and waits for running calls up to the
    /// engine's `quiesce_timeout`; a call that has not returned by then is
    /// leaked ([`Engine::reset`]). No request touches guest memory from
    /// here on: each is abandoned first ([`Engine::discard`]), so the
    /// answer a cancelled request gives is written nowhere (the driver
    /// that sent it is gone). Returns the number leaked; the queue is
    /// empty afterwards.
    pub fn cancel_all(&mut self) -> usize {
        self.engine.discard()
    }

    /// Pauses the queue (GET_VRING_BASE): every request in flight
    /// finishes, except blocking Tlocks waiting for a lock, which stay in
    /// flight, make no attempt and write nothing until
    /// [`RequestQueue::resume_waits`] ([`Engine::pause`]). Returns early
    /// when `give_up` says so. Returns the requests left in flight.
    pub fn pause(&mut self, give_up: impl Fn() -> bool) -> usize {
        self.engine.pause(give_up)
    }

    /// The ring started again for the same guest after a
    /// [`pause`](RequestQueue::pause): the held Tlocks try again at once.
    pub fn resume_waits(&mut self) {
        self.engine.resume_waits();
    }

    /// The in-flight record of the chain just taken at position `pos`:
    /// how many ring slots it took, its first descriptor (packed), and
    /// what a killed instance left about it.
    fn took<R: DeviceRing, G: GuestMemoryBackend>(
        &mut self,
        pos: u32,
        ring: &R,
        mem: &G,
    ) -> (u32, u16, [u8; 16], Option<Slot>) {
        let Some(b) = self.book.as_mut() else {
            return (pos, 1, [0; 16], None);
        };
        let next = b.lin(ring.ring_base() as u16);
        let m = b.modulus();
        let slots = ((next + m - pos) % m).max(1) as u16;
        let mut desc = [0u8; 16];
        if b.packed {
            let at = b.desc_area + 16 * u64::from(pos % u32::from(b.size));
            let _ = mem.read_slice(&mut desc, GuestAddress(at));
        }
        let old = if b.old.is_empty() {
            None
        } else {
            b.old.remove(&pos).map(|(s, _)| s)
        };
        (pos, slots, desc, old)
    }

    /// Serves the chains a killed instance took and did not answer that
    /// the frontend does not offer again (before the position it rewound
    /// to): walked from their head (split) or recorded descriptor
    /// (packed), and run or answered as any other left chain. Done once,
    /// when the ring has nothing more to offer: on a packed ring the used
    /// elements need the slots of the chains passed over first.
    fn adopt_left<R, M>(&mut self, ring: &mut R, mem: &M)
    where
        R: DeviceRing,
        M: Deref + Clone + Send + 'static,
        M::Target: GuestMemoryBackend + Sized,
    {
        let Some(b) = self.book.as_mut() else {
            return;
        };
        if b.adopt.is_empty() {
            return;
        }
        let left = std::mem::take(&mut b.adopt);
        let (packed, size, desc_area) = (b.packed, b.size, b.desc_area);
        for s in left {
            let chain = if packed {
                self.walker
                    .walk_packed_descriptor(mem.clone(), s.desc, size)
            } else {
                self.walker
                    .walk(mem.clone(), GuestAddress(desc_area), size, s.id)
            };
            // Walked in this guest's memory: it is the chain the killed
            // instance took only if its request is the one recorded.
            if let Ok(c) = &chain {
                if first_bytes(&c.reader()).1 != s.digest {
                    if let Some(b) = self.book.as_mut() {
                        b.discard_old("a recorded chain not taken again holds another request");
                    }
                    return;
                }
            }
            let chain = if packed {
                chain.and_then(|c| ring.adopt_in_flight(s.id, s.slots.max(1)).map(|()| c))
            } else {
                chain
            };
            match chain {
                Ok(chain) => {
                    let info = (s.pos, s.slots, s.desc, Some(s));
                    self.start(chain, Some(info));
                }
                Err(e) => error!(
                    "9p: a request the killed daemon took (chain {}) cannot be served again: {e}",
                    s.id
                ),
            }
        }
    }

    fn start<M>(
        &mut self,
        chain: virtqueue_large::Chain<M>,
        book: Option<(u32, u16, [u8; 16], Option<Slot>)>,
    ) where
        M: Deref + Clone + Send + 'static,
        M::Target: GuestMemoryBackend + Sized,
    {
        let head = chain.head_index();
        let segs = chain.readable_segments().len() + chain.writable_segments().len();
        let slot = usize::from(head);
        if self.segments_of.len() <= slot {
            self.segments_of.resize(slot + 1, 0);
        }
        self.segments_of[slot] = segs as u32;
        self.segments += segs;
        let reader = chain.reader();
        let writer = chain.writer();
        drop(chain);
        // Peek at the header (a copy of the reader) for the tag: Tflush
        // (owned by the engine, see `engine`) finds requests by it. With
        // an in-flight table, the digest of the request's first bytes too.
        let (header, digest) = if self.book.is_some() {
            first_bytes(&reader)
        } else {
            let mut peek = reader.clone();
            let mut hdr = [0u8; HEADER_SIZE];
            let header = (peek.available_bytes() >= HEADER_SIZE
                && peek.read_exact(&mut hdr).is_ok())
            .then(|| Header::from_bytes(&hdr));
            (header, 0)
        };
        let tag = header.map(|h| h.tag);
        // The in-flight record: a new chain is noted; a chain a killed
        // instance left and whose reply it recorded gets that reply now.
        let mut record = None;
        let mut left = None;
        if let (Some(b), Some((pos, slots, desc, old))) = (self.book.as_mut(), book) {
            if let Some(p) = b.pos_of.get_mut(slot) {
                *p = pos;
            }
            let old = match old {
                // Offered again at its position, but not the request the
                // killed instance took there: another guest's ring.
                Some(s) if s.digest != digest => {
                    b.discard_old(
                        "a chain offered again at a recorded position holds another request",
                    );
                    None
                }
                // A new 9P session: nothing recorded applies after it (a
                // reset guest repeats its first requests byte for byte).
                _ if header.is_some_and(|h| h.ty == MsgType::Tversion) => {
                    b.discard_old("the guest began a new 9P session (Tversion)");
                    None
                }
                old => old,
            };
            match old {
                None => {
                    let (tag, ty) = header.map_or((u16::MAX, 0), |h| (h.tag, h.ty));
                    b.table.popped(pos, head, slots, desc, tag, ty, digest);
                }
                Some(s) => {
                    if let Some(reply) = s.reply {
                        let mut w = writer;
                        let len = match w.write_all(&reply) {
                            Ok(()) => reply.len() as u32,
                            Err(_) => 0,
                        };
                        self.done.push((head, len));
                        return;
                    }
                    left = Some(Left {
                        intent: s.state == INTENT,
                        time: s.time,
                        qid: s.qid,
                    });
                }
            }
            record = Some(SlotRecord {
                table: Arc::clone(&b.table),
                pos,
            });
        }
        let cancel = Cancel::new();
        let server = Arc::clone(&self.server);
        let session = Arc::clone(&self.session);
        let exec = self.exec;
        let token = cancel.clone();
        let mut w = ChainWriter::new(writer, cancel.clone(), exec);
        let mut r = ChainReader(reader, cancel.clone());
        let result = self.engine.spawn(head, tag, cancel, move || {
            let rec = record.as_ref().map(|r| r as &dyn RequestRecord);
            let handled = match (left, header) {
                (Some(left), Some(h)) => {
                    server.serve_left(&session, &mut r, &mut w, &exec, &token, h, &left, rec)
                }
                _ => server.handle_recorded(&session, &mut r, &mut w, &exec, &token, rec),
            };
            match handled {
                Ok(reply) if engine::flushed_silently(reply.reply_type, &token) => 0,
                Ok(reply) => reply.size,
                Err(e) => {
                    if server.log_limit().admit() {
                        warn!("9p: request on chain {head} not answered: {e}");
                    }
                    0
                }
            }
        });
        if let Err(e) = result {
            // The closure (and with it the chain's buffers) is dropped: the
            // chain goes back empty.
            if self.server.log_limit().admit() {
                warn!("9p: cannot start request on chain {head}: {e}");
            }
            self.done.push((head, 0));
        }
    }
}

/// The 9P header of the request `reader` holds, if complete, and the
/// digest of its first bytes ([`request_digest`]): read from a copy.
fn first_bytes<M>(reader: &virtqueue_large::Reader<M>) -> (Option<Header>, u32)
where
    M: Deref + Clone,
    M::Target: GuestMemoryBackend + Sized,
{
    let mut peek = reader.clone();
    let mut b = [0u8; 64];
    let n = peek.available_bytes().min(b.len());
    if peek.read_exact(&mut b[..n]).is_err() {
        return (None, 0);
    }
    let mut hdr = [0u8; HEADER_SIZE];
    hdr.copy_from_slice(&b[..HEADER_SIZE]);
    let header = (n >= HEADER_SIZE).then(|| Header::from_bytes(&hdr));
    (header, request_digest(&b[..n]))
}

/// A packed ring position: the slot with its wrap counter in bit 15.
fn encode(slot: u16, wrap: bool) -> u16 {
    virtqueue_large::packed::encode_position(slot, wrap)
}
