#!/usr/bin/env python3
"""The SASS lines with the most warp-stall samples in an ncu source page.

    ncu -i REPORT --page source --csv --print-source sass > source.csv
    python3 scripts/ncu-hot.py source.csv [N]

Sums each instruction's samples over every kernel in the page (same address and text), and
prints the N (40) with the most, with their share of all samples, the not-issued samples and the
executed-instruction count where the page has them. A page in another layout: its first lines,
and exit status 1, so that a call that got the report still shows what ncu wrote.
"""
import csv
import sys


def find(header, *words):
    for i, h in enumerate(header):
        if all(w.lower() in h.lower() for w in words):
            return i
    return None


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    cols = None
    lines = {}
    order = []
    for row in rows:
        src = find(row, "source")
        samp = find(row, "sampling", "all")
        if samp is None:
            samp = find(row, "sampling")
        if src is not None and samp is not None and find(row, "address") is not None:
            cols = (find(row, "address"), src, samp, find(row, "not-issued") or find(row, "not issued"),
                    find(row, "instructions executed"))
            continue
        if cols is None or len(row) <= max(c for c in cols if c is not None):
            continue

        def num(i):
            if i is None:
                return 0.0
            try:
                return float(row[i].replace(",", ""))
            except ValueError:
                return 0.0
        key = (row[cols[0]], row[cols[1]].strip())
        if key not in lines:
            lines[key] = [0.0, 0.0, 0.0]
            order.append(key)
        v = lines[key]
        v[0] += num(cols[2])
        v[1] += num(cols[3])
        v[2] += num(cols[4])
    if not lines:
        print(f"ncu-hot: no source table with sampling columns in {path}; its first lines:")
        for row in rows[:15]:
            print("  " + ",".join(row)[:200])
        return 1
    total = sum(v[0] for v in lines.values())
    print(f"# {len(lines)} SASS lines, {total:.0f} warp-stall samples; the {top} with the most")
    print(f"{'address':>10} {'samples':>8} {'%':>6} {'cum%':>6} {'not_iss':>8} {'executed':>9}  instruction")
    cum = 0.0
    for key, v in sorted(lines.items(), key=lambda kv: -kv[1][0])[:top]:
        cum += v[0]
        pct = 100.0 * v[0] / total if total else 0.0
        print(f"{key[0]:>10} {v[0]:8.0f} {pct:6.1f} {100.0 * cum / total if total else 0:6.1f} {v[1]:8.0f} {v[2]:9.0f}  {key[1][:90]}")
    # Where the samples fall along the code: tenths of the kernel's instructions by address order.
    n = len(order)
    if n >= 10:
        print("# samples per tenth of the code (address order)")
        for t in range(10):
            part = order[t * n // 10:(t + 1) * n // 10]
            s = sum(lines[k][0] for k in part)
            print(f"  {part[0][0]:>10}-{part[-1][0]:<10} {s:8.0f} {100.0 * s / total if total else 0:6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
