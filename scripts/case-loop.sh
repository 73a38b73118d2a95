#!/usr/bin/env bash
# Runs one Catch2 test case of a test binary N times, each under a time limit, to measure how
# often an intermittent failure happens and to keep the whole output of every failing run:
#   bash scripts/case-loop.sh BINARY "CASE NAME" [RUNS] [LIMIT_S]
# (RUNS 20, LIMIT_S 90.) The case name is escaped for Catch2 (, [ and \); "ALL" runs every case
# of the binary in its own order (--order lex, as ctest), where earlier cases may matter. Every run's output goes
# to $CASE_LOOP_LOGS (default /tmp/case-loop), failing runs' copied to $OUT when it is set
# (at most CASE_LOOP_KEEP, default 4, as the device tool brings back few files). Env is passed
# through (MKERNEL_DEBUG=INFO for the communicators' setup lines); CUDA_DEVICE_MAX_CONNECTIONS and
# MKERNEL_TIMEOUT_S default to gpu-check.sh's 32 and 30 (session 32's calls 3-4 ran before this
# default, with CUDA's 8 queues and MKERNEL_TIMEOUT_S=10). Prints a line per run (result,
# seconds, the first failure line) and a summary; exit status: the number of failing runs.
set -u -o pipefail
. "$(dirname "$0")/common.sh"  # mk_catch_spec
# As gpu-check.sh runs the GPU tier (the environment of session 32's one failure of
# test_shim_emulate): 32 hardware queues, GPU waits bounded at 30 s, NVLink multicast off.
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
export MKERNEL_TIMEOUT_S=${MKERNEL_TIMEOUT_S:-30}
export NCCL_NVLS_ENABLE=0
bin=$1
name=$2
runs=${3:-20}
limit=${4:-90}
[ -x "$bin" ] || { echo "case-loop: $bin is not an executable"; exit 1; }
logs=${CASE_LOOP_LOGS:-/tmp/case-loop}
mkdir -p "$logs"
if [ "$name" = ALL ]; then
  spec=(--order lex)
else
  spec=("$(mk_catch_spec "$name")")
  listed=$("$bin" --list-test-names-only "${spec[0]}" 2>/dev/null)  # (Catch2 exits with the count)
  grep -qxF -- "$name" <<<"$listed" || { echo "case-loop: no case named '$name' in $bin"; exit 1; }
fi
bad=0 kept=0 total=0
for i in $(seq 1 "$runs"); do
  t0=$(date +%s.%N)
  timeout "$limit" "$bin" "${spec[@]}" >"$logs/run-$i.log" 2>&1
  rc=$?
  t=$(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }")
  total=$(awk "BEGIN { print $total + $t }")
  case $rc in
    0) res=passed ;;
    124|137) res=TIMEOUT ;;
    *) res="FAIL($rc)" ;;
  esac
  first=""
  if [ "$rc" != 0 ]; then
    bad=$((bad + 1))
    first=$(grep -m1 -E "timed out|FAILED|error" "$logs/run-$i.log" | cut -c1-200)
    if [ -n "${OUT:-}" ] && [ "$kept" -lt "${CASE_LOOP_KEEP:-4}" ]; then
      cp "$logs/run-$i.log" "$OUT/case-loop-run-$i.log"
      kept=$((kept + 1))
    fi
  fi
  printf 'run %3d: %-9s %6s s  %s\n' "$i" "$res" "$t" "$first"
done
echo "case-loop: $(basename "$bin") \"$name\": $((runs - bad)) of $runs passed, $bad failed ($total s in all; logs in $logs)"
exit $(( bad > 255 ? 255 : bad ))
