#!/usr/bin/env bash
# The GPU machine's runs, one per device call:
#   bash scripts/gpu-check.sh [RUN]      (from the repository root)
# RUN is one of
#   tier      (the default) the GPU test tier, the AllReduce benchmark, PyTorch and the plugins;
#   launch    the launch path against NCCL (nccl-tests, mkernel-collbench, sweeps);
#   bw        bandwidth against NCCL and the emulated-node stall;
#   multigpu  multi-GPU runs, mkernel against NCCL (nccl-tests, the net plugin, DDP);
#   rail      the hierarchical AllReduce's rail exchange on emulated nodes;
#   hierfail  the hierarchical failure cases on emulated nodes, many times over;
#   procs     process ranks (CUDA IPC) through PyTorch;
#   nccl      the shim, the net plugin and the tuner against one NCCL build (a prefix argument).
# Each run's steps and settings are described above its function below. Every run keeps NVLink
# multicast off (it can take a shared host's GPUs down).
set -u -o pipefail
# shellcheck source=scripts/common.sh
. "$(dirname "$0")/common.sh"

# ---- shared by the runs ---------------------------------------------------------------------------
# nccl_plugin_check BUILD NCCL_LIB_DIR: the real NCCL in NCCL_LIB_DIR loads mkernel's net plugin and
# tuner and assigns them to a communicator, each at the newest version both sides have: the newest
# ncclNetPlugin_vN / ncclTunerPlugin_vN that libnccl.so.2 looks up (its strings) and libmkernel.so
# exports (nm -D). One rank: NCCL loads the plugins and calls init/devices/getProperties (net) and
# init (tuner), but moves no bytes through the net plugin and never asks the tuner for an
# algorithm. Logs: $logs/net-plugin.log, $logs/tuner-plugin.log; the last line says which versions
# NCCL took ("net v12, tuner v6").
nccl_plugin_check() (
  BUILD=$1
  NCCL_LIB_DIR=$2
  PROG=$BUILD/tests/plugin/nccl_one_rank
  [ -x "$PROG" ] || { echo "missing $PROG (build target nccl_one_rank)"; exit 1; }
  export LD_LIBRARY_PATH=$NCCL_LIB_DIR:$BUILD/lib:${LD_LIBRARY_PATH:-}
  rc=0
  # newest KIND (Net, Tuner): the newest version of ncclKINDPlugin_vN both libraries have.
  newest() {
    comm -12 <(grep -a -oE "nccl$1Plugin_v[0-9]+" "$NCCL_LIB_DIR/libnccl.so.2" | sort -u) \
      <(nm -D --defined-only "$BUILD/lib/libmkernel.so" | grep -oE "nccl$1Plugin_v[0-9]+$" | sort -u) |
      grep -oE '[0-9]+$' | sort -n | tail -1
  }
  echo "== NCCL_NET_PLUGIN=$BUILD/lib/libnccl-net-mkernel.so (NCCL $(ls "$NCCL_LIB_DIR"/libnccl.so.2* | head -1))"
  NCCL_NET_PLUGIN=$BUILD/lib/libnccl-net-mkernel.so NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
    "$PROG" >"$logs/net-plugin.log" 2>&1 || rc=1
  grep -E "NET/Plugin|mkernel|Using network|NCCL_NET|Assigned|MKERNEL" "$logs/net-plugin.log" | head -20
  grep -q "Assigned NET plugin mkernel" "$logs/net-plugin.log" || { echo "NET: mkernel was not assigned"; rc=1; }
  echo "== NCCL_TUNER_PLUGIN=mkernel"
  NCCL_TUNER_PLUGIN=mkernel NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING \
    "$PROG" >"$logs/tuner-plugin.log" 2>&1 || rc=1
  grep -iE "tuner|mkernel" "$logs/tuner-plugin.log" | head -20
  grep -qE "TUNER/Plugin: Using mkernel" "$logs/tuner-plugin.log" || { echo "TUNER: mkernel tuner not loaded"; rc=1; }
  net=$(sed -nE 's/.*NET\/Plugin: Loaded net plugin mkernel \(v([0-9]+)\).*/\1/p' "$logs/net-plugin.log" | tail -1)
  tuner=$(sed -nE 's/.*TUNER\/Plugin: Using mkernel \(v([0-9]+)\).*/\1/p' "$logs/tuner-plugin.log" | tail -1)
  want_net=$(newest Net) want_tuner=$(newest Tuner)
  [ -n "$net" ] && [ "$net" = "$want_net" ] || { echo "NET: NCCL took v${net:-?}, the newest both have is v${want_net:-?}"; rc=1; }
  [ -n "$tuner" ] && [ "$tuner" = "$want_tuner" ] ||
    { echo "TUNER: NCCL took v${tuner:-?}, the newest both have is v${want_tuner:-?}"; rc=1; }
  echo "nccl-plugin-check: rc=$rc (net v${net:-?}, tuner v${tuner:-?})"
  exit $rc
)

# ---- tier ----------------------------------------------------------------------------------------
# GPU tier in one call on the device machine (docs/KERNEL.md):
#   bash scripts/gpu-check.sh            (from the repository root)
# Configures with device code (sm_90), builds the GPU tests and mkernel-collbench with nvcc,
# runs `ctest -L gpu`, then the AllReduce benchmark, and prints a short table at the end.
# Logs go to build-gpu/logs; the main ones are copied to $OUT when it is set.
# Catch2 (single header) comes from .carry/ when no Catch2 package is installed.
# Env: GPU_CHECK_BENCH_ARGS (extra mkernel-collbench arguments), GPU_CHECK_SKIP_BENCH=1,
#      GPU_CHECK_SKIP_TORCH=1, GPU_CHECK_TORCH_RANKS (default 1), MK_PYTHON (common.sh,
#      mk_torch_python), GPU_CHECK_TRACE=0 (skip the kernel-trace benchmark run),
#      GPU_CHECK_SKIP_TESTS=1 (benchmarks only: a second call on a warm machine, whose build is
#      still there), GPU_CHECK_GRAPH=0 (skip the graph-residency cases test_gpu_graph* and
#      the slowest, docs/RELIABILITY.md), GPU_CHECK_CTEST_ARGS (more ctest
#      arguments: "-I 1,40" and "-I 41,200" split the tier over two calls; the numbers are
#      ctest's, `ctest -N -L gpu`), GPU_CHECK_SKIP_BUILD=1 (a warm machine whose build is there).
# The summary ends with one row per GPU test: its result and seconds (ctest's own timing).
# One device call may run 600 s at most: the default timeouts fit the build (~150 s), the tests
# and the benchmarks only when the tests pass quickly; split into two calls when in doubt.
run_tier() {
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

step configure
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMKERNEL_DEVICE_CODE=ON -DMKERNEL_BUILD_TESTS=ON "${catch_args[@]}" \
  >"$logs/configure.log" 2>&1 || { tail -40 "$logs/configure.log"; exit 1; }
step build
start=$(date +%s)
[ "${GPU_CHECK_SKIP_BUILD:-0}" = 1 ] || make -C "$build" -j"${GPU_CHECK_JOBS:-16}" test_comm_create test_coll_reduce_gpu test_dmabuf_gpu test_gpu_collectives test_gpu_kernel test_gpu_procs test_shim_gpu test_shim_emulate test_shim_api test_shim_stats_gpu \
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
  # The graph-residency cases (test_gpu_graph*, docs/KERNEL.md) take up to 45 s
  # each. GPU_CHECK_GRAPH=0 leaves them out.
  exclude=()
  [ "${GPU_CHECK_GRAPH:-1}" = 0 ] && exclude=(-E '^test_gpu_graph.*$')
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
  # NCCL's one-rank AllReduce in the same run, for comparison: PyTorch's NCCL 2.28.9.
  NCCL_LIB=${GPU_CHECK_NCCL_LIB:-$(mk_nccl_home)/lib/libnccl.so.2}
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
    # Real multi-GPU: one rank per GPU over NVLink, mkernel beside NCCL in one run.
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
PY=$(mk_torch_python)
if mk_have_torch "$PY" && [ "${GPU_CHECK_SKIP_TORCH:-0}" != 1 ]; then
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
nccl_plugin_check "$build" "$(mk_nccl_home)/lib" 2>&1 | tail -30
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
}

# ---- launch ---------------------------------------------------------------------------------------
# The launch path (docs/KERNEL.md, "Small collectives: the launch path") against NCCL, one
# device call:
#   bash scripts/gpu-check.sh launch        (repository root; carry .carry: Catch2 and nccl-tests)
#   1. builds libmkernel.so, the tools and the GPU test binaries (test_shim_gpu, test_shim_emulate,
#      test_gpu_*; sm_90), and the patched nccl-tests from .carry/nccl-tests;
#   1b. (LC_P2PBENCH=1) mkernel-p2pbench: NVLink pull / push / reduce bandwidth of CTA loops and
#      of the kernel's reduceCopy, both GPUs at once;
#   1c. (LC_LATBENCH=1) mkernel-latbench: kernel-to-kernel gaps (plain, PDL wait, PDL early; eager and
#      graphs), NVLink ping-pong, a frame-free two-GPU flag exchange per kernel (LC_LATBENCH_ARGS);
#   2. ctest LC_CTEST (default test_shim_gpu; none skips it), then test_gpu_hier LC_HIER_REPS times (default 3)
#      with MKERNEL_TIMEOUT_S=LC_HIER_TIMEOUT (default 60): pass/fail and seconds of each;
#   3. (unless LC_NCCL_RUN=0) nccl-tests LC_TESTS (default the five), -b LC_MIN_BYTES (8) -e LC_MAX_BYTES (4M)
#      -f LC_NT_FACTOR (4) -c 1 -g <GPUs>:
#      NCCL alone, mkernel (the launch path, the default) and mkernel with
#      MKERNEL_LAUNCH_MAX_BYTES=0 (everything through the persistent kernel; LC_PERSISTENT=0 skips
#      it), and once per MKERNEL_LL_MAX_BYTES value of LC_LL_SWEEP (e.g. "262144 0"; LC_LLOFF=1 adds
#      0: without the LL mode), and once per entry of LC_ENV_VARIANTS ("name:VAR=value,..."), tables per
#      test (scripts/nccl-tests-table.py: time, busbw, ratio, #wrong); LC_NT_ITERS: iterations per
#      size (nccl-tests' -n; its default 20 leaves +-3 us on small -g 2 sizes); LC_NT_PIN=1: every
#      run on GPU 0's local CPUs; LC_NT_ROUNDS=N: NCCL and the variants N times over, a table each;
#      LC_NT_MODES (any of g t gG tG, default g): -g <GPUs> (one thread drives every GPU), -t <GPUs> -g 1
#      (a thread per GPU), and either in CUDA graphs (-G LC_NT_GRAPH_LAUNCHES, default 10);
#      LC_NT_AGG=K: K collectives per iteration in one group (nccl-tests' -m; a mode followed by mK, e.g. tGm8, for that mode);
#   3b. (unless LC_COLLBENCH=0) mkernel-collbench AllReduce, NCCL / launch / memop in one process (LC_COLLBENCH_GROUP=K:
#      also groups of K, per MKERNEL_LL_BATCH in LC_COLLBENCH_BATCH, with the kernel trace): one rank up to 32 KiB
#      (and again with MKERNEL_ONE_RANK=kernel),
#      and (2+ GPUs) one rank per GPU up to LC_COLLBENCH_MAX (4194304) by factors of LC_COLLBENCH_STEP (4), again with each LC_LL_SWEEP
#      value; LC_COLLBENCH_EMU="2,4,8": thread ranks emulated on GPU 0 up to LC_EMU_LL_MAX (32 KiB),
#      once per MKERNEL_LL_MAX_BYTES of LC_EMU_LL (default "32768 0");
#   3c. (LC_OVERLAP=1) the hierarchical AllReduce's overlap: mkernel-collbench --ranks LC_OVERLAP_RANKS (4)
#      --ranks-per-node LC_OVERLAP_RPN (2) over the GPUs, MKERNEL_HIER_OVERLAP=1 against =0 (the same
#      phases one after another), to LC_OVERLAP_MAX bytes (16777216), and scripts/overlap-table.py's
#      share of the shorter phase hidden (the in-turn run's phase times; one lane: MKERNEL_HIER_CTAS=1);
#   3h. (LC_HIER_ROLES_SWEEP="off 1,1 2,1") the same, once per MKERNEL_HIER_ROLES value, with
#      MKERNEL_HIER_CTAS=LC_HIER_ROLES_CTAS (unset: its default); a table of eager medians;
#   3r. (LC_HIER_RAIL_SWEEP="direct ring rhd") the same, once per MKERNEL_HIER_RAIL value (the
#      AllReduce's exchange among the rail; LC_OVERLAP_RANKS=8 LC_OVERLAP_RPN=2 for 4 nodes), a table;
#      LC_HIER_RAIL_OVERLAP=0 runs the phases in turn instead;
#   3d. (LC_HIER_CTAS_SWEEP="1 2 4") the same hierarchical AllReduce, pipelined, once per
#      MKERNEL_HIER_CTAS value, and a table of eager medians per size (what sets its default);
#   3e. (LC_PROCLAT=1) mkernel-proclat: small AllReduces with LC_PROCLAT_RANKS (2,4,8) process ranks
#      on GPU 0 under MPS (8-rank latency without one shared CUDA context), then
#      mkernel-collbench's thread ranks on GPU 0 at the same sizes;
#   3g. (LC_EMU_BW="32 64") emulated ranks' bandwidth: LC_EMU_BW_RANKS (2) emulated ranks on GPU 0,
#      mkernel-collbench 8 B to LC_EMU_BW_MAX (1 GiB), once per MKERNEL_CTAS value or list of settings;
#   3f. (LC_PROXYBENCH=1) mkernel-proxybench: the proxy's per-chunk overhead against the bare TCP
#      net on loopback, 8 B to LC_PROXYBENCH_MAX (4194304), on this host's cores (no GPU in it);
#   4. (2+ GPUs, unless LC_TORCH=0) scripts/torch_bench.py, 2 processes (process ranks: inboxes through CUDA IPC),
#      NCCL against mkernel, 8 B to LC_TORCH_MAX_BYTES (1M);
#   5. (LC_TORCH_CHECK="<torch_check.py options>") scripts/torch_check.py, e.g. "--ranks 2,4 --gpus 2
#      --mps --ranks-per-node 2" (PyTorch emulated 2x2 through the hierarchical path);
#   6. (LC_EMULATED="2 4 8") scripts/emulated-nccl-tests.sh with those thread counts on GPU 0
#      (LC_EMU_TIMEOUT seconds per run, default 35).
# NVLink multicast stays off. Logs in build-gpu/logs-launch; tables copied to $OUT, and every log
# as $OUT/0-launch-check-logs.tgz (common.sh, mk_gpu_env).
run_launch() {
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
build=${LC_BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build-gpu}
logs=$build/logs-launch
mk_gpu_env
PY=$(mk_torch_python)
TESTS=${LC_TESTS:-"all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf"}
fail=0

step "1. build ($NG GPU(s))"
gpu_build "${LC_JOBS:-16}" mkernel mkernel-collbench mkernel-p2pbench mkernel-latbench mkernel-queueprobe mkernel-emuprobe mkernel-proclat mkernel-proxybench \
  test_shim_gpu test_shim_emulate \
  test_gpu_collectives test_gpu_kernel test_gpu_procs
gpu_build_nccl_tests "$TESTS"
LIB=$build/lib/libmkernel.so
export LD_LIBRARY_PATH=$NCCL_HOME/lib:$build/lib:${LD_LIBRARY_PATH:-}

if [ "${LC_P2PBENCH:-0}" = 1 ]; then
  step "1b. mkernel-p2pbench"
  timeout 120 "$build/bin/mkernel-p2pbench" >"$logs/p2pbench.txt" 2>&1 || fail=1
  cat "$logs/p2pbench.txt"
  save p2pbench.txt
fi

if [ "${LC_LATBENCH:-0}" = 1 ]; then
  step "1c. mkernel-latbench"
  timeout 120 "$build/bin/mkernel-latbench" ${LC_LATBENCH_ARGS:-} >"$logs/latbench.txt" 2>&1 || fail=1
  cat "$logs/latbench.txt"
  save latbench.txt
fi

CTESTS=${LC_CTEST:-'^test_shim_gpu$'}
step "2. ctest -R $CTESTS; test_gpu_hier x ${LC_HIER_REPS:-3}"
if [ "$CTESTS" = none ]; then
  echo "ctest skipped (LC_CTEST=none)" >"$logs/ctest.log"
else
  (cd "$build" && MKERNEL_TIMEOUT_S=20 ctest -R "$CTESTS" --output-on-failure --timeout "${LC_CTEST_TIMEOUT:-200}") >"$logs/ctest.log" 2>&1 ||
    fail=1
fi
grep -E "Passed|Failed|Timeout|FAILED|with expansion|==|REQUIRE|CHECK|launch path up to" "$logs/ctest.log" | head -40
: >"$logs/hier-failed.log"
for i in $(seq 1 "${LC_HIER_REPS:-3}"); do
  t0=$(date +%s%N)
  MKERNEL_TIMEOUT_S=${LC_HIER_TIMEOUT:-60} timeout 200 "$build/tests/gpu/test_gpu_collectives" --order lex "[hier]" \
    >"$logs/hier-$i.log" 2>&1
  rc=$?
  echo "test_gpu_hier run $i: rc=$rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  [ "$rc" = 0 ] || { fail=1; grep -E "timed out|FAILED|differs|no byte moved|proxy:" "$logs/hier-$i.log" | cut -c1-1500 | head -12; cat "$logs/hier-$i.log" >>"$logs/hier-failed.log"; }
done | tee "$logs/hier.txt"
grep -q "rc=[1-9]" "$logs/hier.txt" && fail=1  # the loop ran in a pipeline's subshell
save ctest.log hier.txt hier-failed.log

step "3. nccl-tests -b ${LC_MIN_BYTES:-8} -e ${LC_MAX_BYTES:-4M} -g $NG: NCCL, mkernel (launch path), mkernel (persistent kernel only)"
# mkernel's own path at every size (MKERNEL_NCCL_CROSSOVER=off: no size handed to NCCL).
variants=("launch|launch path, default|MKERNEL_NCCL_CROSSOVER=off")
# LC_LL_SWEEP="262144 0": also the launch path with each of these MKERNEL_LL_MAX_BYTES (0: without
# its LL mode, the inbox mode for small ops); LC_LLOFF=1 is LC_LL_SWEEP=0.
LL_SWEEP=${LC_LL_SWEEP:-}
[ "${LC_LLOFF:-0}" = 1 ] && LL_SWEEP="$LL_SWEEP 0"
for ll in $LL_SWEEP; do
  if [ "$ll" = 0 ]; then
    variants+=("inbox|launch path, LL mode off (MKERNEL_LL_MAX_BYTES=0)|MKERNEL_LL_MAX_BYTES=0 MKERNEL_NCCL_CROSSOVER=off")
  else
    variants+=("ll$ll|launch path, MKERNEL_LL_MAX_BYTES=$ll|MKERNEL_LL_MAX_BYTES=$ll MKERNEL_NCCL_CROSSOVER=off")
  fi
done
# LC_ENV_VARIANTS="name:VAR=value,VAR2=value ...": more mkernel variants, one per entry.
for ev in ${LC_ENV_VARIANTS:-}; do
  variants+=("${ev%%:*}|${ev#*:}|$(tr ',' ' ' <<<"${ev#*:}")")
done
[ "${LC_PERSISTENT:-1}" = 1 ] &&
  variants+=("persistent|MKERNEL_LAUNCH_MAX_BYTES=0: persistent kernel only|MKERNEL_LAUNCH_MAX_BYTES=0 MKERNEL_NCCL_CROSSOVER=off")
if [ "${LC_NCCL_RUN:-1}" = 1 ]; then
  NT_ITERS=${LC_NT_ITERS:-} NT_AGG=${LC_NT_AGG:-} NT_FACTOR=${LC_NT_FACTOR:-4} NT_PIN=${LC_NT_PIN:-0} NT_ROUNDS=${LC_NT_ROUNDS:-1} NT_MODES=${LC_NT_MODES:-g} NT_GRAPH_LAUNCHES=${LC_NT_GRAPH_LAUNCHES:-10} nccl_tests_vs "$TESTS" "${LC_MIN_BYTES:-8}" "${LC_MAX_BYTES:-4M}" 120 "${variants[@]}" || fail=1
  save tables.txt
else
  echo "skipped (LC_NCCL_RUN=0): built only"
fi

if [ "${LC_COLLBENCH:-1}" = 1 ]; then
step "3b. mkernel-collbench: NCCL, launch, memop"
NCCL_LIB=$NCCL_HOME/lib/libnccl.so.2
timeout 90 "$build/bin/mkernel-collbench" --ranks 1 --max-bytes 32768 --iters 1000 --nccl "$NCCL_LIB" \
  >"$logs/collbench.txt" 2>>"$logs/collbench.err" || fail=1
# One rank through the launch kernel instead of cudaMemcpyAsync, in the same process kind.
MKERNEL_ONE_RANK=kernel timeout 90 "$build/bin/mkernel-collbench" --ranks 1 --max-bytes 32768 --iters 1000 --wait launch \
  2>>"$logs/collbench.err" | sed 's/^/one rank, MKERNEL_ONE_RANK=kernel: /' >>"$logs/collbench.txt" || fail=1
if [ "$NG" -gt 1 ]; then
  timeout 150 "$build/bin/mkernel-collbench" --gpus "$NG" --ranks "$NG" --max-bytes "${LC_COLLBENCH_MAX:-4194304}" \
    --step "${LC_COLLBENCH_STEP:-4}" --iters 300 --nccl "$NCCL_LIB" 2>>"$logs/collbench.err" | sed 's/^/multi-gpu: /' >>"$logs/collbench.txt" || fail=1
  # LC_COLLBENCH_GROUP="K": again with each timed call a group of K AllReduces, once per
  # MKERNEL_LL_BATCH value of LC_COLLBENCH_BATCH (default "serial exchange off"), NCCL's groups too.
  if [ -n "${LC_COLLBENCH_GROUP:-}" ]; then
    for lb in ${LC_COLLBENCH_BATCH:-serial exchange off}; do
      nccl=()
      [ "$lb" = serial ] && nccl=(--nccl "$NCCL_LIB")  # NCCL's groups once
      MKERNEL_LL_BATCH=$lb timeout 150 "$build/bin/mkernel-collbench" --gpus "$NG" --ranks "$NG" --max-bytes "${LC_COLLBENCH_MAX:-4194304}" \
        --step "${LC_COLLBENCH_STEP:-4}" --iters 300 --wait launch --group "$LC_COLLBENCH_GROUP" --trace 1 \
        "${nccl[@]}" 2>>"$logs/collbench.err" |
        sed "s/^/multi-gpu, group $LC_COLLBENCH_GROUP, LL_BATCH=$lb: /" >>"$logs/collbench.txt" || fail=1
    done
  fi
  for ll in $LL_SWEEP; do
    MKERNEL_LL_MAX_BYTES=$ll timeout 150 "$build/bin/mkernel-collbench" --gpus "$NG" --ranks "$NG" --max-bytes "${LC_COLLBENCH_MAX:-4194304}" \
      --step "${LC_COLLBENCH_STEP:-4}" --iters 300 --wait launch 2>>"$logs/collbench.err" | sed "s/^/multi-gpu, LL_MAX_BYTES=$ll: /" >>"$logs/collbench.txt" || fail=1
  done
fi
if [ -n "${LC_COLLBENCH_EMU:-}" ]; then
  # Emulated thread ranks on GPU 0 (their latency), the launch path with and without LL mode.
  for ll in ${LC_EMU_LL:-32768 0}; do
    MKERNEL_EMULATE=1 MKERNEL_LL_MAX_BYTES=$ll CUDA_VISIBLE_DEVICES=0 timeout 150 "$build/bin/mkernel-collbench" \
      --ranks "$LC_COLLBENCH_EMU" --max-bytes "${LC_EMU_LL_MAX:-32768}" --step 4 --iters 1000 --wait launch 2>>"$logs/collbench.err" |
      sed "s/^/emulated, LL_MAX_BYTES=$ll: /" >>"$logs/collbench.txt" || fail=1
  done
fi
cat "$logs/collbench.txt"
save collbench.txt
fi

if [ "${LC_OVERLAP:-0}" = 1 ]; then
  step "3c. hierarchical AllReduce: MKERNEL_HIER_OVERLAP=1 against =0"
  : >"$logs/overlap.txt"
  for ov in 1 0; do
    MKERNEL_HIER_OVERLAP=$ov MKERNEL_SOCKET_IFNAME=lo MKERNEL_TIMEOUT_S=30 timeout 150 "$build/bin/mkernel-collbench" \
      --gpus "$NG" --ranks "${LC_OVERLAP_RANKS:-4}" --ranks-per-node "${LC_OVERLAP_RPN:-2}" --wait memop \
      --min-bytes 4096 --max-bytes "${LC_OVERLAP_MAX:-16777216}" --step 4 --iters "${LC_OVERLAP_ITERS:-50}" 2>&1 |
      sed "s|^|${LC_OVERLAP_RANKS:-4}:${LC_OVERLAP_RPN:-2}/${MKERNEL_HIER_RAIL:-direct}/ov$ov/r1: |" >>"$logs/overlap.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "overlap=$ov failed"; fail=1; }
  done
  cat "$logs/overlap.txt"
  # The in-turn run's phase times against the pipelined time (scripts/overlap-table.py).
  python3 "$root/scripts/overlap-table.py" "$logs/overlap.txt" | tee "$logs/overlap-table.txt"
  save overlap.txt overlap-table.txt
fi

# hier_sweep VAR PREFIX FILE VALUE...: 3c's hierarchical AllReduce (emulated nodes, pipelined
# unless SWEEP_OVERLAP=0) once per VALUE of MKERNEL_<VAR>, with SWEEP_ENV's assignments too; each
# run's lines go to FILE prefixed "PREFIX=VALUE: ". A run that fails sets fail=1.
hier_sweep() {
  local var=$1 prefix=$2 file=$3 v
  shift 3
  : >"$file"
  for v in "$@"; do
    # shellcheck disable=SC2086
    env ${SWEEP_ENV:-} "MKERNEL_$var=$v" MKERNEL_HIER_OVERLAP="${SWEEP_OVERLAP:-1}" MKERNEL_SOCKET_IFNAME=lo MKERNEL_TIMEOUT_S=30 timeout 150 \
      "$build/bin/mkernel-collbench" --gpus "$NG" --ranks "${LC_OVERLAP_RANKS:-4}" --ranks-per-node "${LC_OVERLAP_RPN:-2}" \
      --wait memop --min-bytes 4096 --max-bytes "${LC_OVERLAP_MAX:-16777216}" --step 4 --iters "${LC_OVERLAP_ITERS:-50}" 2>&1 |
      sed "s/^/$prefix=$v: /" >>"$file"
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "$prefix=$v failed"; fail=1; }
  done
}

# sweep_table LABEL FILE: the collbench runs of a sweep, each line prefixed "<name>=<value>: ", as
# one line per size with the eager median (collbench's 4th column) of each value, a column per
# value headed LABEL=value. A value that ran twice keeps its last run.
sweep_table() {
  awk -v label="$1" '$2 ~ /^(memop|launch)$/ {
         split($1, a, "="); c = a[2]; sub(":", "", c); t[$4, c] = $5
         if (!(c in seenC)) { seenC[c] = 1; cs[++nc] = c }
         if (!($4 in seenB)) { seenB[$4] = 1; bs[++nb] = $4 } }
       END { printf "%12s", "bytes"; for (j = 1; j <= nc; ++j) printf " %10s", label "=" cs[j]; print ""
             for (i = 1; i <= nb; ++i) { printf "%12s", bs[i]
               for (j = 1; j <= nc; ++j) printf " %10s", ((bs[i], cs[j]) in t) ? t[bs[i], cs[j]] : "-"; print "" } }' "$2"
}

if [ -n "${LC_HIER_CTAS_SWEEP:-}" ]; then
  # The default of MKERNEL_HIER_CTAS from a measured sweep. The same emulated nodes as
  # 3c, pipelined (MKERNEL_HIER_OVERLAP=1), once per CTA count.
  step "3d. hierarchical AllReduce: MKERNEL_HIER_CTAS in ${LC_HIER_CTAS_SWEEP}"
  # shellcheck disable=SC2086
  hier_sweep HIER_CTAS hier_ctas "$logs/hier-ctas.txt" ${LC_HIER_CTAS_SWEEP}
  sweep_table ctas "$logs/hier-ctas.txt" | tee "$logs/hier-ctas-table.txt"
  save hier-ctas.txt hier-ctas-table.txt
fi

if [ -n "${LC_HIER_ROLES_SWEEP:-}" ]; then
  # CTA roles for the pipelined hierarchical AllReduce (MKERNEL_HIER_ROLES=W,R: 1 sender,
  # W workers, R reducers per lane; off: data-parallel CTAs), the same emulated nodes as 3c, with
  # MKERNEL_HIER_CTAS=LC_HIER_ROLES_CTAS lanes (default: the variable's default), once per value.
  step "3h. hierarchical AllReduce: MKERNEL_HIER_ROLES in ${LC_HIER_ROLES_SWEEP}"
  # shellcheck disable=SC2086
  SWEEP_ENV=${LC_HIER_ROLES_CTAS:+MKERNEL_HIER_CTAS=$LC_HIER_ROLES_CTAS} \
    hier_sweep HIER_ROLES roles "$logs/hier-roles.txt" ${LC_HIER_ROLES_SWEEP}
  sweep_table roles "$logs/hier-roles.txt" | tee "$logs/hier-roles-table.txt"
  grep -E "failed|error|Error" "$logs/hier-roles.txt" | head -5
  save hier-roles.txt hier-roles-table.txt
fi

if [ -n "${LC_HIER_RAIL_SWEEP:-}" ]; then
  # The AllReduce's exchange among the rail (MKERNEL_HIER_RAIL: direct, ring, rhd), the
  # same emulated nodes as 3c (LC_OVERLAP_RANKS / LC_OVERLAP_RPN), once per value.
  step "3r. hierarchical AllReduce: MKERNEL_HIER_RAIL in ${LC_HIER_RAIL_SWEEP} (overlap ${LC_HIER_RAIL_OVERLAP:-1})"
  # shellcheck disable=SC2086
  SWEEP_OVERLAP=${LC_HIER_RAIL_OVERLAP:-1} hier_sweep HIER_RAIL rail "$logs/hier-rail.txt" ${LC_HIER_RAIL_SWEEP}
  sweep_table rail "$logs/hier-rail.txt" | tee "$logs/hier-rail-table.txt"
  grep -E "failed|error|Error" "$logs/hier-rail.txt" | head -5
  save hier-rail.txt hier-rail-table.txt
fi

if [ "${LC_PROCLAT:-0}" = 1 ]; then
  # The 8-rank latency with ranks as processes (one CUDA context each, under MPS on one GPU)
  # against the thread ranks of mkernel-collbench, which share one context.
  step "3e. mkernel-proclat: process ranks ${LC_PROCLAT_RANKS:-2,4,8} on GPU 0, 8 B to 32 KiB"
  CUDA_VISIBLE_DEVICES=0 MKERNEL_EMULATE=1 timeout 240 "$build/bin/mkernel-proclat" --ranks "${LC_PROCLAT_RANKS:-2,4,8}" \
    --iters "${LC_PROCLAT_ITERS:-1000}" --csv "$logs/proclat.csv" 2>&1 | tee "$logs/proclat.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || fail=1
  # The same sizes with thread ranks sharing GPU 0 (one CUDA context), in the same call.
  CUDA_VISIBLE_DEVICES=0 MKERNEL_EMULATE=1 timeout 240 "$build/bin/mkernel-collbench" --gpus 1 \
    --ranks "${LC_PROCLAT_RANKS:-2,4,8}" --wait launch --min-bytes 8 --max-bytes 32768 --step 4 \
    --iters "${LC_PROCLAT_ITERS:-1000}" 2>&1 | grep -v "^collbench:" | tee -a "$logs/proclat.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || fail=1
  save proclat.txt proclat.csv
fi

if [ -n "${LC_EMU_BW:-}" ]; then
  # The emulated ranks' bandwidth goal (>= 70% of the copy bandwidth from 64 MiB) with emulated ranks on
  # GPU 0, once per entry of LC_EMU_BW: a number is an MKERNEL_CTAS value (e.g. "32 64"); an entry
  # with "=" is a comma-separated list of settings (e.g. "MKERNEL_LAUNCH_CTAS=64,MKERNEL_DIRECT_MAX_BYTES=0").
  # LC_EMU_BW_RANKS (2) ranks, --wait LC_EMU_BW_WAITS (launch,memop: the default path and the
  # persistent kernel), LC_EMU_BW_MIN (8) to LC_EMU_BW_MAX (1 GiB) bytes by factors of 2. RANKS=k in an
  # entry's settings runs that entry with k ranks (e.g. "RANKS=4,MKERNEL_DIRECT_MAX_BYTES=0").
  step "3g. emulated ranks ${LC_EMU_BW_RANKS:-2} on GPU 0: ${LC_EMU_BW}"
  : >"$logs/emu-bw.txt"
  for c in ${LC_EMU_BW}; do
    case $c in
      *=*) envs=${c//,/ } ;;
      *) envs="MKERNEL_CTAS=$c" ;;
    esac
    # RANKS=k among the settings: this entry's rank count instead of LC_EMU_BW_RANKS.
    ranks=${LC_EMU_BW_RANKS:-2}
    for e in $envs; do case $e in RANKS=*) ranks=${e#RANKS=} ;; esac; done
    envs=$(for e in $envs; do case $e in RANKS=*) ;; *) printf '%s ' "$e" ;; esac; done)
    # shellcheck disable=SC2086  # envs: VAR=value words
    env $envs MKERNEL_EMULATE=1 CUDA_VISIBLE_DEVICES=0 timeout 200 "$build/bin/mkernel-collbench" --gpus 1 \
      --ranks "$ranks" --wait "${LC_EMU_BW_WAITS:-launch,memop}" --min-bytes "${LC_EMU_BW_MIN:-8}" \
      --max-bytes "${LC_EMU_BW_MAX:-1073741824}" --step 2 --iters "${LC_EMU_BW_ITERS:-200}" 2>&1 |
      sed "s/^/$c: /" >>"$logs/emu-bw.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "$c failed"; fail=1; }
  done
  cat "$logs/emu-bw.txt"
  save emu-bw.txt
fi

if [ "${LC_PROXYBENCH:-0}" = 1 ]; then
  # The proxy's per-chunk overhead, where there are cores enough for the four polling
  # threads (the 2-core CI machine's figures are mostly scheduling: docs/PERFORMANCE.md).
  step "3f. mkernel-proxybench: proxy against the bare TCP net, 8 B to ${LC_PROXYBENCH_MAX:-4194304}"
  MKERNEL_SOCKET_IFNAME=lo MKERNEL_NET_BACKEND=tcp timeout 300 "$build/bin/mkernel-proxybench" \
    --max-bytes "${LC_PROXYBENCH_MAX:-4194304}" --csv "$logs/proxybench.csv" 2>/dev/null | tee "$logs/proxybench.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || fail=1
  save proxybench.txt proxybench.csv
fi

if [ "$NG" -gt 1 ] && mk_have_torch "$PY" && [ "${LC_TORCH:-1}" = 1 ]; then
  step "4. torch_bench: 2 processes on 2 GPUs, NCCL against mkernel, 8 B to ${LC_TORCH_MAX_BYTES:-1M}"
  timeout 200 "$PY" "$root/scripts/torch_bench.py" --lib "$LIB" --ranks 2 --max-bytes "${LC_TORCH_MAX_BYTES:-1M}" \
    --iters "${LC_TORCH_ITERS:-200}" --trials 3 --csv "$logs/torch-bench.csv" 2>&1 | tee "$logs/torch-bench.txt" | tail -30
  [ "${PIPESTATUS[0]}" = 0 ] || fail=1
  save torch-bench.txt torch-bench.csv
fi
if [ -n "${LC_TORCH_CHECK:-}" ] && mk_have_torch "$PY"; then
  # e.g. LC_TORCH_CHECK="--ranks 2,4 --gpus 2 --mps --ranks-per-node 2": PyTorch correctness
  # through the shim, the emulated 4 ranks as 2 nodes of 2 (the hierarchical path).
  step "5. torch_check $LC_TORCH_CHECK"
  # shellcheck disable=SC2086
  timeout 400 "$PY" "$root/scripts/torch_check.py" --lib "$LIB" $LC_TORCH_CHECK --timeout 180 \
    >"$logs/torch-check.txt" 2>&1 || fail=1
  grep -E "^\[torch_check\]|FAIL|Error|error" "$logs/torch-check.txt" | cut -c1-600 | head -20
  save torch-check.txt
fi
if [ -n "${LC_EMULATED:-}" ]; then
  # e.g. LC_EMULATED="2 4 8": the patched nccl-tests' five tests with that many thread ranks on
  # GPU 0 (scripts/emulated-nccl-tests.sh; each run must end rc 0 with 0 wrong and mk on every row).
  step "6. emulated nccl-tests -g 1 -t ${LC_EMULATED} on GPU 0"
  EMU_THREADS="$LC_EMULATED" EMU_TIMEOUT=${LC_EMU_TIMEOUT:-35} OUT=$logs bash "$root/scripts/emulated-nccl-tests.sh" "$build" \
    2>&1 | tail -$((5 * $(wc -w <<<"$LC_EMULATED") + 2))
  [ "${PIPESTATUS[0]}" = 0 ] || fail=1
  for t in $LC_EMULATED; do save "emulated-t$t.txt"; done
fi
echo "launch-check: fail=$fail"
exit "$fail"
}

# ---- bw -------------------------------------------------------------------------------------------
# Bandwidth against NCCL and the emulated-node stall, in one device call:
#   bash scripts/gpu-check.sh bw        (repository root; carry .carry: Catch2 and nccl-tests)
#   1. builds libmkernel.so, mkernel-p2pbench, test_gpu_collectives (sm_90) and the patched
#      nccl-tests BW_TESTS (default all_reduce_perf reduce_scatter_perf all_gather_perf);
#   2. mkernel-p2pbench (2+ GPUs): NVLink pull / push / reduce of CTA loops and of reduceCopy;
#   3. ctest BW_CTEST (default test_gpu_collectives and test_gpu_persistent; "" skips);
#   4. nccl-tests BW_TESTS -b BW_MIN (1M) -e BW_MAX (1G) -f 4 -c 1 -g <GPUs>: NCCL, mkernel, and
#      with BW_STAGED=1 mkernel through the staging buffers (MKERNEL_STAGED=1: the process-rank
#      algorithm), tables by scripts/nccl-tests-table.py;
#   5. test_gpu_hier (4 thread ranks as 2 emulated nodes on GPU 0) under each of BW_HIER
#      (default "default:3"; NAME:RUNS, NAME one of default,
#      conn1 = CUDA_DEVICE_MAX_CONNECTIONS=1, conn8 = 8, resident = MKERNEL_IDLE_EXIT_US=10000000,
#      eager = CUDA_MODULE_LOADING=EAGER, eager32 = that and 32 hardware queues),
#      MKERNEL_TIMEOUT_S=BW_HIER_TIMEOUT (8): pass/fail, seconds, and the first error lines;
#   6. (2+ GPUs, BW_TORCH_MAX set, e.g. 64M) scripts/torch_bench.py, 2 processes, NCCL against
#      mkernel, 8 B to BW_TORCH_MAX.
# NVLink multicast stays off. Logs in build-gpu/logs-bw; at most eight files copied to $OUT, and
# every log as $OUT/0-bw-check-logs.tgz (common.sh, mk_gpu_env).
run_bw() {
build=${BW_BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build-gpu}
logs=$build/logs-bw
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

step "5. test_gpu_hier: ${BW_HIER:-default:3}"
: >"$logs/hier.txt"
for spec in ${BW_HIER:-default:3}; do
  mode=${spec%%:*}
  runs=${spec##*:}
  case $mode in
    default) env=() ;;
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
}

# ---- multigpu -------------------------------------------------------------------------------------
# Multi-GPU runs, mkernel against NCCL, in one device call:
#   bash scripts/gpu-check.sh multigpu            (repository root; carry .carry and the nccl-tests
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
#      NCCL numbers at the sizes both runs have.
#   4. The DDP example with <GPUs> ranks, NCCL against LD_PRELOAD=libmkernel.so: loss compared
#      (--tol MG_DDP_TOL), step times printed.
# With one GPU every step runs with one rank (a dry run of the script; NCCL refuses two ranks on
# one GPU). Logs: build-gpu/logs-multi; the summary and tables are copied to $OUT when set,
# and every log as $OUT/0-multigpu-check-logs.tgz (common.sh, mk_gpu_env).
run_multigpu() {
build=${MG_BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build-gpu}
logs=$build/logs-multi
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
  # NCCL loads the tuner and calls its init and getCollInfo. A short run apart (logging
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
}

# ---- rail -----------------------------------------------------------------------------------------
# The hierarchical AllReduce's rail exchange (MKERNEL_HIER_RAIL: direct, ring, rhd; collectives/algo/hier_staged.h,
# docs/ALGORITHMS.md) in one device call:
#   bash scripts/gpu-check.sh rail        (repository root; carry .carry for Catch2)
#   1. builds libmkernel.so, mkernel-collbench and test_gpu_collectives (sm_90);
#   2. the Catch tags of RC_TESTS ("hierrail hierrailroles": test_gpu_hier_rail, every collective x
#      dtype x op, ring and rhd over 3-4 emulated nodes; test_gpu_hier_rail_roles, the same with the
#      AllReduce in CTA roles) RC_TEST_REPS times each (default 2): pass/fail and seconds of each;
#      RC_TESTS="" runs none and does not build the GPU tier (a sweep alone builds in less time);
#      RC_CTEST='REGEX' then runs those GPU-tier ctests (building test_gpu_kernel too), e.g.
#      'hier_inturn|graph_hier';
#   3. the hierarchical AllReduce on emulated nodes of one GPU (mkernel-collbench --ranks-per-node,
#      the proxies over loopback TCP), for each layout of RC_LAYOUTS ("8:2 6:2": ranks:per node, or
#      ranks:per node:lanes to set MKERNEL_HIER_CTAS for that layout, e.g. "8:2:1 8:2:3", or
#      ranks:per node:lanes:W,R to run it in CTA roles too, MKERNEL_HIER_ROLES=W,R, e.g. "8:2:1:2,2";
#      the roles take the AllReduces from MKERNEL_HIER_SPLIT_MIN_BYTES, 512 KiB by default),
#      each MKERNEL_HIER_RAIL of RC_RAILS ("direct ring rhd"), each variant of RC_VARIANTS ("-":
#      as is; "NAME:WORD,..." adds VAR=value words to the environment and --flag=value words to
#      collbench's arguments, its runs shown as rail "RAIL+NAME", e.g. "- bsync:--sync=blocking";
#      "rs:--coll=reducescatter,--sync=blocking" times a ReduceScatter instead),
#      pipelined and in turn (RC_OVERLAPS, "1 0"), RC_ROUNDS (2) rounds interleaved; RC_ITERS
#      (200) iterations per size, RC_MIN (4 KiB) to RC_MAX (16 MiB) by 4. A table per layout: the
#      eager median of each (rail, overlap) as "round 1/round 2/...", in us; the raw lines in
#      rail-sweep.txt; and scripts/overlap-table.py's
#      table (overlap-table.txt): the in-turn runs' phase times against the pipelined time, the
#      share of the shorter phase hidden (the goal: 80%; meant for one lane, "R:G:1");
#   4. (RC_TORCH="<torch_check.py options>", e.g. "--ranks 8 --gpus 1 --mps --ranks-per-node 2")
#      scripts/torch_check.py once per MKERNEL_HIER_RAIL of RC_TORCH_RAILS ("ring rhd"), with
#      MKERNEL_DEBUG=INFO, showing each rank's line matching RC_TORCH_SHOW ("exchange among the rail");
#      RC_TORCH_TIMEOUT (300) s each.
# NVLink multicast stays off (common.sh, mk_gpu_env). Logs in build-gpu/logs-rail; tables to $OUT.
run_rail() {
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
build=${RC_BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build-gpu}
logs=$build/logs-rail
mk_gpu_env
PY=$(mk_torch_python)
fail=0

step "1. build"
tests=${RC_TESTS-hierrail hierrailroles}
# shellcheck disable=SC2046
gpu_build "${RC_JOBS:-16}" mkernel mkernel-collbench $([ -n "$tests${RC_CTEST:-}" ] && echo test_gpu_collectives) \
  $([ -n "${RC_CTEST:-}" ] && echo test_gpu_kernel)
LIB=$build/lib/libmkernel.so
export LD_LIBRARY_PATH=$NCCL_HOME/lib:$build/lib:${LD_LIBRARY_PATH:-}

step "2. [$tests] x ${RC_TEST_REPS:-2}"
: >"$logs/tests.txt"
for i in $(seq 1 "${RC_TEST_REPS:-2}"); do
  for tag in $tests; do
    t0=$(date +%s%N)
    MKERNEL_TIMEOUT_S=60 timeout 200 "$build/tests/gpu/test_gpu_collectives" --order lex "[$tag]" >"$logs/$tag-$i.log" 2>&1
    rc=$?
    [ "$rc" = 0 ] || { fail=1; grep -E "FAILED|failed|with expansion" "$logs/$tag-$i.log" | head -5; }
    echo "[$tag] run $i: rc=$rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$logs/tests.txt"
  done
done
if [ -n "${RC_CTEST:-}" ]; then
  step "2b. ctest -R '$RC_CTEST'"
  (cd "$build" && ctest -R "$RC_CTEST" --output-on-failure) >"$logs/ctest.txt" 2>&1 || fail=1
  grep -E "Test +#|tests passed|FAILED|with expansion" "$logs/ctest.txt" | tee -a "$logs/tests.txt"
fi
save tests.txt

step "3. hierarchical collectives (AllReduce unless a variant says --coll): layouts ${RC_LAYOUTS:-8:2 6:2}, MKERNEL_HIER_RAIL in ${RC_RAILS:-direct ring rhd}, variants ${RC_VARIANTS:--}, overlap ${RC_OVERLAPS:-1 0}, ${RC_ROUNDS:-2} rounds"
: >"$logs/rail-sweep.txt"
for layout in ${RC_LAYOUTS:-8:2 6:2}; do
  IFS=: read -r ranks rpn lanes roles <<<"$layout"
  for round in $(seq 1 "${RC_ROUNDS:-2}"); do
    for ov in ${RC_OVERLAPS:-1 0}; do
      for rail in ${RC_RAILS:-direct ring rhd}; do
        for variant in ${RC_VARIANTS:--}; do
          # A variant "NAME:WORD,WORD": VAR=value words go to the environment, --flag words to
          # collbench; its runs show as rail "RAIL+NAME". "-": none.
          vname="" venv=() vargs=()
          if [ "$variant" != - ]; then
            vname=+${variant%%:*}
            IFS=, read -ra words <<<"${variant#*:}"
            for w in "${words[@]}"; do
              case $w in
                --*) vargs+=("${w%%=*}" "${w#*=}") ;;
                *=*) venv+=("$w") ;;
              esac
            done
          fi
          tag="$layout/$rail$vname/ov$ov/r$round"
          env ${lanes:+MKERNEL_HIER_CTAS=$lanes} ${roles:+MKERNEL_HIER_ROLES=$roles} MKERNEL_HIER_RAIL=$rail \
            MKERNEL_HIER_OVERLAP=$ov MKERNEL_SOCKET_IFNAME=lo MKERNEL_TIMEOUT_S=30 "${venv[@]}" \
            timeout 200 "$build/bin/mkernel-collbench" --gpus 1 --ranks "$ranks" --ranks-per-node "$rpn" --wait memop \
            --min-bytes "${RC_MIN:-4096}" --max-bytes "${RC_MAX:-16777216}" --step 4 --iters "${RC_ITERS:-200}" "${vargs[@]}" 2>&1 |
            sed "s|^|$tag: |" >>"$logs/rail-sweep.txt"
          [ "${PIPESTATUS[0]}" = 0 ] || { echo "$tag failed"; fail=1; }
        done
      done
    done
  done
done
# One table per layout: rows are sizes, a column per (rail, overlap) with each round's eager median.
awk '$2 ~ /^memop$/ && $1 ~ /\/r[0-9]+:$/ {
       split($1, a, "/"); lay = a[1]; col = a[2] "/" a[3]; r = a[4]; sub(":", "", r); sub("r", "", r)
       key = lay SUBSEP col SUBSEP $4
       m = int($5 + 0.5); if (key in v) m = v[key] "/" m; v[key] = m
       if (!(lay in seenL)) { seenL[lay] = 1; ls[++nl] = lay }
       if (!((lay, col) in seenC)) { seenC[lay, col] = 1; cs[lay, ++nc[lay]] = col }
       if (!((lay, $4) in seenB)) { seenB[lay, $4] = 1; bs[lay, ++nb[lay]] = $4 } }
     END { for (l = 1; l <= nl; ++l) { L = ls[l]; split(L, rr, ":")
             printf "\n%s ranks as %d nodes of %s%s%s (eager median per round, us; ov1 pipelined, ov0 in turn)\n", rr[1], rr[1] / rr[2], rr[2], (3 in rr) ? ", " rr[3] " lane(s)" : "", (4 in rr) ? ", CTA roles " rr[4] : ""
             printf "%10s", "bytes"; for (j = 1; j <= nc[L]; ++j) printf " %17s", cs[L, j]; print ""
             for (i = 1; i <= nb[L]; ++i) { B = bs[L, i]; printf "%10s", B
               for (j = 1; j <= nc[L]; ++j) printf " %17s", ((L, cs[L, j], B) in v) ? v[L, cs[L, j], B] : "-"; print "" } } }' \
  "$logs/rail-sweep.txt" | tee "$logs/rail-table.txt"
grep -E "failed|error|Error" "$logs/rail-sweep.txt" | head -5
# The overlap measure: the in-turn runs' phase times (CTA 0, %globaltimer) against the
# pipelined time, per layout, rail and round (one lane: layouts "R:G:1").
python3 "$root/scripts/overlap-table.py" "$logs/rail-sweep.txt" | tee "$logs/overlap-table.txt"
save rail-table.txt rail-sweep.txt overlap-table.txt

if [ -n "${RC_TORCH:-}" ] && mk_have_torch "$PY"; then
  : >"$logs/torch-check.txt"
  for rail in ${RC_TORCH_RAILS:-ring rhd}; do
    step "4. torch_check $RC_TORCH, MKERNEL_HIER_RAIL=$rail"
    # shellcheck disable=SC2086
    MKERNEL_DEBUG=INFO MKERNEL_HIER_RAIL=$rail timeout "${RC_TORCH_TIMEOUT:-300}" "$PY" "$root/scripts/torch_check.py" --lib "$LIB" $RC_TORCH --timeout 180 \
      --show "${RC_TORCH_SHOW:-exchange among the rail}" >>"$logs/torch-check.txt" 2>&1 || fail=1
    grep -E "^\[torch_check\]|FAIL|Error|error|${RC_TORCH_SHOW:-exchange among}" "$logs/torch-check.txt" | cut -c1-300 | tail -12
  done
  save torch-check.txt
fi
echo "rail-check: fail=$fail"
exit "$fail"
}

# ---- hierfail -------------------------------------------------------------------------------------
# The hierarchical failure cases on emulated nodes, many times over, in one device call:
#   bash scripts/gpu-check.sh hierfail      (repository root; carry .carry for Catch2)
# It builds test_gpu_kernel (sm_90) and runs its [hierfail] cases (tests/gpu/test_gpu_kernel.cc,
# hierPartMissing: 2 emulated nodes x 2 thread ranks; "stall", rank 3 never posts the second
# AllReduce; "gone", node 1 aborts and finalizes while node 0 is inside it) HF_REPS times (10)
# as is and HF_REPS times in CTA roles (MKERNEL_HIER_ROLES=1,1, test_gpu_hier_fail_roles'
# settings). One row per run: its result, seconds, how long each survivor of "gone" waited and
# what released it (proxy: the proxy's own failure naming node 1; "proxy, half closed": the same
# through the TCP comm's close seen on a data socket while socket 0 stayed silent, the slow
# survivor's state, failed after 1 s; wait: its timeout), node 1's
# abort-and-finalize seconds, and the stalled survivors' waits. Then the count of runs in which a
# survivor of "gone" waited 10 s or more (docs/RELIABILITY.md). Logs in build-gpu/logs-hierfail; the table
# (hierfail.txt) to $OUT. HF_LIMIT: seconds per run (120). Exit status: non-zero if any run failed.
run_hierfail() {
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
build=${HF_BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build-gpu}
logs=$build/logs-hierfail
mk_gpu_env
reps=${HF_REPS:-10}
fail=0 slow=0 runs=0

step "1. build"
gpu_build "${HF_JOBS:-16}" test_gpu_kernel
bin=$build/tests/gpu/test_gpu_kernel

step "2. [hierfail] x $reps, as is and in CTA roles"
table=$logs/hierfail.txt
{
  echo "| run | roles | result | s | gone: rank 0 | gone: rank 1 | node 1 abort+finalize | stall: ranks 0/1/2 |"
  echo "|---|---|---|---|---|---|---|---|"
} >"$table"
for mode in plain roles; do
  envs=()
  # shellcheck disable=SC2054
  [ "$mode" = roles ] && envs=(MKERNEL_HIER_ROLES=1,1 MKERNEL_HIER_CTAS=1 MKERNEL_HIER_SPLIT_MIN_BYTES=0)
  for i in $(seq 1 "$reps"); do
    log=$logs/$mode-$i.log
    t0=$(date +%s%N)
    env "${envs[@]}" timeout "${HF_LIMIT:-120}" "$bin" --order lex "[hierfail]" >"$log" 2>&1
    rc=$?
    secs=$(awk "BEGIN { printf \"%.1f\", ($(date +%s%N) - $t0) / 1e9 }")
    runs=$((runs + 1))
    [ "$rc" = 0 ] || fail=1
    # "gone, rank R: remote error after S s: ..." for the survivors; "gone, rank R: abort took A s,
    # abort and finalize F s" for node 1; "stall, rank R: ... after S s".
    survivor() {
      awk -v r="$1" '$1 == "gone," && $2 == "rank" && $3 == r":" && /after/ {
        for (i = 1; i <= NF; ++i) if ($i == "after" && s == "") s = $(i + 1)
        how = /the proxy stopped: / ? (/its socket [0-9]+ closed; socket 0, still open/ ? "proxy, half closed" : "proxy") : "wait"
        printf "%s s (%s)", s, how; exit }' "$log"
    }
    g0=$(survivor 0) g1=$(survivor 1)
    fin=$(awk '$1 == "gone," && /abort and finalize/ { for (i = 1; i <= NF; ++i) if ($i == "finalize") f = f (f ? "/" : "") $(i + 1) } END { print f }' "$log")
    stall=$(awk '$1 == "stall," && /after/ { for (i = 1; i <= NF; ++i) if ($i == "after" && !($3 in s)) s[$3] = $(i + 1) }
      END { print s["0:"] "/" s["1:"] "/" s["2:"] }' "$log")
    for g in "$g0" "$g1"; do
      s=${g%% s*}
      [ -n "$s" ] && awk "BEGIN { exit !($s >= 10) }" && { slow=$((slow + 1)); break; }
    done
    res=passed
    case $rc in 0) ;; 124 | 137) res=TIMEOUT ;; *) res="FAIL($rc)" ;; esac
    echo "| $i | $mode | $res | $secs | ${g0:--} | ${g1:--} | ${fin:--} | $stall |" | tee -a "$table"
    [ "$rc" = 0 ] || grep -E "FAILED|with expansion|rank [0-9]+:" "$log" | head -8 | sed 's/^/    /'
  done
done
echo "runs: $runs; with a survivor of \"gone\" that waited 10 s or more: $slow; failed: $(grep -c 'FAIL\|TIMEOUT' "$table")" |
  tee -a "$table"
save hierfail.txt
exit $fail
}

# ---- procs ----------------------------------------------------------------------------------------
# Process ranks (staged collectives through CUDA IPC, docs/KERNEL.md) in one device call:
#   bash scripts/gpu-check.sh procs          (repository root; PyTorch 2.11 at MK_PYTHON, common.sh)
# Builds libmkernel.so and test_gpu_procs, then:
#   0. ctest -R test_gpu_procs: 2 ranks (one per GPU), 4 ranks (emulated under MPS when the GPUs
#      are fewer), 3 ranks with one killed (the survivors see RemoteError).
#   1. (2+ GPUs) scripts/torch_check.py --ranks 2 --gpus 2: two processes on two GPUs, mkernel
#      beside the real NCCL; results bit-identical to NCCL alone; mkernel ran them.
#   2. scripts/torch_check.py --ranks 2,4 --mps: emulated process ranks on one GPU under CUDA MPS.
#   3. (2+ GPUs) scripts/torch_bench.py: torch.distributed all_reduce / all_gather /
#      reduce_scatter, NCCL against mkernel, 8 B to PROCS_MAX_BYTES; table, CSV and plot.
#   4. (2+ GPUs) scripts/ddp_example.py, 2 ranks, NCCL against LD_PRELOAD=libmkernel.so: loss
#      compared, step times and mkernel's counters printed.
# PROCS_STEPS (default "0 1 2 3 4") picks the steps; PROCS_MIN_BYTES (8) starts step 3's sweep;
# PROCS_CROSSOVER_OFF=1 repeats steps 3 and 4 with MKERNEL_NCCL_CROSSOVER=off (mkernel's own path
# at every size: the policy's crossovers for process ranks, docs/ALGORITHMS.md rule 6b, against
# what they replace, in the same call).
# NVLink multicast stays off. Logs in build-gpu/logs-procs; the results are copied to $OUT.
run_procs() {
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
export MKERNEL_TIMEOUT_S=${MKERNEL_TIMEOUT_S:-20}
root=$MK_ROOT
build=${PROCS_BUILD:-$root/build-gpu}
logs=$build/logs-procs
mkdir -p "$logs"
PY=$(mk_torch_python)
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fail=0
mk_have_torch "$PY" || { echo "procs-check: no PyTorch at $PY"; exit 1; }
STEPS=" ${PROCS_STEPS:-0 1 2 3 4} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
# Step 3 and 4's variants: "name|VAR=value ..." (the default policy, and with PROCS_CROSSOVER_OFF=1
# mkernel's own path at every size).
variants=("mk|")
[ "${PROCS_CROSSOVER_OFF:-0}" = 1 ] && variants+=("mk-nocross|MKERNEL_NCCL_CROSSOVER=off")

step "build libmkernel.so ($NG GPU(s))"
catch_args=()
[ -f "$root/.carry/catch2/catch.hpp" ] && catch_args=(-DMKERNEL_CATCH2_INCLUDE_DIR="$root/.carry")
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMKERNEL_DEVICE_CODE=ON -DMKERNEL_BUILD_TESTS=ON "${catch_args[@]}" >"$logs/configure.log" 2>&1 ||
  { tail -30 "$logs/configure.log"; exit 1; }
make -C "$build" -j"${PROCS_JOBS:-16}" mkernel test_gpu_procs >"$logs/build.log" 2>&1 ||
  { grep -m5 -A5 error "$logs/build.log"; exit 1; }
LIB=$build/lib/libmkernel.so

if want 0; then
step "0. test_gpu_procs (C++ process ranks, killed rank)"
(cd "$build" && timeout 300 ctest -R test_gpu_procs --output-on-failure --timeout 90) 2>&1 | tee "$logs/ctest-procs.txt" | tail -40
[ "${PIPESTATUS[0]}" = 0 ] || fail=1
save ctest-procs.txt
fi

if [ "$NG" -ge 2 ] && want 1; then
  step "1. torch_check: 2 processes on 2 GPUs, against NCCL"
  timeout 240 "$PY" "$root/scripts/torch_check.py" --lib "$LIB" --ranks 2 --gpus 2 --timeout 200 2>&1 |
    tee "$logs/torch-check-2gpu.txt" | grep -v "^\s*$" | tail -30
  [ "${PIPESTATUS[0]}" = 0 ] || fail=1
  save torch-check-2gpu.txt
fi

if want 2; then
step "2. torch_check: emulated process ranks on one GPU under MPS (--ranks ${PROCS_EMU_RANKS:-2})"
CUDA_VISIBLE_DEVICES=0 timeout 240 "$PY" "$root/scripts/torch_check.py" --lib "$LIB" --ranks "${PROCS_EMU_RANKS:-2}" \
  --mps --timeout 100 2>&1 | tee "$logs/torch-check-emu.txt" | tail -30
[ "${PIPESTATUS[0]}" = 0 ] || fail=1
save torch-check-emu.txt
fi

if [ "$NG" -ge 2 ] && want 3; then
  for v in "${variants[@]}"; do
    IFS='|' read -r name envs <<<"$v"
    step "3. torch_bench: NCCL against mkernel ($name${envs:+: $envs}), 2 processes on 2 GPUs"
    # shellcheck disable=SC2086  # envs: VAR=value words
    env $envs timeout "${PROCS_BENCH_TIMEOUT:-200}" "$PY" "$root/scripts/torch_bench.py" --lib "$LIB" --ranks 2 \
      --min-bytes "${PROCS_MIN_BYTES:-8}" --max-bytes "${PROCS_MAX_BYTES:-256M}" --iters "${PROCS_ITERS:-30}" \
      --trials "${PROCS_TRIALS:-3}" --csv "$logs/torch-bench-$name.csv" --plot "$logs/torch-bench-$name.png" 2>&1 |
      tee "$logs/torch-bench-$name.txt" | tail -45
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
    save "torch-bench-$name.txt" "torch-bench-$name.csv"
  done
fi

if [ "$NG" -ge 2 ] && want 4; then
  step "4. DDP example, 2 ranks: NCCL against LD_PRELOAD=libmkernel.so"
  timeout 150 "$PY" "$root/scripts/ddp_example.py" --world-size 2 --backend nccl --csv "$logs/ddp-nccl.csv" \
    >"$logs/ddp.txt" 2>&1 || fail=1
  for v in "${variants[@]}"; do
    IFS='|' read -r name envs <<<"$v"
    echo "== DDP with mkernel ($name${envs:+: $envs})" >>"$logs/ddp.txt"
    # shellcheck disable=SC2086
    env $envs LD_PRELOAD="$LIB" timeout 150 "$PY" "$root/scripts/ddp_example.py" --world-size 2 --backend nccl \
      --csv "$logs/ddp-$name.csv" >>"$logs/ddp.txt" 2>&1 || fail=1
    "$PY" "$root/scripts/ddp_example.py" --compare "$logs/ddp-nccl.csv" "$logs/ddp-$name.csv" --tol "${PROCS_DDP_TOL:-1e-3}" \
      >>"$logs/ddp.txt" 2>&1 || fail=1
  done
  grep -iE "==|step time|mkernel|loss|compare|max" "$logs/ddp.txt" | tail -24
  save ddp.txt
fi
step "summary: procs-check $([ $fail = 0 ] && echo passed || echo FAILED)"
exit $fail
}

# ---- nccl -----------------------------------------------------------------------------------------
# The shim, the net plugin and the tuner against one NCCL build (docs/TROUBLESHOOTING.md, "NCCL
# versions"), in one device call:
#   bash scripts/gpu-check.sh nccl PREFIX    (repository root; carry .carry: Catch2 and nccl-tests)
# PREFIX is a build of scripts/nccl-build.sh (PREFIX/lib/libnccl.so.2). When it has none and NV_SRC
# is set (an NCCL source folder, or a git dir with NV_TAG), it is built first (NV_JOBS, default 16;
# NV_ONLY_FUNCS: nccl-build.sh's --only-funcs). mk_use_nccl (common.sh) points NCCL_HOME,
# MKERNEL_NCCL_LIBRARY and LD_LIBRARY_PATH at PREFIX for every step:
#   1. builds libmkernel.so (against the build's own NCCL headers, as an application's copy is),
#      nccl_one_rank and the shim's tests in build-gpu-nccl, with MKERNEL_REAL_NCCL_SO at PREFIX's
#      library (test_shim_api compares the shim's exports with it), and the patched nccl-tests'
#      all_reduce_perf against PREFIX;
#   2. ctest NV_CTEST (default test_shim_gpu, test_shim_stats_gpu, test_shim_api, test_shim_api_gpu);
#   3. MKERNEL_DEBUG=VERSION LD_PRELOAD=libmkernel.so nccl_one_rank: one AllReduce, and the shim's
#      startup line names PREFIX's library at its version;
#   4. nccl_plugin_check: PREFIX's NCCL loads the net plugin and the tuner (NCCL_DEBUG=INFO), each
#      at the newest version both libraries have;
#   5. nccl-tests all_reduce_perf -b 8 -e NV_MAX_BYTES (64M) -f 4 -c 1 -g <GPUs>: NCCL alone, then
#      under LD_PRELOAD=libmkernel.so (mkernel's path at every size); time, busbw and #wrong;
#   6. (PyTorch at MK_PYTHON, unless NV_TORCH=0) scripts/torch_check.py --ranks 1 --nccl PREFIX's
#      library: PyTorch and the shim on that NCCL, bit-identical to that NCCL alone.
# Ends with one row per step in docs/results/compat.csv's columns ($logs/compat-rows.csv, also in
# $OUT; MK_COMMIT names the commit where the tree has no git). NVLink multicast stays off. Logs in
# build-gpu-nccl/logs-nccl, and every log as $OUT/0-nccl-check-logs.tgz.
run_nccl() {
prefix=${1:-}
[ -n "$prefix" ] || { echo "gpu-check.sh nccl: give an NCCL build's prefix (scripts/nccl-build.sh --prefix)"; exit 2; }
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
build=${NV_BUILD:-$MK_ROOT/build-gpu-nccl}
logs=$build/logs-nccl
mk_gpu_env
PY=$(mk_torch_python)
fail=0
if [ ! -f "$prefix/lib/libnccl.so.2" ] && [ -n "${NV_SRC:-}" ]; then
  step "0. scripts/nccl-build.sh --src $NV_SRC ${NV_TAG:+--tag $NV_TAG }--prefix $prefix"
  nb=(--src "$NV_SRC" --prefix "$prefix" --jobs "${NV_JOBS:-16}")
  [ -n "${NV_TAG:-}" ] && nb+=(--tag "$NV_TAG")
  [ -n "${NV_ONLY_FUNCS:-}" ] && nb+=(--only-funcs "$NV_ONLY_FUNCS")
  bash "$root/scripts/nccl-build.sh" "${nb[@]}" 2>&1 | tee "$logs/nccl-build.txt" | tail -5
  [ "${PIPESTATUS[0]}" = 0 ] || exit 1
fi
[ -f "$prefix/lib/libnccl.so.2" ] || { echo "nccl-check: no $prefix/lib/libnccl.so.2 (NV_SRC builds it)"; exit 1; }
prefix=$(cd "$prefix" && pwd)

# Built before mk_use_nccl exports NCCL_HOME, which the configure would take the headers from.
step "1. build libmkernel.so, nccl_one_rank and the shim's tests against $prefix/lib/libnccl.so.2 ($NG GPU(s))"
GPU_CMAKE_ARGS="-DMKERNEL_REAL_NCCL_SO=$prefix/lib/libnccl.so.2 -DMKERNEL_NCCL_LIBRARY=$prefix/lib/libnccl.so.2" \
  gpu_build "${NV_JOBS:-16}" mkernel nccl_one_rank test_shim_gpu test_shim_stats_gpu test_shim_api
grep -m1 "mkernel: NCCL .* headers in" "$logs/configure.log"
LIB=$build/lib/libmkernel.so
mk_use_nccl "$prefix" || exit 1
gpu_build_nccl_tests all_reduce_perf
machine="$NG x $(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null)"
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "${MK_COMMIT:-unknown}")
: >"$logs/compat-rows.csv"
# row COMPONENT COMMAND RESULT: one row of docs/results/compat.csv (no double quote in the texts).
row() {
  printf '%s,%s,%s,"%s",%s,%s,"%s"\n' "$(date +%F)" "$machine" "$commit" "${2//\"/\'}" "$NCCL_VERSION" "$1" "${3//\"/\'}" |
    tee -a "$logs/compat-rows.csv"
}

CTESTS=${NV_CTEST:-'^(test_shim_gpu|test_shim_stats_gpu|test_shim_api|test_shim_api_gpu)$'}
step "2. ctest -R $CTESTS"
(cd "$build" && MKERNEL_TIMEOUT_S=20 ctest -R "$CTESTS" --output-on-failure --timeout "${NV_CTEST_TIMEOUT:-200}") \
  >"$logs/ctest.log" 2>&1 || fail=1
mk_ctest_rows "$logs/ctest.log" | while read -r n name res secs; do echo "| #$n | $name | ${res//_/ } | $secs |"; done
grep -E "FAILED|with expansion|REQUIRE|CHECK\(" "$logs/ctest.log" | head -20
total=$(mk_ctest_rows "$logs/ctest.log" | wc -l)
passed=$(mk_ctest_rows "$logs/ctest.log" | awk '$3 == "Passed"' | wc -l)
failed=$(mk_ctest_rows "$logs/ctest.log" | awk '$3 != "Passed" { printf "%s%s", s, $2; s = " " }')
row shim "ctest -R '$CTESTS' (scripts/gpu-check.sh nccl)" "$passed of $total passed${failed:+; failed: $failed}"

step "3. MKERNEL_DEBUG=VERSION LD_PRELOAD=libmkernel.so nccl_one_rank"
MKERNEL_DEBUG=VERSION LD_PRELOAD=$LIB timeout 120 "$build/tests/plugin/nccl_one_rank" >"$logs/one-rank.txt" 2>&1
rc=$?
cut -c1-300 "$logs/one-rank.txt" | head -12
line=$(grep -m1 "loaded as NCCL shim" "$logs/one-rank.txt")
if [ $rc = 0 ] && [[ $line == *"forwarding to NCCL $NCCL_VERSION at $NCCL_LIB"* ]]; then
  row shim "MKERNEL_DEBUG=VERSION LD_PRELOAD=libmkernel.so tests/plugin/nccl_one_rank" \
    "startup line names NCCL $NCCL_VERSION at its prefix; AllReduce of 8 floats OK"
else
  fail=1
  row shim "MKERNEL_DEBUG=VERSION LD_PRELOAD=libmkernel.so tests/plugin/nccl_one_rank" \
    "FAILED: rc=$rc, startup line: ${line:-none}"
fi

step "4. NCCL $NCCL_VERSION loads mkernel's net plugin and tuner"
nccl_plugin_check "$build" "$NCCL_HOME/lib" 2>&1 | tee "$logs/plugin-check.txt" | tail -30
[ "${PIPESTATUS[0]}" = 0 ] || fail=1
net=$(sed -nE 's/.*NET\/Plugin: Loaded net plugin mkernel \(v([0-9]+)\).*/\1/p' "$logs/net-plugin.log" | tail -1)
tuner=$(sed -nE 's/.*TUNER\/Plugin: Using mkernel \(v([0-9]+)\).*/\1/p' "$logs/tuner-plugin.log" | tail -1)
verdict=$(tail -1 "$logs/plugin-check.txt")
row "net plugin" "NCCL_NET_PLUGIN=libnccl-net-mkernel.so NCCL_DEBUG=INFO tests/plugin/nccl_one_rank" \
  "$(if grep -q "Assigned NET plugin mkernel" "$logs/net-plugin.log"; then echo "NCCL loaded ncclNetPlugin_v${net:-?} and assigned it"; else echo "FAILED: not assigned"; fi); $verdict"
row tuner "NCCL_TUNER_PLUGIN=mkernel NCCL_DEBUG=INFO tests/plugin/nccl_one_rank" \
  "$(if [ -n "$tuner" ]; then echo "NCCL uses ncclTunerPlugin_v$tuner"; else echo "FAILED: not loaded"; fi); $verdict"

step "5. nccl-tests all_reduce_perf -b 8 -e ${NV_MAX_BYTES:-64M} -g $NG: NCCL $NCCL_VERSION alone, then LD_PRELOAD"
if nccl_tests_vs all_reduce_perf 8 "${NV_MAX_BYTES:-64M}" 120 "mk|mkernel's path at every size|MKERNEL_NCCL_CROSSOVER=off"; then
  last=$(grep -E '^ *[0-9]+[KMG]? ' "$logs/tables.txt" | tail -1)
  row shim "nccl-tests all_reduce_perf -b 8 -e ${NV_MAX_BYTES:-64M} -f 4 -c 1 -g $NG, NCCL alone then LD_PRELOAD=libmkernel.so" \
    "$(grep -cE '^ *[0-9]+[KMG]? ' "$logs/tables.txt") sizes, #wrong 0 in both; largest: $(awk '{ printf "%s us NCCL, %s us mkernel, busbw %s / %s GB/s", $2, $3, $5, $6 }' <<<"$last")"
else
  fail=1
  row shim "nccl-tests all_reduce_perf -b 8 -e ${NV_MAX_BYTES:-64M} -f 4 -c 1 -g $NG, NCCL alone then LD_PRELOAD=libmkernel.so" \
    "FAILED (tables.txt)"
fi
save tables.txt

if mk_have_torch "$PY" && [ "${NV_TORCH:-1}" != 0 ]; then
  step "6. scripts/torch_check.py --ranks 1 --nccl $NCCL_LIB"
  OUT=$logs timeout 240 "$PY" "$root/scripts/torch_check.py" --lib "$LIB" --ranks 1 --nccl "$NCCL_LIB" >"$logs/torch.txt" 2>&1
  rc=$?
  res=$(grep -m1 "^\[torch_check\] ranks=1" "$logs/torch.txt" | sed -E 's/^\[torch_check\] ranks=1 emulated=False: //; s/ stats=.*//')
  echo "${res:-no result line}"
  if [ $rc != 0 ] || [[ $res != *"nccl=$NCCL_VERSION"* ]]; then
    fail=1
    tail -20 "$logs/torch.txt"
  fi
  row shim "scripts/torch_check.py --ranks 1 --nccl <prefix>/lib/libnccl.so.2 ($("$PY" -c 'import torch; print("PyTorch", torch.__version__.split("+")[0])' 2>/dev/null))" \
    "$([ $rc = 0 ] || echo "FAILED: ")${res:-no result line}"
  save torch.txt
else
  echo "6. skipped: no PyTorch at $PY (or NV_TORCH=0)"
fi

step "summary: nccl-check against NCCL $NCCL_VERSION $([ $fail = 0 ] && echo passed || echo FAILED)"
cat "$logs/compat-rows.csv"
save compat-rows.csv ctest.log plugin-check.txt
exit $fail
}

run=${1:-tier}
case $run in
  tier | launch | bw | multigpu | rail | hierfail | procs | nccl)
    # The logs' archive in $OUT (bundle_logs): 0-<RUN>-check-logs.tgz.
    MK_LOG_NAME=$run-check
    shift $(($# > 0 ? 1 : 0))
    "run_$run" "$@"
    ;;
  *)
    echo "gpu-check.sh: unknown run '$run' (tier, launch, bw, multigpu, rail, hierfail, procs or nccl)" >&2
    exit 2
    ;;
esac
