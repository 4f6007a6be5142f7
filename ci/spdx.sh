#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Every tracked .rs, .sh and .c file carries an SPDX license header in its
# first five lines (rust-vmm and cloud-hypervisor expect one).
source "$(dirname "$0")/lib.sh"

HEADER='SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause'

# Paths whose files are reported but do not fail the check (none now).
NOT_YET=()

missing=0 pending=0
while IFS= read -r -d '' file; do
    if head -n 5 "$file" | grep -qF "$HEADER"; then
        continue
    fi
    exempt=0
    for prefix in "${NOT_YET[@]+"${NOT_YET[@]}"}"; do
        [[ "$file" == "$prefix"* ]] && exempt=1
    done
    if [ "$exempt" -eq 1 ]; then
        pending=$((pending + 1))
    else
        echo "spdx: missing header: $file"
        missing=$((missing + 1))
    fi
done < <(git ls-files -z -- '*.rs' '*.sh' '*.c')

echo "spdx: $missing file(s) missing the header, $pending more in the not-yet list (${NOT_YET[*]:-none})"
[ "$missing" -eq 0 ]
