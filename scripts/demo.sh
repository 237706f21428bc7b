#!/usr/bin/env bash
# The tcps demo, from a fresh Debian 12 machine (as root):
#   installs what is missing (wrk, curl, nginx, a C compiler, UCX), builds
#   everything (`make`), then runs `tcps demo`: the example web server and the
#   unmodified nginx (under `tcps run`), each through tcps and on kernel
#   sockets, driven by wrk, side by side.
#
#   ./scripts/demo.sh [--duration SECS] [--connections N] [--threads-wrk N]
#                     [--port P] [--poll busy|adaptive|block] ...
#   (all options go to `tcps demo`; see `target/release/tcps demo --help`)
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=0
for tool in wrk curl nginx gcc make; do
    command -v "$tool" >/dev/null 2>&1 || need_apt=1
done
# The tcps binary links UCX (the cluster deployment, crates/fabric).
dpkg-query -W -f='${Status}' libucx-dev 2>/dev/null | grep -q 'install ok installed' || need_apt=1
if [ "$need_apt" = 1 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        SUDO=
    elif command -v sudo >/dev/null 2>&1; then
        SUDO=sudo
    else
        echo "demo.sh: wrk, curl, nginx, UCX or a C compiler is missing and I am not root: run" >&2
        echo "  apt-get install -y wrk curl nginx-light build-essential libucx-dev" >&2
        exit 1
    fi
    echo "demo.sh: installing wrk curl nginx-light build-essential libucx-dev…" >&2
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq wrk curl nginx-light build-essential libucx-dev
fi

if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "demo.sh: cargo not found: install Rust (https://rustup.rs) first" >&2
    exit 1
fi

make
exec target/release/tcps demo "$@"
