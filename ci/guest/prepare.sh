#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Prepares everything the guest conformance run needs, idempotently and with
# all downloads/builds cached under $VIRTIO_9P_CI_CACHE (default
# /var/cache/virtio-9p-ci):
#   Debian's QEMU firmware, qemu-utils and diod/socat (install-qemu.sh), the
#   guest kernels and base initramfs (fetch-kernel.sh), pjdfstest 0.2.2
#   (cargo install), the static guest tools (posix-suite, relay, lifecycle),
#   the two QEMU builds of build-qemu.sh (stock QEMU >= 10.2, the frontend
#   of every row, and the same tree with ci/guest/qemu-patches for the
#   restart scenario), and for the virtiofsd row and the tool-disk suites
#   (suite.sh) virtiofsd (install-virtiofsd.sh), the xfstests build
#   (build-xfstests.sh) and the tool disk (tooldisk.sh, last: it copies the
#   host's installed packages).
# Usage: prepare.sh [--kernel 6.12|6.1]...
#   (--no-vhost-qemu is accepted and ignored: every row needs the stock QEMU.)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=ci/guest/lib.sh
. "$here/lib.sh"
CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
export VIRTIO_9P_CI_CACHE=$CACHE
kernels=()
while [ $# -gt 0 ]; do
    case $1 in
        --no-vhost-qemu) ;;
        --kernel) kernels+=("$2"); shift ;;
        *) echo "prepare: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
[ ${#kernels[@]} -gt 0 ] || kernels=(6.12 6.1)
mkdir -p "$CACHE"

bash "$here/install-qemu.sh" >&2
for k in "${kernels[@]}"; do
    bash "$here/fetch-kernel.sh" "$k" >/dev/null
done

# pjdfstest (the Rust rewrite) from crates.io, built once.
PJD=$CACHE/pjdfstest/bin/pjdfstest
if [ ! -x "$PJD" ]; then
    log "cargo install pjdfstest 0.2.2 (a few minutes)"
    CARGO_TARGET_DIR=$CACHE/pjdfstest-target cargo install --locked --quiet \
        pjdfstest --version 0.2.2 --root "$CACHE/pjdfstest" >&2
    rm -rf "$CACHE/pjdfstest-target"
fi

# Static guest tools, rebuilt when their source changes.
if ! dpkg -s libc6-dev >/dev/null 2>&1 || ! command -v gcc >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null
fi
sum=$(cat "$here"/src/*.c | sha256sum | cut -c1-16)
tools=$CACHE/tools/$sum
if [ ! -x "$tools/relay" ] || [ ! -x "$tools/posix-suite" ] || [ ! -x "$tools/lifecycle" ]; then
    mkdir -p "$tools"
    for t in posix-suite relay lifecycle; do
        gcc -static -O2 -Wall -Wextra -Werror -o "$tools/$t.tmp" "$here/src/$t.c"
        mv "$tools/$t.tmp" "$tools/$t"
    done
fi
ln -sfn "$tools" "$CACHE/tools/current"

bash "$here/build-qemu.sh" >/dev/null
bash "$here/install-virtiofsd.sh" >/dev/null
bash "$here/build-xfstests.sh" >/dev/null
bash "$here/tooldisk.sh" "${kernels[0]}" >/dev/null
log "ready (cache: $CACHE)"
