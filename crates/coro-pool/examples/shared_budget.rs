// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Two devices in one process, each with its own pool: both draw on the
//! one process-wide mapping budget, one of them with a share of its own.
//! When the budget is spent, creation fails with `BudgetExhausted` in
//! every pool, and frees as soon as stacks go back.
//!
//! ```text
//! cargo run -p coro-pool --example shared_budget
//! ```
//!
//! The example uses a small budget of its own (`ProcessBudget::new`) so
//! that it runs out quickly; without `.budget(...)` pools share
//! `ProcessBudget::process()`, `vm.max_map_count` minus 5000 VMAs.

use std::sync::Arc;

use coro_pool::{Error, GuardMode, MaxMapCount, PoolConfig, PooledStack, ProcessBudget, StackPool};

/// Takes stacks until the pool refuses one: the stacks and the refusal.
fn fill(pool: &StackPool) -> (Vec<PooledStack>, Error) {
    let mut stacks = Vec::new();
    loop {
        match pool.take_stack() {
            Ok(stack) => stacks.push(stack),
            Err(e) => return (stacks, e),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // As if vm.max_map_count were 2000, with 1000 VMAs left to the rest of
    // the process: 1000 VMAs for coroutine stacks, 500 mprotect-guarded.
    let budget = ProcessBudget::new(MaxMapCount::Fixed(2000), 1000);
    let config = PoolConfig::default()
        .stack_size(16 << 10)
        .guard(GuardMode::Mprotect)
        .budget(Arc::clone(&budget));
    // The block device may hold at most 100 stacks; the 9p device the rest.
    let block = StackPool::new(config.clone().budget_share(Some(100)))?;
    let ninep = StackPool::new(config)?;

    let (block_stacks, share_error) = fill(&block);
    println!(
        "block device: {} stacks, then: {share_error}",
        block_stacks.len()
    );

    let (ninep_stacks, budget_error) = fill(&ninep);
    println!(
        "9p device: {} stacks, then: {budget_error}",
        ninep_stacks.len()
    );
    assert!(matches!(budget_error, Error::BudgetExhausted { .. }));
    let stats = budget.stats();
    println!(
        "budget: {} of {} VMAs held by the pools ({} other mappings in the process, \
         not counted against this simulated limit)",
        stats.pool_vmas, stats.limit_vmas, stats.foreign_vmas
    );

    // The block device goes away: its stacks go back to the budget, and
    // the 9p device can grow again.
    drop(block_stacks);
    drop(block);
    let more: Vec<_> = (0..100).map_while(|_| ninep.take_stack().ok()).collect();
    println!(
        "after the block device is gone, the 9p device got {} more stacks",
        more.len()
    );
    Ok(())
}
