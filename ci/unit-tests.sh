#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Unit and integration tests under nextest, then the doc tests (nextest does
# not run those).
source "$(dirname "$0")/lib.sh"
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --all-features --locked --no-fail-fast
else
    cargo test --workspace --all-features --locked --no-fail-fast --lib --bins --tests
fi
cargo test --workspace --all-features --locked --doc
