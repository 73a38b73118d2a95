#!/usr/bin/env bash
# The split-communicator stall (docs/RELIABILITY.md, sessions 9, 32, 33) on a GPU, in one device call:
#   1. mkernel-freeprobe: which CUDA calls of one thread wait while another thread's free waits
#      for a kernel that waits for the host (the mechanism);
#   2. test_shim_emulate's "half posted" case with MKERNEL_DEFER_FREES=0 (the frees at release, as
#      before session 33): must fail, after MKERNEL_TIMEOUT_S=5; then with the default: must pass;
#   2b. the same for the application's memory: the hidden control case (a cudaFree while a peer's
#      collective is half posted) must fail after MKERNEL_TIMEOUT_S=5; the ncclMemFree case must pass;
#   2c. process ranks (session 36): test_gpu_procs --release-half-posted, the release of a
#      process-rank communicator while another communicator's collective is half posted, with
#      MKERNEL_PEER_IPC=legacy (cudaIpcCloseMemHandle at release): must fail; by default (cuMem
#      mappings, unmapped without waiting): must pass, REL_RUNS times (default 5);
#   3. scripts/case-loop.sh over the whole binary, RUNS times (default 200; 1 failure in ~200
#      before the fix, session 33 call 1), within LOOP_LIMIT_S seconds in all (default 240);
#   4. ctest -L gpu -R "$CTEST_R" (default: the shim's and the process ranks' GPU tests).
# Prints a short table at the end; each row is also printed, and written to summary.md (saved to
# $OUT), as soon as its step ends, so that a call cut short keeps what it ran. Env: RUNS,
# LOOP_LIMIT_S, CTEST_R, SKIP_BUILD=1, EXTRA_TARGETS (more targets to build, for CTEST_R),
# BUDGET_S (seconds for the whole script: the loop and ctest get what is left, the loop at most
# LOOP_LIMIT_S; session 34's call lost its ctest rows to an outer timeout).
set -u -o pipefail
build=${BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build-gpu}
logs=$build/logs-stall
. "$(dirname "$0")/gpu-common.sh"
. "$root/scripts/common.sh"  # mk_catch_spec
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
deadline=$(( $(date +%s) + ${BUDGET_S:-100000} ))
# bound N: N seconds, or what is left of BUDGET_S if less (at least 1).
bound() { local n=$1 l=$(( deadline - $(date +%s) )); [ "$l" -lt "$n" ] && n=$l; [ "$n" -lt 1 ] && n=1; echo "$n"; }
summary=$logs/summary.md
printf '| check | result |\n|---|---|\n' >"$summary"
row() { echo "| $1 | $2 |" | tee -a "$summary"; save summary.md; }

step build
s=$(date +%s)
[ "${SKIP_BUILD:-0}" = 1 ] || gpu_build 16 mkernel test_shim_emulate test_shim_gpu test_shim_api test_gpu_procs mkernel-freeprobe ${EXTRA_TARGETS:-}
echo "build: $(( $(date +%s) - s )) s"
bin=$build/tests/shim/test_shim_emulate
case="emulate: destroying one communicator while another's collective is half posted"
spec=$(mk_catch_spec "$case")

step freeprobe
timeout 120 "$build/bin/mkernel-freeprobe" --blockers none,cudaFree,cudaFreeHost,cudaFreeAsync,cuMemRelease,cudaIpcCloseMemHandle,cudaDeviceSynchronize \
  --victims none,cudaMalloc,launch,eventRecord >"$logs/freeprobe.txt" 2>&1
probe_rc=$?
grep -v "^#   " "$logs/freeprobe.txt"
row mkernel-freeprobe "rc $probe_rc, $(grep -c WAITS "$logs/freeprobe.txt") pairs where the victim waited"

# one_case NAME fail|pass TIMEOUT_S SPEC LOG [VAR=value...]: one case of $bin with MKERNEL_TIMEOUT_S
# and the variables given; its row says whether it failed or passed as it must (cases_ok=0 if not).
cases_ok=1
one_case() {
  local name=$1 must=$2 t=$3 spec=$4 log=$logs/$5 s rc want
  shift 5
  step "$name (must $must)"
  s=$(date +%s)
  if [ "$spec" = "--procs" ]; then  # test_gpu_procs --release-half-posted (it sets its own timeout)
    env "$@" timeout 90 "$build/tests/gpu/test_gpu_procs" --ranks 2 --release-half-posted >"$log" 2>&1
  else
    env "$@" MKERNEL_TIMEOUT_S="$t" timeout 90 "$bin" "$spec" >"$log" 2>&1
  fi
  rc=$?
  if [ "$must" = fail ]; then
    grep -m3 -E "timed out|FAILED|waited" "$log" | cut -c1-240
    want="non-zero"
    [ "$rc" != 0 ] || cases_ok=0
  else
    tail -3 "$log"
    want="0"
    [ "$rc" = 0 ] || cases_ok=0
  fi
  row "$name" "rc $rc in $(( $(date +%s) - s )) s (must be $want)"
}
one_case "half-posted case, MKERNEL_DEFER_FREES=0" fail 5 "$spec" old-frees.log MKERNEL_DEFER_FREES=0
one_case "half-posted case, default" pass 30 "$spec" new-frees.log
one_case "control: cudaFree while half posted" fail 5 "[freecontrol]" free-control.log
one_case "ncclMemFree while half posted" pass 30 \
  "$(mk_catch_spec "emulate: ncclMemFree while another rank's collective is half posted")" memfree.log

one_case "process ranks: release while half posted, MKERNEL_PEER_IPC=legacy" fail 5 --procs procs-legacy.log \
  MKERNEL_PEER_IPC=legacy
grep -h "release of the process-rank" "$logs/procs-legacy.log" | cut -c1-240
for i in $(seq 1 "${REL_RUNS:-5}"); do
  one_case "process ranks: release while half posted, default (run $i)" pass 5 --procs "procs-cumem-$i.log" MKERNEL_DEBUG=INFO \
    MKERNEL_DEBUG_SUBSYS=INIT
  grep -h -E "release of the process-rank|through cuMem|legacy CUDA IPC" "$logs/procs-cumem-$i.log" | sort -u | cut -c1-240 | head -4
done

step "case-loop ALL ${RUNS:-200}"
MKERNEL_DEBUG=INFO MKERNEL_DEBUG_SUBSYS=INIT CASE_LOOP_KEEP=2 CASE_LOOP_LOGS=$logs/loop \
  timeout "$(bound "${LOOP_LIMIT_S:-240}")" bash "$root/scripts/case-loop.sh" "$bin" ALL "${RUNS:-200}" 60 >"$logs/loop.txt" 2>&1
loop_rc=$?
loop_pass=$(grep -c "^run .*: passed" "$logs/loop.txt")
loop_runs=$(grep -c "^run " "$logs/loop.txt")
grep -v "passed" "$logs/loop.txt" | tail -8
row "test_shim_emulate, whole binary, repeated" "$loop_pass of $loop_runs runs passed (rc $loop_rc)"

step "ctest -R ${CTEST_R:-test_shim|test_gpu_procs}"
(cd "$build" && MKERNEL_TIMEOUT_S=30 NCCL_NVLS_ENABLE=0 timeout "$(bound 300)" ctest -L gpu -R "${CTEST_R:-test_shim|test_gpu_procs}" --output-on-failure --timeout 240) \
  >"$logs/ctest.log" 2>&1
ctest_rc=$?
grep -E "Test +#|tests passed|tests failed" "$logs/ctest.log"
row "ctest -R ${CTEST_R:-test_shim|test_gpu_procs}" "rc $ctest_rc: $(grep -E "tests passed|tests failed" "$logs/ctest.log" | head -1)"
save freeprobe.txt ctest.log loop.txt free-control.log memfree.log procs-legacy.log procs-cumem-1.log

echo "== summary"
cat "$summary"
[ "$cases_ok" = 1 ] && [ "$loop_runs" -gt 0 ] && [ "$loop_pass" = "$loop_runs" ] && [ "$ctest_rc" = 0 ]
