#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""A host process holding a POSIX write lock on a file until SIGUSR1.

Usage: lock-holder.py FILE MARKER
Locks FILE (fcntl F_SETLK, through lockf) and prints "locked <time>";
on SIGUSR1 it unlocks, creates MARKER at once, prints "released <time>
marker <time>" and exits; on SIGTERM it exits without a marker.
"""
import fcntl
import os
import signal
import sys
import time

path, marker = sys.argv[1], sys.argv[2]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGTERM})
fd = os.open(path, os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("locked %.3f" % time.time(), flush=True)
if signal.sigwait({signal.SIGUSR1, signal.SIGTERM}) != signal.SIGUSR1:
    sys.exit(0)
fcntl.lockf(fd, fcntl.LOCK_UN)
t = time.time()
os.close(os.open(marker, os.O_CREAT | os.O_WRONLY, 0o644))
print("released %.3f marker %.3f" % (t, time.time()), flush=True)
