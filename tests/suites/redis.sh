# redis' suite in external-server mode on kernel sockets and through tcps
# (sourced by tests/suites.sh).

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# redis_unit SIDE DIR OUT UNIT: a fresh redis-server (the suite's own test
# config, on kernel sockets or under tcps run), the unit against it with
# runtest --host/--port, its output in OUT/<unit>.log.
redis_unit() {
  local side=$1 dir=$2 out=$3 unit=$4 name=${4//\//_} port data spid t0=$(date +%s)
  port=$(free_port)
  data=$tmp/redis-data/$side-$name
  mkdir -p "$data"
  local cmd=(redis-server "$dir/tests/assets/default.conf" --port "$port" --dir "$data"
    --pidfile "$data/redis.pid")
  [ "$side" = tcps ] && cmd=(env TCPS_SOCKET="$sock" TCPS_PRELOAD_STATS="$tmp/stats-redis"
    "$tcps" run --fallback fail -- "${cmd[@]}")
  "${cmd[@]}" >"$data/server.log" 2>&1 &
  spid=$!
  for _ in $(seq 200); do
    [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && break
    sleep 0.05
  done
  # Each side its own --baseport: runtest's own test-server port is picked
  # below it, and two runtests side by side would race for the same one.
  # A unit's own limit: the longest of the CI tier takes about 20 s on the
  # kernel, the longest of all about 60 s.
  local base=21111 rc=0 limit=150
  [ "$full" = 1 ] && limit=300
  [ "$side" = tcps ] && base=23111
  (cd "$dir" && timeout -k 5 "${SUITES_UNIT_TIMEOUT:-$limit}" ./runtest --host 127.0.0.1 --port "$port" \
    --baseport "$base" --single "$unit" --clients 1 >"$out/$name.log" 2>&1) || rc=$?
  kill "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
  local ok err
  ok=$(grep -c '\[.*ok.*\]:' "$out/$name.log" || true)
  err=$(grep -Ec '\[.*(err|exception|timeout).*\]:' "$out/$name.log" || true)
  say "redis $side $unit: $ok ok, $err failed, runtest exit $rc ($(( $(date +%s) - t0 )) s)"
}

# redis_pass SIDE DIR OUT UNIT...: the units one after another.
redis_pass() {
  local side=$1 dir=$2 out=$3 unit
  shift 3
  mkdir -p "$out"
  for unit in "$@"; do redis_unit "$side" "$dir" "$out" "$unit"; done
}

redis_units() {
  if [ -n "${SUITES_REDIS:-}" ]; then tr ' ' '\n' <<<"$SUITES_REDIS"
  elif [ "$full" = 1 ]; then list "$root/tests/suites/redis-full.txt"
  else list "$root/tests/suites/redis-ci.txt"; fi
}

# The kernel and the tcps pass run side by side (each unit is one client's
# round trips: mostly waiting), then a second kernel run of the units with a
# test that failed under tcps only.
run_redis() {
  local units=() candidates d b kpid tpid
  mapfile -t units < <(redis_units)
  for d in "$tmp/redis-kernel" "$tmp/redis-tcps"; do
    mkdir -p "$d/src"
    for b in redis-server redis-cli redis-benchmark redis-check-aof redis-check-rdb; do
      ln -sf "$(command -v "$b")" "$d/src/$b"
    done
  done
  say "redis: ${#units[@]} units in external-server mode, on kernel sockets and through tcps side by side"
  redis_pass kernel "$tmp/redis-kernel" "$tmp/redis-out/kernel" "${units[@]}" &
  kpid=$!
  redis_pass tcps "$tmp/redis-tcps" "$tmp/redis-out/tcps" "${units[@]}" &
  tpid=$!
  wait "$kpid" "$tpid"
  mapfile -t candidates < <(python3 tests/suites/compare.py redis --candidates \
    "$tmp/redis-out/kernel" "$tmp/redis-out/tcps")
  if [ "${#candidates[@]}" -gt 0 ]; then
    say "redis: ${#candidates[@]} units had tests failing under tcps only; their second kernel run"
    redis_pass kernel2 "$tmp/redis-kernel" "$tmp/redis-out/kernel2" "${candidates[@]//_//}"
  fi
  local rc=0
  python3 tests/suites/compare.py redis "$tmp/redis-out/kernel" "$tmp/redis-out/tcps" \
    "$tmp/redis-out/kernel2" || rc=1
  offloaded redis-server "$tmp/stats-redis" /usr/bin/redis-server || rc=1
  return "$rc"
}
