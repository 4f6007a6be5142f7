#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""Finds import circles between the modules of one crate, from its sources.

cargo-modules draws its graph from `use` lines and signatures only; a
function body that calls into another module is invisible to it. This
reads every path a module's file names, bodies included: `crate::`,
`super::`, `self::` and child-module paths, `use` trees expanded, and
`pub use` re-exports followed to the module that defines the item.
Comments, strings and inline `#[cfg(test)] mod tests { .. }` blocks are
left out. A module's uses of its ancestors and descendants are not
circles (a mod.rs re-exporting its children, a child using its parent's
items). Prints each circle with the paths that close it and exits 1 if
there is one.

Usage: source-cycles.py SRC_DIR [ROOT_FILE...]  (default root files:
lib.rs and main.rs; each root is its own crate)
"""
import os
import re
import sys
from collections import defaultdict

from circles import circles, print_circles

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(src):
    """Source without comments, strings and char literals."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif (m := re.match(r'b?r(#*)"', src[i:i + 40])) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            end = '"' + m.group(1)
            j = src.find(end, i + len(m.group(0)))
            i = n if j < 0 else j + len(end)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and src[i] != '"':
                i += 2 if src[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and (m := re.match(r"'(\\.[^']*|[^\\'])'", src[i:i + 12])):
            i += len(m.group(0))
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(src, open_brace):
    depth = 0
    for i in range(open_brace, len(src)):
        if src[i] == "{":
            depth += 1
        elif src[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(src)


def drop_test_modules(src):
    while m := re.search(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+" + IDENT + r"\s*\{", src):
        src = src[:m.start()] + src[block_end(src, m.end() - 1):]
    return src


def use_tree(text):
    """Expands `a::{b, c::{d, e as f}}` into (path, name it is known by)."""
    text = re.sub(r"\s+as\s+", "@", text)
    text = re.sub(r"\s+", "", text)
    paths = []

    def walk(prefix, s):
        i, item = 0, ""
        while i < len(s):
            ch = s[i]
            if ch == "{":
                j = i
                depth = 0
                while True:
                    if s[j] == "{":
                        depth += 1
                    elif s[j] == "}":
                        depth -= 1
                        if depth == 0:
                            break
                    j += 1
                walk(prefix + item, s[i + 1:j])
                item, i = None, j + 1
                continue
            if ch == ",":
                if item:
                    paths.append(prefix + item)
                item, i = "", i + 1
                continue
            if item is not None:
                item += ch
            i += 1
        if item:
            paths.append(prefix + item)

    walk("", text)
    out = []
    for p in paths:
        p, _, alias = p.partition("@")
        p = p[:-6] if p.endswith("::self") else p
        out.append((p, alias or p.split("::")[-1]))
    return out


class Crate:
    def __init__(self, src_dir, root_file):
        self.files = {}  # module path (tuple) -> file
        self.code = {}  # module path -> its file without comments, strings, tests
        self.load(os.path.join(src_dir, root_file), ())
        self.reexports = {}  # (module, name) -> full path (tuple)
        for m, code in self.code.items():
            for u in re.finditer(r"\bpub(\([^)]*\))?\s+use\s+([^;]+);", code):
                for p, known_as in use_tree(u.group(2)):
                    full = self.absolute(m, p.split("::"))
                    if full and full[-1] != "*":
                        self.reexports[(m, known_as)] = full

    def load(self, path, module):
        self.files[module] = path
        code = self.code[module] = drop_test_modules(strip(open(path).read()))
        base = os.path.dirname(path)
        stem = os.path.splitext(os.path.basename(path))[0]
        if module and stem != "mod":
            base = os.path.join(base, stem)
        for m in re.finditer(r"(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", code):
            name = m.group(1)
            for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
                if os.path.exists(cand):
                    self.load(cand, module + (name,))
                    break

    def absolute(self, module, parts):
        """The crate path a path written in `module` names, or None (extern)."""
        if not parts or not parts[0]:
            return None
        head, rest = parts[0], parts[1:]
        if head == "crate":
            base = ()
        elif head == "self":
            base = module
        elif head == "super":
            base = module[:-1]
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
        elif module + (head,) in self.files:
            base, rest = module + (head,), rest
        else:
            return None
        return base + tuple(rest)

    def owner(self, path, seen=0):
        """The module that defines what `path` names."""
        for k in range(len(path), -1, -1):
            if path[:k] in self.files:
                mod, rest = path[:k], path[k:]
                if rest and (mod, rest[0]) in self.reexports and seen < 20:
                    target = self.reexports[(mod, rest[0])]
                    if target != path[:k + 1]:
                        return self.owner(target + rest[1:], seen + 1)
                return mod
        return ()

    def uses(self):
        edges, why = defaultdict(set), {}
        for m, code in self.code.items():
            paths = []
            for u in re.finditer(r"\buse\s+([^;]+);", code):
                paths += [p for p, _ in use_tree(u.group(1))]
            body = re.sub(r"\buse\s+[^;]+;", "", code)
            paths += re.findall(r"\b(?:crate|super|self)(?:::" + IDENT + r")+", body)
            for child in {k[len(m)] for k in self.files if len(k) > len(m) and k[:len(m)] == m}:
                paths += re.findall(r"(?<![\w:])" + child + r"(?:::" + IDENT + r")+", body)
            for p in paths:
                full = self.absolute(m, p.split("::"))
                if full is None:
                    continue
                o = self.owner(full)
                if related(m, o):
                    continue
                edges[m].add(o)
                why.setdefault((m, o), p)
        return edges, why


def related(a, b):
    return a[:len(b)] == b or b[:len(a)] == a


def name(m):
    return "::".join(m) or "(root)"


def main():
    src = sys.argv[1]
    roots = sys.argv[2:] or [f for f in ("lib.rs", "main.rs") if os.path.exists(os.path.join(src, f))]
    rc = 0
    for root in roots:
        crate = Crate(src, root)
        edges, why = crate.uses()
        found = circles(crate.files, edges)
        print_circles(found, edges, why, name, f"circle ({root})")
        print(f"{src}/{root}: {len(crate.files)} modules, {len(found)} circles")
        rc |= 1 if found else 0
    return rc


if __name__ == "__main__":
    sys.exit(main())
