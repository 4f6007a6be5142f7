#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Reproduces, on one QEMU binary, the failures of hw/virtio/
# vhost-user-base.c (0001-0005) and the missing migration of
# vhost-user-test-device (0006) that ci/guest/qemu-patches fixes, with our
# daemon as the
# vhost-user back-end and `-device vhost-user-test-device-pci` (QEMU >= 10.2):
#   query    0001: QMP x-query-virtio-status on the running device
#   early    0002: the back-end dies before the guest's driver started the
#            device (QEMU paused with -S, so no driver ever runs)
#   rebind   0003: the back-end dies, then the guest unbinds and rebinds
#            9pnet_virtio (the probe reads the config space)
#   start    0004: start with `-chardev socket,...,reconnect-ms=500`
#   restart  0005: the back-end dies and a new one starts on the socket,
#            with reconnect-ms; the device is hot-added over QMP (behind a
#            pcie-root-port) after the chardev connected, so that stock
#            QEMU's realize does not fail first (that is 0004)
#   migrate  0006: live migration of the guest, share mounted, to a second
#            QEMU (-incoming unix:..., -S) whose own daemon exports the
#            same tree through another path (a bind mount), with
#            --export-name share --migration-mode find-paths on both
#            daemons and migratable=on on both devices (when the binary
#            has the property); QMP `migrate` on the source, `cont` on the
#            destination, then the guest reads back, through a fid opened
#            before the migration and through a new open, a file it wrote
#            before, and writes a new one; checksummed reads and writes
#            run all through the migration (dirty logging). Prints
#            query-migrate's total-time and downtime (ms).
#   refused  0007 and the daemon: as migrate, but the destination's daemon
#            exports another --export-name: it refuses the device state,
#            the migration fails, and the source guest goes on (its
#            checksummed loop and read-back pass on the source)
#   realize  0006: a back-end that offers no VHOST_USER_PROTOCOL_F_CONFIG
#            (a minimal one, ci/guest/src/vu-stub.py) and config_size=7:
#            realize fails; QEMU must exit 1 with the reason, not crash
#            (0005 alone crashes here; stock exits 1 too)
#   blockers 0007: `migrate` must be refused, naming the reason, with
#            migratable=off, and with migratable=on when the back-end
#            (the same stub) lacks the device state channel or dirty
#            logging (VHOST_F_LOG_ALL)
# Each scenario passes when QEMU is still running at its end and did what
# the scenario needs (answered, rebound, booted, re-started the device in
# the new daemon); it fails with QEMU's last words otherwise. Run it on the
# stock binary to see the bugs, on the patched one to see the fixes.
#
# Usage: ci/guest/qemu-repro.sh [--qemu PATH] [--server-bin PATH]
#                               [--out DIR] [SCENARIO...]
#   --qemu PATH        default: build-qemu.sh's stock binary
#   --server-bin PATH  our daemon (default: cargo build --release)
#   --packed           offer packed rings (default: --no-packed-ring, split)
#   SCENARIO           query, early, rebind, start, restart, migrate,
#                      refused, realize, blockers (default: all)
# Exit status: 0 when every scenario passed, 1 otherwise.
set -uo pipefail
{
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=ci/guest/lib.sh
. "$here/lib.sh"
repo=$(cd "$here/../.." && pwd)
CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
export VIRTIO_9P_CI_CACHE=$CACHE
qemu=
server_bin=
out=
scenarios=()
ring=(--no-packed-ring)
while [ $# -gt 0 ]; do
    case $1 in
        --qemu) qemu=$2; shift ;;
        --server-bin) server_bin=$2; shift ;;
        --out) out=$2; shift ;;
        --packed) ring=() ;;
        -h|--help) awk 'NR > 1 && /^set / { exit } NR > 1' "$0"; exit 0 ;;
        query|early|rebind|start|restart|migrate|refused|realize|blockers) scenarios+=("$1") ;;
        *) echo "qemu-repro.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
[ ${#scenarios[@]} -gt 0 ] || scenarios=(query early rebind start restart migrate refused realize blockers)
GUEST_LOG_CLOCK=1

eval "$(bash "$here/fetch-kernel.sh" 6.12)" || { log "fetch-kernel.sh failed"; exit 1; }
if [ -z "$qemu" ]; then
    qemu=$(bash "$here/build-qemu.sh" --stock-only | tail -1) || { log "build-qemu.sh failed"; exit 1; }
fi
[ -x "$qemu" ] || { log "no QEMU at $qemu"; exit 1; }
if [ -z "$server_bin" ]; then
    tdir=${CARGO_TARGET_DIR:-$repo/target}
    (cd "$repo" && CARGO_TARGET_DIR=$tdir cargo build --release --quiet -p virtio-9p-server --features daemon) >&2 \
        || { log "cargo build failed"; exit 1; }
    server_bin=$tdir/release/virtio-9p-server
fi
MIGRATABLE=
"$qemu" -device vhost-user-test-device,help 2>/dev/null | grep -q 'migratable=' && MIGRATABLE=migratable=on
[ -n "$out" ] || out=$(mktemp -d /tmp/virtio-9p-qemu-repro.XXXXXX)
mkdir -p "$out"
out=$(cd "$out" && pwd)

# The guest's /ci/run: what it does depends on REPRO= on its command line.
payload=$out/payload
mkdir -p "$payload/ci"
cat >"$payload/ci/run" <<'GUEST'
#!/bin/sh
sc=$(sed -n 's/.*REPRO=\([a-z]*\).*/\1/p' /proc/cmdline)
echo "REPRO-UP $sc"
mkdir -p /mnt
opts=trans=virtio,version=9p2000.L,msize=512000,access=client
# rebind: no mount, so that nothing holds the channel when the driver is
# unbound (the probe at boot already read the config space).
if [ "$sc" != rebind ]; then
    if mount -t 9p -o "$opts" share /mnt && ls /mnt >/dev/null; then
        echo "REPRO-MOUNTED"
    else
        echo "REPRO-MOUNT-FAILED"
    fi
fi
dev=$(basename "$(readlink -f /sys/bus/virtio/drivers/9pnet_virtio/virtio*)")
echo "REPRO-READY $dev"
case $sc in
rebind)
    sleep 8 # the host kills the back-end meanwhile
    echo "$dev" >/sys/bus/virtio/drivers/9pnet_virtio/unbind
    echo "REPRO-UNBOUND rc=$?"
    echo "$dev" >/sys/bus/virtio/drivers/9pnet_virtio/bind
    echo "REPRO-REBOUND rc=$?"
    ;;
query|restart)
    sleep 25
    ;;
migrate|refused)
    # A file written and a fid opened before the migration; the host
    # creates /mnt/migrated once the destination runs.
    dd if=/dev/urandom of=/mnt/before bs=64k count=16 2>/dev/null
    want=$(sha256sum /mnt/before | cut -d' ' -f1)
    exec 3</mnt/before
    cp /mnt/before /tmp/pat
    echo "REPRO-WROTE $want"
    # Checksummed reads and writes go on through the migration: the
    # back-end's writes to guest memory must reach the destination
    # (dirty logging), or a checksum is wrong there.
    read -r t0 _ </proc/uptime
    n=0 bad=0
    while [ ! -e /mnt/migrated ]; do
        read -r t _ </proc/uptime
        [ "${t%.*}" -lt $(( ${t0%.*} + 300 )) ] || { echo "REPRO-NO-MARKER"; break; }
        [ "$(sha256sum /mnt/before | cut -d' ' -f1)" = "$want" ] || bad=$((bad + 1))
        cp /tmp/pat /mnt/loop && [ "$(sha256sum /mnt/loop | cut -d' ' -f1)" = "$want" ] ||
            bad=$((bad + 1))
        n=$((n + 1))
    done
    echo "REPRO-LOOP iterations=$n bad=$bad"
    fd=$(sha256sum <&3 | cut -d' ' -f1)
    again=$(sha256sum /mnt/before | cut -d' ' -f1)
    exec 3<&-
    if [ "$bad" = 0 ] && [ "$fd" = "$want" ] && [ "$again" = "$want" ] &&
        echo after >/mnt/after && [ "$(cat /mnt/after)" = after ]; then
        echo "REPRO-AFTER ok"
    else
        echo "REPRO-AFTER FAIL fd=$fd path=$again want=$want"
    fi
    ;;
esac
echo "REPRO-END"
GUEST
chmod 0755 "$payload/ci/run"
(cd "$payload" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) >"$out/payload.cpio.gz"
cat "$INITRAMFS" "$out/payload.cpio.gz" >"$out/initrd.img"

pids=()
bind_mounts=()
cleanup() {
    local p
    for p in "${pids[@]}"; do
        kill -KILL -- "-$p" 2>/dev/null
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    pids=()
    local m
    for m in "${bind_mounts[@]}"; do umount -l "$m" 2>/dev/null; done
    bind_mounts=()
    return 0
}
trap cleanup EXIT INT TERM

daemon() { # dir n [socket share extra-args...] -> DPID (own process group,
           # so one kill reaches all of it)
    local d=$1 n=$2 sock=${3:-$1/vu.sock} share=${4:-$1/share}
    shift 2
    [ $# -lt 2 ] || shift 2
    RUST_LOG=debug setsid "$server_bin" --socket-path "$sock" --shared-dir "$share" \
        --tag share "${ring[@]}" --keep-serving --log-level debug "$@" >"$d/server-$n.log" 2>&1 &
    DPID=$!
    pids+=("$DPID")
    local i=0
    until grep -q 'vhost-user socket' "$d/server-$n.log" 2>/dev/null; do
        kill -0 "$DPID" 2>/dev/null || return 1
        [ $i -lt 200 ] || return 1
        sleep 0.05
        i=$((i + 1))
    done
}
wait_for() { # file regex seconds -> 0 when a line matches; 1 at timeout or QEMU exit
    local i=0
    while [ $i -lt $(($3 * 10)) ]; do
        grep -qE "$2" "$1" 2>/dev/null && return 0
        kill -0 "$QPID" 2>/dev/null || return 1
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}
alive() { kill -0 "$QPID" 2>/dev/null; }
last_words() { tail -c 400 "$1/qemu.log" | tr '\n' ' '; }

# A QEMU with no guest (-S) on the stub back-end: prints QEMU's exit
# status and output, or the answer to `migrate` when QEMU started.
stub_qemu() { # dir features device-properties [qemu-args...]
    local dir=$1 feat=$2 props=$3 i=0
    shift 3
    rm -f "$dir/stub.sock" "$dir/qmp.sock"
    setsid python3 "$here/src/vu-stub.py" "$dir/stub.sock" "$feat" >>"$dir/stub.log" 2>&1 &
    pids+=("$!")
    until [ -S "$dir/stub.sock" ] || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done
    setsid "$qemu" -nodefaults -no-user-config -accel tcg -machine q35,memory-backend=mem -m 512M \
        -display none -S -L /usr/share/qemu -L /usr/share/seabios "$@" \
        -object memory-backend-memfd,id=mem,size=512M,share=on \
        -qmp "unix:$dir/qmp.sock,server=on,wait=off" -chardev "socket,id=vu,path=$dir/stub.sock" \
        -device "vhost-user-test-device-pci,chardev=vu,virtio-id=9,num_vqs=1$props" >"$dir/qemu.log" 2>&1 &
    QPID=$!
    pids+=("$QPID")
    i=0
    until [ -S "$dir/qmp.sock" ] || ! alive || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done
    if alive; then
        qmp "$dir/qmp.sock" "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"unix:$dir/nowhere.sock\"}}"
    else
        wait "$QPID"
        echo "exit $?: $(tr '\n' ' ' <"$dir/qemu.log")"
    fi
    cleanup
}

declare -A RESULT
run() { # scenario
    local sc=$1 dir=$out/$1
    rm -rf "$dir"
    mkdir -p "$dir/share"
    case $sc in
    realize)
        local r
        r=$(stub_qemu "$dir" log-all ",config_size=7")
        case $r in
            "exit 1: "*F_CONFIG*) RESULT[$sc]="ok: ${r:0:200}" ;;
            *) RESULT[$sc]="FAIL: ${r:0:300}" ;;
        esac
        return
        ;;
    blockers)
        if [ -z "$MIGRATABLE" ]; then
            RESULT[$sc]="FAIL: this QEMU has no migratable property (needs 0007)"
            return
        fi
        local off state log r=ok
        off=$(stub_qemu "$dir" log-all ",migratable=off")
        state=$(stub_qemu "$dir" log-all ",migratable=on")
        log=$(stub_qemu "$dir" none ",migratable=on" -only-migratable)
        grep -q 'has migratable=off' <<<"$off" || r=FAIL
        grep -q 'does not support VHOST_USER_PROTOCOL_F_DEVICE_STATE' <<<"$state" || r=FAIL
        grep -q 'lacks VHOST_F_LOG_ALL' <<<"$log" || r=FAIL
        RESULT[$sc]="$r: off: ${off:0:160}; no device state: ${state:0:160}; no LOG_ALL (-only-migratable): ${log:0:200}"
        return
        ;;
    esac
    # migrate: the session names the export by --export-name and the
    # destination finds the files by path (another path, the same tree).
    local dargs=()
    case $sc in migrate|refused) dargs=("$dir/vu.sock" "$dir/share" --export-name share --migration-mode find-paths) ;; esac
    daemon "$dir" 1 "${dargs[@]}" || { RESULT[$sc]="FAIL: daemon did not start"; return; }
    local chr="socket,id=vu,path=$dir/vu.sock"
    # The -device value of lib.sh's line (migrate() reuses it on the destination).
    vhost_9p_args "$dir/vu.sock"
    local dev=${VHOST_9P_ARGS[3]}
    # 0006's property; stock QEMU has none (and blocks migration).
    case $sc in migrate|refused) [ -z "$MIGRATABLE" ] || dev="$dev,$MIGRATABLE" ;; esac
    local extra=(-chardev "$chr" -device "$dev") paused=()
    case $sc in
        # The vhost-user messages QEMU sends, in order (qemu-trace.log).
        migrate|refused) extra+=(-trace vhost_user_write -D "$dir/qemu-trace.log") ;;
        early) paused=(-S) ;;
        start) extra=(-chardev "$chr,reconnect-ms=500" -device "$dev") ;;
        restart)
            paused=(-S)
            extra=(-chardev "$chr,reconnect-ms=500" -device pcie-root-port,id=rp0,chassis=1) ;;
    esac
    log "$sc: booting"
    boot() { # console qmp-socket log [args...]: QEMU in the background, QPID
        local con=$1 qs=$2 ql=$3
        shift 3
        setsid "$qemu" -nodefaults -no-user-config -accel tcg \
            -machine q35,memory-backend=mem -cpu max -m 512M -smp 1 -display none -no-reboot \
            -object memory-backend-memfd,id=mem,size=512M,share=on \
            -serial "file:$con" -monitor none -qmp "unix:$qs,server=on,wait=off" \
            -L /usr/share/qemu -L /usr/share/seabios "$@" \
            -kernel "$KERNEL" -initrd "$out/initrd.img" \
            -append "console=ttyS0 loglevel=4 panic=-1 no_timer_check REPRO=$sc" \
            >"$ql" 2>&1 &
        QPID=$!
    }
    boot "$dir/console.log" "$dir/qmp.sock" "$dir/qemu.log" "${paused[@]}" "${extra[@]}"
    pids+=("$QPID")
    local i=0
    until [ -S "$dir/qmp.sock" ]; do
        alive || break
        [ $i -lt 100 ] || break
        sleep 0.1
        i=$((i + 1))
    done
    case $sc in
    query)
        if ! wait_for "$dir/console.log" '^REPRO-READY' 120; then
            RESULT[$sc]="FAIL: no guest (QEMU: $(last_words "$dir"))"
        else
            local path ans
            path=$(qmp "$dir/qmp.sock" '{"execute":"x-query-virtio"}' \
                | python3 -c 'import json,sys; r=json.load(sys.stdin)["return"]; print(r[0]["path"] if r else "")')
            ans=$(qmp "$dir/qmp.sock" "{\"execute\":\"x-query-virtio-status\",\"arguments\":{\"path\":\"$path\"}}" 2>&1)
            sleep 1
            echo "$ans" >"$dir/answer.json"
            if alive && grep -q '"vhost-dev"' <<<"$ans"; then
                RESULT[$sc]="ok: x-query-virtio-status answered ($(python3 -c 'import json,sys; r=json.load(sys.stdin)["return"]; print("started %s, vhost-dev nvqs %s" % (r["started"], r["vhost-dev"]["nvqs"]))' <<<"$ans"))"
            else
                RESULT[$sc]="FAIL: QEMU $(alive && echo 'answered without vhost-dev' || echo "died ($(wait "$QPID"; echo "exit $?")): $(last_words "$dir")")"
            fi
        fi
        ;;
    early)
        sleep 1
        kill -KILL -- "-$DPID"
        sleep 3
        if alive && qmp "$dir/qmp.sock" '{"execute":"query-status"}' | grep -q '"status"'; then
            RESULT[$sc]="ok: QEMU runs on after the back-end died before the driver started"
        else
            RESULT[$sc]="FAIL: QEMU died ($(wait "$QPID"; echo "exit $?")): $(last_words "$dir")"
        fi
        ;;
    rebind)
        if ! wait_for "$dir/console.log" '^REPRO-READY' 120; then
            RESULT[$sc]="FAIL: no guest (QEMU: $(last_words "$dir"))"
        else
            kill -KILL -- "-$DPID"
            wait_for "$dir/console.log" '^REPRO-END' 60
            # At its end the guest powers off: QEMU exits 0 (-no-reboot).
            if grep -q '^REPRO-END' "$dir/console.log" && { alive || { wait "$QPID"; [ $? -eq 0 ]; }; }; then
                RESULT[$sc]="ok: $(grep -E '^REPRO-(UN|RE)BOUND' "$dir/console.log" | tr -d '\r' | tr '\n' ' ')"
            else
                RESULT[$sc]="FAIL: QEMU died ($(alive || { wait "$QPID"; echo "exit $?"; })): $(last_words "$dir")"
            fi
        fi
        ;;
    start)
        if wait_for "$dir/console.log" '^REPRO-MOUNTED' 120; then
            RESULT[$sc]="ok: booted and mounted with reconnect-ms"
        else
            RESULT[$sc]="FAIL: QEMU $(alive && echo 'runs but the guest did not mount' || echo "exited ($(wait "$QPID"; echo "exit $?")): $(last_words "$dir")")"
        fi
        ;;
    restart)
        sleep 2 # the chardev connects in the background
        qmp "$dir/qmp.sock" "{\"execute\":\"device_add\",\"arguments\":{\"driver\":\"vhost-user-test-device-pci\",\"bus\":\"rp0\",\"chardev\":\"vu\",\"virtio-id\":9,\"num_vqs\":1,\"config_size\":7,\"vq_size\":1024}}" >"$dir/device_add.json"
        qmp "$dir/qmp.sock" '{"execute":"cont"}' >/dev/null
        if ! wait_for "$dir/console.log" '^REPRO-READY' 120; then
            RESULT[$sc]="FAIL: no guest ($(cat "$dir/device_add.json"); QEMU: $(last_words "$dir"))"
        else
            kill -KILL -- "-$DPID"
            sleep 1
            daemon "$dir" 2 || { RESULT[$sc]="FAIL: daemon 2 did not start"; cleanup; return; }
            if wait_for "$dir/server-2.log" 'acked features' 30 && sleep 2 && alive; then
                RESULT[$sc]="ok: the new daemon got the device (\"driver acked features\")"
            else
                RESULT[$sc]="FAIL: QEMU $(alive && echo 'runs, but the new daemon never got the device' || echo "died ($(wait "$QPID"; echo "exit $?")): $(last_words "$dir")")"
            fi
        fi
        ;;
    migrate|refused)
        migrate "$dir" "$dev" "$sc"
        ;;
    esac
    cleanup
}

# 0007: the guest migrates to a second QEMU + daemon pair on this machine.
# The QMP sequence: destination started with `-S -incoming defer`;
# `migrate-set-capabilities` return-path on both, destination
# `migrate-incoming {"uri": "unix:SOCK"}`, source `migrate {"uri":
# "unix:SOCK"}`, `query-migrate` until "completed" (or "failed");
# destination `cont`.
migrate() { # dir device migrate|refused
    local dir=$1 dev=$2 sc=$3 src_qpid=$QPID st ans export=share
    # refused: the destination exports another name, so its daemon refuses
    # the device state; the migration fails and the source guest goes on.
    [ "$sc" = migrate ] || export=other
    if ! wait_for "$dir/console.log" '^REPRO-WROTE' 120; then
        RESULT[$sc]="FAIL: no guest (QEMU: $(last_words "$dir"))"
        return
    fi
    mkdir -p "$dir/dst" "$dir/share-dst"
    mount --bind "$dir/share" "$dir/share-dst" || { RESULT[$sc]="FAIL: bind mount"; return; }
    bind_mounts+=("$dir/share-dst")
    daemon "$dir" 2 "$dir/dst/vu.sock" "$dir/share-dst" --export-name "$export" --migration-mode find-paths \
        || { RESULT[$sc]="FAIL: destination daemon did not start"; return; }
    boot "$dir/dst/console.log" "$dir/dst/qmp.sock" "$dir/dst/qemu.log" -S \
        -incoming defer -chardev "socket,id=vu,path=$dir/dst/vu.sock" -device "$dev" \
        -trace vhost_user_write -D "$dir/dst/qemu-trace.log"
    local dst_qpid=$QPID i=0
    pids+=("$dst_qpid")
    until [ -S "$dir/dst/qmp.sock" ]; do
        kill -0 "$dst_qpid" 2>/dev/null || break
        [ $i -lt 300 ] || break
        sleep 0.1
        i=$((i + 1))
    done
    # return-path on both sides: the destination tells the source whether
    # it loaded the state, so a destination that refuses it fails the
    # migration on the source too (and the source guest goes on) instead
    # of the source reporting "completed".
    local cap='{"execute":"migrate-set-capabilities","arguments":{"capabilities":[{"capability":"return-path","state":true}]}}'
    qmp "$dir/dst/qmp.sock" "$cap" >"$dir/dst/caps.json"
    qmp "$dir/dst/qmp.sock" \
        "{\"execute\":\"migrate-incoming\",\"arguments\":{\"uri\":\"unix:$dir/mig.sock\"}}" >"$dir/dst/incoming.json"
    qmp "$dir/qmp.sock" "$cap" >"$dir/caps.json"
    i=0
    until [ -S "$dir/mig.sock" ]; do
        kill -0 "$dst_qpid" 2>/dev/null || break
        [ $i -lt 100 ] || break
        sleep 0.1
        i=$((i + 1))
    done
    if ! kill -0 "$dst_qpid" 2>/dev/null; then
        RESULT[$sc]="FAIL: destination QEMU exited: $(tail -c 400 "$dir/dst/qemu.log" | tr '\n' ' ')"
        return
    fi
    ans=$(qmp "$dir/qmp.sock" "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"unix:$dir/mig.sock\"}}")
    echo "$ans" >"$dir/migrate.json"
    if grep -q '"error"' <<<"$ans"; then
        RESULT[$sc]="FAIL: migrate refused: $(python3 -c 'import json,sys; print(json.load(sys.stdin)["error"]["desc"])' <<<"$ans")"
        return
    fi
    i=0
    while :; do
        ans=$(qmp "$dir/qmp.sock" '{"execute":"query-migrate"}')
        st=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["return"].get("status", "none"))' <<<"$ans")
        case $st in completed|failed|cancelled) break ;; esac
        [ $i -lt 600 ] || break
        sleep 0.5
        i=$((i + 1))
    done
    echo "$ans" >"$dir/query-migrate.json"
    if [ "$sc" = refused ]; then
        local why
        why=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["return"].get("error-desc", ""))' <<<"$ans")
        touch "$dir/share/migrated"
        QPID=$src_qpid
        if [ "$st" = failed ] && wait_for "$dir/console.log" '^REPRO-AFTER' 120 \
            && grep -q '^REPRO-AFTER ok' "$dir/console.log"; then
            RESULT[$sc]="ok: migration failed ($why); destination daemon: $(grep -o 'device state refused.*' "$dir/server-2.log" | head -1); the source guest went on: $(grep -o 'iterations=[0-9]* bad=0' "$dir/console.log")"
        else
            RESULT[$sc]="FAIL: migration $st ($why); source guest: $(grep -E '^REPRO-(AFTER|NO-MARKER|LOOP)' "$dir/console.log" | tr '\n' ' ')"
        fi
        return
    fi
    if [ "$st" != completed ]; then
        RESULT[$sc]="FAIL: migration $st: $(python3 -c 'import json,sys; print(json.load(sys.stdin)["return"].get("error-desc", ""))' <<<"$ans"); destination: $(tail -c 300 "$dir/dst/qemu.log" | tr '\n' ' ')"
        return
    fi
    local times
    times=$(python3 -c 'import json,sys; r=json.load(sys.stdin)["return"]; print("total-time %s ms, downtime %s ms, setup %s ms" % (r.get("total-time"), r.get("downtime"), r.get("setup-time")))' <<<"$ans")
    i=0
    # The destination leaves "inmigrate" for "paused" (-S) once it loaded
    # the state.
    until qmp "$dir/dst/qmp.sock" '{"execute":"query-status"}' | grep -q '"status": "paused"'; do
        [ $i -lt 100 ] || break
        sleep 0.1
        i=$((i + 1))
    done
    qmp "$dir/dst/qmp.sock" '{"execute":"query-status"}' >"$dir/dst/status-before-cont.json"
    qmp "$dir/dst/qmp.sock" '{"execute":"cont"}' >"$dir/dst/cont.json"
    touch "$dir/share/migrated"
    QPID=$dst_qpid
    if wait_for "$dir/dst/console.log" '^REPRO-AFTER' 120 && grep -q '^REPRO-AFTER ok' "$dir/dst/console.log"; then
        RESULT[$sc]="ok: migrated ($times); $(grep -o 'iterations=[0-9]* bad=0' "$dir/dst/console.log") checksummed read+write loops across it; after cont the guest read back its file (old fid and new open) and wrote one"
    else
        RESULT[$sc]="FAIL: after cont ($times): $(grep -E '^REPRO-(AFTER|NO-MARKER|LOOP)' "$dir/dst/console.log" | tr '\n' ' ') destination QEMU: $(tail -c 300 "$dir/dst/qemu.log" | tr '\n' ' ')"
    fi
    QPID=$src_qpid
}

for sc in "${scenarios[@]}"; do
    run "$sc"
done
echo "QEMU: $("$qemu" --version | head -1) ($qemu)"
rc=0
for sc in "${scenarios[@]}"; do
    printf '%-8s %s\n' "$sc" "${RESULT[$sc]}"
    case ${RESULT[$sc]} in ok:*) ;; *) rc=1 ;; esac
done
echo "logs: $out"
exit $rc
}
