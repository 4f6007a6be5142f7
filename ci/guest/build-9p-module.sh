#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Builds the guest's 9pnet_virtio.ko and 9p.ko with our large-msize patches
# (ci/guest/linux-9p/series) as out-of-tree modules for the 6.12 guest
# kernel that fetch-kernel.sh pinned. Its source is Debian's linux-source
# package of that exact version and its build tree Debian's linux-headers
# and linux-kbuild packages, all fetched with `apt-get download` and
# unpacked with `dpkg-deb -x` (nothing is installed, no kernel source is
# kept in the repo). The module is cached under $CACHE/kmod, keyed by the
# kernel version and the patches; a second run is instant. The unpacked
# net/9p source (with the kernel's scripts/checkpatch.pl, to check the
# series: `$CACHE/kmod/src-<version>/scripts/checkpatch.pl --no-tree
# --strict --ignore UNKNOWN_COMMIT_ID "$PWD"/ci/guest/linux-9p/000[1-9]*.patch`;
# give it absolute paths: inside a git work tree it reads a relative
# path as a source file and flags the patch's own blank context lines)
# stays in $CACHE/kmod.
#
# Usage: build-9p-module.sh [6.12]
# Prints one line: KMOD=<dir holding 9pnet_virtio.ko and 9p.ko>.
# Environment: VIRTIO_9P_CI_CACHE (default /var/cache/virtio-9p-ci).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=ci/guest/lib.sh
. "$here/lib.sh"
CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
series=${1:-6.12}

# The guest kernel: whatever fetch-kernel.sh boots.
bash "$here/fetch-kernel.sh" "$series" >/dev/null
pkg=$(cat "$CACHE/kernel-$series.package")
kver=${pkg#linux-image-}                     # 6.12.118+deb12-amd64
base=${kver%-amd64}                          # 6.12.118+deb12
deb=$(ls "$CACHE/debs/${pkg}"_*.deb | head -1)
debver=$(dpkg-deb -f "$deb" Version)         # 6.12.118-1~deb12u1
upstream=${kver%%+*}                          # 6.12.118
srcpkg=linux-source-${upstream%.*}           # linux-source-6.12

patches=$(sed 's/#.*//; /^[[:space:]]*$/d' "$here/linux-9p/series")
sum=$( (echo "$kver $debver"; for p in $patches; do cat "$here/linux-9p/$p"; done) \
    | sha256sum | cut -c1-16)
out=$CACHE/kmod/$kver-$sum
if [ -f "$out/9p.ko" ]; then
    echo "KMOD=$out"
    exit 0
fi

# Compiler and kbuild's own needs (gcc-12 is what Debian built 6.12 with).
need=()
for p in gcc-12 make libelf1 libssl3 pahole xz-utils; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$CACHE/kmod"
exec 9>"$CACHE/kmod/.lock"
flock 9
[ -f "$out/9p.ko" ] && { echo "KMOD=$out"; exit 0; }

debs=$CACHE/kmod/debs-$kver
mkdir -p "$debs"
for p in "linux-headers-$kver" "linux-headers-$base-common" "linux-kbuild-$base" "$srcpkg"; do
    if ! ls "$debs/${p}_${debver}"_*.deb >/dev/null 2>&1; then
        log "downloading $p=$debver"
        (cd "$debs" && apt-get download -q "$p=$debver" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2)
    fi
done

work=$(mktemp -d "$CACHE/kmod/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
for p in "linux-headers-$kver" "linux-headers-$base-common" "linux-kbuild-$base"; do
    dpkg-deb -x "$(ls "$debs/${p}_${debver}"_*.deb)" "$root"
done
hdr=$root/usr/src/linux-headers-$kver
# The arch tree includes the common one by absolute path.
sed -i "s|^include /usr/src/|include $root/usr/src/|" "$hdr/Makefile"

# net/9p of the very same version, from the source tarball (unpacked
# once per version: decompressing the whole tarball takes a minute or two).
pristine=$CACHE/kmod/src-$debver
if [ ! -f "$pristine/.unpacked" ] || [ ! -d "$pristine/fs/9p" ]; then
    rm -rf "$pristine"
    mkdir -p "$pristine"
    dpkg-deb --fsys-tarfile "$(ls "$debs/${srcpkg}_${debver}"_*.deb)" \
        | tar -x -C "$work" "./usr/src/$srcpkg.tar.xz"
    tar -xJf "$work/usr/src/$srcpkg.tar.xz" -C "$pristine" --strip-components=1 \
        "$srcpkg/net/9p" "$srcpkg/include/net/9p" "$srcpkg/fs/9p" "$srcpkg/scripts/checkpatch.pl" \
        "$srcpkg/scripts/spelling.txt" "$srcpkg/scripts/const_structs.checkpatch"
    rm -f "$work/usr/src/$srcpkg.tar.xz"
    touch "$pristine/.unpacked"
fi
src=$work/src
mkdir -p "$src"
cp -r "$pristine/net" "$pristine/include" "$pristine/fs" "$src/"
# The series must stay ready for the kernel's list: clean under the
# kernel's own checkpatch.pl of this version. Outside a kernel git tree
# checkpatch cannot look up the commit a Fixes: tag names and calls every
# id unknown, so that one check is left to a kernel tree (the ids were
# checked against Linux's history when the tags were written).
for p in $patches; do
    if ! perl "$pristine/scripts/checkpatch.pl" --no-tree --strict --quiet \
        --ignore UNKNOWN_COMMIT_ID \
        "$here/linux-9p/$p" >"$work/checkpatch.txt" 2>&1; then
        log "checkpatch.pl: $p is not clean:"
        cat "$work/checkpatch.txt" >&2
        exit 1
    fi
done
for p in $patches; do
    log "applying $p"
    patch -d "$src" -p1 --quiet --forward <"$here/linux-9p/$p"
done

mod=$work/mod
mkdir -p "$mod"
cp "$src/net/9p/trans_virtio.c" "$src/net/9p/trans_common.h" "$mod/"
printf 'obj-m := 9pnet_virtio.o\n9pnet_virtio-y := trans_virtio.o\n' >"$mod/Kbuild"
log "building 9pnet_virtio.ko for $kver"
make -s -C "$hdr" M="$mod" modules >&2
# fs/9p as it is in the tree (its Makefile, the kernel's CONFIG_9P_*).
fsmod=$work/fsmod
cp -r "$src/fs/9p" "$fsmod"
log "building 9p.ko for $kver"
make -s -C "$hdr" M="$fsmod" CONFIG_9P_FS=m modules >&2
for ko in "$mod/9pnet_virtio.ko" "$fsmod/9p.ko"; do
    vermagic=$(modinfo -F vermagic "$ko" 2>/dev/null || true)
    case $vermagic in
        "$kver "*) ;;
        *) log "$(basename "$ko"): vermagic '$vermagic' does not match $kver"; exit 1 ;;
    esac
done
mkdir -p "$out.tmp"
cp "$mod/9pnet_virtio.ko" "$fsmod/9p.ko" "$out.tmp/"
rm -rf "$out"
mv "$out.tmp" "$out"
echo "KMOD=$out"
