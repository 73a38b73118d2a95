#!/usr/bin/env python3
"""Plots the tables of scripts/nccl-tests-table.py (NCCL against mkernel, one section per test) as a
PNG: bus bandwidth against message size (NCCL dashed, mkernel solid) and mkernel's speedup
(NCCL time / mkernel time) against size, one colour per collective.

  python3 scripts/plot-nccl-tests.py OUT.png --runs NCCL.json MKERNEL.json [--runs ...] [--title TEXT]
  python3 scripts/plot-nccl-tests.py TABLES.txt OUT.png [--title TEXT] [--only WORD]

--runs: nccl-tests' JSON outputs (-J FILE, or a stdout that names its JSON file) of one test,
NCCL alone then mkernel, read as scripts/nccl-tests-table.py reads them; one curve pair per
--runs, named after the test binary. TABLES.txt (recorded tables): the
tables.txt of scripts/gpu-check.sh multigpu or scripts/gpu-check.sh launch (sections start with
"# <test>, ..."); --only keeps the sections whose title contains WORD (default: those comparing
NCCL with mkernel on the same path, i.e. titles with "vs mkernel"). Needs matplotlib; without
it, says so and exits 2.
"""
import argparse
import importlib.util
import json
import os
import sys

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    if text[-1] in UNITS:
        return int(text[:-1]) * UNITS[text[-1]]
    return int(text)


def parse(path, only):
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


def human(n):
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n:g}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", metavar="FILE", help="[TABLES.txt] OUT.png")
    ap.add_argument("--runs", nargs=2, action="append", default=[], metavar=("NCCL", "MKERNEL"))
    ap.add_argument("--title", default="nccl-tests: NCCL against mkernel")
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    if len(a.files) > 2 or (len(a.files) == 1) != bool(a.runs):
        ap.error("give OUT.png with --runs, or TABLES.txt OUT.png")
    a.png = a.files[-1]
    sections = parse_runs(a.runs) if a.runs else parse(a.files[0], a.only)
    if not sections:
        print(f"plot-nccl-tests: no NCCL-vs-mkernel rows in {' '.join(sum(a.runs, [])) or a.files[0]}", file=sys.stderr)
        return 1
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot-nccl-tests: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
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
        ax.set_xticklabels([human(t) for t in ticks])
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
    print(f"plot-nccl-tests: {len(sections)} collective(s) -> {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
