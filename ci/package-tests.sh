#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Each crate tests from its package, as a user of the published crate
# would: `cargo package` every crate, unpack the .crate files, and run
# each one's tests and doctests there. The unpacked crates form a scratch
# workspace whose [patch.crates-io] points the crates' dependencies on
# each other at their unpacked siblings, and which starts from the
# repository's Cargo.lock, offline; the build reuses the repository's
# target directory, so only the five crates themselves are compiled again.
# Cargo strips the path-only self dev-dependencies (`test-utils`) from a
# package, so the tests run with --all-features, which turns them on;
# virtio-9p-server's with `test-utils` only: its daemon tests (sandbox,
# guest-facing binary) take minutes and run from the same sources in the
# unit-tests step. Measured: about 12 minutes with them on the loaded
# 2-core machine (2026-12-06).
source "$(dirname "$0")/lib.sh"
repo=$(pwd)
crates=(coro-pool mem-prealloc mlock-policy virtqueue-large virtio-9p-server)
# Every crate is packaged (they depend on each other); arguments pick the
# ones tested.
tested=("${@:-${crates[@]}}")
pkg=()
for c in "${crates[@]}"; do pkg+=(-p "$c"); done
# --no-verify: the packages are built and tested below instead.
cargo package --locked --no-verify --allow-dirty "${pkg[@]}"

work=$repo/target/package-tests
rm -rf "$work"
mkdir -p "$work"
patch=""
members=""
for c in "${crates[@]}"; do
    file=$(ls "$repo"/target/package/"$c"-*.crate | sort -V | tail -1)
    tar -xzf "$file" -C "$work"
    dir=$(basename "$file" .crate)
    members+="\"$dir\", "
    patch+="$c = { path = \"$dir\" }"$'\n'
done
cat >"$work/Cargo.toml" <<TOML
[workspace]
resolver = "2"
members = [${members%, }]

[patch.crates-io]
$patch
TOML
cp "$repo/Cargo.lock" "$work/Cargo.lock"

cd "$work"
export CARGO_TARGET_DIR=$repo/target
rc=0
for c in "${tested[@]}"; do
    echo "package-tests: $c"
    features=(--all-features)
    [ "$c" = virtio-9p-server ] && features=(--features test-utils)
    cargo test --offline -q --no-fail-fast "${features[@]}" -p "$c" \
        --lib --bins --tests --examples || rc=1
    cargo test --offline -q --no-fail-fast "${features[@]}" -p "$c" --doc || rc=1
done
[ "$rc" -eq 0 ] || { echo "package-tests: failures above" >&2; exit 1; }
echo "package-tests: ok (${tested[*]} tested from their packages)"
