// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Steady state allocates nothing per chain: segment buffers come from the
//! walker's pool and the iovec array is per thread.

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

use virtio_queue::QueueT;
use virtqueue_large::mock::{guest_memory, Buf, Layout, MockDriver};
use virtqueue_large::{ChainLimits, ChainWalker};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: delegates to the system allocator; the counter is a thread-local
// `Cell` with a const initialiser, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        if COUNTING.with(|c| c.get()) {
            COUNT.with(|c| c.set(c.get() + 1));
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn counted<T>(f: impl FnOnce() -> T) -> (T, usize) {
    COUNT.with(|c| c.set(0));
    COUNTING.with(|c| c.set(true));
    let out = f();
    COUNTING.with(|c| c.set(false));
    (out, COUNT.with(|c| c.get()))
}

#[test]
fn test_steady_state_allocates_nothing_per_chain() {
    let mem = guest_memory(64 << 20);
    let mut driver = MockDriver::new(&mem, 256);
    let mut queue = driver.create_queue();
    queue.set_event_idx(true);
    let mut walker = ChainWalker::new(ChainLimits::large()).unwrap();
    let file = tempfile::tempfile().unwrap();
    file.write_all_at(&vec![5u8; 1 << 20], 0).unwrap();
    let mut scratch = vec![0u8; 64];

    let mut per_round = Vec::new();
    for round in 0..20 {
        let bufs: Vec<Buf> = std::iter::once(Buf::r(64))
            .chain(std::iter::repeat_n(Buf::w(4096), 255))
            .collect();
        let layout = if round % 2 == 0 {
            Layout::Indirect
        } else {
            Layout::Direct
        };
        driver.add_chain(layout, &bufs).unwrap();
        let ((), allocs) = counted(|| {
            let chain = walker.pop(&mut queue, &mem).unwrap().unwrap();
            let mut r = chain.reader();
            let mut w = chain.writer();
            r.read_exact(&mut scratch).unwrap();
            let mut payload = w.split_at(16).unwrap();
            let n = payload.read_from_file_at(&file, 1 << 20, 0).unwrap();
            w.write_all(&(n as u64).to_le_bytes()).unwrap();
            queue
                .add_used(&mem, chain.head_index(), (n + w.bytes_written()) as u32)
                .unwrap();
            queue.needs_notification(&mem).unwrap();
        });
        per_round.push(allocs);
        driver.take_used();
    }
    // The first round allocates the segment buffer, the pool's Arc and the
    // thread's iovec array; after that nothing.
    assert!(per_round[0] > 0);
    let steady: usize = per_round[1..].iter().sum();
    assert_eq!(steady, 0, "allocations per round: {per_round:?}");
}
