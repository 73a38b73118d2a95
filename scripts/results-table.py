#!/usr/bin/env python3
"""docs/RESULTS.md from the measurements in docs/results/*.csv, and README.md's headline table.

    python3 scripts/results-table.py [--check] [--readme README.md] [--embed FILE]... [--results DIR]
                                     [--out FILE]

Each CSV is one theme (collectives.csv: mkernel against NCCL; latency.csv: floors and probes; ...)
and becomes one section of the page. Every row is one measured point, and every CSV has the
columns date (YYYY-MM-DD), machine, commit and command. Within a section the rows are grouped by
run (date, machine, commit, command, and mode where the CSV has one), in the order each run first
appears; a column whose value is the
same for every row of a run is printed once above that run's table, the others as its columns.
size_bytes is printed as B / KiB / MiB / GiB; the headline column is not printed.
compat.csv (columns nccl, component, result) is one table instead: a row per NCCL version, newest
first, a column per component (shim, net plugin, tuner; "net plugin + tuner" fills both), and in
each cell every run of that pair: its command, result, machine, date and commit.

--check           exit 1 if the page (and, with --readme, the README's table) differs from what
                  the CSVs give; write nothing.
--readme FILE     rewrite what lies between the lines "<!-- results:begin -->" and
                  "<!-- results:end -->" of FILE with a table of the rows whose headline column
                  is 1 (at most 8): date, hardware, commit, command and the figure against NCCL.
                  Exit 1 if the markers are absent, or if more than 8 rows are marked.
--embed FILE      (repeatable) rewrite, in FILE, what lies between the lines
                  "<!-- results:NAME.csv begin -->" and "<!-- results:NAME.csv end -->" with that
                  CSV's tables as the page has them (docs/MODEL.md embeds model.csv). Exit 1 if
                  FILE has no such pair, or names a CSV that does not exist.
--results DIR     the CSVs (default: docs/results of this repository).
--out FILE        the page (default: docs/RESULTS.md of this repository).
"""
import argparse
import csv
import glob
import os
import re
import sys

REQUIRED = ("date", "machine", "commit", "command")
RUN_KEYS = ("date", "machine", "commit", "command", "mode")
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
MAX_HEADLINE = 8

THEMES = {
    "compat": ("NCCL versions",
               "What ran against each NCCL version, and its result: a row per version, a column per component "
               "(`shim`: the LD_PRELOAD shim forwarding to that libnccl; `net plugin`, `tuner`: that NCCL loading "
               "mkernel's plugins, or mkernel's ABI structs against that version's plugin headers). An empty cell: "
               "nothing was run. How to run these: docs/TROUBLESHOOTING.md, \"NCCL versions\"."),
    "collectives": ("mkernel against NCCL",
                    "Time per collective, mkernel and NCCL in the same run (`ratio` = NCCL's time / mkernel's: above 1 "
                    "mkernel is faster). `path` is what ran under mkernel (nccl-tests' path column: `mk`, or `nccl` "
                    "where the default policy hands the size to NCCL); `wrong` is nccl-tests' #wrong, NCCL's and "
                    "mkernel's, out of place and in place."),
    "emulated": ("Thread ranks sharing one GPU",
                 "AllReduce of emulated thread ranks on one GPU, eager medians (`mkernel`), CUDA-graph medians and the "
                 "share of `cudaMemcpy`'s device-to-device bandwidth measured in the same run."),
    "latency": ("Floors and probes",
                "What the hardware and the CUDA driver cost before a collective does any work, and the small "
                "collective's time beside them."),
    "model": ("The cost model against measurements",
              "`mkernel-model` (docs/MODEL.md) against measured times; `error_pct` = (model - measured) / measured."),
    "overlap": ("Overlap of the hierarchical pipeline",
                "Share of the shorter phase (node or rail) that the pipelined AllReduce hides, per layout "
                "(nodes x ranks per node) and form, over rounds of pipelined and in-turn runs of the same build "
                "(`mkernel` is the median, `min` and `max` the range, `rounds_ge_80` the rounds at or above 80%)."),
    "pipeline": ("The hierarchical AllReduce's time by form",
                 "Median over rounds of the eager medians (`mkernel`, us) of the hierarchical AllReduce on emulated nodes, "
                 "pipelined and in turn, per layout, form and variant; `ratio` to the `baseline` variant where the sweep "
                 "had one. CTA 0's busy time, its rail and node-barrier waits, and its own work in device memory (`loc`) "
                 "and through the net buffers (`net`), us per op."),
    "transport": ("Host transports",
                  "The TCP transport (`net::Net`) and the proxy on loopback, against a plain socket and the bare "
                  "transport (`baseline`); `ratio` = mkernel / baseline."),
}


class Error(Exception):
    pass


def human(n):
    try:
        n = int(n)
    except ValueError:
        return n
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d %s" % (n >> shift, unit)
    return "%d B" % n


def load(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        cols = reader.fieldnames or []
        missing = [c for c in REQUIRED if c not in cols]
        if missing:
            raise Error("%s: no column %s" % (path, ", ".join(missing)))
        rows = []
        for i, row in enumerate(reader, 2):
            if None in row or any(v is None for v in row.values()):
                raise Error("%s:%d: %d fields, the header has %d" % (path, i, len(row) + len(row.get(None) or []) - (1 if None in row else 0), len(cols)))
            if not re.match(r"^\d{4}-\d{2}-\d{2}$", row["date"]):
                raise Error("%s:%d: date %r is not YYYY-MM-DD" % (path, i, row["date"]))
            rows.append(row)
    if not rows:
        raise Error("%s: no rows" % path)
    return cols, rows


def cell(col, value):
    value = human(value) if col == "size_bytes" and value else value
    return value.replace("|", "\\|").replace("\n", " ")


def table(cols, rows):
    out = ["| " + " | ".join(c.replace("size_bytes", "size") for c in cols) + " |",
           "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(cell(c, r[c]) for c in cols) + " |")
    return out


def section(name, cols, rows):
    title, about = THEMES.get(name, (name, ""))
    out = ["## %s (`%s.csv`)" % (title, name), ""]
    if about:
        out += [about, ""]
    out += ["%d rows." % len(rows), ""]
    return out + tables(name, cols, rows)


def tables(name, cols, rows):
    return compat_table(cols, rows) if name == "compat" else runs_tables(cols, rows)


COMPONENTS = ("shim", "net plugin", "tuner")


def version_key(v):
    return [int(x) if x.isdigit() else x for x in re.split(r"[.+-]", v)]


def compat_table(cols, rows):
    """A row per NCCL version (newest first), a column per component, every run in its cells."""
    missing = [c for c in ("nccl", "component", "result") if c not in cols]
    if missing:
        raise Error("compat.csv: no column %s" % ", ".join(missing))
    comps, cells = list(COMPONENTS), {}
    for r in rows:
        for comp in (c.strip() for c in r["component"].split("+")):
            if comp not in comps:
                comps.append(comp)
            text = "`%s`: %s (%s, %s, %s)" % (r["command"], r["result"], r["machine"], r["date"], r["commit"])
            cells.setdefault((r["nccl"], comp), []).append(cell("result", text))
    out = ["| NCCL | " + " | ".join(comps) + " |", "|" + "---|" * (len(comps) + 1)]
    for v in sorted({r["nccl"] for r in rows}, key=version_key, reverse=True):
        out.append("| %s | %s |" % (v, " | ".join("<br>".join(cells.get((v, c), [])) for c in comps)))
    return out + [""]


def runs_tables(cols, rows):
    out = []
    keys = [k for k in RUN_KEYS if k in cols]
    runs = {}
    for r in rows:
        runs.setdefault(tuple(r[k] for k in keys), []).append(r)
    shown = [c for c in cols if c != "headline"]
    for key, group in runs.items():
        const = [c for c in shown if c not in keys and len(group) > 1 and len({g[c] for g in group}) == 1]
        if len(group) == 1:
            const = []
        head = ", ".join("%s: `%s`" % (k, v) if k == "command" else "%s: %s" % (k, v) for k, v in zip(keys, key) if v)
        out.append("**%s**" % head)
        extra = ["%s: %s" % (c, cell(c, group[0][c])) for c in const if group[0][c]]
        if extra:
            out += ["", "; ".join(extra)]
        out.append("")
        out += table([c for c in shown if c not in keys and c not in const], group)
        out.append("")
    return out


def gather(results):
    files = sorted(glob.glob(os.path.join(results, "*.csv")))
    if not files:
        raise Error("%s: no CSV files" % results)
    return [(os.path.splitext(os.path.basename(f))[0], f) + load(f) for f in files]


def page(themes):
    out = ["# Results", "",
           "<!-- Generated by `python3 scripts/results-table.py` from docs/results/*.csv; edit the CSVs, not this page. -->",
           "",
           "Generated from `docs/results/*.csv` by `python3 scripts/results-table.py --embed docs/MODEL.md` (`--check` "
           "tells whether this page is current). Each row of a CSV is one measured point: when, on which machine, at which commit "
           "(`unknown` where the run recorded none) and by which command. docs/PERFORMANCE.md says how to measure "
           "and what limits the numbers; docs/MODEL.md explains the cost model.", ""]
    for name, path, cols, rows in themes:
        out.append("- [%s](#%s) (`docs/results/%s.csv`, %d rows)" % (
            THEMES.get(name, (name,))[0], anchor("%s (`%s.csv`)" % (THEMES.get(name, (name,))[0], name)), name, len(rows)))
    out.append("")
    for name, path, cols, rows in themes:
        out += section(name, cols, rows)
    return "\n".join(out).rstrip("\n") + "\n"


def anchor(title):
    a = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
    return a


def figure(r):
    what = " ".join(x for x in (r.get("collective", ""), human(r["size_bytes"]) if r.get("size_bytes") else "") if x)
    mode = r.get("mode", "")
    unit = r.get("unit", "")
    if r.get("nccl"):
        fig = "mkernel %s %s, NCCL %s %s" % (r["mkernel"], unit, r["nccl"], unit)
        if r.get("ratio"):
            fig += " (NCCL / mkernel %sx)" % r["ratio"]
    else:
        fig = "mkernel %s %s" % (r.get("mkernel", ""), unit)
    return "%s%s: %s" % (what, " (%s)" % mode if mode else "", fig)


def headline(themes):
    rows = []
    for name, path, cols, data in themes:
        if "headline" not in cols:
            continue
        for r in data:
            if r["headline"].strip() not in ("", "0", "1"):
                raise Error("%s: headline %r is neither 0 nor 1" % (path, r["headline"]))
            if r["headline"].strip() == "1":
                rows.append(r)
    if len(rows) > MAX_HEADLINE:
        raise Error("%d rows have headline 1; the README's table holds at most %d" % (len(rows), MAX_HEADLINE))
    out = ["<!-- Generated by `python3 scripts/results-table.py --readme README.md` from the rows of "
           "docs/results/*.csv whose headline column is 1; all results: docs/RESULTS.md. -->", "",
           "| date | hardware | commit | command | figure against NCCL |", "|---|---|---|---|---|"]
    for r in rows:
        out.append("| %s | %s | %s | %s | %s |" % tuple(
            x.replace("|", "\\|") for x in (r["date"], r["machine"], r["commit"], "`%s`" % r["command"], figure(r))))
    return out


EMBED = re.compile(r"^<!-- results:([\w.-]+)\.csv (begin|end) -->$")


def embed_text(text, themes, path):
    """text with each begin/end pair of NAME.csv filled with that CSV's tables."""
    by_name = {name: (cols, rows) for name, _, cols, rows in themes}
    src, out, i, found = text.split("\n"), [], 0, 0
    while i < len(src):
        m = EMBED.match(src[i].strip())
        if m and m.group(2) == "begin":
            name = m.group(1)
            end = next((j for j in range(i + 1, len(src)) if src[j].strip() == "<!-- results:%s.csv end -->" % name), None)
            if end is None:
                raise Error("%s: %s has no matching end line" % (path, src[i].strip()))
            if name not in by_name:
                raise Error("%s: no %s.csv among the results" % (path, name))
            cols, rows = by_name[name]
            out += [src[i], "<!-- Generated by scripts/results-table.py --embed from docs/results/%s.csv; edit the CSV, "
                            "not this table. -->" % name, ""] + tables(name, cols, rows) + [src[end]]
            i, found = end + 1, found + 1
            continue
        out.append(src[i])
        i += 1
    if not found:
        raise Error("%s: no lines <!-- results:NAME.csv begin --> and <!-- results:NAME.csv end -->" % path)
    return "\n".join(out)


def readme_text(text, lines, path):
    src = text.split("\n")
    try:
        b = next(i for i, l in enumerate(src) if l.strip() == BEGIN)
        e = next(i for i, l in enumerate(src) if l.strip() == END and i > b)
    except StopIteration:
        raise Error("%s: no lines %s and %s (in that order); nothing written" % (path, BEGIN, END))
    return "\n".join(src[:b + 1] + lines + src[e:])


def main(argv):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--readme")
    ap.add_argument("--embed", action="append", default=[])
    ap.add_argument("--results", default=os.path.join(here, "docs", "results"))
    ap.add_argument("--out", default=os.path.join(here, "docs", "RESULTS.md"))
    a = ap.parse_args(argv)
    try:
        themes = gather(a.results)
        want = {a.out: page(themes)}
        if a.readme:
            with open(a.readme) as f:
                text = f.read()
            want[a.readme] = readme_text(text, headline(themes), a.readme)
        for path in a.embed:
            with open(path) as f:
                want[path] = embed_text(f.read(), themes, path)
    except (Error, OSError) as e:
        print("results-table.py: %s" % e, file=sys.stderr)
        return 1
    stale = []
    for path, text in want.items():
        try:
            with open(path) as f:
                have = f.read()
        except OSError:
            have = None
        if have != text:
            stale.append(path)
            if not a.check:
                with open(path, "w") as f:
                    f.write(text)
    if a.check:
        for path in stale:
            print("results-table.py: %s is stale: run python3 scripts/results-table.py%s%s" % (
                path, " --readme " + a.readme if a.readme else "", "".join(" --embed " + e for e in a.embed)), file=sys.stderr)
        return 1 if stale else 0
    for path in want:
        print("%s %s" % ("wrote" if path in stale else "unchanged", path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
