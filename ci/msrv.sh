#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# The declared rust-version (root Cargo.toml) is built with exactly that
# toolchain: every crate, test, bench and example, all features, with the
# committed Cargo.lock. Cargo itself refuses a dependency that declares a
# newer rust-version, so a lockfile update that needs a newer rustc fails
# here.
# Why 1.95: it is this machine's rustup toolchain, and no other toolchain
# can be fetched. The real floor is 1.87 (virtio-queue 0.18 calls
# u*::is_multiple_of without declaring it; criterion 0.8 needs 1.86), but
# no Rust between 1.86 and 1.94 can be installed here to check it (Debian
# has 1.85.1, 1.96.0, 1.97.1 and 1.98.1), so 1.95 is what is declared.
source "$(dirname "$0")/lib.sh"
declared=$(sed -n 's/^rust-version = "\([0-9.]*\)"/\1/p' Cargo.toml)
[ -n "$declared" ] || { echo "msrv: no rust-version in Cargo.toml" >&2; exit 1; }
matches() {
    local v
    v=$("$@" rustc --version 2>/dev/null | awk '{print $2}') || return 1
    [ "$v" = "$declared" ] || [ "${v%.*}" = "$declared" ]
}
toolchain=
if command -v rustup >/dev/null; then
    for t in $(rustup toolchain list | awk '{print $1}'); do
        if matches rustup run "$t"; then
            toolchain=$t
            break
        fi
    done
elif matches env; then
    toolchain=default
fi
if [ -z "$toolchain" ]; then
    echo "msrv: no installed toolchain is rust-version $declared" \
        "($(rustc --version)); move rust-version and the toolchain together" >&2
    exit 1
fi
echo "msrv: rust-version $declared, toolchain $toolchain"
[ "$toolchain" = default ] || export RUSTUP_TOOLCHAIN=$toolchain
rustc --version
cargo check --workspace --all-features --all-targets --locked
