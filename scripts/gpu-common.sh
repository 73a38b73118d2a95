# Shared by the device-call scripts (launch-check.sh, bw-check.sh, multigpu-check.sh): the GPU
# machine's settings, progress lines, copying results to $OUT, and the sm_90 build.
# Source it after setting `build` and `logs`; it sets root, NCCL_HOME and NG (GPUs), and exits
# when there is no GPU.
# shellcheck shell=bash
# NVLink multicast stays off on every machine (it can take a shared host's GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NCCL_HOME=${NCCL_HOME:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl}
mkdir -p "$logs"
NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
[ "$NG" -ge 1 ] || { echo "$(basename "$0"): no GPU"; exit 1; }
step() { echo "== $* ($(date +%T))"; }
# save FILE...: copies these files of $logs to $OUT (the device tool brings back at most eight).
save() { [ -n "${OUT:-}" ] && for f in "$@"; do [ -f "$logs/$f" ] && cp "$logs/$f" "$OUT/"; done; return 0; }
# At exit, every log of the script also goes to $OUT as one archive. The device tool brings back
# at most eight files, the first in name order ("0-" sorts before the saved files), so two
# scripts in one call no longer lose tables (session 12, call 3 lost three).
bundle_logs() {
  [ -n "${OUT:-}" ] && tar czf "$OUT/0-$(basename "$0" .sh)-logs.tgz" -C "$logs" . 2>/dev/null
  return 0
}
trap bundle_logs EXIT
# gpu_build JOBS TARGET...: configures $build (Release, device code, Catch2 from .carry when it is
# there) and builds the targets; logs in $logs; exits on failure.
gpu_build() {
  local jobs=$1 catch_args=()
  shift
  [ -f "$root/.carry/catch2/catch.hpp" ] && catch_args=(-DMKERNEL_CATCH2_INCLUDE_DIR="$root/.carry")
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMKERNEL_DEVICE_CODE=ON -DMKERNEL_BUILD_TESTS=ON "${catch_args[@]}" \
    >"$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; exit 1; }
  # A compiler's message has "error" in it; make's own (e.g. "No rule to make target", a ctest name
  # given for an executable's) does not, so the log's tail is printed then (session 38).
  make -C "$build" -j"$jobs" "$@" >"$logs/build.log" 2>&1 ||
    { grep -m5 -A5 error "$logs/build.log" || tail -5 "$logs/build.log"; echo "gpu_build: make $* failed"; exit 1; }
}
# gpu_build_nccl_tests "TESTS": the patched nccl-tests (scripts/nccl-tests.sh) into $build/nccl-tests.
gpu_build_nccl_tests() {
  NCCL_HOME=$NCCL_HOME bash "$root/scripts/nccl-tests.sh" --build "$build/nccl-tests" --tests "$1" \
    "${NCCL_TESTS_DIR:-$root/.carry/nccl-tests}" >"$logs/nccl-tests-build.log" 2>&1 ||
    { tail -20 "$logs/nccl-tests-build.log"; exit 1; }
}
# nccl_tests_vs "TESTS" MIN MAX LIMIT VARIANT...: each nccl-tests binary of TESTS (built by
# gpu_build_nccl_tests) with -b MIN -e MAX -f 4 -c 1 -g $NG, NCCL alone, then under
# LD_PRELOAD=$LIB once per VARIANT ("name|title|VAR=value ..."): one table per variant
# (scripts/nccl-tests-table.py: time, busbw, speedup, #wrong, path) printed and appended to
# $logs/tables.txt. LIMIT: seconds per run. NT_ITERS: nccl-tests' -n. Non-zero if any run or table
# failed. NT_FACTOR: nccl-tests' -f (default 4). NT_PIN, NT_ROUNDS, NT_MODES: below.
nccl_tests_vs() {
  local tests=$1 min=$2 max=$3 limit=$4 t bin v name title envs rc=0 round sfx rtitle mode how pin=()
  shift 4
  : >"$logs/tables.txt"
  # NT_PIN=1: every run (NCCL's and mkernel's) on GPU 0's local CPUs (sysfs local_cpulist).
  # nccl-tests -g N drives every GPU from one thread, and the kernel launches that bound its
  # small sizes cost more from a far core.
  if [ "${NT_PIN:-0}" = 1 ]; then
    local bus cpus
    bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 0 2>/dev/null | tr 'A-F' 'a-f' | sed 's/^0000//')
    cpus=$(cat "/sys/bus/pci/devices/$bus/local_cpulist" 2>/dev/null)
    if [ -n "$cpus" ]; then
      pin=(taskset -c "$cpus")
      echo "# every run pinned to CPUs $cpus (GPU 0's, $bus)" | tee -a "$logs/tables.txt"
    else
      echo "# NT_PIN=1: no CPU list found for GPU 0 (bus '$bus'); runs not pinned" | tee -a "$logs/tables.txt"
    fi
  fi
  for t in $tests; do
    bin=$build/nccl-tests/$t
    [ -x "$bin" ] || { echo "missing $bin"; rc=1; continue; }
    # NT_MODES: how the GPUs are driven, any of
    #   g: -g N, one thread launches every GPU's kernel (nccl-tests' usual single-process run);
    #   t: -t N -g 1, a thread per GPU, each launching its own (as a job's rank per process does);
    #   gG, tG: the same with the timed loop captured in a CUDA graph per GPU and replayed
    #   NT_GRAPH_LAUNCHES (10) times (-G): the GPU's time per collective, no host launch in it;
    #   any of them followed by mK (e.g. tGm8): K collectives per iteration in one group (-m K),
    #   whatever NT_AGG says.
    for mode in ${NT_MODES:-g}; do
      local args=(-b "$min" -e "$max" -f "${NT_FACTOR:-4}" -c 1) agg=${NT_AGG:-}
      case $mode in
        *m[0-9]*) agg=${mode##*m} mode=${mode%m*} ;;
      esac
      case $mode in
        g | gG) args+=(-g "$NG"); how="-g $NG" ;;
        t | tG) args+=(-t "$NG" -g 1); how="-t $NG -g 1" ;;
        *) echo "NT_MODES: unknown mode '$mode' (g, t, gG or tG)"; rc=1; continue ;;
      esac
      case $mode in
        *G) args+=(-G "${NT_GRAPH_LAUNCHES:-10}"); how="$how -G ${NT_GRAPH_LAUNCHES:-10}" ;;
      esac
      # NT_ITERS: iterations per size (nccl-tests' -n, default 20: +-3 us on the small sizes of a
      # -g 2 run, docs/PERFORMANCE.md session 12).
      [ -n "${NT_ITERS:-}" ] && args+=(-n "$NT_ITERS")
      # NT_AGG=K: K collectives per iteration in one group (nccl-tests' -m; times are per collective).
      if [ -n "$agg" ]; then args+=(-m "$agg"); how="$how -m $agg"; fi
      # NT_ROUNDS=N: the whole sequence (NCCL, then every variant) N times, a table per round
      # (files -rK): what one process against another varies (session 13: 9 against 13 us).
      for round in $(seq 1 "${NT_ROUNDS:-1}"); do
        sfx="" rtitle=""
        [ "$mode" != g ] && sfx="-$mode"
        [ -n "$agg" ] && sfx="$sfx-m$agg"
        [ "${NT_ROUNDS:-1}" -gt 1 ] && sfx="$sfx-r$round" rtitle=", round $round"
        timeout "$limit" "${pin[@]}" "$bin" "${args[@]}" >"$logs/nccl-$t$sfx.txt" 2>&1 || { echo "$t (NCCL) failed"; rc=1; }
        for v in "$@"; do
          IFS='|' read -r name title envs <<<"$v"
          # shellcheck disable=SC2086  # envs: VAR=value words
          env $envs LD_PRELOAD="$LIB" timeout "$limit" "${pin[@]}" "$bin" "${args[@]}" >"$logs/$name-$t$sfx.txt" 2>&1 ||
            { echo "$t ($name) failed"; tail -5 "$logs/$name-$t$sfx.txt"; rc=1; }
          python3 "$root/scripts/nccl-tests-table.py" "$logs/nccl-$t$sfx.txt" "$logs/$name-$t$sfx.txt" \
            --title "$t, $how$rtitle: NCCL vs mkernel ($title)" |
            tee -a "$logs/tables.txt" || rc=1
        done
      done
    done
  done
  return "$rc"
}
