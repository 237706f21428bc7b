#!/usr/bin/env bash
# A large download through nginx, the way a user first tries it: curl
# fetches a file (default 1 GiB) from nginx (1 worker, the Debian build)
# on kernel sockets and under `tcps run` with each engine and balancing
# mode, `sendfile` on and off, N tries each (default 10). Every download
# must arrive byte-identical (SHA-256) within a time limit; prints each
# configuration's median time and its ratio to the kernel's.
#
#   scripts/big-download.sh [--size MiB] [--tries N] [--limit SECS]
#
# Exits 1 if any download is short, differs or stalls. Needs nginx and
# curl (scripts/test.sh installs them) and a release build.
set -euo pipefail
cd "$(dirname "$0")/.."

size=1024 tries=10 limit=120
while [ $# -gt 0 ]; do
    case "$1" in
        --size) size=$2; shift 2 ;;
        --tries) tries=$2; shift 2 ;;
        --limit) limit=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "big-download.sh: unknown argument: $1 (try --help)" >&2; exit 2 ;;
    esac
done

tcps=$PWD/target/release/tcps
[ -x "$tcps" ] || cargo build --release
dir=$(mktemp -d /tmp/tcps-bigdl.XXXXXX)
chmod 755 "$dir"   # the nginx worker runs as nobody
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

mkdir -p "$dir/www" "$dir/tmp"
echo "making a ${size} MiB file..."
head -c "$((size << 20))" /dev/urandom > "$dir/www/big"
want=$(sha256sum < "$dir/www/big" | cut -d' ' -f1)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

conf() { # sendfile on|off
    cat > "$dir/nginx-$1.conf" <<EOF
worker_processes 1; daemon off; master_process on; pid $dir/nginx.pid;
error_log $dir/error.log notice;
events { worker_connections 1024; }
http { access_log off; sendfile $1;
  client_body_temp_path $dir/tmp; proxy_temp_path $dir/tmp; fastcgi_temp_path $dir/tmp;
  uwsgi_temp_path $dir/tmp; scgi_temp_path $dir/tmp;
  server { listen 127.0.0.1:$port; root $dir/www; } }
EOF
}

wait_port() {
    for _ in $(seq 200); do
        curl -s -o /dev/null "http://127.0.0.1:$port/" && return 0
        sleep 0.05
    done
    echo "nginx did not listen" >&2; cat "$dir/error.log" >&2; exit 1
}

failed=0
declare -A median
# One configuration: $1 label, then the command that starts nginx.
run_config() {
    local label=$1; shift
    "$@" > "$dir/nginx.out" 2>&1 &
    local np=$!
    wait_port
    local times=() t got
    for i in $(seq "$tries"); do
        t=$(curl -s -o "$dir/got" --max-time "$limit" -w '%{time_total}' "http://127.0.0.1:$port/big" || true)
        got=$(sha256sum < "$dir/got" | cut -d' ' -f1)
        if [ "$got" != "$want" ]; then
            echo "$label try $i: FAILED: $(stat -c %s "$dir/got") of $((size << 20)) bytes, sha $got" >&2
            failed=1
        fi
        times+=("$t")
        printf '\r%-44s %2d/%d' "$label" "$i" "$tries" >&2
    done
    kill -QUIT "$np" 2>/dev/null || true
    wait "$np" 2>/dev/null || true
    median[$label]=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    printf '\r%-44s median %6.2f s\n' "$label" "${median[$label]}" >&2
}

for sf in on off; do
    conf "$sf"
    run_config "kernel, sendfile $sf" nginx -c "$dir/nginx-$sf.conf" -p "$dir"
    for engine in uring epoll; do
        for balance in on off; do
            sock="$dir/tcps-$engine-$balance.sock"
            "$tcps" server --socket "$sock" --engine "$engine" --balance "$balance" > "$dir/server.log" 2>&1 &
            local_pid=$!
            pids+=("$local_pid")
            run_config "tcps $engine balance $balance, sendfile $sf" \
                "$tcps" run --socket "$sock" --fallback fail -- nginx -c "$dir/nginx-$sf.conf" -p "$dir"
            kill "$local_pid"; wait "$local_pid" 2>/dev/null || true
        done
    done
done

echo
printf '%-44s %10s %8s\n' "configuration (${size} MiB, $tries tries)" "median s" "vs kernel"
for sf in on off; do
    k=${median["kernel, sendfile $sf"]}
    for label in "kernel, sendfile $sf" "tcps uring balance on, sendfile $sf" "tcps uring balance off, sendfile $sf" \
        "tcps epoll balance on, sendfile $sf" "tcps epoll balance off, sendfile $sf"; do
        m=${median[$label]}
        printf '%-44s %10.2f %7.2fx\n' "$label" "$m" "$(echo "$k / $m" | bc -l)"
    done
done
if [ "$failed" != 0 ]; then
    echo "big-download.sh: some downloads were short, differed or stalled" >&2
    exit 1
fi
echo "big-download.sh: every download arrived byte-identical"
