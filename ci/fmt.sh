#!/usr/bin/env bash
# Formatting matches rustfmt.
source "$(dirname "$0")/lib.sh"
cargo fmt --all -- --check
