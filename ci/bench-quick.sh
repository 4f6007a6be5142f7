#!/usr/bin/env bash
# Quick mode of every ready benchmark suite, so the harness cannot rot.
# Figures from this run are not meaningful; the full runs are manual.
source "$(dirname "$0")/lib.sh"
cargo run --release --locked -p vmm-benches -- --quick all
