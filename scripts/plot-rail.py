#!/usr/bin/env python3
"""Plots scripts/gpu-check.sh rail sweeps (MKERNEL_HIER_RAIL: direct, ring, rhd; pipelined and in
turn) as a PNG: for each layout of each file, the time of the direct form pipelined over the time
of every (form, overlap) against the message size (above 1: faster than direct pipelined), one
panel per (file, layout), three to a row. Each point is the mean of the eager medians of the file's rounds.

  python3 scripts/plot-rail.py OUT.png RAIL-SWEEP.txt[=LABEL] ... [--title TEXT]

RAIL-SWEEP.txt is gpu-check.sh rail's raw rail-sweep.txt (lines "R:G/form/ovO/rN: ... memop ranks
bytes eager_med ..."; R:G:L with lanes, R:G:L:W,R in CTA roles, a panel of its own). Needs
matplotlib; without it, says so and exits 2.
"""
import argparse
import re
import sys
from collections import defaultdict

LINE = re.compile(r"^(\d+):(\d+)(?::(\d+))?(?::(\d+,\d+))?/(\w+)/ov(\d)/r(\d+):\s+memop\s+\d+\s+(\d+)\s+([\d.]+)\s")


def human(n):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def parse(path):
    """{(ranks, perNode, lanes or 0, roles or ""): {(form, overlap): {bytes: [eager medians of the rounds]}}}"""
    out = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for line in open(path):
        m = LINE.match(line)
        if m:
            ranks, rpn, lanes, roles, form, ov, _, nbytes, eager = m.groups()
            out[(int(ranks), int(rpn), int(lanes or 0), roles or "")][(form, int(ov))][int(nbytes)].append(float(eager))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("inputs", nargs="+", help="rail-sweep.txt files, each optionally =LABEL")
    ap.add_argument("--title", default="hierarchical AllReduce: rail exchange forms")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot-rail.py: matplotlib is not installed", file=sys.stderr)
        return 2
    panels = []
    for spec in args.inputs:
        path, _, label = spec.partition("=")
        for layout, series in sorted(parse(path).items(), reverse=True):
            lanes = f", {layout[2]} lane(s)" if layout[2] else ""
            roles = f", CTA roles {layout[3]}" if layout[3] else ""
            panels.append((f"{label or path}: {layout[0] // layout[1]} nodes x {layout[1]}{lanes}{roles}", series))
    if not panels or not all(("direct", 1) in s for _, s in panels):
        print("plot-rail.py: no sweep with the direct form pipelined in the input", file=sys.stderr)
        return 1
    cols = min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.4 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    styles = {"direct": "C0", "ring": "C1", "rhd": "C2"}
    for ax, (name, series) in zip(axes.flat, panels):
        base = {b: sum(v) / len(v) for b, v in series[("direct", 1)].items()}
        for (form, ov), points in sorted(series.items()):
            xs = sorted(b for b in points if b in base)
            ys = [base[b] / (sum(points[b]) / len(points[b])) for b in xs]
            ax.plot(xs, ys, marker="o", color=styles.get(form, "k"), linestyle="-" if ov else "--",
                    label=f"{form}, {'pipelined' if ov else 'in turn'}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ticks = sorted(base)
        ax.set_xticks(ticks)
        ax.set_xticklabels([human(b) for b in ticks], rotation=45, fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("direct pipelined time / this time")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(args.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"plot-rail.py: wrote {args.out} ({len(panels)} panel(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
