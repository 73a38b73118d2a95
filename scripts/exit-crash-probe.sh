#!/usr/bin/env bash
# Issue 7's exit crash (an emulated nccl-tests run that prints its results, then dies with SIGSEGV
# at exit, rc 139): runs the runs that showed it in a loop with core dumps on, and prints each
# core's stacks (cuda-gdb on the core: every host thread, 24 frames). One device call:
#   bash scripts/exit-crash-probe.sh        (repository root; carry .carry: nccl-tests)
# XP_RUNS ("test:threads ...", default the three that crashed in session 11), XP_ROUNDS (default
# 8), XP_BUDGET_S (default 300: no new round after that), XP_MAX_CORES (default 2: stop after that
# many), XP_BUILD_TYPE (default RelWithDebInfo: line numbers in the stacks; a build of its own,
# build-xp). Each run: -b 8 -e 64M -f 8 -g 1 -t N -c 1 under LD_PRELOAD, as
# scripts/emulated-nccl-tests.sh runs it. Ends with a line per run (rc) and the count of crashes.
set -u -o pipefail
build=${XP_BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build-xp}
logs=$build/logs-xp
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"
RUNS=${XP_RUNS:-"reduce_perf:4 all_reduce_perf:8 reduce_scatter_perf:8"}
TESTS=$(for r in $RUNS; do echo "${r%%:*}"; done | sort -u | tr '\n' ' ')

step "build (${XP_BUILD_TYPE:-RelWithDebInfo}, $NG GPU(s))"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${XP_BUILD_TYPE:-RelWithDebInfo}" -DMKERNEL_DEVICE_CODE=ON -DMKERNEL_BUILD_TESTS=OFF \
  >"$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; exit 1; }
make -C "$build" -j"${XP_JOBS:-16}" mkernel >"$logs/build.log" 2>&1 || { grep -m5 -A5 error "$logs/build.log"; exit 1; }
gpu_build_nccl_tests "$TESTS"

EMU_DEFAULT_TIMEOUT_S=10
# shellcheck source=scripts/emu-common.sh
. "$root/scripts/emu-common.sh" "$build"
gdb=$(command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)
cores=/tmp/xp-cores
rm -rf "$cores" && mkdir -p "$cores"
# Core files land in $cores (the pattern is the machine's; this is a throwaway device machine).
echo "$cores/core.%p" >/proc/sys/kernel/core_pattern 2>/dev/null || echo "core_pattern not writable: $(cat /proc/sys/kernel/core_pattern)"
ulimit -c unlimited
t_end=$(( $(date +%s) + ${XP_BUDGET_S:-300} ))
crashes=0 total=0
: >"$logs/runs.txt"
: >"$logs/stacks.txt"
step "runs: $RUNS, ${XP_ROUNDS:-8} rounds"
for round in $(seq 1 "${XP_ROUNDS:-8}"); do
  [ "$(date +%s)" -lt "$t_end" ] || { echo "budget spent after $((round - 1)) rounds"; break; }
  for r in $RUNS; do
    t=${r%%:*} n=${r##*:}
    out=$logs/run-$round-$t-$n.txt
    t0=$(date +%s%N)
    EMU_STACKS=0 run_test 40 "$out" env LD_PRELOAD="$build/lib/libmkernel.so" \
      "$build/nccl-tests/$t" -b 8 -e 64M -f 8 -g 1 -t "$n" -c 1
    rc=$?
    total=$((total + 1))
    line="round $round $t -t $n: rc=$rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms, $(grep -c "Out of bounds values : 0 OK" "$out") OK verdict(s)"
    echo "$line" | tee -a "$logs/runs.txt"
    if [ "$rc" != 0 ]; then
      crashes=$((crashes + 1))
      core=$(ls -t "$cores"/core.* 2>/dev/null | head -1)
      tail -5 "$out" | sed 's/^/    /'
      if [ -n "$core" ] && [ -n "$gdb" ]; then
        {
          echo "== $line; core $core"
          timeout 180 "$gdb" -batch -ex "info threads" -ex "thread apply all bt 24" "$build/nccl-tests/$t" "$core" 2>&1 |
            grep -v -E "^\[New LWP|^warning: |^$"
        } >>"$logs/stacks.txt"
        rm -f "$core"
      fi
      [ "$crashes" -ge "${XP_MAX_CORES:-2}" ] && break 2
    fi
  done
done
echo "exit-crash-probe: $crashes of $total runs failed"
if [ -s "$logs/stacks.txt" ]; then
  # The crashing thread first: cuda-gdb marks it with '*' in "info threads" and prints its stack
  # under "Program terminated".
  grep -A30 "Program terminated" "$logs/stacks.txt" | head -60
fi
[ -n "${OUT:-}" ] && cp "$logs/runs.txt" "$logs/stacks.txt" "$OUT/"
[ "$crashes" = 0 ]
