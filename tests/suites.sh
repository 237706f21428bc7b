#!/usr/bin/env bash
# End to end: the peers' own test suites (nginx-tests, redis 7.0.15's suite),
# unmodified, against the Debian builds of nginx and redis-server, first on
# kernel sockets and then under `tcps run --fallback fail`. Every test that
# passes on kernel sockets must pass through tcps (compared per test: the
# nginx-tests file and test number, the redis unit and test name), and the
# preload's exit records must show that nginx and redis-server really were
# offloaded. What runs, how long and what it found: docs/RELIABILITY.md.
#
#   tests/suites.sh          the CI tier: the nginx-tests files that apply to
#                            the Debian build and run in seconds, and a
#                            selection of redis units (about 10 minutes)
#   tests/suites.sh --full   every nginx-tests file and every redis unit that
#                            runs against an external server (the soak; also
#                            SUITES_FULL=1)
#
# Environment: SUITES_DIR (the archives; default ../shared/suites beside the
# repository, else ../../shared/suites for a worktree), SUITES_ONLY=nginx|redis (one suite), SUITES_NGINX / SUITES_REDIS
# (space-separated files or units instead of the tier's list),
# SUITES_FILE_TIMEOUT / SUITES_UNIT_TIMEOUT (seconds one nginx-tests file or
# redis unit may take; 60/150 in the CI tier, 180/300 with --full),
# SUITES_KEEP=1 (keep the temporary directory and say where).
#
# A test that fails under tcps is run again on kernel sockets before it counts
# as a regression: it counts only if it passed on the kernel both times
# (tests that are flaky on the kernel itself are reported, not counted).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
full=${SUITES_FULL:-0}
for arg in "$@"; do
  case "$arg" in
    --full) full=1 ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "suites.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
  esac
done
# The archives: beside the repository in CI (a clone with shared/ beside it);
# a worktree under wt/ finds them one level further up.
suites=${SUITES_DIR:-$root/../shared/suites}
[ -n "${SUITES_DIR:-}" ] || [ -d "$suites" ] || suites=$root/../../shared/suites
nginx_tar=$suites/nginx-tests-76bb761-full.tar.gz
redis_tar=$suites/redis-7.0.15-tests.tar.gz
fail() { echo "suites.sh: FAIL: $*" >&2; exit 1; }
for f in "$nginx_tar" "$redis_tar"; do
  [ -r "$f" ] || fail "missing $f (the peers' suites; set SUITES_DIR to the folder that holds them)"
done
start=$(date +%s)
say() { printf '[suites %4ds] %s\n' "$(( $(date +%s) - start ))" "$*"; }
# shellcheck source=tests/suites/lib.sh
. tests/suites/lib.sh

need_packages
tcps=$root/target/release/tcps
[ -x "$tcps" ] && [ -f target/release/libtcps_preload.so ] || cargo build --release

tmp=$(mktemp -d /tmp/tcps-suites.XXXXXX)
trap cleanup EXIT
mkdir -p "$tmp/nginx-tests" "$tmp/redis-kernel" "$tmp/redis-tcps" "$tmp/t" "$tmp/bin"
tar -xzf "$nginx_tar" -C "$tmp/nginx-tests"
tar -xzf "$redis_tar" -C "$tmp/redis-kernel"
tar -xzf "$redis_tar" -C "$tmp/redis-tcps"

sock=$tmp/tcps.sock
# --balance off: every connection stays offloaded (with balancing on, the
# server may hand a share of them to the program as kernel sockets, and a test
# on such a connection would not test tcps).
RUST_LOG=info "$tcps" server --socket "$sock" --balance off 2>"$tmp/server.log" &
server_pid=$!
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || fail "tcps server did not start: $(tail -3 "$tmp/server.log")"
say "tcps server on $sock (pid $server_pid); work in $tmp"

failed=()
case ${SUITES_ONLY:-both} in
  nginx) run_nginx || failed+=(nginx-tests) ;;
  redis) run_redis || failed+=(redis) ;;
  both) run_nginx || failed+=(nginx-tests); run_redis || failed+=(redis) ;;
  *) fail "SUITES_ONLY must be nginx or redis" ;;
esac
say "done in $(( $(date +%s) - start )) s"
[ "${#failed[@]}" -eq 0 ] || fail "${failed[*]}: tests that pass on kernel sockets fail under tcps (above)"
echo "suites.sh: every test that passed on kernel sockets passed under tcps"
