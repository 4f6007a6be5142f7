#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# The lowest dependency versions the manifests allow: every direct
# dependency at the minimum of its requirement (cargo's
# -Z direct-minimal-versions, on stable through RUSTC_BOOTSTRAP=1; the
# dependencies of those then resolve as usual), and the whole workspace,
# tests and benches included, must build. A requirement that does not
# build at its minimum is to be raised. The committed Cargo.lock is put
# back when the step ends.
source "$(dirname "$0")/lib.sh"
backup=$(mktemp /tmp/Cargo.lock.XXXXXX)
cp Cargo.lock "$backup"
trap 'cp "$backup" Cargo.lock; rm -f "$backup"' EXIT
RUSTC_BOOTSTRAP=1 cargo update --quiet -Z direct-minimal-versions
echo "minimal-versions: the direct dependencies resolve to:"
cargo tree --locked --workspace --all-features --depth 1 -e normal,dev,build --prefix none \
    | grep -v ' (/' | sort -u | tr '\n' ' '
echo
CARGO_TARGET_DIR=target/minimal-versions \
    cargo check --workspace --all-features --all-targets --locked
