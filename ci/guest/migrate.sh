#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Live migration of a Linux guest (TCG) with a mounted share, between two
# QEMU + server pairs on this machine. The destination's server exports
# the same tree through another path (a bind mount of the source's share
# directory). One guest per row:
#
#   ours-vhost         our daemon, split ring (--no-packed-ring), on the
#                      patched QEMU (stock 10.2.2 + ci/guest/qemu-patches,
#                      whose 0007 makes vhost-user-test-device-pci
#                      migratable); both daemons with --export-name and
#                      --migration-mode find-paths
#   ours-vhost-packed  the same on the packed ring
#   virtiofsd          virtiofsd (find-paths) on stock QEMU's
#                      vhost-user-fs-pci, the reference
#
# The guest (ci/guest/migrate-guest.sh, ci/guest/src/migrate.c) takes a
# POSIX write lock on a file of the share, writes a shared writable mmap
# of another (half of it msync'd, half left dirty in guest memory), keeps
# four files open and rewrites and reads them back with checksums in a
# loop. The host, once the guest is busy: QMP `migrate` over a unix socket
# to the destination QEMU (started with -S -incoming defer, then
# return-path on both and migrate-incoming), `query-migrate` until
# it completes, `cont` on the destination if it is paused, `quit` on the
# source (its server then exits), a host lockf on the guest's lock file
# (it must fail: the destination's server holds the lock for the guest),
# then it creates mg/migrated in the share. The guest goes on for
# --after seconds on the destination, then checks the mapping and the file
# behind it, a child's F_GETLK and F_SETLK on the lock, the locked file,
# writes the mapping again and ends. The host compares the mapped file with
# the guest's checksum.
#
# When the migration fails, the source guest must go on unharmed: the host
# creates the marker anyway and the source guest must finish its checks.
#
# Usage: ci/guest/migrate.sh [options]
#   --rows LIST        comma list from: ours-vhost, ours-vhost-packed,
#                      virtiofsd (default: all three)
#   --kernel K         6.12 (default) or 6.1
#   --after S          seconds of guest I/O on the destination (default 5)
#   --busy S           seconds of guest I/O before the migration (default 3)
#   --timeout S        bound of one row, in seconds (default 300)
#   --server-bin P     our daemon (default: build crates/virtio-9p-server,
#                      release, into $CARGO_TARGET_DIR, default target/)
#   --qemu-patched P   QEMU of our rows (default: build-qemu.sh's patched)
#   --qemu-stock P     QEMU of the virtiofsd row (default: build-qemu.sh's stock)
#   --device-props S   extra ,key=value properties of vhost-user-test-device-pci
#                      (default ,migratable=on: patch 0007's property)
#   --out DIR          keep logs and results here (default: a fresh temp dir)
#   --gate             exit 1 unless our rows pass (virtiofsd's never gates)
#   --no-prepare       do not run prepare.sh: use what the cache holds
#   --report-only      boot nothing: print the table again from --out
set -uo pipefail
# One compound command: bash parses all of it before it runs any of it.
{
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=ci/guest/lib.sh
. "$here/lib.sh"
CACHE=$GUEST_CACHE
export VIRTIO_9P_CI_CACHE=$CACHE
rows=ours-vhost,ours-vhost-packed,virtiofsd
kernel=6.12
after_s=5
busy_s=3
timeout_s=300
server_bin=
qemu_patched=$GUEST_QEMU_PATCHED
qemu_stock=$GUEST_QEMU_STOCK
device_props=,migratable=on
out=
gate=0
prepare=1
report_only=0
while [ $# -gt 0 ]; do
    case $1 in
        --rows) rows=$2; shift ;;
        --kernel) kernel=$2; shift ;;
        --after) after_s=$2; shift ;;
        --busy) busy_s=$2; shift ;;
        --timeout) timeout_s=$2; shift ;;
        --server-bin) server_bin=$2; shift ;;
        --qemu-patched) qemu_patched=$2; shift ;;
        --qemu-stock) qemu_stock=$2; shift ;;
        --device-props) device_props=$2; shift ;;
        --out) out=$2; shift ;;
        --gate) gate=1 ;;
        --no-prepare) prepare=0 ;;
        --report-only) report_only=1 ;;
        -h|--help) awk 'NR > 1 && /^set / { exit } NR > 1' "$0"; exit 0 ;;
        *) echo "migrate.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
for v in "$after_s" "$busy_s" "$timeout_s"; do
    case $v in ''|*[!0-9]*) echo "migrate.sh: --after, --busy and --timeout take numbers" >&2; exit 2 ;; esac
done
IFS=, read -r -a row_list <<<"$rows"
for r in "${row_list[@]}"; do
    case $r in ours-vhost|ours-vhost-packed|virtiofsd) ;;
        *) echo "migrate.sh: unknown row '$r'" >&2; exit 2 ;; esac
done
GUEST_LOG_NAME=guest-migration GUEST_LOG_CLOCK=1

if [ "$report_only" -eq 1 ]; then
    if [ -z "$out" ] || [ ! -d "$out" ]; then echo "migrate.sh: --report-only needs --out DIR" >&2; exit 2; fi
    out=$(cd "$out" && pwd)
else
# ---------------------------------------------------------------- preparation
if [ "$prepare" -eq 0 ]; then
    log "--no-prepare: using the cache in $CACHE as it is"
elif ! bash "$here/prepare.sh" --kernel "$kernel"; then
    log "preparation failed"
    exit 1
fi
eval "$(bash "$here/fetch-kernel.sh" "$kernel")" # KERNEL=, INITRAMFS=
[ -n "$out" ] || out=$(mktemp -d /tmp/virtio-9p-migrate.XXXXXX)
mkdir -p "$out"
out=$(cd "$out" && pwd)
log "logs and results in $out"

ours_bin= ours_err=
case ",$rows," in
*,ours-*)
    if [ -n "$server_bin" ]; then
        ours_bin=$server_bin
    else
        log "building virtio-9p-server (release)"
        ours_bin=$(guest_daemon_bin "$out/server-build.log") \
            || ours_err="cargo build -p virtio-9p-server failed (see $out/server-build.log)"
    fi
    if [ -n "$ours_bin" ] && [ ! -x "$ours_bin" ]; then
        ours_err="no daemon binary at $ours_bin"
        ours_bin=
    fi
    ;;
esac
virtiofsd_bin= virtiofsd_err=
case ",$rows," in *,virtiofsd,*)
    virtiofsd_bin=$(bash "$here/install-virtiofsd.sh" 2>"$out/virtiofsd-install.log" | tail -1) \
        || virtiofsd_err="install-virtiofsd.sh failed (see $out/virtiofsd-install.log)"
    ;;
esac

# The guest payload: /ci/run and the static workload.
mkdir -p "$out/payload/ci/bin"
install -m 0755 "$here/migrate-guest.sh" "$out/payload/ci/run"
guest_static_tool "$here/src/migrate.c" "$out/payload/ci/bin/migrate" \
    || { log "building the guest tool (gcc -static) failed"; exit 1; }
guest_initrd "$INITRAMFS" "$out/payload" "$out/initrd.img"
echo "$KERNEL" >"$out/kernel"
date -u +%Y-%m-%dT%H:%MZ >"$out/date"
cut -d' ' -f1-3 /proc/loadavg >"$out/load-start"
for q in "$qemu_patched" "$qemu_stock"; do
    [ -x "$q" ] && echo "$q: $("$q" --version | head -1)"
done >"$out/frontends"
{
    if [ "$qemu_patched" = "$GUEST_QEMU_PATCHED" ]; then
        echo "patched QEMU series: $(cat "$CACHE/qemu-patched/.built" 2>/dev/null || echo unknown) (sha256 prefix of build-qemu.sh and the patches)"
    fi
    [ -n "$device_props" ] && echo "device properties: $device_props"
    true
} >>"$out/frontends"

# ------------------------------------------------------------ one row
# Globals of the running row.
pids=() groups=()
cleanup() {
    local p g
    for g in "${groups[@]}"; do kill -- "-$g" 2>/dev/null || true; done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}" "${groups[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=() groups=()
    if [ -n "${dir:-}" ] && mountpoint -q "$dir/share-dst" 2>/dev/null; then umount "$dir/share-dst" || true; fi
    return 0
}
trap cleanup EXIT INT TERM
dir=

# start_server ROW SIDE: the row's server for SIDE (src: share, dst:
# share-dst), in a process group of its own; sets server_pid.
server_pid=
start_server() {
    local row=$1 side=$2 shared=$dir/share args
    [ "$side" = src ] || shared=$dir/share-dst
    local sock=$dir/$side/vu.sock
    case $row in
    virtiofsd)
        args=("$virtiofsd_bin" --socket-path "$sock" --shared-dir "$shared" --cache never --allow-mmap
            --xattr --migration-mode find-paths --migration-on-error abort --log-level debug)
        ;;
    *)
        args=("$ours_bin" --socket-path "$sock" --shared-dir "$shared" --tag share
            --export-name ci-migrate --migration-mode find-paths --log-level debug)
        vhost_9p_daemon_flags "$row"
        args+=("${VHOST_9P_DAEMON_FLAGS[@]}")
        ;;
    esac
    host_note "$side server: ${args[*]}"
    RUST_LOG=debug setsid "${args[@]}" >"$dir/$side/server.log" 2>&1 &
    server_pid=$!
    groups+=("$server_pid")
    wait_for_socket "$sock" "$server_pid"
}

# start_qemu ROW SIDE: the row's QEMU for SIDE (dst: -incoming); sets qemu_pid.
qemu_pid=
start_qemu() {
    local row=$1 side=$2 qemu=$qemu_patched device=() incoming=()
    local sock=$dir/$side/vu.sock
    case $row in
    virtiofsd)
        qemu=$qemu_stock
        device=(-chardev "socket,id=vu,path=$sock" -device "vhost-user-fs-pci,chardev=vu,tag=share,queue-size=1024")
        ;;
    *)
        vhost_9p_args --props "$device_props" "$sock"
        device=("${VHOST_9P_ARGS[@]}")
        ;;
    esac
    # The destination waits paused for migrate-incoming (after its
    # capabilities are set) and for `cont` after the migration.
    [ "$side" = src ] || incoming=(-S -incoming defer)
    local mode=9p
    [ "$row" != virtiofsd ] || mode=virtiofs
    guest_qemu_args 512M
    host_note "$side qemu: $qemu ... ${device[*]:2} ${incoming[*]}"
    timeout --kill-after=10 "$timeout_s" nice -n 5 "$qemu" "${GUEST_QEMU_ARGS[@]}" \
        -serial "file:$dir/$side/console.log" -monitor none \
        -qmp "unix:$dir/$side/qmp.sock,server=on,wait=off" \
        "${device[@]}" \
        -kernel "$KERNEL" -initrd "$out/initrd.img" \
        -append "$GUEST_APPEND CI_MODE=$mode CI_SRC=share CI_AFTER=$after_s" \
        "${incoming[@]}" >"$dir/$side/qemu.log" 2>&1 &
    qemu_pid=$!
    pids+=("$qemu_pid")
}

# migrate_row: the host's part, once both pairs run. Writes $dir/migration
# (status downtime total setup) and the host checks into host.log.
migrate_row() {
    local src_qemu=$1 dst_qemu=$2 src_server=$3 row=$4
    local src=$dir/src dst=$dir/dst st i
    wait_line "$src/console.log" '^MG-READY' 240 "$src_qemu" \
        || { hfail "the guest never got ready: $(tr -d '\r' <"$src/console.log" | grep -E '^MG-.* FAIL|Kernel panic' | head -2)"; return 1; }
    host_note "guest ready; lock on the host before the migration: $(host_lock "$dir/share/mg/lockfile" | tee "$dir/lock-before")"
    sleep "$busy_s"
    # return-path on both sides: without it the source reports
    # "completed" even when the destination refused the device state
    # (and stays paused, with no guest running anywhere).
    local caps='{"execute":"migrate-set-capabilities","arguments":{"capabilities":[{"capability":"return-path","state":true}]}}'
    host_note "destination capabilities: $(qmp "$dst/qmp.sock" "$caps" 2>&1)"
    host_note "source capabilities: $(qmp "$src/qmp.sock" "$caps" 2>&1)"
    host_note "migrate-incoming: $(qmp "$dst/qmp.sock" "{\"execute\":\"migrate-incoming\",\"arguments\":{\"uri\":\"unix:$dir/migrate.sock\"}}" 2>&1)"
    [ -S "$dir/migrate.sock" ] || { hfail "the destination does not listen on $dir/migrate.sock"; return 1; }
    local answer
    answer=$(qmp "$src/qmp.sock" "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"unix:$dir/migrate.sock\"}}" 2>&1)
    host_note "migrate: $answer"
    case $answer in *'"error"'*)
        # Refused at once (a migration blocker): QEMU names the reason.
        st="failed - - - $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["error"]["desc"].replace(" ", "_"))' "$answer" 2>/dev/null || echo refused)"
        echo "$st" >"$dir/migration"
        host_note "query-migrate: $st"
        return 0
        ;;
    esac
    local t=$(($(date +%s) + 180)) unknown=0
    while :; do
        st=$(qmp_get "$src/qmp.sock" query-migrate status downtime total-time setup-time error-desc)
        case $st in completed\ *|failed\ *|cancelled\ *|error:*) break ;; esac
        # No status at all for 5 s: no migration runs.
        case $st in -\ *) unknown=$((unknown + 1)) ;; *) unknown=0 ;; esac
        [ "$unknown" -lt 25 ] || { st="failed - - - no_migration_under_way"; break; }
        if [ "$(date +%s)" -ge "$t" ]; then
            hfail "the migration did not end within 180 s (last: $st)"
            qmp "$src/qmp.sock" '{"execute":"migrate_cancel"}' >/dev/null 2>&1 || true
            break
        fi
        sleep 0.2
    done
    echo "$st" >"$dir/migration"
    host_note "query-migrate: $st"
    case $st in completed\ *) ;; *) return 0 ;; esac
    # The destination runs (autostart) or waits paused: cont then.
    st=$(qmp_get "$dst/qmp.sock" query-status status running)
    host_note "destination: $st"
    if [ "${st#* }" != True ]; then
        i=0
        # "inmigrate" until the stream is loaded: wait for it.
        while [ "${st%% *}" = inmigrate ] && [ $i -lt 100 ]; do
            sleep 0.1
            st=$(qmp_get "$dst/qmp.sock" query-status status running)
            i=$((i + 1))
        done
        if [ "${st#* }" != True ]; then
            host_note "cont: $(qmp "$dst/qmp.sock" '{"execute":"cont"}')"
            st=$(qmp_get "$dst/qmp.sock" query-status status running)
            host_note "destination after cont: $st"
        fi
    fi
    echo "$st" >"$dir/dst-status"
    [ "${st#* }" = True ] || hfail "the destination does not run: $st"
    # The source is done: quit it; its server sees the hang-up and exits.
    host_note "source quit: $(qmp "$src/qmp.sock" '{"execute":"quit"}' 2>&1)"
    i=0
    while { kill -0 "$src_qemu" 2>/dev/null || kill -0 "$src_server" 2>/dev/null; } && [ $i -lt 150 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    kill -0 "$src_server" 2>/dev/null && { host_note "the source server did not exit within 15 s of the source's quit: killed"; kill -KILL -- "-$src_server" 2>/dev/null || true; }
    wait "$src_qemu" 2>/dev/null
    echo $? >"$src/qemu-rc"
    wait "$src_server" 2>/dev/null
    echo $? >"$src/server-rc"
    # Only the destination's server can hold the guest's lock now.
    host_note "lock on the host after the migration: $(host_lock "$dir/share/mg/lockfile" | tee "$dir/lock-after")"
    return 0
}

run_row() {
    local row=$1 rc=0 src_qemu dst_qemu src_server t0
    dir=$out/$row
    if mountpoint -q "$dir/share-dst" 2>/dev/null; then umount "$dir/share-dst"; fi
    rm -rf "$dir"
    mkdir -p "$dir/src" "$dir/dst" "$dir/share" "$dir/share-dst"
    GUEST_HOST_LOG=$dir/host.log
    : >"$GUEST_HOST_LOG"
    : >"$dir/src/console.log"
    : >"$dir/dst/console.log"
    # The destination's export: the same tree through another path.
    mount --bind "$dir/share" "$dir/share-dst"
    case $row in
    virtiofsd)
        if [ -z "$virtiofsd_bin" ] || [ ! -x "$virtiofsd_bin" ]; then
            echo "not available: ${virtiofsd_err:-no virtiofsd binary}" >"$dir/status"
            cleanup
            return
        fi
        [ -x "$qemu_stock" ] || { echo "not available: no stock QEMU at $qemu_stock (ci/guest/build-qemu.sh)" >"$dir/status"; cleanup; return; }
        ;;
    *)
        [ -n "$ours_bin" ] || { echo "not available: $ours_err" >"$dir/status"; cleanup; return; }
        [ -x "$qemu_patched" ] || { echo "not available: no patched QEMU at $qemu_patched (ci/guest/build-qemu.sh)" >"$dir/status"; cleanup; return; }
        # The cache holds whatever series build-qemu.sh last applied.
        if ! "$qemu_patched" -device vhost-user-test-device-pci,help 2>&1 | grep -q 'migratable='; then
            echo "not available: the QEMU at $qemu_patched has no migratable property (built without qemu-patches/0007: run ci/guest/build-qemu.sh from this tree)" >"$dir/status"
            cleanup
            return
        fi
        ;;
    esac
    log "$row: two QEMU + server pairs, guest $(basename "$KERNEL")"
    t0=$(date +%s)
    start_server "$row" src || { echo "server failed: no socket (see $dir/src/server.log)" >"$dir/status"; cleanup; return; }
    src_server=$server_pid
    start_server "$row" dst || { echo "server failed: no socket (see $dir/dst/server.log)" >"$dir/status"; cleanup; return; }
    start_qemu "$row" src
    src_qemu=$qemu_pid
    start_qemu "$row" dst
    dst_qemu=$qemu_pid
    migrate_row "$src_qemu" "$dst_qemu" "$src_server" "$row" || rc=$?
    # The guest's part on the destination (or, after a failed migration,
    # on the source) ends when it sees the marker.
    mkdir -p "$dir/share/mg"
    : >"$dir/share/mg/migrated"
    local side=dst qpid=$dst_qemu
    case $(cat "$dir/migration" 2>/dev/null) in completed\ *) ;; *) side=src qpid=$src_qemu ;; esac
    local bound=$((after_s + 120))
    [ "$rc" -eq 0 ] || side=src qpid=$src_qemu bound=30
    echo "$side" >"$dir/finished-on"
    if ! wait_line "$dir/$side/console.log" '^MG-END' "$bound" "$qpid"; then
        hfail "the guest did not finish on the $side side"
    fi
    local i=0
    while kill -0 "$qpid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    if kill -0 "$qpid" 2>/dev/null; then
        hfail "$side QEMU did not exit after the guest's poweroff"
        stop_pid "$qpid"
    fi
    wait "$qpid" 2>/dev/null
    echo $? >"$dir/$side/qemu-rc"
    cleanup
    echo "$(($(date +%s) - t0))" >"$dir/seconds"
    # The mapped file as the host sees it, for the guest's checksum.
    fnv1a64 "$dir/share/mg/mapped" >"$dir/host-fnv"
    echo done >"$dir/status"
}

for r in "${row_list[@]}"; do
    run_row "$r"
done
trap - EXIT INT TERM
cut -d' ' -f1-3 /proc/loadavg >"$out/load-end"
rm -f "$out/initrd.img"
fi # report_only

# ---------------------------------------------------------------- report
# judge ROW: prints "ok" or "FAIL: reason; reason..." (or "not available:").
judge() {
    local row=$1 d=$out/$1 st con why=() side mig
    st=$(cat "$d/status" 2>/dev/null || echo "not run")
    case $st in done) ;; *) echo "$st"; return ;; esac
    side=$(cat "$d/finished-on" 2>/dev/null || echo dst)
    mig=$(cat "$d/migration" 2>/dev/null || echo "none")
    # The guest's whole console: the source's, then the destination's.
    con=$d/console.txt
    cat "$d/src/console.log" "$d/dst/console.log" | tr -d '\r' >"$con"
    case $mig in
        completed\ *) ;;
        failed\ *|cancelled\ *) why+=("migration ${mig%% *}: $(cut -d' ' -f5- <<<"$mig" | tr '_' ' ')") ;;
        *) why+=("migration: ${mig}") ;;
    esac
    while IFS= read -r l; do why+=("host: ${l#*HOST-FAIL }"); done < <(grep 'HOST-FAIL' "$d/host.log" || true)
    while IFS= read -r l; do why+=("guest: $l"); done < <(grep -E '^MG-[A-Z]+ FAIL' "$con" | head -5 || true)
    while IFS= read -r l; do why+=("kernel: $l"); done < <(grep -E 'BUG:|Oops|Call Trace|blocked for more than|general protection|Kernel panic' "$con" | head -3 || true)
    need() { grep -qE -- "$1" "$con" || why+=("missing: $2"); }
    need '^CI-MOUNT ' "the mount"
    need '^MG-LOCK ok' "the lock"
    need '^MG-READY' "the workload's start"
    need '^MG-MARKER seen' "the guest seeing the host's marker"
    need '^MG-MMAP ok' "MG-MMAP ok (the mapping across the migration)"
    need '^MG-GETLK ok' "MG-GETLK ok (the lock still the guest's)"
    need '^MG-HELD ok' "MG-HELD ok (the locked file)"
    need '^MG-IO ok' "MG-IO ok (the checksummed I/O)"
    need '^MG-UNLOCK ok' "MG-UNLOCK ok"
    need '^MG-EXIT rc=0' "MG-EXIT rc=0"
    need '^MG-END' "MG-END"
    case $mig in completed\ *)
        tr -d '\r' <"$d/dst/console.log" | grep -q '^MG-IO ok' || why+=("the workload did not finish on the destination")
        ;;
    esac
    local rc
    rc=$(cat "$d/$side/qemu-rc" 2>/dev/null || echo '?')
    [ "$rc" = 0 ] || why+=("$side QEMU exited with $rc: $(tail -c 200 "$d/$side/qemu.log" | tr '\n' ' ')")
    ! grep -qiE 'assert|core dumped' "$d/src/qemu.log" "$d/dst/qemu.log" || why+=("QEMU: $(grep -hiE 'assert|core dumped' "$d/src/qemu.log" "$d/dst/qemu.log" | head -1)")
    # The mapped file on the host holds what the guest last wrote.
    local gf hf
    gf=$(sed -n 's/^MG-MMAP ok .*fnv=\([0-9a-f]*\).*/\1/p' "$con" | head -1)
    hf=$(cat "$d/host-fnv" 2>/dev/null)
    [ -z "$gf" ] || [ "$gf" = "$hf" ] || why+=("the mapped file on the host (fnv $hf) differs from the guest's (fnv $gf)")
    # The lock: held on the host before and after the migration. virtiofsd
    # keeps POSIX locks in the guest only (no host lock at all): both
    # "free" is its normal state; a lock lost by the migration fails.
    local lb la
    lb=$(cat "$d/lock-before" 2>/dev/null || echo '?')
    la=$(cat "$d/lock-after" 2>/dev/null || echo '?')
    case $row/$lb/$la in
        virtiofsd/free/free) ;;
        */held/held) ;;
        */*/'?') case $mig in completed\ *) why+=("no host lock check after the migration") ;; esac ;;
        *) why+=("host lockf on the guest's lock file: $lb before the migration, $la after (want held, held)") ;;
    esac
    # The ring the guest negotiated (bit 34: RING_PACKED).
    local feat
    feat=$(sed -n 's/^CI-VIRTIO [^ ]* id=[^ ]* features=\([01]*\)$/\1/p' "$con" | head -1)
    if [ -n "$feat" ]; then
        J_RING=split
        [ "${feat:34:1}" != 1 ] || J_RING=packed
        case $row in
            ours-vhost-packed) [ "$J_RING" = packed ] || why+=("the packed ring was not negotiated") ;;
            ours-vhost) [ "$J_RING" = split ] || why+=("the split ring was not negotiated") ;;
        esac
    fi
    if [ ${#why[@]} -eq 0 ]; then
        echo ok
    else
        local IFS=';'
        echo "FAIL: ${why[*]}"
    fi
}

declare -A RES RING
for r in "${row_list[@]}"; do
    J_RING=
    judge "$r" >"$out/$r.verdict"
    RES[$r]=$(cat "$out/$r.verdict")
    RING[$r]=$J_RING
done

ms() { # a query-migrate field in ms -> "N ms" or "-"
    case $1 in ''|-|*[!0-9]*) echo "-" ;; *) echo "$1 ms" ;; esac
}
printf '\nLive migration with a mounted share (kernel %s, TCG, 1 vCPU, 512 MiB, %s, load %s -> %s)\n' \
    "$(basename "$(cat "$out/kernel" 2>/dev/null || echo unknown)" | sed 's/^vmlinuz-//')" \
    "$(cat "$out/date" 2>/dev/null)" "$(cat "$out/load-start" 2>/dev/null)" "$(cat "$out/load-end" 2>/dev/null)"
sed 's/^/frontend: /' "$out/frontends" 2>/dev/null || true
fmt='| %-17s | %-39s | %-6s | %-9s | %-10s | %-10s | %-10s | %-12s | %s |\n'
# shellcheck disable=SC2059 # one format for every line of the table
printf "$fmt" row frontend ring result downtime total setup "host lock" "guest I/O rounds before / after the marker"
# shellcheck disable=SC2059
printf "$fmt" --- --- --- --- --- --- --- --- ---
for r in "${row_list[@]}"; do
    d=$out/$r
    read -r _ down total setup _ <<<"$(cat "$d/migration" 2>/dev/null || echo "- - - - -")"
    case $r in virtiofsd) fe="stock QEMU, vhost-user-fs-pci" ;; *) fe="patched QEMU, vhost-user-test-device-pci" ;; esac
    case ${RES[$r]} in ok) res=pass ;; "not available:"*) res=n/a ;; *) res=FAIL ;; esac
    lk="$(cat "$d/lock-before" 2>/dev/null || echo -)/$(cat "$d/lock-after" 2>/dev/null || echo -)"
    io=$(sed -n 's/^MG-IO ok rounds=[0-9]* before=\([0-9]*\) after=\([0-9]*\).*max_gap_ms=\([0-9]*\).*/\1 \/ \2 (longest round \3 ms)/p' "$d/console.txt" 2>/dev/null | head -1)
    # shellcheck disable=SC2059
    printf "$fmt" "$r" "$fe" "${RING[$r]:--}" "$res" "$(ms "$down")" "$(ms "$total")" "$(ms "$setup")" "$lk" "${io:--}"
done
echo
gate_fail=0
for r in "${row_list[@]}"; do
    case ${RES[$r]} in
        ok) echo "$r: pass" ;;
        *)
            echo "$r: ${RES[$r]}" | sed 's/;/\n    /g'
            case $r in ours-*) gate_fail=1 ;; esac
            ;;
    esac
done
echo "logs: $out"
{
    for r in "${row_list[@]}"; do
        read -r _ down total setup _ <<<"$(cat "$out/$r/migration" 2>/dev/null || echo "- - - - -")"
        printf '%s\t%s\t%s\t%s\t%s\n' "$r" "$(case ${RES[$r]} in ok) echo ok ;; "not available:"*) echo n/a ;; *) echo FAIL ;; esac)" \
            "$down" "$total" "${RES[$r]}"
    done
} >"$out/summary.tsv"
if [ "$gate" -eq 1 ] && [ "$gate_fail" -ne 0 ]; then
    echo "guest migration: FAILED (see above)"
    exit 1
fi
exit 0
}
