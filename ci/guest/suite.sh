#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# The tool-disk suites: xfstests and user workloads in a real Linux guest
# (TCG), one guest per server, side by side, then ONE table.
#
# Usage: ci/guest/suite.sh xfstests|workloads [options]
#   --servers LIST    rows, comma separated, from: qemu, ours-vhost,
#                     ours-vhost-packed, ours-vhost-mapped, ours-socket, diod,
#                     virtiofsd. Defaults: xfstests qemu, ours-vhost,
#                     ours-vhost-packed, ours-vhost-mapped, virtiofsd;
#                     workloads qemu, ours-vhost, ours-vhost-packed,
#                     ours-socket, diod, virtiofsd. (xfstests needs two
#                     shares, so not the socket rows.)
#   --tests SEL       xfstests only: quick (the whole quick group, default),
#                     ci (the subset in ci/guest/xfstests-ci.list) or a comma
#                     list of tests (generic/001,generic/013)
#   --kernel K        6.12 (default) or 6.1
#   --timeout S       per-guest limit (default: xfstests 21600, workloads 7200)
#   --test-timeout S  xfstests: kill a test after S seconds without progress
#                     (default 900)
#   --reps N          workloads: rounds per setting, the table gives the
#                     median (default 3)
#   --settings LIST   workloads: strict, cached or strict,cached (default)
#   --server-bin P    our daemon (default: cargo build --release)
#   --out DIR         keep logs and results here (default: a fresh temp dir)
#   --gate            xfstests: exit 1 when a test fails on one of our rows
#                     and passes on QEMU built-in, or one of our rows does
#                     not finish
#   --report-only     boot nothing: print the table again from --out
#
# Each row's guest mounts the tool disk (ci/guest/tooldisk.sh) and chroots
# into it (ci/guest/guest-suite.sh). See ci/guest/README.md.
set -uo pipefail
{
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=ci/guest/lib.sh
. "$here/lib.sh"
repo=$(cd "$here/../.." && pwd)
CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
export VIRTIO_9P_CI_CACHE=$CACHE
suite=${1:-}
case $suite in
    xfstests|workloads) shift ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "suite.sh: first argument must be xfstests or workloads" >&2; exit 2 ;;
esac
servers=
kernel=6.12
sel=quick
timeout_s=
test_timeout=900
reps=3
settings=strict,cached
server_bin=
out=
gate=0
report_only=0
while [ $# -gt 0 ]; do
    case $1 in
        --servers) servers=$2; shift ;;
        --tests) sel=$2; shift ;;
        --kernel) kernel=$2; shift ;;
        --timeout) timeout_s=$2; shift ;;
        --test-timeout) test_timeout=$2; shift ;;
        --reps) reps=$2; shift ;;
        --settings)
            settings=$2; shift
            case $settings in
                strict|cached|strict,cached|cached,strict) ;;
                *) echo "suite.sh: --settings takes strict, cached or strict,cached" >&2; exit 2 ;;
            esac ;;
        --server-bin) server_bin=$2; shift ;;
        --out) out=$2; shift ;;
        --gate) gate=1 ;;
        --report-only) report_only=1 ;;
        -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
        *) echo "suite.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
if [ "$suite" = xfstests ]; then
    servers=${servers:-qemu,ours-vhost,ours-vhost-packed,ours-vhost-mapped,virtiofsd}
    timeout_s=${timeout_s:-21600}
else
    servers=${servers:-qemu,ours-vhost,ours-vhost-packed,ours-socket,diod,virtiofsd}
    timeout_s=${timeout_s:-7200}
fi
IFS=, read -r -a server_list <<<"$servers"
GUEST_LOG_NAME=suite-$suite

if [ "$report_only" -eq 1 ]; then
    [ -n "$out" ] && [ -d "$out" ] || { echo "suite.sh: --report-only needs --out DIR" >&2; exit 2; }
    out=$(cd "$out" && pwd)
    KERNEL=$(cat "$out/kernel" 2>/dev/null || echo unknown)
else
# ---------------------------------------------------------------- preparation
# Every row runs on the stock QEMU that build-qemu.sh builds (prepare.sh).
bash "$here/prepare.sh" --kernel "$kernel" || { log "preparation failed"; exit 1; }
eval "$(bash "$here/fetch-kernel.sh" "$kernel")" # KERNEL=, INITRAMFS=
eval "$(bash "$here/tooldisk.sh" "$kernel" | tail -1)" # TOOLDISK=
# Stock QEMU >= 10.2 (ci/guest/build-qemu.sh) for every row, QEMU built-in
# and virtiofsd included; Debian's firmware (-L).
QEMU=$GUEST_QEMU_STOCK
QEMU_FW=(-L /usr/share/qemu -L /usr/share/seabios)
[ -x "$QEMU" ] || { log "no stock QEMU at $QEMU (ci/guest/build-qemu.sh)"; exit 1; }
virtiofsd_bin=
case ",$servers," in *,virtiofsd,*)
    virtiofsd_bin=$(bash "$here/install-virtiofsd.sh" | tail -1) || virtiofsd_bin= ;;
esac
[ -n "$out" ] || out=$(mktemp -d "/tmp/virtio-9p-$suite.XXXXXX")
mkdir -p "$out"
out=$(cd "$out" && pwd)
log "logs and results in $out"
echo "$KERNEL" >"$out/kernel"
echo "$("$QEMU" --version | head -1) stock, $QEMU" >"$out/frontend"
echo "$sel" >"$out/selection"
echo "$reps" >"$out/reps"

pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
    pids=()
}
on_exit() {
    cleanup
    local m
    for m in "$out"/*/share-*; do mountpoint -q "$m" && umount "$m"; done 2>/dev/null
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------- our daemon
ours_bin= ours_err=
case ",$servers," in *,ours-*)
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
    [ -z "$ours_bin" ] || [ -x "$ours_bin" ] || { ours_err="no daemon binary at $ours_bin"; ours_bin=; }
    ;;
esac

# --------------------------------------------------------- guest payload
payload=$out/payload
rm -rf "$payload"
mkdir -p "$payload/ci/bin"
# SUITE_KMOD: a directory of guest modules that replace the kernel's in
# the initramfs (ci/guest/build-9p-module.sh: the large-msize 9p modules);
# SUITE_MSIZE (default 512000) and SUITE_MEM (default 1G) go with them,
# and our rows load 9pnet_virtio with max_chain=SUITE_MAX_CHAIN (default
# 32768, which msize 128 MiB needs; 0: the module's default, chains of the
# queue size). The qemu row never does: its device fails on chains over
# 1024 descriptors.
if [ -n "${SUITE_KMOD:-}" ]; then
    mkdir -p "$payload/lib/modules"
    cp "$SUITE_KMOD"/*.ko "$payload/lib/modules/"
fi
install -m 0755 "$here/guest-run.sh" "$payload/ci/run"
install -m 0755 "$here/guest-suite.sh" "$payload/ci/suite"
install -m 0755 "$CACHE/tools/current/relay" "$payload/ci/bin/"
if [ "$suite" = xfstests ]; then
    case $sel in
        quick) echo "-g quick" >"$payload/ci/xfstests.args" ;;
        ci) sed 's/#.*//; s/[[:space:]]//g; /^$/d' "$here/xfstests-ci.list" | tr '\n' ' ' >"$payload/ci/xfstests.args" ;;
        *) tr ',' ' ' <<<"$sel" >"$payload/ci/xfstests.args" ;;
    esac
    cp "$here/xfstests-exclude" "$payload/ci/xfstests.exclude"
else
    # The workload tree: xfstests' pinned source, a fixed 4650-file tree.
    tarball=
    for d in "$repo/../shared/xfstests" /work/shared/xfstests; do
        [ -f "$d/xfstests-63a29724.tar.gz" ] && { tarball=$d/xfstests-63a29724.tar.gz; break; }
    done
    [ -n "${XFSTESTS_TARBALL:-}" ] && tarball=$XFSTESTS_TARBALL
    [ -n "$tarball" ] || { log "no xfstests tarball for the workload tree"; exit 1; }
    cp "$tarball" "$payload/ci/tree.tar.gz"
    # The git repository (the tree committed, then 20 small commits;
    # objects loose, as after git init/add/commit) and the fio file,
    # made once and copied into each row's share.
    tmpl=$out/wl-template
    rm -rf "$tmpl"
    mkdir -p "$tmpl/repo"
    tar xzf "$tarball" -C "$tmpl/repo" --strip-components=1
    (
        cd "$tmpl/repo"
        export GIT_AUTHOR_NAME=ci GIT_AUTHOR_EMAIL=ci@example.invalid GIT_COMMITTER_NAME=ci \
            GIT_COMMITTER_EMAIL=ci@example.invalid GIT_AUTHOR_DATE=2026-01-01T00:00:00Z \
            GIT_COMMITTER_DATE=2026-01-01T00:00:00Z
        git init -q -b main . && git add -A && git commit -q -m "xfstests 63a29724 tree"
        for i in $(seq 1 20); do
            for t in $(seq $((i * 7)) 3 $((i * 7 + 27))); do
                f=tests/generic/$(printf %03d "$t")
                [ -f "$f" ] && echo "# change $i" >>"$f"
            done
            git commit -q -am "change $i"
        done
    ) >"$out/wl-template.log" 2>&1 || { log "making the git repository failed (see $out/wl-template.log)"; exit 1; }
    head -c $((256 << 20)) /dev/urandom >"$tmpl/fio.dat"
fi
(cd "$payload" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) >"$out/payload.cpio.gz"
cat "$INITRAMFS" "$out/payload.cpio.gz" >"$out/initrd.img"

# CPU ticks of the given processes and all their descendants (threads
# included; /proc/PID/stat fields 14 and 15, after the comm).
tree_ticks() { # pid...
    cat /proc/[0-9]*/stat 2>/dev/null | sed 's/^\([0-9]*\) (.*) /\1 /' | awk -v roots=" $* " '
        { pp[$1] = $3; t[$1] = $13 + $14 }
        END {
            for (p in t) {
                q = p
                for (i = 0; i < 64 && q > 1; i++) {
                    if (index(roots, " " q " ")) { sum += t[p]; break }
                    q = pp[q]
                }
            }
            print sum + 0
        }'
}
# Workloads: every 2 s, "epoch steps-done guest-ticks server-ticks hz" in
# DIR/cpu.log, so the report can charge each step the CPU time the guest
# (its QEMU) and the server (every process of it) used, which a shared
# host's load does not inflate the way it inflates wall time.
cpu_poll() { # dir qemu-pid server-pid...
    local dir=$1 q=$2 hz
    shift 2
    hz=$(getconf CLK_TCK)
    while kill -0 "$q" 2>/dev/null; do
        echo "$(date +%s.%N) $(grep -c '^CI-WL ' "$dir/console.log" 2>/dev/null) $(tree_ticks "$q") $( [ $# -gt 0 ] && tree_ticks "$@" || echo 0) $hz"
        sleep 2
    done >>"$dir/cpu.log"
}

# run_row NAME -> $out/NAME/{console.log,server-*.log,status,results/}
run_row() {
    local name=$1 dir=$out/$1
    # xfstests mounts with cache=mmap (strict, as the conformance rows);
    # the workloads add their own cache= for each coherence setting.
    local qemu=$QEMU mode=virtio opts="msize=${SUITE_MSIZE:-512000},access=client" extra=() machine=q35
    [ "$suite" = xfstests ] && opts="$opts,cache=mmap"
    local shares=() tags=() append_extra=
    rm -rf "$dir"
    mkdir -p "$dir"
    if [ "$suite" = xfstests ]; then
        shares=(test scratch); tags=(xfstests-testdev xfstests-scratchdev)
    else
        shares=(work); tags=(work)
        [ "$name" = virtiofsd ] && tags=(strict cached)
    fi
    local s
    for s in "${shares[@]}"; do
        mkdir -p "$dir/share-$s"
        # mapped-xattr rows: tmpfs (see run.sh: ext4's one xattr block).
        case $name in *-mapped) mount -t tmpfs -o size=2g,mode=0755 "virtio-9p-$name-$s" "$dir/share-$s" ;; esac
    done
    if [ "$suite" = workloads ]; then
        mkdir -p "$dir/share-work/wl"
        cp -a "$tmpl/repo" "$dir/share-work/wl/repo"
        ln "$tmpl/fio.dat" "$dir/share-work/wl/fio.dat"
    fi
    guest_vhost_ram "${SUITE_MEM:-1G}"
    local serial=(-device virtio-serial-pci -chardev "socket,id=p9c,path=$dir/9p.sock"
        -device virtserialport,chardev=p9c,name=ninep)
    local i pid sock tag
    case $name in
    qemu)
        for i in "${!shares[@]}"; do
            extra+=(-virtfs "local,path=$dir/share-${shares[$i]},mount_tag=${tags[$i]},security_model=none,id=fs$i")
        done
        ;;
    diod)
        [ ${#shares[@]} -eq 1 ] || { echo "not available: one share only over the socket transport" >"$dir/status"; return; }
        diod -f -n -N -l "$dir/9p.sock" -e "$dir/share-work" >"$dir/server-work.log" 2>&1 &
        pid=$!; pids+=("$pid")
        wait_for_socket "$dir/9p.sock" "$pid" || { echo "server failed: diod" >"$dir/status"; cleanup; return; }
        mode=unix; opts="$opts,uname=root,aname=$dir/share-work"
        extra=("${serial[@]}")
        ;;
    ours-socket)
        [ -n "$ours_bin" ] || { echo "not available: $ours_err" >"$dir/status"; return; }
        [ ${#shares[@]} -eq 1 ] || { echo "not available: one share only over the socket transport" >"$dir/status"; return; }
        RUST_LOG=${RUST_LOG:-info} "$ours_bin" --listen "unix:$dir/9p.sock" --shared-dir "$dir/share-work" \
            >"$dir/server-work.log" 2>&1 &
        pid=$!; pids+=("$pid")
        wait_for_socket "$dir/9p.sock" "$pid" || { echo "server failed: virtio-9p-server --listen" >"$dir/status"; cleanup; return; }
        mode=unix; opts="$opts,uname=root"
        extra=("${serial[@]}")
        ;;
    ours-vhost|ours-vhost-packed|ours-vhost-mapped)
        [ -n "$ours_bin" ] || { echo "not available: $ours_err" >"$dir/status"; return; }
        machine=$GUEST_VHOST_MACHINE
        vhost_9p_daemon_flags "$name"
        extra=("${GUEST_VHOST_RAM[@]}")
        for i in "${!shares[@]}"; do
            sock=$dir/vu-$i.sock tag=${tags[$i]}
            RUST_LOG=${RUST_LOG:-info} "$ours_bin" --socket-path "$sock" --shared-dir "$dir/share-${shares[$i]}" \
                --tag "$tag" "${VHOST_9P_DAEMON_FLAGS[@]}" >"$dir/server-${shares[$i]}.log" 2>&1 &
            pid=$!; pids+=("$pid")
            wait_for_socket "$sock" "$pid" || { echo "server failed: virtio-9p-server for $tag" >"$dir/status"; cleanup; return; }
            vhost_9p_args --id "vu$i" --tag "$tag" "$sock"
            extra+=("${VHOST_9P_ARGS[@]}")
        done
        ;;
    virtiofsd)
        [ -n "$virtiofsd_bin" ] || { echo "not available: virtiofsd did not install" >"$dir/status"; return; }
        machine=$GUEST_VHOST_MACHINE
        mode=virtiofs; opts=
        extra=("${GUEST_VHOST_RAM[@]}")
        # Strict: cache=never (--allow-mmap: shared mmap as 9p's
        # cache=mmap allows); cached: cache=auto. Two daemons on one
        # directory for the workloads, one per tag.
        for i in "${!tags[@]}"; do
            sock=$dir/vfs-$i.sock tag=${tags[$i]}
            local cache=never sharedir=$dir/share-${shares[$i]:-work}
            [ "$tag" = cached ] && cache=auto
            "$virtiofsd_bin" --socket-path "$sock" --shared-dir "$sharedir" --cache "$cache" \
                --allow-mmap --xattr --allow-direct-io >"$dir/server-$tag.log" 2>&1 &
            pid=$!; pids+=("$pid")
            wait_for_socket "$sock" "$pid" || { echo "server failed: virtiofsd for $tag" >"$dir/status"; cleanup; return; }
            extra+=(-chardev "socket,id=vfs$i,path=$sock"
                -device "vhost-user-fs-pci,chardev=vfs$i,tag=$tag,queue-size=1024")
        done
        append_extra="CI_SRC_CACHED=cached"
        ;;
    *) echo "not available: unknown server '$name'" >"$dir/status"; return ;;
    esac
    # The results disk: ext4, written by the guest, read back with debugfs.
    truncate -s 2G "$dir/results.img"
    mkfs.ext4 -q -F -L ci-results "$dir/results.img" >/dev/null
    local src=${tags[0]}
    case $name in ours-vhost*)
        [ -n "${SUITE_KMOD:-}" ] && [ "${SUITE_MAX_CHAIN:-32768}" -gt 0 ] &&
            append_extra="$append_extra CI_MAX_CHAIN=${SUITE_MAX_CHAIN:-32768}" ;;
    esac
    local append="console=ttyS0 loglevel=4 panic=-1 CI_MODE=$mode CI_SRC=$src CI_OPTS=$opts CI_TESTS=$suite CI_XFS_TEST_TIMEOUT=$test_timeout CI_WL_REPS=$reps CI_WL_SETTINGS=$settings $append_extra"
    log "$name: booting guest (timeout ${timeout_s}s)"
    local t0 rc
    t0=$(date +%s)
    timeout --kill-after=10 "$timeout_s" "$qemu" -nodefaults -no-user-config -accel tcg \
        -machine "$machine" -cpu max -m "${SUITE_MEM:-1G}" -smp 1 -display none -no-reboot \
        -serial "file:$dir/console.log" -monitor none \
        -kernel "$KERNEL" -initrd "$out/initrd.img" -append "$append" \
        -drive "file=$TOOLDISK,if=none,id=tool,format=raw,snapshot=on" -device ide-hd,drive=tool,bus=ide.0 \
        -drive "file=$dir/results.img,if=none,id=res,format=raw" -device ide-hd,drive=res,bus=ide.1 \
        "${QEMU_FW[@]}" "${extra[@]}" >"$dir/qemu.log" 2>&1 &
    # In the background, so a signal to this script ends the guest too.
    local qpid=$!
    local cpoll= p servers=()
    if [ "$suite" = workloads ]; then
        for p in "${pids[@]}"; do servers+=("$p"); done
        cpu_poll "$dir" "$qpid" "${servers[@]}" &
        cpoll=$!
    fi
    pids+=("$qpid")
    wait "$qpid"
    rc=$?
    [ -z "$cpoll" ] || wait "$cpoll" 2>/dev/null
    echo "$(( $(date +%s) - t0 ))" >"$dir/seconds"
    cleanup
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        echo "guest timed out after ${timeout_s}s" >"$dir/status"
    elif [ $rc -ne 0 ]; then
        echo "qemu exited with $rc: $(tail -c 300 "$dir/qemu.log" | tr '\n' ' ')" >"$dir/status"
    elif ! grep -q '^CI-DONE' "$dir/console.log"; then
        echo "guest did not finish: $(grep -m1 -E 'CI-MOUNT-FAILED|Kernel panic' "$dir/console.log" || echo 'see console.log')" >"$dir/status"
    else
        echo ok >"$dir/status"
    fi
    # -c (catastrophic mode: no bitmaps) reads the disk of a guest killed
    # mid-run too, whose ext4 was never unmounted.
    debugfs -c -R "rdump /out $dir" "$dir/results.img" >/dev/null 2>&1 && mv "$dir/out" "$dir/results" 2>/dev/null
    rm -f "$dir/results.img"
    for s in "${shares[@]}"; do
        mountpoint -q "$dir/share-$s" && umount "$dir/share-$s"
        rm -rf "${dir:?}/share-$s"
    done
}

for s in "${server_list[@]}"; do
    run_row "$s"
done
cleanup
rm -f "$out/initrd.img"
[ "$suite" = workloads ] && rm -rf "$tmpl"
fi # report_only

# ---------------------------------------------------------------- report
for s in "${server_list[@]}"; do
    [ -f "$out/$s/console.log" ] && tr -d '\r' <"$out/$s/console.log" >"$out/$s/console.txt"
done
status_of() { cat "$out/$1/status" 2>/dev/null || echo "not run"; }
kname=$(basename "$KERNEL" | sed 's/^vmlinuz-//')
gate_fail=0

if [ "$suite" = xfstests ]; then
    # "<test> <pass|fail|notrun>" per row.
    for s in "${server_list[@]}"; do
        sed -n 's/^XFS-RESULT \([^ ]*\) \(pass\|fail\|notrun\)$/\1 \2/p' "$out/$s/console.txt" 2>/dev/null >"$out/$s/xfstests.txt"
        # A guest that did not get to check's summary: the per-test lines
        # so far, and the test that was running counts as failed.
        if [ ! -s "$out/$s/xfstests.txt" ] && [ -f "$out/$s/console.txt" ]; then
            awk '$1 == "XFS" && $2 ~ /^[a-z0-9]+\/[0-9]+$/ {
                    t = $2; $1 = $2 = ""
                    if ($0 ~ /expunged/) next
                    st = ($0 ~ /not run/) ? "notrun" : ($0 ~ /mismatch|failed/) ? "fail" : ($0 ~ /^ *[0-9]+s/) ? "pass" : ""
                    if (st != "") { print t, st; seen[t] = 1 }
                 }
                 $1 == "XFS-RUNNING" { last = $2 }
                 END { if (last != "" && !(last in seen)) print last, "fail" }' \
                "$out/$s/console.txt" >"$out/$s/xfstests.txt"
        fi
    done
    known=$here/xfstests-known
    nexcl=$(sed 's/#.*//' "$here/xfstests-exclude" | grep -c '[a-z]' || true)
    printf '\nxfstests in the guest (kernel %s, TCG, selection %s, %s excluded, %s)\n' \
        "$kname" "$(awk -F, '{ print (NF > 4 ? NF " tests from " $1 : $0) }' "$out/selection" 2>/dev/null)" "$nexcl" "$(date -u +%Y-%m-%dT%H:%MZ)"
    printf 'frontend of every row: %s\n' "$(cat "$out/frontend" 2>/dev/null || echo unknown)"
    fmt='%-17s | %5s | %6s | %6s | %6s | %7s | %s\n'
    printf "$fmt" server ran passed failed notrun seconds notes
    printf "$fmt" ----------------- ----- ------ ------ ------ ------- -----
    for s in "${server_list[@]}"; do
        st=$(status_of "$s")
        f=$out/$s/xfstests.txt
        ran=$(wc -l <"$f" 2>/dev/null || echo 0)
        pa=$(grep -c ' pass$' "$f" 2>/dev/null || true)
        fa=$(grep -c ' fail$' "$f" 2>/dev/null || true)
        nr=$(grep -c ' notrun$' "$f" 2>/dev/null || true)
        notes=
        [ "$st" = ok ] || notes=$st
        grep -q '^XFS-WATCHDOG' "$out/$s/console.txt" 2>/dev/null \
            && notes="${notes:+$notes; }watchdog killed: $(sed -n 's/^XFS-WATCHDOG killed \([^ ]*\) .*/\1/p' "$out/$s/console.txt" | tr '\n' ' ')"
        case $s in virtiofsd) notes="${notes:+$notes; }virtio-fs (reference, not gated)" ;; esac
        printf "$fmt" "$s" "$ran" "${pa:-0}" "${fa:-0}" "${nr:-0}" "$(cat "$out/$s/seconds" 2>/dev/null || echo -)" "$notes"
    done
    echo
    for s in "${server_list[@]}"; do
        f=$out/$s/xfstests.txt
        [ -s "$f" ] || continue
        echo "failures on $s: $(awk '$2 == "fail" { printf "%s ", $1 }' "$f")"
    done
    q=$out/qemu/xfstests.txt
    if [ -s "$q" ]; then
        echo
        for s in "${server_list[@]}"; do
            [ "$s" = qemu ] && continue
            f=$out/$s/xfstests.txt
            [ -s "$f" ] || continue
            regress=$(awk 'NR == FNR { st[$1] = $2; next } $2 == "fail" && st[$1] == "pass" { print $1 }' "$q" "$f")
            n=$(printf '%s' "$regress" | grep -c . || true)
            echo "failures on $s that QEMU built-in passes: $n${regress:+ ($(echo $regress))}"
            case $s in ours-*) [ "$n" -eq 0 ] || gate_fail=1 ;; esac
            other=$(awk 'NR == FNR { st[$1] = $2; next } $2 == "fail" && st[$1] != "pass" && st[$1] != "fail" { print $1 }' "$q" "$f")
            [ -n "$other" ] && echo "failures on $s that QEMU built-in did not run: $(echo $other)"
        done
        # Failures shared with QEMU built-in, each with who is at fault.
        both=$(for s in "${server_list[@]}"; do
            case $s in ours-*) ;; *) continue ;; esac
            [ -s "$out/$s/xfstests.txt" ] || continue
            awk 'NR == FNR { st[$1] = $2; next } $2 == "fail" && st[$1] == "fail" { print $1 }' "$q" "$out/$s/xfstests.txt"
        done | sort -u)
        if [ -n "$both" ]; then
            echo
            echo "failures on QEMU built-in and on one of our rows (ci/guest/xfstests-known says who is at fault):"
            for t in $both; do
                rows=$(for s in "${server_list[@]}"; do
                    case $s in ours-*) grep -qx "$t fail" "$out/$s/xfstests.txt" 2>/dev/null && printf '%s ' "$s" ;; esac
                done)
                why=$(sed -n "s|^$t[[:space:]]\{1,\}||p" "$known" 2>/dev/null | head -1)
                printf '  %-12s %s[%s]\n' "$t" "${why:-NOT CLASSIFIED }${why:+ }" "${rows% }"
            done
        fi
    fi
    for s in "${server_list[@]}"; do
        case $s in ours-*) ;; *) continue ;; esac
        st=$(status_of "$s")
        case $st in "not available:"*) echo "$s: $st"; continue ;; esac
        if [ "$st" != ok ] || ! grep -q '^CI-MOUNT ' "$out/$s/console.txt" 2>/dev/null; then
            echo "$s: $st (no finished xfstests run)"
            gate_fail=1
        fi
    done
    {
        for s in "${server_list[@]}"; do
            f=$out/$s/xfstests.txt
            printf '%s\tstatus=%s\tran=%s\tpassed=%s\tfailed=%s\tnotrun=%s\n' "$s" "$(status_of "$s")" \
                "$(wc -l <"$f" 2>/dev/null || echo 0)" "$(grep -c ' pass$' "$f" 2>/dev/null)" \
                "$(grep -c ' fail$' "$f" 2>/dev/null)" "$(grep -c ' notrun$' "$f" 2>/dev/null)"
        done
    } >"$out/summary.tsv"
else
    # "CI-WL <setting> <step> <rep> <ms|fail>" -> medians per row.
    steps="unpack find_stat read_all cp_a rm_rf git_status git_log_p fio_randread_4k fio_seqread_1m fio_randwrite_4k"
    declare -A MED
    for s in "${server_list[@]}"; do
        for setting in strict cached; do
            for step in $steps; do
                v=$(awk -v st="$setting" -v sp="$step" '$1 == "CI-WL" && $2 == st && $3 == sp { print $5 }' \
                    "$out/$s/console.txt" 2>/dev/null | sort -n | awk '
                    /fail/ { bad = 1 } { v[NR] = $1 } END {
                        if (bad || NR == 0) { print (bad ? "fail" : "-"); exit }
                        printf "%.2f", v[int((NR + 1) / 2)] / 1000 }')
                MED[$s,$setting,$step]=$v
            done
        done
    done
    ratio() { awk -v v="$1" -v b="$2" 'BEGIN { if (v !~ /^[0-9.]+$/ || b !~ /^[0-9.]+$/ || b + 0 == 0) print "-"; else printf "%.2f", v / b }'; }
    printf '\nworkloads in the guest (kernel %s, TCG, 1 vCPU, median of %s, seconds; (x qemu / x virtiofsd), %s)\n' \
        "$kname" "$(cat "$out/reps" 2>/dev/null || echo 3)" "$(date -u +%Y-%m-%dT%H:%MZ)"
    printf 'frontend of every row: %s\n' "$(cat "$out/frontend" 2>/dev/null || echo unknown)"
    printf 'strict: 9p cache=mmap, virtio-fs cache=never; cached: 9p cache=loose, virtio-fs cache=auto\n\n'
    hdr="| setting | workload |"; sep="|---|---|"
    for s in "${server_list[@]}"; do hdr="$hdr $s |"; sep="$sep---|"; done
    echo "$hdr"; echo "$sep"
    for setting in strict cached; do
        for step in $steps; do
            line="| $setting | $step |"
            for s in "${server_list[@]}"; do
                v=${MED[$s,$setting,$step]}
                cell=$v
                if [ "$s" != qemu ] && [ "$s" != virtiofsd ]; then
                    cell="$v ($(ratio "$v" "${MED[qemu,$setting,$step]:--}") / $(ratio "$v" "${MED[virtiofsd,$setting,$step]:--}"))"
                fi
                line="$line $cell |"
            done
            echo "$line"
        done
    done
    echo
    # CPU seconds per step (guest QEMU + server), from cpu.log: step k is
    # charged what was used between the polls that first saw k-1 and k
    # steps done; a step the poll skipped over is left out. Median over
    # the rounds; in brackets the server's part.
    declare -A CPU
    have_cpu=0
    for s in "${server_list[@]}"; do
        [ -s "$out/$s/cpu.log" ] && [ -f "$out/$s/console.txt" ] || continue
        have_cpu=1
        while read -r setting step tot srv; do
            CPU[$s,$setting,$step]="$tot $srv"
        done < <(awk '
            NR == FNR { if ($1 == "CI-WL") { n++; set[n] = $2; stp[n] = $3 } next }
            # A poll taken before the step count existed has a field less.
            NF < 5 || $5 == 0 { next }
            { c = $2; if (!(c in at)) { at[c] = ($3 + $4) / $5; sv[c] = $4 / $5 } }
            END {
                for (k = 1; k <= n; k++) {
                    if (!((k - 1) in at) || !(k in at)) continue
                    key = set[k] " " stp[k]
                    m[key]++; tv[key, m[key]] = at[k] - at[k - 1]; ss[key, m[key]] = sv[k] - sv[k - 1]
                }
                for (key in m) {
                    # median by insertion sort (at most a handful of rounds)
                    for (i = 1; i <= m[key]; i++) { a[i] = tv[key, i]; b[i] = ss[key, i] }
                    for (i = 2; i <= m[key]; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { x = a[j]; a[j] = a[j - 1]; a[j - 1] = x; y = b[j]; b[j] = b[j - 1]; b[j - 1] = y }
                    h = int((m[key] + 1) / 2)
                    printf "%s %.1f %.1f\n", key, a[h], b[h]
                }
            }' "$out/$s/console.txt" "$out/$s/cpu.log")
    done
    if [ "$have_cpu" -eq 1 ]; then
        printf 'CPU seconds per step, guest QEMU + server (the server alone in brackets), median; (x qemu / x virtiofsd)\n\n'
        echo "$hdr"; echo "$sep"
        for setting in strict cached; do
            for step in $steps; do
                line="| $setting | $step |"
                for s in "${server_list[@]}"; do
                    read -r tot srv <<<"${CPU[$s,$setting,$step]:--}"
                    # A step that failed did not do the work: no figure.
                    [ "${MED[$s,$setting,$step]}" = fail ] && tot=fail
                    cell=$tot
                    case $tot in -|fail) ;; *) [ "$s" = qemu ] || cell="$tot [$srv]" ;; esac
                    if [ "$s" != qemu ] && [ "$s" != virtiofsd ]; then
                        read -r qt _ <<<"${CPU[qemu,$setting,$step]:--}"
                        read -r vt _ <<<"${CPU[virtiofsd,$setting,$step]:--}"
                        cell="$cell ($(ratio "$tot" "$qt") / $(ratio "$tot" "$vt"))"
                    fi
                    line="$line $cell |"
                done
                echo "$line"
            done
        done
        echo
    fi
    for s in "${server_list[@]}"; do
        st=$(status_of "$s")
        [ "$st" = ok ] || echo "$s: $st"
        grep -h '^CI-WL-ERR' "$out/$s/console.txt" 2>/dev/null | sort -u | head -5 | sed "s/^/$s: /"
    done
    {
        for s in "${server_list[@]}"; do
            for setting in strict cached; do
                for step in $steps; do
                    printf '%s\t%s\t%s\t%s\n' "$s" "$setting" "$step" "${MED[$s,$setting,$step]}"
                done
            done
        done
    } >"$out/summary.tsv"
fi
echo "logs: $out"
if [ "$gate" -eq 1 ] && [ "$gate_fail" -ne 0 ]; then
    echo "guest $suite: FAILED (see above)"
    exit 1
fi
exit 0
}
