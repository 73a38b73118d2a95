#!/usr/bin/env python3
"""PyTorch through mkernel's LD_PRELOAD NCCL shim (docs/SHIM.md, "PyTorch check").

Runs on a GPU machine, with a Python whose `import torch` works:

  python3 scripts/torch_check.py --lib build/lib/libmkernel.so [--ranks 1,2,4] [--gpus N] [--mps]
                                 [--ranks-per-node K] [--nccl PATH/libnccl.so.2]

Each case starts fresh worker processes (this script with --worker) with LD_PRELOAD=<lib>:
  ranks<=gpus  one rank per GPU (cuda:rank), the real NCCL beside the shim; the same workers also
           run without the shim, and the results must be bit-identical to NCCL's (the inputs
           are exact under any reduction order). --gpus defaults to 1: only ranks=1 is real.
  ranks>gpus  MKERNEL_EMULATE=1: that many processes share cuda:0 (run them under CUDA MPS with
           --mps, or two spinning kernels of two processes do not make progress together) and
           the results are checked against a float64 reference computed on the host.
--ranks-per-node K: the emulated cases run as nodes of K ranks (MKERNEL_RANKS_PER_NODE=K, proxies
over TCP on loopback): PyTorch through the hierarchical path, e.g. --ranks 4 --ranks-per-node 2
--mps is "PyTorch emulated 2x2".
--nccl: every worker, with the shim and without, preloads this libnccl.so.2 (after the shim's
library), so that PyTorch and the shim use that NCCL build instead of PyTorch's own (the loader
takes an already loaded soname for PyTorch's dependency); each case's line names the version the
workers report.
With more than one rank the workers are processes, so mkernel runs them as staged process ranks
(CUDA IPC, docs/KERNEL.md). Every case also checks that mkernel ran collectives (kernelOps > 0)
and a large all_reduce / all_gather / broadcast (BIG elements: many staging chunks) on the GPU.
Collectives: all_reduce (sum, avg, max), all_gather_into_tensor, reduce_scatter_tensor,
broadcast, in float32 and bfloat16. Workers report mkernelGetStats' counters (which path ran), read
with the mkernel module (python/mkernel: the struct as mkernel_api.h declares it).
Exit status 0 when every case passed. A JSON summary goes to $OUT/torch_check.json when OUT is set.
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

try:
    import mkernel  # the installed package (pip install .)
except ImportError:  # a source tree: python/mkernel
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import mkernel

HERE = os.path.abspath(__file__)
OPS = ["all_reduce_sum", "all_reduce_avg", "all_reduce_max", "all_gather", "reduce_scatter", "broadcast"]
DTYPES = ["float32", "bfloat16"]
COUNT = 1 << 12  # elements per rank (divisible by every rank count used)
BIG = (1 << 22) + 37  # elements of the large checks (16 MiB of float32, not a multiple of anything)
BIG_OPS = ["all_reduce_sum", "all_gather", "broadcast"]


def read_stats():
    """mkernelGetStats() of this worker when the library is preloaded, else None."""
    return mkernel.stats(load=False)


def rank_input(torch, rank, dtype, n):
    # Small integers and halves: exact in bf16 and under every reduction order.
    base = torch.arange(n, dtype=torch.float64)
    vals = ((base * 7 + rank * 13) % 17 - 8) * 0.5
    return vals.to(getattr(torch, dtype))


def worker(args):
    import torch
    import torch.distributed as dist
    rank, world = args.rank, args.world
    torch.cuda.set_device(0 if args.shared_gpu else rank % max(1, torch.cuda.device_count()))
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    out = {"rank": rank, "nccl_version": ".".join(map(str, torch.cuda.nccl.version())), "results": {}}
    dev = torch.device("cuda", torch.cuda.current_device())
    for dtype in DTYPES:
        for op in OPS:
            x = rank_input(torch, rank, dtype, COUNT).to(dev)
            if op.startswith("all_reduce"):
                red = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX}[op.split("_")[-1]]
                y = x.clone()
                dist.all_reduce(y, op=red)
            elif op == "all_gather":
                y = torch.empty(COUNT * world, dtype=x.dtype, device=dev)
                dist.all_gather_into_tensor(y, x)
            elif op == "reduce_scatter":
                y = torch.empty(COUNT // world, dtype=x.dtype, device=dev)
                dist.reduce_scatter_tensor(y, x)
            else:
                y = x.clone()
                dist.broadcast(y, src=world - 1)
            torch.cuda.synchronize()
            out["results"][f"{op}/{dtype}"] = y.double().cpu().tolist() if args.full else None
            out["results"][f"{op}/{dtype}#sum"] = float(y.double().sum().item())
            out["results"][f"{op}/{dtype}#bits"] = int(y.view(torch.int16 if dtype == "bfloat16" else torch.int32)
                                                        .long().sum().item())
    # Large messages, checked on the GPU against a float64 reference: many staging chunks per CTA.
    for op in BIG_OPS:
        xs = [rank_input(torch, r, "float32", BIG).to(dev) for r in range(world)]
        x = xs[rank]
        if op == "all_reduce_sum":
            y = x.clone()
            dist.all_reduce(y)
            ref = sum(v.double() for v in xs)
        elif op == "all_gather":
            y = torch.empty(BIG * world, dtype=x.dtype, device=dev)
            dist.all_gather_into_tensor(y, x)
            ref = torch.cat([v.double() for v in xs])
        else:
            y = x.clone()
            dist.broadcast(y, src=0)
            ref = xs[0].double()
        torch.cuda.synchronize()
        out["results"][f"big/{op}#maxerr"] = float((y.double() - ref).abs().max().item())
        out["results"][f"big/{op}#bits"] = int(y.view(torch.int32).long().sum().item())
    out["stats"] = read_stats()
    dist.destroy_process_group()
    print("RESULT " + json.dumps(out), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_case(py, lib, world, emulate, preload, full, timeout, ranks_per_node=0, nccl=""):
    port = free_port()
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    if nccl:
        env["LD_PRELOAD"] = nccl
        env["MKERNEL_NCCL_LIBRARY"] = nccl
    if preload:
        env["LD_PRELOAD"] = lib + (":" + nccl if nccl else "")
        env["MKERNEL_LIB"] = lib
        # mkernel's own path at every size: the check is of mkernel, not of the sizes the default
        # policy hands to NCCL (docs/ALGORITHMS.md, rule 6b).
        env.setdefault("MKERNEL_NCCL_CROSSOVER", "off")
    if emulate:
        env["MKERNEL_EMULATE"] = "1"
        # Every rank is a client of GPU 0's MPS server, and the clients share one pool of hardware
        # queues: each takes CUDA_DEVICE_MAX_CONNECTIONS (gpu-check.sh launch exports 32), and four
        # with 32 fail cudaSetDevice with "out of memory" (docs/RELIABILITY.md). At
        # most 64 / clients each, as mkernel-proclat's ranks.
        cap = max(1, 64 // max(1, world))
        if int(env.get("CUDA_DEVICE_MAX_CONNECTIONS", "8")) > cap:
            env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(cap)
        if ranks_per_node > 0:
            env["MKERNEL_RANKS_PER_NODE"] = str(ranks_per_node)
            env.setdefault("MKERNEL_SOCKET_IFNAME", "lo")
    procs = []
    for r in range(world):
        cmd = [py, HERE, "--worker", "--rank", str(r), "--world", str(world), "--port", str(port)]
        if emulate:
            cmd.append("--shared-gpu")
        if full:
            cmd.append("--full")
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    results, logs, ok = [], [], True
    deadline = time.time() + timeout
    for p in procs:
        try:
            text, _ = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            ok = False
            text += "\n[torch_check] worker timed out"
        logs.append(text)
        ok = ok and p.returncode == 0
        for line in text.splitlines():
            if line.startswith("RESULT "):
                results.append(json.loads(line[7:]))
    return ok and len(results) == world, results, logs


def reference(world, dtype_name, op, rank):
    import torch
    xs = [rank_input(torch, r, dtype_name, COUNT).double() for r in range(world)]
    if op == "all_reduce_sum":
        return sum(xs)
    if op == "all_reduce_avg":
        return sum(xs) / world
    if op == "all_reduce_max":
        return torch.stack(xs).max(0).values
    if op == "all_gather":
        return torch.cat(xs)
    if op == "reduce_scatter":
        chunk = COUNT // world
        return sum(xs)[rank * chunk:(rank + 1) * chunk]
    return xs[world - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default="build/lib/libmkernel.so", help="libmkernel.so to preload")
    ap.add_argument("--ranks", default="1,2,4", help="comma list: up to --gpus = real NCCL beside the shim, more = emulated")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs to use, one rank each (default 1)")
    ap.add_argument("--mps", action="store_true", help="start a CUDA MPS daemon for the emulated cases")
    ap.add_argument("--ranks-per-node", type=int, default=0,
                    help="emulated cases: nodes of this many ranks (MKERNEL_RANKS_PER_NODE), the hierarchical path")
    ap.add_argument("--nccl", default="", metavar="LIBNCCL",
                    help="a libnccl.so.2 every worker preloads (an NCCL build; default: PyTorch's own)")
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--show", default="", metavar="REGEX",
                    help="print the workers' output lines that match REGEX (e.g. with MKERNEL_DEBUG=INFO, "
                         "'CTA.roles' shows the hierarchical AllReduce's form), once per distinct line")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--shared-gpu", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--full", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    lib = os.path.abspath(args.lib)
    if not os.path.exists(lib):
        sys.exit(f"torch_check: {lib} does not exist (build first)")
    nccl = os.path.abspath(args.nccl) if args.nccl else ""
    if nccl and not os.path.exists(nccl):
        sys.exit(f"torch_check: {nccl} does not exist")
    py = sys.executable
    summary, all_ok = [], True
    mps_dir = None
    try:
        for world in [int(w) for w in args.ranks.split(",") if w]:
            emulate = world > args.gpus
            if emulate and args.mps and mps_dir is None:
                mps_dir = tempfile.mkdtemp(prefix="mps")
                os.environ["CUDA_MPS_PIPE_DIRECTORY"] = mps_dir
                os.environ["CUDA_MPS_LOG_DIRECTORY"] = mps_dir
                subprocess.run(["nvidia-cuda-mps-control", "-d"], check=False)
            t0 = time.time()
            rpn = args.ranks_per_node if emulate and 0 < args.ranks_per_node < world else 0
            ok, results, logs = run_case(py, lib, world, emulate, True, True, args.timeout, rpn, nccl)
            case = {"ranks": world, "emulated": emulate, "ranks_per_node": rpn,
                    "seconds": round(time.time() - t0, 1), "checks": {}}
            if ok:
                import torch
                for res in results:
                    for dtype in DTYPES:
                        tol = 0.0 if dtype == "float32" else 1e-2
                        for op in OPS:
                            got = torch.tensor(res["results"][f"{op}/{dtype}"], dtype=torch.float64)
                            ref = reference(world, dtype, op, res["rank"]).to(getattr(torch, dtype)).double()
                            err = float((got - ref).norm() / max(ref.norm(), 1e-30))
                            good = got.shape == ref.shape and err <= tol
                            case["checks"][f"rank{res['rank']}/{op}/{dtype}"] = "ok" if good else f"rel.err {err:.3g}"
                            ok = ok and good
                    for op in BIG_OPS:
                        err = res["results"][f"big/{op}#maxerr"]
                        case["checks"][f"rank{res['rank']}/big/{op}"] = "ok" if err == 0 else f"max.err {err:.3g}"
                        ok = ok and err == 0
                    # The path claimed is the path taken: mkernel ran this rank's collectives.
                    st = res.get("stats") or {}
                    ran = sum(st.get("kernelOps", [0]))
                    case["checks"][f"rank{res['rank']}/mkernel_ran"] = "ok" if ran > 0 else "mkernel ran no collective"
                    ok = ok and ran > 0
                case["stats"] = [r.get("stats") for r in results]
                case["nccl_version"] = results[0]["nccl_version"]
                if not emulate:
                    # The same workers on the real NCCL alone: bit-identical results.
                    nok, nres, nlogs = run_case(py, lib, world, False, False, False, args.timeout, 0, nccl)
                    by_rank = {r["rank"]: r for r in results}
                    same = nok and all(n["results"][k] == by_rank[n["rank"]]["results"][k]
                                       for n in nres for k in n["results"] if k.endswith("#bits"))
                    case["equal_to_nccl"] = same
                    ok = ok and same
                    if not nok:
                        logs += nlogs
            if args.show:
                shown = set()
                for text in logs:
                    for line in text.splitlines():
                        if re.search(args.show, line) and line not in shown:
                            shown.add(line)
                            print(f"[torch_check] ranks={world}: {line[:400]}", flush=True)
            case["ok"] = ok
            if not ok:
                case["log_tail"] = "\n".join(l[-3000:] for l in logs)
            all_ok = all_ok and ok
            summary.append(case)
            bad = [k for k, v in case["checks"].items() if v != "ok"]
            print(f"[torch_check] ranks={world} emulated={emulate}"
                  f"{f' nodes of {rpn}' if rpn else ''}: {'PASS' if ok else 'FAIL'} "
                  f"({len(case['checks'])} checks, {len(bad)} bad{', equal to NCCL' if case.get('equal_to_nccl') else ''}) "
                  f"nccl={case.get('nccl_version', '?')} "
                  f"stats={case.get('stats')}", flush=True)
            if not ok:
                print(case.get("log_tail", ""), flush=True)
    finally:
        if mps_dir is not None:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, check=False)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "torch_check.json"), "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
