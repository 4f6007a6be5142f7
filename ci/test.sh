#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# The one entry point for CI and for developers: runs every step in order,
# prints each step's name and time, and ends with a one-line summary.
# Usage: ci/test.sh [step...]     (default: all steps)
set -uo pipefail
cd "$(dirname "$0")/.."

ALL_STEPS=(fmt spdx commit-titles clippy feature-matrix unit-tests lib-deps public-items embed-abort embed-vmm docs docs-rs semver publish-dry-run fuzz-smoke bench-quick guest-conformance guest-lifecycle guest-xfstests miri audit)
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=("${ALL_STEPS[@]}")

passed=() failed=() skipped=()
start_all=$(date +%s)
for step in "${steps[@]}"; do
    script="ci/$step.sh"
    if [ ! -f "$script" ]; then
        echo "ci: unknown step '$step' (known: ${ALL_STEPS[*]})" >&2
        exit 2
    fi
    echo "=== step $step"
    start=$(date +%s)
    bash "$script"
    rc=$?
    secs=$(( $(date +%s) - start ))
    case $rc in
        0) passed+=("$step"); echo "=== step $step: ok (${secs}s)" ;;
        77) skipped+=("$step"); echo "=== step $step: skipped (${secs}s)" ;;
        *) failed+=("$step"); echo "=== step $step: FAILED with exit $rc (${secs}s)" ;;
    esac
done

total=$(( $(date +%s) - start_all ))
echo "ci summary: ${#passed[@]} steps ok, ${#failed[@]} failed (${failed[*]:-none}), ${#skipped[@]} skipped (${skipped[*]:-none}) in ${total}s"
[ ${#failed[@]} -eq 0 ]
