#!/usr/bin/env python3
"""scripts/overlap-table.py on recorded sweeps of scripts/gpu-check.sh rail (tests/scripts/fixtures,
the lines the script reads): the hidden share's medians over six rounds and the A/B ratios of
--baseline for the direct AllReduce one and two chunks ahead (rail-sweep-ahead-*.txt), what it
prints without a baseline column, and the A/B table of a sweep with no in-turn runs
(ReduceScatter's two forms, rail-sweep-rs-ag.txt), with CTA 0's work in device memory and through
its net buffers.

    python3 tests/scripts/test_overlap_table.py REPO_ROOT
"""
import re
import sys

from script_test import report, run_script


def run(root, *args):
    files = ["%s/tests/scripts/fixtures/rail-sweep-ahead-%s.txt" % (root, c) for c in ("a", "b")]
    return run_script(root, "overlap-table.py", *(files + list(args)))


def row(out, pattern):
    hits = [l.split() for l in out.splitlines() if re.match(pattern, l)]
    if len(hits) != 1:
        raise AssertionError("%d lines match %r in:\n%s" % (len(hits), pattern, out))
    return hits[0]


def main(root):
    failures = []

    def check(what, got, want):
        if got != want:
            failures.append("%s: %r, want %r" % (what, got, want))

    out = run(root, "--min-bytes", "16777216", "--baseline", "a1")
    # The summary: layout, rail, bytes, rounds, median, min, max, rounds >= 80%.
    s = row(out, r"^4:2:1 +direct\+a2 +16777216 +6 ")
    check("2 x 2 two ahead, hidden", s[4:8], ["102%", "95%", "126%", "6"])
    s = row(out, r"^8:2:1 +direct\+a2 +16777216 +6 ")
    check("4 x 2 two ahead, hidden", s[4:8], ["63%", "38%", "77%", "0"])
    # The A/B table: layout, bytes, mode, rail, rounds, median, ratio, busy, wr, wn.
    s = row(out, r"^4:2:1 +16777216 +pipelined +direct\+a2 ")
    check("2 x 2 pipelined, two ahead against one", s[4:7], ["6", "3976", "0.837"])
    s = row(out, r"^8:2:1 +16777216 +pipelined +direct\+a2 ")
    check("4 x 2 pipelined, two ahead against one", s[4:10], ["6", "9079", "0.954", "3445", "4652", "826"])
    s = row(out, r"^8:2:1 +16777216 +pipelined +direct\+a1 ")
    check("the baseline against itself", s[6], "1.000")
    if re.search(r"^\S+ +4194304 ", out, re.M):
        failures.append("--min-bytes 16777216 let a 4 MiB row through")

    out = run(root, "--baseline", "a1")
    s = row(out, r"^8:2:1 +4194304 +pipelined +direct\+a2 ")
    check("4 x 2 pipelined at 4 MiB, two ahead against one", s[4:7], ["3", "2664", "1.107"])

    # ReduceScatter and AllGather pipelined only, the own piece kept (rs1, ag1)
    # or through the net buffers (rs0, ag0). Columns: ..., ratio, busy, wr, wn, loc, net.
    out = run_script(root, "overlap-table.py", "%s/tests/scripts/fixtures/rail-sweep-rs-ag.txt" % root,
                     "--baseline", "rs0")
    if "no (in turn, pipelined) pairs" not in out:
        failures.append("a sweep without in-turn runs printed phase rows")
    s = row(out, r"^4:2:1 +16777216 +pipelined +direct\+rs1 ")
    check("2 x 2 ReduceScatter, the own piece kept against through P", [s[4], s[5], s[6], s[10], s[11]],
          ["3", "2229", "0.881", "816", "749"])
    s = row(out, r"^4:2:1 +16777216 +pipelined +direct\+rs0 ")
    check("2 x 2 ReduceScatter through P", [s[6], s[10], s[11]], ["1.000", "603", "1478"])

    out = run(root, "--baseline", "nosuchvariant")
    if re.search(r"direct\+a[12] +\d+ +\d+ +[0-9.]+ ", out.split("# --baseline")[1]):
        failures.append("a baseline no column has printed rows")

    return report("test_overlap_table", failures)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
