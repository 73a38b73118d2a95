#!/usr/bin/env bash
# Issue 7's emulation runs: the patched nccl-tests with several thread ranks on ONE GPU
# (`-g 1 -t N`, MKERNEL_EMULATE=1, LD_PRELOAD=libmkernel.so), data check on (`-c 1`).
#   bash scripts/emulated-nccl-tests.sh [BUILD]     (BUILD: a build dir holding lib/libmkernel.so
#   and nccl-tests/*_perf, as `scripts/gpu-check.sh launch` leaves it; default build-gpu)
# EMU_THREADS (default "2 4 8"), EMU_TESTS (the five), EMU_ARGS (default "-b 8 -e 64M -f 8"),
# EMU_MODULE_LOADING (default EAGER),
# EMU_TIMEOUT per run (default 40 s; MKERNEL_TIMEOUT_S=10). One line per run: rc, nccl-tests'
# "Out of bounds values" verdict, the sizes whose path column is not `mk`, and the average bus
# bandwidth; the logs of each -t go to $OUT/emulated-t<N>.txt when $OUT is set. A run still going
# at its limit gets its host threads' stacks dumped (cuda-gdb) into that log before it is killed.
set -u -o pipefail
EMU_DEFAULT_TIMEOUT_S=10
# shellcheck source=scripts/common.sh
. "$(dirname "$0")/common.sh"
mk_emu_env "$@"
fail=0
for t in ${EMU_THREADS:-2 4 8}; do
  log=${OUT:-/tmp}/emulated-t$t.txt
  : >"$log"
  for x in ${EMU_TESTS:-all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf}; do
    # Line-buffered: a run stopped by the timeout still shows its last lines (nccl-tests prints
    # its errors to stdout, which a pipe would otherwise hold back and the kill would drop).
    tmp=$(mktemp /tmp/emu.XXXXXX)
    # shellcheck disable=SC2086  # EMU_ARGS: words
    run_test "${EMU_TIMEOUT:-40}" "$tmp" env LD_PRELOAD="$build/lib/libmkernel.so" stdbuf -oL -eL \
      "$build/nccl-tests/$x" ${EMU_ARGS:--b 8 -e 64M -f 8} -g 1 -t "$t" -c 1
    rc=$?
    out=$(cat "$tmp")
    printf '%s\n' "== $x -t $t (rc=$rc)" "$out" >>"$log"
    if [ -s "$tmp.stacks" ]; then
      # The frames of mkernel, NCCL and CUDA calls first: where each thread waits.
      { echo "== host stacks of $x -t $t after ${EMU_TIMEOUT:-40} s (cuda-gdb)"; cat "$tmp.stacks"; } >>"$log"
      echo "-t $t $x: stopped; host stacks in $(basename "$log"); frames in mkernel / NCCL / CUDA calls:"
      grep -E "^#[0-9]+ .*(mkernel|nccl|cuda|cu[A-Z][a-zA-Z]+|pthread_barrier|Barrier)" "$tmp.stacks" | cut -c1-160 | head -12
    fi
    rm -f "$tmp" "$tmp.stacks"
    verdict=$(printf '%s\n' "$out" | grep -m1 "Out of bounds values" | sed 's/^# *//')
    # Data rows: the path column (the patch's last field) must read mk on every size.
    notmk=$(printf '%s\n' "$out" | awk '/^ +[0-9]+ +[0-9]+ /{ if ($1 != 0 && $NF != "mk") printf "%s ", $1 }')
    avg=$(printf '%s\n' "$out" | grep -m1 "Avg bus bandwidth" | sed 's/^# *//')
    echo "-t $t $x: rc=$rc; ${verdict:-no verdict}; path not mk at: ${notmk:-none}; ${avg:-no average}"
    # A run that stopped: what the launch watch (MKERNEL_LAUNCH_WATCH) said about its ranks.
    if [ "$rc" != 0 ]; then
      printf '%s\n' "$out" | grep "unfinished" | sed 's/^.*MKERNEL WARN [^ ]* /    watch: /' | cut -c1-200 | head -8
    fi
    { [ "$rc" = 0 ] && [[ "$verdict" == *": 0 OK"* ]] && [ -z "$notmk" ]; } || fail=1
  done
done
echo "emulated-nccl-tests: fail=$fail"
exit "$fail"
