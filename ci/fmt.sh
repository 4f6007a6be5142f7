#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Formatting matches rustfmt.
source "$(dirname "$0")/lib.sh"
cargo fmt --all -- --check
