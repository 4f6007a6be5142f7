#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""Sends one QMP command to a QEMU monitor socket and prints the answer.

Usage: qmp.py SOCKET JSON-COMMAND   (e.g. '{"execute": "stop"}')
The answer ("return" or "error") is printed as one line of JSON; events
QEMU sends meanwhile are skipped. Other scripts import connect().
"""
import json
import socket
import sys


def connect(path):
    """Connects to the QMP socket PATH, negotiates capabilities and returns
    a function that sends one command (a dict) and returns its answer."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
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
    return cmd


if __name__ == "__main__":
    print(json.dumps(connect(sys.argv[1])(json.loads(sys.argv[2]))))
