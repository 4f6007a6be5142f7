#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# CI step: live migration of a Linux guest (TCG) with a mounted share,
# between two QEMU + server pairs on this machine, the destination
# exporting the same tree through a bind mount (ci/guest/migrate.sh; see
# ci/guest/README.md, "Live migration"). The guest keeps checksummed I/O
# going on files it keeps open, holds a POSIX lock and a shared writable
# mmap; the host runs QMP `migrate` in the middle of it.
# Rows: our daemon on the split and the packed ring (patched QEMU:
# ci/guest/qemu-patches/0007 makes vhost-user-test-device-pci migratable,
# with migratable=on), gated; virtiofsd on stock QEMU's vhost-user-fs-pci,
# the reference, reported and never gated.
#
# Fails when one of our rows fails (the migration fails, the guest sees an
# error or a checksum mismatch, the lock is lost, the mapped bytes differ).
#
# Environment:
#   GUEST_MIGRATION_ROWS        default ours-vhost,ours-vhost-packed,virtiofsd
#   GUEST_MIGRATION_SERVER_BIN  a prebuilt virtio-9p-server (default: build it)
#   GUEST_MIGRATION_OUT         where the logs go (default: a temp dir)
#   GUEST_MIGRATION=skip        skip the step (exit 77)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

if [ "${GUEST_MIGRATION:-}" = skip ]; then
    echo "guest-migration: skipped (GUEST_MIGRATION=skip)"
    exit 77
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "guest-migration: skipped: needs root (apt, bind mounts, QEMU)"
    exit 77
fi

out=${GUEST_MIGRATION_OUT:-$(mktemp -d /tmp/guest-migration.XXXXXX)}
# Each row is bounded by migrate.sh's --timeout; the whole step by this.
timeout --kill-after=30 1200 bash ci/guest/migrate.sh \
    --rows "${GUEST_MIGRATION_ROWS:-ours-vhost,ours-vhost-packed,virtiofsd}" \
    --timeout 300 \
    --out "$out" \
    ${GUEST_MIGRATION_SERVER_BIN:+--server-bin "$GUEST_MIGRATION_SERVER_BIN"} \
    --gate
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "guest-migration: FAILED: the run exceeded its time limit (logs: $out)"
    exit 1
fi
[ -f "$out/summary.tsv" ] || { echo "guest-migration: FAILED: no summary (exit $rc)"; exit 1; }

rc=0
# summary.tsv: row, ok|FAIL|n/a, downtime ms, total ms, the full result.
while IFS=$'\t' read -r name short down total full; do
    case $name in
    ours-*)
        if [ "$short" != ok ]; then
            echo "guest-migration: FAILED: $name: $full"
            rc=1
        else
            echo "guest-migration: $name: ok (downtime $down ms, total $total ms)"
        fi
        ;;
    *)
        echo "guest-migration: notice: $name (reference, not gated): $short${down:+, downtime $down ms, total $total ms}"
        ;;
    esac
done <"$out/summary.tsv"
exit $rc
