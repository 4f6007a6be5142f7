#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Import circles between the modules of every crate's library and binaries.
# Two views, each must find none:
# - ci/source-cycles.py reads the sources, function bodies included (a
#   call into another module counts), with re-exports followed. Always run.
# - cargo-modules' graph (`use` lines and signatures, every method charged
#   to its type's module), through ci/module-cycles.py, where cargo-modules
#   is installed: `cargo install --locked cargo-modules --version 0.27.0`
#   (0.28 needs a newer rustc than this workspace's; ~20 min to build, so
#   ci/install.sh leaves it out).
source "$(dirname "$0")/lib.sh"
# The source reader must see a circle closed only in a function body and
# through a re-export, and none between a parent and its child.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
mkdir -p "$probe/circle" "$probe/facade/a"
printf 'mod a;\nmod b;\npub use a::Thing;\n' >"$probe/circle/lib.rs"
printf 'pub struct Thing;\npub fn f() { crate::b::g() }\n' >"$probe/circle/a.rs"
printf '// crate::a::f in a comment is no use\npub fn g() { let _ = crate::Thing; }\n' >"$probe/circle/b.rs"
printf 'pub mod a;\npub use a::inner::Item;\n' >"$probe/facade/lib.rs"
printf 'pub mod inner;\npub fn f() -> crate::Item { inner::Item }\n' >"$probe/facade/a/mod.rs"
printf 'pub struct Item;\npub fn g() { super::f(); }\n' >"$probe/facade/a/inner.rs"
if python3 ci/source-cycles.py "$probe/circle" >/dev/null ||
    ! python3 ci/source-cycles.py "$probe/facade" >/dev/null; then
    echo "module-cycles: ci/source-cycles.py misreads its probe crates" >&2
    exit 1
fi

rc=0
for manifest in crates/*/Cargo.toml; do
    crate=$(basename "$(dirname "$manifest")")
    echo "== $crate (sources)"
    python3 ci/source-cycles.py "crates/$crate/src" || rc=1
done

if ! command -v cargo-modules >/dev/null; then
    echo "module-cycles: cargo-modules is not installed: its view is left out (see the header)"
    exit $rc
fi
for manifest in crates/*/Cargo.toml; do
    crate=$(basename "$(dirname "$manifest")")
    targets=(--lib)
    for bin in $(cargo metadata --no-deps --format-version 1 --manifest-path "$manifest" |
        python3 -c 'import json,sys; m=json.load(sys.stdin)
for p in m["packages"]:
    for t in p["targets"]:
        if p["name"] == sys.argv[1] and "bin" in t["kind"]: print(t["name"])' "$crate"); do
        targets+=("--bin=$bin")
    done
    for target in "${targets[@]}"; do
        echo "== $crate $target (cargo-modules)"
        cargo modules dependencies -p "$crate" "$target" --all-features \
            --no-externs --no-sysroot 2>/dev/null |
            python3 ci/module-cycles.py || rc=1
    done
done
exit $rc
