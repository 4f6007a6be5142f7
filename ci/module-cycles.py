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

    # Tarjan's strongly connected components, iteratively.
    index, low, on, stack, sccs = {}, {}, set(), [], []
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(uses[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    scc = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        scc.append(w)
                        if w == node:
                            break
                    if len(scc) > 1:
                        sccs.append(sorted(scc))
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on.add(nxt)
                work.append((nxt, iter(sorted(uses[nxt]))))
            elif nxt in on:
                low[node] = min(low[node], index[nxt])

    for scc in sccs:
        print("circle: " + ", ".join(scc))
        members = set(scc)
        for a in scc:
            for b in sorted(uses[a] & members):
                print(f"  {a} uses {b}  ({why[(a, b)]})")
    print(f"{len(modules)} modules, {len(sccs)} circles")
    return 1 if sccs else 0


if __name__ == "__main__":
    sys.exit(main())
