#!/usr/bin/env bash
# End to end: the example web server through a TCP server (both engines, every
# --mode: copy, sync, async, async-registered; and each process-ahead
# mechanism of the server switched on and off) and on kernel sockets, fetched
# with curl. Every body must be byte-identical (SHA-256) to the file on disk
# and across the variants; /dynamic/N must have N bytes of a-z; pipelined
# HTTP/1.1 requests must be answered in order. The tcps_stats line the web
# server prints at exit must show the mode really ran (async sends queued;
# no copy of static files in the registered modes).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x examples/build/webserver ] || make examples >/dev/null
tcps=target/release/tcps
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir -p "$tmp/root/sub"
head -c 1 /dev/urandom > "$tmp/root/one.bin"
head -c 16384 /dev/urandom > "$tmp/root/index.html"
head -c 300001 /dev/urandom > "$tmp/root/sub/big.bin"     # larger than a channel arena
head -c 1048576 /dev/urandom > "$tmp/root/mega.bin"
files=(one.bin index.html sub/big.bin mega.bin)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_port() {
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  fail "web server did not listen on port $1"
}

# fetch_all VARIANT PORT: fetches every file and checks it against the disk.
fetch_all() {
  local v=$1 port=$2
  mkdir -p "$tmp/out/$v"
  for f in "${files[@]}"; do
    curl -sf --http1.1 "http://127.0.0.1:$port/$f" -o "$tmp/out/$v/$(basename "$f")" || fail "$v: GET /$f"
    cmp -s "$tmp/root/$f" "$tmp/out/$v/$(basename "$f")" || fail "$v: /$f differs from the file"
    [ "$(sha256sum < "$tmp/out/$v/$(basename "$f")")" = "$(sha256sum < "$tmp/root/$f")" ] ||
      fail "$v: /$f SHA-256 differs"
  done
  # A HEAD of the large file: headers only, the right Content-Length.
  curl -sfI --http1.1 "http://127.0.0.1:$port/sub/big.bin" | tr -d '\r' | grep -i >/dev/null '^content-length: 300001$' ||
    fail "$v: HEAD /sub/big.bin"
  curl -sf --http1.0 "http://127.0.0.1:$port/index.html" | cmp -s - "$tmp/root/index.html" || fail "$v: HTTP/1.0 body differs"
  local n
  for n in 12345 300000; do
    curl -sf "http://127.0.0.1:$port/dynamic/$n" -o "$tmp/out/$v/dyn"
    local got; got=$(wc -c < "$tmp/out/$v/dyn")
    [ "$got" -eq "$n" ] || fail "$v: /dynamic/$n returned $got bytes"
    [ "$(tr -d 'a-z' < "$tmp/out/$v/dyn" | wc -c)" -eq 0 ] || fail "$v: /dynamic/$n has bytes outside a-z"
  done
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/missing")
  [ "$code" = 404 ] || fail "$v: missing file gave $code"
  # Two pipelined requests on one connection, answered in order.
  python3 - "$port" "$tmp/root/one.bin" "$tmp/root/index.html" <<'PY' || fail "$v: pipelining"
import socket, sys
port, a, b = int(sys.argv[1]), open(sys.argv[2], 'rb').read(), open(sys.argv[3], 'rb').read()
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"GET /one.bin HTTP/1.1\r\nHost: x\r\n\r\nGET /index.html HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
def take(data):
    head, rest = data.split(b"\r\n\r\n", 1)
    n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0].split(b":")[1])
    return rest[:n], rest[n:]
first, rest = take(data)
second, rest = take(rest)
assert first == a and second == b and rest == b"", "pipelined bodies wrong"
PY
  echo "ok: $v"
}

run_variant() {
  local v=$1; shift
  local port; port=$(free_port)
  "$@" --root "$tmp/root" --port "$port" --threads 4 --quiet 2>"$tmp/$v.log" &
  pids+=($!)
  wait_port "$port"
  fetch_all "$v" "$port"
  kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
}

# check_stats VARIANT MODE: the web server's exit line of tcps_stats().
check_stats() {
  local v=$1 mode=$2 line
  line=$(grep 'tcps_stats:' "$tmp/$v.log") || fail "$v: no tcps_stats line at exit"
  field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<"$line"; }
  [ "$(field registered_misuse)" -eq 0 ] || fail "$v: registered buffers written in flight: $line"
  case $mode in
    async|async-registered) [ "$(field async_sends)" -gt 0 ] || fail "$v: no asynchronous sends: $line" ;;
    *) [ "$(field async_sends)" -eq 0 ] || fail "$v: unexpected asynchronous sends: $line" ;;
  esac
  # About 1.7 MB of static files were served: the copying modes copied them,
  # the registered modes copy only headers, requests and /dynamic bodies.
  case $mode in
    sync|async-registered) [ "$(field bytes_copied)" -lt 1048576 ] || fail "$v: static files were copied: $line" ;;
    *) [ "$(field bytes_copied)" -ge 1048576 ] || fail "$v: too few bytes copied: $line" ;;
  esac
  echo "   $line"
}

run_variant kernel examples/build/webserver --net kernel
examples/build/webserver --net kernel --mode async >/dev/null 2>&1 && fail "--net kernel accepted --mode async"
for engine in uring epoll; do
  sock="$tmp/tcps-$engine.sock"
  RUST_LOG=info "$tcps" server --socket "$sock" --engine "$engine" 2>"$tmp/server-$engine.log" &
  pids+=($!)
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
  [ -S "$sock" ] || fail "tcps server ($engine) did not start"
  for mode in copy sync async async-registered; do
    TCPS_SOCKET="$sock" run_variant "tcps-$engine-$mode" examples/build/webserver --net tcps --mode "$mode"
    check_stats "tcps-$engine-$mode" "$mode"
  done
  # The bytes really went through the TCP server: it saw the host attach and send.
  grep -q "host attached" "$tmp/server-$engine.log" || fail "$engine: the web server never attached"
  for _ in $(seq 40); do grep -q "host detached" "$tmp/server-$engine.log" && break; sleep 0.05; done
  grep "host detached" "$tmp/server-$engine.log" | grep -Eq "Send=[0-9]+" || fail "$engine: no sends through the server"
done
# server_counter ENGINE-LOG NAME: the sum of a counter over the server's
# "host detached" lines.
server_counter() {
  grep "host detached" "$1" | sed -n "s/.* $2=\([0-9]*\).*/\1/p" | awk '{s+=$1} END {print s+0}'
}

# Process-ahead (issue 4): each mechanism on and off, same bytes. The server
# defaults (everything on) ran above; here every other setting.
ahead_sets=(
  "all-off:--eager-accept off --eager-recv off --setup-with-accept off"
  "eaccept:--eager-accept on --eager-recv off --setup-with-accept off"
  "pull:--eager-accept off --eager-recv pull --setup-with-accept off"
  "push:--eager-accept off --eager-recv push --setup-with-accept off"
  "setup:--eager-accept off --eager-recv off --setup-with-accept on"
)
ahead_variants=()
for set in "${ahead_sets[@]}"; do
  name=${set%%:*}; flags=${set#*:}
  sock="$tmp/tcps-ahead-$name.sock"
  # shellcheck disable=SC2086 # flags are words
  RUST_LOG=info "$tcps" server --socket "$sock" $flags 2>"$tmp/server-ahead-$name.log" &
  srv=$!
  pids+=("$srv")
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
  [ -S "$sock" ] || fail "tcps server ($flags) did not start"
  for mode in sync async; do
    v="tcps-ahead-$name-$mode"
    TCPS_SOCKET="$sock" run_variant "$v" examples/build/webserver --net tcps --mode "$mode"
    check_stats "$v" "$mode"
    ahead_variants+=("$v")
  done
  kill "$srv"; wait "$srv" 2>/dev/null || true
  log="$tmp/server-ahead-$name.log"
  ea=$(server_counter "$log" accepts_eager); er=$(server_counter "$log" recvs_eager)
  case $name in
    eaccept) [ "$ea" -gt 0 ] || fail "$name: no connection was accepted ahead" ;;
    *) [ "$ea" -eq 0 ] || fail "$name: $ea connections accepted ahead with --eager-accept off" ;;
  esac
  case $name in
    pull|push) [ "$er" -gt 0 ] || fail "$name: nothing was received ahead" ;;
    *) [ "$er" -eq 0 ] || fail "$name: $er receives ahead with --eager-recv off" ;;
  esac
  echo "   server ($flags): accepts_eager=$ea recvs_eager=$er"
done
# Balancing (issue 15): half of the connections forced direct; the web
# server serves those on kernel sockets itself (--take-direct), same bytes.
sock="$tmp/tcps-direct.sock"
RUST_LOG=info "$tcps" server --socket "$sock" --balance-force-direct 50 2>"$tmp/server-direct.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || fail "tcps server (--balance-force-direct 50) did not start"
for mode in sync async-registered; do
  v="direct-$mode"
  TCPS_SOCKET="$sock" run_variant "$v" examples/build/webserver --net tcps --mode "$mode" --take-direct
  ahead_variants+=("$v")
done
for _ in $(seq 40); do [ "$(grep -c "host detached" "$tmp/server-direct.log")" -ge 2 ] && break; sleep 0.05; done
direct=$(server_counter "$tmp/server-direct.log" accepts_direct)
offl=$(server_counter "$tmp/server-direct.log" accepts_eager)
[ "$direct" -gt 0 ] || fail "balancing: no connection was handed over directly"
[ "$offl" -gt 0 ] || fail "balancing: no connection stayed offloaded"
echo "   balancing (--balance-force-direct 50): accepts_direct=$direct accepts_eager=$offl"

# With the defaults (everything on) the server processed ahead.
for engine in uring epoll; do
  log="$tmp/server-$engine.log"
  [ "$(server_counter "$log" accepts_eager)" -gt 0 ] || fail "$engine defaults: nothing accepted ahead"
  [ "$(server_counter "$log" recvs_eager)" -gt 0 ] || fail "$engine defaults: nothing received ahead"
done

for f in "${files[@]}"; do
  b=$(basename "$f")
  for engine in uring epoll; do
    for mode in copy sync async async-registered; do
      cmp -s "$tmp/out/kernel/$b" "$tmp/out/tcps-$engine-$mode/$b" || fail "$b differs between kernel and tcps-$engine-$mode"
    done
  done
  for v in "${ahead_variants[@]}"; do
    cmp -s "$tmp/out/kernel/$b" "$tmp/out/$v/$b" || fail "$b differs between kernel and $v"
  done
done
echo "webserver_curl: all variants served identical bytes"
