#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# CI step: real Linux guests (TCG) mount 9p from QEMU's built-in server and
# from our virtio-9p-server, in socket mode (a, trans=unix through a
# virtio-serial relay) and in vhost-user mode (b, -device
# vhost-user-test-device-pci), and run the POSIX suite, pjdfstest and dd in
# each. Every row, QEMU built-in and virtiofsd included, boots the same stock
# QEMU >= 10.2 (ci/guest/build-qemu.sh). See ci/guest/README.md.
#
# Fails when one of our rows has a POSIX failure, a pjdfstest failure that
# QEMU built-in passes in the same run, or does not mount; also fails when the
# QEMU built-in row itself breaks (so the harness cannot rot unnoticed).
# Rows our daemon cannot run yet are reported as "not available" and skipped.
#
# Environment:
#   GUEST_CONFORMANCE_SERVERS  default qemu,ours-socket,ours-vhost,
#                              ours-vhost-mapped,ours-vhost-packed,virtiofsd
#                              (add diod for the second 9p peer; virtiofsd is
#                              a reference row, never gated)
#   GUEST_CONFORMANCE_KERNEL   default 6.12
#   GUEST_CONFORMANCE_MIB      default 256
#   GUEST_CONFORMANCE_SERVER_BIN  a prebuilt virtio-9p-server (default: build it)
#   GUEST_CONFORMANCE=skip     skip the step (exit 77)
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${GUEST_CONFORMANCE:-}" = skip ]; then
    echo "guest-conformance: skipped (GUEST_CONFORMANCE=skip)"
    exit 77
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "guest-conformance: skipped: needs root (apt, diod, chown in the share)"
    exit 77
fi

servers=${GUEST_CONFORMANCE_SERVERS:-qemu,ours-socket,ours-vhost,ours-vhost-mapped,ours-vhost-packed,virtiofsd}
case ",$servers," in *,qemu,*) ;; *) servers=qemu,$servers ;; esac
out=${GUEST_CONFORMANCE_OUT:-$(mktemp -d /tmp/guest-conformance.XXXXXX)}

# Each guest is bounded by run.sh's --timeout; the whole step by this one.
timeout --kill-after=30 4200 bash ci/guest/run.sh \
    --servers "$servers" \
    --kernel "${GUEST_CONFORMANCE_KERNEL:-6.12}" \
    --mib "${GUEST_CONFORMANCE_MIB:-256}" \
    --timeout 1200 \
    --out "$out" \
    ${GUEST_CONFORMANCE_SERVER_BIN:+--server-bin "$GUEST_CONFORMANCE_SERVER_BIN"} \
    --gate
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "guest-conformance: FAILED: the run exceeded its time limit"
    exit 1
fi
[ -f "$out/summary.tsv" ] || { echo "guest-conformance: FAILED: no summary (exit $rc)"; exit 1; }

qemu_status=$(awk -F'\t' '$1 == "qemu" { sub("status=", "", $2); print $2 }' "$out/summary.tsv")
qemu_posix=$(awk -F'\t' '$1 == "qemu" { sub("posix=", "", $3); print $3 }' "$out/summary.tsv")
if [ "$qemu_status" != ok ] || [[ "$qemu_posix" == *FAIL* ]]; then
    echo "guest-conformance: FAILED: the QEMU built-in reference row broke ($qemu_status, POSIX $qemu_posix): the harness needs fixing"
    rc=1
fi
# A row may be skipped only because the daemon lacks that mode; any other
# reason (the daemon failed to build, for example) fails the step.
while IFS=$'\t' read -r name status _; do
    case $name in ours-*) ;; *) continue ;; esac
    reason=${status#status=}
    case $reason in
        "not available: virtio-9p-server has no --"*)
            echo "guest-conformance: notice: row $name skipped: ${reason#not available: }" ;;
        "not available:"*)
            echo "guest-conformance: FAILED: row $name could not run: ${reason#not available: }"
            rc=1 ;;
    esac
done <"$out/summary.tsv"
exit $rc
