#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Each crate builds with no default features and with its defaults, not
# only with --all-features (what the other steps use): a feature that
# another one pulls in by accident shows here.
source "$(dirname "$0")/lib.sh"
crates=$(cargo metadata --no-deps --format-version 1 --locked \
    | python3 -c 'import json,sys; print(" ".join(p["name"] for p in json.load(sys.stdin)["packages"] if p["manifest_path"].split("/")[-3] == "crates"))')
# Warnings fail the step too (the lints say what a dead feature gate
# leaves behind); RUSTFLAGS would rebuild every dependency, so grep.
check() {
    local out
    out=$(cargo check --locked -q --message-format short "$@" 2>&1) || { echo "$out"; return 1; }
    if grep -E '^[^ ]+: warning|^warning' <<<"$out"; then
        return 1
    fi
}
for c in $crates; do
    echo "feature-matrix: $c --no-default-features"
    check -p "$c" --lib --no-default-features
    echo "feature-matrix: $c (default features)"
    check -p "$c" --all-targets
done
echo "feature-matrix: ok ($crates)"
