#!/usr/bin/env bash
# Runs the tcps test suite.
#
#   scripts/test.sh          everything: packages the tests need, release build,
#                            C examples, `cargo test --release --workspace`
#                            (unit + integration tests, both engines), loom
#                            models, a 3 s smoke pass of every fuzz target
#                            (scripts/fuzz.sh), a type-check for aarch64
#                            (installs the target with rustup), then every
#                            end-to-end script tests/*.sh
#   scripts/test.sh --quick  unit tests only (`--lib`), the proto crate's tests
#                            and its loom models of the ring handshakes
#   Both tiers also check the tree's shape (scripts/structure.py: file and
#   function length, import circles, ring atomics outside proto).
#
# Environment: TCPS_IT_SEED replays a seed of the rogue-host garbage test.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "test.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done

step() { printf '\n==> %s\n' "$*"; }

# The loom models of the ring handshakes (crates/proto/src/loom_tests.rs):
# proto built with `--cfg loom`, in a target directory of its own so the
# other RUSTFLAGS do not rebuild the workspace.
loom() {
    step 'RUSTFLAGS="--cfg loom" cargo test -p tcps-proto --release --lib loom_tests'
    RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
        cargo test -p tcps-proto --release --lib loom_tests
}

structure() {
    step "scripts/structure.py"
    python3 scripts/structure.py
}

if [ "$quick" = 1 ]; then
    structure
    step "cargo test --release --workspace --lib"
    cargo test --release --workspace --lib
    step "cargo test --release -p tcps-proto"
    cargo test --release -p tcps-proto
    loom
    echo "test.sh --quick: ok"
    exit 0
fi

# Debian packages the tests and end-to-end scripts use; installed only if
# missing, with one `apt-get update` first.
need_packages() {
    local missing=() p
    # python3 … iperf3: the programs the preload end-to-end tests run unmodified
    # (crates/cli/tests/preload_e2e.rs). pkgconf, man-db, systemd: tests/install.sh
    # (tcps.pc, man -l, systemd-analyze verify). libucx-dev: crates/fabric links libucp
    # (the cluster deployment over UCX, docs/DEPLOYMENT.md).
    for p in curl wrk build-essential strace iproute2 linux-perf python3-matplotlib \
        python3 redis-server redis-tools nginx-light memcached libmemcached-tools iperf3 nghttp2-client \
        libucx-dev \
        pkgconf man-db systemd; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$p")
        fi
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    if ! command -v apt-get >/dev/null; then
        echo "test.sh: missing packages ${missing[*]} and no apt-get; continuing" >&2
        return 0
    fi
    local sudo=()
    if [ "$(id -u)" != 0 ]; then
        if command -v sudo >/dev/null; then sudo=(sudo); else
            echo "test.sh: missing packages ${missing[*]} (not root, no sudo); continuing" >&2
            return 0
        fi
    fi
    step "installing ${missing[*]}"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

start=$(date +%s)
if command -v dpkg-query >/dev/null; then need_packages; fi

step "cargo build --release"
cargo build --release

if [ -f Makefile ]; then
    step "make examples"
    make examples
fi

# --no-fail-fast: one failing test binary must not hide the results of the
# others; the end-to-end scripts run even if a cargo test failed.
failed=()
step "cargo test --release --workspace"
cargo test --release --workspace --no-fail-fast || failed+=("cargo test --release --workspace")
loom || failed+=("loom models (tcps-proto)")
structure || failed+=("scripts/structure.py")
# A smoke pass of every fuzz target (the long runs: docs/SECURITY.md).
step "scripts/fuzz.sh 3"
scripts/fuzz.sh 3 || failed+=("scripts/fuzz.sh (fuzz smoke pass)")

# The deployment on a smart NIC's Arm cores (docs/DEPLOYMENT.md) needs the
# same code to build for aarch64: type-check it (no linker needed).
aarch64_check() {
    step "cargo check --target aarch64-unknown-linux-gnu"
    if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
        rustup target add aarch64-unknown-linux-gnu
    fi
    CARGO_TARGET_DIR=target/aarch64 cargo check --release --workspace --all-targets \
        --target aarch64-unknown-linux-gnu
}
aarch64_check || failed+=("cargo check for aarch64")

shopt -s nullglob
scripts=(tests/*.sh)
for t in "${scripts[@]}"; do
    step "$t"
    bash "$t" || failed+=("$t")
done

echo
if [ "${#failed[@]}" -gt 0 ]; then
    echo "test.sh: FAILED after $(( $(date +%s) - start )) s:" >&2
    printf '  %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "test.sh: all tests passed in $(( $(date +%s) - start )) s"
