#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# API docs build without warnings (broken intra-doc links fail).
source "$(dirname "$0")/lib.sh"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --locked
