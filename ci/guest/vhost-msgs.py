#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""Decodes the vhost-user messages a daemon received.

Usage: vhost-msgs.py STRACE-FILE   (strace -xx -e trace=recvmsg of the daemon)
Prints one line a message, in order, with the fields that matter at a
reconnect (features, ring numbers, bases and addresses, fds).
"""
import re
import struct
import sys

names = {1: "GET_FEATURES", 2: "SET_FEATURES", 3: "SET_OWNER", 4: "RESET_OWNER",
         5: "SET_MEM_TABLE", 8: "SET_VRING_NUM", 9: "SET_VRING_ADDR",
         10: "SET_VRING_BASE", 11: "GET_VRING_BASE", 12: "SET_VRING_KICK",
         13: "SET_VRING_CALL", 14: "SET_VRING_ERR", 15: "GET_PROTOCOL_FEATURES",
         16: "SET_PROTOCOL_FEATURES", 17: "GET_QUEUE_NUM", 18: "SET_VRING_ENABLE",
         21: "SET_BACKEND_REQ_FD", 24: "GET_CONFIG", 25: "SET_CONFIG",
         31: "GET_INFLIGHT_FD", 32: "SET_INFLIGHT_FD", 34: "RESET_DEVICE",
         36: "GET_MAX_MEM_SLOTS", 37: "ADD_MEM_REG", 38: "REM_MEM_REG",
         39: "SET_STATUS", 40: "GET_STATUS"}
rx = re.compile(r'recvmsg\((\d+), \{.*?iov_base="([^"]*)".*?\}, \d+\) = (\d+)')
pending = None
for line in open(sys.argv[1]):
    m = rx.search(line)
    if not m:
        continue
    data = bytes.fromhex(m.group(2).replace("\\x", ""))[: int(m.group(3))]
    fds = len(re.findall(r"SCM_RIGHTS", line))
    if pending is None:
        if len(data) < 12:
            continue
        req, flags, size = struct.unpack_from("<III", data)
        body = data[12:]
        if size > len(body):
            pending = (req, flags, size, body, fds)
            continue
    else:
        req, flags, size, body, f0 = pending
        body += data
        fds += f0
        if size > len(body):
            pending = (req, flags, size, body, fds)
            continue
        pending = None
    n = names.get(req, "REQ_%d" % req)
    d = ""
    if req in (2, 16, 39) and len(body) >= 8:
        d = "0x%x" % struct.unpack_from("<Q", body)[0]
    elif req in (8, 10, 11, 18) and len(body) >= 8:
        i, num = struct.unpack_from("<II", body)
        d = "index=%d num=%d" % (i, num)
        if req == 10 and num > 0xffff:
            # Packed ring: last avail and used index, each with its wrap
            # counter in bit 15 (QEMU's virtio_queue_get_last_avail_idx).
            d += " (packed: avail=%d wrap=%d used=%d wrap=%d)" % (
                num & 0x7fff, (num >> 15) & 1, (num >> 16) & 0x7fff, num >> 31)
    elif req == 9 and len(body) >= 40:
        i, fl, desc, used, avail, logaddr = struct.unpack_from("<IIQQQQ", body)
        d = "index=%d desc=0x%x used=0x%x avail=0x%x" % (i, desc, used, avail)
    elif req in (12, 13, 14) and len(body) >= 8:
        u = struct.unpack_from("<Q", body)[0]
        d = "index=%d%s" % (u & 0xff, " (no fd)" if u & 0x100 else "")
    elif req in (37, 38) and len(body) >= 40:
        gpa, sz, ua, off = struct.unpack_from("<QQQQ", body, 8)
        d = "gpa=0x%x size=0x%x" % (gpa, sz)
    elif req == 5 and len(body) >= 8:
        d = "regions=%d" % struct.unpack_from("<I", body)[0]
    elif req in (24, 25) and len(body) >= 12:
        d = "offset=%d size=%d" % struct.unpack_from("<II", body)
    print("%s%s%s%s" % (n, " " + d if d else "", " +%d fd" % fds if fds else "",
                        " (needs reply)" if flags & 0x8 else ""))
