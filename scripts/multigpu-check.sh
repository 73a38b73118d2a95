#!/usr/bin/env bash
# Issue 9 (multi-GPU runs, mkernel against NCCL) in one device call:
#   bash scripts/multigpu-check.sh            (repository root; carry .carry and the nccl-tests
#                                              checkout, NCCL_TESTS_DIR, default .carry/nccl-tests)
# NVLink multicast stays off everywhere (NCCL, PyTorch symmetric memory, NVSHMEM).
#   1. nccl-tests all_reduce/all_gather/reduce_scatter/broadcast/reduce, -b 8 -e MG_MAX_BYTES -f 2
#      -c 1 -g <GPUs>: NCCL alone, then LD_PRELOAD=libmkernel.so; a table per test (time, busbw,
#      speedup, #wrong of both runs: scripts/nccl-tests-table.py).
#   2. (2+ GPUs) all_reduce over the net path between GPUs of this host (NCCL_P2P_DISABLE=1
#      NCCL_SHM_DISABLE=1, NCCL_TUNER_PLUGIN=none): NCCL's Socket transport against
#      NCCL_NET_PLUGIN=mkernel (TCP); then mkernel's net plugin with its tuner.
#   3. (2+ GPUs) emulated nodes (MKERNEL_EMULATE=1 MKERNEL_RANKS_PER_NODE, default one rank per
#      GPU): mkernel's hierarchical all_reduce through proxies over loopback TCP, against run 1's
#      NCCL numbers at the sizes both runs have (first run in session 7).
#   4. The DDP example with <GPUs> ranks, NCCL against LD_PRELOAD=libmkernel.so: loss compared
#      (--tol MG_DDP_TOL), step times printed.
# With one GPU every step runs with one rank (a dry run of the script; NCCL refuses two ranks on
# one GPU). Logs: build-gpu/logs-multi; the summary and tables are copied to $OUT when set,
# and every log as $OUT/0-multigpu-check-logs.tgz (common.sh, mk_gpu_env).
set -u -o pipefail
build=${MG_BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build-gpu}
logs=$build/logs-multi
# shellcheck source=scripts/common.sh
. "$(dirname "$0")/common.sh"
mk_gpu_env
PY=$(mk_torch_python)
MAX=${MG_MAX_BYTES:-8G}
TESTS=${MG_TESTS:-"all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf"}
fail=0

step "build (mkernel, $NG GPU(s))"
gpu_build "${MG_JOBS:-16}" mkernel mkernel-collbench
LIB=$build/lib/libmkernel.so
NETLIB=$build/lib/libnccl-net-mkernel.so

step "nccl-tests (patched) against $NCCL_HOME"
gpu_build_nccl_tests "$TESTS"
export LD_LIBRARY_PATH=$NCCL_HOME/lib:$build/lib:${LD_LIBRARY_PATH:-}

step "run 1: nccl-tests, NCCL alone against LD_PRELOAD=libmkernel.so (-g $NG)"
: >"$logs/tables.txt"
for t in $TESTS; do
  bin=$build/nccl-tests/$t
  [ -x "$bin" ] || { echo "missing $bin"; fail=1; continue; }
  args=(-b 8 -e "$MAX" -f 2 -c 1 -g "$NG")
  timeout "${MG_TEST_TIMEOUT:-240}" "$bin" "${args[@]}" >"$logs/nccl-$t.txt" 2>&1 || { echo "$t (NCCL) failed"; fail=1; }
  # mkernel's own path at every size (MG_CROSSOVER=auto: the default policy, which hands the sizes
  # where NCCL measured faster to NCCL; docs/ALGORITHMS.md rule 6b).
  MKERNEL_NCCL_CROSSOVER=${MG_CROSSOVER:-off} LD_PRELOAD=$LIB timeout "${MG_TEST_TIMEOUT:-240}" "$bin" "${args[@]}" \
    >"$logs/mk-$t.txt" 2>&1 ||
    { echo "$t (mkernel) failed"; fail=1; }
  python3 "$root/scripts/nccl-tests-table.py" "$logs/nccl-$t.txt" "$logs/mk-$t.txt" \
    --title "$t, $NG GPU(s), NCCL $(basename "$NCCL_HOME") vs mkernel" --csv "$logs/$t.csv" | tee -a "$logs/tables.txt" ||
    fail=1
done

if [ "$NG" -gt 1 ]; then
  step "run 2: the net path between this host's GPUs: NCCL Socket against NCCL_NET_PLUGIN=mkernel (TCP)"
  bin=$build/nccl-tests/all_reduce_perf
  netenv=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 MKERNEL_NET_BACKEND=tcp)
  args=(-b 8 -e "${MG_NET_MAX_BYTES:-256M}" -f 4 -c 1 -g "$NG")
  env "${netenv[@]}" NCCL_NET=Socket NCCL_TUNER_PLUGIN=none timeout 240 "$bin" "${args[@]}" >"$logs/net-socket.txt" 2>&1 || fail=1
  env "${netenv[@]}" NCCL_NET_PLUGIN="$NETLIB" NCCL_TUNER_PLUGIN=none timeout 240 "$bin" "${args[@]}" >"$logs/net-mkernel.txt" 2>&1 || fail=1
  env "${netenv[@]}" NCCL_NET_PLUGIN="$NETLIB" NCCL_TUNER_PLUGIN=mkernel timeout 240 "$bin" "${args[@]}" >"$logs/net-mkernel-tuner.txt" 2>&1 || fail=1
  # Issue 3: NCCL loads the tuner and calls its init and getCollInfo. A short run apart (logging
  # would slow the timed one) with NCCL's INIT and TUNING lines and the tuner's decisions.
  env "${netenv[@]}" NCCL_NET_PLUGIN="$NETLIB" NCCL_TUNER_PLUGIN=mkernel NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING \
    MKERNEL_DEBUG=INFO timeout 60 "$bin" -b 8 -e 16M -f 64 -n 2 -w 1 -c 1 -g "$NG" >"$logs/tuner-run.txt" 2>&1 || fail=1
  grep -i -E "tuner|TUNING" "$logs/tuner-run.txt" | head -60 >"$logs/tuner-log.txt"
  echo "tuner log: $(grep -c -i -E "tuner|TUNING" "$logs/tuner-run.txt") lines naming the tuner or TUNING; the first:"
  head -12 "$logs/tuner-log.txt" | cut -c1-300
  python3 "$root/scripts/nccl-tests-table.py" "$logs/net-socket.txt" "$logs/net-mkernel.txt" \
    --title "all_reduce over the net path: NCCL Socket vs mkernel net plugin (TCP), tuner off" | tee -a "$logs/tables.txt" || fail=1
  python3 "$root/scripts/nccl-tests-table.py" "$logs/net-mkernel.txt" "$logs/net-mkernel-tuner.txt" \
    --title "mkernel net plugin: tuner off vs NCCL_TUNER_PLUGIN=mkernel" | tee -a "$logs/tables.txt" || fail=1
else
  echo "run 2 skipped: one GPU (the net path between GPUs needs two)"
fi

if [ "$NG" -gt 1 ]; then
  # Emulated nodes: every GPU a node of MG_RANKS_PER_NODE ranks (default 1 rank per GPU), the
  # hierarchical path with proxies over TCP on loopback (emulation: no real NCCL in that process),
  # against NCCL's flat run of the same ranks from run 1.
  rpn=${MG_RANKS_PER_NODE:-1}
  step "run 3: emulated nodes of $rpn rank(s) (MKERNEL_RANKS_PER_NODE), all_reduce, against NCCL's flat run"
  bin=$build/nccl-tests/all_reduce_perf
  MKERNEL_EMULATE=1 MKERNEL_RANKS_PER_NODE=$rpn MKERNEL_SOCKET_IFNAME=lo LD_PRELOAD=$LIB timeout "${MG_TEST_TIMEOUT:-240}" \
    "$bin" -b 8 -e "${MG_HIER_MAX_BYTES:-256M}" -f 4 -c 1 -g "$NG" >"$logs/hier-all_reduce.txt" 2>&1 || { echo "run 3 failed"; fail=1; }
  # Run 1 went to MG_MAX_BYTES by factors of 2: the sizes both have.
  python3 "$root/scripts/nccl-tests-table.py" --common "$logs/nccl-all_reduce_perf.txt" "$logs/hier-all_reduce.txt" \
    --title "all_reduce: NCCL flat vs mkernel hierarchical, $NG emulated nodes" | tee -a "$logs/tables.txt" || fail=1
else
  echo "run 3 skipped: one GPU (emulated nodes across GPUs need two)"
fi

step "run 4: DDP example, $NG rank(s), NCCL against LD_PRELOAD=libmkernel.so"
if mk_have_torch "$PY"; then
  "$PY" "$root/scripts/ddp_example.py" --world-size "$NG" --backend nccl --csv "$logs/ddp-nccl.csv" \
    >"$logs/ddp-nccl.txt" 2>&1 || fail=1
  LD_PRELOAD=$LIB "$PY" "$root/scripts/ddp_example.py" --world-size "$NG" --backend nccl --csv "$logs/ddp-mk.csv" \
    >"$logs/ddp-mk.txt" 2>&1 || fail=1
  tail -n 3 "$logs/ddp-nccl.txt" "$logs/ddp-mk.txt" | tee -a "$logs/tables.txt"
  "$PY" "$root/scripts/ddp_example.py" --compare "$logs/ddp-nccl.csv" "$logs/ddp-mk.csv" --tol "${MG_DDP_TOL:-1e-3}" \
    2>&1 | tee -a "$logs/tables.txt" || fail=1
else
  echo "run 4 skipped: no PyTorch at $PY"
fi

step "summary: multigpu-check $([ $fail = 0 ] && echo passed || echo FAILED)"
if [ -n "${OUT:-}" ]; then
  cp "$logs/tables.txt" "$OUT/" 2>/dev/null
  for f in nccl-all_reduce_perf.txt mk-all_reduce_perf.txt tuner-log.txt ddp-mk.txt ddp-nccl.txt hier-all_reduce.txt; do
    [ -f "$logs/$f" ] && cp "$logs/$f" "$OUT/"
  done
fi
exit $fail
