#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Miri for the unsafe code, where the toolchain has it.
source "$(dirname "$0")/lib.sh"
cargo miri --version >/dev/null 2>&1 || skip "miri is not available for this toolchain (stable only, no rustup downloads here)"
cargo miri test -p virtqueue-large --all-features
