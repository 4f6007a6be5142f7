#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# The library and daemon apart: with default features
# off, virtio-9p-server is the embeddable core and pulls in no CLI, logger
# backend, seccomp or vhost crate; it builds and its unit tests pass that
# way; the vhost-user feature builds without the daemon; the embed_abort
# example builds on the core alone; and the daemon build
# (`--features daemon`) has the binary, whose --help does not show the
# hidden --test-hook.
source "$(dirname "$0")/lib.sh"
crate=virtio-9p-server
forbidden='clap|env_logger|seccompiler|vhost|vhost-user-backend|mlock-policy'

tree=$(cargo tree --locked -e normal --no-default-features -p "$crate" --prefix none)
if bad=$(grep -E "^($forbidden) v" <<<"$tree" | sort -u) && [ -n "$bad" ]; then
    echo "lib-deps: the no-default-features library depends on:" >&2
    echo "$bad" >&2
    exit 1
fi
echo "lib-deps: no-default-features tree has none of: ${forbidden//|/, }"

cargo build --locked -p "$crate" --no-default-features
cargo test --locked -p "$crate" --no-default-features --lib
cargo check --locked -p "$crate" --no-default-features --features vhost-user --lib
# The VMM-side embedding example needs only the core.
cargo check --locked -p "$crate" --no-default-features --features test-utils --example embed_abort
cargo check --locked -p "$crate" --no-default-features --features test-utils --example embed_vmm
# A plain dependency (default features) is the core too.
tree=$(cargo tree --locked -e normal -p "$crate" --prefix none)
if bad=$(grep -E "^($forbidden) v" <<<"$tree" | sort -u) && [ -n "$bad" ]; then
    echo "lib-deps: the default-features library depends on:" >&2
    echo "$bad" >&2
    exit 1
fi

# The daemon build (what `cargo install --features daemon` and ci/guest
# build) has the binary; its test hooks stay out of --help.
cargo build --locked -p "$crate" --features daemon
bin=target/debug/$crate
[ -x "$bin" ] || { echo "lib-deps: daemon build made no $bin" >&2; exit 1; }
if "$bin" --help 2>&1 | grep -q -- '--test-hook'; then
    echo "lib-deps: --help shows the hidden --test-hook" >&2
    exit 1
fi
# The integration tests need the hidden flag in this build.
out=$("$bin" --shared-dir / --listen unix:/nonexistent/x --test-hook probe:/ 2>&1) || true
if grep -q "unexpected argument '--test-hook'" <<<"$out"; then
    echo "lib-deps: the daemon binary refuses --test-hook: $out" >&2
    exit 1
fi
echo "lib-deps: daemon binary built, --test-hook hidden"
