#!/bin/sh
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Runs inside the guest as /ci/run (busybox sh) for ci/guest/lifecycle.sh:
# one lifecycle scenario per boot, chosen by CI_SCENARIO on the kernel
# command line (the kernel hands unknown key=value words to init, and init
# to us, as environment variables):
#   CI_SCENARIO  pause (a), rebind (b) or reset (c)
#   CI_SRC       mount tag (trans=virtio)
#   CI_OPTS      extra 9p mount options, comma separated
# The host talks to us through files it creates in the share (lc/...), we
# answer on the console, one line per event, with fixed prefixes:
#   CI-MOUNT <line of /proc/mounts>      CI-VIRTIO-9P <dev> features=<bits>
#   LC-<STEP> ok|FAIL ...                (from here and from /ci/bin/lifecycle)
#   LC-STAGE <what>                      progress, for the host to wait on
#   LC-DMESG <kernel line>               9p, virtio and error lines of dmesg
#   LC-END                               the scenario finished (then poweroff)
# The guest always ends with `poweroff -f`, never by returning to init: the
# reset scenario runs QEMU without -no-reboot (with it, QMP system_reset
# would end QEMU), so init's final `reboot -f` would boot again.
mnt=/mnt
lc=$mnt/lc
opts="version=9p2000.L${CI_OPTS:+,$CI_OPTS}"
LC=/ci/bin/lifecycle
SEED=4242
FIXED_N=8
FIXED_KIB=256

finish() {
    cd /
    dmesg | grep -iE '9p|virtio|warning|bug|oops|call trace|blocked for more|error' \
        | grep -vE 'CI-|LC-|Installing|pci=nocrs|Correctable Errors collector' | sed 's/^/LC-DMESG /'
    echo "LC-END scenario=$CI_SCENARIO"
    sync
    poweroff -f
    sleep 10
    echo "LC-FAIL poweroff did not end the guest"
    while :; do sleep 60; done
}
fail() { echo "LC-FAIL $*"; finish; }

# bounded PID SECONDS: waits for PID to exit, at most SECONDS; returns its
# exit status, or 124 (after SIGKILL) when it did not end in time.
bounded() {
    _i=0
    while kill -0 "$1" 2>/dev/null; do
        if [ "$_i" -ge $(($2 * 10)) ]; then
            kill -9 "$1" 2>/dev/null
            return 124
        fi
        sleep 0.1
        _i=$((_i + 1))
    done
    wait "$1"
}

# wait_file PATH SECONDS: polls PATH (on the share: a 9p walk each time).
wait_file() {
    _i=0
    while [ ! -e "$1" ]; do
        [ "$_i" -ge $(($2 * 5)) ] && return 1
        sleep 0.2
        _i=$((_i + 1))
    done
}

do_mount() {
    timeout 60 mount -t 9p -o "trans=virtio,$opts" "$CI_SRC" "$mnt"
    _rc=$?
    _line=$(grep " $mnt 9p " /proc/mounts)
    [ -n "$_line" ] || { echo "LC-FAIL mount: exit $_rc, no 9p at $mnt in /proc/mounts"; return 1; }
    echo "CI-MOUNT $_line"
}

virtio_9p_dev() {
    for _d in /sys/bus/virtio/devices/*; do
        [ "$(cat "$_d/device" 2>/dev/null)" = 0x0009 ] && { basename "$_d"; return 0; }
    done
    return 1
}

posix_suite() {
    mkdir -p "$mnt/posix"
    timeout 300 /ci/bin/posix-suite "$mnt/posix" || echo "LC-FAIL posix-suite exit $?"
}

# io_for SECONDS: checksummed I/O in $lc/io for SECONDS, in the foreground.
io_for() {
    mkdir -p "$lc/io"
    timeout $(($1 + 60)) "$LC" io "$lc/io" "$1" || echo "LC-FAIL io exit $?"
}

echo "LC-STAGE boot scenario=$CI_SCENARIO"
echo "LC-CLOCK $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
do_mount || finish
dev=$(virtio_9p_dev) && echo "CI-VIRTIO-9P $dev features=$(cat "/sys/bus/virtio/devices/$dev/features")"

case $CI_SCENARIO in
pause)
    # (a) The host holds POSIX write locks on lc/lock-plain and lc/lock-pause.
    # First a plain wait (no pause): the host releases lock-plain 1 s after
    # "waiting", then creates lc/released-plain.
    mkdir -p "$lc/io"
    "$LC" fill "$lc" "$FIXED_N" "$FIXED_KIB" "$SEED" || fail "fill"
    "$LC" lockwait plain "$lc/lock-plain" "$lc/released-plain" &
    lp=$!
    bounded "$lp" 60 || echo "LC-FAIL lock plain: no grant within 60 s (exit $?)"
    # Then I/O and a waiter on lock-pause while the host runs its stop/cont
    # cycles; it releases lock-pause halfway through them and creates
    # lc/host-done when the last cycle has ended.
    "$LC" io "$lc/io" 900 "$lc/host-done" &
    io=$!
    "$LC" lockwait pause "$lc/lock-pause" "$lc/released-pause" &
    lk=$!
    echo "LC-STAGE cycles-ready"
    wait_file "$lc/host-done" 400 || echo "LC-FAIL no lc/host-done from the host within 400 s"
    echo "LC-STAGE host-done-seen"
    bounded "$io" 60 || echo "LC-FAIL io: exit $? (124: did not end within 60 s of host-done)"
    # A Tlock answered Blocked makes the client sleep 30 s (locktimeout)
    # before it asks again, so allow more than that.
    bounded "$lk" 50 || echo "LC-FAIL lock pause: no grant within 50 s of host-done (exit $?)"
    "$LC" verify "$lc" "$FIXED_N" "$FIXED_KIB" "$SEED"
    ;;
rebind)
    # (b) I/O, killed mid-flight; umount; unbind and rebind 9pnet_virtio
    # (p9_virtio_remove waits while a mount uses the channel, hence the
    # umount); mount again, verify, more I/O, the POSIX suite.
    mkdir -p "$lc/io"
    "$LC" fill "$lc" "$FIXED_N" "$FIXED_KIB" "$SEED" || fail "fill"
    "$LC" io "$lc/io" 600 /tmp/never &
    io=$!
    sleep 3
    kill -9 "$io"
    bounded "$io" 30
    [ $? -eq 124 ] && echo "LC-FAIL io did not die within 30 s of SIGKILL"
    echo "LC-STAGE io-killed"
    cd /
    timeout 60 umount "$mnt" || fail "umount after the killed I/O: exit $?"
    [ -n "$dev" ] || fail "no virtio 9p device in sysfs"
    drv=/sys/bus/virtio/drivers/9pnet_virtio
    timeout 60 sh -c "echo $dev >$drv/unbind" || fail "unbind $dev: exit $?"
    [ -e "/sys/bus/virtio/devices/$dev/driver" ] && fail "$dev still has a driver after unbind"
    echo "LC-STAGE unbound $dev"
    timeout 60 sh -c "echo $dev >$drv/bind" || fail "bind $dev: exit $?"
    [ -e "/sys/bus/virtio/devices/$dev/driver" ] || fail "$dev has no driver after bind"
    echo "LC-STAGE rebound $dev"
    do_mount || finish
    "$LC" verify "$lc" "$FIXED_N" "$FIXED_KIB" "$SEED"
    io_for 3
    posix_suite
    ;;
reset)
    # (c) First boot: fixed files, the marker lc/reset-boot1, then busy I/O
    # until the host's QMP system_reset. Second boot (the marker exists):
    # verify, I/O, the POSIX suite.
    if [ -e "$lc/reset-boot1" ]; then
        echo "LC-STAGE second-boot"
        "$LC" verify "$lc" "$FIXED_N" "$FIXED_KIB" "$SEED"
        io_for 3
        posix_suite
    else
        mkdir -p "$lc/io" "$lc/io2"
        "$LC" fill "$lc" "$FIXED_N" "$FIXED_KIB" "$SEED" || fail "fill"
        : >"$lc/reset-boot1"
        sync
        "$LC" io "$lc/io" 600 &
        "$LC" io "$lc/io2" 600 &
        echo "LC-STAGE busy"
        sleep 120
        fail "no system_reset within 120 s"
    fi
    ;;
*)
    fail "unknown CI_SCENARIO '$CI_SCENARIO'"
    ;;
esac
finish
