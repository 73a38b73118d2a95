# Shared by every shell script of scripts/: dependency installation and the build, the Python
# with PyTorch, the GPU machine's settings and helpers (mk_gpu_env), the emulation settings
# (mk_emu_env), and running a test binary's Catch2 cases one by one (mk_gpu_cases).
# Sourcing it defines functions and MK_ROOT / MK_JOBS, and exports ccache's CCACHE_BASEDIR and
# CCACHE_NOHASHDIR (mk_ccache_args).
# shellcheck shell=bash

MK_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MK_JOBS=${MK_JOBS:-$(nproc)}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$MK_ROOT} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}

mk_say() { printf '\n== %s\n' "$*"; }

# A Catch2 test-case name as a command-line spec (Catch2: \ escapes , and [), for the scripts that
# run cases one by one (mk_gpu_cases).
mk_catch_spec() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/,/\\,/g' -e 's/\[/\\[/g'; }

# One line per test of a ctest log, "NUMBER NAME RESULT SECONDS" (a result of several words joined
# by "_"), for the scripts' tables (gpu-check.sh, test.sh tsan). ctest prints
# "  1/27 Test  #7: test_coll_reduce_gpu ......   Passed    3.21 sec", and a failure as
# ".....***Failed    3.44 sec": the result then starts inside the dots' field.
mk_ctest_rows() {
  awk '$2 == "Test" && $5 ~ /^\./ { n = $3; sub(/^#/, "", n); sub(/:$/, "", n); r = $5; sub(/^\.*(\*\*\*)?/, "", r)
    for (i = 6; i <= NF - 2; ++i) r = r (r ? "_" : "") $i
    print n, $4, r, $(NF - 1) }' "$1"
}

# Installs the Debian packages the build and the test tiers need, if any is missing.
mk_install_deps() {
  local need=()
  command -v cmake >/dev/null || need+=(cmake)
  command -v g++ >/dev/null || need+=(g++)
  command -v pkg-config >/dev/null || need+=(pkg-config)
  command -v clang++ >/dev/null || need+=(clang)
  command -v ccache >/dev/null || need+=(ccache)
  command -v clang-format-14 >/dev/null || need+=(clang-format-14)
  [ -f /usr/include/hwloc.h ] || need+=(libhwloc-dev)
  [ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
  [ -f /usr/include/rdma/rdma_cma.h ] || need+=(librdmacm-dev)
  [ -f /usr/include/catch2/catch.hpp ] || need+=(catch2)
  [ -f /usr/include/CLI/CLI.hpp ] || need+=(libcli11-dev)
  [ -f /usr/include/nlohmann/json.hpp ] || need+=(nlohmann-json3-dev)
  dpkg -s libclang-rt-14-dev >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
  if [ ${#need[@]} -gt 0 ]; then
    mk_say "installing: ${need[*]}"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "mkernel needs the CUDA toolkit (nvcc, 12.4+) with NCCL headers; it is not installed here." >&2
    echo "Install it from NVIDIA's repository (cuda-toolkit, libnccl-dev), then run this again." >&2
    return 1
  fi
  export PATH=$PATH:/usr/local/cuda/bin
}

# Builds go through ccache when there is one, with paths relative to the source tree, so that two
# build folders with the same flags (test.sh's build and its wheel stage) share their objects.
mk_ccache_args() {
  command -v ccache >/dev/null || return 0
  printf '%s\n' -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache
}

# mk_build DIR [cmake args...]: configure (once) and build.
mk_build() {
  local dir=$1; shift
  local cc_args=()
  mapfile -t cc_args < <(mk_ccache_args)
  cmake -S "$MK_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${cc_args[@]}" "$@" >"$dir.configure.log" 2>&1 \
    || { cat "$dir.configure.log"; return 1; }
  cmake --build "$dir" -j "$MK_JOBS" 2>&1 | grep -vE '^\[ *[0-9]+%\] (Building|Linking|Built)' || true
  cmake --build "$dir" -j "$MK_JOBS" >/dev/null 2>&1 || { cmake --build "$dir" -j 1 2>&1 | tail -40; return 1; }
}

# Whether a usable NVIDIA GPU is present (driver loaded and at least one device).
mk_have_gpu() {
  command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

# The Python interpreter with PyTorch (and the NCCL wheel that comes with it) for the scripts that
# run Python: $MK_PYTHON when set; else /opt/torch/.venv/bin/python when it imports torch; else the
# first python3 on PATH. Prints its path.
mk_torch_python() {
  local py
  if [ -n "${MK_PYTHON:-}" ]; then command -v "$MK_PYTHON" || echo "$MK_PYTHON"; return 0; fi
  if [ -x /opt/torch/.venv/bin/python ] && /opt/torch/.venv/bin/python -c 'import torch' >/dev/null 2>&1; then
    echo /opt/torch/.venv/bin/python
    return 0
  fi
  py=$(command -v python3) || py=python3
  echo "$py"
}

# mk_have_torch PY: whether the interpreter PY imports torch.
mk_have_torch() { "$1" -c 'import torch' >/dev/null 2>&1; }

# The real NCCL's folder (lib/libnccl.so.2 in it): $NCCL_HOME when set, else the nvidia-nccl wheel
# of mk_torch_python's interpreter (empty when it has none).
mk_nccl_home() {
  if [ -n "${NCCL_HOME:-}" ]; then echo "$NCCL_HOME"; return 0; fi
  "$(mk_torch_python)" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true
}

# mk_nccl_lib_version LIB: the version a libnccl.so.2 reports through ncclGetVersion (no GPU
# needed), e.g. 2.30.7; non-zero, with the reason on stderr, when it does not load or the call fails.
mk_nccl_lib_version() {
  python3 - "$1" <<'EOF'
import ctypes, sys
try:
    lib = ctypes.CDLL(sys.argv[1])
except OSError as e:
    sys.exit(f"mk_nccl_lib_version: {e}")
v = ctypes.c_int(0)
if lib.ncclGetVersion(ctypes.byref(v)) != 0:
    sys.exit(f"mk_nccl_lib_version: ncclGetVersion of {sys.argv[1]} failed")
c = v.value  # NCCL_VERSION(X,Y,Z): X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z after
print(f"{c // 10000}.{c % 10000 // 100}.{c % 100}" if c >= 20900 else f"{c // 1000}.{c % 1000 // 100}.{c % 100}")
EOF
}

# mk_use_nccl PREFIX: what follows runs against the NCCL build in PREFIX (scripts/nccl-build.sh:
# PREFIX/lib/libnccl.so.2, PREFIX/include) instead of the installed one. Exports NCCL_HOME=PREFIX
# (mk_nccl_home; scripts/nccl-tests.sh builds against it), MKERNEL_NCCL_LIBRARY (the shim's real
# NCCL) and LD_LIBRARY_PATH with PREFIX/lib first (programs linked to libnccl.so.2: nccl_one_rank,
# nccl-tests); sets NCCL_LIB (the library) and NCCL_VERSION (its ncclGetVersion, e.g. 2.30.7).
# PyTorch loads its wheel's NCCL whatever LD_LIBRARY_PATH says: scripts/torch_check.py --nccl
# "$NCCL_LIB" preloads this one instead.
mk_use_nccl() {
  local prefix
  prefix=$(cd "${1:-}" 2>/dev/null && pwd) || { echo "mk_use_nccl: no folder '${1:-}'" >&2; return 1; }
  [ -f "$prefix/lib/libnccl.so.2" ] ||
    { echo "mk_use_nccl: no $prefix/lib/libnccl.so.2 (scripts/nccl-build.sh --prefix $prefix)" >&2; return 1; }
  NCCL_LIB=$prefix/lib/libnccl.so.2
  NCCL_VERSION=$(mk_nccl_lib_version "$NCCL_LIB") || return 1
  export NCCL_HOME=$prefix MKERNEL_NCCL_LIBRARY=$NCCL_LIB LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "NCCL $NCCL_VERSION: $NCCL_LIB"
}

# ---- The GPU machine (gpu-check.sh's runs) ----
# mk_gpu_env: the GPU machine's settings, for a script that has set `build` and `logs`: sets root,
# NCCL_HOME and NG (GPUs), makes $logs, bundles the logs to $OUT at exit (bundle_logs), and exits
# when there is no GPU. NVLink multicast stays off on every machine (it can take a shared host's
# GPUs down).
mk_gpu_env() {
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  root=$MK_ROOT
  NCCL_HOME=$(mk_nccl_home)
  mkdir -p "$logs"
  NG=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  [ "$NG" -ge 1 ] || { echo "$(basename "$0"): no GPU"; exit 1; }
  trap bundle_logs EXIT
}
step() { echo "== $* ($(date +%T))"; }
# save FILE...: copies these files of $logs to $OUT (the device tool brings back at most eight).
save() { [ -n "${OUT:-}" ] && for f in "$@"; do [ -f "$logs/$f" ] && cp "$logs/$f" "$OUT/"; done; return 0; }
# At exit (mk_gpu_env sets the trap), every log of the script also goes to $OUT as one archive.
# The device tool brings back at most eight files, the first in name order ("0-" sorts before the
# saved files), so two scripts in one call do not lose each other's tables.
bundle_logs() {
  [ -n "${OUT:-}" ] && tar czf "$OUT/0-${MK_LOG_NAME:-$(basename "$0" .sh)}-logs.tgz" -C "$logs" . 2>/dev/null
  return 0
}
# gpu_build JOBS TARGET...: configures $build (Release, device code, Catch2 from .carry when it is
# there, and the words of GPU_CMAKE_ARGS) and builds the targets; logs in $logs; exits on failure.
gpu_build() {
  local jobs=$1 catch_args=() extra=()
  shift
  [ -f "$root/.carry/catch2/catch.hpp" ] && catch_args=(-DMKERNEL_CATCH2_INCLUDE_DIR="$root/.carry")
  read -r -a extra <<<"${GPU_CMAKE_ARGS:-}"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMKERNEL_DEVICE_CODE=ON -DMKERNEL_BUILD_TESTS=ON -DMKERNEL_BUILD_DEV_TOOLS=ON "${catch_args[@]}" "${extra[@]}" \
    >"$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; exit 1; }
  # A compiler's message has "error" in it; make's own (e.g. "No rule to make target", a ctest name
  # given for an executable's) does not, so the log's tail is printed then.
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
      # -g 2 run, docs/PERFORMANCE.md).
      [ -n "${NT_ITERS:-}" ] && args+=(-n "$NT_ITERS")
      # NT_AGG=K: K collectives per iteration in one group (nccl-tests' -m; times are per collective).
      if [ -n "$agg" ]; then args+=(-m "$agg"); how="$how -m $agg"; fi
      # NT_ROUNDS=N: the whole sequence (NCCL, then every variant) N times, a table per round
      # (files -rK): what one process against another varies (9 against 13 us at the small sizes).
      for round in $(seq 1 "${NT_ROUNDS:-1}"); do
        sfx="" rtitle=""
        [ "$mode" != g ] && sfx="-$mode"
        [ -n "$agg" ] && sfx="$sfx-m$agg"
        [ "${NT_ROUNDS:-1}" -gt 1 ] && sfx="$sfx-r$round" rtitle=", round $round"
        # -J: nccl-tests' JSON beside each stdout log, which nccl-tests-table.py reads.
        rm -f "$logs/nccl-$t$sfx.json"
        timeout "$limit" "${pin[@]}" "$bin" "${args[@]}" -J "$logs/nccl-$t$sfx.json" >"$logs/nccl-$t$sfx.txt" 2>&1 ||
          { echo "$t (NCCL) failed"; rc=1; }
        for v in "$@"; do
          IFS='|' read -r name title envs <<<"$v"
          rm -f "$logs/$name-$t$sfx.json"
          # shellcheck disable=SC2086  # envs: VAR=value words
          env $envs LD_PRELOAD="$LIB" timeout "$limit" "${pin[@]}" "$bin" "${args[@]}" -J "$logs/$name-$t$sfx.json" \
            >"$logs/$name-$t$sfx.txt" 2>&1 ||
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

# ---- Emulation (emulated-nccl-tests.sh) ----
# mk_emu_env [BUILD]: several thread ranks of one process on ONE GPU (MKERNEL_EMULATE=1) under
# LD_PRELOAD; sets root, build (BUILD, default build-gpu) and NCCL_HOME and exports the settings
# below. Set EMU_DEFAULT_TIMEOUT_S first (MKERNEL_TIMEOUT_S unless set). Ranks sharing a GPU in one
# process wait for each other inside their kernels, so nothing may wait for the whole device
# meanwhile (docs/KERNEL.md, "Emulated ranks as threads"): the third nccl-tests patch replaces
# nccl-tests' cudaDeviceSynchronize calls, eager module loading keeps the first launch of one of
# nccl-tests' kernels from waiting for the running ones, and 32 hardware queues keep streams apart.
# EMU_MODULE_LOADING=LAZY gives CUDA's default back.
mk_emu_env() {
  root=$MK_ROOT
  build=${1:-$root/build-gpu}
  NCCL_HOME=$(mk_nccl_home)
  export LD_LIBRARY_PATH=$NCCL_HOME/lib:$build/lib:${LD_LIBRARY_PATH:-}
  export NCCL_NVLS_ENABLE=0 MKERNEL_EMULATE=1 MKERNEL_TIMEOUT_S=${MKERNEL_TIMEOUT_S:-${EMU_DEFAULT_TIMEOUT_S:-10}}
  export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
  export CUDA_MODULE_LOADING=${EMU_MODULE_LOADING:-${CUDA_MODULE_LOADING:-EAGER}}
  export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
}
# run_test LIMIT OUTFILE CMD...: runs CMD (output to OUTFILE); if it is still running after LIMIT
# seconds (tenths count), dumps the debugger's view into OUTFILE.stacks and kills it (rc 124):
# cuda-gdb (batch attach; the device image has no gdb) lists the contexts, the resident kernels
# and their blocks, and every host thread's stack. Where a run stops, that says which kernels run
# and which call each rank thread is in. EMU_STACKS=0 skips the dump; EMU_GDB names another
# debugger.
run_test() {
  local limit=$1 outfile=$2 pid i gdb
  shift 2
  "$@" >"$outfile" 2>&1 &
  pid=$!
  for ((i = 0; i < limit * 10; ++i)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    gdb=${EMU_GDB:-$(command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)}
    if [ "${EMU_STACKS:-1}" = 1 ] && [ -n "$gdb" ]; then
      timeout 120 "$gdb" -p "$pid" -batch -ex "info cuda contexts" -ex "info cuda kernels" -ex "info cuda blocks" \
        -ex "info threads" -ex "thread apply all bt 16" >"$outfile.stacks" 2>&1
    fi
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return 124
  fi
  wait "$pid"
}

# mk_gpu_cases BINARY [LIMIT_S] [TAG_FILTER]: runs every Catch2 test case of one test binary on its
# own, each under a time limit (default 60 s), and prints a table (case, result, seconds): a hang
# costs one case's limit instead of the whole ctest run, and says which case hung. MKERNEL_TIMEOUT_S
# is passed through (set it small so that the kernel's own waits give up before the limit).
# Returns the number of cases that failed or timed out (0 = all passed).
#   bash -c '. scripts/common.sh; mk_gpu_cases build-gpu/tests/gpu/test_gpu_kernel 120'
mk_gpu_cases() {
  local bin limit filter cases bad c t0 t1 spec rc res
  bin=$1
  limit=${2:-60}
  filter=${3:-}
  [ -x "$bin" ] || { echo "mk_gpu_cases: $bin is not an executable"; return 1; }
  mapfile -t cases < <("$bin" --list-test-names-only $filter 2>/dev/null | sed '/^\s*$/d' | sed 's/^ *//')
  bad=0
  printf '| %-78s | %-9s | %7s |\n' "case ($(basename "$bin"))" result seconds
  printf '|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..80})" "-----------" "---------"
  for c in "${cases[@]}"; do
    t0=$(date +%s.%N)
    spec=$(mk_catch_spec "$c")
    timeout "$limit" "$bin" "$spec" >"/tmp/gpu-case.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    case $rc in
      0) res=passed ;;
      124|137) res=TIMEOUT; bad=$((bad + 1)) ;;
      *) res="FAIL($rc)"; bad=$((bad + 1)) ;;
    esac
    printf '| %-78s | %-9s | %7.1f |\n' "${c:0:78}" "$res" "$(awk "BEGIN { print $t1 - $t0 }")"
    if [ "$rc" != 0 ]; then
      grep -E "FAILED|REQUIRE|CHECK|with expansion|failures|rank [0-9]+:|error|timed out" /tmp/gpu-case.log | head -12 | sed 's/^/    /'
    fi
  done
  echo "mk_gpu_cases: ${#cases[@]} cases, $bad failed or timed out"
  return "$bad"
}
