// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Fairness between the connections of a socket thread ("Fairness" in
//! the module docs): request slots, first slots and worker turns.

use std::collections::VecDeque;
use std::time::Instant;

use super::connection::{Admit, Conn, Input, Loop, OUT_HIGH_WATER};
use super::listener::SocketLimits;
use crate::fs::Filesystem;
use crate::protocol::MsgType;

/// (see "Fairness" in the module docs).
pub(super) fn thread_slots(limits: &SocketLimits) -> (usize, usize, usize) {
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
pub(super) fn worker_turns(limits: &SocketLimits) -> usize {
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

impl<F: Filesystem + 'static> Loop<F> {
    /// Free buffers the pool may keep: a request and a reply buffer for
    /// each request in flight, and a few more.
    pub(super) fn keep(&self) -> usize {
        2 * (self.live + self.queued) + 4
    }

    /// Whether the connection may start another request, as far as it
    /// alone is concerned: the per-connection limits.
    pub(super) fn conn_ready(&self, c: &Conn<F>) -> bool {
        c.in_flight < self.shared.limits.max_in_flight.max(1)
            && c.out_bytes < OUT_HIGH_WATER
            && c.slots < self.share
            && c.version.is_none()
            && c.held.is_none()
            && !matches!(c.input, Input::Streaming)
    }

    /// Whether the thread has a slot for the connection's next request:
    /// its first from the reserve while it has nothing running, any other
    /// from the shared part, in queue order (`from_queue`: its turn).
    pub(super) fn admit(&self, c: &Conn<F>, from_queue: bool) -> Option<Admit> {
        let used = self.live + self.reserved;
        if used >= self.thread_cap {
            return None;
        }
        if c.slots == 0 && self.firsts < self.first_slots {
            return Some(Admit::First);
        }
        let shared_used = used.saturating_sub(self.firsts);
        (shared_used < self.thread_cap - self.first_slots && (from_queue || self.waitq.is_empty()))
            .then_some(Admit::Shared)
    }

    /// Whether to read the connection's socket now.
    pub(super) fn readable(&self, c: &Conn<F>) -> bool {
        match c.input {
            Input::Streaming => false,
            ref i if !i.at_boundary() => true,
            _ => self.conn_ready(c) && !c.queued && self.admit(c, false).is_some(),
        }
    }

    /// Puts the connection in the thread's queue for a slot.
    pub(super) fn enqueue(&mut self, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            if !c.queued {
                c.queued = true;
                self.waitq.push_back(id);
            }
        }
    }

    /// The frame just begun takes a slot.
    pub(super) fn reserve(&mut self, id: u32, how: Admit) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.slots += 1;
        c.reserved = true;
        self.reserved += 1;
        if how == Admit::First {
            c.first = true;
            self.firsts += 1;
        }
        c.frame_start = Some(Instant::now());
        c.frame_got = 0;
        self.stall_watch = true;
    }

    /// The frame being read gives its slot to the request it starts.
    pub(super) fn take_reservation(&mut self, id: u32) {
        if let Some(c) = self.conns.get_mut(&id).filter(|c| c.reserved) {
            c.reserved = false;
            self.reserved -= 1;
        }
    }

    /// The frame being read ends without a request: its slot is free.
    pub(super) fn unreserve(&mut self, id: u32) {
        if self.conns.get(&id).is_some_and(|c| c.reserved) {
            self.take_reservation(id);
            self.drop_slot(id);
        }
    }

    /// One of the connection's slots is free.
    pub(super) fn drop_slot(&mut self, id: u32) {
        self.released = true;
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.slots = c.slots.saturating_sub(1);
        if c.slots == 0 && c.first {
            c.first = false;
            self.firsts -= 1;
        }
    }

    /// Reads and starts what the socket holds, within the limits.
    /// `from_queue`: the connection's turn in the queue came, its next
    /// Starts the requests waiting for a worker turn, in order, while the
    /// thread has turns free.
    pub(super) fn serve_workq(&mut self) {
        while self.on_workers < self.worker_turns {
            let Some(id) = self.workq.pop_front() else {
                break;
            };
            let Some((buf, size)) = self.conns.get_mut(&id).and_then(|c| c.held.take()) else {
                continue;
            };
            self.start(id, buf, size);
            self.dirty.push(id);
        }
    }

    /// Gives the connections waiting for a slot their turn, in order, as
    /// long as slots are free: each starts one request, then waits again
    /// at the back if it has more.
    pub(super) fn serve_waiters(&mut self) {
        if !self.released || self.waitq.is_empty() {
            return;
        }
        self.released = false;
        let mut passed = VecDeque::new();
        for _ in 0..self.waitq.len() {
            if self.live + self.reserved >= self.thread_cap {
                break;
            }
            let Some(id) = self.waitq.pop_front() else {
                break;
            };
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            c.queued = false;
            let c = &self.conns[&id];
            if !self.conn_ready(c) || !c.input.at_boundary() {
                // It waits for itself now, not for the thread.
                self.dirty.push(id);
                continue;
            }
            if self.admit(c, true).is_none() {
                if let Some(c) = self.conns.get_mut(&id) {
                    c.queued = true;
                }
                passed.push_back(id);
                continue;
            }
            if let Err(why) = self.read_conn(id, true) {
                self.close(id, why);
                continue;
            }
            self.dirty.push(id);
        }
        // Those that could not have a slot keep their place.
        while let Some(id) = passed.pop_back() {
            self.waitq.push_front(id);
        }
    }
}
