# nginx-tests on kernel sockets and through tcps (sourced by tests/suites.sh).

# prove_side SIDE NGINX FILE...: one prove -j2 run; each file's TAP is kept in
# $tmp/tap/SIDE/<file>.tap (tests/suites/tap-save).
prove_side() {
  # A file's own limit: the longest file of the CI tier takes about 10 s on
  # the kernel, the longest of all about 30 s.
  local side=$1 nginx=$2 t0=$(date +%s) pid file_timeout=60
  [ "$full" = 1 ] && file_timeout=180
  shift 2
  mkdir -p "$tmp/tap/$side"
  (
    cd "$tmp/nginx-tests"
    SUITES_TAP_DIR=$tmp/tap/$side SUITES_FILE_TIMEOUT=${SUITES_FILE_TIMEOUT:-$file_timeout} TMPDIR=$tmp/t \
      TEST_NGINX_BINARY=$nginx TEST_NGINX_MODULES=/usr/lib/nginx/modules \
      TEST_NGINX_GLOBALS="user root;" \
      exec prove -j2 --timer --exec "$root/tests/suites/tap-save" "$@"
  ) >"$tmp/prove-$side.log" 2>&1 &
  pid=$!
  watch_progress "$tmp/tap/$side" .tap $# "nginx-tests $side" "$pid"
  wait "$pid" || true
  say "nginx-tests $side: $(grep -E '^(Files=|Result:)' "$tmp/prove-$side.log" | sed 's/wallclock.*//' | tr '\n' ' ')($(( $(date +%s) - t0 )) s)"
}

# The files of this tier: all of them with --full, else tests/suites/nginx-ci.txt.
nginx_files() {
  if [ -n "${SUITES_NGINX:-}" ]; then tr ' ' '\n' <<<"$SUITES_NGINX"
  elif [ "$full" = 1 ]; then (cd "$tmp/nginx-tests" && ls -- *.t)
  else list "$root/tests/suites/nginx-ci.txt"; fi
}

run_nginx() {
  local files=() candidates
  mapfile -t files < <(nginx_files)
  cat >"$tmp/bin/nginx-tcps" <<EOF
#!/bin/sh
TCPS_SOCKET='$sock' TCPS_PRELOAD_STATS='$tmp/stats-nginx' exec '$tcps' run --fallback fail -- /usr/sbin/nginx "\$@"
EOF
  chmod +x "$tmp/bin/nginx-tcps"
  say "nginx-tests: ${#files[@]} files, on kernel sockets then through tcps (prove -j2)"
  prove_side kernel /usr/sbin/nginx "${files[@]}"
  prove_side tcps "$tmp/bin/nginx-tcps" "${files[@]}"
  mapfile -t candidates < <(python3 tests/suites/compare.py tap --candidates "$tmp/tap/kernel" "$tmp/tap/tcps")
  if [ "${#candidates[@]}" -gt 0 ]; then
    say "nginx-tests: ${#candidates[@]} files had tests failing under tcps only; their second kernel run"
    prove_side kernel2 /usr/sbin/nginx "${candidates[@]/%/.t}"
  fi
  local rc=0
  python3 tests/suites/compare.py tap "$tmp/tap/kernel" "$tmp/tap/tcps" "$tmp/tap/kernel2" || rc=1
  offloaded nginx "$tmp/stats-nginx" /usr/sbin/nginx || rc=1
  return "$rc"
}
