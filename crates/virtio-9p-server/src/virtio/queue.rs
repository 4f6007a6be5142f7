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

use super::io::{ChainReader, ChainWriter};
use crate::engine::{self, Engine, EngineConfig, EngineError, EngineExec, EngineStats};
use crate::fs::Filesystem;
use crate::protocol::{Header, HEADER_SIZE, RLERROR, TFLUSH};
use crate::server::{Cancel, Server, Session};

/// Errors of a request queue.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The engine could not be started.
    #[error("request engine: {0}")]
    Engine(#[from] EngineError),
    /// The chain policy is invalid.
    #[error("chain policy: {0}")]
    Limits(#[source] virtqueue_large::Error),
    /// The ring itself is broken (bad available index, unreadable ring);
    /// the queue stops until the driver resets it.
    #[error("virtqueue is broken: {0}")]
    Ring(#[source] virtqueue_large::Error),
    /// Writing the used ring failed.
    #[error("cannot add to the used ring: {0}")]
    Used(#[source] virtio_queue::Error),
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
    ) -> Result<Self, QueueError> {
        let walker = ChainWalker::new(super::chain_limits(indirect)).map_err(QueueError::Limits)?;
        Ok(RequestQueue {
            server,
            session,
            walker,
            indirect,
            engine: Engine::new(pool, config)?,
            exec: EngineExec::new(config.offload),
            done: Vec::new(),
            broken: false,
        })
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
    pub fn reset(&mut self, indirect: bool) -> Result<(), QueueError> {
        self.broken = false;
        if indirect != self.indirect {
            self.walker =
                ChainWalker::new(super::chain_limits(indirect)).map_err(QueueError::Limits)?;
            self.indirect = indirect;
        }
        Ok(())
    }

    /// Pops every available chain and starts its request. With event-idx
    /// the avail event is rearmed and the ring rechecked, so no kick is
    /// lost. Finished requests are left for [`RequestQueue::complete`].
    pub fn process<Q, M>(&mut self, queue: &mut Q, mem: M) -> Result<(), QueueError>
    where
        Q: QueueT,
        M: Deref + Clone + Send + 'static,
        M::Target: GuestMemoryBackend + Sized,
    {
        if self.broken {
            return Ok(());
        }
        loop {
            if let Err(e) = queue.disable_notification(mem.deref()) {
                return Err(QueueError::Used(e));
            }
            loop {
                match self.walker.pop(queue, mem.clone()) {
                    Ok(Some(chain)) => self.start(chain),
                    Ok(None) => break,
                    // Logged and consumed by the walker (length-0 used entry).
                    Err(e) if e.is_chain_fault() => continue,
                    Err(e) => {
                        self.broken = true;
                        return Err(QueueError::Ring(e));
                    }
                }
            }
            match queue.enable_notification(mem.deref()) {
                Ok(true) => continue,
                Ok(false) => return Ok(()),
                Err(e) => return Err(QueueError::Used(e)),
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
    pub fn complete<Q, G>(&mut self, queue: &mut Q, mem: &G) -> Result<bool, QueueError>
    where
        Q: QueueT,
        G: GuestMemoryBackend,
    {
        self.engine.take_completed(&mut self.done);
        let any = !self.done.is_empty();
        for (head, len) in self.done.drain(..) {
            queue.add_used(mem, head, len).map_err(QueueError::Used)?;
        }
        Ok(any)
    }

    /// Drops the finished requests without touching the ring (the queue
    /// was stopped).
    pub fn discard_completed(&mut self) {
        self.engine.take_completed(&mut self.done);
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
                        ty: TFLUSH + 1,
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
