#!/usr/bin/env python3
"""Balancing under a load step: light -> overload -> light.

The unmodified nginx (1 worker, sendfile on) runs through `tcps run` on
CPU 0; `tcps server --cpus 1` (balancing on, its default) and the client
(wrk, HTTP/1.0: a new connection per request, so each request is a new
balancing decision) on CPU 1, where the server is the bottleneck once the
load is high; the light phases are two connections that wait 10 ms
between requests (~200 requests/s), the overload 64 unpaced ones. Every 200 ms it samples `tcps stat --json`: the host's
direct share, the reason, both loads, and the connections accepted so far
(offloaded and direct). It prints the share over time, when it first moved
up after the overload began and down after it ended, and how often it
changed direction during each phase (flapping); writes CSV and a PNG.

    scripts/bench-balance-step.sh [--light S] [--heavy S] [--out DIR]
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_preload as bp  # noqa: E402  (the servers and helpers)


def sample(b, host_pid):
    out = subprocess.run([bp.TCPS, "stat", "--socket", b.sock, "--json"],
                         capture_output=True, text=True).stdout
    try:
        j = json.loads(out)
    except ValueError:
        return None
    pids = set(bp.tree(host_pid))
    # nginx's master and worker are two hosts: the one that accepts.
    hosts = [h for h in j.get("hosts", []) if h.get("pid") in pids]
    if not hosts:
        return None

    def accepts(h):
        c = h.get("counters", {})
        return c.get("accepts_eager", 0) + c.get("accepts_on_demand", 0), c.get("accepts_direct", 0)
    h = max(hosts, key=lambda h: (sum(accepts(h)), h.get("pid")))
    bal = h.get("balance", {})
    offloaded, direct = accepts(h)
    return {
        "share": bal.get("share_pct", 0), "reason": bal.get("reason", "?"),
        "server_busy": bal.get("server_busy_pct", 0),
        "host_busy": bal.get("host_busy_pct", 0),
        "offloaded": offloaded, "direct": direct,
    }


def wrk(port, secs, conns, threads, pace_ms=0):
    """wrk for `secs`, HTTP/1.0-style (a connection per request); with
    `pace_ms` each connection waits that long between requests (a light,
    open load; wrk's Lua `delay`)."""
    cmd = ["taskset", "-c", bp.SRV_CPU, "wrk", f"-t{threads}", f"-c{conns}", f"-d{secs}s",
           "-H", "Connection: close"]
    if pace_ms:
        script = os.path.join(tempfile.gettempdir(), f"tcps-step-{os.getpid()}.lua")
        with open(script, "w") as f:
            f.write(f"function delay() return {pace_ms} end\n")
        cmd += ["-s", script]
    cmd.append(f"http://127.0.0.1:{port}/16k.bin")
    return subprocess.run(cmd, capture_output=True, text=True).stdout


def flips(shares):
    """Direction changes of a series (up then down or down then up)."""
    dirs = [1 if b > a else -1 for a, b in zip(shares, shares[1:]) if b != a]
    return sum(1 for a, b in zip(dirs, dirs[1:]) if a != b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--light", type=int, default=6, help="seconds of light load, before and after")
    ap.add_argument("--heavy", type=int, default=8, help="seconds of overload")
    ap.add_argument("--out", default="docs/results/balance",
                    help="directory for step.csv and step.png")
    args = ap.parse_args()
    args.balance = "on"  # the TCP server's default, and what is measured here
    os.makedirs(args.out, exist_ok=True)
    b = bp.Bench(args)
    rows, stop = [], threading.Event()
    try:
        app, port, quit_app = b.start_nginx("tcps", "on")
        t0 = time.time()
        phase = ["light"]

        def sampler():
            while not stop.is_set():
                s = sample(b, app.pid)
                if s:
                    s["t"] = round(time.time() - t0, 2)
                    s["phase"] = phase[0]
                    rows.append(s)
                time.sleep(0.2)
        th = threading.Thread(target=sampler)
        th.start()
        wrk(port, args.light, 2, 1, pace_ms=10)
        phase[0] = "overload"
        t_heavy = time.time() - t0
        wrk(port, args.heavy, 64, 2)
        phase[0] = "light again"
        t_light = time.time() - t0
        wrk(port, args.light, 2, 1, pace_ms=10)
        stop.set()
        th.join()
        quit_app()
    finally:
        stop.set()
        b.close()
    if not rows:
        sys.exit("no samples: was the host seen in tcps stat?")
    with open(os.path.join(args.out, "step.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    up = next((r["t"] - t_heavy for r in rows if r["t"] >= t_heavy and r["share"] > 0), None)
    peak = max(r["share"] for r in rows)
    down = next((r["t"] - t_light for r in rows
                 if r["t"] >= t_light and r["share"] < peak), None)
    print(f"{'t s':>6} {'phase':>12} {'share %':>8} {'server %':>9} {'host %':>7} "
          f"{'offloaded':>9} {'direct':>7}  reason")
    for r in rows[::2]:
        print(f"{r['t']:6.1f} {r['phase']:>12} {r['share']:8} {r['server_busy']:9} "
              f"{r['host_busy']:7} {r['offloaded']:9} {r['direct']:7}  {r['reason']}")
    for name in ("light", "overload", "light again"):
        s = [r["share"] for r in rows if r["phase"] == name]
        print(f"{name}: share {min(s, default=0)}..{max(s, default=0)} %, "
              f"{flips(s)} direction changes")
    print(f"share first up {up:.1f} s after the overload began" if up is not None
          else "share never moved up during the overload")
    print(f"share first down {down:.1f} s after it ended" if down is not None
          else "share did not move down after the overload")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 3.5))
        ts = [r["t"] for r in rows]
        ax.plot(ts, [r["share"] for r in rows], label="direct share %", color="C0")
        ax.plot(ts, [r["server_busy"] for r in rows], label="server busy %", color="C1", lw=0.8)
        ax.plot(ts, [r["host_busy"] for r in rows], label="host busy %", color="C2", lw=0.8)
        for x in (t_heavy, t_light):
            ax.axvline(x, color="grey", ls="--", lw=0.8)
        ax.set_xlabel("seconds (dashed: overload begins, ends)")
        ax.set_ylabel("%")
        ax.set_ylim(0, 105)
        ax.set_title("nginx via tcps run, HTTP/1.0: the direct share under a load step")
        ax.legend(fontsize=7, loc="upper right")
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "step.png"), dpi=110)
    except ImportError:
        print("(no matplotlib: no plot)")


if __name__ == "__main__":
    main()
