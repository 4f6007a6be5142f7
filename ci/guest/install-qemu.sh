#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Installs Debian's QEMU 10 (qemu-system-x86 and qemu-utils) from
# bookworm-backports (deb and deb-src enabled), plus the host tools the guest
# conformance run needs: diod (peer 9P server), socat, cpio, attr. No guest
# row boots this QEMU: every row runs on the stock QEMU >= 10.2 that
# build-qemu.sh builds from Debian's source (this package's glibc is too old
# for Debian's 10.2 binaries). It stays for its firmware (/usr/share/qemu,
# passed with -L), qemu-img, and the benches' QEMU anchors (qemu-system-x86_64
# on PATH). build-qemu.sh installs its own build dependencies. Idempotent: a
# second run only checks what is installed.
set -euo pipefail
# shellcheck source=ci/guest/lib.sh
. "$(dirname "$0")/lib.sh"

need_root() {
    if [ "$(id -u)" -ne 0 ]; then
        log "must run as root (apt)"
        exit 1
    fi
}

qemu_major() {
    command -v qemu-system-x86_64 >/dev/null || { echo 0; return; }
    local v
    v=$(qemu-system-x86_64 --version | sed -n 's/^QEMU emulator version \([0-9]*\)\..*/\1/p')
    echo "${v:-0}"
}

list=/etc/apt/sources.list.d/bookworm-backports.sources
updated=0
if [ ! -f "$list" ]; then
    need_root
    cat >"$list" <<'SRC'
Types: deb deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    apt-get update -qq
    updated=1
fi

# deb-src for bookworm itself is not needed; backports carries the QEMU source.
if [ "$(qemu_major)" -lt 10 ]; then
    need_root
    [ "$updated" -eq 1 ] || apt-get update -qq
    updated=1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports \
        --no-install-recommends qemu-system-x86 qemu-utils >/dev/null
fi

# Host-side tools: diod (peer 9P server), socat (relay), cpio (initramfs).
missing=()
command -v diod >/dev/null || missing+=(diod)
command -v socat >/dev/null || missing+=(socat)
command -v cpio >/dev/null || missing+=(cpio)
command -v setfattr >/dev/null || missing+=(attr)
if [ ${#missing[@]} -gt 0 ]; then
    need_root
    [ "$updated" -eq 1 ] || apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

echo "install-qemu: $(qemu-system-x86_64 --version | head -1)"
