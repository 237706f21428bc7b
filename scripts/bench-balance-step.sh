#!/usr/bin/env bash
# The direct share of balancing under a load step (see scripts/bench_balance_step.py).
set -euo pipefail
cd "$(dirname "$0")/.."
# The system python has the Debian matplotlib (a pyenv python may not).
py=python3; [ -x /usr/bin/python3 ] && py=/usr/bin/python3
exec "$py" scripts/bench_balance_step.py "$@"
