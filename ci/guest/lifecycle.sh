#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Lifecycle scenarios with a real Linux guest (TCG): what a VMM does around
# the 9p device while the guest uses it, driven over QMP. One guest per row
# and scenario; QEMU's built-in 9p is the reference row of the same run.
#   pause  (a) checksummed I/O across QMP stop/cont cycles (1-1.5 s paused),
#              with a guest process in fcntl(F_SETLKW) on a file a host
#              process holds a POSIX write lock on; the host releases it
#              halfway through the cycles and the guest must get it. Also a
#              plain wait first (no pause). Grant latency measured in the
#              guest (grant time minus the time the guest saw the host's
#              release marker).
#   rebind (b) I/O killed mid-flight, umount, unbind and rebind 9pnet_virtio
#              through sysfs, mount again, verify, more I/O, the POSIX suite.
#   reset  (c) QMP system_reset under I/O; the same kernel boots again, sees
#              its marker in the share, mounts, verifies, runs I/O and the
#              POSIX suite.
#
# Usage: ci/guest/lifecycle.sh [options]
#   --servers LIST    comma list from: qemu, ours-vhost (split ring,
#                     --no-packed-ring), ours-vhost-packed, ours-vhost-mapped
#                     (split, --security-model mapped-xattr, tmpfs share)
#                     (default: all four)
#   --scenarios LIST  comma list from: pause, rebind, reset (or a, b, c)
#                     (default: all three)
#   --kernel K        6.12 (default) or 6.1
#   --cycles N        stop/cont cycles in pause (default 10)
#   --timeout S       bound of one guest, in seconds (default 300)
#   --server-bin P    our daemon (default: build crates/virtio-9p-server,
#                     release, into $CARGO_TARGET_DIR, default target/)
#   --out DIR         keep logs and results here (default: a fresh temp dir)
#   --gate            exit 1 unless every row passes every scenario
#   --no-prepare      do not run prepare.sh: use what the cache holds
#   --report-only     boot nothing: print the table again from --out
set -euo pipefail
# One compound command: bash parses all of it before it runs any of it.
{
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=ci/guest/lib.sh
. "$here/lib.sh"
repo=$GUEST_REPO
CACHE=$GUEST_CACHE
export VIRTIO_9P_CI_CACHE=$CACHE
servers=qemu,ours-vhost,ours-vhost-packed,ours-vhost-mapped
scenarios=pause,rebind,reset
kernel=6.12
cycles=10
timeout_s=300
server_bin=
out=
gate=0
report_only=0
prepare=1
while [ $# -gt 0 ]; do
    case $1 in
        --servers) servers=$2; shift ;;
        --scenarios) scenarios=$2; shift ;;
        --kernel) kernel=$2; shift ;;
        --cycles) cycles=$2; shift ;;
        --timeout) timeout_s=$2; shift ;;
        --server-bin) server_bin=$2; shift ;;
        --out) out=$2; shift ;;
        --gate) gate=1 ;;
        --report-only) report_only=1 ;;
        --no-prepare) prepare=0 ;;
        -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
        *) echo "lifecycle.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
case $cycles in ''|*[!0-9]*) echo "lifecycle.sh: --cycles needs a number" >&2; exit 2 ;; esac
case $timeout_s in ''|*[!0-9]*) echo "lifecycle.sh: --timeout needs a number" >&2; exit 2 ;; esac
scenarios=$(sed 's/\ba\b/pause/; s/\bb\b/rebind/; s/\bc\b/reset/' <<<"$scenarios")
IFS=, read -r -a server_list <<<"$servers"
IFS=, read -r -a scenario_list <<<"$scenarios"
for s in "${server_list[@]}"; do
    case $s in qemu|ours-vhost|ours-vhost-packed|ours-vhost-mapped) ;;
        *) echo "lifecycle.sh: unknown server '$s'" >&2; exit 2 ;; esac
done
for c in "${scenario_list[@]}"; do
    case $c in pause|rebind|reset) ;;
        *) echo "lifecycle.sh: unknown scenario '$c'" >&2; exit 2 ;; esac
done
GUEST_LOG_NAME=guest-lifecycle

if [ "$report_only" -eq 1 ]; then
    if [ -z "$out" ] || [ ! -d "$out" ]; then echo "lifecycle.sh: --report-only needs --out DIR" >&2; exit 2; fi
    out=$(cd "$out" && pwd)
    KERNEL=$(cat "$out/kernel" 2>/dev/null || echo unknown)
else
# ---------------------------------------------------------------- preparation
# Every row runs on the stock QEMU that build-qemu.sh builds (prepare.sh).
if [ "$prepare" -eq 0 ]; then
    log "--no-prepare: using the cache in $CACHE as it is"
elif ! bash "$here/prepare.sh" --kernel "$kernel"; then
    log "preparation failed"
    exit 1
fi
eval "$(bash "$here/fetch-kernel.sh" "$kernel")" # KERNEL=, INITRAMFS=
# Stock QEMU >= 10.2 (ci/guest/build-qemu.sh) for every row, QEMU built-in
# included; Debian's firmware (-L).
QEMU=$GUEST_QEMU_STOCK
QEMU_FW=(-L /usr/share/qemu -L /usr/share/seabios)
[ -x "$QEMU" ] || { log "no stock QEMU at $QEMU (ci/guest/build-qemu.sh)"; exit 1; }
tools=$CACHE/tools/current
for t in lifecycle posix-suite; do
    [ -x "$tools/$t" ] || { log "no guest tool $tools/$t (ci/guest/prepare.sh builds it)"; exit 1; }
done

[ -n "$out" ] || out=$(mktemp -d /tmp/virtio-9p-lifecycle.XXXXXX)
mkdir -p "$out"
out=$(cd "$out" && pwd)
log "logs and results in $out"

pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
    pids=()
    return 0
}
trap cleanup EXIT INT TERM

# ------------------------------------------------------------- our daemon
ours_err=
ours_bin=
case ",$servers," in
*,ours-*)
    if [ -n "$server_bin" ]; then
        ours_bin=$server_bin
    else
        tdir=${CARGO_TARGET_DIR:-$repo/target}
        log "building virtio-9p-server (release) into $tdir"
        if (cd "$repo" && CARGO_TARGET_DIR=$tdir cargo build --release --quiet -p virtio-9p-server --features daemon) \
            >"$out/server-build.log" 2>&1; then
            ours_bin=$tdir/release/virtio-9p-server
        else
            ours_err="cargo build -p virtio-9p-server failed (see $out/server-build.log)"
        fi
    fi
    if [ -n "$ours_bin" ] && [ ! -x "$ours_bin" ]; then
        ours_err="no daemon binary at $ours_bin"
        ours_bin=
    fi
    ;;
esac
ours_help=
[ -z "$ours_bin" ] || ours_help=$("$ours_bin" --help 2>&1 || true)
echo "${ours_bin:-none}" >"$out/server-bin"

# --------------------------------------------------------- guest payload
# Appended to the cached base initramfs (busybox, 9p modules, ci/guest/init):
# /ci/run is the lifecycle driver, with the two static tools.
payload_dir=$out/payload
rm -rf "$payload_dir"
mkdir -p "$payload_dir/ci/bin"
install -m 0755 "$here/lifecycle-guest.sh" "$payload_dir/ci/run"
install -m 0755 "$tools/lifecycle" "$tools/posix-suite" "$payload_dir/ci/bin/"
(cd "$payload_dir" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) >"$out/payload.cpio.gz"
cat "$INITRAMFS" "$out/payload.cpio.gz" >"$out/initrd.img"
echo "$KERNEL" >"$out/kernel"
echo "$("$QEMU" --version | head -1) stock, $QEMU" >"$out/frontend"
echo "$cycles" >"$out/cycles"
date -u +%Y-%m-%dT%H:%MZ >"$out/date"

# ------------------------------------------------------------ one scenario
# Globals of the running scenario (set by run_scenario and the drivers).
dir='' con='' qpid='' share='' end_by=''
declare -A holder=()

# wait_console ERE SECONDS: until the guest console shows ERE; fails when
# QEMU ends first or the time runs out.
wait_console() {
    local i=0 n=$(($2 * 10))
    until grep -qE -- "$1" "$con" 2>/dev/null; do
        kill -0 "$qpid" 2>/dev/null || return 1
        [ $i -lt "$n" ] || return 1
        sleep 0.1
        i=$((i + 1))
    done
}

# qmp_open / qmp_session COMMAND... / qmp_close: the QMP client of the
# scenario, ci/guest/qmp-session.py, a coprocess that stays connected
# (lib.sh's qmp is one-shot).
qmp_open() {
    local line=''
    coproc python3 -u "$here/qmp-session.py" "$dir/qmp.sock" 2>&1
    pids+=("$COPROC_PID")
    IFS= read -r -t 40 line <&"${COPROC[0]}" || true
    host_note "qmp ${line:-no answer}"
    [ "$line" = ready ]
}
qmp_session() {
    local c line
    for c in "$@"; do
        [ -n "${COPROC[1]:-}" ] || { host_note "qmp: the client is gone"; return 1; }
        # Written from a command substitution: should the client be gone,
        # SIGPIPE ends that subshell, not this script.
        : "$(printf '%s\n' "$c" 2>/dev/null 1>&"${COPROC[1]}")"
        line=''
        IFS= read -r -t 40 line <&"${COPROC[0]}" || true
        host_note "qmp ${line:-$c: no answer}"
        case $line in "$c "*|"$c") ;; *) return 1 ;; esac
    done
}
qmp_close() {
    if [ -n "${COPROC_PID:-}" ]; then
        local p=$COPROC_PID
        kill "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    fi
}

release_lock() { # plain|pause
    local p=${holder[$1]} o
    if grep -q "LC-LOCK $1 ok" "$con"; then
        host_note "lock-$1: the guest had the lock before the host released it"
        echo "$1" >>"$dir/early-grants"
    fi
    kill -USR1 "$p"
    wait "$p" || hfail "lock holder $1 exited with $?"
    o=$(tail -1 "$dir/holder-$1.log")
    host_note "lock-$1 $o"
}

drive_pause() {
    qmp_open || { hfail "no QMP connection"; return 1; }
    wait_console 'LC-LOCK plain waiting' 180 || { hfail "the guest never waited for lock-plain"; return 1; }
    sleep 1
    release_lock plain
    wait_console 'LC-STAGE cycles-ready' 120 || { hfail "the guest never got ready for the cycles"; return 1; }
    wait_console 'LC-LOCK pause waiting' 30 || { hfail "the guest never waited for lock-pause"; return 1; }
    # The first stop comes while the guest's Tlock is in flight: on our
    # rows as soon as the daemon's debug log shows it (a server that
    # answers Blocked after a bounded wait, 1 s in older daemons, would
    # otherwise have answered before the stop), on QEMU's after 0.3 s.
    local gpid i=0
    gpid=$(tr -d '\r' <"$con" | sed -n 's/^LC-LOCK pause waiting pid=\([0-9]*\).*/\1/p' | head -1)
    if [ -f "$dir/server.log" ] && [ -n "$gpid" ]; then
        until grep -q "Wrlck, flags: LockFlags(BLOCK).*proc_id: $gpid," "$dir/server.log"; do
            [ $i -lt 50 ] || { host_note "no Tlock of guest pid $gpid in the daemon log within 5 s"; break; }
            sleep 0.1
            i=$((i + 1))
        done
        host_note "the guest (pid $gpid) waits for lock-pause; its Tlock is in the daemon log"
    else
        host_note "the guest waits for lock-pause"
        sleep 0.3
    fi
    local paused
    for ((i = 1; i <= cycles; i++)); do
        paused=1.$((i % 6))
        host_note "cycle $i: stop for ${paused} s"
        qmp_session stop query-status || { hfail "cycle $i: QMP stop failed"; return 1; }
        sleep "$paused"
        qmp_session cont query-status || { hfail "cycle $i: QMP cont failed"; return 1; }
        sleep 0.5
        [ $i -ne $(((cycles + 1) / 2)) ] || release_lock pause
        sleep 0.5
    done
    host_note "cycles done: $cycles"
    : >"$share/lc/host-done"
    # The guest allows its I/O 60 s and its lock waiter 50 s from here.
    end_by=$(($(date +%s) + 150))
}

drive_reset() {
    qmp_open || { hfail "no QMP connection"; return 1; }
    wait_console 'LC-STAGE busy' 180 || { hfail "the guest never got busy"; return 1; }
    sleep 2
    host_note "system_reset"
    qmp_session system_reset || { hfail "QMP system_reset failed"; return 1; }
    end_by=$(($(date +%s) + 240))
}

# stop_qemu: TERM through timeout(1), which passes it on; KILL after 10 s.
stop_qemu() {
    local i=0 child
    kill "$qpid" 2>/dev/null || return 0
    while kill -0 "$qpid" 2>/dev/null && [ $i -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    if kill -0 "$qpid" 2>/dev/null; then
        for child in $(ps -o pid= --ppid "$qpid"); do kill -KILL "$child" 2>/dev/null || true; done
    fi
}

# run_scenario ROW SCENARIO -> $out/ROW/SCENARIO/{console.log,host.log,...}
run_scenario() {
    local row=$1 sc=$2
    dir=$out/$row/$sc
    share=$dir/share
    con=$dir/console.log
    local sock=$dir/9p.sock qemu=$QEMU machine=q35 extra=() server_pid='' rc=0
    if mountpoint -q "$share" 2>/dev/null; then umount "$share"; fi
    rm -rf "$dir"
    mkdir -p "$share"
    GUEST_HOST_LOG=$dir/host.log
    : >"$GUEST_HOST_LOG"
    : >"$con"
    # The mapped row keeps owners and modes in user.virtfs.* xattrs: tmpfs,
    # as in run.sh (ext4's one xattr block is too small for the POSIX suite).
    case $row in *-mapped) mount -t tmpfs -o size=256m,mode=0755 "virtio-9p-lc-$row" "$share" ;; esac
    mkdir -p "$share/lc"
    case $row in
    qemu)
        extra=(-virtfs "local,path=$share,mount_tag=share,security_model=none")
        ;;
    ours-*)
        if [ -z "$ours_bin" ]; then echo "not available: $ours_err" >"$dir/status"; return; fi
        if ! grep -q -- '--socket-path' <<<"$ours_help"; then
            echo "not available: virtio-9p-server has no --socket-path (vhost-user mode) yet" >"$dir/status"
            return
        fi
        vhost_9p_daemon_flags "$row"
        local args=(--socket-path "$sock" --shared-dir "$share" --tag share --log-level debug
            "${VHOST_9P_DAEMON_FLAGS[@]}")
        host_note "daemon: $ours_bin ${args[*]}"
        RUST_LOG=debug "$ours_bin" "${args[@]}" >"$dir/server.log" 2>&1 &
        server_pid=$!
        pids+=("$server_pid")
        if ! wait_for_socket "$sock" "$server_pid"; then
            echo "server failed: no socket at $sock (see $dir/server.log)" >"$dir/status"
            cleanup
            return
        fi
        machine=$GUEST_VHOST_MACHINE
        guest_vhost_ram 512M
        vhost_9p_args "$sock"
        extra=("${GUEST_VHOST_RAM[@]}" "${VHOST_9P_ARGS[@]}")
        ;;
    esac
    holder=()
    if [ "$sc" = pause ]; then
        local l i
        for l in plain pause; do
            : >"$share/lc/lock-$l"
            chmod 0666 "$share/lc/lock-$l"
            python3 "$here/lock-holder.py" "$share/lc/lock-$l" "$share/lc/released-$l" >"$dir/holder-$l.log" 2>&1 &
            holder[$l]=$!
            pids+=("${holder[$l]}")
            i=0
            until grep -q '^locked' "$dir/holder-$l.log" 2>/dev/null; do
                [ $i -lt 100 ] || { echo "host lock holder failed: $(cat "$dir/holder-$l.log")" >"$dir/status"; cleanup; return; }
                sleep 0.1
                i=$((i + 1))
            done
            host_note "lock-$l held by host pid ${holder[$l]}"
        done
    fi
    # QMP system_reset under -no-reboot would end QEMU, so the reset
    # scenario runs without it (the guest powers off at the end).
    local noreboot=(-no-reboot)
    [ "$sc" != reset ] || noreboot=()
    # GUEST_APPEND: lib.sh says why a TCG guest needs its clock options.
    local append="$GUEST_APPEND CI_SCENARIO=$sc CI_SRC=share"
    append="$append CI_OPTS=msize=512000,cache=mmap,access=client"
    log "$row/$sc: booting guest ($(basename "$KERNEL"), bound ${timeout_s}s)"
    local t0
    t0=$(date +%s)
    timeout --kill-after=10 "$timeout_s" "$qemu" -nodefaults -no-user-config -accel tcg \
        -machine "$machine" -cpu max -m 512M -smp 1 -display none "${noreboot[@]}" \
        -serial "file:$con" -monitor none -qmp "unix:$dir/qmp.sock,server=on,wait=off" \
        -kernel "$KERNEL" -initrd "$out/initrd.img" -append "$append" \
        "${QEMU_FW[@]}" "${extra[@]}" >"$dir/qemu.log" 2>&1 &
    qpid=$!
    pids+=("$qpid")
    host_note "qemu started (pid $qpid)"
    end_by=''
    local drove=0
    case $sc in
    pause) drive_pause || drove=$? ;;
    reset) drive_reset || drove=$? ;;
    esac
    # A driver that failed leaves a guest waiting for the host: end it.
    [ "$drove" -eq 0 ] || end_by=0
    # The guest powers off when done; a third boot, a panic or the
    # driver's deadline ends it here.
    local boots=1
    [ "$sc" != reset ] || boots=2
    while kill -0 "$qpid" 2>/dev/null; do
        if [ "$(grep -c 'LC-STAGE boot' "$con")" -gt "$boots" ]; then
            hfail "the guest booted more often than $boots time(s)"
            stop_qemu
        elif grep -q 'Kernel panic' "$con"; then
            hfail "kernel panic"
            stop_qemu
        elif [ -n "$end_by" ] && [ "$(date +%s)" -ge "$end_by" ]; then
            [ "$end_by" -eq 0 ] || hfail "the guest did not finish in time after the host's part"
            stop_qemu
        fi
        sleep 0.5
    done
    qmp_close
    wait "$qpid" || rc=$?
    echo "$rc" >"$dir/qemu-rc"
    echo "$(($(date +%s) - t0))" >"$dir/seconds"
    host_note "qemu exited with $rc after $(cat "$dir/seconds") s"
    cleanup
    echo "done" >"$dir/status"
    if mountpoint -q "$share"; then umount "$share"; fi
}

for s in "${server_list[@]}"; do
    for c in "${scenario_list[@]}"; do
        run_scenario "$s" "$c"
    done
done
cleanup
rm -f "$out/initrd.img"
fi # report_only

# ---------------------------------------------------------------- report
cycles=$(cat "$out/cycles" 2>/dev/null || echo "$cycles")
# judge ROW SCENARIO: prints "ok" or "FAIL: reason; reason..." and sets
# J_LAT (lock latencies, pause only) and J_RING.
J_LAT='' J_RING='' J_STOP=''
judge() {
    local row=$1 sc=$2 d=$out/$1/$2 st con
    local why=()
    J_LAT='' J_RING='' J_STOP=''
    st=$(cat "$d/status" 2>/dev/null || echo "not run")
    case $st in done) ;; *) echo "$st"; return ;; esac
    con=$d/console.txt
    tr -d '\r' <"$d/console.log" >"$con"
    local rc
    rc=$(cat "$d/qemu-rc" 2>/dev/null || echo '?')
    case $rc in
        0) ;;
        124|137) why+=("guest did not end within the bound (last: $(grep -E '^LC-(STAGE|LOCK|IO-PROGRESS)' "$con" | tail -1))") ;;
        *) why+=("qemu exited with $rc: $(tail -c 200 "$d/qemu.log" | tr '\n' ' ')") ;;
    esac
    while IFS= read -r l; do why+=("host: ${l#*HOST-FAIL }"); done < <(grep 'HOST-FAIL' "$d/host.log" || true)
    while IFS= read -r l; do why+=("$l"); done < <(grep -E '^LC-FAIL|^LC-[A-Z]+ FAIL|^LC-LOCK [a-z]+ FAIL|^POSIX FAIL' "$con" | head -5 || true)
    while IFS= read -r l; do why+=("kernel: $l"); done < <(grep -E 'BUG:|Oops|Call Trace|blocked for more than|WARNING:|general protection|p9_virtio_remove: waiting|Kernel panic' "$con" | head -3 || true)
    need() { grep -qE -- "$1" "$con" || why+=("missing: $2"); }
    need '^LC-END' "LC-END (the scenario did not finish)"
    need '^CI-MOUNT ' "a 9p mount"
    need '^LC-FILL ok' "LC-FILL ok"
    need '^LC-VERIFY ok' "LC-VERIFY ok (files written before)"
    case $sc in
    pause)
        need '^LC-IO ok' "LC-IO ok"
        need '^LC-LOCK plain ok' "the plain lock grant"
        need '^LC-LOCK pause ok' "the lock grant across pauses"
        grep -q "cycles done: $cycles" "$d/host.log" || why+=("the host did not finish $cycles stop/cont cycles")
        local l v lat=()
        for l in plain pause; do
            v=$(sed -n "s/^LC-LOCK $l ok latency_ms=\([-0-9.]*\) .*/\1/p" "$con" | head -1)
            # A pause no lock waiter notices: on our rows the grant across
            # pauses comes within 1 s of the host's release (a waiter
            # answered Blocked at the stop slept the client's 30 s
            # locktimeout instead).
            if [ "$l" = pause ] && [ "$row" != qemu ] && [ -n "$v" ] &&
                awk -v ms="$v" 'BEGIN { exit !(ms >= 1000) }'; then
                why+=("lock-pause: granted ${v} ms after the host's release (at most 1 s)")
            fi
            [ -z "$v" ] || v=$(awk -v ms="$v" 'BEGIN { if (ms >= 1000 || ms <= -1000) printf "%.1f s", ms / 1000; else printf "%.1f ms", ms }')
            [ -n "$v" ] || ! grep -q "^LC-LOCK $l ok granted-before-release" "$con" || v="at once"
            # The host's own evidence: the guest's grant line was on the
            # console before the host released its lock.
            if grep -qx "$l" "$d/early-grants" 2>/dev/null; then
                v="at once"
                [ "$row" = qemu ] || why+=("lock-$l: granted while the host still held its lock")
            fi
            lat+=("${v:-none}")
        done
        J_LAT="${lat[0]} / ${lat[1]}"
        J_STOP=$(sed -n 's/.*qmp stop \([0-9.]*\)ms.*/\1/p' "$d/host.log" | sort -n | tail -1)
        ;;
    rebind)
        need '^LC-STAGE unbound' "the unbind"
        need '^LC-STAGE rebound' "the rebind"
        [ "$(grep -c '^CI-MOUNT ' "$con")" -ge 2 ] || why+=("missing: the mount after the rebind")
        need '^LC-IO ok' "LC-IO ok after the rebind"
        need '^POSIX-SUMMARY pass=[0-9]+ fail=0' "a clean POSIX-SUMMARY"
        ;;
    reset)
        grep -q 'qmp system_reset' "$d/host.log" || why+=("missing: the QMP system_reset")
        need '^LC-STAGE second-boot' "the second boot"
        need '^LC-IO ok' "LC-IO ok after the reset"
        need '^POSIX-SUMMARY pass=[0-9]+ fail=0' "a clean POSIX-SUMMARY"
        ;;
    esac
    # The ring layout: the guest's negotiated bits (bit 34: RING_PACKED).
    local feat
    feat=$(sed -n 's/^CI-VIRTIO-9P [^ ]* features=\([01]*\)$/\1/p' "$con" | head -1)
    if [ -n "$feat" ]; then
        J_RING='split'
        [ "${feat:34:1}" != 1 ] || J_RING=packed
        if [ "$row" = ours-vhost-packed ] && [ "$J_RING" != packed ]; then why+=("the packed ring was not negotiated"); fi
    fi
    if [ ${#why[@]} -eq 0 ]; then
        echo ok
    else
        local IFS=';'
        echo "FAIL: ${why[*]}"
    fi
}

declare -A RES LAT RING STOPMS
for s in "${server_list[@]}"; do
    for c in "${scenario_list[@]}"; do
        # \x1f (not a tab, which read would merge) between the fields.
        r=$(judge "$s" "$c"; printf '\x1f%s\x1f%s\x1f%s' "$J_LAT" "$J_RING" "$J_STOP")
        IFS=$'\x1f' read -r res lat ring stopms <<<"${r//$'\n'/}"
        RES[$s/$c]=$res
        [ -z "$lat" ] || LAT[$s]=$lat
        [ -z "$ring" ] || RING[$s]=$ring
        [ -z "$stopms" ] || STOPMS[$s]=$stopms
    done
done

short() { # result -> table cell
    case $1 in
        ok) echo ok ;;
        FAIL*) echo FAIL ;;
        "not available:"*) echo "n/a" ;;
        *) echo "FAIL" ;;
    esac
}
col() { # scenario -> result cell of row $s
    if [[ ",$scenarios," == *",$1,"* ]]; then short "${RES[$s/$1]}"; else echo -; fi
}
printf '\n9p guest lifecycle (kernel %s, TCG, %s stop/cont cycles, %s)\n' \
    "$(basename "$KERNEL" | sed 's/^vmlinuz-//')" "$cycles" "$(cat "$out/date" 2>/dev/null || date -u +%Y-%m-%dT%H:%MZ)"
printf 'frontend of every row: %s\n' "$(cat "$out/frontend" 2>/dev/null || echo unknown)"
fmt='%-17s | %-16s | %-17s | %-16s | %-31s | %s\n'
# shellcheck disable=SC2059 # one format for every line of the table
printf "$fmt" server "(a) pause/resume" "(b) unbind/rebind" "(c) system_reset" "lock grant: plain / across pauses" notes
# shellcheck disable=SC2059
printf "$fmt" ----------------- ---------------- ----------------- ---------------- ------------------------------- -----
for s in "${server_list[@]}"; do
    notes=
    [ -z "${RING[$s]:-}" ] || notes="${RING[$s]} ring"
    [ -z "${STOPMS[$s]:-}" ] || notes="$notes${notes:+; }slowest QMP stop ${STOPMS[$s]} ms"
    [ "$s" != qemu ] || notes="$notes${notes:+; }built-in 9p ignores host locks"
    # shellcheck disable=SC2059
    printf "$fmt" "$s" "$(col pause)" "$(col rebind)" "$(col reset)" "${LAT[$s]:--}" "$notes"
done
echo
gate_fail=0
for s in "${server_list[@]}"; do
    for c in "${scenario_list[@]}"; do
        r=${RES[$s/$c]}
        case $r in
        ok) ;;
        "not available: virtio-9p-server has no --"*) echo "$s/$c: skipped: ${r#not available: }" ;;
        *)
            echo "$s/$c: $r" | sed 's/;/\n    /g'
            gate_fail=1
            ;;
        esac
    done
done
echo "logs: $out"
{
    for s in "${server_list[@]}"; do
        for c in "${scenario_list[@]}"; do
            printf '%s\t%s\t%s\t%s\n' "$s" "$c" "$(short "${RES[$s/$c]}")" "${RES[$s/$c]}"
        done
    done
} >"$out/summary.tsv"
if [ "$gate" -eq 1 ] && [ "$gate_fail" -ne 0 ]; then
    echo "guest lifecycle: FAILED (see above)"
    exit 1
fi
exit 0
}
