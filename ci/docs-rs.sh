#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# The docs the way docs.rs builds them: all features, `--cfg docsrs` (which
# turns on `doc(cfg(...))` badges on feature-gated items, a nightly rustdoc
# feature, hence RUSTC_BOOTSTRAP on the stable toolchain), warnings fatal.
source "$(dirname "$0")/lib.sh"
RUSTC_BOOTSTRAP=1 RUSTDOCFLAGS="--cfg docsrs -D warnings" \
    cargo doc --workspace --all-features --no-deps --locked
