#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# The embedding example: the virtio-9p Device adapter as a VMM holds it
# (features, activation with GuestMemoryAtomic<GuestMemoryMmap>, the queue
# and an interrupt callback, kicks), driven by virtqueue-large's split and
# packed driver mocks through real 9P requests against a PassthroughFs on
# a temp dir. It must exit 0 and print its "ok" line.
source "$(dirname "$0")/lib.sh"
rc=0
out=$(cargo run --locked -p virtio-9p-server --no-default-features --features test-utils --example embed_vmm) || rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "embed-vmm: exit $rc" >&2; exit 1; }
grep -q '^embed_vmm: ok: ' <<<"$out" || {
    echo "embed-vmm: no ok line" >&2
    exit 1
}
