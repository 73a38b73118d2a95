#!/usr/bin/env bash
# Fuzz tier (docs/RELIABILITY.md): builds the libFuzzer targets of tests/fuzz with clang++
# (-fsanitize=fuzzer,address,undefined) from just the sources they need — the main build stays
# g++-only — and runs each for FUZZ_SECONDS (default 60) or FUZZ_RUNS executions (default 100000),
# whichever comes first, starting from the seed corpus in tests/fuzz/corpus/<target>/.
# Prints per target: executions, seconds, coverage at start -> end, crashes. Exits non-zero when a
# target crashed, leaked, hung or failed an invariant (the input is kept under $FUZZ_DIR/artifacts).
#   FUZZ_SECONDS=60 FUZZ_RUNS=100000 FUZZ_DIR=build-fuzz FUZZ_TARGETS="fuzz_tcp_net ..." scripts/fuzz-tier.sh
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZ_RUNS=${FUZZ_RUNS:-100000}
FUZZ_DIR=${FUZZ_DIR:-$ROOT/build-fuzz}
FUZZ_TARGETS=${FUZZ_TARGETS:-"fuzz_bootstrap_wire fuzz_bootstrap_root fuzz_tcp_net"}
CXX=${FUZZ_CXX:-$(command -v clang++ || command -v clang++-14 || true)}
JOBS=${MK_JOBS:-2}

if [ -z "$CXX" ]; then
  echo "fuzz-tier: clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2
  exit 1
fi
mkdir -p "$FUZZ_DIR/obj" "$FUZZ_DIR/bin"

# Library sources the targets link: common/, the bootstrap, the TCP backend and its interface list.
LIB_SOURCES=$(cd "$ROOT" && ls common/*.cc transport/bootstrap/*.cc transport/net/tcp/*.cc transport/net/socket_iface.cc)
CXXFLAGS="-std=c++17 -g -O1 -fno-omit-frame-pointer -I$ROOT -Wall -Wno-unused-parameter"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"

compile() {  # src obj flags...
  local src=$1 obj=$2; shift 2
  if [ ! -f "$obj" ] || [ "$ROOT/$src" -nt "$obj" ] || [ -n "$(find "$ROOT/common" "$ROOT/transport" "$ROOT/tests/fuzz" -name '*.h' -newer "$obj" -print -quit)" ]; then
    "$CXX" $CXXFLAGS $SAN "$@" -c "$ROOT/$src" -o "$obj" || return 1
  fi
}

echo "== fuzz-tier: building with $CXX into $FUZZ_DIR"
OBJS=()
pids=()
for src in $LIB_SOURCES; do
  obj="$FUZZ_DIR/obj/$(echo "$src" | tr '/' '_').o"
  OBJS+=("$obj")
  compile "$src" "$obj" -fsanitize=fuzzer-no-link &
  pids+=($!)
  if [ ${#pids[@]} -ge "$JOBS" ]; then wait "${pids[0]}" || exit 1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || exit 1; done
for t in $FUZZ_TARGETS; do
  compile "tests/fuzz/$t.cc" "$FUZZ_DIR/obj/$t.o" -fsanitize=fuzzer-no-link || exit 1
  "$CXX" $SAN -fsanitize=fuzzer "$FUZZ_DIR/obj/$t.o" "${OBJS[@]}" -o "$FUZZ_DIR/bin/$t" -ldl -lpthread || exit 1
done

status=0
printf '\n%-22s %10s %8s %16s %8s\n' target executions seconds "coverage" crashes
for t in $FUZZ_TARGETS; do
  corpus="$FUZZ_DIR/corpus/$t"
  art="$FUZZ_DIR/artifacts/$t"
  mkdir -p "$corpus" "$art"
  log="$FUZZ_DIR/$t.log"
  start=$(date +%s.%N)
  # New inputs go to the work corpus; the committed seeds are only read.
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} \
    "$FUZZ_DIR/bin/$t" "$corpus" "$ROOT/tests/fuzz/corpus/$t" \
    -max_total_time="$FUZZ_SECONDS" -runs="$FUZZ_RUNS" -timeout=15 -rss_limit_mb=3072 \
    -artifact_prefix="$art/" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || true)
  cov0=$(grep -Eo 'INITED cov: [0-9]+' "$log" | head -1 | grep -Eo '[0-9]+$' || true)
  cov1=$(grep -Eo '(DONE|#[0-9]+) +[A-Za-z]* *cov: [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+$' || true)
  crashes=$(find "$art" -type f | wc -l)
  printf '%-22s %10s %8.1f %16s %8s\n' "$t" "${execs:-?}" "$secs" "${cov0:-?} -> ${cov1:-?}" "$crashes"
  if [ $rc -ne 0 ] || [ "$crashes" -ne 0 ]; then
    status=1
    echo "   $t FAILED (exit $rc); artifacts in $art; last lines of $log:"
    grep -E 'ERROR|INVARIANT|SUMMARY|leak|timeout' "$log" | head -10 | sed 's/^/   /'
  fi
done
exit $status
