#!/usr/bin/env bash
# Process ranks (staged collectives through CUDA IPC, docs/KERNEL.md) in one device call:
#   bash scripts/procs-check.sh          (repository root; PyTorch 2.11 at PROCS_PYTHON)
# Builds libmkernel.so and test_gpu_procs, then:
#   0. ctest -R test_gpu_procs: 2 ranks (one per GPU), 4 ranks (emulated under MPS when the GPUs
#      are fewer), 3 ranks with one killed (the survivors see RemoteError).
#   1. (2+ GPUs) scripts/torch_check.py --ranks 2 --gpus 2: two processes on two GPUs, mkernel
#      beside the real NCCL; results bit-identical to NCCL alone; mkernel ran them.
#   2. scripts/torch_check.py --ranks 2,4 --mps: emulated process ranks on one GPU under CUDA MPS.
#   3. (2+ GPUs) scripts/torch_bench.py: torch.distributed all_reduce / all_gather /
#      reduce_scatter, NCCL against mkernel, 8 B to PROCS_MAX_BYTES; table, CSV and plot.
#   4. (2+ GPUs) scripts/ddp_example.py, 2 ranks, NCCL against LD_PRELOAD=libmkernel.so: loss
#      compared, step times and mkernel's counters printed.
# PROCS_STEPS (default "0 1 2 3 4") picks the steps; PROCS_MIN_BYTES (8) starts step 3's sweep;
# PROCS_CROSSOVER_OFF=1 repeats steps 3 and 4 with MKERNEL_NCCL_CROSSOVER=off (mkernel's own path
# at every size: the policy's crossovers for process ranks, docs/ALGORITHMS.md rule 6b, against
# what they replace, in the same call).
# NVLink multicast stays off. Logs in build-gpu/logs-procs; the results are copied to $OUT.
set -u -o pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
export MKERNEL_TIMEOUT_S=${MKERNEL_TIMEOUT_S:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${PROCS_BUILD:-$root/build-gpu}
logs=$build/logs-procs
mkdir -p "$logs"
PY=${PROCS_PYTHON:-/opt/torch/.venv/bin/python}
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
step() { echo "== $* ($(date +%T))"; }
save() { [ -n "${OUT:-}" ] && for f in "$@"; do [ -f "$logs/$f" ] && cp "$logs/$f" "$OUT/"; done; return 0; }
fail=0
[ -x "$PY" ] || { echo "procs-check: no PyTorch at $PY"; exit 1; }
STEPS=" ${PROCS_STEPS:-0 1 2 3 4} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
# Step 3 and 4's variants: "name|VAR=value ..." (the default policy, and with PROCS_CROSSOVER_OFF=1
# mkernel's own path at every size).
variants=("mk|")
[ "${PROCS_CROSSOVER_OFF:-0}" = 1 ] && variants+=("mk-nocross|MKERNEL_NCCL_CROSSOVER=off")

step "build libmkernel.so ($NG GPU(s))"
catch_args=()
[ -f "$root/.carry/catch2/catch.hpp" ] && catch_args=(-DMKERNEL_CATCH2_INCLUDE_DIR="$root/.carry")
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMKERNEL_DEVICE_CODE=ON -DMKERNEL_BUILD_TESTS=ON "${catch_args[@]}" >"$logs/configure.log" 2>&1 ||
  { tail -30 "$logs/configure.log"; exit 1; }
make -C "$build" -j"${PROCS_JOBS:-16}" mkernel test_gpu_procs >"$logs/build.log" 2>&1 ||
  { grep -m5 -A5 error "$logs/build.log"; exit 1; }
LIB=$build/lib/libmkernel.so

if want 0; then
step "0. test_gpu_procs (C++ process ranks, killed rank)"
(cd "$build" && timeout 300 ctest -R test_gpu_procs --output-on-failure --timeout 90) 2>&1 | tee "$logs/ctest-procs.txt" | tail -40
[ "${PIPESTATUS[0]}" = 0 ] || fail=1
save ctest-procs.txt
fi

if [ "$NG" -ge 2 ] && want 1; then
  step "1. torch_check: 2 processes on 2 GPUs, against NCCL"
  timeout 240 "$PY" "$root/scripts/torch_check.py" --lib "$LIB" --ranks 2 --gpus 2 --timeout 200 2>&1 |
    tee "$logs/torch-check-2gpu.txt" | grep -v "^\s*$" | tail -30
  [ "${PIPESTATUS[0]}" = 0 ] || fail=1
  save torch-check-2gpu.txt
fi

if want 2; then
step "2. torch_check: emulated process ranks on one GPU under MPS (--ranks ${PROCS_EMU_RANKS:-2})"
CUDA_VISIBLE_DEVICES=0 timeout 240 "$PY" "$root/scripts/torch_check.py" --lib "$LIB" --ranks "${PROCS_EMU_RANKS:-2}" \
  --mps --timeout 100 2>&1 | tee "$logs/torch-check-emu.txt" | tail -30
[ "${PIPESTATUS[0]}" = 0 ] || fail=1
save torch-check-emu.txt
fi

if [ "$NG" -ge 2 ] && want 3; then
  for v in "${variants[@]}"; do
    IFS='|' read -r name envs <<<"$v"
    step "3. torch_bench: NCCL against mkernel ($name${envs:+: $envs}), 2 processes on 2 GPUs"
    # shellcheck disable=SC2086  # envs: VAR=value words
    env $envs timeout "${PROCS_BENCH_TIMEOUT:-200}" "$PY" "$root/scripts/torch_bench.py" --lib "$LIB" --ranks 2 \
      --min-bytes "${PROCS_MIN_BYTES:-8}" --max-bytes "${PROCS_MAX_BYTES:-256M}" --iters "${PROCS_ITERS:-30}" \
      --trials "${PROCS_TRIALS:-3}" --csv "$logs/torch-bench-$name.csv" --plot "$logs/torch-bench-$name.png" 2>&1 |
      tee "$logs/torch-bench-$name.txt" | tail -45
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
    save "torch-bench-$name.txt" "torch-bench-$name.csv"
  done
fi

if [ "$NG" -ge 2 ] && want 4; then
  step "4. DDP example, 2 ranks: NCCL against LD_PRELOAD=libmkernel.so"
  timeout 150 "$PY" "$root/scripts/ddp_example.py" --world-size 2 --backend nccl --csv "$logs/ddp-nccl.csv" \
    >"$logs/ddp.txt" 2>&1 || fail=1
  for v in "${variants[@]}"; do
    IFS='|' read -r name envs <<<"$v"
    echo "== DDP with mkernel ($name${envs:+: $envs})" >>"$logs/ddp.txt"
    # shellcheck disable=SC2086
    env $envs LD_PRELOAD="$LIB" timeout 150 "$PY" "$root/scripts/ddp_example.py" --world-size 2 --backend nccl \
      --csv "$logs/ddp-$name.csv" >>"$logs/ddp.txt" 2>&1 || fail=1
    "$PY" "$root/scripts/ddp_example.py" --compare "$logs/ddp-nccl.csv" "$logs/ddp-$name.csv" --tol "${PROCS_DDP_TOL:-1e-3}" \
      >>"$logs/ddp.txt" 2>&1 || fail=1
  done
  grep -iE "==|step time|mkernel|loss|compare|max" "$logs/ddp.txt" | tail -24
  save ddp.txt
fi
step "summary: procs-check $([ $fail = 0 ] && echo passed || echo FAILED)"
exit $fail
