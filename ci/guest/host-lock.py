#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""Whether a host process can take a POSIX write lock on a file now.

Usage: host-lock.py FILE
Prints "free", "held" (another process, e.g. the daemon for the guest,
holds it) or "no file (why)". The lock, when taken, ends with the process.
"""
import fcntl
import sys

try:
    f = open(sys.argv[1], "r+")
except OSError as e:
    print("no file (%s)" % e.strerror)
    sys.exit()
try:
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("free")
except OSError:
    print("held")
