#!/usr/bin/env python3
"""Side-by-side table of two nccl-tests outputs of the same test (NCCL alone, then mkernel under
LD_PRELOAD): out-of-place time and busbw per size, the time ratio, and #wrong of both runs
(out-of-place and in-place). Exit status 1 when any #wrong is not 0 or a size is missing.

  python3 scripts/nccl-tests-table.py NCCL MKERNEL [--title TEXT] [--csv OUT.csv]

NCCL, MKERNEL: nccl-tests' JSON output (-J FILE), or its stdout: when the stdout says where it
wrote its JSON ("# Writing JSON output to FILE") and that file is there, the JSON is read; the
text columns are read only from a run without -J.
"""
import argparse
import csv
import json
import os
import re
import sys


def wrong_text(value):
    """nccl-tests' nwrong (a number, or null when the data check is off) as its text column."""
    return "N/A" if value is None else f"{value:g}"


def parse_json(path):
    """{size: (time_us, busbw, wrong_oop, wrong_ip, path)} from nccl-tests' -J output (its "results":
    size, out_of_place / in_place {time or cpu_time, alg_bw, bus_bw, nwrong}; the patched
    nccl-tests adds "path"). None when the file is not such a document."""
    try:
        with open(path, errors="replace") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        return None
    rows = {}
    for r in doc["results"]:
        oop, ip = r.get("out_of_place") or {}, r.get("in_place") or {}
        t = oop.get("time", oop.get("cpu_time"))
        if t is None or "size" not in r:
            continue
        rows[int(r["size"])] = (float(t), float(oop.get("bus_bw", 0.0)), wrong_text(oop.get("nwrong")),
                                wrong_text(ip.get("nwrong")) if ip else "N/A", r.get("path", ""))
    return rows


def parse(path):
    """{size: (time_us, busbw, wrong_oop, wrong_ip, path)} from nccl-tests' JSON (the file itself, or
    the one its stdout names), else from its stdout's text columns."""
    with open(path, errors="replace") as f:
        text = f.read()
    if text.lstrip().startswith("{"):
        rows = parse_json(path)
        if rows is not None:
            return rows
    m = re.search(r"^# Writing JSON output to (\S+)", text, re.M)
    if m:
        named = m.group(1)
        if not os.path.isabs(named) and not os.path.exists(named):
            named = os.path.join(os.path.dirname(path), os.path.basename(named))
        rows = parse_json(named) if os.path.exists(named) else None
        if rows is not None:
            return rows
    return parse_text(text)


def parse_text(text):
    """The same from an nccl-tests stdout without JSON: its result lines' columns."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        tok = line.split()
        if len(tok) < 13 or not tok[0].isdigit() or not tok[1].isdigit():
            continue
        try:
            t_oop, bus_oop, wrong_oop = float(tok[5]), float(tok[7]), tok[8]
            wrong_ip = tok[12]
        except ValueError:
            continue
        rows[int(tok[0])] = (t_oop, bus_oop, wrong_oop, wrong_ip, tok[13] if len(tok) > 13 else "")
    return rows


def human(n):
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n // size}{unit}"
    return str(n)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("nccl")
    ap.add_argument("mkernel")
    ap.add_argument("--title", default="")
    ap.add_argument("--csv")
    ap.add_argument("--common", action="store_true",
                    help="compare only the sizes both runs have (runs of different -e or -f); at least one")
    a = ap.parse_args()
    base, mk = parse(a.nccl), parse(a.mkernel)
    if not base or not mk:
        print(f"nccl-tests-table: no result lines in {a.nccl if not base else a.mkernel}", file=sys.stderr)
        return 1
    ok = True
    if a.title:
        print(f"# {a.title}")
    print(f"{'size':>6} {'nccl_us':>9} {'mk_us':>9} {'speedup':>8} {'nccl_busbw':>11} {'mk_busbw':>9} "
          f"{'wrong(nccl,mk)':>15} {'mk_path':>8}")
    out = []
    sizes = sorted(set(base) & set(mk)) if a.common else sorted(set(base) | set(mk))
    if not sizes:
        print("nccl-tests-table: the two runs share no size", file=sys.stderr)
        return 1
    for size in sizes:
        b, m = base.get(size), mk.get(size)
        if b is None or m is None:
            print(f"{human(size):>6} missing in {'the NCCL run' if b is None else 'the mkernel run'}")
            ok = False
            continue
        wrong = f"{b[2]}/{b[3]},{m[2]}/{m[3]}"
        ok = ok and all(w in ("0", "N/A") for w in (b[2], b[3], m[2], m[3]))
        speed = b[0] / m[0] if m[0] > 0 else float("inf")
        print(f"{human(size):>6} {b[0]:>9.2f} {m[0]:>9.2f} {speed:>7.2f}x {b[1]:>11.2f} {m[1]:>9.2f} {wrong:>15} {m[4]:>8}")
        out.append([size, b[0], m[0], speed, b[1], m[1], b[2], b[3], m[2], m[3], m[4]])
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["bytes", "nccl_us", "mk_us", "speedup", "nccl_busbw", "mk_busbw", "nccl_wrong_oop",
                        "nccl_wrong_ip", "mk_wrong_oop", "mk_wrong_ip", "mk_path"])
            w.writerows(out)
    if not ok:
        print("nccl-tests-table: a size is missing or #wrong is not 0", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
