#!/usr/bin/env bash
# One device call against the first-collective stall of several thread ranks on one GPU
# (docs/RELIABILITY.md): which condition makes it go away.
#   bash scripts/emu-stall-matrix.sh        (repository root; carry .carry)
#   1. builds libmkernel.so, mkernel-queueprobe and the patched nccl-tests (scripts/launch-check.sh
#      with everything else off);
#   2. mkernel-queueprobe: kernels that wait for each other, one per thread and stream, with the
#      streams made after G other streams (--gaps) or S-1 apart (--strides), made by this
#      program's static CUDA runtime or by the shared libcudart.so (foreign: nccl-tests' case),
#      plain and shaped like mkernel's launch-path kernel (--kernel mkernel), with and without
#      an event recorded behind each kernel (--after), at 32 and 8 hardware queues: no mkernel
#      library;
#   2b. mkernel-emuprobe (tools/dev/emuprobe): nccl-tests -t 4's set-up through libmkernel.so's NCCL
#      API without nccl-tests, MATRIX_RUNS fresh processes per row, each row changing one thing
#      (buffers, how the comms are made, the collective, data set-up, rank count);
#   3. scripts/emu-stall-probe.sh, MATRIX_RUNS (6) short runs each of broadcast_perf -t 4 -b 8 -e 8
#      (MKERNEL_TIMEOUT_S=3), per variant: the default; nccl-tests -p 1 (every thread makes its own
#      comm instead of the main thread making all four in one group); MKERNEL_LAUNCH_STREAM=own;
#      nccl-tests -c 0 (no data setup on the default stream before the first collective);
#      CUDA_DEVICE_MAX_CONNECTIONS=8; MKERNEL_LAUNCH_MAX_BYTES=0 (the persistent kernel);
#      MKERNEL_LAUNCH_WATCH=off (no event before the first kernel); under each row, what the
#      launch watch said in its stalled runs;
#   3b. (MATRIX_SHARED_CUDART=1) a second build of libmkernel.so on the shared CUDA runtime
#      (-DMKERNEL_CUDART=shared), the same short runs with it;
#   4. (unless MATRIX_GDB=0) one stalled run of the default with MKERNEL_TIMEOUT_S=60, for
#      cuda-gdb's contexts, kernels and host stacks.
# MATRIX_STEPS (default "2 2b 3") picks the steps after the build; MATRIX_ROWS (an extended regular
# expression, default all) the rows of 2b and 3 by name.
# About 540 s with MATRIX_RUNS=4 MATRIX_GDB=0 when half the runs stall (one device call).
# Prints a table: variant, runs passed. Logs to $OUT when set.
set -u -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-gpu
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
echo "== 1. build ($(date +%T))"
if [[ " ${MATRIX_STEPS:-2 2b 3} " == *" 3 "* ]]; then
  LC_CTEST=none LC_HIER_REPS=0 LC_NCCL_RUN=0 LC_COLLBENCH=0 LC_TORCH=0 LC_JOBS=${MATRIX_JOBS:-32} \
    LC_TESTS="broadcast_perf all_reduce_perf" bash "$root/scripts/launch-check.sh" >/dev/null 2>&1 ||
    { echo "build failed"; exit 1; }
else
  # No nccl-tests rows: the library and the probes only.
  { cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMKERNEL_DEVICE_CODE=ON -DMKERNEL_BUILD_DEV_TOOLS=ON -DMKERNEL_BUILD_TESTS=OFF >/dev/null &&
    make -C "$build" -j"${MATRIX_JOBS:-32}" mkernel mkernel-queueprobe mkernel-emuprobe >/dev/null; } 2>&1 | tail -5
  [ -x "$build/bin/mkernel-emuprobe" ] || { echo "build failed"; exit 1; }
fi

want() { [[ " ${MATRIX_STEPS:-2 2b 3} " == *" $1 "* ]]; }
row() { [[ "$1" =~ ${MATRIX_ROWS:-.} ]]; }
if want 2; then
echo "== 2. mkernel-queueprobe ($(date +%T))"
# foreign: the streams made and polled by the shared libcudart.so, as nccl-tests' are.
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64
# --after record: an event recorded behind each waiting kernel (session 9's reading: such a
# command blocks the hardware queue it shares with peers' streams), at CUDA's 8 queues too.
for k in plain mkernel; do
  for after in none record; do
    for conns in 32 8; do
      CUDA_DEVICE_MAX_CONNECTIONS=$conns timeout 100 "$build/bin/mkernel-queueprobe" --kernel "$k" --after "$after" \
        --ranks 2,4,8 --variants fresh,reused,foreign --gaps 0,7 --strides 1,2 --rounds 10 --timeout-ms 50
    done
  done
done | tee "${OUT:-/tmp}/queueprobe.txt" | awk '/^#|^variant/ || $6 != 0'
echo "(rows with stalls only; the whole table in queueprobe.txt)"
fi

if want 2b; then
echo "== 2b. mkernel-emuprobe: nccl-tests' set-up without nccl-tests, one difference at a time ($(date +%T))"
# Each run a fresh process; MATRIX_RUNS runs per row. The default row is nccl-tests -t 4's set-up:
# streams first, the comms made by one thread in a group, buffers from the real NCCL's
# ncclMemAlloc, Broadcast of 8 B. Failed runs' verdicts go to emuprobe-failures.txt.
printf '%-30s %s\n' "emuprobe variant" "runs passed" | tee -a "${OUT:-/tmp}/stall-matrix.txt"
: >"${OUT:-/tmp}/emuprobe-failures.txt"
while IFS='|' read -r name args; do
  row "$name" || continue
  ok=0
  runs=${MATRIX_RUNS:-6}
  for ((i = 0; i < runs; ++i)); do
    # shellcheck disable=SC2086  # args: words
    verdict=$(MKERNEL_EMULATE=1 MKERNEL_TIMEOUT_S=3 CUDA_VISIBLE_DEVICES=0 CUDA_MODULE_LOADING=EAGER \
      LD_LIBRARY_PATH="${NCCL_HOME:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl}/lib:$build/lib:${LD_LIBRARY_PATH:-}" \
      timeout 30 "$build/bin/mkernel-emuprobe" $args --timeout-s 10 2>&1 | grep "^mkernel-emuprobe:" | tail -1)
    if [[ "$verdict" == *": passed"* ]]; then
      ok=$((ok + 1))
    else
      echo "$name: ${verdict:-no verdict (crash or timeout)}" | cut -c1-240 >>"${OUT:-/tmp}/emuprobe-failures.txt"
    fi
  done
  printf '%-30s %s of %s\n' "$name" "$ok" "$runs" | tee -a "${OUT:-/tmp}/stall-matrix.txt"
done <<'EOF'
default (nccl-tests -t 4)|--ranks 4 --coll broadcast --init group --alloc nccl
buffers by cudaMalloc|--ranks 4 --coll broadcast --init group --alloc cuda
comms by ncclCommInitAll|--ranks 4 --coll broadcast --init all --alloc nccl
comms by each thread (-p 1)|--ranks 4 --coll broadcast --init threads --alloc nccl
allreduce|--ranks 4 --coll allreduce --init group --alloc nccl
data set-up on legacy stream|--ranks 4 --coll broadcast --init group --alloc nccl --data-init
8 ranks|--ranks 8 --coll broadcast --init group --alloc nccl
2 ranks|--ranks 2 --coll broadcast --init group --alloc nccl
VMM mapped by the probe (cumem)|--ranks 4 --coll broadcast --init group --alloc cumem
device sync after the buffers|--ranks 4 --coll broadcast --init group --alloc nccl --sync-after-alloc
each rank's stream flushed|--ranks 4 --coll broadcast --init group --alloc nccl --flush
ncclCommInitAll, cudaMalloc|--ranks 4 --coll broadcast --init all --alloc cuda
VMM + GPUDirect RDMA (cumem-gdr)|--ranks 4 --coll broadcast --init group --alloc cumem-gdr
NCCL_CUMEM_ENABLE=0 (ncclMemAlloc: cudaMalloc)|--ranks 4 --coll broadcast --init group --alloc nccl --setenv NCCL_CUMEM_ENABLE=0
CUDA_MODULE_LOADING=LAZY|--ranks 4 --coll broadcast --init group --alloc nccl --setenv CUDA_MODULE_LOADING=LAZY
EOF
head -12 "${OUT:-/tmp}/emuprobe-failures.txt"
fi

if want 3; then
echo "== 3. emulated broadcast_perf -t 4, first collective ($(date +%T))"
printf '%-34s %s\n' variant passed | tee "${OUT:-/tmp}/stall-matrix.txt"
while IFS='|' read -r name envs; do
  row "$name" || continue
  # shellcheck disable=SC2086  # envs: VAR=value words
  line=$(env $envs EMU_STACKS=0 MKERNEL_TIMEOUT_S=3 PROBE_LIMIT=10 PROBE_ALL=1 PROBE_RUNS="${MATRIX_RUNS:-6}" PROBE_THREADS=4 \
    bash "$root/scripts/emu-stall-probe.sh" 2>&1 | grep "^emu-stall-probe:")
  printf '%-34s %s\n' "$name" "${line#*: }" | tee -a "${OUT:-/tmp}/stall-matrix.txt"
  # What the launch watch said in this variant's stalled runs: why a rank's kernel did not run.
  grep -h "unfinished" "${OUT:-/tmp}/stall-probe.txt" 2>/dev/null | sed 's/^.*MKERNEL WARN [^ ]* //; s/rank [0-9]*: //' |
    sort | uniq -c | sort -rn | head -3 | tee -a "${OUT:-/tmp}/stall-matrix.txt"
done <<'EOF'
default|PROBE_TEST=broadcast_perf
nccl-tests -p 1|PROBE_PARALLEL_INIT=1
nccl-tests -c 0|PROBE_CHECK=0
MKERNEL_LAUNCH_STREAM=own|MKERNEL_LAUNCH_STREAM=own
CUDA_DEVICE_MAX_CONNECTIONS=8|CUDA_DEVICE_MAX_CONNECTIONS=8
MKERNEL_LAUNCH_MAX_BYTES=0|MKERNEL_LAUNCH_MAX_BYTES=0
MKERNEL_LAUNCH_WATCH=off|MKERNEL_LAUNCH_WATCH=off
all_reduce_perf|PROBE_TEST=all_reduce_perf
EOF
fi

if [ "${MATRIX_SHARED_CUDART:-0}" = 1 ]; then
  # libmkernel.so on the application's libcudart.so (one runtime instance in the process, as in
  # the probe's own runs) instead of its static copy.
  echo "== 3b. libmkernel.so with the shared CUDA runtime ($(date +%T))"
  if ! { cmake -S "$root" -B "$build-shared" -DCMAKE_BUILD_TYPE=Release -DMKERNEL_DEVICE_CODE=ON -DMKERNEL_CUDART=shared \
    -DMKERNEL_BUILD_TESTS=OFF >/dev/null 2>&1 && make -C "$build-shared" -j"${MATRIX_JOBS:-32}" mkernel >/dev/null 2>&1; }; then
    echo "shared-runtime build failed"
    exit 1
  fi
  line=$(PROBE_LIB="$build-shared/lib/libmkernel.so" EMU_STACKS=0 MKERNEL_TIMEOUT_S=3 PROBE_LIMIT=10 PROBE_ALL=1 \
    PROBE_RUNS="${MATRIX_RUNS:-6}" PROBE_THREADS=4 bash "$root/scripts/emu-stall-probe.sh" 2>&1 | grep "^emu-stall-probe:")
  printf '%-34s %s\n' "MKERNEL_CUDART=shared" "${line#*: }" | tee -a "${OUT:-/tmp}/stall-matrix.txt"
fi

if [ "${MATRIX_GDB:-1}" = 1 ]; then
  echo "== 4. one stalled default run under cuda-gdb ($(date +%T))"
  MKERNEL_TIMEOUT_S=60 PROBE_LIMIT=8 PROBE_RUNS=4 PROBE_THREADS=4 bash "$root/scripts/emu-stall-probe.sh" 2>&1 | tail -30
fi
