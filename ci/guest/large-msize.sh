#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# The large-msize row: boots the 6.12 guest with our 9pnet_virtio.ko
# (ci/guest/linux-9p, built by build-9p-module.sh) in place of the
# kernel's, and has it mount 9p at several msizes up to 128 MiB from our
# vhost-user daemon (split and packed rings), beside QEMU's built-in 9p
# at its own largest msize and virtiofsd. One guest per row; the guest
# remounts for each msize (large-msize-guest.sh). Prints one table:
# dd/fio MiB/s and host CPU seconds per GiB (QEMU plus the server, sampled
# at marks the guest prints around each transfer), then correctness.
#
# Usage: ci/guest/large-msize.sh [options]
#   --rows LIST     from: ours-vhost (split ring), ours-vhost-packed, qemu,
#                   virtiofsd (default: ours-vhost)
#   --msizes LIST   msizes for our rows (default 512000,134217728)
#   --qemu-msize LIST  msizes for the qemu row (default 512000: its queue
#                   has 128 entries, and without max_chain the transport
#                   keeps chains within the queue size; a larger msize is
#                   clamped to it)
#   --max-chain N   9pnet_virtio.max_chain for our rows (default 32768,
#                   which 128 MiB needs; 0: the module's default, the
#                   queue size); never for the qemu row, whose device
#                   fails on chains over 1024 descriptors
#   --tests LIST    from: posix, pjdfstest, dd, fio, ceiling (default posix,dd)
#   --mib N         dd size in MiB, also the file read back (default 256)
#   --bs KIB        dd block size in KiB (default 1024)
#   --direct-mib M  block size of the O_DIRECT dd pair (default 128)
#   --mem MIB       guest RAM (default 2048)
#   --stock-module  keep the kernel's own 9pnet_virtio (for comparison)
#   --timeout S     per-guest limit (default 1800)
#   --server-bin P  our daemon (default: cargo build --release)
#   --out DIR       logs (default: a fresh temp dir)
#   --server-log L  our daemon's --log-level (default info; debug logs
#                   every request, e.g. to count Tread sizes)
#   --cpu MODEL     QEMU -cpu of every guest (default max,-erms,-fsrm:
#                   with ERMS/FSRM the guest kernel copies to user space
#                   with 'rep movsb', which TCG runs one byte per
#                   iteration; the buffered read then costs ~5 s of
#                   QEMU CPU per GiB in that copy alone, ten times the
#                   9p transfer; without them it uses 'rep movsq')
#   --diag          print the guest's readahead window, /proc/vmstat
#                   deltas and 9p requests around the buffered dd read
#                   (CI-DIAG lines in each row's console.txt)
#   --gate          exit 1 on a POSIX failure, a pjdfstest failure the
#                   512000 mount passes, a failed mount or transfer, a
#                   mount that did not get the msize it asked for, a
#                   corrupted write, or (any row) a device QEMU stopped
set -uo pipefail
{
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=ci/guest/lib.sh
. "$here/lib.sh"
repo=$(cd "$here/../.." && pwd)
CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
export VIRTIO_9P_CI_CACHE=$CACHE
rows=ours-vhost msizes=512000,134217728 qemu_msize=512000 max_chain=32768 tests=posix,dd
mib=256 bs=1024 dmib=128 mem=2048 stock=0 timeout_s=1800 server_bin= out= gate=0
server_log=info diag=0 cpu=max,-erms,-fsrm
while [ $# -gt 0 ]; do
    case $1 in
        --rows) rows=$2; shift ;;
        --msizes) msizes=$2; shift ;;
        --qemu-msize) qemu_msize=$2; shift ;;
        --max-chain) max_chain=$2; shift ;;
        --tests) tests=$2; shift ;;
        --mib) mib=$2; shift ;;
        --bs) bs=$2; shift ;;
        --direct-mib) dmib=$2; shift ;;
        --mem) mem=$2; shift ;;
        --stock-module) stock=1 ;;
        --timeout) timeout_s=$2; shift ;;
        --server-bin) server_bin=$2; shift ;;
        --out) out=$2; shift ;;
        --server-log) server_log=$2; shift ;;
        --diag) diag=1 ;;
        --cpu) cpu=$2; shift ;;
        --gate) gate=1 ;;
        -h|--help) sed -n '2,47p' "$0"; exit 0 ;;
        *) echo "large-msize: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
has_test() { case ",$tests," in *",$1,"*) return 0 ;; esac; return 1; }

bash "$here/prepare.sh" --kernel 6.12 --no-vhost-qemu >&2 || { log "preparation failed"; exit 1; }
eval "$(bash "$here/fetch-kernel.sh" 6.12)" # KERNEL=, INITRAMFS=
KMOD=
if [ "$stock" -eq 0 ]; then
    eval "$(bash "$here/build-9p-module.sh" 6.12)" || { log "module build failed"; exit 1; }
fi
# Every row runs on the stock QEMU >= 10.2 that build-qemu.sh made
# (vhost-user-test-device-pci), as run.sh's rows do.
QEMU=$(bash "$here/build-qemu.sh" --stock-only | tail -1) || { log "build-qemu.sh failed"; exit 1; }
virtiofsd_bin=
case ",$rows," in *,virtiofsd,*) virtiofsd_bin=$(bash "$here/install-virtiofsd.sh" 2>/dev/null | tail -1) ;; esac
tools=$CACHE/tools/current
PJD=$CACHE/pjdfstest/bin/pjdfstest

[ -n "$out" ] || out=$(mktemp -d /tmp/virtio-9p-large-msize.XXXXXX)
mkdir -p "$out"
out=$(cd "$out" && pwd)
log "logs in $out"

ours_bin=
case ",$rows," in *,ours-*)
    if [ -n "$server_bin" ]; then
        ours_bin=$server_bin
    else
        tdir=${CARGO_TARGET_DIR:-$repo/target}
        (cd "$repo" && CARGO_TARGET_DIR=$tdir cargo build --release --quiet -p virtio-9p-server --features daemon) \
            >"$out/server-build.log" 2>&1 && ours_bin=$tdir/release/virtio-9p-server
    fi
    ;;
esac

# ---------------------------------------------------------------- payload
# Appended after the base initramfs: the kernel unpacks the archives in
# order, so our lib/modules/9pnet_virtio.ko and 9p.ko replace the kernel's and the
# base init (ci/guest/init) loads it in the usual module order.
pl=$out/payload
rm -rf "$pl"
mkdir -p "$pl"/{ci/bin,etc,lib64,lib/x86_64-linux-gnu,lib/modules}
install -m 0755 "$here/large-msize-guest.sh" "$pl/ci/run"
install -m 0755 "$tools/posix-suite" "$pl/ci/bin/"
[ -n "$KMOD" ] && cp "$KMOD/9pnet_virtio.ko" "$KMOD/9p.ko" "$pl/lib/modules/"
copy_with_libs() { # binary name
    install -m 0755 "$1" "$pl/ci/bin/$2"
    ldd "$1" | awk '/=> \//{print $3} /^\t\/lib64/{print $1}' | while read -r lib; do
        case $lib in
            /lib64/*) cp -L "$lib" "$pl/lib64/" ;;
            *) cp -L "$lib" "$pl/lib/x86_64-linux-gnu/" ;;
        esac
    done
}
has_test pjdfstest && copy_with_libs "$PJD" pjdfstest
has_test fio && command -v fio >/dev/null && copy_with_libs "$(command -v fio)" fio
cat >"$pl/etc/passwd" <<'PW'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
pjdfstest:x:1001:1001:pjdfstest:/nonexistent:/bin/false
tests:x:1002:1002:tests:/nonexistent:/bin/false
PW
cat >"$pl/etc/group" <<'GR'
root:x:0:
nogroup:x:65534:
pjdfstest:x:1001:pjdfstest
tests:x:1002:tests
GR
printf 'passwd: files\ngroup: files\nshadow: files\n' >"$pl/etc/nsswitch.conf"
printf '[features]\n\n[settings]\nnaptime = 0.001\nallow_remount = false\n\n[dummy_auth]\nentries = [\n    ["pjdfstest", "pjdfstest"],\n    ["tests", "tests"],\n]\n' \
    >"$pl/ci/pjdfstest.toml"
if has_test pjdfstest; then
    pv=$("$PJD" --version 2>/dev/null | awk '{print $2}')
    sed 's/#.*//; s/[[:space:]]//g; /^$/d' "$here/pjdfstest-exclude" >"$out/pjdfstest-excluded"
    grep -vxF -f "$out/pjdfstest-excluded" "$here/pjdfstest-$pv.tests" \
        | sed 's/^/pjdfstest::tests::/' >"$pl/ci/pjdfstest-args"
fi
(cd "$pl" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) >"$out/payload.cpio.gz"
cat "$INITRAMFS" "$out/payload.cpio.gz" >"$out/initrd.img"

big=$out/big.bin
head -c $((mib * 1048576)) /dev/urandom >"$big"
big_sha=$(sha256sum "$big" | cut -d' ' -f1)
zero_sha=$(head -c $((mib * 1048576)) /dev/zero | sha256sum | cut -d' ' -f1)

# ------------------------------------------------------------- CPU marks
cpu_ticks() { # pid... -> utime+stime of them and their descendants
    local t=0 p kids
    for p in "$@"; do
        [ -r "/proc/$p/stat" ] || continue
        t=$((t + $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
        kids=$(cat /proc/"$p"/task/*/children 2>/dev/null)
        [ -n "$kids" ] && t=$((t + $(cpu_ticks $kids)))
    done
    echo $t
}
# Follows the console; at each CI-MARK line records the CPU ticks of QEMU
# and of the server (pids in files, the server may be none).
watch_marks() { # console qemu-pid-file server-pid-file output
    local line q s
    tail -n +1 -F "$1" 2>/dev/null | while read -r line; do
        line=${line%$'\r'}
        case $line in
        CI-MARK*)
            q=$(cat "$2" 2>/dev/null); s=$(cat "$3" 2>/dev/null)
            echo "$line qemu_ticks=$(cpu_ticks $q) server_ticks=$(cpu_ticks $s)" >>"$4" ;;
        CI-LM-DONE*) break ;;
        esac
    done
}

run_row() {
    local name=$1 dir=$out/$1
    local share=$dir/share sock=$dir/9p.sock qemu=$QEMU mode=virtio ms=$msizes
    local extra=() spid= machine=q35 chain=
    rm -rf "$dir"
    mkdir -p "$share/data"
    ln "$big" "$share/data/big.bin" 2>/dev/null || cp "$big" "$share/data/big.bin"
    echo "$big_sha" >"$share/data/big.sha256"
    guest_vhost_ram "${mem}M"
    case $name in
    ours-vhost|ours-vhost-packed)
        [ -n "$ours_bin" ] || { echo "not available: no daemon build (see $out/server-build.log)" >"$dir/status"; return; }
        vhost_9p_daemon_flags "$name"
        "$ours_bin" --socket-path "$sock" --shared-dir "$share" --tag share "${VHOST_9P_DAEMON_FLAGS[@]}" \
            --log-level "$server_log" >"$dir/server.log" 2>&1 &
        spid=$!
        machine=$GUEST_VHOST_MACHINE
        [ "$max_chain" -gt 0 ] && chain="CI_MAX_CHAIN=$max_chain"
        vhost_9p_args "$sock"
        extra=("${GUEST_VHOST_RAM[@]}" "${VHOST_9P_ARGS[@]}")
        ;;
    qemu)
        ms=$qemu_msize
        extra=(-virtfs "local,path=$share,mount_tag=share,security_model=none")
        ;;
    virtiofsd)
        [ -x "$virtiofsd_bin" ] || { echo "not available: no virtiofsd" >"$dir/status"; return; }
        "$virtiofsd_bin" --socket-path "$sock" --shared-dir "$share" --cache never --allow-mmap \
            --xattr --allow-direct-io >"$dir/server.log" 2>&1 &
        spid=$!
        mode=virtiofs machine=$GUEST_VHOST_MACHINE
        extra=("${GUEST_VHOST_RAM[@]}" -chardev "socket,id=vfs,path=$sock"
            -device "vhost-user-fs-pci,chardev=vfs,tag=share,queue-size=1024")
        ;;
    *) echo "not available: unknown row" >"$dir/status"; return ;;
    esac
    if [ -n "$spid" ] && ! wait_for_socket "$sock" "$spid"; then
        echo "server failed (see $dir/server.log)" >"$dir/status"
        kill "$spid" 2>/dev/null
        return
    fi
    echo "$spid" >"$dir/server.pid"
    : >"$dir/console.log"
    watch_marks "$dir/console.log" "$dir/qemu.pid" "$dir/server.pid" "$dir/marks" &
    local wpid=$!
    local append="console=ttyS0 loglevel=4 panic=-1 CI_MODE=$mode CI_SRC=share"
    append="$append CI_OPTS=cache=mmap,access=client CI_MSIZES=$ms CI_TESTS=$tests CI_DD_MIB=$mib CI_DD_BS=$bs CI_DIRECT_MIB=$dmib CI_DIAG=$diag $chain"
    log "$name: booting (msizes $ms, ${mem} MiB RAM, -cpu $cpu, timeout ${timeout_s}s)"
    local t0=$(date +%s) rc
    timeout --kill-after=10 "$timeout_s" "$qemu" -nodefaults -no-user-config -accel tcg \
        -machine "$machine" -cpu "$cpu" -m "${mem}M" -smp 1 -display none -no-reboot \
        -serial "file:$dir/console.log" -monitor none -pidfile "$dir/qemu.pid" \
        -kernel "$KERNEL" -initrd "$out/initrd.img" -append "$append" \
        "${extra[@]}" -L /usr/share/qemu -L /usr/share/seabios >"$dir/qemu.log" 2>&1
    rc=$?
    echo $(($(date +%s) - t0)) >"$dir/seconds"
    sleep 0.5
    kill "$wpid" 2>/dev/null
    pkill -P "$wpid" 2>/dev/null
    # The server's peak memory (its own and any child's, e.g. virtiofsd's
    # sandboxed one), against the daemon's memory bound at this msize.
    if [ -n "$spid" ]; then
        local p hwm=0 k
        for p in $spid $(cat /proc/"$spid"/task/*/children 2>/dev/null); do
            k=$(awk '/^VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null)
            [ -n "$k" ] && [ "$k" -gt "$hwm" ] && hwm=$k
        done
        echo "$hwm" >"$dir/server-peak-kib"
        kill "$spid" 2>/dev/null
        wait "$spid" 2>/dev/null
    fi
    # No stale pid files: stop_all must never signal a reused pid.
    rm -f "$dir/qemu.pid" "$dir/server.pid"
    if [ $rc -ne 0 ]; then
        echo "qemu exited with $rc: $(tail -c 300 "$dir/qemu.log" | tr '\n' ' ')" >"$dir/status"
    elif ! grep -q '^CI-LM-DONE' "$dir/console.log"; then
        echo "guest did not finish (see console.log)" >"$dir/status"
    else
        echo ok >"$dir/status"
        rm -rf "$share"
    fi
}

# Interrupted: stop what this run started (QEMU, servers, watchers).
stop_all() {
    local f
    for f in "$out"/*/qemu.pid "$out"/*/server.pid; do
        [ -s "$f" ] && kill "$(cat "$f")" 2>/dev/null
    done
    pkill -P $$ 2>/dev/null
}
trap 'stop_all; exit 130' INT TERM
IFS=, read -r -a row_list <<<"$rows"
for r in "${row_list[@]}"; do run_row "$r"; done
rm -f "$big" "$out/initrd.img"

# ----------------------------------------------------------------- report
gate_fail=0
printf '\nlarge msize (kernel %s, %s 9pnet_virtio, TCG, %s MiB dd bs=%sk, guest %s MiB, %s)\n' \
    "$(basename "$KERNEL" | sed 's/^vmlinuz-//')" "$([ -n "$KMOD" ] && echo patched || echo stock)" \
    "$mib" "$bs" "$mem" "$(date -u +%Y-%m-%dT%H:%MZ)"
fmt='%-17s | %-10s | %-9s | %11s | %15s | %11s | %15s | %s\n'
printf "$fmt" row msize test MiB/s "CPU s/GiB q+s" "" "" notes
for r in "${row_list[@]}"; do
    dir=$out/$r
    st=$(cat "$dir/status" 2>/dev/null || echo "not run")
    [ "$st" = ok ] || { printf "$fmt" "$r" - - - - "" "" "$st"; case $r in ours-*) gate_fail=1 ;; esac; }
    [ -f "$dir/console.log" ] || continue
    tr -d '\r' <"$dir/console.log" >"$dir/console.txt"
    # Per msize: the mount line (the msize it really got) and the marks.
    awk -v row="$r" -v fmt="$fmt" '
        FNR == NR { if ($1 == "CI-MARK") { for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
                      key = f["msize"] " " f["test"]
                      if ($2 == "begin") { q0[key] = f["qemu_ticks"]; s0[key] = f["server_ticks"] }
                      if ($2 == "end") { bytes[key] = f["bytes"]; cs[key] = f["centis"]
                          dq[key] = f["qemu_ticks"] - q0[key]; ds[key] = f["server_ticks"] - s0[key]; order[++n] = key }
                      delete f }
                    next }
        /^CI-MARK fail/ { printf fmt, row, $2, $3, "FAILED", "", "", "", $0; next }
        END {
            for (i = 1; i <= n; i++) {
                k = order[i]; split(k, a, " "); gib = bytes[k] / 1073741824
                rate = (cs[k] > 0) ? sprintf("%.1f", bytes[k] / 1048576 / (cs[k] / 100)) : "-"
                cpu = (gib > 0) ? sprintf("%.1f + %.1f", dq[k] / 100 / gib, ds[k] / 100 / gib) : "-"
                printf fmt, row, a[1] == 0 ? "-" : a[1], a[2], rate, cpu, "", "", ""
            }
        }' "$dir/marks" "$dir/console.txt" 2>/dev/null
done
echo
for r in "${row_list[@]}"; do
    c=$out/$r/console.txt
    [ -f "$c" ] || continue
    # (0 when the server had already exited: ours and virtiofsd exit when
    # QEMU disconnects, so this is only known for a server still running.)
    if [ -s "$out/$r/server-peak-kib" ] && [ "$(cat "$out/$r/server-peak-kib")" -gt 0 ]; then
        echo "$r: server peak RSS $(($(cat "$out/$r/server-peak-kib") / 1024)) MiB"
    fi
    sed -n 's/^CI-LM msize=\([0-9]*\) mount \(.*\)$/\1 \2/p' "$c" | while read -r want line; do
        echo "$r: mount at msize=$want: $line"
    done
    grep -E '^CI-LM msize=[0-9]* klog .*(Limiting|msize|descriptor chains|max_chain|BUG|WARNING|Call Trace)' "$c" | sort -u | sed "s/^/$r: /"
    # A device QEMU stopped (e.g. "virtio: too many write descriptors in
    # indirect table" from its built-in 9p on a chain it refuses): fails
    # the gate for every row, the qemu row included.
    if grep -E '^qemu-system.*virtio|virtio: ' "$out/$r/qemu.log" 2>/dev/null | sed "s/^/$r: device error: /" | grep .; then
        gate_fail=1
    fi
    # Correctness: the msize each mount got, POSIX, pjdfstest, writes.
    awk -v row="$r" -v zero="$zero_sha" '
        /^CI-LM msize=[0-9]* mount FAILED/ { print row ": " $0; bad = 1 }
        /^CI-LM msize=[0-9]* mount / { split($2, m, "="); got = ""
            if (match($0, /msize=[0-9]+,/)) got = substr($0, RSTART + 6, RLENGTH - 7)
            if (got != "" && got != m[2] && row != "qemu") { print row ": asked msize " m[2] ", got " got; bad = 1 } }
        /^CI-LM msize=[0-9]* zero-sha / { if ($4 != zero) { print row ": " $2 ": the written file differs on the host"; bad = 1 } }
        /^CI-LM-TESTS / { split($2, m, "="); ms = m[2] }
        /^POSIX PASS/ { pass[ms]++ } /^POSIX FAIL/ { fail[ms]++; print row " msize=" ms ": " $0; bad = 1 }
        /^PJD / && /(ok|FAILED|skipped)$/ { st = $NF; if (st == "FAILED") pf[ms] = pf[ms] " " $2; pj[ms, st]++; seen[ms] = 1; res[ms, $2] = st }
        /^CI-MARK fail/ { bad = 1 }
        END {
            for (k in pass) printf "%s msize=%s: POSIX %d/%d\n", row, k, pass[k], pass[k] + fail[k]
            for (k in seen) printf "%s msize=%s: pjdfstest %d/%d/%d (failed:%s)\n", row, k, pj[k, "ok"], pj[k, "FAILED"], pj[k, "skipped"], pf[k]
            # A pjdfstest case that fails at a large msize but passes at 512000.
            for (k in res) { split(k, a, SUBSEP)
                if (res[k] == "FAILED" && a[1] != "512000" && res["512000", a[2]] == "ok") {
                    print row " msize=" a[1] ": pjdfstest " a[2] " fails, passes at 512000"; bad = 1 } }
            exit bad
        }' "$c" || case $r in ours-*) gate_fail=1 ;; esac
done
echo "logs: $out"
if [ "$gate" -eq 1 ] && [ "$gate_fail" -ne 0 ]; then
    echo "large msize: FAILED"
    exit 1
fi
exit 0
}
