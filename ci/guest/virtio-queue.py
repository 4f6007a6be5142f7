#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""Prints QEMU's view of queue 0 of the first virtio device, over QMP.

Usage: virtio-queue.py SOCKET
Prints "last_avail=N used=N; guest avail.idx=N used.idx=N": QEMU's indices
and the guest's own, read from the rings (split rings only). Only while
the vhost device is stopped: with the device started,
x-query-virtio-queue-status asks the back-end for the ring base
(GET_VRING_BASE, which stops the ring) and, without the get_vhost hook of
ci/guest/qemu-patches/0001-*, crashes QEMU (a NULL vdc->get_vhost).
"""
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the tree
import qmp  # noqa: E402

try:
    cmd = qmp.connect(sys.argv[1])
except OSError as e:
    print("no QMP connection (%s)" % e)
    sys.exit()
devices = cmd({"execute": "x-query-virtio"}).get("return")
if not devices:
    print("no virtio device over QMP")
    sys.exit()
queue = {"path": devices[0]["path"], "queue": 0}
st = cmd({"execute": "x-query-virtio-queue-status", "arguments": queue}).get("return", {})
el = cmd({"execute": "x-query-virtio-queue-element", "arguments": queue})
if "return" in el:
    e = el["return"]
    guest = "guest avail.idx=%s used.idx=%s" % (e["avail"]["idx"], e["used"]["idx"])
else:
    guest = "guest indices: %s" % el["error"]["desc"]
print("last_avail=%s used=%s; %s" % (st.get("last-avail-idx"), st.get("used-idx"), guest))
