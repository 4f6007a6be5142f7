// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Fuzzing support (feature `test-utils`): the invariant checks that the
//! `virtqueue_chain` cargo-fuzz target applies to every accepted chain
//! ([`check_chain`], [`compare_with_virtio_queue`], [`serve`],
//! [`pop_and_serve`]), and a self-contained byte-level harness ([`run`])
//! whose [`seeds`] the unit tests replay, so the checks also run in plain
//! `cargo test`.
//!
//! [`run`]'s input is decoded byte by byte (running out of bytes reads zeros and
//! ends the op list): a header picks the queue size, the policy and
//! event-idx; then up to 64 operations lay out valid, malicious or raw
//! chains through the [`mock`](crate::mock), corrupt the available index,
//! pop and serve chains, and reclaim used entries. Every accepted chain is
//! checked: its bytes are exactly readable/writable through the
//! Reader/Writer, every segment lies in guest memory, the limits hold, and
//! virtio-queue's own iterator sees the same descriptors and bytes.

use std::io::{Read, Write};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::mock::{desc, guest_memory, Buf, Layout, Malicious, MockDriver, F_INDIRECT};
use crate::{Chain, ChainLimits, ChainWalker};

pub mod packed;

/// Guest memory of every fuzz run.
pub const MEMORY: usize = 4 << 20;

const MAX_OPS: usize = 64;

pub(crate) struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Input { data, pos: 0 }
    }
}

impl Input<'_> {
    pub(crate) fn done(&self) -> bool {
        self.pos >= self.data.len()
    }

    pub(crate) fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub(crate) fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
}

/// Operation codes (the low 3 bits of an op byte).
#[derive(Debug, Clone, Copy)]
#[repr(u8)]
#[non_exhaustive]
pub enum Op {
    /// Lay out a valid-looking chain through the mock: layout byte, count
    /// byte, then per buffer a u16 length and a writable byte.
    AddChain = 0,
    /// Lay out a [`Malicious`] pattern: index byte.
    AddMalicious = 1,
    /// Write raw descriptors into the ring and publish a raw head.
    RawRing = 2,
    /// Write a raw indirect table and publish a ring descriptor to it.
    RawTable = 3,
    /// Pop and serve one chain.
    Pop = 4,
    /// Write a raw available index (odd byte) or restore the real one.
    AvailIdx = 5,
    /// Pop and serve until the queue is empty.
    PopAll = 6,
    /// Reclaim used entries in the mock.
    Reclaim = 7,
}

/// Runs one fuzz input under the spec-strict policy, the large policy and
/// the variant its header selects. Panics only when an invariant breaks.
pub fn run(data: &[u8]) {
    replay(data, |data, limits| {
        run_with(data, limits);
    });
}

/// Replays `data` through `run_with` under the spec-strict policy, the
/// large policy and the variant its header selects (byte 1: bit 1 refuses
/// indirect descriptors, bit 2 chained tables where compiled in, bits 3-4
/// the variant; byte 2 its parameter). The chosen variant is skipped when it
/// equals one of the other two: the same run twice would check nothing new.
pub(crate) fn replay(data: &[u8], mut run_with: impl FnMut(&[u8], ChainLimits)) {
    let mut input = Input { data, pos: 0 };
    let _size = input.u8();
    let flags = input.u8();
    let param = input.u8();
    let mut chosen = match (flags >> 3) & 3 {
        0 => ChainLimits::strict(),
        1 => ChainLimits::large(),
        2 => ChainLimits::large().with_max_descriptors(1 + u32::from(param)),
        _ => ChainLimits::large().with_max_bytes(u32::from(param) << 8),
    };
    let indirect = flags & 2 == 0;
    chosen = chosen.with_indirect(indirect);
    if cfg!(feature = "chained-indirect") && flags & 4 != 0 && indirect {
        chosen = chosen.with_chained_indirect(true);
    }
    let strict = ChainLimits::strict().with_indirect(indirect);
    let large = ChainLimits::large().with_indirect(indirect);
    run_with(data, strict);
    run_with(data, large);
    if chosen != strict && chosen != large {
        run_with(data, chosen);
    }
}

/// The work one [`run_with`] may spend: descriptors walked (accepted
/// chains fully, refused ones as far as the error tells), including the
/// 32768-entry table of each [`Malicious::TooManyDescriptorsLarge`] laid
/// out, up to four times the large policy's chain limit; and bytes copied
/// through the Reader/Writer (64 MiB each way).
///
/// A guest can publish every ring entry with the same head of a 32768-entry
/// indirect table; serving 256 of them costs 8 million descriptor walks
/// under the large policy, the same work many times over. Found as
/// libFuzzer slow units of 0.5 s (most of it in the checks, not in the
/// walker); the run stops popping once the budget is spent, after the chain
/// that spent it was fully checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Budget {
    /// Descriptors of accepted chains still to check.
    pub descriptors: u64,
    /// Bytes still to copy each way.
    pub bytes: usize,
}

impl Budget {
    /// The budget of one fuzz run.
    pub const RUN: Budget = Budget {
        descriptors: 4 * crate::limits::LARGE_MAX_DESCRIPTORS as u64,
        bytes: 64 << 20,
    };

    /// Whether anything is left.
    pub fn exhausted(&self) -> bool {
        self.descriptors == 0
    }
}

/// Runs one fuzz input under `limits` (its header's policy bits ignored);
/// returns what is left of its [`Budget`].
pub fn run_with(data: &[u8], limits: ChainLimits) -> Budget {
    let mut input = Input { data, pos: 0 };
    let size = 1u16 << (1 + input.u8() % 8);
    let flags = input.u8();
    let _param = input.u8();
    let mem = guest_memory(MEMORY);
    let mut driver = MockDriver::new(&mem, size);
    let mut queue = driver.create_queue();
    queue.set_event_idx(flags & 1 != 0);
    let mut walker = ChainWalker::new(limits).expect("fuzz limits are valid");
    let mut served = 0u64;
    let mut budget = Budget::RUN;

    for _ in 0..MAX_OPS {
        if input.done() || budget.exhausted() {
            break;
        }
        let op = input.u8();
        match op & 7 {
            0 => {
                let layout = match input.u8() % 3 {
                    0 => Layout::Direct,
                    1 => Layout::Indirect,
                    n => Layout::ChainedIndirect {
                        per_table: 2 + u16::from(n) + u16::from(op >> 3),
                    },
                };
                let count = 1 + usize::from(input.u8() % 48);
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
                let _ = driver.add_chain(layout, &bufs);
            }
            1 => {
                let idx = usize::from(input.u8()) % Malicious::ALL.len();
                let pattern = Malicious::ALL[idx];
                if pattern == Malicious::TooManyDescriptorsLarge {
                    // Laying out its 32768-entry table is work too.
                    budget.descriptors = budget
                        .descriptors
                        .saturating_sub(u64::from(crate::limits::LARGE_MAX_DESCRIPTORS));
                }
                if pattern == Malicious::TooManyDescriptorsLarge {
                    let _ = add_too_many_descriptors_large(&mut driver, &mem);
                } else {
                    let _ = driver.add_malicious(pattern);
                }
            }
            2 => {
                let n = 1 + usize::from(input.u8() % 4);
                for _ in 0..n {
                    let index = input.u16() % size;
                    let d = raw_desc(&mut input, &driver);
                    let _ = driver.write_desc(index, d);
                }
                let head = input.u16() % (size + 2);
                let _ = driver.publish(head, Vec::new());
            }
            3 => {
                let n = 1 + usize::from(input.u8() % 16);
                let descs: Vec<_> = (0..n).map(|_| raw_desc(&mut input, &driver)).collect();
                let len = match input.u8() % 4 {
                    0 => input.u32(),
                    _ => 16 * n as u32,
                };
                if let Ok(table) = driver.write_table(&descs) {
                    if let Ok(ring) = driver.alloc_ring(1) {
                        let head = ring[0];
                        let _ = driver.write_desc(head, desc(table.0, len, F_INDIRECT, 0));
                        let _ = driver.publish(head, ring);
                    }
                }
            }
            4 => {
                served += u64::from(pop_within(
                    &mut walker,
                    &mut queue,
                    &driver,
                    &mem,
                    &mut budget,
                ));
            }
            5 => {
                let raw = input.u16();
                if raw & 1 == 1 {
                    let _ = driver.set_avail_idx(raw);
                } else {
                    let _ = driver.restore_avail_idx();
                }
            }
            6 => {
                for _ in 0..2 * usize::from(size) {
                    if !pop_within(&mut walker, &mut queue, &driver, &mem, &mut budget) {
                        break;
                    }
                    served += 1;
                }
            }
            _ => {
                driver.take_used();
            }
        }
    }
    let _ = driver.restore_avail_idx();
    for _ in 0..2 * usize::from(size) {
        if !pop_within(&mut walker, &mut queue, &driver, &mem, &mut budget) {
            break;
        }
        served += 1;
    }
    let stats = walker.stats();
    assert!(
        stats.chains + stats.faults >= served,
        "{stats:?} popped {served}"
    );
    budget
}

/// [`Malicious::TooManyDescriptorsLarge`] laid out as
/// [`MockDriver::add_malicious`] lays it out (the same allocations, bytes
/// and ring entries; `test_large_table_layout_matches_the_mock` compares
/// them), with its 32768-entry table written in one copy instead of one
/// guest-memory write per descriptor, which took a third of the fuzzer's
/// time.
fn add_too_many_descriptors_large(
    driver: &mut MockDriver<'_, GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
) -> Result<u16, crate::mock::MockError> {
    use crate::mock::{MockError, F_NEXT};
    // The table depends only on the page address, which repeats across
    // the policy replays of an input and across similar inputs: keep the
    // last few (building one is a 32768-step loop, which the coverage
    // instrumentation makes costly).
    thread_local! {
        static TABLES: std::cell::RefCell<Vec<(u64, Vec<u8>)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    const KEEP: usize = 8;
    let n = crate::limits::LARGE_MAX_DESCRIPTORS as usize;
    let page = driver.alloc_data(4096)?.0;
    let t_addr = driver.alloc_data(16 * n as u64)?;
    TABLES.with(|tables| {
        let mut tables = tables.borrow_mut();
        let at = match tables.iter().position(|(p, _)| *p == page) {
            Some(at) => at,
            None => {
                let mut t = Vec::with_capacity(16 * n);
                for i in 0..n {
                    let (flags, next) = if i + 1 < n {
                        (F_NEXT, i as u16 + 1)
                    } else {
                        (0, 0)
                    };
                    t.extend_from_slice(&page.to_le_bytes());
                    t.extend_from_slice(&8u32.to_le_bytes());
                    t.extend_from_slice(&flags.to_le_bytes());
                    t.extend_from_slice(&next.to_le_bytes());
                }
                if tables.len() == KEEP {
                    tables.pop();
                }
                tables.push((page, t));
                tables.len() - 1
            }
        };
        // Most recent first.
        let hit = tables.remove(at);
        tables.insert(0, hit);
        mem.write_slice(&tables[0].1, t_addr)
            .map_err(|e| MockError::Memory(e.to_string()))
    })?;
    let ring = driver.alloc_ring(2)?;
    driver.write_desc(ring[0], desc(page, 8, F_NEXT, ring[1]))?;
    driver.write_desc(ring[1], desc(t_addr.0, 16 * n as u32, F_INDIRECT, 0))?;
    driver.publish(ring[0], ring.clone())?;
    Ok(ring[0])
}

fn raw_desc(
    input: &mut Input<'_>,
    driver: &MockDriver<'_, GuestMemoryMmap>,
) -> virtio_queue::desc::split::Descriptor {
    let sel = input.u8();
    let addr = match sel % 4 {
        0 => driver.data_start().0 + u64::from(input.u16()) * 16,
        1 => driver.memory_end().wrapping_sub(u64::from(input.u8())),
        2 => input.u64(),
        _ => u64::from(input.u16()) * 16,
    };
    let len = if sel & 0x10 != 0 {
        input.u32()
    } else {
        u32::from(input.u16())
    };
    let flags = u16::from(input.u8() & 7);
    let next = input.u16();
    desc(addr, len, flags, next)
}

/// [`pop_and_serve`] charged to `budget`: false without popping once the
/// budget is spent; an accepted chain is fully checked, its bytes copied up
/// to what is left of the byte budget.
fn pop_within(
    walker: &mut ChainWalker,
    queue: &mut Queue,
    driver: &MockDriver<'_, GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    budget: &mut Budget,
) -> bool {
    if budget.exhausted() {
        return false;
    }
    let mut spent = (0u32, 0usize);
    let popped = pop_and_serve_counted(walker, queue, driver, mem, budget.bytes, &mut spent);
    budget.descriptors = budget.descriptors.saturating_sub(u64::from(spent.0));
    budget.bytes = budget.bytes.saturating_sub(spent.1);
    popped
}

/// Pops one chain; checks a valid one, serves up to `io_limit` bytes each
/// way and returns it to the used ring. False when nothing more can be
/// popped (empty queue or ring-level error).
pub fn pop_and_serve(
    walker: &mut ChainWalker,
    queue: &mut Queue,
    driver: &MockDriver<'_, GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    io_limit: usize,
) -> bool {
    pop_and_serve_counted(walker, queue, driver, mem, io_limit, &mut (0, 0))
}

/// [`pop_and_serve`], setting `spent` to the accepted chain's descriptor
/// count and the most bytes copied one way.
fn pop_and_serve_counted(
    walker: &mut ChainWalker,
    queue: &mut Queue,
    driver: &MockDriver<'_, GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    io_limit: usize,
    spent: &mut (u32, usize),
) -> bool {
    let next_avail = queue.next_avail();
    match walker.pop(queue, mem) {
        Ok(Some(chain)) => {
            let most = chain.readable_len().max(chain.writable_len()) as usize;
            *spent = (chain.descriptor_count().max(1), most.min(io_limit));
            check_chain(walker.limits(), &chain, queue.size(), mem);
            compare_with_virtio_queue(walker.limits(), &chain, driver, next_avail, mem);
            let written = serve(&chain, io_limit);
            queue
                .add_used(mem, chain.head_index(), written)
                .expect("used ring is in memory");
            let _ = queue.needs_notification(mem);
            true
        }
        Ok(None) => false,
        Err(e) => {
            if e.is_chain_fault() {
                assert_eq!(queue.next_avail(), next_avail.wrapping_add(1));
                // What the walk went through before it refused, where the
                // error tells (the long walks); one descriptor otherwise.
                spent.0 = match e {
                    crate::Error::TooManyDescriptors { max } => max.saturating_add(1),
                    crate::Error::DescriptorLoop { table_len } => table_len,
                    crate::Error::ReadableAfterWritable { position } => position,
                    _ => 1,
                };
                true
            } else {
                assert_eq!(
                    queue.next_avail(),
                    next_avail,
                    "ring errors consume nothing"
                );
                false
            }
        }
    }
}

/// Checks an accepted chain: limits hold, segment lengths add up, every
/// segment is non-empty and inside one guest memory region.
pub fn check_chain(
    limits: &ChainLimits,
    chain: &Chain<&GuestMemoryMmap>,
    size: u16,
    mem: &GuestMemoryMmap,
) {
    assert!(chain.descriptor_count() <= limits.descriptors_for(size));
    let total = u64::from(chain.readable_len()) + u64::from(chain.writable_len());
    assert!(total <= u64::from(limits.max_bytes));
    let r: u64 = chain
        .readable_segments()
        .iter()
        .map(|s| u64::from(s.len()))
        .sum();
    let w: u64 = chain
        .writable_segments()
        .iter()
        .map(|s| u64::from(s.len()))
        .sum();
    assert_eq!(r, u64::from(chain.readable_len()));
    assert_eq!(w, u64::from(chain.writable_len()));
    for s in chain
        .readable_segments()
        .iter()
        .chain(chain.writable_segments())
    {
        assert!(s.len() > 0);
        assert!(
            mem.check_range(s.addr(), s.len() as usize),
            "{s:?} outside memory"
        );
        let region = mem.find_region(s.addr()).expect("segment in a region");
        assert!(
            mem.find_region(GuestAddress(s.addr().0 + u64::from(s.len()) - 1))
                .is_some_and(|r| std::ptr::eq(r, region)),
            "segment spans regions"
        );
    }
}

/// virtio-queue's iterator must see the same descriptors and bytes in an
/// accepted chain (skipped for chained tables, which it does not know).
/// `next_avail` is the queue position the chain was popped from.
pub fn compare_with_virtio_queue(
    limits: &ChainLimits,
    chain: &Chain<&GuestMemoryMmap>,
    driver: &MockDriver<'_, GuestMemoryMmap>,
    next_avail: u16,
    mem: &GuestMemoryMmap,
) {
    if limits.chained_indirect {
        return;
    }
    let mut vq: Queue = driver.create_queue();
    vq.set_next_avail(next_avail);
    let theirs = vq
        .pop_descriptor_chain(mem)
        .expect("virtio-queue pops the same head");
    assert_eq!(theirs.head_index(), chain.head_index());
    let (mut count, mut rbytes, mut wbytes) = (0u32, 0u64, 0u64);
    for d in theirs {
        count += 1;
        if d.is_write_only() {
            wbytes += u64::from(d.len());
        } else {
            rbytes += u64::from(d.len());
        }
    }
    assert_eq!(
        count,
        chain.descriptor_count(),
        "descriptor count differs from virtio-queue"
    );
    assert_eq!(rbytes, u64::from(chain.readable_len()));
    assert_eq!(wbytes, u64::from(chain.writable_len()));
}

/// Reads up to `io_limit` bytes in two parts split at the middle, then
/// writes up to `io_limit` bytes, payload first and an 11-byte header
/// last; returns the bytes written. With an unbounded limit it checks that
/// exactly the chain's lengths were transferred.
pub fn serve(chain: &Chain<&GuestMemoryMmap>, io_limit: usize) -> u32 {
    let mut r = chain.reader();
    assert_eq!(r.available_bytes(), chain.readable_len() as usize);
    assert_eq!(
        chain.writer().available_bytes(),
        chain.writable_len() as usize
    );
    let want = r.available_bytes().min(io_limit);
    let mut tail = r.split_at(want / 2).expect("split inside the reader");
    let mut buf = Vec::new();
    r.read_to_end(&mut buf).expect("guest memory is readable");
    (&mut tail)
        .take((want - buf.len()) as u64)
        .read_to_end(&mut buf)
        .expect("guest memory is readable");
    assert_eq!(buf.len(), want);

    let mut w = chain.writer();
    let room = w.available_bytes().min(io_limit);
    let mut payload = w.split_at(room.min(11)).expect("split inside the writer");
    let fill = vec![0xa5u8; room - room.min(11)];
    payload.write_all(&fill).expect("payload fits");
    let hdr = vec![0x5au8; w.available_bytes()];
    w.write_all(&hdr).expect("header fits");
    let written = w.bytes_written() + payload.bytes_written();
    assert_eq!(written, room);
    if io_limit == usize::MAX {
        assert_eq!(buf.len(), chain.readable_len() as usize);
        assert_eq!(written, chain.writable_len() as usize);
    }
    written as u32
}

/// A seed corpus: one input per op kind, every malicious pattern, large
/// chains and both policies.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    // Valid chains, direct/indirect, both policies, event-idx on.
    for (layout, policy) in [(0u8, 0u8), (1, 0), (1, 1 << 3), (2, 1 << 3)] {
        let mut s = vec![7, 1 | policy, 0, Op::AddChain as u8, layout, 6];
        for i in 0..6u8 {
            s.extend_from_slice(&[(u32::from(i) * 97) as u8, 2, u8::from(i >= 3)]);
        }
        s.push(Op::PopAll as u8);
        seeds.push(s);
    }
    // Each malicious pattern followed by a valid chain.
    for i in 0..Malicious::ALL.len() {
        let policy = if i % 2 == 0 { 1 << 3 } else { 0 };
        seeds.push(vec![
            5,
            policy,
            0,
            Op::AddMalicious as u8,
            i as u8,
            Op::AddChain as u8,
            1,
            1,
            16,
            0,
            0,
            Op::PopAll as u8,
            Op::Reclaim as u8,
        ]);
    }
    // Raw ring descriptors, a raw table, a bad available index.
    seeds.push(vec![
        3,
        0,
        0,
        Op::RawRing as u8,
        2,
        1,
        0,
        0x10,
        0,
        0,
        0,
        1,
        1,
        0,
        0,
        0,
        0,
        0,
        0,
        0x20,
        0,
        1,
        0,
        1,
        0,
        Op::Pop as u8,
    ]);
    seeds.push(vec![
        3,
        1 << 3,
        0,
        Op::RawTable as u8,
        2,
        0,
        1,
        0,
        0x40,
        0,
        1,
        1,
        0,
        0,
        2,
        0,
        0x40,
        0,
        2,
        0,
        0,
        1,
        Op::PopAll as u8,
    ]);
    seeds.push(vec![
        4,
        0,
        0,
        Op::AddChain as u8,
        0,
        1,
        8,
        0,
        0,
        Op::AvailIdx as u8,
        0xff,
        0x7f,
        Op::Pop as u8,
        Op::AvailIdx as u8,
        0,
        0,
        Op::PopAll as u8,
    ]);
    // A small descriptor limit and a small byte cap.
    seeds.push(vec![
        8,
        2 << 3,
        3,
        Op::AddChain as u8,
        1,
        8,
        0,
        1,
        0,
        Op::PopAll as u8,
    ]);
    seeds.push(vec![
        8,
        3 << 3,
        2,
        Op::AddChain as u8,
        1,
        8,
        0,
        1,
        0,
        Op::PopAll as u8,
    ]);
    seeds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_fuzz_seeds_run_clean() {
        for seed in seeds() {
            run(&seed);
        }
        // Degenerate inputs.
        run(&[]);
        run(&[0xff; 300]);
    }

    #[test]
    fn test_regression_slow_unit_same_large_table_in_every_ring_entry() {
        // virtqueue_chain slow unit (0.45 s in the release fuzz build):
        // the ring entries all point at one 32768-entry indirect table
        // (the TooManyDescriptorsLarge table reached from a raw head), so
        // 250 chains of 32768 descriptors were each walked, checked against
        // virtio-queue and served under the large policy.
        let input = [
            0x27, 0x00, 0x06, 0x05, 0x05, 0x00, 0xff, 0xf4, 0x01, 0x59, 0x01, 0xfe, 0xfc, 0xff,
            0xff, 0xef, 0xdd, 0x3d, 0x00, 0x59, 0x59, 0x59, 0x59, 0x03, 0x10, 0x00, 0x00, 0x37,
            0x00, 0x00, 0x27, 0x06, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x57, 0x55, 0x55, 0x7a,
            0x55, 0x55, 0x55, 0x05, 0xff, 0x00, 0x06, 0x00, 0xff, 0x07, 0x07,
        ];
        let left = run_with(&input, ChainLimits::large());
        // The budget ran out after the first accepted chains, all checked.
        assert!(left.exhausted(), "{left:?}");
        // The strict policy refuses the table after queue-size
        // descriptors, again and again: charged as far as it walked.
        let strict = run_with(&input, ChainLimits::strict());
        assert!(strict.descriptors < Budget::RUN.descriptors, "{strict:?}");
        run(&input);
    }

    #[test]
    fn test_large_table_layout_matches_the_mock() {
        // The second round finds its tables in the cache.
        for _ in 0..2 {
            let (a, b) = (guest_memory(MEMORY), guest_memory(MEMORY));
            let mut da = MockDriver::new(&a, 64);
            let mut db = MockDriver::new(&b, 64);
            // Something first, so the pattern does not start at the data
            // start.
            let _ = da.add_chain(Layout::Direct, &[Buf::r(100)]).unwrap();
            let _ = db.add_chain(Layout::Direct, &[Buf::r(100)]).unwrap();
            for _ in 0..2 {
                let mine = add_too_many_descriptors_large(&mut da, &a).unwrap();
                let theirs = db
                    .add_malicious(Malicious::TooManyDescriptorsLarge)
                    .unwrap();
                assert_eq!(Some(mine), theirs);
            }
            let (mut ma, mut mb) = (vec![0u8; MEMORY], vec![0u8; MEMORY]);
            a.read_slice(&mut ma, GuestAddress(0)).unwrap();
            b.read_slice(&mut mb, GuestAddress(0)).unwrap();
            assert!(ma == mb, "guest memory differs from the mock's layout");
            // And the walker refuses it as the pattern says.
            let mut qa = da.create_queue();
            let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
            assert!(
                walker.pop(&mut qa, &a).unwrap().is_some(),
                "the first chain"
            );
            let err = walker.pop(&mut qa, &a).err().map(|e| e.kind());
            assert_eq!(err, Some(Malicious::TooManyDescriptorsLarge.expected()));
        }
    }

    #[test]
    fn test_budget_leaves_small_inputs_alone() {
        for seed in seeds() {
            let left = run_with(&seed, ChainLimits::large());
            assert!(!left.exhausted(), "a seed spent the budget: {left:?}");
        }
    }

    #[test]
    fn test_write_seed_corpus_when_asked() {
        let Some(dir) = std::env::var_os("VIRTQUEUE_LARGE_SEED_DIR") else {
            return;
        };
        std::fs::create_dir_all(&dir).unwrap();
        for (i, seed) in seeds().iter().enumerate() {
            std::fs::write(
                std::path::Path::new(&dir).join(format!("seed-{i:03}")),
                seed,
            )
            .unwrap();
        }
    }
}
