#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Semver check of the public API with cargo-semver-checks, for the crates
# made ready for crates.io. The baseline is SEMVER_BASELINE_REV,
# by default the merge-base of HEAD with main (on main itself: HEAD, which
# passes trivially). Skipped with a notice where the tool is not installed
# (ci/install.sh installs it).
#
# Until a crate's 0.1.0 is published, breaking changes are allowed: such a
# crate is checked and its findings printed, but they do not fail the step.
# Once it is published, add it to RELEASED: from then on its findings fail
# the step (and the baseline may as well be the published version:
# SEMVER_BASELINE_REV unset and `--baseline-version` instead).
source "$(dirname "$0")/lib.sh"

CRATES=(coro-pool mem-prealloc mlock-policy virtqueue-large virtio-9p-server)
# Crates published on crates.io, whose breaking changes fail this step.
RELEASED=()

if ! cargo semver-checks --version >/dev/null 2>&1; then
    skip "cargo-semver-checks is not installed (ci/install.sh installs it)"
fi

base=${SEMVER_BASELINE_REV:-}
if [ -z "$base" ]; then
    if git rev-parse --verify -q main >/dev/null; then
        base=$(git merge-base HEAD main)
    else
        base=$(git rev-parse HEAD)
    fi
fi
echo "semver: baseline $base ($(git log -1 --format=%s "$base"))"

failed=()
for crate in "${CRATES[@]}"; do
    released=0
    for r in "${RELEASED[@]}"; do [ "$r" = "$crate" ] && released=1; done
    if cargo semver-checks check-release -p "$crate" --all-features \
        --baseline-rev "$base"; then
        echo "semver: $crate: no breaking change against the baseline"
    elif [ "$released" -eq 1 ]; then
        failed+=("$crate")
    else
        echo "semver: $crate: breaking changes above are allowed: 0.1.0 is not published yet"
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "semver: breaking changes in released crates: ${failed[*]}"
    exit 1
fi
