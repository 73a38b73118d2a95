#!/usr/bin/env bash
# Issue 6's failure cases on emulated nodes, many times over, in one device call:
#   bash scripts/hierfail-check.sh      (repository root; carry .carry for Catch2)
# It builds test_gpu_kernel (sm_90) and runs its [hierfail] cases (tests/gpu/test_gpu_kernel.cc,
# hierPartMissing: 2 emulated nodes x 2 thread ranks; "stall", rank 3 never posts the second
# AllReduce; "gone", node 1 aborts and finalizes while node 0 is inside it) HF_REPS times (10)
# as is and HF_REPS times in CTA roles (MKERNEL_HIER_ROLES=1,1, test_gpu_hier_fail_roles'
# settings). One row per run: its result, seconds, how long each survivor of "gone" waited and
# what released it (proxy: the proxy's own failure naming node 1; "proxy, half closed": the same
# through the TCP comm's close seen on a data socket while socket 0 stayed silent, session 29's
# slow survivor's state, failed after 1 s since session 30; wait: its timeout), node 1's
# abort-and-finalize seconds, and the stalled survivors' waits. Then the count of runs in which a
# survivor of "gone" waited 10 s or more (session 29: 2 of 20, before an aborted finalize stopped
# copying the launch counters, docs/RELIABILITY.md). Logs in build-gpu/logs-hierfail; the table
# (hierfail.txt) to $OUT. HF_LIMIT: seconds per run (120). Exit status: non-zero if any run failed.
set -u -o pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
build=${HF_BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build-gpu}
logs=$build/logs-hierfail
# shellcheck source=scripts/common.sh
. "$(dirname "$0")/common.sh"
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
