#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Boots one Linux guest per 9p server under TCG, runs the POSIX suite,
# pjdfstest and dd in each, and prints ONE comparison table.
#
# Usage: ci/guest/run.sh [options]
#   --servers LIST   comma list from: qemu, diod, ours-socket, ours-vhost,
#                    ours-vhost-mapped (ours-vhost with --security-model
#                    mapped-xattr), ours-vhost-packed (ours-vhost with
#                    packed virtqueues; the other vhost rows run
#                    --no-packed-ring), virtiofsd (virtio-fs through stock
#                    QEMU's vhost-user-fs-pci, a reference, never gated)
#                    (default: all seven)
#   --kernel K       6.12 (default) or 6.1
#   --tests LIST     comma list from: posix, pjdfstest, dd (default: all)
#   --mib N          size of the dd transfers and checksummed file (default 256)
#   --timeout S      per-guest time limit in seconds (default 1500)
#   --server-bin P   our daemon (default: build crates/virtio-9p-server into
#                    $CARGO_TARGET_DIR, default target/ in the repo)
#   --out DIR        keep logs and results here (default: a fresh temp dir)
#   --gate           exit 1 when one of our rows has a POSIX failure, a
#                    pjdfstest failure QEMU built-in passes, or cannot mount
#   --report-only    boot nothing: print the table again from the logs in
#                    --out (with the same --servers)
#
# Every row boots the stock QEMU >= 10.2 of ci/guest/build-qemu.sh.
# Rows whose server is unavailable (binary lacks the mode, no virtiofsd)
# print "not available: <reason>" instead of figures.
set -uo pipefail
# The whole script is one compound command, so bash parses it completely
# before running it (editing the file during a long run is then harmless).
{
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=ci/guest/lib.sh
. "$here/lib.sh"
repo=$GUEST_REPO
CACHE=$GUEST_CACHE
export VIRTIO_9P_CI_CACHE=$CACHE
servers=qemu,diod,ours-socket,ours-vhost,ours-vhost-mapped,ours-vhost-packed,virtiofsd
kernel=6.12
tests=posix,pjdfstest,dd
mib=256
timeout_s=1500
server_bin=
out=
gate=0
report_only=0
while [ $# -gt 0 ]; do
    case $1 in
        --servers) servers=$2; shift ;;
        --kernel) kernel=$2; shift ;;
        --tests) tests=$2; shift ;;
        --mib) mib=$2; shift ;;
        --timeout) timeout_s=$2; shift ;;
        --server-bin) server_bin=$2; shift ;;
        --out) out=$2; shift ;;
        --gate) gate=1 ;;
        --report-only) report_only=1 ;;
        -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
case $mib in ''|*[!0-9]*) echo "run.sh: --mib needs a number" >&2; exit 2 ;; esac
GUEST_LOG_NAME=guest-run

IFS=, read -r -a server_list <<<"$servers"
if [ "$report_only" -eq 1 ]; then
    [ -n "$out" ] && [ -d "$out" ] || { echo "run.sh: --report-only needs --out DIR" >&2; exit 2; }
    out=$(cd "$out" && pwd)
    KERNEL=$(cat "$out/kernel" 2>/dev/null || echo unknown)
else
# ---------------------------------------------------------------- preparation
# Every row runs on the stock QEMU that build-qemu.sh builds (prepare.sh).
if ! bash "$here/prepare.sh" --kernel "$kernel"; then
    log "preparation failed"
    exit 1
fi
eval "$(bash "$here/fetch-kernel.sh" "$kernel")" # KERNEL=, INITRAMFS=
# virtiofsd (the virtio-fs reference row), from crates.io, cached.
virtiofsd_bin= virtiofsd_err=
case ",$servers," in *,virtiofsd,*)
    virtiofsd_bin=$(bash "$here/install-virtiofsd.sh" 2>"$CACHE/virtiofsd-install.log" | tail -1) \
        || virtiofsd_err="cargo install virtiofsd failed (see $CACHE/virtiofsd-install.log)"
    ;;
esac
# Stock QEMU >= 10.2 (ci/guest/build-qemu.sh): the frontend of every row,
# QEMU built-in and virtiofsd included, so the peers share one QEMU. Its
# firmware is Debian's (-L).
QEMU=$GUEST_QEMU_STOCK
QEMU_FW=(-L /usr/share/qemu -L /usr/share/seabios)
[ -x "$QEMU" ] || { log "no stock QEMU at $QEMU (ci/guest/build-qemu.sh)"; exit 1; }
tools=$CACHE/tools/current
PJD=$CACHE/pjdfstest/bin/pjdfstest

if [ -z "$out" ]; then
    out=$(mktemp -d /tmp/virtio-9p-guest.XXXXXX)
fi
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
}
trap cleanup EXIT INT TERM

# ------------------------------------------------------------- our daemon
ours_err=
ours_bin=
case ",$servers," in
*,ours-*)
    if [ -n "$server_bin" ]; then
        ours_bin=$server_bin
    elif [ ! -f "$repo/crates/virtio-9p-server/Cargo.toml" ]; then
        ours_err="crates/virtio-9p-server is missing"
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
[ -n "$ours_bin" ] && ours_help=$("$ours_bin" --help 2>&1 || true)
# Debug logging shows each request, so the log proves the guest's Tattach.
ours_log=()
grep -q -- '--log-level' <<<"$ours_help" && ours_log=(--log-level debug)

# --------------------------------------------------------- guest payload
# Appended to the cached base initramfs (the kernel unpacks concatenated
# cpio archives in order): the run script, static tools, pjdfstest with its
# shared libraries, and the users pjdfstest switches to.
payload_dir=$out/payload
rm -rf "$payload_dir"
mkdir -p "$payload_dir"/{ci/bin,etc,lib64,lib/x86_64-linux-gnu}
install -m 0755 "$here/guest-run.sh" "$payload_dir/ci/run"
install -m 0755 "$tools/posix-suite" "$tools/relay" "$payload_dir/ci/bin/"
install -m 0755 "$PJD" "$payload_dir/ci/bin/pjdfstest"
ldd "$PJD" | awk '/=> \//{print $3} /^\t\/lib64/{print $1}' | while read -r lib; do
    real=$(readlink -f "$lib")
    case $lib in
        /lib64/*) cp "$real" "$payload_dir/lib64/$(basename "$lib")" ;;
        *) cp "$real" "$payload_dir/lib/x86_64-linux-gnu/$(basename "$lib")" ;;
    esac
done
cat >"$payload_dir/etc/passwd" <<'PW'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
pjdfstest:x:1001:1001:pjdfstest:/nonexistent:/bin/false
tests:x:1002:1002:tests:/nonexistent:/bin/false
PW
cat >"$payload_dir/etc/group" <<'GR'
root:x:0:
nogroup:x:65534:
pjdfstest:x:1001:pjdfstest
tests:x:1002:tests
GR
printf 'passwd: files\ngroup: files\nshadow: files\n' >"$payload_dir/etc/nsswitch.conf"
cat >"$payload_dir/ci/pjdfstest.toml" <<'TOML'
# 9P2000.L has no fallocate and no file flags, so no opt-in feature is on.
[features]

[settings]
naptime = 0.001
allow_remount = false

[dummy_auth]
entries = [
    ["pjdfstest", "pjdfstest"],
    ["tests", "tests"],
]
TOML
# Test selection: every test of the pinned list minus ci/guest/pjdfstest-exclude.
pjd_version=$("$PJD" --version 2>/dev/null | awk '{print $2}')
: >"$out/pjdfstest-excluded"
if [ -f "$here/pjdfstest-$pjd_version.tests" ]; then
    sed 's/#.*//; s/[[:space:]]//g; /^$/d' "$here/pjdfstest-exclude" >"$out/pjdfstest-excluded"
    grep -vxF -f "$out/pjdfstest-excluded" "$here/pjdfstest-$pjd_version.tests" \
        | sed 's/^/pjdfstest::tests::/' >"$payload_dir/ci/pjdfstest-args"
else
    log "no test list for pjdfstest $pjd_version: running every test, none excluded"
fi
(cd "$payload_dir" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) >"$out/payload.cpio.gz"
cat "$INITRAMFS" "$out/payload.cpio.gz" >"$out/initrd.img"

# The file the guest checksums, shared (hard-linked) into every server's dir.
big=$out/big.bin
head -c $((mib * 1048576)) /dev/urandom >"$big"
big_sha=$(sha256sum "$big" | cut -d' ' -f1)
zero_sha=$(head -c $((mib * 1048576)) /dev/zero | sha256sum | cut -d' ' -f1)

# ---------------------------------------------------------- one guest
# run_row NAME -> writes $out/NAME/{console.log,server.log,status}
run_row() {
    local name=$1 dir=$out/$1
    local share=$dir/share sock=$dir/9p.sock
    local qemu=$QEMU mode=virtio src=share opts extra=() server_pid=
    rm -rf "$dir"
    mkdir -p "$share"
    # mapped-xattr keeps the guest's owner and mode in user.virtfs.*
    # xattrs beside the guest's own. ext4 gives all of a file's xattrs one
    # 4 KiB block, which leaves no room for the POSIX suite's 4000-byte
    # value (QEMU's mapped-xattr meets the same ENOSPC), so mapped rows
    # get a tmpfs share (user xattrs since Linux 6.6, no such limit).
    case $name in *-mapped) mount -t tmpfs -o size=1g,mode=0755 "virtio-9p-$name" "$share" ;; esac
    mkdir -p "$share/data"
    ln "$big" "$share/data/big.bin" 2>/dev/null || cp "$big" "$share/data/big.bin"
    echo "$big_sha" >"$share/data/big.sha256"
    opts="msize=512000,cache=mmap,access=client"
    local serial=(-device virtio-serial-pci -chardev "socket,id=p9c,path=$sock"
        -device virtserialport,chardev=p9c,name=ninep)
    case $name in
    qemu)
        extra=(-virtfs "local,path=$share,mount_tag=share,security_model=none")
        ;;
    diod)
        diod -f -n -N -l "$sock" -e "$share" >"$dir/server.log" 2>&1 &
        server_pid=$!
        mode=unix
        opts="$opts,uname=root,aname=$share"
        extra=("${serial[@]}")
        ;;
    ours-socket)
        if [ -z "$ours_bin" ]; then echo "not available: $ours_err" >"$dir/status"; return; fi
        if ! grep -q -- '--listen' <<<"$ours_help"; then
            echo "not available: virtio-9p-server has no --listen (socket mode) yet" >"$dir/status"
            return
        fi
        RUST_LOG=${RUST_LOG:-debug} "$ours_bin" --listen "unix:$sock" --shared-dir "$share" \
            "${ours_log[@]}" >"$dir/server.log" 2>&1 &
        server_pid=$!
        mode=unix
        opts="$opts,uname=root"
        extra=("${serial[@]}")
        ;;
    ours-vhost|ours-vhost-mapped|ours-vhost-packed)
        if [ -z "$ours_bin" ]; then echo "not available: $ours_err" >"$dir/status"; return; fi
        if ! grep -q -- '--socket-path' <<<"$ours_help"; then
            echo "not available: virtio-9p-server has no --socket-path (vhost-user mode) yet" >"$dir/status"
            return
        fi
        # ours-vhost-mapped: the same, in the model for untrusted guests
        # (ownership, modes, devices and ACLs in user.virtfs.* xattrs);
        # ours-vhost-packed: packed rings, the others split. A row whose
        # options the daemon lacks is skipped.
        vhost_9p_daemon_flags "$name"
        local flag
        for flag in --no-packed-ring "${VHOST_9P_DAEMON_FLAGS[@]}"; do
            case $flag in --*) ;; *) continue ;; esac
            if ! grep -q -- "$flag" <<<"$ours_help"; then
                echo "not available: virtio-9p-server has no $flag yet" >"$dir/status"
                return
            fi
        done
        RUST_LOG=${RUST_LOG:-debug} "$ours_bin" --socket-path "$sock" --shared-dir "$share" --tag share \
            "${VHOST_9P_DAEMON_FLAGS[@]}" "${ours_log[@]}" >"$dir/server.log" 2>&1 &
        server_pid=$!
        guest_vhost_ram 512M
        vhost_9p_args "$sock"
        extra=("${GUEST_VHOST_RAM[@]}" "${VHOST_9P_ARGS[@]}")
        ;;
    virtiofsd)
        # virtio-fs, the other way to share a folder: stock QEMU's
        # vhost-user-fs-pci, shared memfd RAM. Strict coherence as on the 9p
        # rows (cache=never; --allow-mmap for shared writable mmap, as
        # cache=mmap gives 9p), xattrs on, everything else its defaults.
        if [ -z "$virtiofsd_bin" ] || [ ! -x "$virtiofsd_bin" ]; then
            echo "not available: ${virtiofsd_err:-no virtiofsd binary}" >"$dir/status"
            return
        fi
        "$virtiofsd_bin" --socket-path "$sock" --shared-dir "$share" --cache never --allow-mmap \
            --xattr --allow-direct-io >"$dir/server.log" 2>&1 &
        server_pid=$!
        mode=virtiofs
        opts=
        guest_vhost_ram 512M
        extra=("${GUEST_VHOST_RAM[@]}" -chardev "socket,id=vfs,path=$sock"
            -device "vhost-user-fs-pci,chardev=vfs,tag=share,queue-size=1024")
        ;;
    *)
        echo "not available: unknown server '$name'" >"$dir/status"
        return
        ;;
    esac
    if [ -n "$server_pid" ]; then
        pids+=("$server_pid")
        if ! wait_for_socket "$sock" "$server_pid"; then
            echo "server failed: no socket at $sock (see $dir/server.log)" >"$dir/status"
            cleanup
            return
        fi
    fi
    local machine=q35
    case $name in ours-vhost|ours-vhost-mapped|ours-vhost-packed|virtiofsd) machine=$GUEST_VHOST_MACHINE ;; esac
    local append="console=ttyS0 loglevel=4 panic=-1 CI_MODE=$mode CI_SRC=$src CI_OPTS=$opts CI_TESTS=$tests CI_DD_MIB=$mib"
    log "$name: booting guest ($(basename "$KERNEL"), timeout ${timeout_s}s)"
    local t0 rc
    t0=$(date +%s)
    timeout --kill-after=10 "$timeout_s" "$qemu" -nodefaults -no-user-config -accel tcg \
        -machine "$machine" -cpu max -m 512M -smp 1 -display none -no-reboot \
        -serial "file:$dir/console.log" -monitor none \
        -kernel "$KERNEL" -initrd "$out/initrd.img" -append "$append" \
        "${QEMU_FW[@]}" "${extra[@]}" >"$dir/qemu.log" 2>&1
    rc=$?
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
    # Host-side check of the file the guest wrote with dd.
    if [ -f "$share/dd/zero.bin" ]; then
        if [ "$(sha256sum "$share/dd/zero.bin" | cut -d' ' -f1)" = "$zero_sha" ]; then
            echo "POSIX PASS guest_write_checksum" >>"$dir/host-checks"
        else
            echo "POSIX FAIL guest_write_checksum: host sha256 of the guest's dd output differs" >>"$dir/host-checks"
        fi
    fi
    # The share holds over 512 MiB; keep it only when the row went wrong.
    if [ "$(cat "$dir/status")" = ok ] && ! grep -q '^POSIX FAIL' "$dir/console.log" "$dir/host-checks" 2>/dev/null; then
        rm -rf "$share"
        if mountpoint -q "$share"; then umount "$share"; fi
    fi
}

echo "$KERNEL" >"$out/kernel"
echo "$("$QEMU" --version | head -1) stock, $QEMU" >"$out/frontend"
for s in "${server_list[@]}"; do
    run_row "$s"
done
cleanup
rm -f "$big" "$out/initrd.img"
fi # report_only

# ---------------------------------------------------------------- report
rate() { # bytes centis -> MiB/s with one decimal
    awk -v b="$1" -v c="$2" 'BEGIN { if (c <= 0 || b <= 0) print "-"; else printf "%.1f", b / 1048576 / (c / 100) }'
}
ratio() { # value base
    awk -v v="$1" -v b="$2" 'BEGIN { if (v == "-" || b == "-" || b + 0 == 0) print "-"; else printf "%.2f", v / b }'
}
# pjdfstest result lines: "PJD <name> <padding> ok|FAILED|skipped|..."
pjd_results() { # console -> "name status" lines
    sed -n 's/\r$//; s/^PJD \([^ \t]*\) *\(ok\|FAILED\|skipped\|PASSED UNEXPECTEDLY\|failed as expected\)$/\1 \2/p' "$1" \
        | sed 's/ PASSED UNEXPECTEDLY$/ FAILED/; s/ failed as expected$/ ok/'
}
declare -A R_POSIX R_PJD R_READ R_WRITE R_STATUS R_MOUNT R_ATTACH R_PREAD R_RING
for s in "${server_list[@]}"; do
    dir=$out/$s
    st=$(cat "$dir/status" 2>/dev/null || echo "not run")
    R_STATUS[$s]=$st
    case $st in "not available:"*|"server failed:"*) continue ;; esac
    con=$dir/console.log
    [ -f "$con" ] || continue
    tr -d '\r' <"$con" >"$dir/console.txt"
    con=$dir/console.txt
    R_MOUNT[$s]=$(sed -n 's/^CI-MOUNT \(.*\)/\1/p' "$con" | head -1)
    cat "$con" "$dir/host-checks" 2>/dev/null | grep -E '^POSIX (PASS|FAIL) ' >"$dir/posix.txt"
    p=$(grep -c '^POSIX PASS' "$dir/posix.txt")
    f=$(grep -c '^POSIX FAIL' "$dir/posix.txt")
    if [ $((p + f)) -gt 0 ]; then R_POSIX[$s]="$p/$((p + f))"; else R_POSIX[$s]="-"; fi
    [ "$f" -eq 0 ] || R_POSIX[$s]="${R_POSIX[$s]} FAIL"
    pjd_results "$con" >"$dir/pjdfstest.txt"
    if [ -s "$dir/pjdfstest.txt" ] && [ -s "$out/pjdfstest-excluded" ]; then
        sed 's/$/ skipped/' "$out/pjdfstest-excluded" >>"$dir/pjdfstest.txt"
    fi
    pp=$(grep -c ' ok$' "$dir/pjdfstest.txt")
    pf=$(grep -c ' FAILED$' "$dir/pjdfstest.txt")
    ps=$(grep -c ' skipped$' "$dir/pjdfstest.txt")
    if [ $((pp + pf + ps)) -gt 0 ]; then R_PJD[$s]="$pp/$pf/$ps"; else R_PJD[$s]="-"; fi
    w=$(sed -n 's/^CI-DD write bytes=\([0-9]*\) centis=\([0-9]*\)$/\1 \2/p' "$con" | head -1)
    r=$(sed -n 's/^CI-DD read bytes=\([0-9]*\) centis=\([0-9]*\)$/\1 \2/p' "$con" | head -1)
    R_WRITE[$s]=$( [ -n "$w" ] && rate $w || echo -)
    R_READ[$s]=$( [ -n "$r" ] && rate $r || echo -)
    pr=$(sed -n 's/^CI-PDD read bytes=\([0-9]*\) centis=\([0-9]*\)$/\1 \2/p' "$con" | head -1)
    R_PREAD[$s]=$( [ -n "$pr" ] && rate $pr || echo -)
    R_ATTACH[$s]=
    if [ -f "$dir/server.log" ] && grep -qi 'attach' "$dir/server.log"; then
        R_ATTACH[$s]=yes
    fi
    # The ring layout, from both ends: the guest's negotiated feature bits
    # (bit 34, VIRTIO_F_RING_PACKED, is the 35th character) and the
    # daemon's "driver acked features ... (packed ring)" line.
    R_RING[$s]=
    feat=$(sed -n 's/^CI-VIRTIO-9P [^ ]* features=\([01]*\)$/\1/p' "$con" | head -1)
    if [ -n "$feat" ]; then
        ring=split
        [ "${feat:34:1}" = 1 ] && ring=packed
        R_RING[$s]="$ring ring"
        case $s in ours-vhost*)
            if [ -f "$dir/server.log" ] && grep -q "acked features .*($ring ring)" "$dir/server.log"; then
                R_RING[$s]="$ring ring (guest and daemon)"
            else
                R_RING[$s]="$ring ring (guest; daemon log disagrees)"
            fi
            ;;
        esac
    fi
done

base_read=${R_READ[qemu]:--}
base_write=${R_WRITE[qemu]:--}
printf '\n9p guest conformance (kernel %s, TCG, msize=512000, %s MiB dd, %s)\n' \
    "$(basename "$KERNEL" | sed 's/^vmlinuz-//')" "$mib" "$(date -u +%Y-%m-%dT%H:%MZ)"
printf 'frontend of every row: %s\n' "$(cat "$out/frontend" 2>/dev/null || echo unknown)"
fmt='%-17s | %-9s | %-16s | %-13s | %-13s | %-14s | %-16s | %s\n'
printf "$fmt" server POSIX "pjdfstest p/f/s" "dd read MiB/s" "dd write MiB/s" "vs qemu r / w" "4x dd read MiB/s" notes
printf "$fmt" ----------------- --------- ---------------- ------------- ------------- -------------- ---------------- -----
for s in "${server_list[@]}"; do
    st=${R_STATUS[$s]}
    case $st in
    "not available:"*|"server failed:"*)
        printf "$fmt" "$s" - - - - - - "$st"
        continue ;;
    esac
    notes=
    if [ -z "${R_MOUNT[$s]:-}" ]; then
        notes="NOT MOUNTED; "
    fi
    [ "$st" = ok ] || notes="$notes$st; "
    case $s in ours-*) [ "${R_ATTACH[$s]:-}" = yes ] && notes="${notes}daemon log shows attach" || notes="${notes}no attach in daemon log" ;; esac
    [ "$s" = virtiofsd ] && notes="${notes}virtio-fs, cache=never (reference, not gated)"
    [ -n "${R_RING[$s]:-}" ] && notes="$notes; ${R_RING[$s]}"
    rr=$(ratio "${R_READ[$s]:--}" "$base_read")
    rw=$(ratio "${R_WRITE[$s]:--}" "$base_write")
    printf "$fmt" "$s" "${R_POSIX[$s]:--}" "${R_PJD[$s]:--}" "${R_READ[$s]:--}" "${R_WRITE[$s]:--}" "$rr / $rw" "${R_PREAD[$s]:--}" "${notes%; }"
done

# Proof of each mount: the guest's own /proc/mounts line.
echo
for s in "${server_list[@]}"; do
    [ -n "${R_MOUNT[$s]:-}" ] && echo "guest /proc/mounts on $s: ${R_MOUNT[$s]}"
done

# pjdfstest failures a row has that QEMU built-in passes in this run.
gate_fail=0
echo
for s in "${server_list[@]}"; do
    [ "$s" = qemu ] && continue
    [ -s "$out/$s/pjdfstest.txt" ] || continue
    if [ -f "$out/qemu/pjdfstest.txt" ] && [ -s "$out/qemu/pjdfstest.txt" ]; then
        regress=$(awk 'NR == FNR { if ($2 == "ok") okq[$1] = 1; next } $2 == "FAILED" && ($1 in okq) { print $1 }' \
            "$out/qemu/pjdfstest.txt" "$out/$s/pjdfstest.txt")
        label="pjdfstest failures on $s that QEMU built-in passes"
    else
        regress=$(awk '$2 == "FAILED" { print $1 }' "$out/$s/pjdfstest.txt")
        label="pjdfstest failures on $s (no QEMU built-in result to compare)"
    fi
    n=$(printf '%s' "$regress" | grep -c . || true)
    echo "$label: $n"
    [ -n "$regress" ] && printf '  %s\n' $regress
    case $s in ours-*) [ "$n" -eq 0 ] || gate_fail=1 ;; esac
done
for s in "${server_list[@]}"; do
    [ -s "$out/$s/posix.txt" ] || continue
    if grep -q '^POSIX FAIL' "$out/$s/posix.txt"; then
        echo "POSIX failures on $s:"
        grep '^POSIX FAIL' "$out/$s/posix.txt" | sed 's/^POSIX FAIL /  /'
        case $s in ours-*) gate_fail=1 ;; esac
    fi
done
# The packed row must really run packed, on both ends.
for s in "${server_list[@]}"; do
    [ "$s" = ours-vhost-packed ] || continue
    case ${R_STATUS[$s]} in "not available:"*|"server failed:"*) continue ;; esac
    if [ "${R_RING[$s]:-}" != "packed ring (guest and daemon)" ]; then
        echo "$s: the packed ring was not negotiated (${R_RING[$s]:-no CI-VIRTIO-9P line})"
        gate_fail=1
    fi
done
for s in "${server_list[@]}"; do
    case $s in ours-*) ;; *) continue ;; esac
    case ${R_STATUS[$s]} in "not available:"*) continue ;; esac
    if [ "${R_STATUS[$s]}" != ok ] || [ -z "${R_MOUNT[$s]:-}" ]; then
        echo "$s: ${R_STATUS[$s]}${R_MOUNT[$s]:+} (mount: ${R_MOUNT[$s]:-none})"
        gate_fail=1
    fi
done
echo "logs: $out"

# Machine-readable summary for ci/guest-conformance.sh.
{
    for s in "${server_list[@]}"; do
        printf '%s\tstatus=%s\tposix=%s\tpjdfstest=%s\tread=%s\twrite=%s\tpread4=%s\n' "$s" "${R_STATUS[$s]}" \
            "${R_POSIX[$s]:--}" "${R_PJD[$s]:--}" "${R_READ[$s]:--}" "${R_WRITE[$s]:--}" "${R_PREAD[$s]:--}"
    done
} >"$out/summary.tsv"

if [ "$gate" -eq 1 ] && [ "$gate_fail" -ne 0 ]; then
    echo "guest conformance: FAILED (see above)"
    exit 1
fi
exit 0
}
