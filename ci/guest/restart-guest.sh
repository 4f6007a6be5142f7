#!/bin/sh
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Runs inside the guest as /ci/run (busybox sh) for ci/guest/restart.sh.
# Kernel command line (init passes unknown key=value words on as the
# environment): CI_SRC (mount tag), CI_SECONDS (time limit), CI_STATE=1
# (--state, --handover: a lock holder, /ci/holdlock, keeps a file locked).
# Mounts the share and loops over the workload until $mnt/ci-stop exists;
# restart.sh lists the lines it prints.
mnt=/mnt
opts=trans=virtio,version=9p2000.L,msize=512000,cache=mmap,access=client
domount() { mount -t 9p -o "$opts" "$CI_SRC" "$mnt"; }
up() { read -r u _ </proc/uptime; echo "${u%.*}"; }
deadline=$(( $(up) + ${CI_SECONDS:-800} ))
if ! domount; then echo "CI-R MOUNT-FAILED"; exit 1; fi
echo "CI-R MOUNTED $(grep " $mnt 9p " /proc/mounts)"
for d in /sys/bus/virtio/devices/*; do
    [ "$(cat "$d/device" 2>/dev/null)" = 0x0009 ] && echo "CI-R FEATURES $(cat "$d/features")"
done
dd if=/dev/urandom of=/tmp/pat bs=64k count=16 2>/dev/null
want=$(sha256sum /tmp/pat | cut -d' ' -f1)
mkdir -p "$mnt/w"
exec 3>>"$mnt/w/held.log"
lockpid=
if [ "${CI_STATE:-0}" = 1 ]; then
    /ci/holdlock "$mnt/w/lockfile" &
    lockpid=$!
    n=0
    while [ ! -s "$mnt/w/lockfile" ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
fi
# One step: run it under a kill timer (a 9p wait is only killable), print
# its error on failure. K is the guest-side limit per step in seconds.
K=120
step() { # name command...
    name=$1; shift
    if ! err=$(timeout -s KILL "$K" sh -c "$*" 2>&1); then
        echo "CI-R FAIL iter=$i step=$name: $(echo "$err" | tr '\n' ' ' | cut -c1-200)"
        return 1
    fi
}
i=0 ok=0 fail=0 remounts=0
while :; do
    i=$((i + 1))
    if [ "$(up)" -ge "$deadline" ]; then echo "CI-R TIMEOUT"; break; fi
    if [ -e "$mnt/ci-stop" ]; then break; fi
    f=$mnt/w/f$((i % 4))
    d=$mnt/w/d$i
    if step write "cp /tmp/pat $f" &&
        step read "[ \"\$(sha256sum $f | cut -d' ' -f1)\" = $want ] || { echo sha256 mismatch; exit 1; }" &&
        step meta "mkdir $d && echo x >$d/a && mv $d/a $d/b && rm $d/b && rmdir $d" &&
        step held "echo iter $i >&3" &&
        step list "ls $mnt/w >/dev/null" &&
        { [ -z "$lockpid" ] || step lock "kill -USR1 $lockpid"; }; then
        ok=$((ok + 1))
        echo "CI-R OK iter=$i"
    else
        fail=$((fail + 1))
        exec 3>&-
        umount -l "$mnt"
        # The channel stays in use until the old client is gone.
        n=0
        while :; do
            n=$((n + 1))
            domount && rc=0 && break
            rc=$?
            echo "CI-R REMOUNT-TRY iter=$i try=$n rc=$rc mounts: $(grep ' 9p ' /proc/mounts | tr '\n' ';')"
            [ $n -lt 30 ] || break
            sleep 1
        done
        remounts=$((remounts + 1))
        echo "CI-R REMOUNT iter=$i rc=$rc tries=$n"
        exec 3>>"$mnt/w/held.log"
    fi
done
echo "CI-R STOP iter=$i ok=$ok fail=$fail remounts=$remounts"
if [ -n "$lockpid" ]; then
    kill -TERM "$lockpid"
    wait "$lockpid"
    echo "CI-R HOLDLOCK exit=$?"
    exec 3>&-
    # The file kept open got one line per good iteration, in order, once.
    lines=$(grep -c '^iter ' "$mnt/w/held.log")
    sorted=no
    grep '^iter ' "$mnt/w/held.log" | cut -d' ' -f2 >/tmp/held
    sort -n -u /tmp/held | cmp -s - /tmp/held && sorted=yes
    echo "CI-R HELDLOG lines=$lines ok=$ok in-order=$sorted"
fi
echo "CI-DONE"
