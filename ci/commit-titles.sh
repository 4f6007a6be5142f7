#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Commit titles since the check began: at most 60 characters, imperative
# ("Add x", not "Added x", "Adds x" or "Adding x"). Older commits are
# history and stay as they are.
source "$(dirname "$0")/lib.sh"

# The last commit before the check existed.
BASE=8a7f677
MAX=60

git rev-parse --verify -q "$BASE^{commit}" >/dev/null \
    || skip "commit $BASE is not in this clone (shallow?); fetch the history to check titles"

bad=0
while IFS= read -r line; do
    hash=${line%% *}
    title=${line#* }
    first=${title%% *}
    if [ ${#title} -gt $MAX ]; then
        echo "commit-titles: $hash: ${#title} characters (at most $MAX): $title"
        bad=1
    fi
    # Past tense, gerund and third person are not imperative; a few verbs
    # end that way in the imperative too.
    case $first in
        Embed|Feed|Need|Seed|Shed|Speed|Bring|String|Ping) ;;
        *ed|*ing|Adds|Fixes|Makes|Moves|Removes|Renames|Updates|Changes|Implements|Uses|Improves|Allows|Ensures)
            echo "commit-titles: $hash: not imperative (\"$first\"): $title"
            bad=1 ;;
    esac
done < <(git log --no-merges --format='%h %s' "$BASE..HEAD")
if [ $bad -ne 0 ]; then
    exit 1
fi
echo "commit-titles: $(git rev-list --no-merges --count "$BASE..HEAD") titles since $BASE are imperative and at most $MAX characters"
