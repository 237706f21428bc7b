#!/usr/bin/env bash
# The docs an operator reads (issue 16 item 13): the README leads with what
# an operator does, states its requirements and what happens when the TCP
# server stops; no doc cites files that are not in this repository (the
# thesis is cited by its title); every doc a doc links to exists.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "FAIL: $*" >&2; exit 1; }

for heading in '## Requirements' '## Run it (operators)' '### When the TCP server stops or restarts' \
    '## Installing, and running as a service'; do
    grep -qxF "$heading" README.md || fail "README.md has no '$heading' section"
done
# The operator's section comes before the developers' one.
op=$(grep -n '^## Run it (operators)' README.md | cut -d: -f1)
dev=$(grep -n '^## Quick start for developers' README.md | cut -d: -f1)
[ "$op" -lt "$dev" ] || fail "README.md: the operator's section must come first"

# Source documents outside the repository are cited by title, not by path.
if grep -nE 'shared/seeds|[0-9]{3}_[0-9a-f]{16}' README.md docs/*.md; then
    fail "a doc cites a file that is not in this repository (cite the thesis by its title)"
fi
# Relative links in README.md and docs/*.md point at files that exist.
for f in README.md docs/*.md; do
    dir=$(dirname "$f")
    while read -r target; do
        [ -z "$target" ] || [ -e "$dir/$target" ] || fail "$f links to $target, which does not exist"
    done < <(grep -oE '\]\([^)#:]+\)' "$f" | sed -E 's/^\]\((.*)\)$/\1/' || true)
done
# Every source file a doc names (`....rs`, as a path or its tail) exists.
for f in README.md docs/*.md; do
    while read -r src; do
        [ -z "$src" ] && continue
        find crates examples -path "*$src" 2>/dev/null | grep . >/dev/null ||
            fail "$f names $src, which no longer exists"
    done < <(grep -ohE '`[A-Za-z0-9_/.-]+\.rs`' "$f" | tr -d '`' | sort -u || true)
done
echo "docs.sh: ok"
