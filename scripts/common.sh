# Shared by scripts/test.sh and scripts/bench.sh: dependency installation and the build.
# shellcheck shell=bash

MK_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MK_JOBS=${MK_JOBS:-$(nproc)}

mk_say() { printf '\n== %s\n' "$*"; }

# A Catch2 test-case name as a command-line spec (Catch2: \ escapes , and [), for the scripts that
# run cases one by one (gpu-cases.sh, case-loop.sh).
mk_catch_spec() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/,/\\,/g' -e 's/\[/\\[/g'; }

# One line per test of a ctest log, "NUMBER NAME RESULT SECONDS" (a result of several words joined
# by "_"), for the scripts' tables (gpu-check.sh, tsan-audit.sh). ctest prints
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

# mk_build DIR [cmake args...]: configure (once) and build.
mk_build() {
  local dir=$1; shift
  cmake -S "$MK_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >"$dir.configure.log" 2>&1 \
    || { cat "$dir.configure.log"; return 1; }
  cmake --build "$dir" -j "$MK_JOBS" 2>&1 | grep -vE '^\[ *[0-9]+%\] (Building|Linking|Built)' || true
  cmake --build "$dir" -j "$MK_JOBS" >/dev/null 2>&1 || { cmake --build "$dir" -j 1 2>&1 | tail -40; return 1; }
}

# Whether a usable NVIDIA GPU is present (driver loaded and at least one device).
mk_have_gpu() {
  command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}
