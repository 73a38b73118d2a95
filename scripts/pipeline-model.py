#!/usr/bin/env python3
"""A time-stepped model of the hierarchical AllReduce's chunk schedule (collectives/algo/hier_staged.h,
hierAllReduce), for one question: how much does the order of a CTA's steps cost when the rail,
not the node, is the bound? It models the schedule only: no bytes, no GPU.

    python3 scripts/pipeline-model.py [--nodes 4] [--per-node 2] [--chunks 16] [--round-us 220]
                                      [--push 40 --red1 50 --red 60 --p3 40 --cp 30]
                                      [--mode both|shared|fifo] [--jitter 0] [--seeds 1]

Ranks are nodes x per-node, each one CTA (one lane). Per chunk i a CTA runs
    A(i)  push (its part of the chunk into every local inbox), node barrier, red1 (the node
          reduction), post round 0
    B(i)  wait for round 0, red (the reduction over the nodes), post round 1
    C(i)  wait for round 1, p3 (the copies to the node), node barrier, cp (the copy out)
with the work in us (--push ... --cp; each scaled by a uniform factor in 1 +- jitter, drawn per
rank, step and chunk). A round of rank r is ready once every rank of its rail (the same local
index on every node) has posted it; r's proxy then serves it for --round-us us: "shared" splits the
proxy's rate among the ready rounds (processor sharing, like one host's loopback TCP), "fifo" serves
them one at a time in the order posted. The orders:
    turn   A(i), B(i), C(i) for each i (MKERNEL_HIER_OVERLAP=0)
    one    A(0); then B(i), A(i + 1), C(i)          (MKERNEL_HIER_AHEAD=1)
    two    A(0), A(1); then B(i), A(i + 2), C(i)    (MKERNEL_HIER_AHEAD=2, the default)
It prints each order's time and the hidden share (t_turn - t_pipe) / min(node, rail), where the
node phase is chunks x (push + red1 + p3 + cp) and the rail phase the rest of t_turn, as
scripts/overlap-table.py computes it from the in-turn phase marks.

The defaults are per-chunk times of 4 x 2 emulated nodes at 16 MiB (docs/results/pipeline.csv
holds such runs, with CTA 0's busy time and rail waits in turn): CTA 0's own work in turn, about 3,450 us over 16 one-MiB chunks (215
us a chunk, split here by phase), and its rail waits in turn, about 7,000 us over 32 rounds (220
us a round; 2 x 2: about 3,370 us, so --nodes 2 --round-us 105). docs/MODEL.md, "The schedule
model", gives what it predicts for both layouts at 4 and 16 chunks.
"""
import argparse
import random
import statistics


def order(kind, n):
    A = lambda i: [("push", i), ("bar", ("a", i)), ("red1", i), ("post", (0, i))]
    B = lambda i: [("wait", (0, i)), ("red", i), ("post", (1, i))]
    C = lambda i: [("wait", (1, i)), ("p3", i), ("bar", ("c", i)), ("cp", i)]
    s = []
    if kind == "turn":
        for i in range(n):
            s += A(i) + B(i) + C(i)
    elif kind == "one":
        s = A(0)
        for i in range(n):
            s += B(i) + (A(i + 1) if i + 1 < n else []) + C(i)
    elif kind == "two":
        s = A(0) + (A(1) if n > 1 else [])
        for i in range(n):
            s += B(i) + (A(i + 2) if i + 2 < n else []) + C(i)
    else:
        raise ValueError(kind)
    return s


def simulate(kind, a, mode, seed, dt=1.0):
    rnd = random.Random(seed)
    N, G, n = a.nodes, a.per_node, a.chunks
    R = N * G
    work = {"push": a.push, "red1": a.red1, "red": a.red, "p3": a.p3, "cp": a.cp}
    dur = {(r, op, i): w * rnd.uniform(1 - a.jitter, 1 + a.jitter)
           for r in range(R) for op, w in work.items() for i in range(n)}
    steps = order(kind, n)
    pc, busy = [0] * R, [0.0] * R
    posted, arrived, left, done = {}, {}, {}, set()
    queue = {r: [] for r in range(R)}
    t = 0.0
    while True:
        for r in range(R):
            node, j = divmod(r, G)
            while pc[r] < len(steps) and busy[r] <= t:
                op, x = steps[pc[r]]
                if op in work:
                    busy[r] = t + dur[(r, op, x)]
                elif op == "post":
                    posted[(r, x)] = t
                    left[(r, x)] = a.round_us
                    queue[r].append(x)
                elif op == "bar":
                    arrived.setdefault((r, x), t)
                    if not all((node * G + q, x) in arrived for q in range(G)):
                        break
                elif (r, x) not in done:  # wait
                    break
                pc[r] += 1
        if all(p >= len(steps) for p in pc) and all(b <= t for b in busy):
            return t
        for r in range(R):
            j = r % G
            ready = [x for x in queue[r] if all((m * G + j, x) in posted for m in range(N))]
            if not ready:
                continue
            if mode == "fifo":
                ready = ready[:1]
            share = dt / len(ready)
            for x in ready:
                left[(r, x)] -= share
                if left[(r, x)] <= 1e-9:
                    done.add((r, x))
                    queue[r].remove(x)  # served: out of the proxy's queue
        t += dt
        if t > 1e8:
            raise RuntimeError("the schedule %s did not finish (a deadlock in the model)" % kind)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--per-node", type=int, default=2)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--round-us", type=float, default=220.0)
    for k, v in (("push", 40.0), ("red1", 50.0), ("red", 60.0), ("p3", 40.0), ("cp", 30.0)):
        p.add_argument("--" + k, type=float, default=v)
    p.add_argument("--mode", choices=("both", "shared", "fifo"), default="both")
    p.add_argument("--jitter", type=float, default=0.0)
    p.add_argument("--seeds", type=int, default=1)
    a = p.parse_args()
    node = a.chunks * (a.push + a.red1 + a.p3 + a.cp)
    print("%d nodes x %d, %d chunks, a rail round %.0f us; us per AllReduce (median over %d seed(s))"
          % (a.nodes, a.per_node, a.chunks, a.round_us, a.seeds))
    print("%-7s %9s %9s %9s %9s %8s %8s %9s" % ("rail", "turn", "one", "two", "two/one", "hid one", "hid two", "node"))
    for mode in (("shared", "fifo") if a.mode == "both" else (a.mode,)):
        t = {k: statistics.median(simulate(k, a, mode, s) for s in range(a.seeds)) for k in ("turn", "one", "two")}
        short = min(node, t["turn"] - node)
        print("%-7s %9.0f %9.0f %9.0f %9.3f %7.0f%% %7.0f%% %9.0f" % (
            mode, t["turn"], t["one"], t["two"], t["two"] / t["one"], 100 * (t["turn"] - t["one"]) / short,
            100 * (t["turn"] - t["two"]) / short, node))


if __name__ == "__main__":
    main()
