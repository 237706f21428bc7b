# Functions of tests/suites.sh (sourced; it sets root, tmp, tcps, sock, full,
# start and the functions say and fail).

# Debian packages the suites need, installed only if missing (one apt-get
# update first): the nginx modules nginx-tests loads (every file loads each
# module `nginx -V` lists as dynamic, so one missing .so fails them all), the
# perl modules and backends its files use (they skip themselves without
# them), tcl for redis' runtest.
need_packages() {
  local missing=() p
  for p in nginx redis-server redis-tools tcl perl openssl memcached \
      libnginx-mod-http-geoip libnginx-mod-http-image-filter libnginx-mod-http-perl \
      libnginx-mod-http-xslt-filter libnginx-mod-mail libnginx-mod-stream \
      libnginx-mod-stream-geoip libio-socket-ssl-perl libnet-ssleay-perl libfcgi-perl \
      libscgi-perl libcache-memcached-perl libcache-memcached-fast-perl libgd-perl \
      libcryptx-perl; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  command -v apt-get >/dev/null || fail "missing packages ${missing[*]} and no apt-get"
  local sudo=()
  [ "$(id -u)" = 0 ] || sudo=(sudo)
  say "installing ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

# Everything this run started: the server, and every process whose working
# directory or command line is inside $tmp (nginx -p $tmp/..., redis-server
# with its config there, perl backends of nginx-tests files stopped by their
# timeout). Then the check that nothing is left.
ours() {
  local d p
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = $$ ] || [ "$p" = "${BASHPID:-$$}" ] && continue
    if [[ "$(readlink "$d/cwd" 2>/dev/null)" == "$tmp"* ]] ||
       tr '\0' ' ' 2>/dev/null <"$d/cmdline" | grep -qF "$tmp"; then
      echo "$p"
    fi
  done
}
cleanup() {
  local rc=$? pids
  [ -n "${server_pid:-}" ] && kill "$server_pid" 2>/dev/null
  pids=$(ours)
  # shellcheck disable=SC2086 # a list of pids
  [ -n "$pids" ] && kill $pids 2>/dev/null
  for _ in $(seq 50); do [ -z "$(ours)" ] && break; sleep 0.1; done
  pids=$(ours)
  if [ -n "$pids" ]; then
    echo "suites.sh: killing what did not stop: $pids" >&2
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null
  fi
  [ -n "${server_pid:-}" ] && wait "$server_pid" 2>/dev/null
  if [ "${SUITES_KEEP:-0}" = 1 ]; then echo "suites.sh: kept $tmp" >&2; else rm -rf "$tmp"; fi
  exit "$rc"
}

# offloaded NAME STATS EXE: the preload's exit records of the program EXE
# (TCPS_PRELOAD_STATS) must show sockets and connections served by the TCP
# server. A record names the executable the link resolves to (Debian's
# redis-server is a link to redis-check-rdb), by path or by name.
offloaded() {
  local name=$1 stats=$2 exe sums
  exe=$(readlink -f "$3")
  [ -s "$stats" ] || { echo "$name: no exit records of the preload in $stats" >&2; return 1; }
  sums=$(grep -E " exe=($exe|${exe##*/}) " "$stats" | awk '{
      for (i = 1; i <= NF; i++) { split($i, kv, "="); s[kv[1]] += kv[2] }
      n++ } END { printf "processes=%d offloaded=%d accepted=%d kernel_tcp=%d direct=%d sendfile_bytes=%d",
      n, s["offloaded"], s["accepted"], s["kernel_tcp"], s["direct"], s["sendfile_bytes"] }')
  say "$name through tcps, the preload's exit records: $sums"
  field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<"$sums"; }
  [ "$(field offloaded)" -gt 0 ] && [ "$(field accepted)" -gt 0 ] ||
    { echo "$name: no offloaded sockets or connections in the exit records" >&2; return 1; }
  # --fallback fail and --balance off: no TCP socket on the kernel, no
  # connection handed over as a kernel socket.
  [ "$(field kernel_tcp)" -eq 0 ] && [ "$(field direct)" -eq 0 ] ||
    { echo "$name: TCP sockets on the kernel or handed over directly: $sums" >&2; return 1; }
}

# list FILE: the names of a selection file (comments and blank lines out).
list() { sed 's/#.*//' "$1" | tr -s ' \t' '\n\n' | sed '/^$/d'; }

# watch_progress DIR EXT TOTAL LABEL PID: a line every 20 s while PID runs.
watch_progress() {
  local dir=$1 ext=$2 total=$3 label=$4 pid=$5 n
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 200); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    n=$(find "$dir" -name "*$ext" | wc -l)
    say "$label: $n of $total started"
  done
}

. "$root/tests/suites/nginx.sh"
. "$root/tests/suites/redis.sh"
