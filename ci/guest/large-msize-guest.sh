#!/bin/sh
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Runs inside the guest as /ci/run for ci/guest/large-msize.sh (busybox sh).
# For each msize in CI_MSIZES: mounts the share, prints the mount and what
# the kernel said about msize, runs the checks in CI_TESTS, unmounts.
# Output lines (parsed by large-msize.sh):
#   CI-LM msize=N mount <line of /proc/mounts>
#   CI-LM msize=N klog <kernel message about msize or 9p>
#   CI-MARK begin|end msize=N test=T bytes=B centis=C   (the host samples
#                                     its CPU time at each mark; the guest
#                                     waits a moment so the sample lands
#                                     between the marks)
#   POSIX/PJD lines as in guest-run.sh, prefixed per msize by CI-LM-TESTS
#   CI-LM-DONE
# Settings from the kernel command line:
#   CI_MODE   virtio (9p, CI_SRC is the tag) or virtiofs
#   CI_SRC    mount tag;  CI_OPTS  9p options besides msize
#   CI_MSIZES comma list of msizes (ignored for virtiofs)
#   CI_MAX_CHAIN  reload our 9pnet_virtio with max_chain=N (chains longer
#             than the queue size, for devices known to take them);
#             unset: the module's default, chains of the queue size
#   CI_TESTS  comma list of: posix, pjdfstest, dd, fio, ceiling (with dd:
#             also re-reads the file from the page cache, test=reread)
#   CI_DD_MIB size of the dd transfers (MiB); the host wrote data/big.bin
#   CI_DD_BS  dd block size in KiB (default 1024)
#   CI_DIRECT_MIB  block size of the O_DIRECT dd pair in MiB (default 128)
#   CI_DIAG   1: around the buffered dd read, print the mount's readahead
#             window, /proc/vmstat deltas and the 9p requests the guest
#             sent (tracefs 9p_client_req), as CI-DIAG lines
mnt=/mnt
uptime_centis() { read -r up _ </proc/uptime; echo "${up%.*}${up#*.}"; }
has_test() { case ",$CI_TESTS," in *",$1,"*) return 0 ;; esac; return 1; }
mib=${CI_DD_MIB:-256}
bs=${CI_DD_BS:-1024}
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
tr_dir=/sys/kernel/tracing
# diag begin|end msize: what the buffered read cost the guest (CI_DIAG=1)
diag() {
    [ "${CI_DIAG:-0}" = 1 ] || return 0
    local dev bdi
    if [ "$1" = begin ]; then
        [ -d "$tr_dir/events" ] || mount -t tracefs nodev "$tr_dir" 2>/dev/null
        dev=$(mountpoint -d "$mnt" 2>/dev/null)
        for bdi in /sys/class/bdi/"$dev" /sys/class/bdi/9p-*; do
            [ -r "$bdi/read_ahead_kb" ] && echo "CI-DIAG msize=$2 bdi=${bdi##*/} read_ahead_kb=$(cat "$bdi/read_ahead_kb") max_bytes=$(cat "$bdi/max_bytes" 2>/dev/null)"
        done
        cp /proc/vmstat /tmp/vmstat.0
        if [ -d "$tr_dir/events/9p" ]; then
            echo 0 >"$tr_dir/tracing_on"
            : >"$tr_dir/trace"
            echo 16384 >"$tr_dir/buffer_size_kb"
            echo 1 >"$tr_dir/events/9p/9p_client_req/enable"
            echo 1 >"$tr_dir/events/9p/9p_protocol_dump/enable"
            echo 1 >"$tr_dir/tracing_on"
        else
            echo "CI-DIAG msize=$2 no 9p tracepoints"
        fi
        return 0
    fi
    if [ -d "$tr_dir/events/9p" ]; then
        echo 0 >"$tr_dir/tracing_on"
        echo 0 >"$tr_dir/events/9p/9p_client_req/enable"
        echo 0 >"$tr_dir/events/9p/9p_protocol_dump/enable"
        grep -c 9p_client_req "$tr_dir/trace" | sed "s/^/CI-DIAG msize=$2 requests=/"
        grep 9p_client_req "$tr_dir/trace" | sed 's/.*request_type \([A-Z_a-z]*\).*/\1/' \
            | sort | uniq -c | while read -r n t; do echo "CI-DIAG msize=$2 req $t $n"; done
        grep -A3 9p_protocol_dump "$tr_dir/trace" | head -40 | sed "s/^/CI-DIAG msize=$2 dump /"
        grep -E "entries-in-buffer|overrun" "$tr_dir/trace" | sed "s/^/CI-DIAG msize=$2 /"
    fi
    awk 'NR==FNR { a[$1] = $2; next } { d = $2 - a[$1]; if (d != 0) print "CI-DIAG msize='"$2"' vmstat " $1 " " d }' \
        /tmp/vmstat.0 /proc/vmstat
}
# mark begin|end name msize [bytes centis]
mark() { echo "CI-MARK $1 msize=$3 test=$2${4:+ bytes=$4 centis=$5}"; sleep 0.3; }
timed() { # name msize bytes cmd... : run cmd between two marks
    local name=$1 ms=$2 bytes=$3 t0 t1 rc
    shift 3
    mark begin "$name" "$ms"
    t0=$(uptime_centis)
    "$@" >/tmp/out.$name 2>&1
    rc=$?
    t1=$(uptime_centis)
    if [ $rc -eq 0 ]; then
        mark end "$name" "$ms" "$bytes" $((t1 - t0))
    else
        echo "CI-MARK fail msize=$ms test=$name rc=$rc $(tail -c 200 /tmp/out.$name | tr '\n' ' ')"
        sleep 0.3
    fi
}

# The guest's own ceiling, once: moving the bytes through guest memory
# alone (no 9p), and nothing else.
if has_test ceiling; then
    timed memcpy 0 $((mib * 1048576)) dd if=/dev/zero of=/dev/null bs=1M count="$mib"
fi

# ci/guest/init loads the modules with insmod, which passes no parameters:
# reload ours with max_chain before anything is mounted. The stock module
# has no such parameter and is left alone.
if [ "$CI_MODE" = virtio ] && [ -n "${CI_MAX_CHAIN:-}" ] &&
    [ -e /sys/module/9pnet_virtio/parameters/max_chain ]; then
    rmmod 9pnet_virtio && insmod /lib/modules/9pnet_virtio.ko max_chain="$CI_MAX_CHAIN" ||
        echo "CI-LM msize=0 klog reloading 9pnet_virtio with max_chain=$CI_MAX_CHAIN failed"
fi
# The chain limit the transport chose for each device.
dmesg 2>/dev/null | grep -E "9pnet_virtio.*(descriptor chains|max_chain)" |
    while read -r l; do echo "CI-LM msize=0 klog $l"; done

IFS=,
set -- ${CI_MSIZES:-512000}
unset IFS
[ "$CI_MODE" = virtiofs ] && set -- 0
for ms in "$@"; do
    dmesg -c >/dev/null 2>&1
    if [ "$CI_MODE" = virtiofs ]; then
        mount -t virtiofs "$CI_SRC" "$mnt"
    else
        mount -t 9p -o "trans=virtio,version=9p2000.L,msize=$ms${CI_OPTS:+,$CI_OPTS}" "$CI_SRC" "$mnt"
    fi
    line=$(grep -E " $mnt (9p|virtiofs) " /proc/mounts)
    dmesg 2>/dev/null | grep -iE "msize|9p|virtio" | while read -r l; do echo "CI-LM msize=$ms klog $l"; done
    if [ -z "$line" ]; then
        echo "CI-LM msize=$ms mount FAILED"
        continue
    fi
    echo "CI-LM msize=$ms mount $line"
    if has_test posix; then
        echo "CI-LM-TESTS msize=$ms posix"
        rm -rf "$mnt/posix"
        mkdir -p "$mnt/posix"
        /ci/bin/posix-suite "$mnt/posix"
        want=$(cat "$mnt/data/big.sha256" 2>/dev/null)
        got=$(sha256sum "$mnt/data/big.bin" 2>/dev/null | cut -d' ' -f1)
        if [ -n "$want" ] && [ "$want" = "$got" ]; then
            echo "POSIX PASS big_file_checksum (${mib} MiB)"
        else
            echo "POSIX FAIL big_file_checksum: guest sha256 '$got', host sha256 '$want'"
        fi
        rm -rf "$mnt/posix"
    fi
    if has_test dd; then
        mkdir -p "$mnt/dd"
        count=$((mib * 1024 / bs))
        drop
        timed write "$ms" $((count * bs * 1024)) \
            dd if=/dev/zero of="$mnt/dd/zero-$ms.bin" bs="${bs}k" count="$count" conv=fsync
        drop
        diag begin "$ms"
        timed read "$ms" "$(stat -c %s "$mnt/data/big.bin")" \
            dd if="$mnt/data/big.bin" of=/dev/null bs="${bs}k"
        diag end "$ms"
        # The same read again from the page cache the first one filled:
        # the copy to user space alone, the ceiling of a buffered read.
        if has_test ceiling; then
            timed reread "$ms" "$(stat -c %s "$mnt/data/big.bin")" \
                dd if="$mnt/data/big.bin" of=/dev/null bs="${bs}k"
        fi
        sha=$(sha256sum "$mnt/dd/zero-$ms.bin" | cut -d' ' -f1)
        echo "CI-LM msize=$ms zero-sha $sha"
        rm -f "$mnt/dd/zero-$ms.bin"
        # The request rate: 4 KiB O_DIRECT reads, one request each.
        drop
        timed read4k "$ms" 16777216 dd if="$mnt/data/big.bin" of=/dev/null bs=4k count=4096 iflag=direct
        # O_DIRECT with large blocks: the request size is the block (up
        # to msize), with no page-cache copy in the guest.
        dbs=${CI_DIRECT_MIB:-128}
        [ "$dbs" -gt "$mib" ] && dbs=$mib
        dn=$((mib / dbs))
        drop
        timed wdirect "$ms" $((dn * dbs * 1048576)) \
            dd if=/dev/zero of="$mnt/dd/direct-$ms.bin" bs="${dbs}M" count="$dn" oflag=direct
        rm -f "$mnt/dd/direct-$ms.bin"
        drop
        timed rdirect "$ms" $((dn * dbs * 1048576)) \
            dd if="$mnt/data/big.bin" of=/dev/null bs="${dbs}M" count="$dn" iflag=direct
    fi
    if has_test fio && [ -x /ci/bin/fio ]; then
        for b in 1m 16m; do
            drop
            timed "fio$b" "$ms" "$(stat -c %s "$mnt/data/big.bin")" /ci/bin/fio --name=seq --filename="$mnt/data/big.bin" \
                --rw=read --bs=$b --direct=1 --ioengine=psync --numjobs=1 --thread --output-format=terse
        done
    fi
    if has_test pjdfstest; then
        echo "CI-LM-TESTS msize=$ms pjdfstest"
        rm -rf "$mnt/pjd"
        mkdir -p "$mnt/pjd"
        set --
        [ -f /ci/pjdfstest-args ] && set -- -e $(cat /ci/pjdfstest-args)
        NO_COLOR=1 CLICOLOR=0 /ci/bin/pjdfstest -c /ci/pjdfstest.toml -p "$mnt/pjd" "$@" 2>&1 | sed 's/^/PJD /'
        rm -rf "$mnt/pjd"
    fi
    cd /
    umount "$mnt" || echo "CI-LM msize=$ms umount failed"
    dmesg 2>/dev/null | grep -iE "9p|virtio|bug|warn" | while read -r l; do echo "CI-LM msize=$ms klog $l"; done
done
echo "CI-LM-DONE"
