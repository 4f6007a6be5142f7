// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Fairness between the connections of a socket thread ("Fairness" in
//! the module docs): which connection may start a request, in which
//! slot, and the turns of the requests that run on a worker.

use std::collections::VecDeque;

use super::limits::SocketLimits;
use crate::protocol::MsgType;

/// A socket thread's slots: most requests at once, the first slots kept
/// for connections with nothing running, and the most one connection
/// holds (see "Fairness" in the module docs).
fn thread_slots(limits: &SocketLimits) -> (usize, usize, usize) {
    let threads = limits.threads.max(1);
    let cap = limits
        .max_requests
        .div_ceil(threads)
        .clamp(1, usize::from(u16::MAX) - 1);
    let first = limits.max_connections.div_ceil(threads).min(cap / 2);
    let share = limits.max_in_flight.max(1).min(1 + (cap - first) / 2);
    (cap, first, share)
}

/// Requests of worker-bound types one socket thread runs at once: twice
/// its share of the workers, enough to keep them busy (see "Workers").
fn worker_turns(limits: &SocketLimits) -> usize {
    (2 * limits.workers).div_ceil(limits.threads.max(1)).max(2)
}

/// Request types whose filesystem call always runs on a worker (the
/// engine's placement, `crate::engine`): they take turns ("Workers").
/// Twrite comes here only buffered; a streamed one is never held.
pub(super) fn worker_bound(ty: u8) -> bool {
    [
        MsgType::Tattach,
        MsgType::Tlopen,
        MsgType::Tlcreate,
        MsgType::Treaddir,
        MsgType::Twrite,
        MsgType::Tmkdir,
        MsgType::Tsymlink,
        MsgType::Tmknod,
        MsgType::Trename,
        MsgType::Trenameat,
        MsgType::Tunlinkat,
        MsgType::Tremove,
        MsgType::Tsetattr,
        MsgType::Tfsync,
        MsgType::Tlink,
    ]
    .iter()
    .any(|&t| ty == t)
}

/// Which reserve a new request slot comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    /// The connection's first slot, from the reserve kept for
    /// connections that have nothing running.
    First,
    /// A further slot, from the shared part.
    Shared,
}

/// The slots of one connection.
#[derive(Debug, Default)]
pub(super) struct Slots {
    /// Request slots of the thread this connection holds: its requests
    /// on the engine, plus the frame being read.
    held: usize,
    /// One of `held` is the thread's first-slot reserve.
    first: bool,
    /// The frame being read holds a slot (taken with its first byte).
    reserved: bool,
    /// Waiting in the thread's queue for a slot.
    queued: bool,
}

impl Slots {
    /// Slots the connection holds.
    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// Whether it waits in the thread's queue for a slot.
    pub(super) fn queued(&self) -> bool {
        self.queued
    }
}

/// The slots and worker turns of one socket thread, and the queues of
/// the connections waiting for them.
#[derive(Debug)]
pub(super) struct Admission {
    /// Requests of this thread on the engine (all connections, closed
    /// ones too until their calls return).
    live: usize,
    /// Frames being read that hold a slot.
    reserved: usize,
    /// Most requests this thread runs at once (its share of
    /// [`SocketLimits::max_requests`]).
    cap: usize,
    /// Slots kept for connections with nothing running.
    first_slots: usize,
    /// Connections holding one of those.
    firsts: usize,
    /// Most slots one connection holds.
    share: usize,
    /// Connections waiting for a slot, served in turn.
    waitq: VecDeque<u32>,
    /// A slot was freed since the queue was last served.
    released: bool,
    /// Requests of worker-bound types running, the most at once, and the
    /// connections whose next one waits for a turn.
    on_workers: usize,
    worker_turns: usize,
    workq: VecDeque<u32>,
}

impl Admission {
    /// The thread's share of `limits`.
    pub(super) fn new(limits: &SocketLimits) -> Self {
        let (cap, first_slots, share) = thread_slots(limits);
        Admission {
            live: 0,
            reserved: 0,
            cap,
            first_slots,
            firsts: 0,
            share,
            waitq: VecDeque::new(),
            released: false,
            on_workers: 0,
            worker_turns: worker_turns(limits),
            workq: VecDeque::new(),
        }
    }

    /// Most requests this thread runs at once.
    pub(super) fn cap(&self) -> usize {
        self.cap
    }

    /// Requests of this thread on the engine.
    pub(super) fn live(&self) -> usize {
        self.live
    }

    /// Whether the connection holds fewer slots than its share.
    pub(super) fn within_share(&self, s: &Slots) -> bool {
        s.held < self.share
    }

    /// Whether every slot of the thread is taken.
    fn full(&self) -> bool {
        self.live + self.reserved >= self.cap
    }

    /// Whether the thread has a slot for the connection's next request:
    /// its first from the reserve while it has nothing running, any other
    /// from the shared part, in queue order (`from_queue`: its turn).
    pub(super) fn admit(&self, s: &Slots, from_queue: bool) -> Option<Admit> {
        let used = self.live + self.reserved;
        if used >= self.cap {
            return None;
        }
        if s.held == 0 && self.firsts < self.first_slots {
            return Some(Admit::First);
        }
        let shared_used = used.saturating_sub(self.firsts);
        (shared_used < self.cap - self.first_slots && (from_queue || self.waitq.is_empty()))
            .then_some(Admit::Shared)
    }

    /// The frame the connection just began takes a slot.
    pub(super) fn reserve(&mut self, s: &mut Slots, how: Admit) {
        s.held += 1;
        s.reserved = true;
        self.reserved += 1;
        if how == Admit::First {
            s.first = true;
            self.firsts += 1;
        }
    }

    /// The frame being read gives its slot to the request it starts.
    pub(super) fn take_reservation(&mut self, s: &mut Slots) {
        if s.reserved {
            s.reserved = false;
            self.reserved -= 1;
        }
    }

    /// The frame being read ends without a request: its slot is free.
    pub(super) fn unreserve(&mut self, s: &mut Slots) {
        if s.reserved {
            self.take_reservation(s);
            self.drop_slot(Some(s));
        }
    }

    /// One of the connection's slots is free (`None`: it has closed).
    pub(super) fn drop_slot(&mut self, s: Option<&mut Slots>) {
        self.released = true;
        let Some(s) = s else {
            return;
        };
        s.held = s.held.saturating_sub(1);
        if s.held == 0 && s.first {
            s.first = false;
            self.firsts -= 1;
        }
    }

    /// A request started on the engine.
    pub(super) fn started(&mut self, on_worker: bool) {
        self.live += 1;
        if on_worker {
            self.on_workers += 1;
        }
    }

    /// A request left the engine (or never got on it).
    pub(super) fn ended(&mut self, on_worker: bool) {
        self.live -= 1;
        self.released = true;
        if on_worker {
            self.on_workers -= 1;
        }
    }

    /// The connection closed: its frame's slot and its first slot are
    /// free (its requests still running hold plain slots until they
    /// return).
    pub(super) fn close(&mut self, s: &Slots) {
        if s.reserved {
            self.reserved -= 1;
        }
        if s.first {
            self.firsts -= 1;
        }
        self.released = true;
    }

    /// Puts the connection in the thread's queue for a slot.
    pub(super) fn enqueue(&mut self, id: u32, s: &mut Slots) {
        if !s.queued {
            s.queued = true;
            self.waitq.push_back(id);
        }
    }

    /// How many queued connections to serve now: `Some` once a slot was
    /// freed since the last time, and there are any.
    pub(super) fn waiters_turn(&mut self) -> Option<usize> {
        if !self.released || self.waitq.is_empty() {
            return None;
        }
        self.released = false;
        Some(self.waitq.len())
    }

    /// The next connection in the queue, while the thread has a slot.
    pub(super) fn next_waiter(&mut self) -> Option<u32> {
        if self.full() {
            return None;
        }
        self.waitq.pop_front()
    }

    /// The connection taken by [`next_waiter`](Self::next_waiter) is out
    /// of the queue.
    pub(super) fn left_queue(&mut self, s: &mut Slots) {
        s.queued = false;
    }

    /// The connection taken by [`next_waiter`](Self::next_waiter) found
    /// no slot: it keeps its place (see [`keep_places`](Self::keep_places)).
    pub(super) fn passed(&mut self, s: &mut Slots) {
        s.queued = true;
    }

    /// The connections that were [`passed`](Self::passed) go back to the
    /// front of the queue, in their order.
    pub(super) fn keep_places(&mut self, passed: Vec<u32>) {
        for id in passed.into_iter().rev() {
            self.waitq.push_front(id);
        }
    }

    /// Whether a worker-bound request may start now.
    pub(super) fn worker_turn_free(&self) -> bool {
        self.on_workers < self.worker_turns
    }

    /// The connection's worker-bound request waits for a turn; one with
    /// nothing else running (`alone`) goes first.
    pub(super) fn wait_for_worker(&mut self, id: u32, alone: bool) {
        if alone {
            self.workq.push_front(id);
        } else {
            self.workq.push_back(id);
        }
    }

    /// The connection whose held request takes the next free worker turn.
    pub(super) fn next_worker_turn(&mut self) -> Option<u32> {
        if !self.worker_turn_free() {
            return None;
        }
        self.workq.pop_front()
    }

    /// Whether a queue has a connection to serve right away.
    pub(super) fn turns_to_give(&self) -> bool {
        (self.released && !self.waitq.is_empty())
            || (self.worker_turn_free() && !self.workq.is_empty())
    }
}
