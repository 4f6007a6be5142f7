#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Builds the two QEMU frontends of the real-guest rows from one Debian
# source tree:
#   $CACHE/qemu-stock/bin/qemu-system-x86_64    the source as Debian ships
#       it, no source patch: the frontend of every row (ours-vhost split,
#       packed, mapped; the `qemu` built-in 9p row; the virtiofsd row; the
#       lifecycle scenarios; xfstests; the workloads);
#   $CACHE/qemu-patched/bin/qemu-system-x86_64  the same tree with our
#       series ci/guest/qemu-patches/*.patch applied (`git am`), rebuilt
#       incrementally in the same build directory, so the two binaries differ
#       only by the series. Only the restart scenario (reconnect-ms) and
#       the migration scenario (a migratable generic device) use it.
#
# Source: the newest Debian QEMU >= 10.2 whose orig tarball downloads. The
# candidates are the `qemu` source versions that sid, trixie-backports and
# trixie list (read through a private apt configuration under
# $CACHE/qemu-src/apt, so the system's sources stay as they are), tried
# newest first. On 2026-12-06 sid listed 1:11.1.3+ds-1 and 1:11.1.2+ds-3,
# trixie-backports 1:11.1.3+ds-2~bpo13+1, and every 11.1.x file answered
# 404 on the mirror; 1:10.2.2+ds-1 (sid) downloaded, so that is the source
# picked. 10.2 is the first release with a user-creatable generic device,
# `vhost-user-test-device-pci` (QEMU commit 722e9022). The orig tarball is
# cached under $CACHE/qemu-src: later runs use it without the network.
#
# Build-only settings (no source change): --without-default-devices plus our
# device list (configs/devices/x86_64-softmmu/vhost9p.mak below); the +ds
# tarball has no prebuilt .dtb or edk2 blobs, so meson is told not to
# install them (the host's packaged firmware is used at run time:
# -L /usr/share/qemu -L /usr/share/seabios).
#
# Cached, keyed by the sha256 of this script (stock) and of this script plus
# the patches (patched): a second run returns at once; an edit of a patch
# rebuilds only the patched binary, and only the objects it changes.
# Concurrent runs wait for each other (flock). Prints the stock binary's
# path, then the patched one's, one a line.
#
# Usage: build-qemu.sh [--stock-only]
# Environment: VIRTIO_9P_CI_CACHE (default /var/cache/virtio-9p-ci),
#              JOBS (default: nproc).
set -euo pipefail
# One compound command: bash parses all of it before it runs any of it, so
# editing this file during a build is harmless.
{
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
JOBS=${JOBS:-$(nproc)}
PATCHES=$here/qemu-patches
STOCK=$CACHE/qemu-stock
PATCHED=$CACHE/qemu-patched
KEY_STOCK=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)
shopt -s nullglob
series=("$PATCHES"/*.patch)
KEY_PATCHED=$(cat "${BASH_SOURCE[0]}" "${series[@]}" | sha256sum | cut -c1-16)
stock_only=0
case ${1:-} in
    --stock-only) stock_only=1 ;;
    "") ;;
    *) echo "build-qemu: unknown option $1" >&2; exit 2 ;;
esac

built() { # DIR KEY
    [ -x "$1/bin/qemu-system-x86_64" ] && [ "$(cat "$1/.built" 2>/dev/null)" = "$2" ]
}
all_built() {
    built "$STOCK" "$KEY_STOCK" && { [ "$stock_only" -eq 1 ] || built "$PATCHED" "$KEY_PATCHED"; }
}
report() {
    echo "$STOCK/bin/qemu-system-x86_64"
    [ "$stock_only" -eq 1 ] || echo "$PATCHED/bin/qemu-system-x86_64"
}
if all_built; then
    report
    exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.qemu-build.lock"
flock 9
if all_built; then
    report
    exit 0
fi

# Build dependencies (meson >= 1.5 comes from bookworm-backports).
need=()
for p in ninja-build libglib2.0-dev flex bison python3-venv gcc xz-utils \
    python3-pycotap libattr1-dev git perl; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    log "installing build deps: ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${need[@]}" >/dev/null
fi
meson_ok() {
    command -v meson >/dev/null || return 1
    local v
    v=$(meson --version)
    [ "$(printf '%s\n1.5.0\n' "$v" | sort -V | head -1)" = 1.5.0 ]
}
if ! meson_ok; then
    [ -f /etc/apt/sources.list.d/bookworm-backports.sources ] \
        || bash "$here/install-qemu.sh" >&2
    log "installing meson from bookworm-backports"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -t bookworm-backports meson >/dev/null
fi

# Source: the newest orig tarball >= 10.2 that downloads (see the header).
src_dir=$CACHE/qemu-src
mkdir -p "$src_dir"
cd "$src_dir"
pick_tarball() {
    local t=(qemu_*.orig.tar.xz) # nullglob: none, no word
    [ ${#t[@]} -eq 0 ] || printf '%s\n' "${t[@]}" | sort -V | tail -1
}
tarball=$(pick_tarball)
if [ -z "$tarball" ]; then
    apt_dir=$src_dir/apt
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial"
    key=/usr/share/keyrings/debian-archive-keyring.gpg
    for suite in sid trixie-backports trixie; do
        echo "deb-src [signed-by=$key] http://deb.debian.org/debian $suite main"
    done >"$apt_dir/sources.list"
    apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list"
        -o Dir::Etc::sourceparts=/dev/null
        -o "Dir::State::Lists=$apt_dir/lists"
        -o "Dir::Cache=$apt_dir")
    log "reading Debian's qemu source versions (sid, trixie-backports, trixie)"
    apt-get "${apt_opts[@]}" update -qq >&2
    versions=$(apt-cache "${apt_opts[@]}" showsrc qemu 2>/dev/null \
        | sed -n 's/^Version: //p' | sort -Vr -u)
    for v in $versions; do
        upstream=${v#*:}
        upstream=${upstream%%+*}
        upstream=${upstream%%-*}
        [ "$(printf '%s\n10.2\n' "$upstream" | sort -V | head -1)" = 10.2 ] || continue
        log "trying qemu $v"
        # The .dsc may 404 where the orig tarball does not: keep what came.
        apt-get "${apt_opts[@]}" source --download-only "qemu=$v" >&2 || true
        tarball=$(pick_tarball)
        [ -z "$tarball" ] || break
        log "qemu $v did not download"
    done
    [ -n "$tarball" ] || { log "no QEMU >= 10.2 orig tarball could be downloaded"; exit 1; }
fi
version=${tarball#qemu_}
version=${version%.orig.tar.xz}
version=${version%%+*} # 10.2.2+ds unpacks to qemu-10.2.2
log "source: $tarball"

# The tree: pristine source plus the build-only settings, committed as
# `base`, so `git am` can apply the series and `git reset --hard base` can
# take it off again (git rewrites only the files that differ, so ninja
# recompiles only those).
work=$CACHE/qemu-build
tree=$work/qemu-$version
build=$work/build
g() { git -C "$tree" -c safe.directory="$tree" -c user.name=ci -c user.email=ci@localhost "$@"; }
if [ "$(cat "$work/.tree" 2>/dev/null)" != "$KEY_STOCK" ]; then
    rm -rf "$work"
    mkdir -p "$work"
    log "unpacking $tarball"
    tar xf "$src_dir/$tarball" --no-same-owner -C "$work"
    [ -d "$tree" ] || { log "$tarball did not unpack to $tree"; exit 1; }
    # No edk2 blobs in the +ds tarball: do not unpack or install them.
    sed -i 's/unpack_edk2_blobs = bzip2.found()/unpack_edk2_blobs = false/' "$tree/meson.build"
    # No prebuilt .dtb in the +ds tarball either (and no dtc here): the
    # PowerPC/MicroBlaze device trees are of no use to x86_64-softmmu.
    sed -i "s|^    install_data(dtbs, install_dir: qemu_datadir / 'dtb')|    # no prebuilt dtbs in the +ds tarball|" \
        "$tree/pc-bios/dtb/meson.build"
    # Our device selection. q35 brings AHCI/ide-hd (the xfstests tool disk).
    # VHOST_USER_TEST: vhost-user-test-device-pci (ours); VIRTIO_9P: -virtfs
    # (the `qemu` row); VHOST_USER_FS: vhost-user-fs-pci (the virtiofsd row);
    # PCIE_PORT: pcie-root-port (hot-adding a device). PXB, CXL and
    # CXL_MEM_DEVICE: 10.2.2 does not link q35 without them.
    cat >"$tree/configs/devices/x86_64-softmmu/vhost9p.mak" <<'MAK'
CONFIG_Q35=y
CONFIG_PCI_DEVICES=n
CONFIG_VIRTIO_PCI=y
CONFIG_VIRTIO_SERIAL=y
CONFIG_SERIAL_ISA=y
CONFIG_SERIAL_PCI=y
CONFIG_VHOST_USER_TEST=y
CONFIG_VIRTIO_9P=y
CONFIG_VHOST_USER_FS=y
CONFIG_PCIE_PORT=y
CONFIG_PXB=y
CONFIG_CXL=y
CONFIG_CXL_MEM_DEVICE=y
MAK
    log "committing the unpacked tree (git)"
    g init -q
    g add -A -f .
    g commit -q -m "qemu $version (Debian orig tarball) with build-only settings"
    g tag base
    mkdir -p "$build"
    cd "$build"
    log "configuring (log: $build/configure.log)"
    # The system python (not a pyenv shim) sees Debian's meson and pycotap.
    "$tree/configure" \
        --python=/usr/bin/python3 \
        --prefix="$work/prefix" \
        --target-list=x86_64-softmmu \
        --without-default-devices \
        --with-devices-x86_64=vhost9p \
        --without-default-features \
        --enable-tcg \
        --enable-vhost-user \
        --enable-vhost-kernel \
        --enable-virtfs \
        --enable-attr \
        --disable-download \
        --disable-docs \
        --disable-install-blobs \
        --disable-tools \
        --disable-werror \
        --disable-debug-info \
        >configure.log 2>&1 || { tail -40 configure.log >&2; exit 1; }
    echo "$KEY_STOCK" >"$work/.tree"
fi

compile() { # DEST KEY
    log "building $(basename "$1") with $JOBS jobs (log: $build/build.log)"
    local t0=$SECONDS
    (cd "$build" && nice -n 10 ninja -j "$JOBS" qemu-system-x86_64 >build.log 2>&1) \
        || { tail -60 "$build/build.log" >&2; exit 1; }
    log "$(basename "$1"): built in $((SECONDS - t0)) s"
    local bin=$1/bin/qemu-system-x86_64
    mkdir -p "$1/bin"
    install -m 0755 "$build/qemu-system-x86_64" "$bin.tmp"
    for dev in vhost-user-test-device-pci vhost-user-fs-pci virtio-9p-pci \
        pcie-root-port ide-hd; do
        "$bin.tmp" -device help 2>/dev/null | grep -q "\"$dev\"" \
            || { log "built QEMU lists no $dev"; exit 1; }
    done
    mv "$bin.tmp" "$bin"
    g log -1 --format=%H >"$1/.source-commit"
    echo "$version" >"$1/.version"
    echo "$2" >"$1/.built"
}

if ! built "$STOCK" "$KEY_STOCK"; then
    g checkout -q -f base 2>/dev/null || g checkout -q -f -B stock base
    g reset -q --hard base
    compile "$STOCK" "$KEY_STOCK"
fi

if [ "$stock_only" -eq 0 ] && ! built "$PATCHED" "$KEY_PATCHED"; then
    [ ${#series[@]} -gt 0 ] || { log "no patches in $PATCHES"; exit 1; }
    # The series must be clean under QEMU's own checkpatch.
    for p in "${series[@]}"; do
        (cd "$tree" && perl scripts/checkpatch.pl -q "$p" >&2) \
            || { log "checkpatch: $(basename "$p") is not clean"; exit 1; }
    done
    g checkout -q -f -B patched base
    g am -q "${series[@]}" >&2 \
        || { g am --abort 2>/dev/null || true; log "the series does not apply to $version"; exit 1; }
    compile "$PATCHED" "$KEY_PATCHED"
    # Leave the tree as the stock binary was built.
    g checkout -q -f base
fi
log "done"
report
exit 0
}
