#!/usr/bin/env bash
# Coverage-guided fuzzing of what the server reads from hosts and scrapers:
# request decoding, the channel ring, send queues, receive/accept rings,
# control-socket messages and the metrics request parser (fuzz/).
#
#   scripts/fuzz.sh SECONDS [TARGET...]    every target (or those named) for SECONDS each
#
# libFuzzer (libfuzzer-sys) with sanitizer coverage, on stable Rust. Each
# target starts from its committed corpus (fuzz/corpus/TARGET; new inputs
# found go to a scratch copy, not into git) and prints executions and
# crashes; a crash input is kept in fuzz/artifacts/TARGET/ and makes the
# script fail. `scripts/test.sh` runs a short smoke pass.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:?usage: scripts/fuzz.sh SECONDS [TARGET...]}
shift
all=(request_decode channel_ring send_queue recv_rings control_msg metrics_request)
targets=("${@:-${all[@]}}")
[ $# -eq 0 ] && targets=("${all[@]}")

command -v g++ >/dev/null || { echo "fuzz.sh: g++ is needed (apt-get install g++)" >&2; exit 1; }
triple=$(rustc -vV | sed -n 's/^host: //p')
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# --target keeps the flags off build scripts and proc macros.
cargo build --quiet --release --manifest-path fuzz/Cargo.toml --target "$triple" --bins
bin=fuzz/target/$triple/release

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0
printf '%-16s %12s %10s %8s\n' target executions exec/s crashes
for t in "${targets[@]}"; do
    [ -x "$bin/$t" ] || { echo "fuzz.sh: no target $t (have: ${all[*]})" >&2; exit 2; }
    mkdir -p "$scratch/$t" "fuzz/artifacts/$t"
    [ -d "fuzz/corpus/$t" ] && cp -r "fuzz/corpus/$t/." "$scratch/$t/"
    log=$scratch/$t.log
    rc=0
    "$bin/$t" "$scratch/$t" -max_total_time="$secs" -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$t/" -close_fd_mask=3 >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    crashes=$(find "fuzz/artifacts/$t" -type f | wc -l)
    printf '%-16s %12s %10s %8s\n' "$t" "${execs:-?}" "${rate:-?}" "$crashes"
    if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
        failed=1
        echo "--- $t (exit $rc) ---" >&2
        tail -30 "$log" >&2
    fi
done
exit $failed
