# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Shared helpers of the ci/guest host scripts; source it, don't run it.
# Every host script sources it (build-qemu.sh and tooldisk.sh hash only
# their own text into their cache keys, so editing this file rebuilds
# nothing).
# The guest-side scripts (*-guest.sh) run under busybox in the guest.
# shellcheck shell=bash
# shellcheck disable=SC2034 # its variables are for the scripts that source it

GUEST_CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
GUEST_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GUEST_REPO=$(cd "$GUEST_DIR/../.." && pwd)
# The two QEMU builds of build-qemu.sh: stock 10.2.2 and the same tree with
# ci/guest/qemu-patches applied.
GUEST_QEMU_STOCK=$GUEST_CACHE/qemu-stock/bin/qemu-system-x86_64
GUEST_QEMU_PATCHED=$GUEST_CACHE/qemu-patched/bin/qemu-system-x86_64

# log MESSAGE...: "NAME: MESSAGE" on stderr. NAME is GUEST_LOG_NAME (by
# default the script's name); GUEST_LOG_CLOCK=1 adds the UTC time.
GUEST_LOG_NAME=$(basename "$0" .sh)
GUEST_LOG_CLOCK=0
log() {
    if [ "$GUEST_LOG_CLOCK" = 1 ]; then
        echo "$GUEST_LOG_NAME: $(date -u +%H:%M:%S) $*" >&2
    else
        echo "$GUEST_LOG_NAME: $*" >&2
    fi
}

# host_note MESSAGE...: "HH:MM:SS.mmm MESSAGE" (UTC) appended to
# GUEST_HOST_LOG, the running scenario's host.log, which the script sets
# as it starts a scenario. hfail MESSAGE...: a note "HOST-FAIL MESSAGE",
# which the script's report lists as a failure.
GUEST_HOST_LOG=
host_note() {
    printf '%s %s\n' "$(date -u +%H:%M:%S.%3N)" "$*" >>"$GUEST_HOST_LOG"
}
hfail() {
    host_note "HOST-FAIL $*"
}

# The kernel command line every TCG guest gets. On a loaded host a TCG
# guest calibrates its TSC wrongly (its clock ran 3x fast, crypto
# self-tests timed out, the IO-APIC timer check panicked): time from the
# ACPI PM timer, no crypto self-tests, no timer check.
GUEST_APPEND="console=ttyS0 loglevel=4 panic=-1 clocksource=acpi_pm cryptomgr.notests=1 no_timer_check"

# ------------------------------------------------ the vhost-user QEMU line
# A vhost-user guest's RAM is shared memfd memory of MEM (the back-end maps
# it): guest_vhost_ram sets GUEST_VHOST_RAM to its -object and the machine
# takes it with -machine GUEST_VHOST_MACHINE.
GUEST_VHOST_MACHINE=q35,memory-backend=mem
guest_vhost_ram() {
    GUEST_VHOST_RAM=(-object "memory-backend-memfd,id=mem,size=$1,share=on")
}

# guest_qemu_args MEM: sets the array GUEST_QEMU_ARGS to the options every
# vhost-user guest shares: TCG, q35 with shared memfd RAM of MEM, one vCPU,
# no display, no reboot, Debian's firmware (-L). Stock and patched QEMU
# (GUEST_QEMU_STOCK, GUEST_QEMU_PATCHED) take the same line.
guest_qemu_args() {
    guest_vhost_ram "$1"
    GUEST_QEMU_ARGS=(-nodefaults -no-user-config -accel tcg
        -machine "$GUEST_VHOST_MACHINE" -cpu max -m "$1" -smp 1 -display none -no-reboot
        "${GUEST_VHOST_RAM[@]}"
        -L /usr/share/qemu -L /usr/share/seabios)
}

# vhost_9p_args [--id ID] [--tag TAG] [--chardev-opts ,K=V] [--props ,K=V] SOCK:
# sets the array VHOST_9P_ARGS to the -chardev and -device of one 9p device
# on the vhost-user socket SOCK: QEMU >= 10.2's generic
# vhost-user-test-device-pci as virtio device 9 with one 1024-entry queue
# and a config space of 2 + the tag's length (the tag's own length field).
# ID defaults to vu and TAG to share (the daemon's --tag); --chardev-opts
# goes on the socket (,reconnect-ms=500), --props on the device
# (,migratable=on: the patched QEMU's, see qemu-patches/0007). The same for
# the split, packed and mapped rows: they differ in the daemon's options
# (vhost_9p_daemon_flags).
vhost_9p_args() {
    local id=vu tag=share chardev_opts='' props=''
    while [ $# -gt 1 ]; do
        case $1 in
            --id) id=$2 ;;
            --tag) tag=$2 ;;
            --chardev-opts) chardev_opts=$2 ;;
            --props) props=$2 ;;
            *) echo "vhost_9p_args: unknown option $1" >&2; return 2 ;;
        esac
        shift 2
    done
    VHOST_9P_ARGS=(-chardev "socket,id=$id,path=$1$chardev_opts"
        -device "vhost-user-test-device-pci,chardev=$id,virtio-id=9,num_vqs=1,config_size=$((2 + ${#tag})),vq_size=1024$props")
}

# vhost_9p_daemon_flags ROW: sets the array VHOST_9P_DAEMON_FLAGS to our
# daemon's options for a vhost-user row: ours-vhost-packed offers packed
# rings, every other row declines them (--no-packed-ring: QEMU's generic
# device passes the offer through, so the guest would pick packed);
# ours-vhost-mapped keeps owners and modes in xattrs (mapped-xattr).
vhost_9p_daemon_flags() {
    VHOST_9P_DAEMON_FLAGS=()
    [ "$1" = ours-vhost-packed ] || VHOST_9P_DAEMON_FLAGS+=(--no-packed-ring)
    [ "$1" != ours-vhost-mapped ] || VHOST_9P_DAEMON_FLAGS+=(--security-model mapped-xattr)
}

# ------------------------------------------------------------ the guest
# guest_initrd INITRAMFS PAYLOAD_DIR OUT: the cached base initramfs with the
# payload directory appended (the kernel unpacks concatenated archives in
# order, so /ci/run and /ci/bin/* come in beside ci/guest/init).
guest_initrd() {
    (cd "$2" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) >"$3.payload"
    cat "$1" "$3.payload" >"$3"
    rm -f "$3.payload"
}

# guest_static_tool SRC OUT: a static guest binary from ci/guest/src.
guest_static_tool() {
    gcc -static -O2 -Wall -Wextra -Werror -o "$2" "$1"
}

# guest_daemon_bin LOG: our daemon, built (release, --features daemon) into
# $CARGO_TARGET_DIR (default target/); prints its path; the build output
# goes to LOG.
guest_daemon_bin() {
    local tdir=${CARGO_TARGET_DIR:-$GUEST_REPO/target}
    (cd "$GUEST_REPO" && CARGO_TARGET_DIR=$tdir cargo build --release --quiet -p virtio-9p-server --features daemon) \
        >"$1" 2>&1 || return 1
    echo "$tdir/release/virtio-9p-server"
}

# wait_for_socket PATH [PID]: until PATH is a socket (10 s), while PID
# (if given) lives.
wait_for_socket() {
    local i=0
    while [ ! -S "$1" ] && [ $i -lt 100 ]; do
        [ -z "${2:-}" ] || kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
        i=$((i + 1))
    done
    [ -S "$1" ]
}

# wait_line FILE ERE SECONDS [PID]: until a line of FILE matches ERE; fails
# when the time runs out or PID (if given) ends first.
wait_line() {
    local t=$(($(date +%s) + $3))
    until tr -d '\r' 2>/dev/null <"$1" | grep -qE -- "$2"; do
        if [ -n "${4:-}" ] && ! kill -0 "$4" 2>/dev/null; then
            tr -d '\r' 2>/dev/null <"$1" | grep -qE -- "$2"
            return
        fi
        [ "$(date +%s)" -lt "$t" ] || return 1
        sleep 0.2
    done
}

# qmp SOCKET JSON: one QMP command (ci/guest/qmp.py); prints the answer.
qmp() {
    python3 "$GUEST_DIR/qmp.py" "$1" "$2"
}

# qmp_get SOCKET COMMAND KEY...: runs COMMAND (no arguments) and prints the
# answer's KEYs, space-separated ("-" for a missing one), or "error: ...".
qmp_get() {
    local sock=$1 cmd=$2
    shift 2
    qmp "$sock" "{\"execute\":\"$cmd\"}" 2>&1 | python3 "$GUEST_DIR/qmp-keys.py" "$@"
}

# host_lock FILE: whether a host process can take a POSIX write lock on
# FILE now: "free", "held" or "no file (why)".
host_lock() {
    python3 "$GUEST_DIR/host-lock.py" "$1"
}

# fnv1a64 FILE: the FNV-1a 64 of FILE in hex (as ci/guest/src/migrate.c).
fnv1a64() {
    python3 "$GUEST_DIR/fnv1a64.py" "$1"
}

# stop_pid PID [SECONDS]: TERM, then KILL after SECONDS (default 10).
stop_pid() {
    local i=0 n=$((${2:-10} * 10))
    kill "$1" 2>/dev/null || return 0
    while kill -0 "$1" 2>/dev/null && [ $i -lt $n ]; do
        sleep 0.1
        i=$((i + 1))
    done
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
    return 0
}
