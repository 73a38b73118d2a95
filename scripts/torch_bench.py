#!/usr/bin/env python3
"""torch.distributed collectives, NCCL against LD_PRELOAD=libmkernel.so, in one run (docs/PERFORMANCE.md).

  python3 scripts/torch_bench.py --lib build/lib/libmkernel.so [--ranks 2] [--colls all_reduce,all_gather]
                                 [--min-bytes 8] [--max-bytes 256M] [--iters 50] [--csv F] [--plot F.png]

Starts --ranks worker processes twice (one GPU each, cuda:rank): once on PyTorch's NCCL, once
with mkernel preloaded, which then runs the collectives as process ranks (staged through CUDA
IPC). For each size: warm-up, then --trials timings of --iters back-to-back collectives between
CUDA events on rank 0's stream; the median per-collective time is reported, with nccl-tests'
busbw (all_reduce: 2(n-1)/n * bytes / t; all_gather, reduce_scatter: (n-1)/n * total bytes / t).
Prints a progress line per size and a table; with mkernel it checks that mkernel ran the
collectives (mkernelGetStats) and the first result of every size against NCCL's definition.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

try:
    import mkernel  # the installed package (pip install .)
except ImportError:  # a source tree: python/mkernel
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import mkernel

HERE = os.path.abspath(__file__)


def parse_bytes(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def mk_stats():
    """mkernelGetStats() (python/mkernel) when the library is preloaded, else None."""
    return mkernel.stats(load=False)


def sizes(lo, hi):
    out, b = [], lo
    while b <= hi:
        out.append(b)
        b *= 4 if b >= (1 << 10) else 8  # 8, 64, 512, 1K, 4K, ... (x4 from 1 KiB on)
    return out


def worker(args):
    import torch
    import torch.distributed as dist
    rank, world = args.rank, args.world
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world,
                            device_id=dev)
    stream = torch.cuda.current_stream()
    for coll in args.colls.split(","):
        for nbytes in sizes(args.min_bytes, args.max_bytes):
            n = max(1, nbytes // 4)  # float32 elements per rank
            if coll == "reduce_scatter":
                n = max(world, n // world * world)
            x = torch.full((n,), float(rank + 1), dtype=torch.float32, device=dev)
            if coll == "all_reduce":
                y = x.clone()
                run = lambda: dist.all_reduce(y)
            elif coll == "all_gather":
                y = torch.empty(n * world, dtype=torch.float32, device=dev)
                run = lambda: dist.all_gather_into_tensor(y, x)
            else:
                y = torch.empty(n // world, dtype=torch.float32, device=dev)
                run = lambda: dist.reduce_scatter_tensor(y, x)
            run()
            torch.cuda.synchronize()
            # Correctness of the first call (inputs rank+1: exact sums).
            total = world * (world + 1) / 2
            if coll == "all_reduce":
                good = bool((y == total).all().item())
            elif coll == "all_gather":
                want = torch.arange(1, world + 1, dtype=torch.float32, device=dev).repeat_interleave(n)
                good = bool((y == want).all().item())
            else:
                good = bool((y == total).all().item())
            iters = args.iters if nbytes <= (1 << 24) else max(5, args.iters // 5)
            for _ in range(args.warmup):
                if coll == "all_reduce":
                    y.copy_(x)
                run()
            times = []
            for _ in range(args.trials):
                dist.barrier()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(stream)
                for _ in range(iters):
                    run()
                end.record(stream)
                end.synchronize()
                times.append(start.elapsed_time(end) * 1000.0 / iters)  # us per collective
            t = statistics.median(times)
            moved = nbytes if coll == "all_reduce" else n * 4 * (world if coll == "all_gather" else 1)
            factor = 2 * (world - 1) / world if coll == "all_reduce" else (world - 1) / world
            busbw = factor * moved / (t * 1e-6) / 1e9 if t > 0 else 0.0
            if rank == 0:
                print("ROW " + json.dumps({"coll": coll, "bytes": n * 4, "us": t, "busbw": busbw, "ok": good}),
                      flush=True)
    stats = mk_stats()
    if rank == 0:
        print("STATS " + json.dumps(stats), flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_side(args, preload, label):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    if preload:
        env["LD_PRELOAD"] = os.path.abspath(args.lib)
    port = free_port()
    common = ["--worker", "--world", str(args.ranks), "--port", str(port), "--colls", args.colls,
              "--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes), "--iters", str(args.iters),
              "--warmup", str(args.warmup), "--trials", str(args.trials)]
    procs = [subprocess.Popen([sys.executable, HERE, "--rank", str(r)] + common, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(args.ranks)]
    rows, stats, log = [], None, []
    t0 = time.time()
    for line in procs[0].stdout:
        log.append(line)
        if line.startswith("ROW "):
            row = json.loads(line[4:])
            rows.append(row)
            print(f"[{label}] {row['coll']:>14} {row['bytes']:>11} B  {row['us']:10.2f} us  {row['busbw']:8.2f} GB/s"
                  f"{'' if row['ok'] else '  WRONG'}  ({time.time() - t0:.0f} s)", flush=True)
        elif line.startswith("STATS "):
            stats = json.loads(line[6:])
    ok = True
    for p in procs:
        try:
            rest, _ = p.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rest, _ = p.communicate()
            ok = False
        if p is not procs[0] and p.returncode != 0:
            log.append(rest)
        ok = ok and p.returncode == 0
    if not ok:
        print(f"[{label}] FAILED; rank 0's log:\n" + "".join(log[-40:]), flush=True)
    return ok, rows, stats


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default="build/lib/libmkernel.so")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--colls", default="all_reduce,all_gather,reduce_scatter")
    ap.add_argument("--min-bytes", type=parse_bytes, default=8)
    ap.add_argument("--max-bytes", type=parse_bytes, default=parse_bytes("256M"))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--csv", default="")
    ap.add_argument("--plot", default="")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if not os.path.exists(args.lib):
        sys.exit(f"torch_bench: {args.lib} does not exist (build first)")
    ok_n, nccl, _ = run_side(args, False, "nccl")
    ok_m, mk, stats = run_side(args, True, "mkernel")
    ran = sum((stats or {}).get("kernelOps", [0]))
    fwd = sum((stats or {}).get("forwardedOps", [0]))
    print(f"\ntorch.distributed, {args.ranks} processes (one GPU each), float32, median of {args.trials} trials")
    print(f"mkernel rank 0: {ran} collectives in mkernel, {fwd} forwarded to NCCL")
    hdr = f"| {'collective':<14} | {'bytes':>11} | {'NCCL us':>9} | {'mkernel us':>10} | {'speedup':>7} | " \
          f"{'NCCL GB/s':>9} | {'mk GB/s':>8} | ok |"
    print(hdr)
    print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
    bad = 0
    key = lambda r: (r["coll"], r["bytes"])
    nmap = {key(r): r for r in nccl}
    lines = ["coll,bytes,nccl_us,mkernel_us,speedup,nccl_busbw,mkernel_busbw,nccl_ok,mkernel_ok"]
    for m in mk:
        n = nmap.get(key(m))
        sp = n["us"] / m["us"] if n and m["us"] > 0 else float("nan")
        good = m["ok"] and (n is None or n["ok"])
        bad += 0 if good else 1
        print(f"| {m['coll']:<14} | {m['bytes']:>11} | {n['us'] if n else float('nan'):9.2f} | {m['us']:10.2f} | "
              f"{sp:7.2f} | {n['busbw'] if n else float('nan'):9.2f} | {m['busbw']:8.2f} | {'y' if good else 'NO'} |")
        lines.append(f"{m['coll']},{m['bytes']},{n['us'] if n else ''},{m['us']},{sp},{n['busbw'] if n else ''},"
                     f"{m['busbw']},{n['ok'] if n else ''},{m['ok']}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("\n".join(lines) + "\n")
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            colls = sorted({r["coll"] for r in mk})
            fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
            for c in colls:
                for rows, style, name in ((nccl, "--", "NCCL"), (mk, "-", "mkernel")):
                    rs = [r for r in rows if r["coll"] == c]
                    axes[0].plot([r["bytes"] for r in rs], [r["us"] for r in rs], style, marker=".", label=f"{c} {name}")
                    axes[1].plot([r["bytes"] for r in rs], [r["busbw"] for r in rs], style, marker=".", label=f"{c} {name}")
            for ax, yl in ((axes[0], "time per collective (us)"), (axes[1], "busbw (GB/s)")):
                ax.set_xscale("log", base=2)
                ax.set_xlabel("bytes per rank")
                ax.set_ylabel(yl)
                ax.grid(True, alpha=0.3)
            axes[0].set_yscale("log")
            axes[1].legend(fontsize=7)
            fig.suptitle(f"torch.distributed, {args.ranks} processes: NCCL vs mkernel (LD_PRELOAD)")
            fig.tight_layout()
            fig.savefig(args.plot, dpi=110)
        except ImportError:
            print("torch_bench: no matplotlib, no plot")
    ok = ok_n and ok_m and bad == 0 and ran > 0
    print(f"torch_bench: {'passed' if ok else 'FAILED'} ({bad} wrong rows)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
