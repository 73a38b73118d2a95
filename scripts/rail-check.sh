#!/usr/bin/env bash
# Issue 6's rail exchange (MKERNEL_HIER_RAIL: direct, ring, rhd; collectives/hier_staged.h,
# docs/ALGORITHMS.md) in one device call:
#   bash scripts/rail-check.sh        (repository root; carry .carry for Catch2)
#   1. builds libmkernel.so, mkernel-collbench and test_gpu_collectives (sm_90);
#   2. the Catch tags of RC_TESTS ("hierrail hierrailroles": test_gpu_hier_rail, every collective x
#      dtype x op, ring and rhd over 3-4 emulated nodes; test_gpu_hier_rail_roles, the same with the
#      AllReduce in CTA roles) RC_TEST_REPS times each (default 2): pass/fail and seconds of each;
#      RC_TESTS="" runs none and does not build the GPU tier (a sweep alone builds in less time);
#      RC_CTEST='REGEX' then runs those GPU-tier ctests (building test_gpu_kernel too), e.g.
#      'hier_inturn|graph_hier';
#   3. the hierarchical AllReduce on emulated nodes of one GPU (mkernel-collbench --ranks-per-node,
#      the proxies over loopback TCP), for each layout of RC_LAYOUTS ("8:2 6:2": ranks:per node, or
#      ranks:per node:lanes to set MKERNEL_HIER_CTAS for that layout, e.g. "8:2:1 8:2:3", or
#      ranks:per node:lanes:W,R to run it in CTA roles too, MKERNEL_HIER_ROLES=W,R, e.g. "8:2:1:2,2";
#      the roles take the AllReduces from MKERNEL_HIER_SPLIT_MIN_BYTES, 512 KiB by default),
#      each MKERNEL_HIER_RAIL of RC_RAILS ("direct ring rhd"), each variant of RC_VARIANTS ("-":
#      as is; "NAME:WORD,..." adds VAR=value words to the environment and --flag=value words to
#      collbench's arguments, its runs shown as rail "RAIL+NAME", e.g. "- bsync:--sync=blocking";
#      "rs:--coll=reducescatter,--sync=blocking" times a ReduceScatter instead, session 28),
#      pipelined and in turn (RC_OVERLAPS, "1 0"), RC_ROUNDS (2) rounds interleaved; RC_ITERS
#      (200) iterations per size, RC_MIN (4 KiB) to RC_MAX (16 MiB) by 4. A table per layout: the
#      eager median of each (rail, overlap) as "round 1/round 2/...", in us; the raw lines in
#      rail-sweep.txt; and scripts/overlap-table.py's
#      table (overlap-table.txt): the in-turn runs' phase times against the pipelined time, the
#      share of the shorter phase hidden (issue 6's goal: 80%; meant for one lane, "R:G:1");
#   4. (RC_TORCH="<torch_check.py options>", e.g. "--ranks 8 --gpus 1 --mps --ranks-per-node 2")
#      scripts/torch_check.py once per MKERNEL_HIER_RAIL of RC_TORCH_RAILS ("ring rhd"), with
#      MKERNEL_DEBUG=INFO, showing each rank's line matching RC_TORCH_SHOW ("exchange among the rail");
#      RC_TORCH_TIMEOUT (300) s each.
# NVLink multicast stays off (common.sh, mk_gpu_env). Logs in build-gpu/logs-rail; tables to $OUT.
set -u -o pipefail
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
build=${RC_BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build-gpu}
logs=$build/logs-rail
# shellcheck source=scripts/common.sh
. "$(dirname "$0")/common.sh"
mk_gpu_env
PY=$(mk_torch_python)
fail=0

step "1. build"
tests=${RC_TESTS-hierrail hierrailroles}
# shellcheck disable=SC2046
gpu_build "${RC_JOBS:-16}" mkernel mkernel-collbench $([ -n "$tests${RC_CTEST:-}" ] && echo test_gpu_collectives) \
  $([ -n "${RC_CTEST:-}" ] && echo test_gpu_kernel)
LIB=$build/lib/libmkernel.so
export LD_LIBRARY_PATH=$NCCL_HOME/lib:$build/lib:${LD_LIBRARY_PATH:-}

step "2. [$tests] x ${RC_TEST_REPS:-2}"
: >"$logs/tests.txt"
for i in $(seq 1 "${RC_TEST_REPS:-2}"); do
  for tag in $tests; do
    t0=$(date +%s%N)
    MKERNEL_TIMEOUT_S=60 timeout 200 "$build/tests/gpu/test_gpu_collectives" --order lex "[$tag]" >"$logs/$tag-$i.log" 2>&1
    rc=$?
    [ "$rc" = 0 ] || { fail=1; grep -E "FAILED|failed|with expansion" "$logs/$tag-$i.log" | head -5; }
    echo "[$tag] run $i: rc=$rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$logs/tests.txt"
  done
done
if [ -n "${RC_CTEST:-}" ]; then
  step "2b. ctest -R '$RC_CTEST'"
  (cd "$build" && ctest -R "$RC_CTEST" --output-on-failure) >"$logs/ctest.txt" 2>&1 || fail=1
  grep -E "Test +#|tests passed|FAILED|with expansion" "$logs/ctest.txt" | tee -a "$logs/tests.txt"
fi
save tests.txt

step "3. hierarchical collectives (AllReduce unless a variant says --coll): layouts ${RC_LAYOUTS:-8:2 6:2}, MKERNEL_HIER_RAIL in ${RC_RAILS:-direct ring rhd}, variants ${RC_VARIANTS:--}, overlap ${RC_OVERLAPS:-1 0}, ${RC_ROUNDS:-2} rounds"
: >"$logs/rail-sweep.txt"
for layout in ${RC_LAYOUTS:-8:2 6:2}; do
  IFS=: read -r ranks rpn lanes roles <<<"$layout"
  for round in $(seq 1 "${RC_ROUNDS:-2}"); do
    for ov in ${RC_OVERLAPS:-1 0}; do
      for rail in ${RC_RAILS:-direct ring rhd}; do
        for variant in ${RC_VARIANTS:--}; do
          # A variant "NAME:WORD,WORD": VAR=value words go to the environment, --flag words to
          # collbench; its runs show as rail "RAIL+NAME". "-": none.
          vname="" venv=() vargs=()
          if [ "$variant" != - ]; then
            vname=+${variant%%:*}
            IFS=, read -ra words <<<"${variant#*:}"
            for w in "${words[@]}"; do
              case $w in
                --*) vargs+=("${w%%=*}" "${w#*=}") ;;
                *=*) venv+=("$w") ;;
              esac
            done
          fi
          tag="$layout/$rail$vname/ov$ov/r$round"
          env ${lanes:+MKERNEL_HIER_CTAS=$lanes} ${roles:+MKERNEL_HIER_ROLES=$roles} MKERNEL_HIER_RAIL=$rail \
            MKERNEL_HIER_OVERLAP=$ov MKERNEL_SOCKET_IFNAME=lo MKERNEL_TIMEOUT_S=30 "${venv[@]}" \
            timeout 200 "$build/bin/mkernel-collbench" --gpus 1 --ranks "$ranks" --ranks-per-node "$rpn" --wait memop \
            --min-bytes "${RC_MIN:-4096}" --max-bytes "${RC_MAX:-16777216}" --step 4 --iters "${RC_ITERS:-200}" "${vargs[@]}" 2>&1 |
            sed "s|^|$tag: |" >>"$logs/rail-sweep.txt"
          [ "${PIPESTATUS[0]}" = 0 ] || { echo "$tag failed"; fail=1; }
        done
      done
    done
  done
done
# One table per layout: rows are sizes, a column per (rail, overlap) with each round's eager median.
awk '$2 ~ /^memop$/ && $1 ~ /\/r[0-9]+:$/ {
       split($1, a, "/"); lay = a[1]; col = a[2] "/" a[3]; r = a[4]; sub(":", "", r); sub("r", "", r)
       key = lay SUBSEP col SUBSEP $4
       m = int($5 + 0.5); if (key in v) m = v[key] "/" m; v[key] = m
       if (!(lay in seenL)) { seenL[lay] = 1; ls[++nl] = lay }
       if (!((lay, col) in seenC)) { seenC[lay, col] = 1; cs[lay, ++nc[lay]] = col }
       if (!((lay, $4) in seenB)) { seenB[lay, $4] = 1; bs[lay, ++nb[lay]] = $4 } }
     END { for (l = 1; l <= nl; ++l) { L = ls[l]; split(L, rr, ":")
             printf "\n%s ranks as %d nodes of %s%s%s (eager median per round, us; ov1 pipelined, ov0 in turn)\n", rr[1], rr[1] / rr[2], rr[2], (3 in rr) ? ", " rr[3] " lane(s)" : "", (4 in rr) ? ", CTA roles " rr[4] : ""
             printf "%10s", "bytes"; for (j = 1; j <= nc[L]; ++j) printf " %17s", cs[L, j]; print ""
             for (i = 1; i <= nb[L]; ++i) { B = bs[L, i]; printf "%10s", B
               for (j = 1; j <= nc[L]; ++j) printf " %17s", ((L, cs[L, j], B) in v) ? v[L, cs[L, j], B] : "-"; print "" } } }' \
  "$logs/rail-sweep.txt" | tee "$logs/rail-table.txt"
grep -E "failed|error|Error" "$logs/rail-sweep.txt" | head -5
# Issue 6's overlap measure: the in-turn runs' phase times (CTA 0, %globaltimer) against the
# pipelined time, per layout, rail and round (one lane: layouts "R:G:1").
python3 "$root/scripts/overlap-table.py" "$logs/rail-sweep.txt" | tee "$logs/overlap-table.txt"
save rail-table.txt rail-sweep.txt overlap-table.txt

if [ -n "${RC_TORCH:-}" ] && mk_have_torch "$PY"; then
  : >"$logs/torch-check.txt"
  for rail in ${RC_TORCH_RAILS:-ring rhd}; do
    step "4. torch_check $RC_TORCH, MKERNEL_HIER_RAIL=$rail"
    # shellcheck disable=SC2086
    MKERNEL_DEBUG=INFO MKERNEL_HIER_RAIL=$rail timeout "${RC_TORCH_TIMEOUT:-300}" "$PY" "$root/scripts/torch_check.py" --lib "$LIB" $RC_TORCH --timeout 180 \
      --show "${RC_TORCH_SHOW:-exchange among the rail}" >>"$logs/torch-check.txt" 2>&1 || fail=1
    grep -E "^\[torch_check\]|FAIL|Error|error|${RC_TORCH_SHOW:-exchange among}" "$logs/torch-check.txt" | cut -c1-300 | tail -12
  done
  save torch-check.txt
fi
echo "rail-check: fail=$fail"
exit "$fail"
