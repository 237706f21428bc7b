#!/usr/bin/env bash
# Unmodified nginx (one 16 KiB static file) and redis on kernel sockets and
# through the TCP server (`tcps run`), same clients, same cores:
#
#   the application      CPU 0 (taskset; nginx: master + 1 worker)
#   tcps server          CPU 1 (--cpus 1, adaptive polling)
#   clients (wrk, redis-benchmark) CPU 1
#
# For each: throughput, latency percentiles, and CPU seconds used by the
# application processes, by the server, and in total (utime+stime from
# /proc, before/after the measured run). Loopback, no network namespace.
#
#   scripts/bench-preload.sh [SECONDS]      (default 5 s per run)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
tcps=target/release/tcps
[ -x "$tcps" ] && [ -f target/release/libtcps_preload.so ] || cargo build --release
for p in nginx wrk redis-server redis-benchmark; do
    command -v "$p" >/dev/null || { echo "bench-preload: $p missing (scripts/test.sh installs it)" >&2; exit 1; }
done
dir=$(mktemp -d /tmp/tcps-bench-preload.XXXXXX)
chmod 755 "$dir"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 0.3; rm -rf "$dir"; }
trap cleanup EXIT

hz=$(getconf CLK_TCK)
# CPU seconds (user+system) of the given pids and their threads.
cpu() { local t=0 p; for p in "$@"; do
    [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat")))
  done; echo "$t"; }
children() { pgrep -P "$1" 2>/dev/null | tr '\n' ' '; }
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; return 1; }

taskset -c 1 "$tcps" server --socket "$dir/tcps.sock" --cpus 1 >"$dir/server.log" 2>&1 &
srv=$!; pids+=("$srv")
for _ in $(seq 100); do [ -S "$dir/tcps.sock" ] && break; sleep 0.05; done

head -c 16384 /dev/urandom >"$dir/16k.bin"
mkdir -p "$dir/tmp"
results=()

# run NAME NET(kernel|tcps): prefix for the application command
app_prefix() { if [ "$1" = tcps ]; then echo "taskset -c 0 $tcps run --socket $dir/tcps.sock --"; else echo "taskset -c 0"; fi; }

bench_nginx() {
    local net=$1 port=$2 sendfile=$3
    cat >"$dir/nginx-$net.conf" <<CONF
worker_processes 1; daemon off; master_process on; pid $dir/nginx-$net.pid;
error_log $dir/nginx-$net.err warn; events { worker_connections 1024; }
http { access_log off; sendfile $sendfile; keepalive_requests 1000000;
  client_body_temp_path $dir/tmp; proxy_temp_path $dir/tmp; fastcgi_temp_path $dir/tmp;
  uwsgi_temp_path $dir/tmp; scgi_temp_path $dir/tmp;
  server { listen 127.0.0.1:$port; root $dir; } }
CONF
    $(app_prefix "$net") nginx -c "$dir/nginx-$net.conf" -p "$dir" >"$dir/nginx-$net.log" 2>&1 &
    local app=$!; pids+=("$app"); wait_port "$port"; sleep 0.3
    local master; master=$(cat "$dir/nginx-$net.pid")
    local procs="$master $(children "$master")"
    taskset -c 1 wrk -t1 -c32 -d1s "http://127.0.0.1:$port/16k.bin" >/dev/null   # warm-up
    local a0 s0; a0=$(cpu $procs); s0=$(cpu "$srv")
    taskset -c 1 wrk -t1 -c32 -d"${secs}s" --latency "http://127.0.0.1:$port/16k.bin" >"$dir/wrk-$net.txt"
    local a1 s1; a1=$(cpu $procs); s1=$(cpu "$srv")
    kill -QUIT "$(cat "$dir/nginx-$net.pid")"; wait "$app" 2>/dev/null || true
    python3 - "$dir/wrk-$net.txt" "$net" $(( a1 - a0 )) $(( s1 - s0 )) "$hz" "$sendfile" <<'PY'
import re, sys
t = open(sys.argv[1]).read(); net = sys.argv[2]; app, srv, hz = (int(x) for x in sys.argv[3:6]); sf = sys.argv[6]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
def lat(p):
    m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)", t, re.M)
    v = float(m.group(1)); return v / 1000 if m.group(2) == "us" else v * 1000 if m.group(2) == "s" else v
n = rps * float(re.search(r"requests in ([\d.]+)s", t).group(1))
errs = "Socket errors" in t or "Non-2xx" in t
print(f"| nginx 16 KiB, sendfile {sf} | {net} | {rps:,.0f} | {lat(50):.3f} / {lat(90):.3f} / {lat(99):.3f} | {app/hz:.2f} | {srv/hz:.2f} | {(app+srv)/hz:.2f} | {(app+srv)/hz/n*1e6:.1f} |" + (" (errors!)" if errs else ""))
PY
}

bench_redis() {
    local net=$1 port=$2
    $(app_prefix "$net") redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >"$dir/redis-$net.log" 2>&1 &
    local app=$!; pids+=("$app"); wait_port "$port"; sleep 0.3
    local procs="$app $(children "$app")"
    taskset -c 1 redis-benchmark -p "$port" -t get -n 20000 -c 32 -q >/dev/null   # warm-up
    local a0 s0; a0=$(cpu $procs); s0=$(cpu "$srv")
    local n=$(( secs * 40000 ))
    taskset -c 1 redis-benchmark -p "$port" -t set,get -n "$n" -c 32 --csv >"$dir/redis-$net.csv"
    local a1 s1; a1=$(cpu $procs); s1=$(cpu "$srv")
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; wait "$app" 2>/dev/null || true
    python3 - "$dir/redis-$net.csv" "$net" $(( a1 - a0 )) $(( s1 - s0 )) "$hz" "$n" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]))); net = sys.argv[2]
app, srv, hz, n = (int(x) for x in sys.argv[3:7])
for r in rows:
    print(f"| redis {r['test']} | {net} | {float(r['rps']):,.0f} | {float(r['p50_latency_ms']):.3f} / {float(r['p95_latency_ms']):.3f} (p95) / {float(r['p99_latency_ms']):.3f} | | | | |")
print(f"| redis SET+GET (CPU) | {net} | | | {app/hz:.2f} | {srv/hz:.2f} | {(app+srv)/hz:.2f} | {(app+srv)/hz/(2*n)*1e6:.1f} |")
PY
}

echo "| run | sockets | requests/s | latency ms p50 / p90 / p99 | app CPU s | server CPU s | total CPU s | CPU µs/request |"
echo "|---|---|---:|---|---:|---:|---:|---:|"
port=18400
for sf in on off; do
    for net in kernel tcps; do bench_nginx "$net" $((port++)) "$sf"; done
done
for net in kernel tcps; do bench_redis "$net" $((port++)); done
