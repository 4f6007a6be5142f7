#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Runs a command in the trixie chroot of prepare.sh, as root, with the
# repository bound at /src (the working directory) and the host's cargo
# registry and git caches bound at the chroot's CARGO_HOME, so crates are
# downloaded once, and the host's CA store at /etc/ssl/certs. /proc, /dev and the binds live in a private mount
# namespace: nothing stays mounted when the command ends.
# Usage: run.sh COMMAND [ARG...]      (environment: VAR=VALUE via `env`)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
ROOT=$CACHE/trixie-rust
[ -f "$ROOT/.prepared" ] || {
    echo "trixie-run: no chroot at $ROOT; run ci/trixie/prepare.sh" >&2
    exit 1
}
host_cargo=${CARGO_HOME:-$HOME/.cargo}
mkdir -p "$host_cargo/registry" "$host_cargo/git"

exec unshare --mount --propagation private bash -euo pipefail -c '
    root=$1 repo=$2 cargo=$3; shift 3
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mkdir -p "$root/src" "$root/root/.cargo/registry" "$root/root/.cargo/git"
    mount --bind "$repo" "$root/src"
    mount --bind "$cargo/registry" "$root/root/.cargo/registry"
    mount --bind "$cargo/git" "$root/root/.cargo/git"
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    # The host'"'"'s CA store: the registries may be reached through a proxy
    # whose CA only the host trusts.
    mount --bind /etc/ssl/certs "$root/etc/ssl/certs"
    mount -o remount,bind,ro "$root/etc/ssl/certs"
    exec chroot "$root" env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        CARGO_HOME=/root/.cargo TERM=dumb bash -c "cd /src && exec \"\$@\"" _ "$@"
' _ "$ROOT" "$repo" "$host_cargo" "$@"
