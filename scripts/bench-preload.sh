#!/usr/bin/env bash
# Unmodified nginx, pipelined HTTP/1.1 and redis on kernel sockets and through
# `tcps run`, side by side on the same CPUs (application CPU 0, `tcps server
# --cpus 1` and the clients CPU 1): throughput, application and server CPU per
# request, round trips and wake-ups per request, p50/p99 latency, as ratios.
# The driver is scripts/bench_preload.py (see its --help).
#
#   scripts/bench-preload.sh [--secs S] [--repeat N] [--out FILE] [--only SUBSTR]
set -euo pipefail
exec python3 "$(dirname "$0")/bench_preload.py" "$@"
