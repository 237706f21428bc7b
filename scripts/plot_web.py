#!/usr/bin/env python3
"""Plots of `tcps bench web` (DIR/results.json -> DIR/*.png).

    plot_web.py DIR

throughput_<workload>.png  throughput vs offered load, one line per variant
                           (thesis figures 6.9, 6.11, 6.12, 6.14, 6.16, 6.18);
                           the rightmost point of each line is the unpaced run
cpu.png                    CPU utilisation at saturation per variant, host and
                           TCP server cores, user/system (figures 6.10, 6.13, 6.15, 6.17)
ratios.png                 saturation throughput / Regular's, per workload,
                           with the thesis' Sync and AsyncSend gains
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Distinct colours for up to 20 variants (the default cycle repeats after 10).
PALETTE = plt.get_cmap("tab20")


def curves_of(res, wid):
    for w in res["results"]:
        if w["workload"] == wid:
            return [c for c in w["variants"] if c["points"]]
    return []


def label_of(res, vid):
    for v in res["variants"]:
        if v["id"] == vid:
            return v["label"]
    return vid


def net_of(res, vid):
    for v in res["variants"]:
        if v["id"] == vid:
            return v["net"]
    return ""


def throughput(res, out):
    for w in res["workloads"]:
        curves = curves_of(res, w["id"])
        if not curves:
            continue
        paced_max = max(
            (p["offered_rps"] for c in curves for p in c["points"] if p["offered_rps"]),
            default=1.0,
        )
        unpaced_x = paced_max * 1.15
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for i, c in enumerate(curves):
            pts = sorted(c["points"], key=lambda p: p["offered_rps"] or unpaced_x)
            xs = [p["offered_rps"] or unpaced_x for p in pts]
            ys = [p["rps"] for p in pts]
            ax.plot(xs, ys, marker="o", label=label_of(res, c["variant"]), color=PALETTE(i % 20))
        ax.axvline(paced_max * 1.075, color="grey", lw=0.5, ls=":")
        ax.set_xlabel("offered load (requests/s); rightmost point: unpaced")
        ax.set_ylabel("throughput (requests/s)")
        ax.set_title(f"{w['label']} (thesis fig. {w['figure']})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"throughput_{w['id']}.png"), dpi=110)
        plt.close(fig)


def balance(res, out):
    """Throughput vs offered load of Regular, `all` without balancing and
    `all` with it, one panel per workload (balance.png)."""
    keep = {"regular": "C0", "all-nobalance": "C1", "all": "C2"}
    wls = [w for w in res["workloads"]
           if any(c["variant"] in keep for c in curves_of(res, w["id"]))]
    if not wls:
        return
    cols = min(3, len(wls))
    rows = (len(wls) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, w in zip(axes.flat, wls):
        curves = [c for c in curves_of(res, w["id"]) if c["variant"] in keep]
        paced_max = max((p["offered_rps"] for c in curves for p in c["points"]
                         if p["offered_rps"]), default=1.0)
        unpaced_x = paced_max * 1.15
        for c in curves:
            pts = sorted(c["points"], key=lambda p: p["offered_rps"] or unpaced_x)
            ax.plot([p["offered_rps"] or unpaced_x for p in pts], [p["rps"] for p in pts],
                    marker="o", ms=3, label=label_of(res, c["variant"]), color=keep[c["variant"]])
        ax.set_title(w["label"], fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(wls):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.supxlabel("offered load (requests/s); rightmost point: unpaced", fontsize=9)
    fig.supylabel("throughput (requests/s)", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "balance.png"), dpi=110)
    plt.close(fig)


def saturation_point(c):
    return max(c["points"], key=lambda p: p["rps"])


def cpu(res, out):
    wls = [w for w in res["workloads"] if curves_of(res, w["id"])]
    if not wls:
        return
    cols = min(3, len(wls))
    rows = (len(wls) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.2 * rows), squeeze=False)
    for ax in axes.flat[len(wls):]:
        ax.axis("off")
    for ax, w in zip(axes.flat, wls):
        names, user, sys_, steal = [], [], [], []
        for c in curves_of(res, w["id"]):
            p = saturation_point(c)
            groups = [("host", p["host_cores"])]
            if p.get("server_cores"):
                # Kernel variants on the host's core only: the other core
                # runs wrk and softirqs, not a TCP server.
                other = "TCPS" if net_of(res, c["variant"]) == "tcps" else "other core"
                groups.append((other, p["server_cores"]))
            for g, s in groups:
                names.append(f"{label_of(res, c['variant'])}\n({g})")
                user.append(s["user_pct"])
                sys_.append(s["sys_pct"])
                steal.append(s["steal_pct"])
        xs = range(len(names))
        ax.bar(xs, user, label="user")
        ax.bar(xs, sys_, bottom=user, label="system (+irq)")
        ax.bar(xs, steal, bottom=[u + s for u, s in zip(user, sys_)], label="steal")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, fontsize=6, rotation=45, ha="right")
        ax.set_ylim(0, 100)
        ax.set_ylabel("% of the group's cores")
        ax.set_title(w["label"], fontsize=9)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("CPU utilisation at saturation (the rest is idle)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "cpu.png"), dpi=110)
    plt.close(fig)


def ratios(res, out):
    wls = [w for w in res["workloads"] if curves_of(res, w["id"])]
    vids = []
    for w in wls:
        for c in curves_of(res, w["id"]):
            if c["variant"] != "regular" and c["variant"] not in vids:
                vids.append(c["variant"])
    if not wls or not vids:
        return
    fig, ax = plt.subplots(figsize=(max(9, 1.8 * len(wls)), 4.5))
    width = 0.8 / (len(vids) + 2)
    for i, vid in enumerate(vids):
        ys = []
        for w in wls:
            c = next((c for c in curves_of(res, w["id"]) if c["variant"] == vid), None)
            ys.append((c or {}).get("ratio_vs_regular") or 0.0)
        ax.bar([k + i * width for k in range(len(wls))], ys, width, label=label_of(res, vid),
               color=PALETTE(i % 20))
    base = len(vids)
    for j, (name, hatch) in enumerate([("thesis Sync", "//"), ("thesis AsyncSend", "xx")]):
        ys = [1 + w["thesis_gain_pct"][j] / 100 for w in wls]
        ax.bar([k + (base + j) * width for k in range(len(wls))], ys, width,
               label=name, fill=False, hatch=hatch, edgecolor="grey")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([k + width * (len(vids) + 1) / 2 for k in range(len(wls))])
    ax.set_xticklabels([w["id"] for w in wls], fontsize=8)
    ax.set_ylabel("saturation throughput / Regular (both cores)")
    ax.set_title("Saturation throughput relative to Regular, same run")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ratios.png"), dpi=110)
    plt.close(fig)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    with open(os.path.join(out, "results.json")) as f:
        res = json.load(f)
    throughput(res, out)
    cpu(res, out)
    ratios(res, out)
    balance(res, out)


if __name__ == "__main__":
    main()
