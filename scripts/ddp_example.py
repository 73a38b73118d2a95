#!/usr/bin/env python3
"""PyTorch DDP example for mkernel: a small transformer trained on a deterministic synthetic task.

Run it as users would run their own job, with and without LD_PRELOAD=libmkernel.so, and compare
the loss curves (docs/NCCL-TESTS.md, section "PyTorch DDP"):

  torchrun --nproc-per-node 2 scripts/ddp_example.py --backend nccl --csv nccl.csv
  python3 scripts/ddp_example.py --world-size 2 --backend gloo --csv gloo.csv   # mp.spawn
  python3 scripts/ddp_example.py --compare nccl.csv gloo.csv --tol 1e-3

Task: each sequence is an arithmetic progression modulo the vocabulary, x[t+1] = (x[t] + s) % V,
with a start and a stride s drawn per sequence; the model predicts the next token, so it must
infer s from the context. Data, initial weights and the order of everything are fixed by --seed,
so two runs of the same configuration give the same losses up to the rounding of the gradient
all-reduce. Rank 0 prints the global mean loss of each step (itself an all-reduce) and the median
step time; with mkernel preloaded it also prints mkernelGetStats' counters (which path ran).
"""
import argparse
import csv
import math
import os
import socket
import statistics
import sys
import time

try:
    import mkernel  # the installed package (pip install .)
except ImportError:  # a source tree: python/mkernel
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
    import mkernel


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=50, help="training steps (default 50)")
    p.add_argument("--backend", choices=["nccl", "gloo"], default=None,
                   help="process group backend (default: nccl with CUDA, else gloo)")
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks to start with mp.spawn when not under torchrun (default 1)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="where the model lives; cuda puts rank r on cuda:(r %% visible GPUs), so one "
                        "visible GPU holds every rank (emulation). auto: cuda when available")
    p.add_argument("--csv", default=None, help="write step,loss rows here (rank 0)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--batch", type=int, default=16, help="sequences per rank per step")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--compare", nargs=2, metavar=("A_CSV", "B_CSV"),
                   help="compare two --csv files instead of training; non-zero exit past --tol")
    p.add_argument("--tol", type=float, default=1e-3, help="largest allowed |loss difference|")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    return args


# ---- compare mode (no torch needed) ------------------------------------------------------------

def read_loss_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "step" not in rows[0] or "loss" not in rows[0]:
        raise ValueError(f"{path}: expected a CSV with columns step,loss")
    return {int(r["step"]): float(r["loss"]) for r in rows}


def compare(path_a, path_b, tol):
    """Prints the largest |loss_a - loss_b| over the common steps; 0 when within tol."""
    try:
        a, b = read_loss_csv(path_a), read_loss_csv(path_b)
    except (OSError, ValueError) as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    if sorted(a) != sorted(b):
        print(f"compare: different steps: {path_a} has {len(a)}, {path_b} has {len(b)}", file=sys.stderr)
        return 1
    bad = [s for s in sorted(a) if not (math.isfinite(a[s]) and math.isfinite(b[s]))]
    if bad:
        print(f"compare: non-finite loss at step {bad[0]}", file=sys.stderr)
        return 1
    worst_step = max(a, key=lambda s: (abs(a[s] - b[s]), -s))
    worst = abs(a[worst_step] - b[worst_step])
    verdict = "OK" if worst <= tol else "FAILED"
    print(f"max |loss difference| = {worst:.3e} at step {worst_step} "
          f"({a[worst_step]:.6f} vs {b[worst_step]:.6f}) over {len(a)} steps, tol {tol:g}: {verdict}")
    return 0 if worst <= tol else 1


# ---- mkernel's query symbol --------------------------------------------------------------------

def mkernel_stats():
    """mkernelGetStats() of this process (python/mkernel), or None when mkernel is not preloaded."""
    return mkernel.stats(load=False)


# ---- training ----------------------------------------------------------------------------------

def build_model(torch, args):
    nn = torch.nn

    class TinyTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(args.vocab, args.d_model)
            self.pos = nn.Parameter(torch.randn(args.seq_len, args.d_model) * 0.02)
            layer = nn.TransformerEncoderLayer(args.d_model, args.heads, 2 * args.d_model,
                                               dropout=0.0, batch_first=True)
            self.blocks = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
            self.head = nn.Linear(args.d_model, args.vocab)
            mask = torch.triu(torch.full((args.seq_len, args.seq_len), float("-inf")), diagonal=1)
            self.register_buffer("causal", mask, persistent=False)

        def forward(self, tokens):
            h = self.embed(tokens) + self.pos[: tokens.shape[1]]
            n = tokens.shape[1]
            h = self.blocks(h, mask=self.causal[:n, :n])
            return self.head(h)

    return TinyTransformer()


def make_batch(torch, args, step, rank):
    """The batch of (step, rank): the same on every run, different on every rank."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
    start = torch.randint(0, args.vocab, (args.batch, 1), generator=g)
    stride = torch.randint(1, 4, (args.batch, 1), generator=g)
    t = torch.arange(args.seq_len + 1).unsqueeze(0)
    seq = (start + stride * t) % args.vocab
    return seq[:, :-1], seq[:, 1:]


def pick_device(torch, args, local_rank):
    want = args.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("ddp_example: --device cuda but torch sees no GPU")
        dev = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        return dev
    return torch.device("cpu")


def train(rank, world_size, local_rank, args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    # Deterministic kernels so that two runs differ only by the all-reduce's rounding.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off: it can take a shared host's GPUs down
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    device = pick_device(torch, args, local_rank)
    if device.type == "cpu":
        # Ranks of one host share its cores: without this each takes them all and they thrash.
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_ranks)))
    backend = args.backend or ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl" and device.type != "cuda":
        raise SystemExit("ddp_example: the nccl backend needs --device cuda")
    dist.init_process_group(backend, rank=rank, world_size=world_size)

    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP broadcasts them too)
    model = build_model(torch, args).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        print(f"ddp_example: {world_size} rank(s), backend {backend}, device {device.type} "
              f"(rank 0 on {device}), {n_params} parameters, {args.steps} steps", flush=True)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    losses, step_times = [], []
    for step in range(args.steps):
        inputs, targets = (t.to(device) for t in make_batch(torch, args, step, rank))
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = ddp(inputs)
        loss = loss_fn(logits.reshape(-1, args.vocab), targets.reshape(-1))
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        sync()
        step_times.append(time.perf_counter() - t0)
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        global_loss = global_loss.item() / world_size
        if not math.isfinite(global_loss):
            raise SystemExit(f"ddp_example: rank {rank}: loss is {global_loss} at step {step}")
        losses.append(global_loss)
        if rank == 0:
            print(f"step {step:4d}  loss {global_loss:.6f}  {step_times[-1] * 1e3:8.2f} ms", flush=True)

    if rank == 0:
        print(f"median step time: {statistics.median(step_times) * 1e3:.3f} ms "
              f"(all {len(step_times)} steps); loss {losses[0]:.4f} -> {losses[-1]:.4f}")
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["step", "loss"])
                for i, v in enumerate(losses):
                    w.writerow([i, repr(v)])
            print(f"wrote {args.csv}")
    stats = mkernel_stats()
    if stats is not None:
        names = ["Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"]
        ran = ", ".join(f"{n} {stats['kernelOps'][i]}/{stats['forwardedOps'][i]}"
                        for i, n in enumerate(names) if stats["kernelOps"][i] or stats["forwardedOps"][i])
        print(f"rank {rank}: mkernel kernel/forwarded ops: {ran or 'none'}; "
              f"kernel launches {stats['kernelLaunches']}", flush=True)
    elif rank == 0:
        print("mkernel: not loaded (mkernelGetStats not found)")
    dist.destroy_process_group()
    return losses


def spawned(index, world_size, args):
    train(index, world_size, index, args)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    args = parse_args(argv)
    if args.compare:
        return compare(args.compare[0], args.compare[1], args.tol)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        if args.world_size is not None and args.world_size != int(os.environ["WORLD_SIZE"]):
            print("ddp_example: --world-size differs from torchrun's WORLD_SIZE; using torchrun's",
                  file=sys.stderr)
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
              int(os.environ.get("LOCAL_RANK", os.environ["RANK"])), args)
        return 0
    world_size = args.world_size or 1
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    if world_size == 1:
        os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", "1"
        train(0, 1, 0, args)
        return 0
    import torch.multiprocessing as mp
    mp.spawn(spawned, args=(world_size, args), nprocs=world_size, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
