#!/usr/bin/env bash
# Runs every fuzz target briefly (FUZZ_SECONDS, default 60) with ASan, and
# fails on a crash. cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP allows
# them on stable (see fuzz/README.md).
source "$(dirname "$0")/lib.sh"
shopt -s nullglob
targets=(fuzz/fuzz_targets/*.rs)
[ ${#targets[@]} -gt 0 ] || skip "no fuzz targets yet in fuzz/fuzz_targets"
command -v cargo-fuzz >/dev/null || skip "cargo-fuzz is not installed (.ci/run installs it)"
seconds=${FUZZ_SECONDS:-60}
for path in "${targets[@]}"; do
    target=$(basename "$path" .rs)
    echo "--- fuzz target $target for ${seconds}s"
    RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir fuzz "$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=4096
done
