#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# The panic = "abort" embedding check: a VMM-side virtio-9p device
# built with aborting panics (profile embed-abort) floods Tflush at blocked
# Tlocks and reads in flight, resets with 1024 requests in flight and
# disconnects, for many rounds. An unwound coroutine would abort it; it must
# exit 0 and print its "ok" line.
source "$(dirname "$0")/lib.sh"
rc=0
out=$(cargo run --locked --profile embed-abort -p virtio-9p-server --features test-utils \
    --example embed_abort) || rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "embed-abort: exit $rc" >&2; exit 1; }
grep -q '^embed_abort: ok: .*panic = abort$' <<<"$out" || {
    echo "embed-abort: no ok line from a panic = abort build" >&2
    exit 1
}
