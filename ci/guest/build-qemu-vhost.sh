#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Rebuilds QEMU from Debian's own source (the bookworm-backports package)
# with vhost-user-device and vhost-user-device-pci made user-creatable, so a
# generic vhost-user backend (our virtio-9p-server in vhost-user mode) can be
# plugged with `-device vhost-user-device-pci,virtio-id=9,...`.
#
# Minimal configuration: x86_64-softmmu, TCG, q35, virtio-pci, virtio-serial,
# ISA serial, vhost-user. The binary is cached under $CACHE/qemu-vhost; a
# second run returns at once. Prints the binary's path on the last line.
#
# Environment: VIRTIO_9P_CI_CACHE (default /var/cache/virtio-9p-ci),
#              JOBS (default: nproc).
set -euo pipefail

CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
PREFIX=$CACHE/qemu-vhost
BIN=$PREFIX/bin/qemu-system-x86_64
STAMP=$PREFIX/.built-v1
JOBS=${JOBS:-$(nproc)}

if [ -x "$BIN" ] && [ -f "$STAMP" ]; then
    echo "$BIN"
    exit 0
fi

log() { echo "build-qemu-vhost: $*" >&2; }

# Build dependencies (meson >= 1.5 comes from bookworm-backports).
need=()
dpkg -s ninja-build >/dev/null 2>&1 || need+=(ninja-build)
dpkg -s libglib2.0-dev >/dev/null 2>&1 || need+=(libglib2.0-dev)
dpkg -s flex >/dev/null 2>&1 || need+=(flex)
dpkg -s bison >/dev/null 2>&1 || need+=(bison)
dpkg -s python3-venv >/dev/null 2>&1 || need+=(python3-venv)
dpkg -s gcc >/dev/null 2>&1 || need+=(gcc)
dpkg -s xz-utils >/dev/null 2>&1 || need+=(xz-utils)
dpkg -s python3-pycotap >/dev/null 2>&1 || need+=(python3-pycotap)
if [ ${#need[@]} -gt 0 ]; then
    log "installing build deps: ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -t bookworm-backports "${need[@]}" >/dev/null
fi
meson_ok() {
    command -v meson >/dev/null || return 1
    local v
    v=$(meson --version)
    [ "$(printf '%s\n1.5.0\n' "$v" | sort -V | head -1)" = 1.5.0 ]
}
if ! meson_ok; then
    [ -f /etc/apt/sources.list.d/bookworm-backports.sources ] \
        || bash "$(dirname "$0")/install-qemu.sh" >&2
    log "installing meson from bookworm-backports"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -t bookworm-backports meson >/dev/null
fi

# Source: the orig tarball of the backports QEMU (the .dsc may 404 on the
# mirror, the orig tarball does not).
src_dir=$CACHE/src
mkdir -p "$src_dir"
cd "$src_dir"
tarball=$(ls qemu_*.orig.tar.xz 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$tarball" ]; then
    log "downloading QEMU source"
    apt-get source --download-only qemu >&2 || true
    tarball=$(ls qemu_*.orig.tar.xz 2>/dev/null | sort -V | tail -1 || true)
    [ -n "$tarball" ] || { log "no qemu orig tarball could be downloaded"; exit 1; }
fi
version=${tarball#qemu_}
version=${version%+ds.orig.tar.xz}
version=${version%.orig.tar.xz}
tree=$src_dir/qemu-$version
if [ ! -f "$tree/.patched-v2" ]; then
    rm -rf "$tree"
    log "unpacking $tarball"
    tar xf "$tarball"
    for f in hw/virtio/vhost-user-device.c hw/virtio/vhost-user-device-pci.c; do
        grep -q 'dc->user_creatable = false;' "$tree/$f" \
            || { log "$f: no 'user_creatable = false' line to patch"; exit 1; }
        sed -i 's/dc->user_creatable = false;/dc->user_creatable = true;/' "$tree/$f"
    done
    # Debian's +ds tarball carries no firmware blobs; the host's packaged
    # firmware (-L /usr/share/qemu -L /usr/share/seabios) is used instead.
    sed -i 's/unpack_edk2_blobs = bzip2.found()/unpack_edk2_blobs = false/' "$tree/meson.build"
    # Our own device selection: q35 plus what vhost-user-device needs.
    cat >"$tree/configs/devices/x86_64-softmmu/vhost9p.mak" <<'MAK'
CONFIG_Q35=y
CONFIG_PCI_DEVICES=n
CONFIG_VIRTIO_PCI=y
CONFIG_VIRTIO_SERIAL=y
CONFIG_SERIAL_ISA=y
CONFIG_SERIAL_PCI=y
MAK
    touch "$tree/.patched-v2"
fi

build=$tree/build-vhost9p
rm -rf "$build"
mkdir -p "$build"
cd "$build"
log "configuring (log: $build/configure.log)"
# The system python (not a pyenv shim) sees Debian's meson and pycotap.
../configure \
    --python=/usr/bin/python3 \
    --prefix="$PREFIX" \
    --target-list=x86_64-softmmu \
    --without-default-devices \
    --with-devices-x86_64=vhost9p \
    --without-default-features \
    --enable-tcg \
    --enable-vhost-user \
    --enable-vhost-kernel \
    --disable-download \
    --disable-docs \
    --disable-install-blobs \
    --disable-tools \
    --disable-werror \
    --disable-debug-info \
    >configure.log 2>&1 || { tail -40 configure.log >&2; exit 1; }
log "building with $JOBS jobs (log: $build/build.log)"
ninja -j "$JOBS" qemu-system-x86_64 >build.log 2>&1 || { tail -60 build.log >&2; exit 1; }
mkdir -p "$PREFIX/bin"
install -m 0755 qemu-system-x86_64 "$BIN"
"$BIN" -device help 2>/dev/null | grep -q '"vhost-user-device-pci"' \
    || { log "built QEMU lists no vhost-user-device-pci"; exit 1; }
touch "$STAMP"
log "done"
echo "$BIN"
