#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""Prints keys of a QMP answer (qmp.py's output, on stdin) on one line.

Usage: qmp.py SOCKET COMMAND 2>&1 | qmp-keys.py KEY...
The values of the answer's KEYs, space-separated, spaces inside a value
replaced by "_" and "-" for a missing key; "error: ..." for an error
answer or for output that is not JSON (qmp.py failed).
"""
import json
import sys

text = sys.stdin.read()
try:
    r = json.loads(text)
except ValueError:
    print("error: " + " ".join(text.split())[:200])
    sys.exit()
if "error" in r:
    print("error: " + r["error"].get("desc", "?"))
    sys.exit()
r = r["return"]
print(" ".join(str(r.get(k, "-")).replace(" ", "_") for k in sys.argv[1:]))
