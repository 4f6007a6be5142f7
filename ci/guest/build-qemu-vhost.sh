#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Rebuilds QEMU from Debian's own source (the bookworm-backports package)
# with vhost-user-device and vhost-user-device-pci made user-creatable, so a
# generic vhost-user backend (our virtio-9p-server in vhost-user mode) can be
# plugged with `-device vhost-user-device-pci,virtio-id=9,...`, and with
# hw/virtio/vhost-user-base.c patched so that the device survives a restart
# of its backend (`-chardev socket,...,reconnect-ms=N`; see ci/guest/README.md,
# "Restarting the daemon"):
#   - realize waits for the chardev's first connection, as vhost-user-blk
#     does (with reconnect-ms the connect is asynchronous, and QEMU 10.0.2
#     stops at start: "Failed to set msg fds ... vhost_backend_init failed");
#   - on a reconnect, the vhost device that the disconnect cleaned up is
#     initialised again before the device is restarted (10.0.2 asserts
#     "vhost_dev_start: Assertion `hdev->vhost_ops' failed");
#   - a disconnect stops the vhost device only if the driver had started it
#     (10.0.2 asserts "memory_region_del_eventfd: Assertion
#     `i != mr->ioeventfd_nb' failed" when the backend dies before that, with
#     or without reconnect-ms); status and config accesses while no backend
#     is connected do nothing (config keeps its last contents);
#   - get_vhost, without which QMP's x-query-virtio-status and
#     x-query-virtio-queue-status call a NULL pointer while the device runs.
#
# Minimal configuration: x86_64-softmmu, TCG, q35, virtio-pci, virtio-serial,
# ISA serial, vhost-user. The binary is cached under $CACHE/qemu-vhost, keyed
# by this script's sha256: a second run returns at once, and any edit of
# this script (patches, configure flags) rebuilds it. Concurrent runs wait
# for each other (flock). Prints the binary's path on the last line.
#
# Environment: VIRTIO_9P_CI_CACHE (default /var/cache/virtio-9p-ci),
#              JOBS (default: nproc).
set -euo pipefail

CACHE=${VIRTIO_9P_CI_CACHE:-/var/cache/virtio-9p-ci}
PREFIX=$CACHE/qemu-vhost
BIN=$PREFIX/bin/qemu-system-x86_64
STAMP=$PREFIX/.built
KEY=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)
JOBS=${JOBS:-$(nproc)}

built() { [ -x "$BIN" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$KEY" ]; }
if built; then
    echo "$BIN"
    exit 0
fi

log() { echo "build-qemu-vhost: $*" >&2; }
mkdir -p "$CACHE"
exec 9>"$CACHE/.qemu-vhost.lock"
flock 9
if built; then
    echo "$BIN"
    exit 0
fi

# Build dependencies (meson >= 1.5 comes from bookworm-backports).
need=()
dpkg -s ninja-build >/dev/null 2>&1 || need+=(ninja-build)
dpkg -s libglib2.0-dev >/dev/null 2>&1 || need+=(libglib2.0-dev)
dpkg -s flex >/dev/null 2>&1 || need+=(flex)
dpkg -s bison >/dev/null 2>&1 || need+=(bison)
dpkg -s python3-venv >/dev/null 2>&1 || need+=(python3-venv)
dpkg -s gcc >/dev/null 2>&1 || need+=(gcc)
dpkg -s xz-utils >/dev/null 2>&1 || need+=(xz-utils)
dpkg -s python3-pycotap >/dev/null 2>&1 || need+=(python3-pycotap)
dpkg -s patch >/dev/null 2>&1 || need+=(patch)
if [ ${#need[@]} -gt 0 ]; then
    log "installing build deps: ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -t bookworm-backports "${need[@]}" >/dev/null
fi
meson_ok() {
    command -v meson >/dev/null || return 1
    local v
    v=$(meson --version)
    [ "$(printf '%s\n1.5.0\n' "$v" | sort -V | head -1)" = 1.5.0 ]
}
if ! meson_ok; then
    [ -f /etc/apt/sources.list.d/bookworm-backports.sources ] \
        || bash "$(dirname "$0")/install-qemu.sh" >&2
    log "installing meson from bookworm-backports"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -t bookworm-backports meson >/dev/null
fi

# Source: the orig tarball of the backports QEMU (the .dsc may 404 on the
# mirror, the orig tarball does not).
src_dir=$CACHE/src
mkdir -p "$src_dir"
cd "$src_dir"
tarball=$(ls qemu_*.orig.tar.xz 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$tarball" ]; then
    log "downloading QEMU source"
    apt-get source --download-only qemu >&2 || true
    tarball=$(ls qemu_*.orig.tar.xz 2>/dev/null | sort -V | tail -1 || true)
    [ -n "$tarball" ] || { log "no qemu orig tarball could be downloaded"; exit 1; }
fi
version=${tarball#qemu_}
version=${version%+ds.orig.tar.xz}
version=${version%.orig.tar.xz}
tree=$src_dir/qemu-$version
if [ "$(cat "$tree/.patched" 2>/dev/null)" != "$KEY" ]; then
    rm -rf "$tree"
    log "unpacking $tarball"
    tar xf "$tarball"
    for f in hw/virtio/vhost-user-device.c hw/virtio/vhost-user-device-pci.c; do
        grep -q 'dc->user_creatable = false;' "$tree/$f" \
            || { log "$f: no 'user_creatable = false' line to patch"; exit 1; }
        sed -i 's/dc->user_creatable = false;/dc->user_creatable = true;/' "$tree/$f"
    done
    # Restart of the backend under a running guest (see the header).
    patch -d "$tree" -p1 --forward --no-backup-if-mismatch --quiet <<'PATCH' \
        || { log "hw/virtio/vhost-user-base.c: the reconnect patch does not apply"; exit 1; }
--- a/hw/virtio/vhost-user-base.c
+++ b/hw/virtio/vhost-user-base.c
@@ -93,6 +93,10 @@
     VHostUserBase *vub = VHOST_USER_BASE(vdev);
     bool should_start = virtio_device_should_start(vdev, status);
 
+    if (!vub->connected) {
+        return;
+    }
+
     if (vhost_dev_is_started(&vub->vhost_dev) == should_start) {
         return;
     }
@@ -134,6 +138,11 @@
      */
     g_assert(vub->config_size && vub->vhost_user.supports_config == true);
 
+    /* No backend: vdev->config keeps what it last read. */
+    if (!vub->connected) {
+        return;
+    }
+
     if (vhost_dev_get_config(&vub->vhost_dev, config,
                              vub->config_size, &local_err)) {
         error_report_err(local_err);
@@ -147,6 +156,10 @@
 
     g_assert(vub->config_size && vub->vhost_user.supports_config == true);
 
+    if (!vub->connected) {
+        return;
+    }
+
     ret = vhost_dev_set_config(&vub->vhost_dev, config_data,
                                0, vub->config_size,
                                VHOST_SET_CONFIG_TYPE_FRONTEND);
@@ -199,6 +212,25 @@
     if (vub->connected) {
         return 0;
     }
+
+    /*
+     * vub_disconnect cleaned the vhost device up: initialise it again on
+     * the new connection, as vhost-user-blk does (realize did the first).
+     */
+    if (!vhost_dev->vhost_ops) {
+        struct vhost_virtqueue *vqs = g_new0(struct vhost_virtqueue,
+                                             vub->num_vqs);
+        Error *local_err = NULL;
+
+        vhost_dev->nvqs = vub->num_vqs;
+        vhost_dev->vqs = vqs;
+        if (vhost_dev_init(vhost_dev, &vub->vhost_user,
+                           VHOST_BACKEND_TYPE_USER, 0, &local_err) < 0) {
+            error_report_err(local_err);
+            g_free(vqs);
+            return -1;
+        }
+    }
     vub->connected = true;
 
     /*
@@ -230,7 +262,10 @@
     }
     vub->connected = false;
 
-    vub_stop(vdev);
+    /* Stop only what vub_start started (the driver may not have yet). */
+    if (vdev->vhost_started) {
+        vub_stop(vdev);
+    }
     vhost_dev_cleanup(&vub->vhost_dev);
     g_free(vhost_vqs);
 
@@ -300,6 +335,11 @@
         vub->vhost_user.supports_config = true;
     }
 
+    /* With reconnect-ms the chardev is still connecting: wait for it. */
+    if (qemu_chr_fe_wait_connected(&vub->chardev, errp) < 0) {
+        return;
+    }
+
     if (!vhost_user_init(&vub->vhost_user, &vub->chardev, errp)) {
         return;
     }
@@ -348,6 +388,12 @@
     do_vhost_user_cleanup(vdev, vub);
 }
 
+static struct vhost_dev *vub_get_vhost(VirtIODevice *vdev)
+{
+    VHostUserBase *vub = VHOST_USER_BASE(vdev);
+    return &vub->vhost_dev;
+}
+
 static void vub_class_init(ObjectClass *klass, void *data)
 {
     VirtioDeviceClass *vdc = VIRTIO_DEVICE_CLASS(klass);
@@ -358,6 +404,7 @@
     vdc->get_config = vub_get_config;
     vdc->set_config = vub_set_config;
     vdc->set_status = vub_set_status;
+    vdc->get_vhost = vub_get_vhost;
 }
 
 static const TypeInfo vub_types[] = {
PATCH
    # Debian's +ds tarball carries no firmware blobs; the host's packaged
    # firmware (-L /usr/share/qemu -L /usr/share/seabios) is used instead.
    sed -i 's/unpack_edk2_blobs = bzip2.found()/unpack_edk2_blobs = false/' "$tree/meson.build"
    # Our own device selection: q35 plus what vhost-user-device needs.
    cat >"$tree/configs/devices/x86_64-softmmu/vhost9p.mak" <<'MAK'
CONFIG_Q35=y
CONFIG_PCI_DEVICES=n
CONFIG_VIRTIO_PCI=y
CONFIG_VIRTIO_SERIAL=y
CONFIG_SERIAL_ISA=y
CONFIG_SERIAL_PCI=y
MAK
    echo "$KEY" >"$tree/.patched"
fi

build=$tree/build-vhost9p
rm -rf "$build"
mkdir -p "$build"
cd "$build"
log "configuring (log: $build/configure.log)"
# The system python (not a pyenv shim) sees Debian's meson and pycotap.
../configure \
    --python=/usr/bin/python3 \
    --prefix="$PREFIX" \
    --target-list=x86_64-softmmu \
    --without-default-devices \
    --with-devices-x86_64=vhost9p \
    --without-default-features \
    --enable-tcg \
    --enable-vhost-user \
    --enable-vhost-kernel \
    --disable-download \
    --disable-docs \
    --disable-install-blobs \
    --disable-tools \
    --disable-werror \
    --disable-debug-info \
    >configure.log 2>&1 || { tail -40 configure.log >&2; exit 1; }
log "building with $JOBS jobs (log: $build/build.log)"
ninja -j "$JOBS" qemu-system-x86_64 >build.log 2>&1 || { tail -60 build.log >&2; exit 1; }
mkdir -p "$PREFIX/bin"
install -m 0755 qemu-system-x86_64 "$BIN"
"$BIN" -device help 2>/dev/null | grep -q '"vhost-user-device-pci"' \
    || { log "built QEMU lists no vhost-user-device-pci"; exit 1; }
echo "$KEY" >"$STAMP"
log "done"
echo "$BIN"
