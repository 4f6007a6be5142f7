#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""Finds import circles between the modules of one crate.

Reads the graph `cargo modules dependencies` prints (cargo-modules 0.27,
dot format) on stdin. Every item is charged to the module that owns it;
a module uses another when one of its items uses one of the other's. A
module's uses of its own ancestors and descendants are left out: a mod.rs
re-exporting its children and a child using its parent's items is how a
facade is built, not a circle. Prints each circle (a strongly connected
set of modules, with the uses that close it) and exits 1 if there is one.
"""
import re
import sys
from collections import defaultdict

from circles import circles, print_circles

NODE = re.compile(r'^\s*"([^"]+)" \[label="[^|]*?(\bmod|crate)\|')
EDGE = re.compile(r'^\s*"([^"]+)" -> "([^"]+)" \[label="uses"')


def owner(path, modules):
    while path not in modules:
        if "::" not in path:
            return None
        path = path.rsplit("::", 1)[0]
    return path


def related(a, b):
    return a == b or a.startswith(b + "::") or b.startswith(a + "::")


def main():
    lines = sys.stdin.read().splitlines()
    modules = set()
    for line in lines:
        m = NODE.match(line)
        if m:
            modules.add(m.group(1))
    uses = defaultdict(set)
    why = {}
    for line in lines:
        m = EDGE.match(line)
        if not m:
            continue
        a, b = owner(m.group(1), modules), owner(m.group(2), modules)
        if a is None or b is None or related(a, b):
            continue
        uses[a].add(b)
        why.setdefault((a, b), f"{m.group(1)} -> {m.group(2)}")

    sccs = circles(modules, uses)
    print_circles(sccs, uses, why)
    print(f"{len(modules)} modules, {len(sccs)} circles")
    return 1 if sccs else 0


if __name__ == "__main__":
    sys.exit(main())
