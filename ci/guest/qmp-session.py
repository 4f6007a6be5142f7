#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""A QMP client that stays connected for a whole scenario.

Usage: qmp-session.py SOCKET   (lifecycle.sh runs it as a coprocess, so a
command costs no interpreter start)
Connects (retrying while QEMU starts), negotiates capabilities, prints
"ready", then reads command names from stdin and prints
"<command> <milliseconds>ms [status]" for each. On an error reply, a
closed connection or no answer within QMP_TIMEOUT seconds (default 30) it
prints "qmp: <why>" and exits.
"""
import json
import os
import socket
import sys
import time

path = sys.argv[1]
limit = float(os.environ.get("QMP_TIMEOUT", "30"))


def fail(why):
    print("qmp: " + why, flush=True)
    sys.exit(1)


s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
for _ in range(300):
    try:
        s.connect(path)
        break
    except (FileNotFoundError, ConnectionRefusedError):
        time.sleep(0.1)
else:
    fail("cannot connect to " + path)
s.settimeout(limit)
f = s.makefile("rw")


def recv(name):
    while True:
        try:
            line = f.readline()
        except socket.timeout:
            fail("%s: no answer within %.0f s" % (name, limit))
        if not line:
            fail("%s: QEMU closed the connection" % name)
        msg = json.loads(line)
        if "event" not in msg:
            return msg


def run(name):
    f.write(json.dumps({"execute": name}) + "\n")
    f.flush()
    r = recv(name)
    if "error" in r:
        fail("%s: %s" % (name, r["error"]))
    return r["return"]


recv("greeting")
run("qmp_capabilities")
print("ready", flush=True)
for line in sys.stdin:
    for name in line.split():
        t = time.monotonic()
        r = run(name)
        ms = (time.monotonic() - t) * 1000
        status = r.get("status", "") if isinstance(r, dict) else ""
        print(("%s %.1fms %s" % (name, ms, status)).strip(), flush=True)
