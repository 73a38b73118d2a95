#!/usr/bin/env bash
# GPU tier in one call on the device machine (docs/KERNEL.md):
#   bash scripts/gpu-check.sh            (from the repository root)
# Configures with device code (sm_90), builds the GPU tests and mkernel-collbench with nvcc,
# runs `ctest -L gpu`, then the AllReduce benchmark, and prints a short table at the end.
# Logs go to build-gpu/logs; the main ones are copied to $OUT when it is set.
# Catch2 (single header) comes from .carry/ when no Catch2 package is installed.
# Env: GPU_CHECK_BENCH_ARGS (extra mkernel-collbench arguments), GPU_CHECK_SKIP_BENCH=1,
#      GPU_CHECK_SKIP_TORCH=1, GPU_CHECK_TORCH_RANKS (default 1), GPU_CHECK_PYTHON,
#      GPU_CHECK_TRACE=0 (skip the kernel-trace benchmark run), GPU_CHECK_SKIP_TESTS=1 (benchmarks
#      only: a second call on a warm machine, whose build is still there), GPU_CHECK_GRAPH=0 (skip
#      the graph-residency cases test_gpu_graph* and test_gpu_gate: they hung in sessions 3-8 and
#      pass since session 9's fix, docs/RELIABILITY.md), GPU_CHECK_CTEST_ARGS (more ctest
#      arguments: "-I 1,40" and "-I 41,200" split the tier over two calls; the numbers are
#      ctest's, `ctest -N -L gpu`), GPU_CHECK_SKIP_BUILD=1 (a warm machine whose build is there).
# The summary ends with one row per GPU test: its result and seconds (ctest's own timing).
# One device call may run 600 s at most: the default timeouts fit the build (~150 s), the tests
# and the benchmarks only when the tests pass quickly; split into two calls when in doubt.
set -u -o pipefail
. "$(dirname "$0")/common.sh"  # mk_ctest_rows
# NVLink multicast stays off on every machine this runs on (it can take a shared host's GPUs down
# for a day): for NCCL here, and mkernel never uses multicast unless MKERNEL_NVLS=1.
export NCCL_NVLS_ENABLE=0
root=$(cd "$(dirname "$0")/.." && pwd)
build=${GPU_CHECK_BUILD:-$root/build-gpu}
# All logs go to $build/logs; at the end the eight that matter are copied to $OUT when it is set
# (the device tool brings back at most 8 files).
logs=$build/logs
mkdir -p "$build" "$logs"
catch_args=()
[ -f "$root/.carry/catch2/catch.hpp" ] && catch_args=(-DMKERNEL_CATCH2_INCLUDE_DIR="$root/.carry")

step() { echo "== $* ($(date +%T))"; }
step configure
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMKERNEL_DEVICE_CODE=ON -DMKERNEL_BUILD_TESTS=ON "${catch_args[@]}" \
  >"$logs/configure.log" 2>&1 || { tail -40 "$logs/configure.log"; exit 1; }
step build
start=$(date +%s)
[ "${GPU_CHECK_SKIP_BUILD:-0}" = 1 ] || make -C "$build" -j"${GPU_CHECK_JOBS:-16}" test_comm_create test_coll_reduce_gpu test_dmabuf_gpu test_gpu_collectives test_gpu_kernel test_gpu_procs test_shim_gpu test_shim_emulate test_shim_api \
  mkernel mkernel-collbench mkernel-topo nccl_one_rank \
  >"$logs/build.log" 2>&1 || { grep -B2 -A8 -m5 "error" "$logs/build.log"; tail -20 "$logs/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true

# Every rank has a caller stream and an internal stream; with CUDA's default 8 hardware queues,
# streams share queues and a stream blocked in cuStreamWaitValue32 delays the posts of the
# streams queued behind it (docs/KERNEL.md). 32 is the maximum.
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
# A hang must not eat the whole device call: GPU waits give up after MKERNEL_TIMEOUT_S.
export MKERNEL_TIMEOUT_S=${MKERNEL_TIMEOUT_S:-30}
# Copies what exists so far to $OUT after every step: a call that hits the device tool's time
# limit still brings back everything finished before it.
save() {
  [ -n "${OUT:-}" ] || return 0
  for f in summary.txt ctest-gpu.log collbench.txt collbench.err collbench.csv collbench-multi.csv torch.txt torch_check.json; do
    [ -f "$logs/$f" ] && cp "$logs/$f" "$OUT/"
  done
  return 0
}
ctest_rc=skipped
if [ "${GPU_CHECK_SKIP_TESTS:-0}" != 1 ]; then
  # The graph-residency cases (test_gpu_graph*, test_gpu_gate) hung on the H200 in sessions 3-8
  # (docs/KERNEL.md); since session 9 they pass, 45 s each at most. GPU_CHECK_GRAPH=0 leaves them out.
  exclude=()
  [ "${GPU_CHECK_GRAPH:-1}" = 0 ] && exclude=(-E '^(test_gpu_graph.*|test_gpu_gate)$')
  step "ctest -L gpu ${GPU_CHECK_CTEST_ARGS:-} ${exclude[*]}"
  # shellcheck disable=SC2086
  (cd "$build" && timeout "${GPU_CHECK_TEST_TIMEOUT:-420}" ctest -L gpu "${exclude[@]}" ${GPU_CHECK_CTEST_ARGS:-} \
    --output-on-failure --timeout 240) 2>&1 | tee "$logs/ctest-gpu.log"
  ctest_rc=${PIPESTATUS[0]}
  save
fi
(cd "$build" && ctest -R test_comm_create --output-on-failure) >"$logs/ctest-create.log" 2>&1
create_rc=$?

bench_rc=0
if [ "${GPU_CHECK_SKIP_BENCH:-0}" != 1 ]; then
  step "mkernel-collbench"
  # NCCL's one-rank AllReduce in the same run (the issue's comparison): PyTorch's NCCL 2.28.9.
  NCCL_LIB=${GPU_CHECK_NCCL_LIB:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2}
  nccl_args=()
  [ -f "$NCCL_LIB" ] && nccl_args=(--nccl "$NCCL_LIB")
  # shellcheck disable=SC2086
  timeout "${GPU_CHECK_BENCH_TIMEOUT:-300}" "$build/bin/mkernel-collbench" --csv "$logs/collbench.csv" \
    --ranks 1,2,4,8 "${nccl_args[@]}" ${GPU_CHECK_BENCH_ARGS:-} \
    >"$logs/collbench.txt" 2>"$logs/collbench.err"
  bench_rc=$?
  tail -5 "$logs/collbench.err"
  save
  ngpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if [ "${ngpus:-1}" -gt 1 ]; then
    # Real multi-GPU (issue 9): one rank per GPU over NVLink, mkernel beside NCCL in one run.
    # NVLink multicast stays off (it can take a shared host's GPUs down).
    step "mkernel-collbench on $ngpus GPUs, beside NCCL (NCCL_NVLS_ENABLE=0)"
    NCCL_NVLS_ENABLE=0 timeout "${GPU_CHECK_MULTI_TIMEOUT:-200}" "$build/bin/mkernel-collbench" --gpus "$ngpus" \
      --ranks "$ngpus" "${nccl_args[@]}" --iters 300 --csv "$logs/collbench-multi.csv" 2>>"$logs/collbench.err" \
      | sed 's/^/multi-gpu: /' >>"$logs/collbench.txt" || bench_rc=1
  fi
  if [ "${GPU_CHECK_TRACE:-1}" != 0 ]; then
    # Where the small-message time goes: the kernel's stage timestamps (MKERNEL_KERNEL_TRACE).
    step "mkernel-collbench --trace 1 (small messages)"
    timeout "${GPU_CHECK_TRACE_TIMEOUT:-90}" "$build/bin/mkernel-collbench" --trace 1 --wait memop --ranks 1,2,8 --max-bytes 32768 \
      --iters 300 2>>"$logs/collbench.err" | sed -n '/# kernel trace/,$p' >>"$logs/collbench.txt" || bench_rc=1
  fi
fi

torch_rc=skipped
PY=${GPU_CHECK_PYTHON:-/opt/torch/.venv/bin/python}
if [ -x "$PY" ] && [ "${GPU_CHECK_SKIP_TORCH:-0}" != 1 ]; then
  step "PyTorch through the LD_PRELOAD shim (scripts/torch_check.py --ranks 1)"
  OUT=$logs timeout "${GPU_CHECK_TORCH_TIMEOUT:-240}" "$PY" "$root/scripts/torch_check.py" --lib "$build/lib/libmkernel.so" \
    --ranks "${GPU_CHECK_TORCH_RANKS:-1}" >"$logs/torch.txt" 2>&1
  torch_rc=$?
  tail -25 "$logs/torch.txt"
  save
fi

step "mkernel-topo"
"$build/bin/mkernel-topo" 2>&1 | tee "$logs/topo.txt" | head -30
step "NCCL loads mkernel's net plugin and tuner"
OUT=$logs bash "$root/scripts/nccl-plugin-check.sh" "$build" 2>&1 | tail -30
plugin_rc=${PIPESTATUS[0]}

{
step summary
echo "nccl-plugin-check: rc=$plugin_rc"
echo "ctest -L gpu: rc=$ctest_rc   test_comm_create: rc=$create_rc   collbench: rc=$bench_rc   torch_check: rc=$torch_rc"
if [ -f "$logs/ctest-gpu.log" ]; then
  grep -E "tests passed|tests failed|Total Test time" "$logs/ctest-gpu.log"
  # "  1/27 Test  #7: test_coll_reduce_gpu ......   Passed    3.21 sec" -> one row per test
  echo "| # | test | result | s |"
  echo "|---|---|---|---|"
  mk_ctest_rows "$logs/ctest-gpu.log" | while read -r n name res secs; do echo "| #$n | $name | ${res//_/ } | $secs |"; done
fi
[ -f "$logs/collbench.txt" ] && cat "$logs/collbench.txt"
[ -f "$logs/torch.txt" ] && grep -E "^\[torch_check\]" "$logs/torch.txt"
} 2>&1 | tee "$logs/summary.txt"
save
{ [ "$ctest_rc" = 0 ] || [ "$ctest_rc" = skipped ]; } && [ "$create_rc" = 0 ] && [ "$bench_rc" = 0 ] && { [ "$torch_rc" = 0 ] || [ "$torch_rc" = skipped ]; }
