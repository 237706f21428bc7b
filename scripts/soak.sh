#!/usr/bin/env bash
# The long version of the integrity matrix (crates/cli/tests/integrity.rs):
# runs it with TCPS_INTEGRITY_SOAK=1 (a 1 GiB file and a 1 GiB echo stream
# besides the CI sizes, 400 connections at once) again and again until
# the time is up, and counts rounds, stalls and byte differences.
#
#   scripts/soak.sh [--minutes N]     (default 30)
#
# Each round's output is kept in target/soak/round-N.log; a failed round
# (a stall, a difference, anything else) is reported with its log and the
# script exits 1 at the end. docs/RELIABILITY.md records what it covered.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=30
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes=$2; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "soak.sh: unknown argument: $1 (try --help)" >&2; exit 2 ;;
    esac
done

cargo build --release
# The test binary is run directly (not through cargo, which would hold the
# build directory's lock for the whole soak).
bin=$(cargo test --release -p tcps-cli --test integrity --no-run 2>&1 |
    sed -n 's/.*Executable tests\/integrity.rs (\(.*\))/\1/p' | tail -1)
[ -x "$bin" ] || { echo "soak.sh: no integrity test binary" >&2; exit 1; }
mkdir -p target/soak
end=$(( $(date +%s) + minutes * 60 ))
round=0 failed=0 stalls=0 diffs=0
start=$(date +%s)
while [ "$(date +%s)" -lt "$end" ]; do
    round=$((round + 1))
    log=target/soak/round-$round.log
    if TCPS_INTEGRITY_SOAK=1 "$bin" --nocapture > "$log" 2>&1; then
        status=ok
    else
        status=FAILED
        failed=$((failed + 1))
    fi
    stalls=$((stalls + $(grep -c 'STALLED' "$log" || true)))
    diffs=$((diffs + $(grep -c 'different bytes\|echo differs' "$log" || true)))
    cases=$(grep -c 'byte-identical\|echoed whole' "$log" || true)
    printf 'round %d: %s (%d program-configurations whole), %d min elapsed\n' \
        "$round" "$status" "$cases" $(( ($(date +%s) - start) / 60 ))
    [ "$status" = ok ] || grep -E 'panicked|STALLED|differ' "$log" | head -5
done
echo "soak.sh: $round rounds in $(( ($(date +%s) - start) / 60 )) min: $failed failed, $stalls stalls, $diffs byte differences"
[ "$failed" = 0 ]
