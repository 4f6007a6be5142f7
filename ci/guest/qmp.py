#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""Sends one QMP command to a QEMU monitor socket and prints the answer.

Usage: qmp.py SOCKET JSON-COMMAND   (e.g. '{"execute": "stop"}')
The answer ("return" or "error") is printed as one line of JSON; events
QEMU sends meanwhile are skipped.
"""
import json
import socket
import sys

s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
f = s.makefile("rw")
json.loads(f.readline())


def cmd(c):
    f.write(json.dumps(c) + "\n")
    f.flush()
    while True:
        r = json.loads(f.readline())
        if "return" in r or "error" in r:
            return r


cmd({"execute": "qmp_capabilities"})
print(json.dumps(cmd(json.loads(sys.argv[2]))))
