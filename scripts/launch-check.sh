#!/usr/bin/env bash
# The launch path (docs/KERNEL.md, "Small collectives: the launch path") against NCCL, one
# device call:
#   bash scripts/launch-check.sh        (repository root; carry .carry: Catch2 and nccl-tests)
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
#      MKERNEL_HIER_CTAS value, and a table of eager medians per size (issue 6's default);
#   3e. (LC_PROCLAT=1) mkernel-proclat: small AllReduces with LC_PROCLAT_RANKS (2,4,8) process ranks
#      on GPU 0 under MPS (issue 5's 8-rank latency without one shared CUDA context), then
#      mkernel-collbench's thread ranks on GPU 0 at the same sizes;
#   3g. (LC_EMU_BW="32 64") issue 5's bandwidth: LC_EMU_BW_RANKS (2) emulated ranks on GPU 0,
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
set -u -o pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
build=${LC_BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build-gpu}
logs=$build/logs-launch
# shellcheck source=scripts/common.sh
. "$(dirname "$0")/common.sh"
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
  # Emulated thread ranks on GPU 0 (issue 5's latency), the launch path with and without LL mode.
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
  # Issue 6: the default of MKERNEL_HIER_CTAS from a measured sweep. The same emulated nodes as
  # 3c, pipelined (MKERNEL_HIER_OVERLAP=1), once per CTA count.
  step "3d. hierarchical AllReduce: MKERNEL_HIER_CTAS in ${LC_HIER_CTAS_SWEEP}"
  # shellcheck disable=SC2086
  hier_sweep HIER_CTAS hier_ctas "$logs/hier-ctas.txt" ${LC_HIER_CTAS_SWEEP}
  sweep_table ctas "$logs/hier-ctas.txt" | tee "$logs/hier-ctas-table.txt"
  save hier-ctas.txt hier-ctas-table.txt
fi

if [ -n "${LC_HIER_ROLES_SWEEP:-}" ]; then
  # Issue 6: CTA roles for the pipelined hierarchical AllReduce (MKERNEL_HIER_ROLES=W,R: 1 sender,
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
  # Issue 6: the AllReduce's exchange among the rail (MKERNEL_HIER_RAIL: direct, ring, rhd), the
  # same emulated nodes as 3c (LC_OVERLAP_RANKS / LC_OVERLAP_RPN), once per value.
  step "3r. hierarchical AllReduce: MKERNEL_HIER_RAIL in ${LC_HIER_RAIL_SWEEP} (overlap ${LC_HIER_RAIL_OVERLAP:-1})"
  # shellcheck disable=SC2086
  SWEEP_OVERLAP=${LC_HIER_RAIL_OVERLAP:-1} hier_sweep HIER_RAIL rail "$logs/hier-rail.txt" ${LC_HIER_RAIL_SWEEP}
  sweep_table rail "$logs/hier-rail.txt" | tee "$logs/hier-rail-table.txt"
  grep -E "failed|error|Error" "$logs/hier-rail.txt" | head -5
  save hier-rail.txt hier-rail-table.txt
fi

if [ "${LC_PROCLAT:-0}" = 1 ]; then
  # Issue 5's 8-rank latency with ranks as processes (one CUDA context each, under MPS on one GPU)
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
  # Issue 5's bandwidth goal (>= 70% of the copy bandwidth from 64 MiB) with emulated ranks on
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
  # Issue 6: the proxy's per-chunk overhead, where there are cores enough for the four polling
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
