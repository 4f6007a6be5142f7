#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Builds xfstests (fstests, GPL-2.0) from the pinned source tarball for the
# guest suite (ci/guest/xfstests.sh). It is a test tool run inside the guest
# from the tool disk; it is never part of a crate. The build is cached under
# $CACHE/xfstests-<commit>; a second run returns at once. Prints the built
# tree's path on the last line.
#
# Source: $XFSTESTS_TARBALL, default ../shared/xfstests/xfstests-63a29724.tar.gz
# beside the repository (see that directory's README.md).
# Environment: VIRTIO_9P_CI_CACHE (default /var/cache/virtio-9p-ci), JOBS.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=ci/guest/lib.sh
. "$here/lib.sh"
repo=$(cd "$here/../.." && pwd)
CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
commit=63a29724
JOBS=${JOBS:-$(nproc)}

tarball=${XFSTESTS_TARBALL:-}
if [ -z "$tarball" ]; then
    # The worktree may sit anywhere beside ../shared; the main clone too.
    for d in "$repo/../shared/xfstests" /work/shared/xfstests; do
        [ -f "$d/xfstests-$commit.tar.gz" ] && { tarball=$d/xfstests-$commit.tar.gz; break; }
    done
fi
[ -n "$tarball" ] && [ -f "$tarball" ] \
    || { log "no xfstests-$commit.tar.gz (set XFSTESTS_TARBALL)"; exit 1; }

dest=$CACHE/xfstests-$commit
tree=$dest/xfstests
stamp=$dest/.built-v1
if [ -f "$stamp" ] && [ -x "$tree/check" ]; then
    echo "$tree"
    exit 0
fi

# Build deps (shared/xfstests/README.md) and the tools the tests call.
need=()
for p in autoconf automake libtool make gcc pkg-config xfslibs-dev uuid-dev \
    libattr1-dev libacl1-dev libaio-dev liburing-dev libgdbm-dev libcap-dev \
    xfsprogs attr acl bc perl psmisc; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    log "installing: ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o DPkg::Lock::Timeout=600 "${need[@]}" >/dev/null
fi

rm -rf "$dest"
mkdir -p "$dest"
log "unpacking $tarball"
tar xzf "$tarball" -C "$dest"
[ -f "$tree/Makefile" ] || { log "no xfstests/Makefile in $tarball"; exit 1; }
log "building with $JOBS jobs (log: $dest/build.log, a few minutes)"
if ! (cd "$tree" && make -j "$JOBS") >"$dest/build.log" 2>&1; then
    tail -40 "$dest/build.log" >&2
    exit 1
fi
[ -x "$tree/ltp/fsstress" ] || { log "the build left no ltp/fsstress"; exit 1; }
touch "$stamp"
echo "$tree"
