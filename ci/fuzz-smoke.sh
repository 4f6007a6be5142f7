#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Runs every fuzz target briefly (FUZZ_SECONDS, default 60) with ASan, and
# fails on a crash. cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP allows
# them on stable (see fuzz/README.md). The seed corpora are written first by
# the unit tests of fuzz/common (into fuzz/corpus/<target>/, not committed).
source "$(dirname "$0")/lib.sh"
shopt -s nullglob
targets=(fuzz/fuzz_targets/*.rs)
[ ${#targets[@]} -gt 0 ] || skip "no fuzz targets yet in fuzz/fuzz_targets"
command -v cargo-fuzz >/dev/null || skip "cargo-fuzz is not installed (.ci/run installs it)"
seconds=${FUZZ_SECONDS:-60}
echo "--- seed corpora (cargo test -p vmm-fuzz-common)"
cargo test -q -p vmm-fuzz-common
for path in "${targets[@]}"; do
    target=$(basename "$path" .rs)
    mkdir -p "fuzz/corpus/$target"
    echo "--- fuzz target $target for ${seconds}s ($(ls "fuzz/corpus/$target" | wc -l) corpus files)"
    RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir fuzz "$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=60 -print_final_stats=1
done
