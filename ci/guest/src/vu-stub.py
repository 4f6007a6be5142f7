#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""A vhost-user back-end that only answers QEMU's device initialisation,
for ci/guest/qemu-repro.sh's `realize` and `blockers` scenarios: it
offers VIRTIO_F_VERSION_1, the 9p mount-tag bit, the protocol features
bit and, with `log-all`, VHOST_F_LOG_ALL; of the protocol features only
LOG_SHMFD: no CONFIG, no DEVICE_STATE. Serves one connection.

Usage: vu-stub.py SOCKET log-all|none
"""
import os
import socket
import struct
import sys

path, mode = sys.argv[1], sys.argv[2]
features = (1 << 32) | (1 << 30) | 1
if mode == "log-all":
    features |= 1 << 26
PROTOCOL_FEATURES = 1 << 1  # LOG_SHMFD
if os.path.exists(path):
    os.unlink(path)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(1)
conn, _ = srv.accept()


def recv_exact(n):
    data = b""
    while len(data) < n:
        # Messages may carry fds: take them and drop them.
        chunk, _, _, _ = conn.recvmsg(n - len(data), socket.CMSG_SPACE(64 * 4))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data


while True:
    req, flags, size = struct.unpack("<III", recv_exact(12))
    if size:
        recv_exact(size)
    print("request", req, flush=True)
    value = None
    if req == 1:  # GET_FEATURES
        value = features
    elif req == 15:  # GET_PROTOCOL_FEATURES
        value = PROTOCOL_FEATURES
    elif flags & 0x8:  # NEED_REPLY
        value = 0
    if value is not None:
        # Version 1, reply flag.
        conn.sendall(struct.pack("<IIIQ", req, 0x5, 8, value))
