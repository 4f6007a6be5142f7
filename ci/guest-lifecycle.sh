#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# CI step: what a VMM does around the 9p device, with a real Linux guest
# (TCG) and QMP: (a) stop/cont cycles under checksummed I/O with a guest
# process waiting for a lock the host holds, (b) 9pnet_virtio unbind/rebind,
# (c) system_reset under I/O. Rows: QEMU's built-in 9p (reference) and our
# daemon in vhost-user mode on the split ring, the packed ring and with
# mapped-xattr. See ci/guest/README.md ("Lifecycle scenarios").
# Then (d), a restart: three SIGKILLs of our daemon at random moments under a
# running guest, each followed by a new daemon on the same socket and
# --state-dir (ci/guest/restart.sh --state --strict), on the split and the
# packed ring: the guest's mount, a file it keeps open and a lock it holds
# must survive with no error, its checksums must match. About 30 s a ring.
# (d) is the only scenario on the patched QEMU (ci/guest/build-qemu.sh:
# stock plus ci/guest/qemu-patches), since stock QEMU cannot reconnect a
# vhost-user-test-device; (a)-(c) run on stock QEMU >= 10.2.
#
# Fails when one of our rows fails a scenario (a hang, a checksum mismatch,
# an error in the guest, a lock granted while the host held it), and when
# the QEMU built-in row fails one (then the harness is broken). Rows our
# daemon cannot run yet are skipped with a notice.
#
# Environment:
#   GUEST_LIFECYCLE_SERVERS     default qemu,ours-vhost,ours-vhost-packed,
#                               ours-vhost-mapped
#   GUEST_LIFECYCLE_SCENARIOS   default pause,rebind,reset
#   GUEST_LIFECYCLE_KERNEL      default 6.12
#   GUEST_LIFECYCLE_SERVER_BIN  a prebuilt virtio-9p-server (default: build it)
#   GUEST_LIFECYCLE_OUT         where the logs go (default: a temp dir)
#   GUEST_LIFECYCLE=skip        skip the step (exit 77)
#   GUEST_RESTART=skip          skip (d)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

if [ "${GUEST_LIFECYCLE:-}" = skip ]; then
    echo "guest-lifecycle: skipped (GUEST_LIFECYCLE=skip)"
    exit 77
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "guest-lifecycle: skipped: needs root (apt, tmpfs mounts, QEMU)"
    exit 77
fi

servers=${GUEST_LIFECYCLE_SERVERS:-qemu,ours-vhost,ours-vhost-packed,ours-vhost-mapped}
case ",$servers," in *,qemu,*) ;; *) servers=qemu,$servers ;; esac
out=${GUEST_LIFECYCLE_OUT:-$(mktemp -d /tmp/guest-lifecycle.XXXXXX)}

# Each guest is bounded by lifecycle.sh's --timeout; the whole step by this.
timeout --kill-after=30 1800 bash ci/guest/lifecycle.sh \
    --servers "$servers" \
    --scenarios "${GUEST_LIFECYCLE_SCENARIOS:-pause,rebind,reset}" \
    --kernel "${GUEST_LIFECYCLE_KERNEL:-6.12}" \
    --timeout 300 \
    --out "$out" \
    ${GUEST_LIFECYCLE_SERVER_BIN:+--server-bin "$GUEST_LIFECYCLE_SERVER_BIN"} \
    --gate
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "guest-lifecycle: FAILED: the run exceeded its time limit (logs: $out)"
    exit 1
fi
[ -f "$out/summary.tsv" ] || { echo "guest-lifecycle: FAILED: no summary (exit $rc)"; exit 1; }

rc=0
# summary.tsv: row, scenario, ok|FAIL|n/a, the full result.
while IFS=$'\t' read -r name scenario short full; do
    case $name in
        ours-*)
            if [ "$short" = FAIL ]; then
                echo "guest-lifecycle: FAILED: $name/$scenario: $full"
                rc=1
            fi ;;
    esac
    if [ "$name" = qemu ] && [ "$short" != ok ]; then
        echo "guest-lifecycle: FAILED: the QEMU built-in reference row failed $scenario ($full): the harness needs fixing"
        rc=1
    fi
    case $full in
        "not available: virtio-9p-server has no --"*)
            echo "guest-lifecycle: notice: $name/$scenario skipped: ${full#not available: }" ;;
        "not available:"*)
            echo "guest-lifecycle: FAILED: $name/$scenario could not run: ${full#not available: }"
            rc=1 ;;
    esac
done <"$out/summary.tsv"

# (d) kill -9 under a running guest, with the crash-safe state.
if [ "${GUEST_RESTART:-}" = skip ]; then
    echo "guest-lifecycle: notice: restart scenario skipped (GUEST_RESTART=skip)"
else
    bin=${GUEST_LIFECYCLE_SERVER_BIN:-$(cat "$out/server-bin" 2>/dev/null)}
    for ring in split packed; do
        args=(--state --strict --kills 3 --gap 2:6 --timeout 300 --out "$out/restart-$ring")
        [ "$ring" = packed ] && args+=(--packed)
        [ -x "${bin:-}" ] && args+=(--server-bin "$bin")
        if timeout --kill-after=30 420 bash ci/guest/restart.sh "${args[@]}" >"$out/restart-$ring.txt" 2>&1; then
            echo "guest-lifecycle: restart ($ring ring, 3 x SIGKILL, --state-dir, PATCHED QEMU): ok: $(grep -m1 '^guest total' "$out/restart-$ring.txt"); $(grep -m1 '^frontend:' "$out/restart-$ring.txt")"
        else
            echo "guest-lifecycle: FAILED: restart ($ring ring, 3 x SIGKILL, --state-dir, PATCHED QEMU): $(grep -E 'FAILED|guest total|^  guest: CI-R' "$out/restart-$ring.txt" | head -5 | tr '\n' ' ') (logs: $out/restart-$ring)"
            rc=1
        fi
    done
fi
exit $rc
