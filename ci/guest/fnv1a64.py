#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""Prints the FNV-1a 64 of a file in hex, as ci/guest/src/migrate.c does.

Usage: fnv1a64.py FILE   ("unreadable (why)" when it cannot read FILE)
"""
import sys

h = 0xcbf29ce484222325
try:
    data = open(sys.argv[1], "rb").read()
except OSError as e:
    print("unreadable (%s)" % e.strerror)
    sys.exit()
for b in data:
    h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
print("%016x" % h)
