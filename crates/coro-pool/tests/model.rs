// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! A proptest of random get/put/trim/reserve sequences on one thread,
//! checked step by step against a model of the pool's rules.

use std::collections::HashSet;

use coro_pool::{GuardMode, PoolConfig, PooledStack, StackId, StackPool};
use proptest::prelude::*;

const BATCH: usize = 4;
const BASE_MAX: usize = 6;

#[derive(Debug, Clone)]
enum Op {
    Get,
    Put(usize),
    Trim,
    Reserve(usize),
    Unreserve,
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => Just(Op::Get),
        5 => any::<usize>().prop_map(Op::Put),
        1 => Just(Op::Trim),
        1 => (0usize..20).prop_map(Op::Reserve),
        1 => Just(Op::Unreserve),
        1 => Just(Op::Flush),
    ]
}

/// The pool's rules, in counts.
#[derive(Debug, Default)]
struct Model {
    cur: usize,
    spare: usize,
    /// Global batches, oldest first: (stacks, returned by this thread's
    /// spill rather than by a flush).
    global: Vec<(usize, bool)>,
    live: usize,
    held: usize,
    created: u64,
    reused: u64,
    freed: u64,
    reserved: Vec<usize>,
    peak_outside: usize,
}

impl Model {
    fn max(&self) -> usize {
        BASE_MAX + self.reserved.iter().sum::<usize>()
    }

    fn global_size(&self) -> usize {
        self.global.iter().map(|b| b.0).sum()
    }

    fn put_global(&mut self, n: usize, mine: bool) {
        if n == 0 {
            return;
        }
        let room = self.max().saturating_sub(self.global_size());
        let keep = n.min(room);
        if keep > 0 {
            self.global.push((keep, mine));
        }
        self.freed += (n - keep) as u64;
        self.held -= n - keep;
    }

    /// A refill takes the newest of the last four batches this thread
    /// spilled itself, else the newest batch.
    fn take_global(&mut self) -> Option<usize> {
        let len = self.global.len();
        let pick = (len.saturating_sub(4)..len)
            .rev()
            .find(|&i| self.global[i].1)
            .or(len.checked_sub(1))?;
        Some(self.global.remove(pick).0)
    }

    fn note_outside(&mut self) {
        let outside = self.held - self.global_size();
        self.peak_outside = self.peak_outside.max(outside);
    }

    fn get(&mut self) {
        if self.cur > 0 {
            self.cur -= 1;
            self.reused += 1;
        } else if self.spare > 0 {
            self.cur = self.spare - 1;
            self.spare = 0;
            self.reused += 1;
        } else if let Some(b) = self.take_global() {
            self.cur = b - 1;
            self.reused += 1;
            self.note_outside();
        } else {
            self.created += 1;
            self.held += 1;
            self.note_outside();
        }
        self.live += 1;
    }

    fn put(&mut self) {
        self.live -= 1;
        if self.cur >= BATCH {
            let spill = std::mem::take(&mut self.spare);
            self.spare = self.cur;
            self.cur = 0;
            self.cur += 1;
            self.put_global(spill, true);
        } else {
            self.cur += 1;
        }
    }

    fn trim(&mut self) {
        let now = self.held - self.global_size();
        let peak = self.peak_outside.max(now);
        self.peak_outside = now;
        let keep = self.max().min(peak - now);
        self.shrink(keep);
    }

    /// Frees the oldest global stacks until at most `keep` are left.
    fn shrink(&mut self, keep: usize) {
        let mut size = self.global_size();
        while size > keep {
            let excess = size - keep;
            let first = self.global[0].0;
            if first <= excess {
                self.global.remove(0);
                size -= first;
                self.freed += first as u64;
                self.held -= first;
            } else {
                self.global[0].0 -= excess;
                size -= excess;
                self.freed += excess as u64;
                self.held -= excess;
            }
        }
    }

    /// A reservation ends: the maximum drops and the global stacks above
    /// it are freed at once.
    fn unreserve(&mut self) {
        if self.reserved.pop().is_some() {
            self.shrink(self.max());
        }
    }

    fn flush(&mut self) {
        let spare = std::mem::take(&mut self.spare);
        let cur = std::mem::take(&mut self.cur);
        self.put_global(spare, false);
        self.put_global(cur, false);
    }
}

fn check(pool: &StackPool, m: &Model, step: usize) -> Result<(), TestCaseError> {
    let s = pool.stats();
    prop_assert_eq!(s.live_coroutines, m.live, "live at step {}", step);
    prop_assert_eq!(s.pooled_local, m.cur + m.spare, "local at step {}", step);
    prop_assert_eq!(s.pooled_global, m.global_size(), "global at step {}", step);
    prop_assert_eq!(s.stacks_held, m.held, "held at step {}", step);
    prop_assert_eq!(s.stacks_created, m.created, "created at step {}", step);
    prop_assert_eq!(s.stacks_reused, m.reused, "reused at step {}", step);
    prop_assert_eq!(s.stacks_freed, m.freed, "freed at step {}", step);
    prop_assert_eq!(s.max_pooled, m.max(), "max at step {}", step);
    prop_assert!(s.pooled_local <= 2 * BATCH);
    Ok(())
}

/// The global pool never holds more than its maximum: returning stacks
/// never grows it beyond, and lowering the maximum (a reservation ends)
/// frees what is above at once.
fn check_growth(pool: &StackPool, global_before: usize) -> Result<(), TestCaseError> {
    let s = pool.stats();
    if s.pooled_global > global_before {
        prop_assert!(s.pooled_global <= s.max_pooled, "{:?}", s);
    }
    prop_assert!(s.pooled_global <= s.max_pooled, "{:?}", s);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn test_random_get_put_trim_agrees_with_model(ops in proptest::collection::vec(op(), 1..300)) {
        let pool = StackPool::new(
            PoolConfig::default()
                .stack_size(16 << 10)
                .batch_size(BATCH)
                .base_max(BASE_MAX)
                .guard(GuardMode::Mprotect),
        )
        .unwrap();
        let mut model = Model::default();
        let mut live: Vec<PooledStack> = Vec::new();
        let mut reservations = Vec::new();
        let mut ever: HashSet<StackId> = HashSet::new();
        for (step, op) in ops.into_iter().enumerate() {
            let global_before = pool.stats().pooled_global;
            match op {
                Op::Get => {
                    let created_before = pool.stats().stacks_created;
                    let s = pool.take_stack().unwrap();
                    let id = s.id();
                    prop_assert!(live.iter().all(|l| l.id() != id), "a stack handed out twice");
                    model.get();
                    if model.created == created_before {
                        prop_assert!(ever.contains(&id), "a reused stack must be a known one");
                    }
                    ever.insert(id);
                    live.push(s);
                }
                Op::Put(i) => {
                    if live.is_empty() {
                        continue;
                    }
                    let idx = i % live.len();
                    drop(live.swap_remove(idx));
                    model.put();
                }
                Op::Trim => {
                    pool.trim();
                    model.trim();
                }
                Op::Reserve(n) => {
                    reservations.push(pool.reserve(n));
                    model.reserved.push(n);
                }
                Op::Unreserve => {
                    drop(reservations.pop());
                    model.unreserve();
                }
                Op::Flush => {
                    pool.flush_local();
                    model.flush();
                }
            }
            check(&pool, &model, step)?;
            check_growth(&pool, global_before)?;
        }
    }
}
