#!/usr/bin/env python3
"""Plots a mkernel-collbench CSV (--csv) as a PNG: per-op latency and memory bandwidth against the
message size, one curve per (stream-wait mode, rank count), eager solid and CUDA graph dashed.

  python3 scripts/plot-bench.py bench-results/collectives.csv [out.png] [--title TEXT]

Needs matplotlib (pip install matplotlib); without it, says so and exits 2 (the CSV is the data).
"""
import argparse
import csv
import sys


def human(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("png", nargs="?")
    ap.add_argument("--title", default="mkernel AllReduce (float sum), emulated ranks on one GPU")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot-bench: matplotlib is not installed (pip install matplotlib); no plot written", file=sys.stderr)
        return 2
    with open(args.csv) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print(f"plot-bench: {args.csv} has no rows", file=sys.stderr)
        return 1
    curves = {}
    for r in rows:
        key = (r.get("wait", "memop"), int(r["ranks"]))
        curves.setdefault(key, []).append(r)
    copy = float(rows[0].get("copy_GBps", 0) or 0)
    fig, (lat, bw) = plt.subplots(1, 2, figsize=(13, 5))
    for (wait, ranks), rs in sorted(curves.items()):
        rs.sort(key=lambda r: int(r["bytes"]))
        x = [int(r["bytes"]) for r in rs]
        label = f"{ranks} rank{'s' if ranks > 1 else ''}" + (f" ({wait})" if len({k[0] for k in curves}) > 1 else "")
        line, = lat.plot(x, [float(r["eager_med_us"]) for r in rs], marker="o", label=label + " eager")
        lat.plot(x, [float(r["graph_med_us"]) for r in rs], linestyle="--", color=line.get_color(),
                 label=label + " graph")
        bw.plot(x, [float(r["mem_GBps"]) for r in rs], marker="o", color=line.get_color(), label=label)
    for ax in (lat, bw):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per rank")
        ticks = sorted({int(r["bytes"]) for r in rows})
        ax.set_xticks(ticks)
        ax.set_xticklabels([human(t) for t in ticks], rotation=45, ha="right")
        ax.grid(True, which="both", alpha=0.3)
    lat.set_yscale("log")
    lat.set_ylabel("latency per AllReduce (us, median)")
    lat.set_title("latency (eager solid, CUDA graph dashed)")
    lat.legend(fontsize=7)
    bw.set_ylabel("memory bandwidth (GB/s) = 2 x ranks x bytes / time")
    bw.set_title("bandwidth" + (f" (device copy: {copy:.0f} GB/s)" if copy else ""))
    if copy:
        bw.axhline(copy, color="gray", linestyle=":", label="cudaMemcpy D2D")
        bw.axhline(0.7 * copy, color="gray", linestyle="-.", label="goal: 70% of copy")
    bw.legend(fontsize=7)
    fig.suptitle(args.title)
    fig.tight_layout()
    out = args.png or args.csv.rsplit(".", 1)[0] + ".png"
    fig.savefig(out, dpi=110)
    print(f"plot-bench: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
