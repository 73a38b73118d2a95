#!/usr/bin/env bash
# Issue 7's emulated DDP run: scripts/ddp_example.py with N processes sharing ONE GPU (cuda:0),
# under a private CUDA MPS daemon (without it, two processes' spinning kernels do not progress
# together), through mkernel (`LD_PRELOAD=libmkernel.so MKERNEL_EMULATE=1`, backend nccl),
# against the same run on PyTorch's gloo backend. NCCL itself refuses two ranks on one GPU
# ("Duplicate GPU detected"), so gloo is the reference here; it sums in another order, hence a
# looser default tolerance than the multi-GPU comparison with NCCL (scripts/gpu-check.sh multigpu).
#   bash scripts/ddp-emulated.sh [BUILD]     (BUILD holds lib/libmkernel.so; default build-gpu)
# DDP_RANKS (default "2 4"), DDP_STEPS (30), DDP_TOL (1e-2), DDP_TIMEOUT per run (240 s),
# MK_PYTHON (the interpreter; default: the first of python3, python and /opt/*/.venv/bin/python3
# whose `import torch` works), NCCL_HOME (default: the nvidia-nccl wheel of that interpreter's
# PyTorch). Prints per N: both runs' median step times, mkernel's
# path counters and the loss comparison; logs and CSVs in $OUT (or /tmp) as ddp-emu-*.
set -u -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
# mk_torch_python: MK_PYTHON, else the first interpreter whose `import torch` works.
mk_torch_python() {
  local c
  for c in ${MK_PYTHON:-} python3 python /opt/*/.venv/bin/python3; do
    command -v "$c" >/dev/null 2>&1 && "$c" -c 'import torch' >/dev/null 2>&1 && { command -v "$c"; return 0; }
    [ -n "${MK_PYTHON:-}" ] && break  # MK_PYTHON set: that one or none
  done
  return 1
}
PY=$(mk_torch_python) || { echo "ddp-emulated: no Python with PyTorch (${MK_PYTHON:-python3, python, /opt/*/.venv}); set MK_PYTHON"; exit 1; }
out=${OUT:-/tmp}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
# PyTorch's NCCL (the nvidia-nccl-cu* wheel next to it), for the forwarded calls.
NCCL_HOME=${NCCL_HOME:-$("$PY" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)}
export LD_LIBRARY_PATH=${NCCL_HOME:+$NCCL_HOME/lib:}$build/lib:${LD_LIBRARY_PATH:-}
echo "ddp-emulated: $PY, NCCL_HOME=${NCCL_HOME:-none, libnccl from the loader path}"
[ -f "$build/lib/libmkernel.so" ] || { echo "ddp-emulated: no $build/lib/libmkernel.so"; exit 1; }

mps=$(mktemp -d /tmp/mps.XXXXXX)
export CUDA_MPS_PIPE_DIRECTORY=$mps CUDA_MPS_LOG_DIRECTORY=$mps
nvidia-cuda-mps-control -d || { echo "ddp-emulated: could not start the MPS daemon"; exit 1; }
trap 'echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; rm -rf "$mps"' EXIT

fail=0
for n in ${DDP_RANKS:-2 4}; do
  args=(--world-size "$n" --steps "${DDP_STEPS:-30}")
  timeout "${DDP_TIMEOUT:-240}" "$PY" "$root/scripts/ddp_example.py" "${args[@]}" --backend gloo \
    --csv "$out/ddp-emu-gloo-$n.csv" >"$out/ddp-emu-gloo-$n.txt" 2>&1 || { echo "N=$n gloo failed"; tail -5 "$out/ddp-emu-gloo-$n.txt"; fail=1; continue; }
  MKERNEL_EMULATE=1 LD_PRELOAD=$build/lib/libmkernel.so timeout "${DDP_TIMEOUT:-240}" "$PY" "$root/scripts/ddp_example.py" \
    "${args[@]}" --backend nccl --csv "$out/ddp-emu-mk-$n.csv" >"$out/ddp-emu-mk-$n.txt" 2>&1 ||
    { echo "N=$n mkernel failed"; tail -5 "$out/ddp-emu-mk-$n.txt"; fail=1; continue; }
  echo "N=$n on one GPU: gloo $(grep -m1 'median step' "$out/ddp-emu-gloo-$n.txt"); mkernel $(grep -m1 'median step' "$out/ddp-emu-mk-$n.txt")"
  grep -m1 'kernel/forwarded' "$out/ddp-emu-mk-$n.txt"
  "$PY" "$root/scripts/ddp_example.py" --compare "$out/ddp-emu-gloo-$n.csv" "$out/ddp-emu-mk-$n.csv" --tol "${DDP_TOL:-1e-2}" || fail=1
done
echo "ddp-emulated: fail=$fail"
exit "$fail"
