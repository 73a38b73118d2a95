#!/usr/bin/env python3
"""Issue 6's overlap measure from a sweep of mkernel-collbench on emulated nodes, pipelined
(MKERNEL_HIER_OVERLAP=1) and in turn (=0), in the same run.

    python3 scripts/overlap-table.py rail-sweep.txt [more files] [--min-bytes N] [--plot OUT.png]
                                     [--baseline VARIANT]

Input: the lines scripts/gpu-check.sh rail (step 3) writes, each prefixed "LAYOUT/RAIL/ovO/rROUND: ":
collbench's table rows ("memop RANKS BYTES EAGER_MED ..."), its "# hierarchical, R ranks, B B:
eager mean T us" lines (pipelined runs), and from the in-turn runs its "# phases in turn, R ranks,
B B: eager mean T us; node X us, rail Y us per op (...)" lines: CTA 0 of rank 0 timing each
AllReduce chunk's phases with %globaltimer (collectives/algo/hier_staged.h, "Phase times"). Both
kinds of line end "; waits: rail W us, node V us per op": CTA 0's time waiting for
its rail transfers and at node barriers (DeviceState::hierWait), printed as extra columns. In CTA
roles (layouts "R:G:lanes:W,R") CTA 0 is lane 0's sender: it has no node barriers; its waits
for the workers' and reducers' counters follow the node wait as ", role W us", taken out of busy.
The lines also end
"; work: copy C / CN net, reduce R / RN net, post P us per op" (DeviceState::hierBusy): CTA 0's own
work by kind, shown for the in-turn run as loc_t (C + R), net_t (CN + RN) and post_t.

Per (layout, rail, round, bytes): t_turn and t_pipe (the eager means over the same loop the phase
times are summed over, us; the medians of the table rows where a run printed no mean), the node and rail phases of the in-turn run (us per op), and
    covered = (node + rail) / t_turn     how much of the in-turn time the two phases account for
    hidden  = (t_turn - t_pipe) / min(node, rail)
              the share of the shorter phase that the pipeline hides (the goal: at least 80%).
With several lanes (MKERNEL_HIER_CTAS > 1) the lanes run at once even in turn, so t_turn is not
node + rail; the measure is meant for one lane (layout "R:G:1"). Exit status 0; a row without
both runs is left out. --plot OUT.png also draws hidden against the size, a line per (layout,
rail) through the mean of the rounds, each round a dot, and the goal's 80% (needs matplotlib);
--min-bytes leaves out the smaller sizes (their phases are a few us, the noise's order).

Several files (several device calls' sweeps) are read as one: each file's rounds are numbered on
after the previous file's. A last table gives, per (layout, rail, bytes), the
rounds, the median of hidden over them, its range and how many rounds reached the goal's 80%.

--baseline VARIANT adds an A/B table for sweeps with RC_VARIANTS (rail columns
"RAIL+NAME"): per (layout, bytes, pipelined or in turn) and variant, the median over the rounds of
its eager medians, its ratio to the median of "RAIL+VARIANT" in the same file set, and, where the
runs printed CTA 0's waits, the medians over the rounds of its busy time, rail waits and
node-barrier waits (us per op, from the eager means), and of its own work in
device memory (loc: copies + reductions) and through its net buffers (net). The A/B table needs
no phase times, so it is printed for sweeps without an in-turn run too (e.g. ReduceScatter and
AllGather variants, "--coll=reducescatter", whose chunks collbench does not time by phase).
"""
import re
import sys

ROW = re.compile(r"^(\S+)/(\S+)/ov([01])/r(\d+): +memop +(\d+) +(\d+) +([0-9.]+)")
MEAN = re.compile(r"^(\S+)/(\S+)/ov([01])/r(\d+): # (?:hierarchical|phases in turn), \d+ ranks, (\d+) B: eager mean ([0-9.]+) us")
WAITS = re.compile(r"^(\S+)/(\S+)/ov([01])/r(\d+): # (?:hierarchical|phases in turn), \d+ ranks, (\d+) B: .*; "
                   r"waits: rail ([0-9.]+) us, node ([0-9.]+) us(?:, role ([0-9.]+) us)?")
WORK = re.compile(r"^(\S+)/(\S+)/ov([01])/r(\d+): # (?:hierarchical|phases in turn), \d+ ranks, (\d+) B: .*; "
                  r"work: copy ([0-9.]+) / ([0-9.]+) net, reduce ([0-9.]+) / ([0-9.]+) net, post ([0-9.]+) us")
PHASE = re.compile(r"^(\S+)/(\S+)/ov0/r(\d+): # phases in turn, (\d+) ranks, (\d+) B: (?:eager mean [0-9.]+ us; )?"
                   r"node ([0-9.]+) us, rail ([0-9.]+) us")


def plot(rows, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("overlap-table: matplotlib is not installed; no plot", file=sys.stderr)
        return 2
    series = {}
    for lay, rail, _, b, *_, hid, _ in rows:
        series.setdefault((lay, rail), {}).setdefault(b, []).append(100 * hid)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, ((lay, rail), pts) in enumerate(sorted(series.items())):
        xs = sorted(pts)
        color = "C%d" % i
        ax.plot(xs, [sum(pts[b]) / len(pts[b]) for b in xs], marker="o", color=color,
                label="%s, %s" % (lay, rail))
        for b in xs:
            ax.scatter([b] * len(pts[b]), pts[b], color=color, s=10, alpha=0.5)
    ax.axhline(80, color="grey", linestyle="--", linewidth=1, label="goal: 80%")
    ax.axhline(0, color="grey", linewidth=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("hidden share of the shorter phase, %")
    ax.set_title("the pipeline's overlap, timed by phase (in turn vs pipelined, same run)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("overlap-table: wrote %s" % out)
    return 0


def main(paths, out=None, minBytes=0, baseline=None):
    med = {}    # (layout, rail, round, bytes, ov) -> eager median
    mean = {}   # the same -> eager mean
    phase = {}  # (layout, rail, round, bytes) -> (node, rail)
    waits = {}  # (layout, rail, round, bytes, ov) -> (rail wait, node-barrier wait), CTA 0
    work = {}   # the same -> (copy, copy net, reduce, reduce net, post), CTA 0
    offset = 0  # rounds of the files before this one
    for path in paths:
        last = 0
        with open(path) as f:
            for line in f:
                # Each file's rounds after the previous file's: rewrite "/rN: " as "/r(offset + N): ".
                r = re.match(r"^(\S+/\S+/ov[01]/r)(\d+)(: .*)$", line, re.S)
                if r:
                    last = max(last, int(r.group(2)))
                    line = r.group(1) + str(offset + int(r.group(2))) + r.group(3)
                m = ROW.match(line)
                if m:
                    lay, rail, ov, rnd, _, b, t = m.groups()
                    med[(lay, rail, int(rnd), int(b), int(ov))] = float(t)
                    continue
                m = MEAN.match(line)
                if m:
                    lay, rail, ov, rnd, b, t = m.groups()
                    mean[(lay, rail, int(rnd), int(b), int(ov))] = float(t)
                m = WAITS.match(line)
                if m:
                    lay, rail, ov, rnd, b, wr, wn, wo = m.groups()
                    waits[(lay, rail, int(rnd), int(b), int(ov))] = (float(wr), float(wn), float(wo or 0))
                m = WORK.match(line)
                if m:
                    lay, rail, ov, rnd, b = m.groups()[:5]
                    work[(lay, rail, int(rnd), int(b), int(ov))] = tuple(float(v) for v in m.groups()[5:])
                m = PHASE.match(line)
                if m:
                    lay, rail, rnd, _, b, node, rl = m.groups()
                    phase[(lay, rail, int(rnd), int(b))] = (float(node), float(rl))
        offset += last
    rows = []
    for (lay, rail, rnd, b), (node, rl) in sorted(phase.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][3], kv[0][2])):
        k0, k1 = (lay, rail, rnd, b, 0), (lay, rail, rnd, b, 1)
        means = k0 in mean and k1 in mean
        t0 = mean[k0] if means else med.get(k0)
        t1 = mean[k1] if means else med.get(k1)
        if t0 is None or t1 is None or b < minBytes:
            continue
        short = min(node, rl)
        hidden = (t0 - t1) / short if short > 0 else float("nan")
        rows.append((lay, rail, rnd, b, t0, t1, node, rl, (node + rl) / t0, hidden, "mean" if means else "median"))
    if not rows:
        print("overlap-table: no (in turn, pipelined) pairs with phase times")
        if baseline:
            ab(med, mean, waits, work, baseline, minBytes)
        return 0
    print("# hidden = (t_turn - t_pipe) / min(node, rail); covered = (node + rail) / t_turn; us per op")
    haveWaits = any((r[0], r[1], r[2], r[3], ov) in waits for r in rows for ov in (0, 1))
    if haveWaits:
        print("# CTA 0's waits : wr = for the rail, wn = at node barriers; busy = t - wr - wn"
              " (- its waits for the other roles in CTA roles), its own copies, reductions and"
              " posts; _t in turn, _p pipelined")
    head = "%-12s %-13s %5s %10s %10s %10s %10s %10s %8s %8s %7s" % (
        "layout", "rail", "round", "bytes", "t_turn", "t_pipe", "node", "rail_ph", "covered", "hidden", "t_is")
    haveWork = any((r[0], r[1], r[2], r[3], 0) in work for r in rows)
    if haveWork:
        print("# CTA 0's own work in turn : loc_t = copies and reductions in device memory,"
              " net_t = those through its net buffers, post_t = its posts to the proxy")
    if haveWaits:
        head += " %9s %9s %9s %9s %9s %9s" % ("busy_t", "busy_p", "wr_t", "wr_p", "wn_t", "wn_p")
    if haveWork:
        head += " %9s %9s %9s" % ("loc_t", "net_t", "post_t")
    print(head)
    for lay, rail, rnd, b, t0, t1, node, rl, cov, hid, kind in rows:
        line = "%-12s %-13s %5d %10d %10.1f %10.1f %10.1f %10.1f %7.0f%% %7.0f%% %7s" % (
            lay, rail, rnd, b, t0, t1, node, rl, 100 * cov, 100 * hid, kind)
        if haveWaits:
            w0, w1 = waits.get((lay, rail, rnd, b, 0)), waits.get((lay, rail, rnd, b, 1))
            cell = lambda v: "%9.1f" % v if v is not None else "%9s" % "-"
            line += " " + " ".join(cell(v) for v in (
                t0 - sum(w0) if w0 else None, t1 - sum(w1) if w1 else None,
                w0[0] if w0 else None, w1[0] if w1 else None, w0[1] if w0 else None, w1[1] if w1 else None))
        if haveWork:
            k = work.get((lay, rail, rnd, b, 0))
            line += " " + " ".join("%9.1f" % v if k else "%9s" % "-" for v in (
                (k[0] + k[2], k[1] + k[3], k[4]) if k else (0, 0, 0)))
        print(line)
    summary(rows)
    if baseline:
        ab(med, mean, waits, work, baseline, minBytes)
    if out:
        return plot(rows, out)
    return 0


def median(v):
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def ab(med, mean, waits, work, base, minBytes):
    """--baseline: each variant's median eager time over the rounds, against variant `base`'s."""
    groups = {}  # (layout, bytes, ov) -> rail column -> {round: eager median}
    for (lay, rail, rnd, b, ov), t in med.items():
        if b >= minBytes:
            groups.setdefault((lay, b, ov), {}).setdefault(rail, {})[rnd] = t
    print("# --baseline %s: the median over the rounds of each variant's eager medians (us), its ratio to %s's;"
          " CTA 0's busy, rail and node-barrier waits, and its own work in device memory (loc) and through its"
          " net buffers (net), medians over the rounds (us per op)" % (base, base))
    print("%-12s %10s %-9s %-13s %6s %10s %7s %9s %9s %9s %9s %9s" % (
        "layout", "bytes", "mode", "rail", "rounds", "median", "ratio", "busy", "wr", "wn", "loc", "net"))
    for (lay, b, ov), cols in sorted(groups.items()):
        for rail in sorted(cols):
            ref = cols.get(rail.split("+", 1)[0] + "+" + base)
            if ref is None:
                continue
            m, mr = median(cols[rail].values()), median(ref.values())
            busy, wr, wn, loc, net = [], [], [], [], []
            for rnd in cols[rail]:
                k = (lay, rail, rnd, b, ov)
                if k in waits and k in mean:
                    w = waits[k]
                    busy.append(mean[k] - sum(w))
                    wr.append(w[0])
                    wn.append(w[1])
                if k in work:
                    c, cn, r, rn, _ = work[k]
                    loc.append(c + r)
                    net.append(cn + rn)
            cell = lambda v: "%9.0f" % median(v) if v else "%9s" % "-"
            print("%-12s %10d %-9s %-13s %6d %10.0f %7.3f %s %s %s %s %s" % (
                lay, b, "pipelined" if ov else "in turn", rail, len(cols[rail]), m, m / mr if mr > 0 else float("nan"),
                cell(busy), cell(wr), cell(wn), cell(loc), cell(net)))


def summary(rows):
    """Per (layout, rail, bytes): the rounds, the median of hidden, its range, the rounds >= 80%."""
    groups = {}
    for lay, rail, _, b, _, _, _, _, _, hid, _ in rows:
        if hid == hid:  # not nan
            groups.setdefault((lay, rail, b), []).append(hid)
    if not groups:
        return
    print("# over the rounds: the median of hidden, its range, and the rounds at or above the goal's 80%")
    print("%-12s %-13s %10s %6s %8s %8s %8s %6s" % ("layout", "rail", "bytes", "rounds", "median", "min", "max", ">=80%"))
    for (lay, rail, b), hs in sorted(groups.items()):
        s = sorted(hs)
        print("%-12s %-13s %10d %6d %7.0f%% %7.0f%% %7.0f%% %6d" % (
            lay, rail, b, len(s), 100 * median(s), 100 * s[0], 100 * s[-1], sum(1 for h in s if h >= 0.8)))


def option(args, name, convert):
    """Takes "--name VALUE" out of args: convert(VALUE), None when absent; exits with the usage
    when the value is missing."""
    if name not in args:
        return None
    k = args.index(name)
    if k + 1 >= len(args):
        print(__doc__)
        sys.exit(2)
    value = convert(args[k + 1])
    del args[k:k + 2]
    return value


if __name__ == "__main__":
    args = sys.argv[1:]
    out = option(args, "--plot", str)
    minBytes = option(args, "--min-bytes", int) or 0
    baseline = option(args, "--baseline", str)
    if not args:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(args, out, minBytes, baseline))
