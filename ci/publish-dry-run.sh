#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Every publishable crate packages and builds on its own, the way crates.io
# will see it (cargo >= 1.90 resolves the crates' dependencies on each other).
source "$(dirname "$0")/lib.sh"
# Packaging downloads from crates.io: retry a flaky network more than the
# default 3 times (one CI run failed here and passed on the same commit).
export CARGO_NET_RETRY=10
cargo publish --workspace --dry-run --allow-dirty --locked
