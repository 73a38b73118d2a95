#!/usr/bin/env bash
# Runs every Catch2 test case of one test binary on its own, each under a time limit, and prints a
# table (case, result, seconds): a hang costs one case's limit instead of the whole ctest run, and
# says which case hung.
#   bash scripts/gpu-cases.sh BINARY [LIMIT_S] [TAG_FILTER]
# Env: MKERNEL_TIMEOUT_S is passed through (set it small so that the kernel's own waits give up
# before the limit). Exit status: the number of cases that failed or timed out (0 = all passed).
set -u -o pipefail
. "$(dirname "$0")/common.sh"  # mk_catch_spec
bin=$1
limit=${2:-60}
filter=${3:-}
[ -x "$bin" ] || { echo "gpu-cases: $bin is not an executable"; exit 1; }
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
echo "gpu-cases: ${#cases[@]} cases, $bad failed or timed out"
exit $bad
