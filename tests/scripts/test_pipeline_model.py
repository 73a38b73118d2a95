#!/usr/bin/env python3
"""scripts/pipeline-model.py: the figures docs/MODEL.md quotes from it, for the measured 2 x 2 and
4 x 2 per-chunk times: two chunks ahead takes 3-10% less time than one at 16
chunks, and the same or up to 5% less at 4; in turn and one ahead hide what they did.

    python3 tests/scripts/test_pipeline_model.py REPO_ROOT
"""
import sys

from script_test import report, run_script


def table(root, *args):
    out = run_script(root, "pipeline-model.py", *args)
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if f and f[0] in ("shared", "fifo"):
            rows[f[0]] = {"turn": float(f[1]), "one": float(f[2]), "two": float(f[3]), "ratio": float(f[4])}
    return rows


def main(root):
    failures = []
    cases = [
        (("--chunks", "16"), 10576, (0.89, 0.98)),
        (("--chunks", "4"), 2644, (0.94, 1.01)),
        (("--nodes", "2", "--round-us", "105", "--chunks", "16"), 6896, (0.89, 0.98)),
        (("--nodes", "2", "--round-us", "105", "--chunks", "4"), 1724, (0.94, 1.01)),
    ]
    for args, turn, (lo, hi) in cases:
        rows = table(root, *args)
        if set(rows) != {"shared", "fifo"}:
            failures.append("%s: rows %s" % (" ".join(args), sorted(rows)))
            continue
        for mode, r in rows.items():
            what = "%s, %s" % (" ".join(args), mode)
            if abs(r["turn"] - turn) > 1:
                failures.append("%s: in turn %.0f us, want %d" % (what, r["turn"], turn))
            if not lo <= r["ratio"] <= hi:
                failures.append("%s: two / one ahead %.3f outside %.2f-%.2f" % (what, r["ratio"], lo, hi))
            if not r["two"] <= r["one"] * 1.01 < r["turn"]:
                failures.append("%s: times turn %.0f, one %.0f, two %.0f out of order" % (what, r["turn"], r["one"], r["two"]))
    # Without a rail to wait for, every order is the node work and its barriers.
    rows = table(root, "--chunks", "8", "--round-us", "0.5", "--mode", "fifo")
    r = rows.get("fifo")
    if r is None or not (r["two"] <= r["turn"] <= r["two"] + 40):
        failures.append("no rail: %s" % r)
    return report("test_pipeline_model", failures)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
