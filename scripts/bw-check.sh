#!/usr/bin/env bash
# Bandwidth against NCCL and the emulated-node stall, in one device call:
#   bash scripts/bw-check.sh        (repository root; carry .carry: Catch2 and nccl-tests)
#   1. builds libmkernel.so, mkernel-p2pbench, test_gpu_collectives (sm_90) and the patched
#      nccl-tests BW_TESTS (default all_reduce_perf reduce_scatter_perf all_gather_perf);
#   2. mkernel-p2pbench (2+ GPUs): NVLink pull / push / reduce of CTA loops and of reduceCopy;
#   3. ctest BW_CTEST (default test_gpu_collectives and test_gpu_persistent; "" skips);
#   4. nccl-tests BW_TESTS -b BW_MIN (1M) -e BW_MAX (1G) -f 4 -c 1 -g <GPUs>: NCCL, mkernel, and
#      with BW_STAGED=1 mkernel through the staging buffers (MKERNEL_STAGED=1: the process-rank
#      algorithm), tables by scripts/nccl-tests-table.py;
#   5. test_gpu_hier (4 thread ranks as 2 emulated nodes on GPU 0) under each of BW_HIER
#      (default "default:3 gate:3"; NAME:RUNS, NAME one of default, gate = MKERNEL_STREAM_WAIT=kernel,
#      conn1 = CUDA_DEVICE_MAX_CONNECTIONS=1, conn8 = 8, resident = MKERNEL_IDLE_EXIT_US=10000000,
#      eager = CUDA_MODULE_LOADING=EAGER, eager32 = that and 32 hardware queues),
#      MKERNEL_TIMEOUT_S=BW_HIER_TIMEOUT (8): pass/fail, seconds, and the first error lines;
#   6. (2+ GPUs, BW_TORCH_MAX set, e.g. 64M) scripts/torch_bench.py, 2 processes, NCCL against
#      mkernel, 8 B to BW_TORCH_MAX.
# NVLink multicast stays off. Logs in build-gpu/logs-bw; at most eight files copied to $OUT, and
# every log as $OUT/0-bw-check-logs.tgz (common.sh, mk_gpu_env).
set -u -o pipefail
build=${BW_BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build-gpu}
logs=$build/logs-bw
# shellcheck source=scripts/common.sh
. "$(dirname "$0")/common.sh"
mk_gpu_env
PY=$(mk_torch_python)
TESTS=${BW_TESTS:-"all_reduce_perf reduce_scatter_perf all_gather_perf"}
fail=0

step "1. build ($NG GPU(s))"
gpu_build "${BW_JOBS:-16}" mkernel mkernel-p2pbench test_gpu_collectives
gpu_build_nccl_tests "$TESTS"
LIB=$build/lib/libmkernel.so
export LD_LIBRARY_PATH=$NCCL_HOME/lib:$build/lib:${LD_LIBRARY_PATH:-}

if [ "$NG" -ge 2 ]; then
  step "2. mkernel-p2pbench"
  timeout 120 "$build/bin/mkernel-p2pbench" ${BW_P2P_ARGS:-} >"$logs/p2pbench.txt" 2>&1 || fail=1
  cat "$logs/p2pbench.txt"
  save p2pbench.txt
fi

CTESTS=${BW_CTEST-'^(test_gpu_collectives|test_gpu_persistent)$'}
if [ -n "$CTESTS" ]; then
  step "3. ctest -R $CTESTS"
  (cd "$build" && MKERNEL_TIMEOUT_S=20 ctest -R "$CTESTS" --output-on-failure --timeout 200) >"$logs/ctest.log" 2>&1 ||
    fail=1
  grep -E "Passed|Failed|Timeout|FAILED|with expansion" "$logs/ctest.log" | head -30
fi

step "4. nccl-tests -b ${BW_MIN:-1M} -e ${BW_MAX:-1G} -g $NG: NCCL, mkernel${BW_STAGED:+, mkernel staged}"
variants=("mk|default|")
[ "${BW_STAGED:-0}" = 1 ] && variants+=("staged|MKERNEL_STAGED=1: the process-rank algorithm|MKERNEL_STAGED=1")
nccl_tests_vs "$TESTS" "${BW_MIN:-1M}" "${BW_MAX:-1G}" 150 "${variants[@]}" || fail=1
save tables.txt

step "5. test_gpu_hier: ${BW_HIER:-default:3 gate:3}"
: >"$logs/hier.txt"
for spec in ${BW_HIER:-default:3 gate:3}; do
  mode=${spec%%:*}
  runs=${spec##*:}
  case $mode in
    default) env=() ;;
    gate) env=(MKERNEL_STREAM_WAIT=kernel) ;;
    conn1) env=(CUDA_DEVICE_MAX_CONNECTIONS=1) ;;
    conn8) env=(CUDA_DEVICE_MAX_CONNECTIONS=8) ;;
    resident) env=(MKERNEL_IDLE_EXIT_US=10000000) ;;
    eager) env=(CUDA_MODULE_LOADING=EAGER) ;;
    eager32) env=(CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32) ;;
    *) echo "unknown BW_HIER mode $mode"; fail=1; continue ;;
  esac
  for i in $(seq 1 "$runs"); do
    t0=$(date +%s%N)
    env "${env[@]}" MKERNEL_TIMEOUT_S=${BW_HIER_TIMEOUT:-8} timeout 90 "$build/tests/gpu/test_gpu_collectives" --order lex "[hier]" \
      >"$logs/hier-$mode-$i.log" 2>&1
    rc=$?
    echo "test_gpu_hier $mode (${env[*]:-defaults}) run $i: rc=$rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms"
    [ "$rc" = 0 ] || { fail=1; grep -E "timed out|no byte moved|FAILED|differs" "$logs/hier-$mode-$i.log" | cut -c1-400 | head -6; }
  done
done 2>&1 | tee -a "$logs/hier.txt"
grep -q "rc=[1-9]" "$logs/hier.txt" && fail=1  # the loop ran in a pipeline's subshell
save hier.txt

if [ "$NG" -ge 2 ] && [ -n "${BW_TORCH_MAX:-}" ] && mk_have_torch "$PY"; then
  step "6. torch_bench: 2 processes on 2 GPUs, NCCL against mkernel, 8 B to $BW_TORCH_MAX"
  timeout 240 "$PY" "$root/scripts/torch_bench.py" --lib "$LIB" --ranks 2 --max-bytes "$BW_TORCH_MAX" \
    --iters "${BW_TORCH_ITERS:-50}" --trials 3 --csv "$logs/torch-bench.csv" 2>&1 | tee "$logs/torch-bench.txt" | tail -40
  [ "${PIPESTATUS[0]}" = 0 ] || fail=1
  save torch-bench.txt torch-bench.csv
fi
echo "bw-check: fail=$fail"
exit "$fail"
