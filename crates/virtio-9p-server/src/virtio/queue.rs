// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Serving one request queue: pop, start a coroutine per chain, complete.

use std::io::{Read, Write};
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use coro_pool::StackPool;
use log::{debug, error};
use virtio_queue::QueueT;
use virtqueue_large::{ChainWalker, WalkerStats};
use vm_memory::GuestMemoryBackend;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::io::{ChainReader, ChainWriter};
use crate::engine::{self, Engine, EngineConfig, EngineExec, EngineStats};
use crate::error::{Error, Result};
use crate::fs::Filesystem;
use crate::protocol::{Header, MsgType, HEADER_SIZE, RLERROR, TFLUSH};
use crate::server::{Cancel, Server, Session};

/// Descriptors one [`RequestQueue::process`] call walks at most (a chain
/// fault counts as [`MAX_CHAIN_DESCRIPTORS`](super::MAX_CHAIN_DESCRIPTORS)).
/// The rest of the ring waits for the next round of the event loop, which
/// [`RequestQueue::more_fd`] triggers: one kick cannot make the device walk
/// queue size x 32768 descriptors before it serves anything else.
pub const KICK_BUDGET: u32 = 65_536;

/// Segments (16 bytes each) the chains in flight may hold together: 4 MiB.
/// While they hold more, no further chain is popped; completions resume
/// the queue through [`RequestQueue::more_fd`].
pub const MAX_IN_FLIGHT_SEGMENTS: usize = 1 << 18;

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
        let walker = ChainWalker::new(super::chain_limits(indirect)).map_err(Error::ChainLimits)?;
        Ok(RequestQueue {
            server,
            session,
            walker,
            indirect,
            engine: Engine::new(pool, config)?,
            exec: EngineExec::new(config.offload),
            done: Vec::new(),
            broken: false,
            more: EventFd::new(EFD_NONBLOCK).map_err(Error::ResumeFd)?,
            stalled: false,
            segments: 0,
            segments_of: Vec::new(),
        })
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
            self.walker =
                ChainWalker::new(super::chain_limits(indirect)).map_err(Error::ChainLimits)?;
            self.indirect = indirect;
        }
        Ok(())
    }

    /// Pops every available chain and starts its request. With event-idx
    /// the avail event is rearmed and the ring rechecked, so no kick is
    /// lost. Finished requests are left for [`RequestQueue::complete`].
    pub fn process<Q, M>(&mut self, queue: &mut Q, mem: M) -> Result<()>
    where
        Q: QueueT,
        M: Deref + Clone + Send + 'static,
        M::Target: GuestMemoryBackend + Sized,
    {
        if self.broken {
            return Ok(());
        }
        let mut budget = KICK_BUDGET;
        loop {
            if let Err(e) = queue.disable_notification(mem.deref()) {
                return Err(Error::Used(e));
            }
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
                match self.walker.pop(queue, mem.clone()) {
                    Ok(Some(chain)) => {
                        budget = budget.saturating_sub(chain.descriptor_count());
                        self.start(chain);
                    }
                    Ok(None) => break,
                    // Logged and consumed by the walker (length-0 used entry).
                    Err(e) if e.is_chain_fault() => {
                        budget = budget.saturating_sub(super::MAX_CHAIN_DESCRIPTORS);
                        continue;
                    }
                    Err(e) => {
                        self.broken = true;
                        return Err(Error::Ring(e));
                    }
                }
            }
            match queue.enable_notification(mem.deref()) {
                Ok(true) => continue,
                Ok(false) => return Ok(()),
                Err(e) => return Err(Error::Used(e)),
            }
        }
    }

    /// Resumes requests whose blocking calls finished or whose sleep ended
    /// (call when [`Engine::wake_fd`] or [`Engine::timer_fd`] is readable).
    pub fn poll(&mut self) {
        self.engine.poll();
    }

    /// Puts finished requests on the used ring. Returns true if any, in
    /// which case the caller signals the driver if
    /// `queue.needs_notification()` says so.
    pub fn complete<Q, G>(&mut self, queue: &mut Q, mem: &G) -> Result<bool>
    where
        Q: QueueT,
        G: GuestMemoryBackend,
    {
        self.engine.take_completed(&mut self.done);
        self.finish_done();
        let any = !self.done.is_empty();
        for (head, len) in self.done.drain(..) {
            queue.add_used(mem, head, len).map_err(Error::Used)?;
        }
        Ok(any)
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

    /// Cancels every request and waits for running calls up to the
    /// engine's `quiesce_timeout`; a call that has not returned by then is
    /// leaked ([`Engine::reset`]). Returns the number leaked; the queue is
    /// empty afterwards.
    pub fn cancel_all(&mut self) -> usize {
        self.engine.reset()
    }

    fn start<M>(&mut self, chain: virtqueue_large::Chain<M>)
    where
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
        // Peek at the header (a copy of the reader) for the tag and Tflush.
        let mut peek = reader.clone();
        let mut hdr = [0u8; HEADER_SIZE + 2];
        let header = if peek.available_bytes() >= HEADER_SIZE
            && peek.read_exact(&mut hdr[..HEADER_SIZE]).is_ok()
        {
            let mut h7 = [0u8; HEADER_SIZE];
            h7.copy_from_slice(&hdr[..HEADER_SIZE]);
            Some(Header::from_bytes(&h7))
        } else {
            None
        };
        let cancel = Cancel::new();
        let result = match header {
            Some(h)
                if h.ty == TFLUSH
                    && h.size as usize == HEADER_SIZE + 2
                    && peek.read_exact(&mut hdr[HEADER_SIZE..]).is_ok() =>
            {
                let oldtag = u16::from_le_bytes([hdr[HEADER_SIZE], hdr[HEADER_SIZE + 1]]);
                debug!("9p: tag {} Tflush oldtag {oldtag}", h.tag);
                let mut w = ChainWriter(writer);
                let tag = h.tag;
                self.engine.spawn(head, None, cancel, move || {
                    engine::flush(oldtag);
                    let rflush = Header {
                        size: HEADER_SIZE as u32,
                        ty: MsgType::Rflush.into(),
                        tag,
                    }
                    .to_bytes();
                    match w.write_all(&rflush) {
                        Ok(()) => HEADER_SIZE as u32,
                        Err(e) => {
                            error!("9p: cannot write Rflush: {e}");
                            0
                        }
                    }
                })
            }
            _ => {
                let server = Arc::clone(&self.server);
                let session = Arc::clone(&self.session);
                let exec = self.exec;
                let token = cancel.clone();
                let mut w = ChainWriter(writer);
                let mut r = ChainReader(reader);
                self.engine
                    .spawn(head, header.map(|h| h.tag), cancel, move || {
                        match server.handle(&session, &mut r, &mut w, &exec, &token) {
                            // A flushed request that was interrupted gets no
                            // reply (QEMU does the same); one that completed
                            // keeps its reply, which may record a change.
                            Ok(reply) if token.is_cancelled() && reply.reply_type == RLERROR => 0,
                            Ok(reply) => reply.size,
                            Err(e) => {
                                error!("9p: request on chain {head} not answered: {e}");
                                0
                            }
                        }
                    })
            }
        };
        if let Err(e) = result {
            // The closure (and with it the chain's buffers) is dropped: the
            // chain goes back empty.
            error!("9p: cannot start request on chain {head}: {e}");
            self.done.push((head, 0));
        }
    }
}
