#!/usr/bin/env bash
# The direct share of balancing under a load step (see scripts/bench_balance_step.py).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/bench_balance_step.py "$@"
