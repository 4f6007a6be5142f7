#!/bin/sh
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Runs inside the guest as /ci/run (busybox sh) for ci/guest/migrate.sh.
# Kernel command line (init passes unknown key=value words on as the
# environment):
#   CI_MODE   9p (trans=virtio) or virtiofs
#   CI_SRC    mount tag
#   CI_AFTER  seconds of I/O on the destination before the checks
# It mounts the share, prints the mount and the negotiated virtio
# features, and runs /ci/bin/migrate on $mnt/mg (see ci/guest/src/migrate.c
# for its lines). The host migrates the guest meanwhile and then creates
# $mnt/mg/migrated. Lines: CI-MOUNT <proc/mounts line>,
# CI-VIRTIO <dev> id=<device> features=<bits>, the tool's MG-* lines,
# MG-DMESG <kernel line>, MG-EXIT rc=N, MG-END.
mnt=/mnt
echo "MG-STAGE boot"
case $CI_MODE in
virtiofs) timeout 60 mount -t virtiofs "$CI_SRC" "$mnt" ;;
*) timeout 60 mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=mmap,access=client "$CI_SRC" "$mnt" ;;
esac
line=$(grep -E " $mnt (9p|virtiofs) " /proc/mounts)
if [ -z "$line" ]; then
    echo "MG-MOUNT FAIL no 9p or virtiofs at $mnt"
else
    echo "CI-MOUNT $line"
    for d in /sys/bus/virtio/devices/*; do
        id=$(cat "$d/device" 2>/dev/null)
        case $id in 0x0009|0x001a) echo "CI-VIRTIO $(basename "$d") id=$id features=$(cat "$d/features")" ;; esac
    done
    mkdir -p "$mnt/mg"
    /ci/bin/migrate "$mnt/mg" "$mnt/mg/migrated" "${CI_AFTER:-5}"
    echo "MG-EXIT rc=$?"
fi
dmesg | grep -iE '9p|virtio|fuse|warning|bug|oops|call trace|blocked for more|error' \
    | grep -vE 'CI-|MG-|Installing|pci=nocrs|Correctable Errors collector' | sed 's/^/MG-DMESG /'
echo "MG-END"
sync
poweroff -f
