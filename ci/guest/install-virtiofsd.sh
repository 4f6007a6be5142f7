#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Installs virtiofsd (the virtio-fs vhost-user daemon, the reference peer of
# the `virtiofsd` row) from crates.io with `cargo install --locked`, once.
# Build deps: Debian's libseccomp-dev and libcap-ng-dev. The binary is
# cached under $CACHE/virtiofsd; a second run returns at once. Prints the
# binary's path on the last line.
#
# Environment: VIRTIO_9P_CI_CACHE (default /var/cache/virtio-9p-ci),
#              VIRTIOFSD_VERSION (default 1.14.0).
set -euo pipefail
# shellcheck source=ci/guest/lib.sh
. "$(dirname "$0")/lib.sh"

CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
version=${VIRTIOFSD_VERSION:-1.14.0}
root=$CACHE/virtiofsd-$version
bin=$root/bin/virtiofsd

if [ -x "$bin" ]; then
    ln -sfn "$root" "$CACHE/virtiofsd"
    echo "$bin"
    exit 0
fi

need=()
dpkg -s libseccomp-dev >/dev/null 2>&1 || need+=(libseccomp-dev)
dpkg -s libcap-ng-dev >/dev/null 2>&1 || need+=(libcap-ng-dev)
dpkg -s pkg-config >/dev/null 2>&1 || need+=(pkg-config)
if [ ${#need[@]} -gt 0 ]; then
    log "installing build deps: ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -o DPkg::Lock::Timeout=600 "${need[@]}" >/dev/null
fi
log "cargo install --locked virtiofsd $version (a few minutes)"
mkdir -p "$CACHE"
CARGO_TARGET_DIR=$CACHE/virtiofsd-target cargo install --locked --quiet \
    virtiofsd --version "$version" --root "$root" >&2
rm -rf "$CACHE/virtiofsd-target"
[ -x "$bin" ] || { log "no binary at $bin after cargo install"; exit 1; }
ln -sfn "$root" "$CACHE/virtiofsd"
echo "$bin"
