#!/usr/bin/env bash
# Builds NVIDIA's nccl-tests with mkernel's patches (nccl-tests-patches/) against the local CUDA
# and NCCL, then optionally runs some of the tests. docs/NCCL-TESTS.md has the commands for a GPU.
#
#   scripts/nccl-tests.sh [options] [NCCL_TESTS_CHECKOUT]
#
#   checkout       nccl-tests source tree (else $NCCL_TESTS_DIR, else cloned from $NCCL_TESTS_REPO
#                  into build-nccl-tests/nccl-tests at the commit the patches were made for)
#   --build DIR    where the binaries go (default: <checkout>/build)
#   --tests "A B"  binaries to build (default: the five mkernel runs; "all" = every nccl-tests binary)
#   --no-patch     build the checkout as it is (a pristine checkout builds upstream nccl-tests)
#   --mpi          build with MPI=1 (MPI_HOME must point at the MPI installation); off by default
#   --gencode G    NVCC_GENCODE (default: sm_90 only)
#   --run "A B"    after building, run these binaries (names as in --tests) with --args, each
#                  writing nccl-tests' JSON (-J) to DIR/<binary>.json for nccl-tests-table.py
#   --args "..."   arguments for every --run binary (default: -b 8 -e 128M -f 2 -g 1)
#   --preload LIB  LD_PRELOAD=LIB for the --run binaries only (e.g. build/lib/libmkernel.so)
#   --selftest     also build and run nccl-tests-patches/selftest (no GPU needed): the patched
#                  functions, with nothing preloaded, with a fake mkernel, and with --preload LIB
# Environment: NCCL_HOME (else auto-detected), CUDA_HOME (default /usr/local/cuda), MK_JOBS.
# An LD_PRELOAD set when this script starts is kept away from the compiler and given back to
# the --run binaries.
set -euo pipefail
# NVLink multicast stays off on every machine this runs on (it can take a shared host's GPUs down).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

MK_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PATCH_DIR=$MK_ROOT/nccl-tests-patches
# The upstream commit the patches were made and tested against (NCCL_TESTS_VERSION 2.19.6).
UPSTREAM_COMMIT=a0b82b2260cf5152b9f8c061bbf7eaf0ba096432
UPSTREAM_REPO=${NCCL_TESTS_REPO:-https://github.com/NVIDIA/nccl-tests.git}
DEFAULT_TESTS="all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf reduce_perf"

say() { printf '== %s\n' "$*"; }
die() { printf 'nccl-tests.sh: %s\n' "$*" >&2; exit 1; }

# The LD_PRELOAD of the caller belongs to the tests, not to make and nvcc.
RUN_PRELOAD=${LD_PRELOAD:-}
unset LD_PRELOAD

src=${NCCL_TESTS_DIR:-}
build=""
tests=$DEFAULT_TESTS
apply_patches=1
mpi=0
gencode="-gencode=arch=compute_90,code=sm_90"
run_list=""
run_args="-b 8 -e 128M -f 2 -g 1"
selftest=0
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --tests) tests=$2; shift 2 ;;
    --no-patch) apply_patches=0; shift ;;
    --mpi) mpi=1; shift ;;
    --gencode) gencode=$2; shift 2 ;;
    --run) run_list=$2; shift 2 ;;
    --args) run_args=$2; shift 2 ;;
    --preload) RUN_PRELOAD=$2; shift 2 ;;
    --selftest) selftest=1; shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) src=$1; shift ;;
  esac
done

# ---- the checkout ------------------------------------------------------------------------------
if [ -z "$src" ]; then
  src=$MK_ROOT/build-nccl-tests/nccl-tests
  if [ ! -f "$src/src/common.cu" ]; then
    say "cloning $UPSTREAM_REPO into $src"
    mkdir -p "$(dirname "$src")"
    git clone -q "$UPSTREAM_REPO" "$src" \
      || die "cannot clone $UPSTREAM_REPO (no network?): pass a checkout or set NCCL_TESTS_DIR"
    git -C "$src" -c advice.detachedHead=false checkout -q "$UPSTREAM_COMMIT" \
      || die "commit $UPSTREAM_COMMIT not found in $UPSTREAM_REPO"
  fi
fi
[ -f "$src/src/common.cu" ] || die "$src is not an nccl-tests checkout (no src/common.cu)"
src=$(cd "$src" && pwd)
build=${build:-$src/build}
mkdir -p "$build"
build=$(cd "$build" && pwd)
if [ -d "$src/.git" ]; then
  head=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)
  [ "$head" = "$UPSTREAM_COMMIT" ] || say "note: checkout is at $head, patches were made for $UPSTREAM_COMMIT"
fi

# ---- the patches (idempotent) ------------------------------------------------------------------
# patch(1) rather than git apply: git apply resolves paths against an enclosing repository, which
# is wrong when the checkout sits inside another git tree (e.g. under mkernel's build-* folders).
apply_one() {  # apply_one FILE: applies it unless it is already in the tree
  local p=$1 name
  name=$(basename "$p")
  if patch -d "$src" -p1 -R -s -f --dry-run <"$p" >/dev/null 2>&1; then
    say "already applied: $name"
  elif patch -d "$src" -p1 -N -s -f --dry-run <"$p" >/dev/null 2>&1; then
    patch -d "$src" -p1 -N -s -f <"$p" >/dev/null || die "applying $name failed"
    say "applied: $name"
  else
    patch -d "$src" -p1 -N -f --dry-run <"$p" >&2 || true
    die "$name neither applies nor is already applied to $src (a modified or different nccl-tests?)"
  fi
}
if [ "$apply_patches" = 1 ]; then
  command -v patch >/dev/null || die "patch(1) is needed to apply nccl-tests-patches/"
  shopt -s nullglob
  patches=("$PATCH_DIR"/*.patch)
  [ ${#patches[@]} -gt 0 ] || die "no patches in $PATCH_DIR"
  for p in "${patches[@]}"; do apply_one "$p"; done
else
  if grep -q testGpuSharingAllowed "$src/src/common.cu"; then
    say "note: --no-patch, but $src already carries the mkernel patches"
  fi
fi

# ---- CUDA and NCCL ----------------------------------------------------------------------------
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[ -x "$CUDA_HOME/bin/nvcc" ] || die "no nvcc at $CUDA_HOME/bin/nvcc: set CUDA_HOME"

nccl_lib_dir() {  # nccl_lib_dir HOME: prints the folder holding libnccl.so*, if any
  local d
  for d in "$1/lib" "$1/lib64" "$1/lib/x86_64-linux-gnu" "$1/lib/aarch64-linux-gnu"; do
    if compgen -G "$d/libnccl.so*" >/dev/null; then echo "$d"; return 0; fi
  done
  return 1
}
find_nccl_home() {
  local c py
  if [ -n "${NCCL_HOME:-}" ]; then echo "$NCCL_HOME"; return 0; fi
  for c in "$CUDA_HOME" /usr/local/cuda /usr; do
    if [ -f "$c/include/nccl.h" ] && nccl_lib_dir "$c" >/dev/null; then echo "$c"; return 0; fi
  done
  # PyTorch's wheel (nvidia-nccl-cu1x) in PyTorch's interpreter (scripts/common.sh, mk_torch_python:
  # $MK_PYTHON, else one that imports torch), else python3.
  for py in "$(. "$(dirname "${BASH_SOURCE[0]}")/common.sh"; mk_torch_python)" python3; do
    c=$("$py" -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
    if [ -n "$c" ] && [ -f "$c/include/nccl.h" ] && nccl_lib_dir "$c" >/dev/null; then echo "$c"; return 0; fi
  done
  return 1
}
nccl_home=$(find_nccl_home) || die "NCCL not found (include/nccl.h + lib/libnccl.so*): set NCCL_HOME"
[ -f "$nccl_home/include/nccl.h" ] || die "NCCL_HOME=$nccl_home has no include/nccl.h"
nccl_libdir=$(nccl_lib_dir "$nccl_home") || die "NCCL_HOME=$nccl_home has no lib/libnccl.so*"
if [ ! -e "$nccl_libdir/libnccl.so" ]; then
  # A wheel ships only libnccl.so.2; -lnccl needs the unversioned name. Link against a private
  # NCCL_HOME whose lib/ holds that name (the binaries still record libnccl.so.2).
  [ -e "$nccl_libdir/libnccl.so.2" ] || die "$nccl_libdir has neither libnccl.so nor libnccl.so.2"
  shim_home=$build/nccl-home
  mkdir -p "$shim_home/lib"
  ln -sfn "$nccl_home/include" "$shim_home/include"
  ln -sf "$nccl_libdir/libnccl.so.2" "$shim_home/lib/libnccl.so"
  ln -sf "$nccl_libdir/libnccl.so.2" "$shim_home/lib/libnccl.so.2"
  say "NCCL: $nccl_home (no libnccl.so: linking through $shim_home)"
  link_home=$shim_home
else
  say "NCCL: $nccl_home"
  link_home=$nccl_home
fi
nccl_version=$(awk '/^#define NCCL_(MAJOR|MINOR|PATCH)/ {printf "%s%s", sep, $3; sep="."}' "$nccl_home/include/nccl.h")
say "NCCL headers $nccl_version, CUDA $("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), gencode: $gencode"

# ---- build ------------------------------------------------------------------------------------
targets=()
if [ "$tests" = all ]; then
  targets=(build)
else
  for t in $tests; do targets+=("$build/$t"); done
fi
# The selftest links the objects all_reduce_perf is made of.
[ "$selftest" = 1 ] && [ "$tests" != all ] && targets+=("$build/all_reduce_perf")
mpi_args=(MPI=0)
if [ "$mpi" = 1 ]; then
  [ -n "${MPI_HOME:-}" ] || die "--mpi needs MPI_HOME"
  mpi_args=(MPI=1 "MPI_HOME=$MPI_HOME")
fi
say "building into $build: $tests"
t0=$SECONDS
make -C "$src/src" -j "${MK_JOBS:-$(nproc)}" BUILDDIR="$build" CUDA_HOME="$CUDA_HOME" \
  NCCL_HOME="$link_home" NVCC_GENCODE="$gencode" "${mpi_args[@]}" "${targets[@]}" \
  || die "build failed"
say "built in $((SECONDS - t0)) s"

export LD_LIBRARY_PATH=$nccl_libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
status=0

# ---- selftest (no GPU) ------------------------------------------------------------------------
if [ "$selftest" = 1 ]; then
  [ "$apply_patches" = 1 ] || die "--selftest checks the patches: drop --no-patch"
  dir=$build/selftest
  mkdir -p "$dir"
  say "selftest: building $dir/selftest"
  # nccl-tests' main() lives in common.o: rename it so the selftest's main can drive the objects.
  objcopy --redefine-sym main=ncclTestsMain "$build/common.o" "$dir/common_nomain.o"
  cc -O1 -shared -fPIC -o "$dir/libfake_mkernel.so" "$PATCH_DIR/selftest/fake_mkernel.c"
  # shellcheck disable=SC2086  # gencode may hold several -gencode flags
  "$CUDA_HOME/bin/nvcc" -std=c++17 -DNCCL_OS_LINUX $gencode -I"$src/src" -I"$src/os" \
    -I"$link_home/include" -o "$dir/selftest" "$PATCH_DIR/selftest/selftest.cu" "$dir/common_nomain.o" \
    "$build/util.o" "$build/all_reduce.o" "$build/timer.o" "$build/verifiable/verifiable.o" \
    -L"$build/os" -lnccl_test_os -L"$link_home/lib" -lnccl || die "selftest build failed"
  "$dir/selftest" plain || status=1
  LD_PRELOAD=$dir/libfake_mkernel.so "$dir/selftest" fake || status=1
  if [ -n "$RUN_PRELOAD" ]; then
    LD_PRELOAD=$RUN_PRELOAD "$dir/selftest" real || status=1
  else
    say "selftest: no --preload libmkernel.so given, real-library check skipped"
  fi
fi

# ---- run --------------------------------------------------------------------------------------
[ -n "$run_list" ] || exit $status
for t in $run_list; do
  [ -x "$build/$t" ] || die "$build/$t was not built (add it to --tests)"
  say "run: ${RUN_PRELOAD:+LD_PRELOAD=$RUN_PRELOAD }$t $run_args (JSON: $build/$t.json)"
  rm -f "$build/$t.json"
  # shellcheck disable=SC2086  # run_args is a list of words on purpose
  LD_PRELOAD=$RUN_PRELOAD "$build/$t" $run_args -J "$build/$t.json" || { echo "$t failed (exit $?)" >&2; status=1; }
done
exit $status
