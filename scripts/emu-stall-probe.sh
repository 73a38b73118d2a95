#!/usr/bin/env bash
# Repeats one short emulated nccl-tests run (several thread ranks on one GPU, LD_PRELOAD) until
# it stalls, then shows what the GPU and every host thread are doing (cuda-gdb, batch attach):
# the kernels resident on the device with their blocks, and each thread's stack. For the stall
# of docs/RELIABILITY.md ("patched nccl-tests with several thread ranks on one GPU stall").
#   bash scripts/emu-stall-probe.sh [BUILD]      (BUILD as scripts/emulated-nccl-tests.sh)
# PROBE_TEST (broadcast_perf), PROBE_THREADS (2), PROBE_ARGS ("-b 8 -e 8 -w 1 -n 1"), PROBE_CHECK (nccl-tests -c: 1),
# PROBE_LIB (the libmkernel.so to preload; default BUILD's), PROBE_PARALLEL_INIT (0: nccl-tests' main thread makes every rank's comm in one group; 1: each
# rank thread makes its own, nccl-tests -p 1), PROBE_RUNS (30), PROBE_LIMIT seconds per run (10; MKERNEL_TIMEOUT_S defaults to 60 so that the
# stall is still in place when the debugger attaches). Prints one line per run and, at the first
# stall, the debugger's report; the log goes to $OUT/stall-probe.txt when $OUT is set.
set -u -o pipefail
EMU_DEFAULT_TIMEOUT_S=60
# shellcheck source=scripts/emu-common.sh
. "$(dirname "$0")/emu-common.sh"
test=${PROBE_TEST:-broadcast_perf}
log=${OUT:-/tmp}/stall-probe.txt
mkdir -p "${OUT:-/tmp}"
: >"$log"
stalls=0 ok=0
for ((run = 1; run <= ${PROBE_RUNS:-30}; ++run)); do
  tmp=$(mktemp /tmp/probe.XXXXXX)
  t0=$(date +%s%N)
  # shellcheck disable=SC2086  # PROBE_ARGS: words
  run_test "${PROBE_LIMIT:-10}" "$tmp" env LD_PRELOAD="${PROBE_LIB:-$build/lib/libmkernel.so}" stdbuf -oL -eL \
    "$build/nccl-tests/$test" ${PROBE_ARGS:--b 8 -e 8 -w 1 -n 1} -c "${PROBE_CHECK:-1}" -p "${PROBE_PARALLEL_INIT:-0}" -g 1 \
    -t "${PROBE_THREADS:-2}"
  rc=$?
  if [ "$rc" = 124 ]; then
    stalls=$((stalls + 1))
    echo "run $run: stalled after ${PROBE_LIMIT:-10} s" | tee -a "$log"
    { echo "== run $run output"; cat "$tmp"; echo "== cuda-gdb"; cat "$tmp.stacks" 2>/dev/null; } >>"$log"
    rm -f "$tmp" "$tmp.stacks"
    [ "${PROBE_ALL:-0}" = 1 ] || break
    continue
  fi
  echo "run $run: rc=$rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$log"
  [ "$rc" = 0 ] && ok=$((ok + 1))
  [ "$rc" = 0 ] || cat "$tmp" >>"$log"
  rm -f "$tmp"
done
runs=$((run > ${PROBE_RUNS:-30} ? ${PROBE_RUNS:-30} : run))
echo "emu-stall-probe: $test -t ${PROBE_THREADS:-2}: $ok of $runs run(s) passed, $stalls stalled past ${PROBE_LIMIT:-10} s"
# The debugger's view: resident kernels and blocks, then the frames in CUDA / mkernel / nccl-tests calls.
sed -n '/== cuda-gdb/,$p' "$log" | grep -E "^ *[*]? *[0-9]+ +[0-9]+ +[0-9]+|Kernel|kernel|grid|^#[0-9]+ .*(mkernel|nccl|cuda|cu[A-Z][a-zA-Z]+|Test|Coll)" |
  cut -c1-200 | head -60
[ "$ok" = "$runs" ]
