# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""The circle search both import-circle checks share: module-cycles.py
(cargo-modules' graph) and source-cycles.py (the sources)."""


def circles(nodes, edges):
    """Strongly connected sets of more than one node (Tarjan's, iteratively),
    each sorted; `edges` maps a node to the nodes it uses."""
    index, low, on, stack, out = {}, {}, set(), [], []
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
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
                        out.append(sorted(scc))
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on.add(nxt)
                work.append((nxt, iter(sorted(edges[nxt]))))
            elif nxt in on:
                low[node] = min(low[node], index[nxt])
    return out


def print_circles(sccs, edges, why, name=str, title="circle"):
    """Prints each circle and, for each use that closes it, `why`'s example."""
    for scc in sccs:
        print(f"{title}: " + ", ".join(map(name, scc)))
        members = set(scc)
        for a in scc:
            for b in sorted(edges[a] & members):
                print(f"  {name(a)} uses {name(b)}  ({why[(a, b)]})")
