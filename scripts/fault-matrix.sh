#!/usr/bin/env bash
# The fault matrix, long: SIGKILL to a host or to the TCP server at N seeded
# random points of a mixed workload, on both engines
# (crates/cli/tests/fault_matrix.rs explains the checks), and the table
# written to docs/results/fault-matrix.txt.
#
#   scripts/fault-matrix.sh [POINTS] [SEED]     defaults: 1000, 0x18f42026
#
# CI runs the same test with 200 points. A failing point prints the
# command that replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
points=${1:-1000}
seed=${2:-0x18f42026}
out=docs/results/fault-matrix.txt
cargo build --release --workspace
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
echo "fault-matrix.sh: $points points, seed $seed (both engines)…" >&2
TCPS_FAULT_POINTS="$points" TCPS_FAULT_SEED="$seed" TCPS_FAULT_TABLE="$tmp" \
    cargo test --release -p tcps-cli --test fault_matrix -- --test-threads=1
{
    echo "# scripts/fault-matrix.sh $points $seed   ($(date -u +%Y-%m-%d), $(uname -r), $(nproc) CPUs)"
    echo "# hangs, leaks, corrupt, unserved: points where that check failed (0 = none)"
    cat "$tmp"
} > "$out"
cat "$out"
