#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# CI step: the large-msize row. The 6.12 guest runs with our patched
# 9pnet_virtio.ko (ci/guest/linux-9p, built and cached by
# ci/guest/build-9p-module.sh) and mounts our vhost-user daemon at msize
# 512000 and 128 MiB: the POSIX suite (with the checksummed file) and a
# dd write and read at each, on the split ring. See ci/guest/README.md
# ("Large msize").
#
# Fails on a POSIX failure, a failed mount or transfer, a mount that did
# not get the msize it asked for, or a written file the host reads back
# differently.
#
# Environment:
#   GUEST_LARGE_MSIZE_MIB      dd size (default 128)
#   GUEST_LARGE_MSIZE_ROWS     default ours-vhost
#   GUEST_CONFORMANCE_SERVER_BIN  a prebuilt virtio-9p-server (default: build it)
#   GUEST_LARGE_MSIZE=skip     skip the step (exit 77)
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${GUEST_LARGE_MSIZE:-}" = skip ]; then
    echo "guest-large-msize: skipped (GUEST_LARGE_MSIZE=skip)"
    exit 77
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "guest-large-msize: skipped: needs root (apt, the share's owners)"
    exit 77
fi
timeout --kill-after=30 900 bash ci/guest/large-msize.sh \
    --rows "${GUEST_LARGE_MSIZE_ROWS:-ours-vhost}" \
    --msizes 512000,134217728 \
    --tests posix,dd \
    --mib "${GUEST_LARGE_MSIZE_MIB:-128}" \
    --timeout 600 \
    ${GUEST_CONFORMANCE_SERVER_BIN:+--server-bin "$GUEST_CONFORMANCE_SERVER_BIN"} \
    --gate
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "guest-large-msize: FAILED: the run exceeded its time limit"
    exit 1
fi
exit $rc
