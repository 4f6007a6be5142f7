#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# The embedding example: a VMM-side virtio-9p device with
# a virtio_queue::Queue on GuestMemoryAtomic<GuestMemoryMmap>, its own epoll
# thread and an interrupt callback, driven by virtqueue-large's MockDriver
# through real 9P requests against a PassthroughFs on a temp dir. It must
# exit 0 and print its "ok" line.
source "$(dirname "$0")/lib.sh"
rc=0
out=$(cargo run --locked -p virtio-9p-server --no-default-features --example embed_vmm) || rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "embed-vmm: exit $rc" >&2; exit 1; }
grep -q '^embed_vmm: ok: ' <<<"$out" || {
    echo "embed-vmm: no ok line" >&2
    exit 1
}
