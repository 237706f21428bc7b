#!/usr/bin/env bash
# End to end: `make install` into a temporary PREFIX, then use only what it
# installed. Checks every installed file; builds examples/echo.c against the
# installed tcps.pc and runs it through a server started from the installed
# binary; `tcps run` (the installed binary, no TCPS_PRELOAD_LIB) must preload
# the installed libtcps_preload.so and offload a Python program's sockets;
# the man pages render; the bash completion sources and completes; the
# systemd units pass `systemd-analyze verify`; `make uninstall` removes every
# file and the empty directories it made; a DESTDIR install stages the same files under DESTDIR with
# PREFIX's paths inside tcps.pc and the units.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
p=$tmp/prefix
pids=()
cleanup() { for x in "${pids[@]}"; do kill "$x" 2>/dev/null || true; wait "$x" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

make --no-print-directory install PREFIX="$p" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log" >&2; fail "make install PREFIX=$p"; }

# --- every file in its place ---
[ -x "$p/bin/tcps" ] || fail "bin/tcps missing or not executable"
for f in lib/libtcps.so lib/tcps/libtcps_preload.so include/tcps.h lib/pkgconfig/tcps.pc \
  share/man/man1/tcps.1 share/man/man1/tcps-server.1 share/man/man1/tcps-run.1 \
  share/man/man1/tcps-stat.1 share/bash-completion/completions/tcps \
  share/zsh/site-functions/_tcps share/fish/vendor_completions.d/tcps.fish \
  share/doc/tcps/README.md share/doc/tcps/LICENSE-MIT share/doc/tcps/LICENSE-APACHE \
  share/doc/tcps/tcps.conf share/doc/tcps/tcps-run.conf lib/systemd/system/tcps.service \
  lib/systemd/system/tcps.socket lib/systemd/system/tcps-run@.service; do
  [ -s "$p/$f" ] || fail "$f not installed (or empty)"
done
# Every unit in the source tree is installed, pointing at the installed binary.
shopt -s nullglob
for u in contrib/systemd/*.service contrib/systemd/*.socket; do
  i=$p/lib/systemd/system/$(basename "$u")
  [ -f "$i" ] || fail "unit $(basename "$u") not installed"
  ! grep -q /usr/local/bin "$i" || fail "$(basename "$u") still names /usr/local/bin"
done
grep -q "ExecStart=$p/bin/tcps run" "$p/lib/systemd/system/tcps-run@.service" ||
  fail "tcps-run@.service does not run the installed tcps"
cmp -s include/tcps.h "$p/include/tcps.h" || fail "installed tcps.h differs"
# `tcps man` and `tcps completions` (the build steps that wrote the pages
# and completions) are hidden: not in --help, tcps(1) nor the completions.
! "$p/bin/tcps" --help | grep -Eqw 'man|completions' || fail "tcps --help shows man/completions"
! grep -Eqw '(fB)?(man|completions)' "$p/share/man/man1/tcps.1" || fail "tcps(1) lists man/completions"

# --- pkg-config: a C program builds against the installed library ---
export PKG_CONFIG_PATH=$p/lib/pkgconfig
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
[ "$(pkg-config --modversion tcps)" = "$version" ] || fail "tcps.pc version is not $version"
[ "$(pkg-config --variable=libdir tcps)" = "$p/lib" ] || fail "tcps.pc libdir is not $p/lib"
# A copy of the example away from the source tree: only the installed
# tcps.h can satisfy its #include "tcps.h".
mkdir "$tmp/src"
cp examples/echo.c examples/net.h "$tmp/src/"
# shellcheck disable=SC2046
cc -O2 -pthread -o "$tmp/echo" "$tmp/src/echo.c" $(pkg-config --cflags --libs tcps) \
  -Wl,-rpath,"$(pkg-config --variable=libdir tcps)" 2>"$tmp/cc.log" ||
  { cat "$tmp/cc.log" >&2; fail "echo.c does not build with \$(pkg-config --cflags --libs tcps)"; }
# (grep reads all of ldd's output: `grep -q` would close the pipe early and
# pipefail would see ldd killed by SIGPIPE.)
ldd "$tmp/echo" | grep "$p/lib/libtcps.so" >/dev/null || fail "echo is not linked to the installed libtcps.so"

# --- a server from the installed binary; the example through it ---
# The server runs with no capabilities at all, as tcps.service runs it
# (CapabilityBoundingSet= empty): everything below must work that way.
sock=$tmp/tcps.sock
nocaps=()
if command -v setpriv >/dev/null; then
  nocaps=(setpriv --inh-caps=-all --ambient-caps=-all --bounding-set=-all --)
else
  echo "install.sh: no setpriv; the server keeps root's capabilities" >&2
fi
"${nocaps[@]}" "$p/bin/tcps" server --socket "$sock" >"$tmp/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { cat "$tmp/server.log" >&2; fail "installed tcps server made no socket"; }
# The socket exists: setpriv has exec'd the server.
if [ "${#nocaps[@]}" -gt 0 ]; then
  grep -q '^CapEff:[[:space:]]*0*$' "/proc/${pids[-1]}/status" || fail "the server kept capabilities"
fi
export TCPS_SOCKET=$sock
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$tmp/echo" --net tcps --addr 127.0.0.1 --port "$port" --quiet >"$tmp/echo.log" 2>&1 &
pids+=($!)
ok=0
for _ in $(seq 100); do
  if timeout 10 "$tmp/echo" --net tcps --connect "127.0.0.1:$port" --bytes 100000 >>"$tmp/echo.log" 2>&1; then
    ok=1
    break
  fi
  sleep 0.05
done
[ "$ok" = 1 ] || { cat "$tmp/echo.log" >&2; fail "echo client through the installed libtcps.so"; }

# --- tcps run finds the installed preload library on its own ---
unset TCPS_PRELOAD_LIB
cat >"$tmp/prog.py" <<'EOF'
import socket, sys
maps = open("/proc/self/maps").read()
lib = sys.argv[1]
if lib not in maps:
    sys.exit("preload library not mapped: " + lib)
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
c = socket.create_connection(srv.getsockname())
a, _ = srv.accept()
c.sendall(b"installed")
assert a.recv(100) == b"installed"
print("ok")
EOF
out=$(TCPS_PRELOAD_STATS="$tmp/stats" "$p/bin/tcps" run --socket "$sock" --fallback fail -- \
  python3 "$tmp/prog.py" "$p/lib/tcps/libtcps_preload.so" 2>&1) ||
  fail "tcps run from the installed binary: $out"
[ "$out" = ok ] || fail "tcps run: unexpected output: $out"
grep -Eq ' offloaded=[1-9]' "$tmp/stats" || fail "the Python sockets were not offloaded: $(cat "$tmp/stats")"

# --- man pages and completions ---
for page in tcps tcps-server tcps-run tcps-stat; do
  MANWIDTH=100 man -l "$p/share/man/man1/$page.1" 2>/dev/null >"$tmp/$page.txt" || fail "man -l $page.1"
done
grep -q -- '--fallback' "$tmp/tcps-run.txt" || fail "tcps-run(1) does not document --fallback"
grep -q -- '--socket' "$tmp/tcps-server.txt" || fail "tcps-server(1) does not document --socket"
MANPATH=$p/share/man man -w tcps-run >/dev/null 2>&1 || fail "man finds no tcps-run under $p/share/man"
# complete WORD...: what the installed bash completion offers for the last word.
complete_words() {
  bash -c '
    source "$1"; shift
    COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
    _tcps tcps "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD - 1]}"
    echo " ${COMPREPLY[*]} "' _ "$p/share/bash-completion/completions/tcps" "$@" ||
    fail "the bash completion does not source"
}
got=$(complete_words tcps "")
for w in server run stat bench; do [[ $got == *" $w "* ]] || fail "bash completion of 'tcps ' lacks $w: $got"; done
[[ $got != *" man "* && $got != *" completions "* ]] || fail "bash completion offers a hidden command: $got"
got=$(complete_words tcps server --eng)
[[ $got == *" --engine "* ]] || fail "bash completion of 'tcps server --eng' gave $got"
if command -v zsh >/dev/null; then zsh -n "$p/share/zsh/site-functions/_tcps" || fail "zsh completion syntax"; fi
if command -v fish >/dev/null; then fish -n "$p/share/fish/vendor_completions.d/tcps.fish" || fail "fish completion syntax"; fi

# --- the systemd units ---
if command -v systemd-analyze >/dev/null; then
  # MANPATH: verify also runs `man` on each Documentation=man: entry.
  (cd "$p/lib/systemd/system" && MANPATH=$p/share/man systemd-analyze verify ./*.service ./*.socket) \
    >"$tmp/verify.log" 2>&1 || { cat "$tmp/verify.log" >&2; fail "systemd-analyze verify"; }
  # verify prints warnings without failing; there must be none.
  [ ! -s "$tmp/verify.log" ] || { cat "$tmp/verify.log" >&2; fail "systemd-analyze verify warned"; }
else
  echo "install.sh: no systemd-analyze; units not verified" >&2
fi

# --- uninstall removes every file ---
for x in "${pids[@]}"; do kill "$x" 2>/dev/null || true; wait "$x" 2>/dev/null || true; done
pids=()
# Another package's file in a directory tcps shares: it and its directory stay.
echo '#compdef other' >"$p/share/zsh/site-functions/_other"
make --no-print-directory uninstall PREFIX="$p" >"$tmp/uninstall.log" 2>&1 ||
  { cat "$tmp/uninstall.log" >&2; fail "make uninstall"; }
left=$(find "$p" -type f)
[ "$left" = "$p/share/zsh/site-functions/_other" ] || fail "make uninstall left: $left"
rm "$p/share/zsh/site-functions/_other"
# ... and the directories install made, once empty (the prefix's standard
# bin, lib, include and share/man/man1 stay).
for d in lib/pkgconfig lib/systemd share/bash-completion share/fish lib/tcps share/doc/tcps; do
  [ ! -e "$p/$d" ] || fail "make uninstall left the directory $d"
done

# --- DESTDIR: staged under DESTDIR, PREFIX's paths inside ---
make --no-print-directory install PREFIX=/opt/tcps DESTDIR="$tmp/stage" >"$tmp/install2.log" 2>&1 ||
  { cat "$tmp/install2.log" >&2; fail "make install DESTDIR"; }
[ -x "$tmp/stage/opt/tcps/bin/tcps" ] || fail "DESTDIR install: no bin/tcps"
[ -f "$tmp/stage/opt/tcps/lib/tcps/libtcps_preload.so" ] || fail "DESTDIR install: no preload library"
grep -qx 'prefix=/opt/tcps' "$tmp/stage/opt/tcps/lib/pkgconfig/tcps.pc" || fail "DESTDIR leaked into tcps.pc"
! grep -rq "$tmp/stage" "$tmp/stage/opt/tcps/lib/systemd/system" || fail "DESTDIR leaked into the units"

echo "install.sh: ok"
