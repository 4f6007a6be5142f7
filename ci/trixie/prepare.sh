#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Builds, once, a Debian trixie chroot that holds a Rust toolchain with an
# aarch64 std of the very same version, and the aarch64 cross tools:
#   rustc-web + cargo-web 1.96.0 (trixie's second, newer toolchain, kept
#   current by stable updates), libstd-rust-web-dev for amd64 and arm64 of
#   the same version, gcc-aarch64-linux-gnu (the linker) and qemu-user
#   (qemu-aarch64 runs the aarch64 test binaries).
# The rustup toolchain of this machine cannot fetch other targets; Debian's
# packages can. Checked 2026-12-06: trixie's plain rustc is 1.85.1, too old
# for virtio-queue 0.18 (u*::is_multiple_of, Rust 1.87); trixie-backports
# keeps only its newest rustc, and its arm64 build lags the amd64 one
# (rustc 1.98.1 amd64, libstd-rust-dev 1.97.1 arm64), so no pair matches.
# The chroot lives in $VIRTIO_9P_CI_CACHE/trixie-rust (about 2 GB) and is
# rebuilt when the package list below changes. Idempotent.
set -euo pipefail

CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
ROOT=$CACHE/trixie-rust
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The version is pinned so that amd64 and arm64 agree (Multi-Arch: same);
# apt refuses a version that the archive no longer has: then move the pin
# to trixie's current rustc-web.
RUST_VERSION=1.96.0+dfsg1-1~deb13u1+b1
PACKAGES=(
    "rustc-web=$RUST_VERSION" "cargo-web=$RUST_VERSION"
    "libstd-rust-web-dev=$RUST_VERSION" "libstd-rust-web-dev:arm64=$RUST_VERSION"
    gcc libc6-dev gcc-aarch64-linux-gnu libc6-dev-arm64-cross libc6:arm64
    qemu-user ca-certificates
)
stamp="trixie ${PACKAGES[*]}"
log() { echo "trixie-prepare: $*" >&2; }

if [ -f "$ROOT/.prepared" ] && [ "$(cat "$ROOT/.prepared")" = "$stamp" ]; then
    exit 0
fi
if ! command -v debootstrap >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends debootstrap >/dev/null
fi
rm -rf "$ROOT" "$ROOT.tmp"
mkdir -p "$CACHE"
log "debootstrap trixie into $ROOT (a few minutes)"
debootstrap --variant=minbase trixie "$ROOT.tmp" "$MIRROR" >&2 || {
    rm -rf "$ROOT.tmp"
    exit 1
}
cp /etc/resolv.conf "$ROOT.tmp/etc/resolv.conf"
# The chroot's apt runs in a private mount namespace with /proc and /dev, so
# nothing stays mounted on the host when it ends.
unshare --mount --propagation private bash -euo pipefail -c '
    root=$1; shift
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    chroot "$root" dpkg --add-architecture arm64
    chroot "$root" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq \
        --no-install-recommends "$@"
    chroot "$root" apt-get clean
' _ "$ROOT.tmp" "${PACKAGES[@]}" >&2
echo "$stamp" >"$ROOT.tmp/.prepared"
mv "$ROOT.tmp" "$ROOT"
log "ready: $(chroot "$ROOT" rustc --version)"
