#!/usr/bin/env bash
# Issue 7's emulation runs: the patched nccl-tests with several thread ranks on ONE GPU
# (`-g 1 -t N`, MKERNEL_EMULATE=1, LD_PRELOAD=libmkernel.so), data check on (`-c 1`).
#   bash scripts/emulated-nccl-tests.sh [BUILD]     (BUILD: a build dir holding lib/libmkernel.so
#   and nccl-tests/*_perf, as `scripts/gpu-check.sh launch` leaves it; default build-gpu)
# EMU_THREADS (default "2 4 8"), EMU_TESTS (the five), EMU_ARGS (default "-b 8 -e 64M -f 8"),
# EMU_MODULE_LOADING (default EAGER),
# EMU_TIMEOUT per run (default 40 s; MKERNEL_TIMEOUT_S=10). One line per run, from nccl-tests'
# JSON output (-J): rc, the "Out of bounds values" verdict, the sizes whose path is not `mk`, and
# the average bus bandwidth; the logs of each -t go to $OUT/emulated-t<N>.txt when $OUT is set. A
# run still going at its limit gets its host threads' stacks dumped (cuda-gdb) into that log
# before it is killed.
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
      "$build/nccl-tests/$x" ${EMU_ARGS:--b 8 -e 64M -f 8} -g 1 -t "$t" -c 1 -J "$tmp.json"
    rc=$?
    out=$(cat "$tmp")
    printf '%s\n' "== $x -t $t (rc=$rc)" "$out" >>"$log"
    if [ -s "$tmp.stacks" ]; then
      # The frames of mkernel, NCCL and CUDA calls first: where each thread waits.
      { echo "== host stacks of $x -t $t after ${EMU_TIMEOUT:-40} s (cuda-gdb)"; cat "$tmp.stacks"; } >>"$log"
      echo "-t $t $x: stopped; host stacks in $(basename "$log"); frames in mkernel / NCCL / CUDA calls:"
      grep -E "^#[0-9]+ .*(mkernel|nccl|cuda|cu[A-Z][a-zA-Z]+|pthread_barrier|Barrier)" "$tmp.stacks" | cut -c1-160 | head -12
    fi
    # nccl-tests' JSON (-J): the verdict, the sizes whose path (the patch's "path" key) is not mk,
    # and the average bus bandwidth; a run that wrote none (stopped early) gives empty fields.
    fields=$(python3 - "$tmp.json" <<'PY' 2>/dev/null
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit(0)
oob = doc.get("out_of_bounds") or {}
avg = doc.get("average_bus_bandwidth") or {}
notmk = " ".join(str(r["size"]) for r in doc.get("results", []) if r.get("size") and r.get("path") != "mk")
print("Out of bounds values : %d %s" % (oob["count"], "OK" if oob.get("okay") else "FAILED") if "count" in oob else "")
print(notmk)
print("Avg bus bandwidth    : %g" % avg["bandwidth"] if "bandwidth" in avg else "")
PY
)
    rm -f "$tmp" "$tmp.stacks" "$tmp.json"
    verdict=$(sed -n 1p <<<"$fields")
    notmk=$(sed -n 2p <<<"$fields")
    avg=$(sed -n 3p <<<"$fields")
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
