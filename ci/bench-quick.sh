#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Quick mode of the benchmark report: every ready suite at small sizes with
# one repetition, so the harness and the suites cannot rot. It writes
# target/bench/BENCHMARKS.quick.md; the committed BENCHMARKS.md comes from
# the full, manual `cargo run --release -p vmm-benches -- report`.
source "$(dirname "$0")/lib.sh"
cargo run --release --locked -p vmm-benches -- --quick report
