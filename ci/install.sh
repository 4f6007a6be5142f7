#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Installs the tools the CI steps need. Idempotent: each tool is checked
# first, so a second run takes a second.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo-nextest >/dev/null; then
    cargo install --locked cargo-nextest
fi

# The semver check (ci/semver.sh).
if ! cargo semver-checks --version >/dev/null 2>&1; then
    cargo install --locked cargo-semver-checks
fi

shopt -s nullglob
fuzz_targets=(fuzz/fuzz_targets/*.rs)
if [ ${#fuzz_targets[@]} -gt 0 ] && ! command -v cargo-fuzz >/dev/null; then
    cargo install --locked cargo-fuzz --version "^0.13"
fi

# Real-guest conformance (ci/guest): stock QEMU >= 10.2 built from Debian's
# source (the frontend of every guest row) and the same tree with
# ci/guest/qemu-patches (restart only), Debian's QEMU firmware, diod, guest
# kernels, pjdfstest, all cached under /var/cache/virtio-9p-ci.
if [ "$(id -u)" -eq 0 ]; then
    bash ci/guest/prepare.sh
fi
