#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Counts the named public items of the virtio-9p-server library: types,
# traits, free functions, constants, statics and macros, not fields,
# variants or methods. It builds rustdoc JSON of the library
# (no default features unless FEATURES is set, e.g. FEATURES=daemon) and
# counts the crate's own entries in `paths` per top-level module. Re-exports
# are counted once, at their defining module. The step fails when more than
# MAX_OUTSIDE_PROTOCOL (default 80, so the API stays narrow) live outside
# `protocol`; MAX_OUTSIDE_PROTOCOL= (empty) only prints the counts.
source "$(dirname "$0")/lib.sh"
crate=virtio-9p-server
krate=${crate//-/_}
features=(--no-default-features)
[ -n "${FEATURES:-}" ] && features+=(--features "$FEATURES")

RUSTC_BOOTSTRAP=1 cargo rustdoc --locked -q -p "$crate" --lib "${features[@]}" \
    -- -Z unstable-options --output-format json
json=target/doc/$krate.json
[ -f "$json" ] || { echo "public-items: no $json" >&2; exit 1; }

python3 - "$json" "${MAX_OUTSIDE_PROTOCOL-80}" <<'PY'
import collections, json, sys

doc = json.load(open(sys.argv[1]))
limit = sys.argv[2]
named = {"struct", "enum", "union", "trait", "trait_alias", "function",
         "constant", "static", "type_alias", "macro", "proc_macro"}
per = collections.Counter()
for entry in doc["paths"].values():
    if entry["crate_id"] != 0 or entry["kind"] not in named:
        continue
    path = entry["path"]
    per[path[1] if len(path) > 2 else "(crate root)"] += 1
total = sum(per.values())
outside = total - per.get("protocol", 0)
for module, n in sorted(per.items(), key=lambda kv: (-kv[1], kv[0])):
    print(f"{module:24} {n:4}")
print(f"{'total':24} {total:4}")
print(f"{'outside protocol':24} {outside:4}")
if limit and outside > int(limit):
    sys.exit(f"public-items: {outside} items outside protocol, limit {limit}")
PY
