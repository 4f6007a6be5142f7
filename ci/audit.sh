#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# RustSec advisories, where the advisory database can be fetched.
source "$(dirname "$0")/lib.sh"
command -v cargo-audit >/dev/null || skip "cargo-audit is not installed; its advisory database cannot be fetched from this network"
cargo audit
