#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Kills the vhost-user 9p daemon (SIGKILL) under a running guest and starts
# a new one on the same socket, several times, and reports what QEMU and the
# guest saw. With --state --strict it is the crash scenario: every
# daemon keeps its session crash-safe in --state-dir, and the guest must
# see no error at all.
#
# The guest (Linux under TCG, QEMU with `reconnect-ms`) mounts
# the share and loops over a workload: write a 1 MiB file and check its
# sha256 on read-back, mkdir/create/rename/remove/rmdir, append a line to
# a file it keeps open, list the directory. With --state or --handover a
# guest process also keeps a file open with a POSIX write lock on it
# (ci/guest/src/holdlock.c): it reads the file back through its open fd at
# every iteration, and the host checks after each restart that the new
# daemon holds the lock again (a host lockf on the file must fail). A step
# that fails is printed with its error, then the guest remounts (umount -l
# + mount) and goes on.
# The host waits a random time, SIGKILLs the daemon, starts a new one on
# the same socket and waits for QEMU to restart the device in it ("driver
# acked features" in the new daemon's log) and for the guest's next good
# iteration, N times; then it stops the guest and prints one report.
#
# Usage: ci/guest/restart.sh [options]
#   --kills N          restarts of the daemon (default 3)
#   --gap MIN:MAX      seconds between the guest's recovery and the next kill,
#                      chosen at random (default 3:15)
#   --seed N           seed for the random gaps (default: from the clock)
#   --kernel K         6.12 (default) or 6.1
#   --packed           offer packed rings (default: --no-packed-ring, split)
#   --qemu PATH        QEMU binary (default: ci/guest/build-qemu.sh's patched
#                      one: stock QEMU 10.2 plus ci/guest/qemu-patches; stock
#                      QEMU cannot reconnect, see ci/guest/README.md)
#   --server-bin PATH  our daemon (default: cargo build --release)
#   --daemon-arg ARG   extra argument for every daemon instance (repeatable;
#                      for example --state-dir)
#   --timeout S        limit for the whole guest (default 900)
#   --state            SIGKILL with the crash-safe state: every
#                      daemon runs with --state-dir OUT/state and the next
#                      one recovers the session and the requests in flight;
#                      use with --strict
#   --handover         a planned handover instead of SIGKILL: every daemon
#                      runs with --state-dir OUT/state, gets SIGUSR1 (finish
#                      the requests taken, save the session, exit) and the
#                      next one takes the session over; use with --strict
#   --strace           run each restarted daemon under strace and decode the
#                      vhost-user messages it receives (vhost-msgs-N.txt:
#                      order, ring bases, addresses, features); slower
#   --strict           exit 1 unless the guest saw no error at all (a
#                      daemon with --state-dir keeps the session; without
#                      it only the transport is expected to survive)
#   --out DIR          keep logs here (default: a fresh /tmp/virtio-9p-restart.*)
#
# Exit status: 0 when the transport survived every restart (QEMU still
# running without assert, the new daemon got the device each time, the
# guest did a good iteration after each restart and finished); 1 otherwise.
# Between the kill and the new daemon's start it reads QEMU's ring indices
# over QMP (only safe while the vhost device is stopped).
#
# Split rings survive today (the guest's mount fails, a remount works).
# Packed rings do not: QEMU cannot rewind a packed ring when GET_VRING_BASE
# fails, so the new daemon is told a stale base (0 with both wrap counters
# set, when the device never stopped cleanly before) and the guest hangs
# until the daemon restores the ring position itself (the session
# state does not carry it yet).
set -uo pipefail
{
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=ci/guest/lib.sh
. "$here/lib.sh"
repo=$GUEST_REPO
CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
export VIRTIO_9P_CI_CACHE=$CACHE
kills=3
gap=3:15
seed=
kernel=6.12
packed=0
qemu=
server_bin=
daemon_args=()
timeout_s=900
strict=0
use_strace=0
handover=0
state=0
out=
while [ $# -gt 0 ]; do
    case $1 in
        --kills) kills=$2; shift ;;
        --gap) gap=$2; shift ;;
        --seed) seed=$2; shift ;;
        --kernel) kernel=$2; shift ;;
        --packed) packed=1 ;;
        --qemu) qemu=$2; shift ;;
        --server-bin) server_bin=$2; shift ;;
        --daemon-arg) daemon_args+=("$2"); shift ;;
        --timeout) timeout_s=$2; shift ;;
        --strict) strict=1 ;;
        --strace) use_strace=1 ;;
        --handover) handover=1 ;;
        --state) state=1 ;;
        --out) out=$2; shift ;;
        -h|--help) awk 'NR > 1 && /^set / { exit } NR > 1' "$0"; exit 0 ;;
        *) echo "restart.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
gap_min=${gap%%:*}
gap_max=${gap##*:}
for v in "$kills" "$gap_min" "$gap_max" "$timeout_s"; do
    case $v in ''|*[!0-9]*) echo "restart.sh: --kills, --gap and --timeout take numbers" >&2; exit 2 ;; esac
done
[ "$gap_max" -ge "$gap_min" ] || { echo "restart.sh: --gap MIN:MAX with MIN <= MAX" >&2; exit 2; }
[ -n "$seed" ] || seed=$(( $(date +%s) % 32768 ))
[ "$handover" -eq 1 ] && state=1
RANDOM=$seed
GUEST_LOG_CLOCK=1
now_ms() { date +%s%3N; }

# ---------------------------------------------------------------- preparation
eval "$(bash "$here/fetch-kernel.sh" "$kernel")" || { log "fetch-kernel.sh failed"; exit 1; }
if [ -z "$qemu" ]; then
    qemu=$(bash "$here/build-qemu.sh" | tail -1) || { log "build-qemu.sh failed"; exit 1; }
fi
[ -x "$qemu" ] || { log "no QEMU at $qemu"; exit 1; }
# Which QEMU: build-qemu.sh's patched binary records its source and series.
qemu_desc="$("$qemu" --version | head -1), $qemu"
case $qemu in
    "$CACHE"/qemu-patched/*) qemu_desc="$qemu_desc (stock $(cat "$CACHE/qemu-patched/.version" 2>/dev/null) + ci/guest/qemu-patches: patched, stock QEMU cannot reconnect)" ;;
esac
if [ -z "$server_bin" ]; then
    tdir=${CARGO_TARGET_DIR:-$repo/target}
    log "building virtio-9p-server (release) into $tdir"
    (cd "$repo" && CARGO_TARGET_DIR=$tdir cargo build --release --quiet -p virtio-9p-server --features daemon) >&2 \
        || { log "cargo build failed"; exit 1; }
    server_bin=$tdir/release/virtio-9p-server
fi
[ -x "$server_bin" ] || { log "no daemon at $server_bin"; exit 1; }
if [ "$state" -eq 1 ] && ! command -v gcc >/dev/null; then
    log "--state and --handover need gcc (the guest's lock holder, a static binary)"
    exit 1
fi
if [ "$use_strace" -eq 1 ] && ! command -v strace >/dev/null; then
    log "--strace needs strace (apt-get install strace)"
    exit 1
fi
[ -n "$out" ] || out=$(mktemp -d /tmp/virtio-9p-restart.XXXXXX)
mkdir -p "$out"
out=$(cd "$out" && pwd)
share=$out/share sock=$out/9p.sock qmp=$out/qmp.sock con=$out/console.log
rm -rf "$share" "$out"/server-*.log "$out"/console.* "$out"/qemu.log "$out"/qemu-trace.log "$out"/payload* \
    "$out"/strace-*.txt "$out"/vhost-msgs-*.txt
mkdir -p "$share"
log "logs in $out (seed $seed)"

# ---------------------------------------------------------------- the guest
# ci/guest/restart-guest.sh runs as /ci/run under ci/guest/init. Lines it
# prints:
#   CI-R MOUNTED <proc/mounts line>     CI-R FEATURES <bits>
#   CI-R OK iter=N                      CI-R FAIL iter=N step=S: <error>
#   CI-R REMOUNT iter=N rc=R            CI-R STOP iter=N ok=N fail=N remounts=N
#   CI-R TIMEOUT                        CI-DONE
# and with CI_STATE=1 (--state, --handover), from holdlock and at the end:
#   CI-R LOCKED pid=P   CI-R HELD ok|FAIL why   CI-R UNLOCKED ok|FAIL why
#   CI-R HELDLOG lines=N ok=N in-order=yes|no
mkdir -p "$out/payload/ci"
if [ "$state" -eq 1 ]; then
    guest_static_tool "$here/src/holdlock.c" "$out/payload/ci/holdlock" \
        || { log "building holdlock failed"; exit 1; }
fi
install -m 0755 "$here/restart-guest.sh" "$out/payload/ci/run"
guest_initrd "$INITRAMFS" "$out/payload" "$out/initrd.img"

# ---------------------------------------------------------------- daemons
ring=(--no-packed-ring)
[ "$packed" -eq 1 ] && ring=()
if [ "$state" -eq 1 ]; then
    # The daemon takes a state directory on a tmpfs only (SECURITY.md);
    # $out/state points at it for the report.
    state_dir=$(mktemp -d /dev/shm/virtio-9p-state.XXXXXX)
    rm -rf "$out/state"
    ln -s "$state_dir" "$out/state"
    daemon_args+=(--state-dir "$state_dir")
fi
daemon_pid=''
sig_pid=''
stale_groups=()
start_daemon() { # instance number
    local wrap=()
    [ "$use_strace" -eq 1 ] && [ "$1" -gt 1 ] \
        && wrap=(strace -f -q -xx -s 4096 -e trace=recvmsg -o "$out/strace-$1.txt")
    # Its own process group (setsid), so that one kill reaches every
    # process of it: the daemon, its sandboxed child and strace.
    RUST_LOG=${RUST_LOG:-debug} setsid "${wrap[@]}" "$server_bin" --socket-path "$sock" --shared-dir "$share" --tag share \
        --keep-serving --log-level debug "${ring[@]}" "${daemon_args[@]}" >"$out/server-$1.log" 2>&1 &
    daemon_pid=$!
    sig_pid=$daemon_pid
    stale_groups+=("$daemon_pid")
    local i=0
    # The socket path may still hold the killed daemon's stale socket:
    # wait for the new daemon's log line instead of the path.
    while ! grep -q 'vhost-user socket' "$out/server-$1.log" 2>/dev/null; do
        kill -0 "$daemon_pid" 2>/dev/null || return 1
        [ $i -lt 200 ] || return 1
        sleep 0.05
        i=$((i + 1))
    done
    # Under strace, signals go to the daemon, not to strace.
    [ ${#wrap[@]} -eq 0 ] || sig_pid=$(pgrep -o -P "$daemon_pid") || return 1
}
# QEMU's view of queue 0 (ci/guest/virtio-queue.py), only while the vhost
# device is stopped.
vq_status() {
    python3 "$here/virtio-queue.py" "$qmp"
}

qemu_pid=
cleanup() {
    local g
    for g in "${stale_groups[@]}"; do kill -- "-$g" 2>/dev/null; done
    [ -n "$qemu_pid" ] && kill "$qemu_pid" 2>/dev/null
    # Not a bare wait: the report's tee is a child too, and ends only
    # when this script does.
    wait "${stale_groups[@]}" $qemu_pid 2>/dev/null
    if [ -n "${state_dir:-}" ]; then rm -rf "$state_dir"; fi
}
trap cleanup EXIT INT TERM

start_daemon 1 || { log "daemon 1 did not start (see $out/server-1.log)"; exit 1; }
# no_timer_check: under TCG on a loaded host the IO-APIC timer check can
# fail and panic the kernel ("IO-APIC + timer doesn't work").
append="console=ttyS0 loglevel=4 panic=-1 no_timer_check CI_SRC=share CI_SECONDS=$timeout_s CI_STATE=$state"
# reconnect-ms: QEMU reconnects to the next daemon on the same socket.
guest_qemu_args 512M
vhost_9p_args --chardev-opts ,reconnect-ms=500 "$sock"
# vhost-user trace events (message numbers in the order QEMU sends them)
# and the vhost device's start/stop/cleanup go to qemu-trace.log.
nice -n 5 "$qemu" "${GUEST_QEMU_ARGS[@]}" \
    -serial "file:$con" -monitor none -qmp "unix:$qmp,server=on,wait=off" \
    "${VHOST_9P_ARGS[@]}" \
    -trace 'vhost_user_read' -trace 'vhost_user_write' -trace 'vhost_dev_st*' -trace 'vhost_dev_cleanup' \
    -D "$out/qemu-trace.log" \
    -kernel "$KERNEL" -initrd "$out/initrd.img" -append "$append" >"$out/qemu.log" 2>&1 &
qemu_pid=$!

count_lines() { grep -cE "$2" "$1" 2>/dev/null || true; }
fail() { log "FAILED: $*"; verdict_fail=1; }

verdict_fail=0
declare -a R_KILL R_CLEAN R_ACK R_BEFORE R_GUEST R_HANDOVER R_LOCK R_FIRST
if ! wait_line "$con" '^CI-R (MOUNTED|MOUNT-FAILED)' 300 "$qemu_pid" || grep -q '^CI-R MOUNT-FAILED' "$con"; then
    fail "the guest did not mount (see $con, $out/qemu.log)"
fi
if [ "$verdict_fail" -eq 0 ]; then
    wait_line "$con" '^CI-R OK' 300 "$qemu_pid" || fail "no good iteration before the first kill"
fi
if [ "$verdict_fail" -eq 0 ] && [ "$state" -eq 1 ]; then
    grep -q '^CI-R LOCKED pid=' "$con" || fail "the guest's lock holder did not lock ($(grep -m1 '^CI-R LOCKED' "$con"))"
    [ "$(host_lock "$share/w/lockfile")" = held ] || fail "the guest's lock is not held on the host before the first kill"
fi
k=0
while [ "$verdict_fail" -eq 0 ] && [ "$k" -lt "$kills" ]; do
    k=$((k + 1))
    g=$(( gap_min + RANDOM % (gap_max - gap_min + 1) ))
    log "restart $k: waiting ${g}s"
    sleep "$g"
    ok_before=$(count_lines "$con" '^CI-R OK')
    lines_before=$(wc -l <"$con")
    stops_before=$(count_lines "$out/qemu-trace.log" '^vhost_dev_cleanup')
    t0=$(now_ms)
    if [ "$handover" -eq 1 ]; then
        # SIGUSR1 to the daemon (its namespace supervisor forwards it): it
        # drains, saves the session and exits.
        kill -USR1 "$sig_pid"
        t=$(( $(date +%s) + 60 ))
        while kill -0 "$sig_pid" 2>/dev/null && [ "$(date +%s)" -lt "$t" ]; do sleep 0.05; done
        if kill -0 "$sig_pid" 2>/dev/null; then
            fail "daemon $k did not exit within 60 s of SIGUSR1"
            kill -KILL -- "-$daemon_pid"
        fi
        wait "$daemon_pid" 2>/dev/null
        rc=$?
        if [ "$sig_pid" != "$daemon_pid" ]; then
            # strace's status is not the daemon's: read the daemon's exit.
            rc=$(sed -n "s/^$sig_pid +++ exited with \([0-9]*\) +++\$/\1/p" "$out/strace-$k.txt" | tail -1)
            rc=${rc:-unknown}
        fi
        R_HANDOVER[$k]="exit $rc after $(( $(now_ms) - t0 )) ms, state: $(ls "$out/state" 2>/dev/null | tr '\n' ' ')"
        log "restart $k: daemon $k handed over: ${R_HANDOVER[$k]}"
        [ "$rc" = 0 ] || fail "daemon $k exited with $rc at the handover"
    else
        # SIGKILL every process of the daemon at once.
        kill -KILL -- "-$daemon_pid"
        wait "$daemon_pid" 2>/dev/null
    fi
    R_KILL[$k]=$(date -u +%H:%M:%S.%3N)
    # QEMU stops the vhost device (GET_VRING_BASE fails, so it rewinds the
    # ring's last available index to the used index) and cleans it up.
    t=$(( $(date +%s) + 10 ))
    while [ "$(count_lines "$out/qemu-trace.log" '^vhost_dev_cleanup')" -le "$stops_before" ] \
        && [ "$(date +%s)" -lt "$t" ] && kill -0 "$qemu_pid" 2>/dev/null; do
        sleep 0.05
    done
    if [ "$(count_lines "$out/qemu-trace.log" '^vhost_dev_cleanup')" -gt "$stops_before" ]; then
        R_CLEAN[$k]=$(( $(now_ms) - t0 ))
        R_BEFORE[$k]=$(vq_status)
    else
        R_BEFORE[$k]="(QEMU did not clean up the vhost device within 10 s)"
    fi
    log "restart $k: daemon gone; QEMU with no backend: ${R_BEFORE[$k]}"
    t1=$(now_ms)
    if ! start_daemon $((k + 1)); then
        fail "daemon $((k + 1)) did not start (see $out/server-$((k + 1)).log)"
        break
    fi
    if ! wait_line "$out/server-$((k + 1)).log" 'driver acked features' 60 "$qemu_pid"; then
        fail "QEMU did not restart the device in daemon $((k + 1)) within 60 s"
        break
    fi
    R_ACK[$k]=$(( $(now_ms) - t1 ))
    R_FIRST[$k]=$(( $(now_ms) - t0 ))
    if [ "$use_strace" -eq 1 ]; then
        sleep 1
        python3 "$here/vhost-msgs.py" "$out/strace-$((k + 1)).txt" >"$out/vhost-msgs-$((k + 1)).txt"
    fi
    log "restart $k: device restarted in daemon $((k + 1)) ${R_ACK[$k]} ms after its start"
    # The guest's next good iteration (its workload resumed).
    t=$(( $(date +%s) + 300 ))
    while [ "$(count_lines "$con" '^CI-R OK')" -le "$ok_before" ]; do
        if ! kill -0 "$qemu_pid" 2>/dev/null || [ "$(date +%s)" -ge "$t" ]; then
            fail "no good guest iteration after restart $k"
            break
        fi
        sleep 0.2
    done
    R_GUEST[$k]=$(tail -n +"$((lines_before + 1))" "$con" | tr -d '\r' | grep -E '^CI-R (FAIL|REMOUNT|HELD FAIL)' | head -8)
    if [ "$state" -eq 1 ]; then
        # The new daemon took the guest's lock again before it served.
        R_LOCK[$k]=$(host_lock "$share/w/lockfile")
        [ "${R_LOCK[$k]}" = held ] || fail "after restart $k the guest's lock is ${R_LOCK[$k]} on the host"
    fi
done
# Stop the guest: it checks for the file at each iteration.
touch "$share/ci-stop"
if [ "$verdict_fail" -eq 0 ]; then
    wait_line "$con" '^CI-DONE' 300 "$qemu_pid" || fail "the guest did not finish"
else
    wait_line "$con" '^CI-DONE' 20 "$qemu_pid"
fi
for _ in $(seq 1 100); do kill -0 "$qemu_pid" 2>/dev/null || break; sleep 0.2; done
if kill -0 "$qemu_pid" 2>/dev/null; then
    kill "$qemu_pid" 2>/dev/null
    fail "QEMU did not exit with the guest"
fi
wait "$qemu_pid" 2>/dev/null
qemu_rc=$?
qemu_pid=
kill -- "-$daemon_pid" 2>/dev/null
wait "$daemon_pid" 2>/dev/null
daemon_pid=
if [ "$qemu_rc" -ne 0 ] || grep -qiE 'assert|abort|core dumped' "$out/qemu.log"; then
    fail "QEMU exited with $qemu_rc: $(tail -c 300 "$out/qemu.log" | tr '\n' ' ')"
fi

# ---------------------------------------------------------------- report
# The report also goes to OUT/report.txt.
exec > >(tee "$out/report.txt")
tr -d '\r' <"$con" >"$out/console.txt"
stop=$(grep -m1 '^CI-R STOP' "$out/console.txt")
nfail=$(grep -c '^CI-R FAIL' "$out/console.txt")
echo
echo "9p daemon $([ "$handover" -eq 1 ] && echo handover || echo SIGKILL) under a running guest ($(basename "$KERNEL" | sed 's/^vmlinuz-//'), TCG, $([ "$packed" -eq 1 ] && echo packed || echo split) ring, seed $seed, $(date -u +%Y-%m-%dT%H:%MZ))"
echo "frontend: $qemu_desc"
echo "guest: $(grep -m1 '^CI-R MOUNTED' "$out/console.txt" | cut -d' ' -f3-)"
for i in $(seq 1 "$k"); do
    [ -n "${R_HANDOVER[$i]:-}" ] && echo "restart $i: handover (SIGUSR1): ${R_HANDOVER[$i]}"
    echo "restart $i: old daemon gone at ${R_KILL[$i]:-?}; QEMU stopped the device ${R_CLEAN[$i]:-?} ms after the signal; the new daemon had it (\"driver acked features\") ${R_ACK[$i]:-?} ms after its start (${R_FIRST[$i]:-?} ms after the signal)"
    [ -n "${R_LOCK[$i]:-}" ] && echo "  the guest's lock on the host after the restart: ${R_LOCK[$i]}"
    echo "  QEMU queue 0 with no backend (SET_VRING_BASE gets last_avail): ${R_BEFORE[$i]:-?}"
    if [ -s "$out/vhost-msgs-$((i + 1)).txt" ]; then
        echo "  vhost-user messages daemon $((i + 1)) received (vhost-msgs-$((i + 1)).txt):"
        sed 's/^/    /' "$out/vhost-msgs-$((i + 1)).txt" | head -40
    fi
    if [ -n "${R_GUEST[$i]:-}" ]; then
        printf '  guest: %s\n' "${R_GUEST[$i]}" | sed '2,$s/^/  guest: /'
    else
        echo "  guest: no error"
    fi
done
echo "guest total: ${stop:-no STOP line} (failed steps: $nfail)"
if [ "$state" -eq 1 ]; then
    held_ok=$(grep -c '^CI-R HELD ok' "$out/console.txt")
    held_fail=$(grep -c '^CI-R HELD FAIL' "$out/console.txt")
    echo "guest lock holder: $(grep -m1 '^CI-R LOCKED' "$out/console.txt"); open-file checks ok=$held_ok fail=$held_fail; $(grep -m1 '^CI-R UNLOCKED' "$out/console.txt"); $(grep -m1 '^CI-R HOLDLOCK' "$out/console.txt")"
    echo "file kept open: $(grep -m1 '^CI-R HELDLOG' "$out/console.txt")"
    heldlog=$(grep -m1 '^CI-R HELDLOG' "$out/console.txt")
    okn=$(sed -n 's/.* ok=\([0-9]*\).*/\1/p' <<<"$stop")
    if [ "$held_fail" -gt 0 ] || ! grep -q '^CI-R UNLOCKED ok' "$out/console.txt" \
        || ! grep -q '^CI-R HOLDLOCK exit=0' "$out/console.txt" \
        || [ "$heldlog" != "CI-R HELDLOG lines=$okn ok=$okn in-order=yes" ]; then
        nfail=$((nfail + 1))
        echo "the open file or the lock did not survive"
    fi
fi
echo "QEMU: exit ${qemu_rc}; $(grep -ciE 'assert|abort' "$out/qemu.log") assert/abort lines; vhost-user messages traced in qemu-trace.log"
echo "logs: $out"
[ "$verdict_fail" -eq 0 ] && [ -n "$stop" ] || { echo "restart: FAILED"; exit 1; }
if [ "$strict" -eq 1 ] && [ "$nfail" -gt 0 ]; then
    echo "restart: FAILED (--strict: the guest saw $nfail failed steps)"
    exit 1
fi
echo "restart: transport survived $k restarts"
exit 0
}
