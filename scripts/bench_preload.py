#!/usr/bin/env python3
"""Unmodified programs on kernel sockets and through `tcps run`, side by side.

Issue 14's "Measure": the same binaries, the same clients, the same CPUs:

    the application             CPU 0 (taskset; nginx: master + 1 worker)
    tcps server --cpus 1        CPU 1 (adaptive polling)
    clients (wrk, h2load, redis-benchmark)  CPU 1

Cases: nginx keep-alive 16 KiB with `sendfile on` and `off` (wrk), pipelined
HTTP/1.1 (`h2load --h1 -m 8`, sendfile on), redis GET and SET
(`redis-benchmark -c 50`, and `-P 16`), and request/response latency
(`redis-benchmark -c 1` GET; a Python echo server answering 64-byte
requests one at a time from a Python client, the issue-15 latency case).

For each: throughput (kernel, tcps, ratio); the application's CPU per
request (its process tree, user+system, from /proc before/after; ratio);
the TCP server's CPU per request; round trips and wake-ups per request
(`tcps stat --json` totals before/after: round_trips, wakes +
doorbell_rings); p50/p99
latency (ratio). `--repeat N` runs kernel and tcps alternately N times and
reports medians. Loopback, no network namespace. The TCP server runs with
`--balance off` (every connection offloaded: the offload is what is
measured; `--balance on` lets busy-server periods hand new connections
to the program as kernel sockets, see scripts/bench-balance-step.sh).

    scripts/bench-preload.sh [--secs S] [--repeat N] [--out FILE] [--only SUBSTR] [SECS]
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TCPS = os.path.join(ROOT, "target/release/tcps")
HZ = os.sysconf("SC_CLK_TCK")
APP_CPU, SRV_CPU = "0", "1"
STAT_SETTLE = 0.25


def cpu_ticks(pid):
    """utime+stime of a process (all its threads), 0 if gone."""
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])
    except OSError:
        return 0


def tree(pid):
    """pid and all its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            kids = open(f"/proc/{p}/task/{p}/children").read().split()
        except OSError:
            kids = []
        todo.extend(int(k) for k in kids)
    return out


def wait_port(port, secs=10):
    end = time.time() + secs
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened")


class Bench:
    def __init__(self, args):
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="tcps-bench-preload.")
        os.chmod(self.dir, 0o755)
        os.mkdir(os.path.join(self.dir, "tmp"))
        with open(os.path.join(self.dir, "16k.bin"), "wb") as f:
            f.write(os.urandom(16384))
        self.sock = os.path.join(self.dir, "tcps.sock")
        self.port = 18600
        self.srv = subprocess.Popen(
            ["taskset", "-c", SRV_CPU, TCPS, "server", "--socket", self.sock,
             "--cpus", SRV_CPU, "--poll", "adaptive",
             "--balance", getattr(args, "balance", "off")],
            stdout=open(os.path.join(self.dir, "server.log"), "w"), stderr=subprocess.STDOUT)
        for _ in range(200):
            if os.path.exists(self.sock):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError("tcps server did not start")
        self.srv_pid = self.srv.pid

    def close(self):
        self.srv.send_signal(signal.SIGTERM)
        try:
            self.srv.wait(5)
        except subprocess.TimeoutExpired:
            self.srv.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def counters(self):
        out = subprocess.run([TCPS, "stat", "--socket", self.sock, "--json"],
                             capture_output=True, text=True, check=True).stdout
        c = json.loads(out)["total"]["counters"]
        # Wake-ups of host threads: futex wakes plus host doorbell rings.
        return c.get("round_trips", 0), c.get("wakes", 0) + c.get("doorbell_rings", 0)

    def prefix(self, net):
        p = ["taskset", "-c", APP_CPU]
        if net == "tcps":
            p += [TCPS, "run", "--socket", self.sock, "--"]
        return p

    # ---- applications -------------------------------------------------
    def start_nginx(self, net, sendfile):
        self.port += 1
        port, d = self.port, self.dir
        conf = os.path.join(d, f"nginx-{port}.conf")
        with open(conf, "w") as f:
            f.write(f"""worker_processes 1; daemon off; master_process on; pid {d}/nginx-{port}.pid;
error_log {d}/nginx-{port}.err warn; events {{ worker_connections 1024; }}
http {{ access_log off; sendfile {sendfile}; keepalive_requests 1000000;
  client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;
  uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;
  server {{ listen 127.0.0.1:{port}; root {d}; }} }}
""")
        p = subprocess.Popen(self.prefix(net) + ["nginx", "-c", conf, "-p", d],
                             stdout=subprocess.DEVNULL, stderr=open(f"{d}/nginx-{port}.log", "w"))
        wait_port(port)
        time.sleep(0.3)
        return p, port, lambda: p.send_signal(signal.SIGQUIT)

    def start_echo(self, net):
        self.port += 1
        port = self.port
        p = subprocess.Popen(self.prefix(net) + ["python3", "-c", ECHO_SERVER, str(port)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(port)
        return p, port, p.kill

    def start_redis(self, net):
        self.port += 1
        port = self.port
        p = subprocess.Popen(self.prefix(net) + [
            "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no"], stdout=open(f"{self.dir}/redis-{port}.log", "w"),
            stderr=subprocess.STDOUT)
        wait_port(port)
        time.sleep(0.3)

        def stop():
            subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"],
                           capture_output=True)
        return p, port, stop

    # ---- one measured client run ----------------------------------------
    def measure(self, app, client):
        """Runs `client` (returns (requests, p50 ms, p99 ms, note)) and the
        counters around it."""
        procs = tree(app.pid)
        # The server's workers publish their counters every 100 ms: let the
        # previous run's reach the board first, and this run's after it.
        time.sleep(STAT_SETTLE)
        rt0, w0 = self.counters()
        a0 = sum(cpu_ticks(p) for p in procs)
        s0 = cpu_ticks(self.srv_pid)
        reqs, p50, p99, elapsed, note = client()
        a1 = sum(cpu_ticks(p) for p in procs)
        s1 = cpu_ticks(self.srv_pid)
        time.sleep(STAT_SETTLE)
        rt1, w1 = self.counters()
        n = max(reqs, 1)
        return {
            "rps": reqs / elapsed if elapsed else 0.0,
            "app_us": (a1 - a0) / HZ / n * 1e6,
            "srv_us": (s1 - s0) / HZ / n * 1e6,
            "rt": (rt1 - rt0) / n,
            "wakes": (w1 - w0) / n,
            "p50": p50,
            "p99": p99,
            "note": note,
        }


def ms(v, unit):
    return float(v) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def run_client(cmd):
    r = subprocess.run(["taskset", "-c", SRV_CPU] + cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def wrk(port, secs, conns=32):
    def go():
        out = run_client(["wrk", "-t1", f"-c{conns}", f"-d{secs}s", "--latency",
                          f"http://127.0.0.1:{port}/16k.bin"])
        m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s)", out)
        reqs, el = int(m.group(1)), ms(m.group(2), m.group(3)) / 1e3

        def pct(p):
            m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)", out, re.M)
            return ms(m.group(1), m.group(2))
        note = "errors" if ("Socket errors" in out or "Non-2xx" in out) else ""
        return reqs, pct(50), pct(99), el, note
    return go


def h2load(port, secs):
    def go():
        out = run_client(["h2load", "--h1", "-m", "8", "-c", "32", "-t", "1", "-D", str(secs),
                          "--warm-up-time", "1", f"http://127.0.0.1:{port}/16k.bin"])
        m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed", out)
        done, failed = int(m.group(1)), int(m.group(3))
        mean = re.search(r"time for request:\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", out)
        note = f"{failed} failed" if failed else ""
        # h2load prints no percentiles: p50 column carries the mean.
        return done, ms(mean.group(1), mean.group(2)), None, float(secs), note
    return go


def redis_bench(port, test, n, conns, pipeline=1):
    def go():
        t0 = time.time()
        out = run_client(["redis-benchmark", "-p", str(port), "-t", test, "-n", str(n),
                          "-c", str(conns), "-P", str(pipeline), "--csv"])
        el = time.time() - t0
        rows = [l.split('","') for l in out.strip().splitlines()]
        head, row = rows[0], rows[1]
        head = [h.strip('"') for h in head]
        row = dict(zip(head, (v.strip('"') for v in row)))
        # the benchmark's own rps excludes connection setup
        el = n / float(row["rps"]) if float(row["rps"]) else el
        return n, float(row["p50_latency_ms"]), float(row["p99_latency_ms"]), el, ""
    return go


# The latency case's echo server (under test) and client (kernel sockets,
# one request at a time, per-request times): 64-byte requests.
ECHO_SERVER = '''
import socket, sys
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1]))); l.listen(8)
while True:
    c, _ = l.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        d = c.recv(4096)
        if not d: break
        c.sendall(d)
    c.close()
'''
ECHO_CLIENT = '''
import json, socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
msg, v, pc = b"x" * 64, [], time.perf_counter_ns
t0 = time.time()
for i in range(n + n // 10):
    t = pc(); s.sendall(msg); got = 0
    while got < 64: got += len(s.recv(64 - got))
    if i >= n // 10: v.append(pc() - t)
v.sort()
print(json.dumps({"n": n, "secs": time.time() - t0, "p50": v[n // 2] / 1e6, "p99": v[n * 99 // 100] / 1e6}))
'''


def echo_latency(port, n):
    def go():
        j = json.loads(run_client(["python3", "-c", ECHO_CLIENT, str(port), str(n)]))
        return j["n"], j["p50"], j["p99"], j["secs"], ""
    return go


def cases(secs):
    """(group, starter args, [(case name, client factory(port))]). The
    redis counts make a kernel run last about `secs` on this machine."""
    k = max(1, round(secs))
    return [
        ("nginx", ("on",), [
            ("nginx 16 KiB keep-alive, sendfile on (wrk -c 32)", lambda p: wrk(p, secs)),
            ("HTTP/1.1 pipelined (h2load --h1 -m 8 -c 32), sendfile on", lambda p: h2load(p, secs)),
        ]),
        ("nginx", ("off",), [
            ("nginx 16 KiB keep-alive, sendfile off (wrk -c 32)", lambda p: wrk(p, secs)),
        ]),
        ("redis", (), [
            ("redis GET -c 50", lambda p: redis_bench(p, "get", 80000 * k, 50)),
            ("redis SET -c 50", lambda p: redis_bench(p, "set", 80000 * k, 50)),
            ("redis GET -c 50 -P 16", lambda p: redis_bench(p, "get", 1000000 * k, 50, 16)),
            ("redis SET -c 50 -P 16", lambda p: redis_bench(p, "set", 1000000 * k, 50, 16)),
            ("latency: redis GET -c 1", lambda p: redis_bench(p, "get", 15000 * k, 1)),
        ]),
        ("echo", (), [
            ("latency: Python echo 64 B", lambda p: echo_latency(p, 10000 * k)),
        ]),
    ]


def run_all(b, args):
    results = {}  # case -> net -> [dict]
    order = []
    for rep in range(args.repeat):
        for group, sargs, cs in cases(args.secs):
            cs = [c for c in cs if not args.only or args.only in c[0]]
            if not cs:
                continue
            for net in ("kernel", "tcps"):
                app, port, stop = (b.start_nginx(net, *sargs) if group == "nginx"
                                   else b.start_echo(net) if group == "echo"
                                   else b.start_redis(net))
                try:
                    # warm-up: connections, caches, the server's adaptive spin
                    if group == "nginx":
                        wrk(port, 1)()
                    elif group == "echo":
                        echo_latency(port, 2000)()
                    else:
                        redis_bench(port, "get", 20000, 32)()
                    for name, mk in cs:
                        r = b.measure(app, mk(port))
                        if name not in results:
                            results[name] = {"kernel": [], "tcps": []}
                            order.append(name)
                        results[name][net].append(r)
                        print(f"[{rep + 1}/{args.repeat}] {net:6} {name}: {r['rps']:,.0f}/s "
                              f"app {r['app_us']:.1f} µs/req srv {r['srv_us']:.1f} µs/req "
                              f"rt {r['rt']:.3f} wakes {r['wakes']:.3f} p50 {r['p50']} p99 {r['p99']}"
                              + (f" ({r['note']})" if r["note"] else ""), flush=True)
                finally:
                    stop()
                    try:
                        app.wait(10)
                    except subprocess.TimeoutExpired:
                        app.kill()
                        app.wait()
    return results, order


def med(rs, key):
    v = [r[key] for r in rs if r[key] is not None]
    return statistics.median(v) if v else None


def ratio(t, k):
    return f"{t / k:.2f}x" if t is not None and k else "–"


def f(v, d=1):
    return "–" if v is None else f"{v:,.{d}f}"


def table(results, order):
    lines = [
        "| case | req/s kernel | req/s tcps | ratio | app CPU µs/req kernel | tcps | ratio "
        "| server CPU µs/req | round trips/req | wakes/req | p50 ms kernel | tcps | ratio "
        "| p99 ms kernel | tcps | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in order:
        k, t = results[name]["kernel"], results[name]["tcps"]
        row = [name]
        for key, d in (("rps", 0), ("app_us", 1)):
            kv, tv = med(k, key), med(t, key)
            row += [f(kv, d), f(tv, d), ratio(tv, kv)]
        row += [f(med(t, "srv_us"), 1), f(med(t, "rt"), 3), f(med(t, "wakes"), 3)]
        for key in ("p50", "p99"):
            kv, tv = med(k, key), med(t, key)
            row += [f(kv, 3), f(tv, 3), ratio(tv, kv)]
        notes = {r["note"] for r in k + t if r["note"]}
        if notes:
            row[0] += " (" + ", ".join(sorted(notes)) + ")"
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--secs", type=int, default=3, help="seconds per timed client run (default 3)")
    ap.add_argument("--repeat", type=int, default=1, help="kernel/tcps rounds, alternating; medians")
    ap.add_argument("--out", help="also write the table (with the command) to this file")
    ap.add_argument("--only", help="run only the cases whose name contains this")
    ap.add_argument("--balance", choices=["on", "off"], default="off",
                    help="the TCP server's balancing (default off: every connection "
                    "offloaded, which is what this measures; on: new connections may "
                    "run directly on kernel sockets in the program when the server is busy)")
    ap.add_argument("seconds", nargs="?", type=int,
                    help="same as --secs (the script's older form: bench-preload.sh 5)")
    args = ap.parse_args()
    if args.seconds:
        args.secs = args.seconds
    for p in ("nginx", "wrk", "h2load", "redis-server", "redis-benchmark", "redis-cli", "taskset"):
        if not shutil.which(p):
            sys.exit(f"bench-preload: {p} missing (scripts/test.sh installs it)")
    if not (os.access(TCPS, os.X_OK)
            and os.path.exists(os.path.join(ROOT, "target/release/libtcps_preload.so"))):
        subprocess.run(["cargo", "build", "--release"], cwd=ROOT, check=True)
    load0 = open("/proc/loadavg").read().split()[0]
    b = Bench(args)
    try:
        results, order = run_all(b, args)
    finally:
        b.close()
    cmd = "scripts/bench-preload.sh " + shlex.join(sys.argv[1:])
    head = (f"`{cmd.strip()}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
            f"{args.repeat} round(s), medians; application on CPU {APP_CPU}, "
            f"`tcps server --cpus {SRV_CPU}` and the clients on CPU {SRV_CPU}; "
            "ratios are tcps / kernel; server CPU, round trips and wakes are tcps-only; "
            "h2load prints no percentiles, its p50 column is the mean; "
            f"load average {load0} before, {open('/proc/loadavg').read().split()[0]} after: "
            "other processes on these CPUs show as kernel/tcps noise)\n\n")
    t = table(results, order)
    print("\n" + head + t)
    if args.out:
        with open(args.out, "w") as fo:
            fo.write(head + t)


if __name__ == "__main__":
    main()
