// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Suite `selftest`: exercises the harness itself with a comparison whose
//! answer is known: summing a buffer in one pass against summing it twice.
//! The ratio must come out near 2, which checks the alternation, the medians
//! and the output files end to end.

use std::hint::black_box;

use crate::harness::{alternate, format_value, time, Ctx, SuiteReport, SuiteResult, Table};

/// One-line description.
pub const ABOUT: &str = "harness self-check: one pass vs two passes over a buffer";
/// Ready to run.
pub const READY: bool = true;

fn sum(buf: &[u64]) -> u64 {
    buf.iter().fold(0u64, |acc, v| acc.wrapping_add(*v))
}

/// Measures both contenders alternately and reports their medians and ratio.
pub fn run(ctx: &Ctx) -> SuiteResult {
    let len = ctx.pick(4 << 20, 64 << 10);
    let buf: Vec<u64> = (0..len as u64).collect();
    let ns_per_elem = |passes: u32| {
        let (_, elapsed) = time(|| {
            for _ in 0..passes {
                black_box(sum(black_box(&buf)));
            }
        });
        Ok(elapsed.as_nanos() as f64 / len as f64)
    };
    let mut one = || ns_per_elem(1);
    let mut two = || ns_per_elem(2);
    let [one_pass, two_passes] = alternate(ctx.reps(), &mut [&mut one, &mut two])?;

    let mut contenders = Table::new("contenders", &["contender", "ns per element"]);
    contenders
        .row(&["one pass", &format_value(one_pass)])
        .row(&["two passes", &format_value(two_passes)]);
    let mut report = SuiteReport::default();
    report
        .table(contenders)
        .metric("one_pass_ns_per_elem", one_pass)
        .metric("two_passes_ns_per_elem", two_passes)
        .metric("ratio_two_vs_one", two_passes / one_pass)
        .note(format!(
            "{len} u64 elements, median of {} alternating runs; the ratio should be near 2.",
            ctx.reps()
        ));
    Ok(report)
}
