#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# CI step: xfstests in a real Linux guest (TCG) on QEMU's built-in 9p and on
# our vhost-user daemon, both on the same stock QEMU >= 10.2
# (ci/guest/build-qemu.sh), the subset in ci/guest/xfstests-ci.list (rename,
# link, xattr, truncate, mmap, O_DIRECT, fsync, large and sparse files,
# readdir while the directory changes, open-unlink). The whole quick group
# on every row is `ci/guest/suite.sh xfstests` (hours under TCG); see
# ci/guest/README.md.
#
# Fails when a test fails on one of our rows and passes on QEMU built-in in
# the same run, when one of our rows does not finish, or when the QEMU
# built-in row itself breaks.
#
# Environment:
#   GUEST_XFSTESTS_SERVERS  default qemu,ours-vhost,ours-vhost-mapped
#   GUEST_XFSTESTS_TESTS    default ci (see suite.sh --tests)
#   GUEST_CONFORMANCE_SERVER_BIN  a prebuilt virtio-9p-server (default: build it)
#   GUEST_XFSTESTS=skip     skip the step (exit 77)
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${GUEST_XFSTESTS:-}" = skip ] || [ "${GUEST_CONFORMANCE:-}" = skip ]; then
    echo "guest-xfstests: skipped (GUEST_XFSTESTS=skip)"
    exit 77
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "guest-xfstests: skipped: needs root (apt, tool disk, QEMU)"
    exit 77
fi

servers=${GUEST_XFSTESTS_SERVERS:-qemu,ours-vhost,ours-vhost-mapped}
case ",$servers," in *,qemu,*) ;; *) servers=qemu,$servers ;; esac
out=${GUEST_XFSTESTS_OUT:-$(mktemp -d /tmp/guest-xfstests.XXXXXX)}

timeout --kill-after=30 2700 bash ci/guest/suite.sh xfstests \
    --servers "$servers" \
    --tests "${GUEST_XFSTESTS_TESTS:-ci}" \
    --timeout 1200 \
    --test-timeout 240 \
    --out "$out" \
    ${GUEST_CONFORMANCE_SERVER_BIN:+--server-bin "$GUEST_CONFORMANCE_SERVER_BIN"} \
    --gate
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "guest-xfstests: FAILED: the run exceeded its time limit"
    exit 1
fi
[ -f "$out/summary.tsv" ] || { echo "guest-xfstests: FAILED: no summary (exit $rc)"; exit 1; }
qemu=$(awk -F'\t' '$1 == "qemu"' "$out/summary.tsv")
case $qemu in
    *status=ok*) ;;
    *) echo "guest-xfstests: FAILED: the QEMU built-in reference row broke ($qemu)"; rc=1 ;;
esac
case $qemu in
    *$'\t'ran=0$'\t'*) echo "guest-xfstests: FAILED: the QEMU built-in row ran no test"; rc=1 ;;
esac
exit $rc
