#!/usr/bin/env bash
# Head-of-line blocking between ranks that share a GPU (docs/RELIABILITY.md, session 10): does a
# command queued behind a kernel that waits for its peers (an event record, the application's
# next kernel) hold back a peer's kernel queued later in a shared hardware queue, and does a host
# barrier before that command (mkernel's rule for co-located ranks, --fence) prevent it?
#   bash scripts/hol-probe.sh        (repository root, on the GPU machine; about 60 s)
# Builds mkernel-queueprobe (tools/dev: -DMKERNEL_BUILD_DEV_TOOLS=ON) into HOL_BUILD (default
# build-gpu), then runs it with the ranks' launches staggered (HOL_STAGGER_US, default 2000: each
# rank's commands reach the GPU before the next rank's), for every after-command with and without
# the fence, at 1 hardware queue (every stream shares it) and at 32 (streams made after HOL_GAPS
# others, so that some share). Prints the queueprobe tables and a summary: rows, stalled rounds.
# Logs to $OUT/hol-probe.txt when set.
set -u -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${HOL_BUILD:-$root/build-gpu}
{ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMKERNEL_DEVICE_CODE=ON -DMKERNEL_BUILD_DEV_TOOLS=ON \
    -DMKERNEL_BUILD_TESTS=OFF >/dev/null && cmake --build "$build" -j"${HOL_JOBS:-16}" --target mkernel-queueprobe >/dev/null; } ||
  { echo "build failed"; exit 1; }
bin=$build/bin/mkernel-queueprobe
log=${OUT:-/tmp}/hol-probe.txt
: >"$log"
printf '%-6s %-7s %-6s %s\n' queues after fence "stalled/rounds (per ranks x gap row)" | tee -a "$log"
for conns in 1 32; do
  gaps=0
  [ "$conns" = 1 ] || gaps=${HOL_GAPS:-0,31}
  for after in none record kernel; do
    for fence in "" --fence; do
      [ "$after" = none ] && [ -n "$fence" ] && continue
      # shellcheck disable=SC2086  # fence: zero or one word
      out=$(CUDA_DEVICE_MAX_CONNECTIONS=$conns timeout 120 "$bin" --after "$after" $fence \
        --stagger-us "${HOL_STAGGER_US:-2000}" --ranks "${HOL_RANKS:-2,4,8}" --variants reused --gaps "$gaps" \
        --rounds "${HOL_ROUNDS:-8}" --timeout-ms 100 2>&1)
      echo "$out" >>"$log"
      cells=$(echo "$out" | awk '$1 == "reused" { printf "%s%d/%d", sep, $6, $5; sep = " " }')
      printf '%-6s %-7s %-6s %s\n' "$conns" "$after" "${fence:+yes}" "${cells:-no rows: $(echo "$out" | tail -1)}" | tee -a "$log"
    done
  done
done
