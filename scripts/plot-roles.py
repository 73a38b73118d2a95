#!/usr/bin/env python3
"""Plots MKERNEL_HIER_ROLES sweeps (the tables scripts/gpu-check.sh launch step 3h prints) as a PNG:
for each table, the data-parallel time over each roles setting's time against the message size
(above 1: the roles are faster), one panel per table.

  python3 scripts/plot-roles.py SWEEPS.txt OUT.png [--section TEXT] [--title TEXT]

SWEEPS.txt holds tables whose header line starts with "bytes" followed by "roles=off" and the
other settings, each preceded by a "### name" line that titles its panel (as gpu-check.sh launch
writes them). --section keeps only the tables after the first "##" line containing TEXT, up to
the next "## " line. Needs matplotlib; without it, says so and exits 2.
"""
import argparse
import sys


def human(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def parse(path, section):
    tables, name, cols, inside = [], "", None, not section
    for line in open(path):
        s = line.strip()
        if s.startswith("## ") and section:
            inside = section in s
            continue
        if not inside:
            continue
        if s.startswith("###"):
            name, cols = s.lstrip("#").strip(), None
        elif s.startswith("bytes") and "roles=off" in s:
            cols = s.split()[1:]
            tables.append((name, cols, []))
        elif cols and s and s.split()[0].isdigit():
            f = s.split()
            tables[-1][2].append((int(f[0]), [float(v) if v != "-" else None for v in f[1:]]))
        else:
            cols = None if not s else cols
    return tables


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps")
    ap.add_argument("png")
    ap.add_argument("--section", default="")
    ap.add_argument("--title", default="hierarchical AllReduce: data-parallel time / CTA-roles time")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot-roles: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return 2
    tables = parse(args.sweeps, args.section)
    if not tables:
        print(f"plot-roles: no roles table in {args.sweeps}", file=sys.stderr)
        return 1
    fig, axes = plt.subplots(1, len(tables), figsize=(4.2 * len(tables), 3.8), sharey=True, squeeze=False)
    for ax, (name, cols, rows) in zip(axes[0], tables):
        off = cols.index("roles=off")
        xs = [b for b, _ in rows]
        for j, c in enumerate(cols):
            if j == off:
                continue
            ys = [v[off] / v[j] if v[off] and v[j] else float("nan") for _, v in rows]
            ax.plot(xs, ys, marker="o", ms=3, label=c.replace("roles=", "W,R = "))
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([human(b) for b in xs], rotation=45, fontsize=7)
        ax.set_title(name, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("speedup of roles over data-parallel")
    fig.suptitle(args.title, fontsize=9)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"plot-roles: wrote {args.png} ({len(tables)} panel(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
