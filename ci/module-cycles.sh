#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Lists import circles between the modules of every crate's library and
# binaries (all features), as cargo-modules draws the graph. Not a CI step:
# cargo-modules takes ~20 min to build. Install it once with
# `cargo install --locked cargo-modules --version 0.27.0` (0.28 needs a
# newer rustc than this workspace's), then run `ci/module-cycles.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
command -v cargo-modules >/dev/null || {
    echo "module-cycles: cargo-modules is not installed (see the header)" >&2
    exit 77
}
rc=0
for manifest in crates/*/Cargo.toml; do
    crate=$(basename "$(dirname "$manifest")")
    targets=(--lib)
    for bin in $(cargo metadata --no-deps --format-version 1 --manifest-path "$manifest" |
        python3 -c 'import json,sys; m=json.load(sys.stdin)
for p in m["packages"]:
    for t in p["targets"]:
        if p["name"] == sys.argv[1] and "bin" in t["kind"]: print(t["name"])' "$crate"); do
        targets+=("--bin=$bin")
    done
    for target in "${targets[@]}"; do
        echo "== $crate $target"
        cargo modules dependencies -p "$crate" "$target" --all-features \
            --no-externs --no-sysroot 2>/dev/null |
            python3 ci/module-cycles.py || rc=1
    done
done
exit $rc
