# Shared by scripts/test.sh and scripts/bench.sh: dependency installation and the build.
# shellcheck shell=bash

MK_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MK_JOBS=${MK_JOBS:-$(nproc)}

mk_say() { printf '\n== %s\n' "$*"; }

# A Catch2 test-case name as a command-line spec (Catch2: \ escapes , and [), for the scripts that
# run cases one by one (gpu-cases.sh, case-loop.sh).
mk_catch_spec() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/,/\\,/g' -e 's/\[/\\[/g'; }

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
