#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Clippy on every target and feature; the lints live in [workspace.lints].
source "$(dirname "$0")/lib.sh"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
