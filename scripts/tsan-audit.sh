#!/usr/bin/env bash
# ThreadSanitizer over mkernel's host code (not part of CI, which keeps one sanitizer build, ASan +
# UBSan; run it by hand after changes to threaded host code: the proxy, the nets, the bootstrap,
# the shim's reaper and groups):
#   bash scripts/tsan-audit.sh            (repository root; on 2 cores a few minutes of build, then
#                                          about 5 minutes of tests; docs/RELIABILITY.md)
# Builds with -DMKERNEL_TSAN=ON -DMKERNEL_DEVICE_CODE=OFF in build-tsan (TSAN_BUILD), runs the
# unit, proc and soak tiers there (TSAN_LABELS, default 'unit|proc|soak'; the soak for
# MKERNEL_SOAK_SECONDS, default 20 here; TSAN_REGEX narrows by name) and
# prints one row per test: result, seconds, and how many ThreadSanitizer reports it printed
# (a report makes the test fail: TSan's exit code 66). The reports' first lines follow the table.
# Exit status: non-zero if any test failed or any report was printed.
set -u -o pipefail
. "$(dirname "$0")/common.sh"  # mk_ctest_rows
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TSAN_BUILD:-$root/build-tsan}
logs=$build/logs-tsan
mkdir -p "$logs"
echo "== configure + build (ThreadSanitizer, host code) ($(date +%T))"
start=$(date +%s)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DMKERNEL_DEVICE_CODE=OFF -DMKERNEL_TSAN=ON -DMKERNEL_BUILD_TESTS=ON >"$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; exit 1; }
cmake --build "$build" -j"${TSAN_JOBS:-$(nproc)}" >"$logs/build.log" 2>&1 || { grep -m5 -A8 "error" "$logs/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
echo "== ctest -L '${TSAN_LABELS:-unit|proc|soak}' under ThreadSanitizer ($(date +%T))"
# second_deadlock_stack: both stacks of a lock-order report; history_size: older accesses kept.
export TSAN_OPTIONS="second_deadlock_stack=1 history_size=4 ${TSAN_OPTIONS:-}"
export MKERNEL_SOAK_SECONDS=${MKERNEL_SOAK_SECONDS:-20}
args=(-L "${TSAN_LABELS:-unit|proc|soak}" -LE 'gpu|verbs')
[ -n "${TSAN_REGEX:-}" ] && args+=(-R "$TSAN_REGEX")
(cd "$build" && ctest "${args[@]}" -V -j "${TSAN_CTEST_JOBS:-2}") >"$logs/ctest.log" 2>&1
rc=$?
# ctest -V prefixes each output line with the test's number ("12: WARNING: ThreadSanitizer: ...").
echo "| test | result | s | TSan reports |"
echo "|---|---|---|---|"
reports=0
while read -r num name res secs; do
  k=$(grep -c "^$num: WARNING: ThreadSanitizer" "$logs/ctest.log")
  reports=$((reports + k))
  echo "| $name | $res | $secs | $k |"
done < <(mk_ctest_rows "$logs/ctest.log")
echo "ctest rc=$rc; ThreadSanitizer reports: $reports (log: $logs/ctest.log)"
grep -E "^[0-9]+: (WARNING: ThreadSanitizer|SUMMARY: ThreadSanitizer)" "$logs/ctest.log" | sort | uniq -c | sort -rn | head -40
[ "$rc" = 0 ] && [ "$reports" = 0 ]
