#!/bin/sh
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Runs inside the guest as /ci/run (busybox sh). Mounts the share under test,
# proves the mount with /proc/mounts, then runs the checks named in CI_TESTS.
# Every result is one line on the console with a fixed prefix that
# ci/guest/run.sh parses:
#   CI-MOUNT <line of /proc/mounts>          POSIX PASS|FAIL <name>[: why]
#   PJD <pjdfstest line>                     CI-DD read|write bytes=N centis=N
#   CI-PDD read bytes=N centis=N (4 parallel readers)
#   CI-VIRTIO-9P <dev> features=<bits>       (one per virtio 9p device: the
#                                             negotiated feature bits, bit 0
#                                             first, as sysfs prints them)
#   CI-DONE
# Settings come from the kernel command line (the kernel hands unknown
# key=value words to init as environment variables):
#   CI_MODE   virtio (CI_SRC is the mount tag), unix (virtio-serial port
#             named "ninep" relayed to a guest unix socket) or virtiofs
#             (CI_SRC is the virtio-fs tag)
#   CI_SRC    mount tag for virtio and virtiofs modes
#   CI_OPTS   extra 9p mount options, comma separated
#   CI_TESTS  comma list of: posix, pjdfstest, dd; or xfstests or workloads,
#             which run from the tool disk (guest-suite.sh, see below)
#   CI_DD_MIB size of the dd transfers and of the checksummed file (MiB)
#   CI_MAX_CHAIN  reload our 9pnet_virtio with max_chain=N (see below)
mnt=/mnt
opts="version=9p2000.L${CI_OPTS:+,$CI_OPTS}"

# CI_MAX_CHAIN: ci/guest/init loads the modules with insmod, which passes
# no parameters; reload our large-msize 9pnet_virtio (suite.sh's
# SUITE_KMOD) with max_chain before anything is mounted. The stock module
# has no such parameter and is left alone.
if [ -n "${CI_MAX_CHAIN:-}" ] && [ -e /sys/module/9pnet_virtio/parameters/max_chain ]; then
    rmmod 9pnet_virtio && insmod /lib/modules/9pnet_virtio.ko max_chain="$CI_MAX_CHAIN" ||
        echo "CI-GUEST-WARN reloading 9pnet_virtio with max_chain=$CI_MAX_CHAIN failed"
fi
uptime_centis() { read -r up _ </proc/uptime; echo "${up%.*}${up#*.}"; }

start_relay() { # the virtio-serial port "ninep" <-> /run/9p.sock
    port=
    for n in /sys/class/virtio-ports/*/name; do
        [ -f "$n" ] && [ "$(cat "$n")" = ninep ] && port=$(basename "$(dirname "$n")")
    done
    if [ -z "$port" ]; then
        echo "CI-MOUNT-FAILED no virtio-serial port named ninep"
        exit 1
    fi
    /ci/bin/relay "/dev/$port" /run/9p.sock &
    i=0
    while [ ! -S /run/9p.sock ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
}

# xfstests and the workloads need bash, perl, git, fio and xfstests' own
# binaries: they run chrooted into the tool disk (ci/guest/tooldisk.sh,
# label ci-tool, attached read-only through snapshot=on) with results on a
# second disk (label ci-results). guest-suite.sh does the mounting there.
case ",$CI_TESTS," in
*,xfstests,*|*,workloads,*)
    [ "$CI_MODE" = unix ] && start_relay
    tool= res= i=0
    while [ $i -lt 100 ]; do
        for d in /dev/sd?; do
            [ -b "$d" ] || continue
            # The ext4 volume label: 16 bytes at 0x478 (busybox-static
            # has no blkid).
            case $(dd if="$d" bs=1 skip=1144 count=16 2>/dev/null | tr -d '\000') in
                ci-tool) tool=$d ;;
                ci-results) res=$d ;;
            esac
        done
        [ -n "$tool" ] && [ -n "$res" ] && break
        sleep 0.1
        i=$((i + 1))
    done
    if [ -z "$tool" ] || [ -z "$res" ]; then
        echo "CI-MOUNT-FAILED tool disk '$tool' or results disk '$res' not found"
        echo "CI-DEBUG partitions: $(tr '\n' ' ' </proc/partitions)"
        exit 1
    fi
    # Loopback up: lock tests talk TCP to 127.0.0.1 (generic/131).
    ifconfig lo 127.0.0.1 up 2>/dev/null || ip link set lo up 2>/dev/null
    hostname ci-guest
    t=/tool
    mkdir -p $t
    mount -t ext4 "$tool" $t && mount -t ext4 "$res" $t/results || {
        echo "CI-MOUNT-FAILED cannot mount the tool or results disk"
        exit 1
    }
    mount -t proc proc $t/proc
    mount -t sysfs sysfs $t/sys
    mount -t devtmpfs devtmpfs $t/dev
    mkdir -p $t/dev/pts $t/dev/shm
    # devtmpfs has no /dev/fd (bash's process substitution needs it).
    ln -sf /proc/self/fd $t/dev/fd
    ln -sf /proc/self/fd/0 $t/dev/stdin
    ln -sf /proc/self/fd/1 $t/dev/stdout
    ln -sf /proc/self/fd/2 $t/dev/stderr
    mount -t devpts devpts $t/dev/pts
    mount -t tmpfs tmpfs $t/dev/shm
    mount -t tmpfs -o mode=1777 tmpfs $t/tmp
    mount --bind /run $t/run
    mount --bind /ci $t/ci
    # A heartbeat with what runs, every 2 minutes: if a suite stalls, the
    # console shows whether the guest still schedules and what spins.
    (
        while sleep 120; do
            echo "CI-HEARTBEAT $(cat /proc/uptime) load $(cat /proc/loadavg)"
            top -b -n 1 2>/dev/null | sed -n '5,9p' | sed 's/^/CI-HEARTBEAT /'
        done
    ) &
    hb=$!
    chroot $t /bin/bash /ci/suite
    kill $hb 2>/dev/null
    echo "CI-SUITE-EXIT rc=$?"
    sync
    umount $t/results 2>/dev/null || echo "CI-WARN umount results failed"
    echo "CI-DONE"
    exit 0
    ;;
esac

case "$CI_MODE" in
virtio)
    mount -t 9p -o "trans=virtio,$opts" "$CI_SRC" "$mnt"
    ;;
virtiofs)
    mount -t virtiofs "$CI_SRC" "$mnt"
    ;;
unix)
    start_relay
    mount -t 9p -o "trans=unix,$opts" /run/9p.sock "$mnt"
    ;;
*)
    echo "CI-MOUNT-FAILED unknown CI_MODE '$CI_MODE'"
    exit 1
    ;;
esac
mount_rc=$?
line=$(grep -E " $mnt (9p|virtiofs) " /proc/mounts)
if [ -z "$line" ]; then
    echo "CI-MOUNT-FAILED mount exit $mount_rc, no 9p or virtiofs at $mnt in /proc/mounts"
    exit 1
fi
echo "CI-MOUNT $line"
# The features the driver negotiated (bit 34: VIRTIO_F_RING_PACKED).
for d in /sys/bus/virtio/devices/*; do
    [ "$(cat "$d/device" 2>/dev/null)" = 0x0009 ] || continue
    echo "CI-VIRTIO-9P $(basename "$d") features=$(cat "$d/features" 2>/dev/null)"
done

has_test() { case ",$CI_TESTS," in *",$1,"*) return 0 ;; esac; return 1; }
mib=${CI_DD_MIB:-256}

if has_test posix; then
    mkdir -p "$mnt/posix"
    /ci/bin/posix-suite "$mnt/posix"
    # A file the host wrote, checksummed here against the host's sha256.
    want=$(cat "$mnt/data/big.sha256" 2>/dev/null)
    got=$(sha256sum "$mnt/data/big.bin" 2>/dev/null | cut -d' ' -f1)
    if [ -n "$want" ] && [ "$want" = "$got" ]; then
        echo "POSIX PASS big_file_checksum (${mib} MiB)"
    else
        echo "POSIX FAIL big_file_checksum: guest sha256 '$got', host sha256 '$want'"
    fi
fi

if has_test dd; then
    mkdir -p "$mnt/dd"
    t0=$(uptime_centis)
    if dd if=/dev/zero of="$mnt/dd/zero.bin" bs=1M count="$mib" conv=fsync 2>/dev/null; then
        t1=$(uptime_centis)
        echo "CI-DD write bytes=$((mib * 1048576)) centis=$((t1 - t0))"
    else
        echo "CI-DD write failed"
    fi
    sync
    echo 3 >/proc/sys/vm/drop_caches
    t0=$(uptime_centis)
    if dd if="$mnt/data/big.bin" of=/dev/null bs=1M 2>/dev/null; then
        t1=$(uptime_centis)
        echo "CI-DD read bytes=$(stat -c %s "$mnt/data/big.bin") centis=$((t1 - t0))"
    else
        echo "CI-DD read failed"
    fi
    # Parallel readers: four dd at once, a quarter of the file each, so
    # the mount has requests of several processes in flight.
    sync
    echo 3 >/proc/sys/vm/drop_caches
    q=$(($(stat -c %s "$mnt/data/big.bin") / 1048576 / 4))
    t0=$(uptime_centis)
    pids=
    for i in 0 1 2 3; do
        dd if="$mnt/data/big.bin" of=/dev/null bs=1M skip=$((i * q)) count=$q 2>/dev/null &
        pids="$pids $!"
    done
    pdd_ok=1
    for p in $pids; do wait "$p" || pdd_ok=0; done
    t1=$(uptime_centis)
    if [ $pdd_ok = 1 ]; then
        echo "CI-PDD read bytes=$((4 * q * 1048576)) centis=$((t1 - t0))"
    else
        echo "CI-PDD read failed"
    fi
fi

if has_test pjdfstest; then
    mkdir -p "$mnt/pjd"
    # pjdfstest switches to these users; the guest's /etc holds them.
    # /ci/pjdfstest-args: the selected test names (run.sh leaves out the few
    # in ci/guest/pjdfstest-exclude); without it every test runs.
    set --
    [ -f /ci/pjdfstest-args ] && set -- -e $(cat /ci/pjdfstest-args)
    NO_COLOR=1 CLICOLOR=0 /ci/bin/pjdfstest -c /ci/pjdfstest.toml -p "$mnt/pjd" "$@" 2>&1 | sed 's/^/PJD /'
fi

cd /
umount "$mnt" 2>/dev/null || echo "CI-WARN umount failed"
echo "CI-DONE"
