#!/bin/bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Runs inside the guest, chrooted into the tool disk (guest-run.sh mounts it
# and /results), as /ci/suite. CI_TESTS names the suite:
#
#   xfstests   FSTYP=9p (or virtiofs) with TEST_DEV=xfstests-testdev,
#              SCRATCH_DEV=xfstests-scratchdev.
#              /ci/xfstests.args holds check's test selection (a list or
#              "-g quick"), /ci/xfstests.exclude the exclude list. Output:
#              "XFS <check's line>", then one "XFS-RESULT <test> pass|fail|
#              notrun" per test, and the results tree under
#              /results/out/xfstests (the host reads it back).
#   workloads  timed user workloads on the share (tag CI_SRC; for virtiofs
#              CI_SRC is the cache=never share and CI_SRC_CACHED the
#              cache=auto one), strict then cached, each step CI_WL_REPS
#              times (default 3):
#              "CI-WL <setting> <step> <rep> <milliseconds>" ("fail" for a
#              step that failed).
#
# Settings from the kernel command line, as for guest-run.sh: CI_MODE,
# CI_SRC, CI_SRC_CACHED, CI_OPTS (9p mount options without trans/version),
# CI_XFS_TEST_TIMEOUT (seconds one xfstests test may take, default 900).
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LC_ALL=C TERM=dumb
out=/results/out
mkdir -p "$out"
ms() { date +%s%3N; }

mount_share() { # target setting(strict|cached)
    local target=$1 setting=$2 cache src=${CI_SRC:-share}
    mkdir -p "$target"
    case ${CI_MODE:-virtio} in
    virtiofs)
        [ "$setting" = cached ] && src=${CI_SRC_CACHED:-$src}
        mount -t virtiofs "$src" "$target"
        ;;
    virtio|unix)
        cache=mmap
        [ "$setting" = cached ] && cache=loose
        local o="version=9p2000.L,${CI_OPTS:+$CI_OPTS,}cache=$cache"
        if [ "$CI_MODE" = unix ]; then
            mount -t 9p -o "trans=unix,$o" /run/9p.sock "$target"
        else
            mount -t 9p -o "trans=virtio,$o" "$src" "$target"
        fi
        ;;
    esac || return 1
    echo "CI-MOUNT $setting $(grep " $target " /proc/mounts)"
}

# ------------------------------------------------------------------ xfstests
# A test that hangs would stop the whole row: when check's output has not
# moved for the limit, print what runs (XFS-PS) and kill every process
# below check (the test and what it started; check then records the test
# as failed and goes on). XFS-RUNNING names each test as it starts, since
# check prints a test's line only when it ends.
descendants() { # pid -> its descendants, breadth first
    local frontier=$1 next all=
    while [ -n "$frontier" ]; do
        next=$(ps -eo pid=,ppid= | awk -v f=" $frontier " 'index(f, " " $2 " ") { printf "%s ", $1 }')
        all="$all $next"
        frontier=${next% }
    done
    echo $all
}
xfs_watchdog() { # check-pid limit
    local chk=$1 limit=$2 cur= size=-1 since now t victims
    since=$(date +%s)
    while sleep 10; do
        # The test runs as "/bin/bash /opt/xfstests/tests/generic/NNN".
        t=$(ps -eo args= | sed -n 's|^/bin/bash [^ ]*/tests/\([a-z0-9]*/[0-9][0-9]*\)$|\1|p' | head -1)
        if [ -n "$t" ] && [ "$t" != "$cur" ]; then
            echo "XFS-RUNNING $t"
            cur=$t
        fi
        now=$(date +%s)
        if [ "$(stat -c %s "$out/check.out")" != "$size" ]; then
            size=$(stat -c %s "$out/check.out")
            since=$now
            continue
        fi
        [ $((now - since)) -ge "$limit" ] || continue
        victims=$(descendants "$chk")
        echo "XFS-WATCHDOG killed ${cur:-?} after $((now - since))s without progress"
        ps -eo pid=,ppid=,stat=,wchan:24=,etimes=,args= | awk -v v=" $victims " 'index(v, " " $1 " ")' \
            | cut -c1-160 | sed 's/^/XFS-PS /'
        [ -n "$victims" ] && kill -KILL $victims 2>/dev/null
        since=$now
    done
}

run_xfstests() {
    local fstyp=9p args=() rc
    cd /opt/xfstests || { echo "XFS-ERROR no /opt/xfstests on the tool disk"; return 1; }
    if [ "${CI_MODE:-virtio}" = virtiofs ]; then
        fstyp=virtiofs
    else
        export PLAN9_MOUNT_OPTIONS="-o trans=virtio,version=9p2000.L${CI_OPTS:+,$CI_OPTS}"
    fi
    # Tags no test's file names contain: _filter_scratch and _filter_test_dir
    # rewrite every occurrence of the device names in a test's output.
    export FSTYP=$fstyp TEST_DEV=xfstests-testdev TEST_DIR=/mnt/test
    export SCRATCH_DEV=xfstests-scratchdev SCRATCH_MNT=/mnt/scratch
    export RESULT_BASE=$out/xfstests
    mkdir -p "$TEST_DIR" "$SCRATCH_MNT" "$RESULT_BASE"
    read -r -a args </ci/xfstests.args
    echo "CI-XFS-CONFIG FSTYP=$FSTYP TEST_DEV=$TEST_DEV SCRATCH_DEV=$SCRATCH_DEV ${PLAN9_MOUNT_OPTIONS:-}"
    # Prove the mount the way the other suites do.
    if _m=$(mount -t "$fstyp" ${PLAN9_MOUNT_OPTIONS:-} "$TEST_DEV" /mnt/test 2>&1); then
        echo "CI-MOUNT $(grep ' /mnt/test ' /proc/mounts)"
        umount /mnt/test
    else
        echo "CI-MOUNT-FAILED $_m"
        return 1
    fi
    ./check -E /ci/xfstests.exclude "${args[@]}" >"$out/check.out" 2>&1 &
    local chk=$!
    xfs_watchdog $chk "${CI_XFS_TEST_TIMEOUT:-900}" &
    local wd=$!
    tail -n +1 -f --pid=$chk "$out/check.out" | sed -u 's/^/XFS /'
    wait $chk
    rc=$?
    kill $wd 2>/dev/null
    echo "CI-XFS-EXIT rc=$rc"
    # Per-test status from check's summary lines (Ran: includes notrun).
    local ran notrun bad t
    ran=$(sed -n 's/^Ran: //p' "$out/check.out" | tail -1)
    notrun=" $(sed -n 's/^Not run: //p' "$out/check.out" | tail -1) "
    bad=" $(sed -n 's/^Failures: //p' "$out/check.out" | tail -1) "
    for t in $ran; do
        case $bad in *" $t "*) echo "XFS-RESULT $t fail"; continue ;; esac
        case $notrun in *" $t "*) echo "XFS-RESULT $t notrun"; continue ;; esac
        echo "XFS-RESULT $t pass"
    done
    # The first lines of each failure's diff, for the report.
    for t in $bad; do
        [ -f "$RESULT_BASE/$t.out.bad" ] || continue
        diff -u "tests/$t.out" "$RESULT_BASE/$t.out.bad" 2>/dev/null | head -20 | sed "s|^|XFS-DIFF $t |"
    done
}

# ----------------------------------------------------------------- workloads
# The tree: xfstests' own source (4650 files, 33 directories, 23 MiB) from
# the pinned tarball in the payload; the git repository and the fio file
# were made on the host in the share (ci/guest/suite.sh).
wl_step() { # setting step rep command...
    local setting=$1 step=$2 rep=$3 t0 t1
    shift 3
    sync
    echo 3 >/proc/sys/vm/drop_caches
    t0=$(ms)
    if "$@" >/dev/null 2>"/tmp/wl-$step.err"; then
        t1=$(ms)
        echo "CI-WL $setting $step $rep $((t1 - t0))"
    else
        echo "CI-WL $setting $step $rep fail"
        head -3 "/tmp/wl-$step.err" | sed "s/^/CI-WL-ERR $setting $step: /"
    fi
}
fio_ms() { # fio args... -> prints the job's runtime in ms (terse v3)
    local line
    line=$(fio --output-format=terse --terse-version=3 "$@") || return 1
    # Fields: 9 read runtime (ms), 50 write runtime (ms).
    awk -F';' '{ r = $9 + 0; w = $50 + 0; print (r > w ? r : w) }' <<<"$line"
}
wl_fio() { # setting step rep fio-args...
    local setting=$1 step=$2 rep=$3 v
    shift 3
    sync
    echo 3 >/proc/sys/vm/drop_caches
    if v=$(fio_ms "$@" 2>"/tmp/wl-$step.err") && [ -n "$v" ] && [ "$v" -gt 0 ]; then
        echo "CI-WL $setting $step $rep $v"
    else
        echo "CI-WL $setting $step $rep fail"
        head -3 "/tmp/wl-$step.err" | sed "s/^/CI-WL-ERR $setting $step: /"
    fi
}

run_workloads() {
    local m=/mnt/work setting rep w
    gzip -dc /ci/tree.tar.gz >/tmp/tree.tar || { echo "CI-WL-ERROR no /ci/tree.tar.gz"; return 1; }
    local settings=${CI_WL_SETTINGS:-strict,cached}
    for setting in ${settings//,/ }; do
        mount_share "$m" "$setting" || { echo "CI-MOUNT-FAILED $setting"; continue; }
        [ -d "$m/wl/repo/.git" ] && [ -f "$m/wl/fio.dat" ] || echo "CI-WL-ERROR the host-made repo or fio file is missing"
        git config --global --add safe.directory '*'
        for rep in $(seq 1 "${CI_WL_REPS:-3}"); do
            w=$m/wl/run
            rm -rf "$w" "$w.copy"
            mkdir -p "$w"
            wl_step "$setting" unpack "$rep" tar -xf /tmp/tree.tar -C "$w"
            wl_step "$setting" find_stat "$rep" find "$w" -printf '%s %m %u %T@\n'
            wl_step "$setting" read_all "$rep" sh -c "find '$w' -type f -exec cat {} + >/dev/null"
            wl_step "$setting" cp_a "$rep" cp -a "$w" "$w.copy"
            wl_step "$setting" rm_rf "$rep" rm -rf "$w.copy" "$w"
            wl_step "$setting" git_status "$rep" git -C "$m/wl/repo" status --porcelain
            wl_step "$setting" git_log_p "$rep" git -C "$m/wl/repo" log -p -20
            local f=(--filename="$m/wl/fio.dat" --size=256M --ioengine=libaio --direct=1
                --randrepeat=1 --randseed=31 --norandommap=1 --group_reporting)
            wl_fio "$setting" fio_randread_4k "$rep" --name=rr "${f[@]}" --rw=randread --bs=4k --iodepth=16 --io_size=16M
            wl_fio "$setting" fio_seqread_1m "$rep" --name=sr "${f[@]}" --rw=read --bs=1M --iodepth=16 --io_size=256M
            wl_fio "$setting" fio_randwrite_4k "$rep" --name=rw "${f[@]}" --rw=randwrite --bs=4k --iodepth=16 --io_size=8M --end_fsync=1
        done
        cd /
        umount "$m" || echo "CI-WARN umount $m failed"
    done
}

case ",${CI_TESTS:-}," in
*,xfstests,*) run_xfstests ;;
*,workloads,*) run_workloads ;;
*) echo "CI-SUITE-ERROR unknown CI_TESTS '${CI_TESTS:-}'"; exit 1 ;;
esac
