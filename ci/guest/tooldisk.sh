#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Builds the tool disk of the xfstests and workload suites: an ext4 image
# (label ci-tool) the guest mounts and chroots into, since the busybox
# initramfs cannot run xfstests, git or fio. It holds:
#   - the host's /usr (hard-linked while staging, minus documentation,
#     toolchains and SDKs no test calls), so the host's bash, perl, git, fio,
#     xfs_io, attr/acl tools and their libraries run in the guest;
#   - a copy of the host's /etc with the users xfstests switches to
#     (fsgqa, fsgqa2, 123456-fsgqa);
#   - the guest kernel's module tree (modprobe works in the chroot);
#   - the xfstests build (build-xfstests.sh) at /opt/xfstests.
# The image is made with `mkfs.ext4 -d` (no loop device) and cached under
# $CACHE/tooldisk, keyed by this script, the kernel, the xfstests build and
# the host's package set. Guests attach it with snapshot=on, so it never
# changes. Prints TOOLDISK=<image> on the last line.
#
# Usage: tooldisk.sh [6.12|6.1]        (default 6.12)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
export VIRTIO_9P_CI_CACHE=$CACHE
series=${1:-6.12}
source "$here/lib.sh"

# Rows run as parallel invocations (one per row) build the disk once: the
# second waits here, then finds the image.
mkdir -p "$CACHE/tooldisk"
exec 9>"$CACHE/tooldisk/.lock"
flock 9

eval "$(bash "$here/fetch-kernel.sh" "$series")" # KERNEL=, INITRAMFS=
kver=$(basename "$KERNEL")
kver=${kver#vmlinuz-}
kroot=$CACHE/kernel/$kver/root
xfstests=$(bash "$here/build-xfstests.sh" | tail -1)

# Workload tools the suites call, and xfstests' own needs (gawk: its
# filters use asort and gensub, which mawk lacks).
need=()
for p in fio git xfsprogs attr acl bc psmisc e2fsprogs gawk; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    log "installing: ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o DPkg::Lock::Timeout=600 "${need[@]}" >/dev/null
fi

key=$( (cat "$0"; echo "$kver"; cat "$xfstests/../.built-v1" 2>/dev/null; echo "$xfstests";
    cat /var/lib/dpkg/status) | sha256sum | cut -c1-16)
dir=$CACHE/tooldisk
img=$dir/tool-$key.img
if [ -f "$img" ]; then
    echo "TOOLDISK=$img"
    exit 0
fi
mkdir -p "$dir"
rm -f "$dir"/tool-*.img # older keys
stage=$(mktemp -d "$dir/stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT

log "staging /usr, /etc, modules $kver and xfstests"
# Hard links cost nothing on the same filesystem; a copy otherwise.
cp -al /usr "$stage/usr" 2>/dev/null || { rm -rf "$stage/usr"; cp -a /usr "$stage/usr"; }
for d in share/doc share/man share/info share/locale share/icons share/help \
    include local lib/jvm lib/google-cloud-sdk lib/debug lib/node_modules \
    lib/postgresql lib/gcc lib/modules; do
    rm -rf "${stage:?}/usr/$d"
done
rm -rf "$stage"/usr/lib/llvm-*
for l in bin lib lib64 sbin; do
    [ -L "/$l" ] && ln -s "$(readlink "/$l")" "$stage/$l"
done
cp -a /etc "$stage/etc"
rm -f "$stage/etc/mtab"
ln -s ../proc/self/mounts "$stage/etc/mtab"
# xfstests' users (common/rc _require_user, _require_group,
# _require_user 123456-fsgqa for the numeric-name cases).
add_user() { # name uid
    grep -q "^$1:" "$stage/etc/passwd" && return 0
    echo "$1:x:$2:$2:$1:/home/$1:/bin/bash" >>"$stage/etc/passwd"
    echo "$1:x:$2:" >>"$stage/etc/group"
    echo "$1:*:19000:0:99999:7:::" >>"$stage/etc/shadow"
    mkdir -p "$stage/home/$1"
    chown "$2:$2" "$stage/home/$1"
}
add_user fsgqa 2001
add_user fsgqa2 2002
add_user 123456-fsgqa 2003
echo "ci-guest" >"$stage/etc/hostname"
mkdir -p "$stage/usr/lib/modules"
cp -a "$kroot/lib/modules/$kver" "$stage/usr/lib/modules/$kver"
mkdir -p "$stage/opt"
cp -a "$xfstests" "$stage/opt/xfstests"
mkdir -p "$stage"/{proc,sys,dev,tmp,run,root,results,ci,mnt/test,mnt/scratch,mnt/work,var/tmp,var/lib,var/log,var/cache}
chmod 1777 "$stage/tmp" "$stage/var/tmp"

mib=$(( $(du -sm "$stage" | cut -f1) * 5 / 4 + 512 ))
log "mkfs.ext4 -d ($mib MiB)"
mkfs.ext4 -q -F -L ci-tool -E lazy_itable_init=1 -d "$stage" "$img.tmp" "${mib}M" >&2
mv "$img.tmp" "$img"
echo "TOOLDISK=$img"
