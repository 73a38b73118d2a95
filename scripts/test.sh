#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test tier this machine can run,
# prints ctest's summary, and exits non-zero on any failure. .ci/run calls exactly this.
#   MK_BUILD_DIR   build folder (default: build)
#   MK_SKIP_ASAN=1 skip the sanitizer build (developer shortcut; CI runs it)
#   MK_SKIP_WHEEL=1 skip the wheel stage (developer shortcut; CI runs it)
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$MK_ROOT"
BUILD=${MK_BUILD_DIR:-$MK_ROOT/build}
declare -a STAGES=()
fail=0
stage() {  # stage NAME CMD...: runs CMD, records its outcome and time
  local name=$1; shift
  local t0=$SECONDS
  mk_say "$name"
  if "$@"; then STAGES+=("$(printf '%-34s %-8s %5ss' "$name" passed $((SECONDS - t0)))")
  else STAGES+=("$(printf '%-34s %-8s %5ss' "$name" FAILED $((SECONDS - t0)))"); fail=1; fi
}

# The Python wheel as a user installs it: `pip wheel .` (scikit-build-core, pyproject.toml) and
# `pip install` of that wheel into a fresh venv, then tests/install/check_python.py run from outside
# the source tree on the installed package (python -m mkernel --lib/--version/--plugin-dir,
# mkernel.stats(), python -m mkernel.run). The CMake build stays in $BUILD-wheel between runs and
# uses ccache when there is one; the source tree must be left as it was.
wheel_stage() {
  local tmp rel version left rc=0 cmake_args=""
  tmp=$(mktemp -d) rel=${BUILD#"$MK_ROOT"/}
  tree_files() { git status --porcelain --ignored --untracked-files=all | grep -v "^!! $rel-wheel/" | sort; }
  tree_files >"$tmp/before"
  version=$(sed -n 's/^project(mkernel VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
  command -v ccache >/dev/null &&
    cmake_args="-DCMAKE_C_COMPILER_LAUNCHER=ccache;-DCMAKE_CXX_COMPILER_LAUNCHER=ccache;-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
  python3 -m venv "$tmp/venv" &&
    SKBUILD_BUILD_DIR=$BUILD-wheel SKBUILD_CMAKE_ARGS=$cmake_args \
      "$tmp/venv/bin/pip" wheel --no-deps -q -w "$tmp/dist" "$MK_ROOT" &&
    ls "$tmp/dist" && python3 -m zipfile -l "$tmp"/dist/mkernel-*.whl &&
    "$tmp/venv/bin/pip" install -q "$tmp"/dist/mkernel-*.whl &&
    (cd "$tmp" && "$tmp/venv/bin/python" "$MK_ROOT/tests/install/check_python.py" --installed \
       --version "$version" --cc "${CC:-cc}") || rc=1
  left=$(tree_files | comm -13 "$tmp/before" -)
  if [ -n "$left" ]; then
    echo "wheel: the build left files in the source tree:"
    echo "$left"
    rc=1
  fi
  rm -rf "$tmp"
  return $rc
}

mk_install_deps || exit 1
stage "build (sm_90 + host)" mk_build "$BUILD" -DMKERNEL_CUDA_ARCH=90 -DMKERNEL_BUILD_TESTS=ON
# The data movers' SASS: no local memory in their loops (scripts/spill-report.sh; a regression
# there halves a collective's speed and no CPU test sees it).
[ $fail = 0 ] && stage "device code: movers without spills" env SPILL_CHECK=1 SPILL_WORK="$BUILD/spill" \
    bash scripts/spill-report.sh 'reduceCopy|copyBytes'
if [ $fail = 0 ]; then
  stage "unit + proc + soak tiers" ctest --test-dir "$BUILD" -LE 'gpu|verbs' --output-on-failure -j 2
  if mk_have_gpu; then
    stage "gpu tier" ctest --test-dir "$BUILD" -L gpu --output-on-failure
  else
    mk_say "skipped: GPU tier (ctest label gpu): no GPU on this machine. Run scripts/gpu-check.sh on a GPU machine."
  fi
  if [ -x scripts/verbs-tier.sh ]; then
    stage "verbs tier (Soft-RoCE VM)" scripts/verbs-tier.sh "$BUILD"
  fi
  stage "network-fault tier (netns, tc, nft)" env NETFAULT_BUILD="$BUILD" bash scripts/netfault-tier.sh
fi
[ "${MK_SKIP_WHEEL:-0}" != 1 ] && stage "wheel: pip install . + python -m mkernel" wheel_stage
stage "fuzz tier (libFuzzer, bounded)" bash scripts/fuzz-tier.sh
if [ "${MK_SKIP_ASAN:-0}" != 1 ]; then
  # -O1 -g1: half the compile time of -O2 -g under ASan, with line tables for the reports.
  stage "ASan+UBSan build (host code)" mk_build "$BUILD-asan" -DMKERNEL_BUILD_TESTS=ON -DMKERNEL_DEVICE_CODE=OFF -DMKERNEL_SANITIZE=ON \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1"
  # LeakSanitizer on everything. The two tests that load the live hwloc topology run apart, with
  # one suppression (tests/lsan.supp: hwloc's PCI plugin leaks 1 KB per load, outside mkernel)
  # and the slow unwinder that the suppression needs to see hwloc's frames (docs/RELIABILITY.md).
  lsan_hwloc='^(test_topology|mkernel_topo_live)$'
  [ $fail = 0 ] && stage "ASan+UBSan+LSan: unit + proc + soak" env ASAN_OPTIONS=detect_leaks=1:protect_shadow_gap=0 \
      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 MKERNEL_SOAK_SECONDS=20 \
      ctest --test-dir "$BUILD-asan" -L 'unit|proc|soak' -LE 'gpu|verbs' -E "$lsan_hwloc" --output-on-failure -j 2
  [ $fail = 0 ] && stage "ASan+UBSan+LSan: live hwloc (2 tests)" env ASAN_OPTIONS=detect_leaks=1:protect_shadow_gap=0 \
      LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0" \
      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      ctest --test-dir "$BUILD-asan" -R "$lsan_hwloc" --output-on-failure
fi

mk_say "summary"
printf '%s\n' "${STAGES[@]}"
if [ $fail = 0 ]; then echo "scripts/test.sh: all stages passed"; else echo "scripts/test.sh: FAILED"; fi
exit $fail
