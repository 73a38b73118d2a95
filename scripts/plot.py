#!/usr/bin/env python3
"""Plots of the benchmarks' output as PNGs, one subcommand per kind of input:

  python3 scripts/plot.py bench COLLBENCH.csv [OUT.png] [--title TEXT]
  python3 scripts/plot.py nccl-tests OUT.png --runs NCCL.json MKERNEL.json [--runs ...] [--title TEXT]
  python3 scripts/plot.py nccl-tests TABLES.txt OUT.png [--title TEXT] [--only WORD]
  python3 scripts/plot.py rail OUT.png RAIL-SWEEP.txt[=LABEL] ... [--title TEXT]
  python3 scripts/plot.py roles SWEEPS.txt OUT.png [--section TEXT] [--title TEXT]

bench: a mkernel-collbench CSV (--csv): per-op latency and memory bandwidth against the message
size, one curve per (stream-wait mode, rank count), eager solid and CUDA graph dashed; OUT.png
defaults to the CSV's name with .png.

nccl-tests: the tables of scripts/nccl-tests-table.py (NCCL against mkernel, one section per
test): bus bandwidth against message size (NCCL dashed, mkernel solid) and mkernel's speedup (NCCL
time / mkernel time) against size, one colour per collective. --runs: nccl-tests' JSON outputs (-J
FILE, or a stdout that names its JSON file) of one test, NCCL alone then mkernel, read as
scripts/nccl-tests-table.py reads them; one curve pair per --runs, named after the test binary.
TABLES.txt (recorded tables): the tables.txt of scripts/gpu-check.sh multigpu or launch (sections
start with "# <test>, ..."); --only keeps the sections whose title contains WORD (default: those
comparing NCCL with mkernel on the same path, i.e. titles with "vs mkernel").

rail: scripts/gpu-check.sh rail sweeps (MKERNEL_HIER_RAIL: direct, ring, rhd; pipelined and in
turn): for each layout of each file, the time of the direct form pipelined over the time of every
(form, overlap) against the message size (above 1: faster than direct pipelined), one panel per
(file, layout), three to a row; each point is the mean of the eager medians of the file's rounds.
RAIL-SWEEP.txt is gpu-check.sh rail's raw rail-sweep.txt (lines "R:G/form/ovO/rN: ... memop ranks
bytes eager_med ..."; R:G:L with lanes, R:G:L:W,R in CTA roles, a panel of its own).

roles: MKERNEL_HIER_ROLES sweeps (the tables scripts/gpu-check.sh launch step 3h prints): for each
table, the data-parallel time over each roles setting's time against the message size (above 1:
the roles are faster), one panel per table. SWEEPS.txt holds tables whose header line starts with
"bytes" followed by "roles=off" and the other settings, each preceded by a "### name" line that
titles its panel. --section keeps only the tables after the first "##" line containing TEXT, up to
the next "## " line.

Every subcommand needs matplotlib (pip install matplotlib); without it, it says so and exits 2 (the
input is the data).
"""
import argparse
import csv
import importlib.util
import json
import os
import re
import sys
from collections import defaultdict

SUMMARY = {
    "bench": "mkernel-collbench CSV: latency and bandwidth against size",
    "nccl-tests": "nccl-tests, NCCL against mkernel: bus bandwidth and speedup against size",
    "rail": "gpu-check.sh rail sweeps: each rail exchange form against the direct form, pipelined",
    "roles": "MKERNEL_HIER_ROLES sweeps: data-parallel time over each roles setting's time",
}


def human(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def human_short(n):
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n:g}"


def pyplot(cmd):
    """matplotlib.pyplot on the Agg backend, or None (said on stderr) when it is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"plot.py {cmd}: matplotlib is not installed (pip install matplotlib); no plot written", file=sys.stderr)
        return None
    return plt


# ---- bench ----------------------------------------------------------------------------------------
def bench(argv):
    ap = argparse.ArgumentParser(prog="plot.py bench", description=SUMMARY["bench"])
    ap.add_argument("csv")
    ap.add_argument("png", nargs="?")
    ap.add_argument("--title", default="mkernel AllReduce (float sum), emulated ranks on one GPU")
    args = ap.parse_args(argv)
    plt = pyplot("bench")
    if plt is None:
        return 2
    with open(args.csv) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print(f"plot.py bench: {args.csv} has no rows", file=sys.stderr)
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
    print(f"plot.py bench: wrote {out}")
    return 0


# ---- nccl-tests -----------------------------------------------------------------------------------
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    if text[-1] in UNITS:
        return int(text[:-1]) * UNITS[text[-1]]
    return int(text)


def nt_parse(path, only):
    """{title: [(bytes, nccl_us, mk_us, speedup, nccl_busbw, mk_busbw)]}"""
    sections, title = {}, None
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                t = line[1:].strip()
                title = t if (only in t if only else "vs mkernel" in t) else None
                if title is not None:
                    sections[title] = []
                continue
            fields = line.split()
            if title is None or len(fields) < 6 or fields[1] == "nccl_us" or "missing" in line:
                continue
            try:
                size = parse_size(fields[0])
                row = (size, float(fields[1]), float(fields[2]), float(fields[3].rstrip("x")), float(fields[4]),
                       float(fields[5]))
            except ValueError:
                continue
            if size > 0:
                sections[title].append(row)
    return {t: rows for t, rows in sections.items() if rows}


def load_table_module():
    """scripts/nccl-tests-table.py, whose reader of nccl-tests' output the runs share."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nccl-tests-table.py")
    spec = importlib.util.spec_from_file_location("nccl_tests_table", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_name(path):
    """The nccl-tests binary that wrote `path` (its JSON "args"[0]), else the file's name."""
    try:
        with open(path) as f:
            args = json.load(f).get("args") or []
        if args:
            return os.path.basename(args[0])
    except (OSError, ValueError, AttributeError):
        pass
    return os.path.splitext(os.path.basename(path))[0]


def parse_runs(pairs):
    """{title: [(bytes, nccl_us, mk_us, speedup, nccl_busbw, mk_busbw)]} from (NCCL, mkernel) runs."""
    table = load_table_module()
    sections = {}
    for nccl_path, mk_path in pairs:
        base, mk = table.parse(nccl_path), table.parse(mk_path)
        rows = []
        for size in sorted(set(base) & set(mk)):
            b, m = base[size], mk[size]
            if size > 0 and m[0] > 0:
                rows.append((size, b[0], m[0], b[0] / m[0], b[1], m[1]))
        if rows:
            sections[f"{test_name(nccl_path)}, NCCL vs mkernel"] = rows
    return sections


def nccl_tests(argv):
    ap = argparse.ArgumentParser(prog="plot.py nccl-tests", description=SUMMARY["nccl-tests"])
    ap.add_argument("files", nargs="+", metavar="FILE", help="[TABLES.txt] OUT.png")
    ap.add_argument("--runs", nargs=2, action="append", default=[], metavar=("NCCL", "MKERNEL"))
    ap.add_argument("--title", default="nccl-tests: NCCL against mkernel")
    ap.add_argument("--only", default="")
    a = ap.parse_args(argv)
    if len(a.files) > 2 or (len(a.files) == 1) != bool(a.runs):
        ap.error("give OUT.png with --runs, or TABLES.txt OUT.png")
    a.png = a.files[-1]
    sections = parse_runs(a.runs) if a.runs else nt_parse(a.files[0], a.only)
    if not sections:
        print(f"plot.py nccl-tests: no NCCL-vs-mkernel rows in {' '.join(sum(a.runs, [])) or a.files[0]}", file=sys.stderr)
        return 1
    plt = pyplot("nccl-tests")
    if plt is None:
        return 2
    fig, (bw, sp) = plt.subplots(1, 2, figsize=(14, 5.5))
    for i, (title, rows) in enumerate(sections.items()):
        colour = f"C{i}"
        name = title.split(",")[0].replace("_perf", "")
        x = [r[0] for r in rows]
        # nccl-tests prints busbw with two decimals: the smallest sizes read 0.00, off a log axis.
        nb = [(r[0], r[4]) for r in rows if r[4] > 0]
        mb = [(r[0], r[5]) for r in rows if r[5] > 0]
        bw.plot([p[0] for p in nb], [p[1] for p in nb], "--", color=colour, alpha=0.7, label=f"{name} NCCL")
        bw.plot([p[0] for p in mb], [p[1] for p in mb], "-", color=colour, marker=".", label=f"{name} mkernel")
        sp.plot(x, [r[3] for r in rows], "-", color=colour, marker=".", label=name)
    for ax in (bw, sp):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ticks = [t for t in (8, 1 << 10, 1 << 15, 1 << 20, 1 << 25, 1 << 30, 1 << 33)]
        ax.set_xticks(ticks)
        ax.set_xticklabels([human_short(t) for t in ticks])
        ax.grid(True, which="major", alpha=0.3)
    bw.set_yscale("log")
    bw.set_ylabel("bus bandwidth (GB/s)")
    bw.set_title("bus bandwidth: NCCL dashed, mkernel solid")
    bw.legend(fontsize=7, ncol=2)
    sp.axhline(1.0, color="black", linewidth=0.8)
    sp.set_ylabel("speedup (NCCL time / mkernel time)")
    sp.set_title("mkernel's speedup over NCCL (above 1: mkernel faster)")
    sp.legend(fontsize=8)
    fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)
    print(f"plot.py nccl-tests: {len(sections)} collective(s) -> {a.png}")
    return 0


# ---- rail -----------------------------------------------------------------------------------------
LINE = re.compile(r"^(\d+):(\d+)(?::(\d+))?(?::(\d+,\d+))?/(\w+)/ov(\d)/r(\d+):\s+memop\s+\d+\s+(\d+)\s+([\d.]+)\s")


def rail_parse(path):
    """{(ranks, perNode, lanes or 0, roles or ""): {(form, overlap): {bytes: [eager medians of the rounds]}}}"""
    out = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for line in open(path):
        m = LINE.match(line)
        if m:
            ranks, rpn, lanes, roles, form, ov, _, nbytes, eager = m.groups()
            out[(int(ranks), int(rpn), int(lanes or 0), roles or "")][(form, int(ov))][int(nbytes)].append(float(eager))
    return out


def rail(argv):
    ap = argparse.ArgumentParser(prog="plot.py rail", description=SUMMARY["rail"])
    ap.add_argument("out")
    ap.add_argument("inputs", nargs="+", help="rail-sweep.txt files, each optionally =LABEL")
    ap.add_argument("--title", default="hierarchical AllReduce: rail exchange forms")
    args = ap.parse_args(argv)
    plt = pyplot("rail")
    if plt is None:
        return 2
    panels = []
    for spec in args.inputs:
        path, _, label = spec.partition("=")
        for layout, series in sorted(rail_parse(path).items(), reverse=True):
            lanes = f", {layout[2]} lane(s)" if layout[2] else ""
            roles = f", CTA roles {layout[3]}" if layout[3] else ""
            panels.append((f"{label or path}: {layout[0] // layout[1]} nodes x {layout[1]}{lanes}{roles}", series))
    if not panels or not all(("direct", 1) in s for _, s in panels):
        print("plot.py rail: no sweep with the direct form pipelined in the input", file=sys.stderr)
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
    print(f"plot.py rail: wrote {args.out} ({len(panels)} panel(s))")
    return 0


# ---- roles ----------------------------------------------------------------------------------------
def roles_parse(path, section):
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


def roles(argv):
    ap = argparse.ArgumentParser(prog="plot.py roles", description=SUMMARY["roles"])
    ap.add_argument("sweeps")
    ap.add_argument("png")
    ap.add_argument("--section", default="")
    ap.add_argument("--title", default="hierarchical AllReduce: data-parallel time / CTA-roles time")
    args = ap.parse_args(argv)
    plt = pyplot("roles")
    if plt is None:
        return 2
    tables = roles_parse(args.sweeps, args.section)
    if not tables:
        print(f"plot.py roles: no roles table in {args.sweeps}", file=sys.stderr)
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
    print(f"plot.py roles: wrote {args.png} ({len(tables)} panel(s))")
    return 0


COMMANDS = {"bench": bench, "nccl-tests": nccl_tests, "rail": rail, "roles": roles}


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(__doc__.split("\n\n")[1].rstrip(), file=sys.stderr)
        print(f"plot.py: the first argument is one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return COMMANDS[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
