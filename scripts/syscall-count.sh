#!/usr/bin/env bash
# Counts the system calls a host makes for N send/recv round trips through a
# busy-polling TCP server (strace -c -f over the whole host process, setup
# included), and prints syscalls per socket call.
#   scripts/syscall-count.sh [ROUND_TRIPS]   (default 100000)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100000}
command -v strace >/dev/null || apt-get install -y strace >/dev/null
[ -x target/release/tcps ] || cargo build --release
tmp=$(mktemp -d)
trap 'kill $srv 2>/dev/null; wait $srv 2>/dev/null; rm -rf "$tmp"' EXIT
RUST_LOG=warn target/release/tcps server --socket "$tmp/tcps.sock" --poll busy --cpus 1 &
srv=$!
for _ in $(seq 100); do [ -S "$tmp/tcps.sock" ] && break; sleep 0.05; done
taskset -c 0 strace -c -f -o "$tmp/strace.txt" \
  target/release/tcps bench pingpong --socket "$tmp/tcps.sock" --count "$n" --no-kernel --json > "$tmp/pp.json"
calls=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["socket_calls"])' "$tmp/pp.json")
total=$(awk '$NF=="total"{print $(NF-2)}' "$tmp/strace.txt")
cat "$tmp/pp.json"
echo "--- strace -c -f summary (whole host process, including attach and setup) ---"
cat "$tmp/strace.txt"
python3 - "$calls" "$total" <<'PY'
import sys
calls, total = int(sys.argv[1]), int(sys.argv[2])
print(f"host socket calls: {calls}, host system calls: {total}, system calls per socket call: {total/calls:.5f}")
PY
