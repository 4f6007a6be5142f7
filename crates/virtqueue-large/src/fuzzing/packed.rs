// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The `virtqueue_packed` harness: a byte-decoded list of driver and
//! device operations on one packed ring, replayed under the spec-strict
//! policy, the large policy and a variant the input chooses.
//!
//! Input (running out of bytes reads zeros and ends the op list): a header
//! of three bytes (queue size 1 to 64, not only powers of two; flags:
//! bit 0 event-idx, bit 1 no indirect, bits 3-4 the chosen policy; a policy
//! parameter, as for `virtqueue_chain`), then up to 64 operations, each an op byte whose low 4 bits
//! pick [`PackedOp`] followed by its arguments.
//!
//! Checked on every run: no panic; every accepted chain satisfies
//! [`check_chain`], its Reader/Writer move exactly its
//! bytes ([`serve`]), it occupies exactly the slots up to the
//! first descriptor without NEXT (an oracle that reads the ring itself), and
//! its id is the last descriptor's; a ring-level error consumes nothing; a
//! chain fault consumes the chain; `add_used` of a chain in flight always
//! succeeds; every used descriptor the driver reads names a returned id
//! with the length the device reported (0 for refused chains); the device
//! event area holds what `enable_notification`/`disable_notification`
//! wrote; `needs_notification` fails exactly when [`EventMode::parse`]
//! refuses the driver area; the ring base survives a round trip.

use std::collections::HashMap;

use vm_memory::GuestMemoryMmap;

use super::{check_chain, serve, Budget, Input};
use crate::mock::{guest_memory, pdesc, Buf, Layout, MockPackedDriver, PackedMalicious, UsedEntry};
use crate::packed::{
    EventMode, EventSuppression, PackedQueue, EVENT_FLAG_DESC, EVENT_FLAG_DISABLE,
    EVENT_FLAG_ENABLE, F_AVAIL, F_USED, WRAP_BIT,
};
use crate::{Chain, ChainLimits, ChainWalker, DeviceRing, ErrorKind};

/// Guest memory of every packed fuzz run (the malicious patterns that need
/// more, [`PackedMalicious::LengthOverflow`], fail to lay out and are
/// covered by the unit tests).
pub const MEMORY: usize = 1 << 20;

const MAX_OPS: usize = 64;

/// Operation codes (the low 4 bits of an op byte).
#[derive(Debug, Clone, Copy)]
#[repr(u8)]
#[non_exhaustive]
pub enum PackedOp {
    /// A chain through the mock: layout byte (bit 0 indirect, bit 1 pick
    /// the id: then an id byte, taken modulo size + 2, so out of range and
    /// in-flight ids occur), count byte, per buffer a u16 length and a
    /// writable byte.
    AddChain = 0,
    /// A [`PackedMalicious`] pattern: index byte.
    AddMalicious = 1,
    /// One raw ring descriptor: slot u16, address selector byte, u32 length, u16 id, u16 flags.
    RawSlot = 2,
    /// Raw descriptors published at the next slots: count byte (1-4), per
    /// descriptor an address selector, u16 length, u16 id, u16 flags; then a
    /// byte whose bit 0 keeps the flags' AVAIL/USED bits as given.
    RawPublish = 3,
    /// Pop and serve one chain (kept in flight).
    Pop = 4,
    /// Return the in-flight chain picked by the next byte (any order).
    Complete = 5,
    /// Pop and serve until nothing is available, then return everything.
    Drain = 6,
    /// The driver reads the used descriptors.
    Reclaim = 7,
    /// Raw driver event area (u16 off_wrap, u16 flags), then `needs_notification`.
    DriverEvent = 8,
    /// `enable_notification` (odd byte) or `disable_notification`.
    Notify = 9,
    /// Ring base: round trip, or a raw u32 (odd byte) which may desync the driver.
    RingBase = 10,
}

struct Run<'m> {
    mem: &'m GuestMemoryMmap,
    limits: ChainLimits,
    size: u16,
    driver: MockPackedDriver<'m, GuestMemoryMmap>,
    queue: PackedQueue,
    walker: ChainWalker,
    in_flight: Vec<(Chain<&'m GuestMemoryMmap>, u32)>,
    /// Lengths reported per id, not yet read back by the driver.
    returned: HashMap<u16, Vec<u32>>,
    /// The driver state no longer matches the device's (raw ring base).
    desynced: bool,
    budget: Budget,
}

/// Runs one input under the strict, the large and the chosen policy (the
/// header as for `virtqueue_chain`; chained tables, a split-ring
/// extension, do not apply).
pub fn run(data: &[u8]) {
    super::replay(data, |data, limits| {
        run_with(data, limits.with_chained_indirect(false))
    });
}

/// Runs one input under `limits` (the header's policy bits ignored).
pub fn run_with(data: &[u8], limits: ChainLimits) {
    let mut input = Input::new(data);
    let size = 1 + u16::from(input.u8() % 64);
    let flags = input.u8();
    let _param = input.u8();
    let mem = guest_memory(MEMORY);
    let driver = MockPackedDriver::new(&mem, size);
    let mut queue = driver.create_queue();
    queue.set_event_idx(flags & 1 != 0);
    let mut run = Run {
        mem: &mem,
        limits,
        size,
        driver,
        queue,
        walker: ChainWalker::new(limits).expect("fuzz limits are valid"),
        in_flight: Vec::new(),
        returned: HashMap::new(),
        desynced: false,
        budget: Budget::RUN,
    };
    for _ in 0..MAX_OPS {
        if input.done() || run.budget.exhausted() {
            break;
        }
        run.op(&mut input);
    }
    run.drain();
    run.reclaim();
}

impl<'m> Run<'m> {
    fn op(&mut self, input: &mut Input<'_>) {
        let op = input.u8();
        match op & 15 {
            0 => {
                let layout_byte = input.u8();
                let layout = if layout_byte & 1 != 0 {
                    Layout::Indirect
                } else {
                    Layout::Direct
                };
                let id = (layout_byte & 2 != 0).then(|| u16::from(input.u8()) % (self.size + 2));
                let count = 1 + usize::from(input.u8() % 16);
                let bufs: Vec<Buf> = (0..count)
                    .map(|_| {
                        let len = u32::from(input.u16() % 5000);
                        if input.u8() & 1 == 0 {
                            Buf::r(len)
                        } else {
                            Buf::w(len)
                        }
                    })
                    .collect();
                let _ = match id {
                    Some(id) => {
                        // A second chain with an id the driver has not got
                        // back yet: the device may or may not have it in
                        // flight, so the driver's view of the used ring
                        // is no longer exact.
                        self.desynced |= self.driver.is_outstanding(id);
                        self.driver.add_chain_with_id(layout, &bufs, id)
                    }
                    None => self.driver.add_chain(layout, &bufs),
                };
            }
            1 => {
                let pattern =
                    PackedMalicious::ALL[usize::from(input.u8()) % PackedMalicious::ALL.len()];
                if pattern == PackedMalicious::TooManyDescriptorsLarge {
                    self.budget.descriptors = self
                        .budget
                        .descriptors
                        .saturating_sub(u64::from(crate::LARGE_MAX_DESCRIPTORS));
                }
                let _ = self.driver.add_malicious(pattern);
            }
            2 => {
                let slot = input.u16();
                let addr = self.raw_addr(input.u8());
                let (len, id, flags) = (input.u32(), input.u16(), input.u16());
                // Raw descriptors: the driver no longer knows what the
                // device will return.
                self.desynced = true;
                let _ = self.driver.write_slot(slot, pdesc(addr, len, id, flags));
            }
            3 => {
                let count = 1 + usize::from(input.u8() % 4);
                let descs: Vec<_> = (0..count)
                    .map(|_| {
                        let addr = self.raw_addr(input.u8());
                        pdesc(addr, u32::from(input.u16()), input.u16(), input.u16())
                    })
                    .collect();
                let raw_bits = input.u8() & 1 != 0;
                self.desynced = true;
                let id = descs.last().map_or(0, |d| d.id());
                // Untracked: the driver cannot know whether it is returned.
                let _ = self.driver.publish(&descs, id, raw_bits, false);
            }
            4 => {
                self.pop_one();
            }
            5 if !self.in_flight.is_empty() => {
                let k = usize::from(input.u8()) % self.in_flight.len();
                self.complete(k);
            }
            6 => self.drain(),
            7 => self.reclaim(),
            8 => {
                let (off_wrap, flags) = (input.u16(), input.u16());
                let _ = self.driver.set_driver_event(off_wrap, flags);
                let parsed = EventMode::parse(
                    EventSuppression::new(off_wrap, flags),
                    self.size,
                    self.queue.event_idx_enabled(),
                );
                let got = self.queue.needs_notification(self.mem);
                match (&parsed, &got) {
                    (Ok(EventMode::Enable), Ok(n)) => assert!(*n),
                    (Ok(EventMode::Disable), Ok(n)) => assert!(!*n),
                    (Ok(_), Ok(_)) => {}
                    (Err(a), Err(b)) => assert_eq!(a.kind(), b.kind()),
                    _ => panic!("needs_notification {got:?} vs parse {parsed:?}"),
                }
            }
            9 => {
                let enable = input.u8() & 1 != 0;
                if enable {
                    let more = self
                        .queue
                        .enable_notification(self.mem)
                        .expect("device area");
                    let ev = self.driver.device_event();
                    let (pos, wrap) = self.queue.next_avail();
                    if self.queue.event_idx_enabled() {
                        let wrap_bit = if wrap { WRAP_BIT } else { 0 };
                        assert_eq!(ev, EventSuppression::new(pos | wrap_bit, EVENT_FLAG_DESC));
                    } else {
                        assert_eq!(ev.flags(), EVENT_FLAG_ENABLE);
                    }
                    assert_eq!(more, self.queue.has_available(self.mem).expect("ring"));
                } else {
                    self.queue
                        .disable_notification(self.mem)
                        .expect("device area");
                    assert_eq!(self.driver.device_event().flags(), EVENT_FLAG_DISABLE);
                }
            }
            10 => {
                let raw = input.u8() & 1 != 0;
                let value = input.u32();
                let before = self.queue.ring_base();
                if raw {
                    let ok = (value as u16 & !WRAP_BIT) < self.size
                        && ((value >> 16) as u16 & !WRAP_BIT) < self.size;
                    match self.queue.set_ring_base(value) {
                        Ok(()) => {
                            assert!(ok);
                            assert_eq!(self.queue.ring_base(), value);
                            assert_eq!(self.queue.in_flight(), 0);
                            self.in_flight.clear();
                            self.desynced = true;
                        }
                        Err(e) => {
                            assert!(!ok, "{e}");
                            assert_eq!(self.queue.ring_base(), before);
                        }
                    }
                } else if self.in_flight.is_empty() {
                    self.queue.set_ring_base(before).expect("own base is valid");
                    assert_eq!(self.queue.ring_base(), before);
                }
            }
            _ => {}
        }
    }

    /// A buffer address: inside the data area, at its edges, or raw.
    fn raw_addr(&self, sel: u8) -> u64 {
        let end = self.driver.memory_end();
        match sel % 4 {
            0 => 0x10000 + u64::from(sel) * 64,
            1 => end - u64::from(sel),
            2 => end + u64::from(sel),
            _ => u64::MAX - u64::from(sel),
        }
    }

    /// The extent of the chain at the device's next slot, read from the
    /// ring by the harness itself: slots up to the first descriptor
    /// without NEXT, and that descriptor's id.
    fn oracle_extent(&self) -> Option<(u16, u16)> {
        let (mut slot, mut wrap) = self.queue.next_avail();
        for n in 1..=self.size {
            let d = self.driver.read_slot(slot).ok()?;
            let avail = (d.flags() & F_AVAIL != 0) == wrap && (d.flags() & F_USED != 0) != wrap;
            if !avail {
                return None;
            }
            if d.flags() & crate::mock::F_NEXT == 0 {
                return Some((n, d.id()));
            }
            slot += 1;
            if slot == self.size {
                slot = 0;
                wrap = !wrap;
            }
        }
        None
    }

    fn slots_between(&self, from: (u16, bool), to: (u16, bool)) -> u16 {
        let (a, b) = (u32::from(from.0), u32::from(to.0));
        let n = if from.1 == to.1 && b >= a {
            b - a
        } else {
            b + u32::from(self.size) - a
        };
        n as u16
    }

    /// Pops one chain; returns whether the queue may have more.
    fn pop_one(&mut self) -> bool {
        if self.budget.exhausted() {
            return false;
        }
        let before = self.queue.next_avail();
        let oracle = self.oracle_extent();
        match self.queue.pop_chain(&mut self.walker, self.mem) {
            Ok(None) => false,
            Ok(Some(chain)) => {
                let (slots, id) = oracle.expect("an accepted chain has an extent");
                assert_eq!(self.slots_between(before, self.queue.next_avail()), slots);
                assert_eq!(chain.head_index(), id);
                check_chain(&self.limits, &chain, self.size, self.mem);
                let descs = u64::from(chain.descriptor_count());
                self.budget.descriptors = self.budget.descriptors.saturating_sub(descs.max(1));
                let io_limit = self.budget.bytes;
                let written = serve(&chain, io_limit);
                self.budget.bytes = self.budget.bytes.saturating_sub(written as usize);
                self.in_flight.push((chain, written));
                true
            }
            Err(e) if e.is_chain_fault() => {
                let (slots, id) = oracle.expect("a refused chain has an extent");
                assert_eq!(self.slots_between(before, self.queue.next_avail()), slots);
                let returned = !matches!(
                    e.kind(),
                    ErrorKind::BufferIdOutOfRange | ErrorKind::BufferIdInFlight
                );
                if returned {
                    self.returned.entry(id).or_default().push(0);
                }
                true
            }
            Err(e) => {
                assert_eq!(self.queue.next_avail(), before, "{e} consumed nothing");
                false
            }
        }
    }

    fn complete(&mut self, k: usize) {
        let (chain, written) = self.in_flight.swap_remove(k);
        let id = chain.head_index();
        self.queue
            .add_used(self.mem, id, written)
            .expect("a chain in flight can be returned");
        self.returned.entry(id).or_default().push(written);
    }

    fn drain(&mut self) {
        for _ in 0..2 * usize::from(self.size) {
            if !self.pop_one() {
                break;
            }
        }
        while !self.in_flight.is_empty() {
            self.complete(self.in_flight.len() - 1);
        }
    }

    fn reclaim(&mut self) {
        let used = self.driver.take_used();
        if self.desynced {
            return;
        }
        for UsedEntry { id, len } in used {
            let id = u16::try_from(id).expect("a packed buffer id has 16 bits");
            let lens = self.returned.get_mut(&id);
            let pos = lens.as_ref().and_then(|l| l.iter().position(|&x| x == len));
            match (lens, pos) {
                (Some(l), Some(p)) => {
                    l.swap_remove(p);
                }
                // A chain published raw (untracked by the driver) stops the
                // driver's scan; it may be read again next time.
                _ => panic!("used descriptor ({id}, {len}) was never returned"),
            }
        }
    }
}

/// A seed corpus: valid chains of both layouts with ids out of order,
/// every malicious pattern, raw descriptors, events and ring bases.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    let op = |o: PackedOp| o as u8;
    // Valid chains, both layouts, ids picked out of order, event-idx on.
    for (size, layout) in [(7u8, 0u8), (15, 1), (4, 2), (63, 3)] {
        let mut s = vec![size, 1 | (u8::from(layout & 1 != 0) << 3), 0];
        for k in 0..4u8 {
            s.extend_from_slice(&[op(PackedOp::AddChain), layout]);
            if layout & 2 != 0 {
                s.push(7 - k);
            }
            s.push(3);
            for i in 0..4u8 {
                s.extend_from_slice(&[i * 40 + k, 1, u8::from(i >= 2)]);
            }
            s.push(op(PackedOp::Pop));
        }
        s.extend_from_slice(&[op(PackedOp::Complete), 2, op(PackedOp::Complete), 0]);
        s.extend_from_slice(&[
            op(PackedOp::Reclaim),
            op(PackedOp::Drain),
            op(PackedOp::Reclaim),
        ]);
        seeds.push(s);
    }
    // Each malicious pattern followed by a valid chain.
    for i in 0..PackedMalicious::ALL.len() {
        let policy = if i % 2 == 0 { 1 << 3 } else { 0 };
        seeds.push(vec![
            12,
            policy | u8::from(PackedMalicious::ALL[i].needs_event_idx()),
            0,
            op(PackedOp::AddMalicious),
            i as u8,
            op(PackedOp::DriverEvent),
            0,
            0,
            2,
            0,
            op(PackedOp::AddChain),
            1,
            1,
            16,
            0,
            0,
            op(PackedOp::Drain),
            op(PackedOp::Reclaim),
        ]);
    }
    // Raw descriptors, notifications and ring bases.
    seeds.push(vec![
        5,
        1,
        0,
        op(PackedOp::RawPublish),
        2,
        0,
        0x10,
        0,
        0,
        0,
        1,
        0,
        0,
        0x20,
        0,
        0,
        0,
        2,
        0,
        0,
        op(PackedOp::RawSlot),
        1,
        0,
        1,
        8,
        0,
        0,
        0,
        0,
        0,
        0x80,
        0x80,
        op(PackedOp::Notify),
        1,
        op(PackedOp::Drain),
        op(PackedOp::RingBase),
        0,
        op(PackedOp::RingBase),
        1,
        3,
        0x80,
        2,
        0,
        op(PackedOp::Notify),
        0,
        op(PackedOp::Reclaim),
    ]);
    seeds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_packed_seeds_replay() {
        let seeds = seeds();
        assert!(seeds.len() > PackedMalicious::ALL.len());
        for s in &seeds {
            run(s);
        }
    }

    /// Found by the first campaign (a harness false positive): under a
    /// zero byte cap, `PackedMalicious::IdInFlight`'s first chain is refused
    /// and returned at once, so the device serves the second chain with
    /// the same id; the mock had not tracked it and reported its used
    /// descriptor again at every reclaim.
    #[test]
    fn test_regression_id_reused_after_a_refused_chain() {
        run(&[
            0xf4, 0xfd, 0x00, 0x01, 0x06, 0x1a, 0x00, 0x01, 0x0b, 0x08, 0x80, 0x18, 0x18, 0x18,
            0x00, 0x00, 0x06, 0x07,
        ]);
    }

    #[test]
    fn test_packed_harness_takes_any_bytes() {
        for s in [
            &[][..],
            &[0],
            &[0xff; 64],
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
        ] {
            run(s);
        }
        // A pseudo-random sweep over op sequences.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..300 {
            let bytes: Vec<u8> = (0..96)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            run(&bytes);
        }
    }
}
