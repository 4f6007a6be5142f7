#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# The one entry point for CI and for developers: runs every step in order,
# prints each step's name and time, and ends with a one-line summary.
# Usage: ci/test.sh [step...]     (default: all steps)
set -uo pipefail
cd "$(dirname "$0")/.."

ALL_STEPS=(fmt spdx commit-titles clippy msrv minimal-versions feature-matrix unit-tests aarch64 lib-deps module-cycles public-items embed-abort embed-vmm docs docs-rs semver publish-dry-run package-tests fuzz-smoke bench-quick guest-conformance guest-large-msize guest-lifecycle guest-migration guest-xfstests miri audit)
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=("${ALL_STEPS[@]}")

passed=() failed=() skipped=()
# Each step's output also goes to a log, so the summary can repeat the end
# of a failed step's output (CI reports often keep only the last lines).
logs=$(mktemp -d /tmp/ci-steps.XXXXXX)
start_all=$(date +%s)
for step in "${steps[@]}"; do
    script="ci/$step.sh"
    if [ ! -f "$script" ]; then
        echo "ci: unknown step '$step' (known: ${ALL_STEPS[*]})" >&2
        exit 2
    fi
    echo "=== step $step"
    start=$(date +%s)
    # Process substitution, not a pipe: a step's stray background child
    # holding stdout must not keep the step from ending.
    bash "$script" > >(tee "$logs/$step.log") 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    case $rc in
        0) passed+=("$step"); echo "=== step $step: ok (${secs}s)" ;;
        77) skipped+=("$step"); echo "=== step $step: skipped (${secs}s)" ;;
        *) failed+=("$step"); echo "=== step $step: FAILED with exit $rc (${secs}s)" ;;
    esac
done

total=$(( $(date +%s) - start_all ))
for step in "${failed[@]}"; do
    echo "=== the last lines of failed step $step (whole log: $logs/$step.log)"
    tail -n 40 "$logs/$step.log"
done
echo "ci summary: ${#passed[@]} steps ok, ${#failed[@]} failed (${failed[*]:-none}), ${#skipped[@]} skipped (${skipped[*]:-none}) in ${total}s"
[ ${#failed[@]} -eq 0 ]
