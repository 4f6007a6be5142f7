# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Shared helpers for the ci/ step scripts; source it, don't run it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Exit code a step uses to say "skipped" (the automake convention).
SKIP=77

# Prints a skip notice with its reason and ends the step as skipped.
skip() {
    echo "SKIP: $*"
    exit "$SKIP"
}
