// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Prints how many VMAs 1000 pooled stacks take with each guard kind
//! (`cargo run --release -p vmm-benches --example coro_pool_vma_probe`).
use coro_pool::{GuardMode, PoolConfig, StackPool};

fn maps() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn main() {
    for guard in [GuardMode::Mprotect, GuardMode::Auto] {
        let pool = StackPool::new(PoolConfig::default().stack_size(64 << 10).guard(guard)).unwrap();
        let before = maps();
        let stacks: Vec<_> = (0..1000).map(|_| pool.take_stack().unwrap()).collect();
        let during = maps();
        println!(
            "{:?} ({:?}): 1000 stacks add {} VMAs (stats say at most {})",
            guard,
            pool.guard_kind(),
            during - before,
            pool.stats().vmas_held
        );
        drop(stacks);
    }
}
