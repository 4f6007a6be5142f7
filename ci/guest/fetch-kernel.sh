#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Downloads a Debian kernel (with the 9p modules) and busybox-static with
# `apt-get download`, unpacks them with `dpkg-deb -x` (no install hooks), and
# builds a base initramfs: busybox, the 9p/virtio/virtio-fs and AHCI/ext4
# modules in load order, and
# ci/guest/init. Everything is cached under $CACHE; a second run is instant.
#
# Usage: fetch-kernel.sh [6.12|6.1]      (default 6.12)
# Prints two lines: KERNEL=<path to vmlinuz> and INITRAMFS=<path to cpio.gz>.
#
# Environment: VIRTIO_9P_CI_CACHE (default /var/cache/virtio-9p-ci).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=ci/guest/lib.sh
. "$here/lib.sh"
CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
series=${1:-6.12}

debs=$CACHE/debs
mkdir -p "$debs"

# Newest available package of the series. 6.12 comes from bookworm-backports
# (enabled by install-qemu.sh), 6.1 from bookworm itself.
pick_package() {
    case $series in
        6.12)
            [ -f /etc/apt/sources.list.d/bookworm-backports.sources ] \
                || bash "$here/install-qemu.sh" >&2
            apt-cache depends linux-image-6.12-amd64 2>/dev/null \
                | sed -n 's/^ *Depends: \(linux-image-6\.12\.[0-9]*+deb12-amd64\)$/\1/p' | head -1
            ;;
        6.1)
            apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' 2>/dev/null \
                | awk '{print $1}' | sort -V | tail -1
            ;;
        *) log "unknown kernel series '$series' (use 6.12 or 6.1)"; exit 2 ;;
    esac
}

# The cache remembers which package a series resolved to, so later runs work
# offline and do not move to a new kernel behind the user's back.
pin=$CACHE/kernel-$series.package
if [ -s "$pin" ]; then
    pkg=$(cat "$pin")
else
    pkg=$(pick_package)
    [ -n "$pkg" ] || { log "no linux-image package found for $series (apt-get update?)"; exit 1; }
    echo "$pkg" >"$pin"
fi
kver=${pkg#linux-image-}
kdir=$CACHE/kernel/$kver
initramfs=$CACHE/initramfs-$kver.cpio.gz
# The guest's modules: 9p over virtio and fd, virtio-fs (fuse, virtiofs) for
# the virtiofsd row, and AHCI disks with ext4 for the tool disk of the
# xfstests and workload suites (ci/guest/tooldisk.sh).
modules="netfs 9pnet 9pnet_virtio 9pnet_fd 9p virtio_pci virtio_console fuse virtiofs libahci ahci sd_mod crc32c_generic ext4"
init_sum=$( (cat "$here/init"; echo "$modules") | sha256sum | cut -c1-16)

download() { # package -> path of the .deb in $debs
    local p=$1 f
    f=$(ls "$debs/${p}"_*.deb 2>/dev/null | head -1 || true)
    if [ -z "$f" ]; then
        log "downloading $p"
        (cd "$debs" && apt-get download "$p" >&2)
        f=$(ls "$debs/${p}"_*.deb | head -1)
    fi
    echo "$f"
}

if ! command -v depmod >/dev/null && [ ! -x /usr/sbin/depmod ] && [ ! -x /sbin/depmod ]; then
    log "installing kmod (depmod)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kmod >/dev/null
fi
export PATH=$PATH:/usr/sbin:/sbin
if [ ! -f "$kdir/.unpacked" ]; then
    rm -rf "$kdir"
    mkdir -p "$kdir"
    dpkg-deb -x "$(download "$pkg")" "$kdir/root"
    # The package ships no modules.dep (its postinst runs depmod); make it.
    depmod -b "$kdir/root" "$kver"
    touch "$kdir/.unpacked"
fi
bbdir=$CACHE/busybox
if [ ! -x "$bbdir/bin/busybox" ]; then
    rm -rf "$bbdir"
    dpkg-deb -x "$(download busybox-static)" "$bbdir"
fi

vmlinuz=$kdir/root/boot/vmlinuz-$kver
[ -f "$vmlinuz" ] || { log "$vmlinuz missing from $pkg"; exit 1; }

if [ ! -f "$initramfs" ] || [ "$(cat "$initramfs.init-sum" 2>/dev/null)" != "$init_sum" ]; then
    moddir=$kdir/root/lib/modules/$kver
    [ -f "$moddir/modules.dep" ] || { log "no modules.dep in $moddir"; exit 1; }
    stage=$(mktemp -d "$CACHE/initramfs-stage.XXXXXX")
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage"/{bin,sbin,dev,proc,sys,mnt,tmp,run,etc,lib/modules,ci}
    cp "$bbdir/bin/busybox" "$stage/bin/busybox"
    ln -s busybox "$stage/bin/sh"
    install -m 0755 "$here/init" "$stage/init"

    # Resolve each wanted module and its dependencies (deps first) from
    # modules.dep; a module absent from modules.dep but listed in
    # modules.builtin is compiled in, one absent from both is optional
    # (9pnet_fd only exists as a module from Linux 6.2 on).
    declare -A seen=()
    order=()
    add_module() { # relative path from modules.dep
        local rel=$1 line dep
        [ -n "${seen[$rel]:-}" ] && return 0
        seen[$rel]=1
        line=$(grep -m1 "^${rel}:" "$moddir/modules.dep" || true)
        for dep in ${line#*:}; do add_module "$dep"; done
        order+=("$rel")
    }
    for m in $modules; do
        rel=$(grep -E -m1 "/${m}\.ko(\.xz|\.zst|\.gz)?:" "$moddir/modules.dep" | cut -d: -f1 || true)
        if [ -n "$rel" ]; then
            add_module "$rel"
        elif grep -qE "/${m}\.ko$" "$moddir/modules.builtin" 2>/dev/null; then
            log "$m is built into $kver"
        else
            log "$m: neither module nor built-in in $kver (skipped)"
        fi
    done
    : >"$stage/etc/modules.order"
    for rel in "${order[@]}"; do
        base=$(basename "$rel")
        case $base in
            *.xz) xz -dc "$moddir/$rel" >"$stage/lib/modules/${base%.xz}"; base=${base%.xz} ;;
            *.zst) zstd -qdc "$moddir/$rel" >"$stage/lib/modules/${base%.zst}"; base=${base%.zst} ;;
            *.gz) gzip -dc "$moddir/$rel" >"$stage/lib/modules/${base%.gz}"; base=${base%.gz} ;;
            *) cp "$moddir/$rel" "$stage/lib/modules/$base" ;;
        esac
        echo "$base" >>"$stage/etc/modules.order"
    done
    log "modules for $kver: $(tr '\n' ' ' <"$stage/etc/modules.order")"
    (cd "$stage" && find . -print0 | cpio --null -o -H newc --quiet | gzip -6) >"$initramfs.tmp"
    mv "$initramfs.tmp" "$initramfs"
    echo "$init_sum" >"$initramfs.init-sum"
fi

echo "KERNEL=$vmlinuz"
echo "INITRAMFS=$initramfs"
