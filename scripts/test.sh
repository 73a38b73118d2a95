#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test tier this machine can run,
# prints ctest's summary, and exits non-zero on any failure. .ci/run calls exactly this.
#   MK_BUILD_DIR   build folder (default: build)
#   MK_SKIP_ASAN=1 skip the sanitizer build (developer shortcut; CI runs it)
#   bash scripts/test.sh [TIER]: TIER runs one tier alone, one of
#     format    every C, C++ and CUDA file against .clang-format (clang-format 14); --fix rewrites;
#     fuzz      the libFuzzer targets, bounded;
#     headers   the shim and the plugins compiled against the newest NCCL's headers;
#     netfault  the TCP transport across two network namespaces with faults in between;
#     spill     the device code's local-memory traffic (no GPU needed);
#     tsan      ThreadSanitizer over the host code (not part of CI).
#   Each tier's settings are described above its function below.
#   MK_SKIP_WHEEL=1 skip the wheel stage (developer shortcut; CI runs it)
set -uo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "$0")/common.sh"

# ---- fuzz -----------------------------------------------------------------------------------------
# Fuzz tier (docs/RELIABILITY.md): builds the libFuzzer targets of tests/fuzz with clang++
# (-fsanitize=fuzzer,address,undefined) from just the sources they need — the main build stays
# g++-only — and runs each for FUZZ_SECONDS (default 60) or FUZZ_RUNS executions (default 100000),
# whichever comes first, starting from the seed corpus in tests/fuzz/corpus/<target>/.
# Prints per target: executions, seconds, coverage at start -> end, crashes. Exits non-zero when a
# target crashed, leaked, hung or failed an invariant (the input is kept under $FUZZ_DIR/artifacts).
#   FUZZ_SECONDS=60 FUZZ_RUNS=100000 FUZZ_DIR=build-fuzz FUZZ_TARGETS="fuzz_tcp_net ..." scripts/test.sh fuzz
tier_fuzz() {
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
}

# ---- netfault -------------------------------------------------------------------------------------
# Network-fault tier (docs/RELIABILITY.md): the TCP net::Net backend across two network namespaces
# joined by a veth pair, with faults in between: a tc tbf rate limit, nftables random drops, a cut
# link (ip link set down), a stalled peer (SIGSTOP) and a killed peer (SIGKILL). Transfers must
# complete with every byte right, or fail cleanly (exit 2, an error message) within
# MKERNEL_TIMEOUT_S — never hang, never deliver a wrong byte. Bounded to about 2 minutes.
#   NETFAULT_BUILD=<build dir with netfault_peer, default build> scripts/test.sh netfault
# Skips (exit 0, "skipped: <reason>") when namespaces cannot be made, unless CI=true.
tier_netfault() {
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${NETFAULT_BUILD:-$ROOT/build}
TIMEOUT_S=${NETFAULT_TIMEOUT_S:-5}
NS_A=mknf-a-$$ NS_B=mknf-b-$$ IF_A=mknfa$$ IF_B=mknfb$$
IP_A=10.201.77.1 IP_B=10.201.77.2
WORK=$(mktemp -d /tmp/netfault.XXXXXX)

skip() {
  if [ "${CI:-}" = true ]; then echo "netfault-tier: FAILED (CI=true, cannot skip): $*"; exit 1; fi
  echo "netfault-tier: skipped: $*"; exit 0
}
cleanup() {
  ip netns del "$NS_A" 2>/dev/null; ip netns del "$NS_B" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

[ "$(id -u)" = 0 ] || skip "needs root for network namespaces"
command -v ip >/dev/null && command -v tc >/dev/null || skip "iproute2 (ip, tc) not installed"
if ! command -v nft >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null 2>&1
fi
ip netns add "$NS_A" 2>/dev/null || skip "cannot create a network namespace"
ip netns add "$NS_B" || skip "cannot create a second network namespace"
ip link add "$IF_A" type veth peer name "$IF_B" || skip "cannot create a veth pair"
ip link set "$IF_A" netns "$NS_A" && ip link set "$IF_B" netns "$NS_B" || skip "cannot move veths into namespaces"
ip -n "$NS_A" addr add "$IP_A/24" dev "$IF_A" && ip -n "$NS_B" addr add "$IP_B/24" dev "$IF_B"
ip -n "$NS_A" link set "$IF_A" up && ip -n "$NS_B" link set "$IF_B" up
ip -n "$NS_A" link set lo up && ip -n "$NS_B" link set lo up

if [ ! -x "$BUILD/tests/soak/netfault_peer" ]; then
  cmake --build "$BUILD" --target netfault_peer -j "${MK_JOBS:-2}" >/dev/null || { echo "netfault-tier: cannot build netfault_peer in $BUILD"; exit 1; }
fi
PEER=$BUILD/tests/soak/netfault_peer
export MKERNEL_TIMEOUT_S=$TIMEOUT_S MKERNEL_NET_SOCKETS=2 MKERNEL_DEBUG=WARN

status=0
printf '%-28s %-9s %-6s %-14s %8s %9s  %s\n' scenario receiver sender code seconds "err_after" "message"
# run NAME MESSAGES BYTES EXPECT(ok|error) [ACTION-AFTER-SECONDS ACTION...]
run() {
  local name=$1 msgs=$2 bytes=$3 expect=$4; shift 4
  local hf=$WORK/$name.handle
  rm -f "$hf"
  ip netns exec "$NS_A" env MKERNEL_SOCKET_IFNAME="=$IF_A" timeout 30 "$PEER" recv "$hf" "$msgs" "$bytes" >"$WORK/$name.recv" 2>"$WORK/$name.recv.err" &
  local rpid=$!
  ip netns exec "$NS_B" env MKERNEL_SOCKET_IFNAME="=$IF_B" "$PEER" send "$hf" "$msgs" "$bytes" >"$WORK/$name.send" 2>"$WORK/$name.send.err" &
  local spid=$!  # ip netns exec and env exec in place: this is the peer itself
  if [ $# -gt 0 ]; then
    local after=$1; shift
    sleep "$after"
    "$@" "$spid"
  fi
  wait $rpid; local rrc=$?
  kill -CONT $spid 2>/dev/null; kill -9 $spid 2>/dev/null
  wait $spid 2>/dev/null; local src=$?
  local rline sline; rline=$(cat "$WORK/$name.recv"); sline=$(cat "$WORK/$name.send")
  [ -n "${NETFAULT_VERBOSE:-}" ] && echo "   recv: $rline" && echo "   send: $sline"
  local res=${rline#result=}; res=${res%% *}
  local secs; secs=$(echo "$rline" | grep -Eo 'seconds=[0-9.]+' | cut -d= -f2)
  local errafter; errafter=$(echo "$rline" | grep -Eo 'error_after_progress_s=[0-9.]+' | cut -d= -f2)
  local msg; msg=$(echo "$rline" | grep -Eo 'msg=".*"' | cut -c5- | cut -c1-90)
  local code; code=$(echo "$rline" | grep -Eo 'code=[0-9]+' | cut -d= -f2)
  printf '%-28s %-9s %-6s %-14s %8s %9s  %s\n' "$name" "${res:-none}($rrc)" "$src" "${code:-?}" "${secs:-?}" "${errafter:-?}" "$msg"
  local bad=0
  [ "$rrc" = 1 ] && bad=1                                       # a wrong byte is never acceptable
  [ "$expect" = ok ] && [ "$rrc" != 0 ] && bad=1
  [ "$expect" = error ] && [ "$rrc" != 2 ] && bad=1             # must fail cleanly, not hang (124)
  if [ "$expect" = error ] && [ -n "$errafter" ] && awk -v e="$errafter" -v t="$TIMEOUT_S" 'BEGIN { exit !(e > t + 3) }'; then bad=1; fi
  if [ $bad = 1 ]; then status=1; echo "   ^ FAILED: expected $expect; receiver stderr:"; tail -3 "$WORK/$name.recv.err" | sed 's/^/   /'; fi
}
stop_peer() { kill -STOP "$1"; }
kill_peer() { kill -9 "$1"; }
cut_link() { ip -n "$NS_B" link set "$IF_B" down; }

only() { [ -z "${NETFAULT_ONLY:-}" ] || [[ "$1" == *"$NETFAULT_ONLY"* ]]; }
only baseline && run baseline_64x1MiB 64 1048576 ok
if only tbf; then
  tc -n "$NS_B" qdisc add dev "$IF_B" root tbf rate 40mbit burst 32kbit latency 50ms
  run tbf_40mbit_16x1MiB 16 1048576 ok
  tc -n "$NS_B" qdisc del dev "$IF_B" root
fi
if ! only nft; then
  :
elif command -v nft >/dev/null; then
  ip netns exec "$NS_B" nft add table inet mknf
  ip netns exec "$NS_B" nft add chain inet mknf out '{ type filter hook output priority 0 ; }'
  ip netns exec "$NS_B" nft add rule inet mknf out numgen random mod 100 '<' 5 counter drop
  run nft_drop5pct_32x1MiB 32 1048576 ok
  echo "   nft dropped: $(ip netns exec "$NS_B" nft list table inet mknf | grep -Eo 'packets [0-9]+ bytes [0-9]+')"
  ip netns exec "$NS_B" nft delete table inet mknf
else
  echo "nft_drop5pct: skipped: nftables not installed"
fi
only peer_killed && run peer_killed_mid_transfer 100000 1048576 error 1 kill_peer
only peer_stalled && run peer_stalled_sigstop 100000 1048576 error 1 stop_peer
only link_cut && run link_cut_mid_transfer 100000 1048576 error 1 cut_link
[ $status = 0 ] && echo "netfault-tier: passed" || echo "netfault-tier: FAILED"
exit $status
}

# ---- spill ----------------------------------------------------------------------------------------
# Local-memory traffic of the device code, per function and per kernel (no GPU needed):
#   bash scripts/test.sh spill [FILTER]
# Compiles collectives/device/kernel.cu for sm_90 as the build does, then counts the STL / LDL
# (local-memory store / load) instructions of every function in the SASS, listed under the kernel
# whose call graph it belongs to (ptxas compiles a non-inlined device function once per kernel
# that calls it). A data mover with STL / LDL inside its loop keeps its data in local memory.
# "spill": the STL / LDL nvdisasm marks as register spills and refills (not all are marked).
# "body": STL / LDL other than the callee-saved registers a function reached through a pointer
# (the persistent kernel's movers, docs/KERNEL.md) stores on entry and reloads before returning:
# the local-memory traffic of the function's body and loops; 0 for a clean mover.
# FILTER (a regular expression, default "reduceCopy|copyBytes|reduceDispatch|Kernel") selects
# the rows. cuobjdump and nvdisasm come from NVIDIA's PyPI wheels (nvidia-cuda-cuobjdump,
# nvidia-cuda-nvdisasm) when the CUDA installation lacks them; SPILL_TOOLS=DIR overrides.
# SPILL_CHECK=1 (scripts/test.sh's stage): exits 1 when a data mover (reduceCopy, copyBytes) of
# any kernel has more local-memory traffic in its body than tests/spill-baseline.txt allows
# (SPILL_BASELINE=FILE overrides): a loop around a mover's call that leaves it too few registers
# runs the op at half speed on the device.
tier_spill() {
# Any failing command ends the tier (it runs in a process of its own, `bash scripts/test.sh spill`).
set -e
root=$(cd "$(dirname "$0")/.." && pwd)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
work=${SPILL_WORK:-/tmp/mkernel-spill}
mkdir -p "$work"
tools=${SPILL_TOOLS:-}
if [ -z "$tools" ]; then
  if [ -x "$CUDA_HOME/bin/nvdisasm" ] && [ -x "$CUDA_HOME/bin/cuobjdump" ]; then
    tools=$CUDA_HOME/bin
  else
    tools=$work/tools/nvidia/cu13/bin
    if [ ! -x "$tools/nvdisasm" ]; then
      echo "spill-report: fetching cuobjdump and nvdisasm from PyPI into $work/tools" >&2
      python3 -m pip download --no-deps -q -d "$work/wheels" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
      for w in "$work"/wheels/*.whl; do python3 -m zipfile -e "$w" "$work/tools"; done
      chmod +x "$tools"/*
    fi
  fi
fi
# The CMake build's flags for kernel.cu (CMakeLists.txt), sm_90 SASS only. SPILL_REUSE=1: the SASS
# of the previous run in SPILL_WORK (another filter or baseline without compiling again).
if [ "${SPILL_REUSE:-0}" != 1 ] || [ ! -s "$work/kernel.sass" ]; then
"$CUDA_HOME/bin/nvcc" -DMKERNEL_HAVE_DEVICE_CODE=1 -I"$root" -O3 -DNDEBUG --generate-code=arch=compute_90,code=sm_90 \
  --extended-lambda -std=c++17 -Xptxas -v -x cu -c "$root/collectives/device/kernel.cu" -o "$work/kernel.o" \
  >"$work/ptxas.log" 2>&1 || { tail -20 "$work/ptxas.log"; exit 1; }
rm -f "$work"/kernel.*.cubin
(cd "$work" && "$tools/cuobjdump" -xelf all kernel.o >/dev/null)
"$tools/nvdisasm" -c "$work"/kernel.*sm_90.cubin >"$work/kernel.sass"
fi
SPILL_ROOT=$root python3 - "$work/kernel.sass" "${1:-reduceCopy|copyBytes|reduceDispatch|Kernel}" <<'EOF'
import os, re, subprocess, sys
sass, pattern = sys.argv[1], re.compile(sys.argv[2])
funcs, order, cur = {}, [], None
for line in open(sass):
    m = re.match(r'^(\$?[\w$.]+):\s*$', line)
    if m and not m.group(1).startswith('.L'):
        cur = m.group(1)
        if cur not in funcs:
            funcs[cur] = []
            order.append(cur)
        continue
    if cur and re.search(r'/\*[0-9a-f]{4,}\*/', line):
        funcs[cur].append(line)
BRANCH = re.compile(r'\b(BRA|BRX|CALL|RET|EXIT|JMP)\b')
def count(ins):
    stl = sum(1 for x in ins if re.search(r'\bSTL\b', x))
    ldl = sum(1 for x in ins if re.search(r'\bLDL\b', x))
    spill = sum(1 for x in ins if 'SpillRefill' in x)
    # Callee-saved registers: stores before the first branch, loads in the straight run before a
    # RET. Everything else is local-memory traffic in the function's body (its loops).
    saved = set()
    for k, x in enumerate(ins):
        if BRANCH.search(x): break
        if re.search(r'\bSTL\b', x): saved.add(k)
    for k, x in enumerate(ins):
        if not re.search(r'\bRET\b', x): continue
        j = k - 1
        while j >= 0 and not BRANCH.search(ins[j]):
            if re.search(r'\bLDL\b', ins[j]): saved.add(j)
            j -= 1
    body = sum(1 for k, x in enumerate(ins) if re.search(r'\b(STL|LDL)\b', x) and k not in saved)
    return stl, ldl, spill, body, len(ins)
def demangle(s):
    try:
        return subprocess.run(['c++filt'], input=s, capture_output=True, text=True).stdout.strip()
    except OSError:
        return s
bad = []
allowed = {}
for line in open(os.environ.get('SPILL_BASELINE') or os.environ['SPILL_ROOT'] + '/tests/spill-baseline.txt'):
    if line.strip() and not line.startswith('#'):
        k, f, n = line.rstrip('\n').split('\t')
        allowed[(k, f)] = int(n)
print(f"{'kernel':18s} {'function':60s} {'STL':>5s} {'LDL':>5s} {'spill':>5s} {'body':>5s} {'instr':>6s}")
for name in order:
    if not funcs[name]:
        continue
    parts = name.lstrip('.').replace('text.', '').split('$')
    parts = [p for p in parts if p]
    kernel = demangle(parts[0]).split('(')[0].split('::')[-1]
    func = demangle(parts[-1]).split('(')[0].replace('mkernel::coll::dev::', '') if len(parts) > 1 else '(kernel body)'
    if not (pattern.search(func) or pattern.search(kernel) and func == '(kernel body)'):
        continue
    stl, ldl, spill, body, n = count(funcs[name])
    print(f"{kernel:18s} {func[:60]:60s} {stl:5d} {ldl:5d} {spill:5d} {body:5d} {n:6d}")
    if body > allowed.get((kernel, func), 0) and re.search(r'reduceCopy|copyBytes', func):
        bad.append(f"{kernel} {func}: {body} local-memory accesses in its body "
                   f"(allowed {allowed.get((kernel, func), 0)}, tests/spill-baseline.txt)")
if os.environ.get('SPILL_CHECK') == '1':
    movers = sum(1 for name in order if re.search(r'reduceCopy|copyBytes', name))
    if movers == 0:
        sys.exit("spill-report: no data mover found in the SASS (the check would pass vacuously)")
    if bad:
        sys.exit("spill-report: data movers spill to local memory:\n  " + "\n  ".join(bad))
    print(f"spill-report: no data mover spills beyond tests/spill-baseline.txt ({movers} mover instances checked)")
EOF
grep -A2 "Compiling entry function" "$work/ptxas.log" | grep -E "entry|spill|Used" | sed 's/ptxas info    : //' | grep -v "Function properties" || true
}

# ---- tsan -----------------------------------------------------------------------------------------
# ThreadSanitizer over mkernel's host code (not part of CI, which keeps one sanitizer build, ASan +
# UBSan; run it by hand after changes to threaded host code: the proxy, the nets, the bootstrap,
# the shim's reaper and groups):
#   bash scripts/test.sh tsan             (repository root; on 2 cores a few minutes of build, then
#                                          about 5 minutes of tests; docs/RELIABILITY.md)
# Builds with -DMKERNEL_TSAN=ON -DMKERNEL_DEVICE_CODE=OFF in build-tsan (TSAN_BUILD), runs the
# unit, proc and soak tiers there (TSAN_LABELS, default 'unit|proc|soak'; the soak for
# MKERNEL_SOAK_SECONDS, default 20 here; TSAN_REGEX narrows by name) and
# prints one row per test: result, seconds, and how many ThreadSanitizer reports it printed
# (a report makes the test fail: TSan's exit code 66). The reports' first lines follow the table.
# Exit status: non-zero if any test failed or any report was printed.
tier_tsan() {
root=$(cd "$(dirname "$0")/.." && pwd)
build=${TSAN_BUILD:-$root/build-tsan}
logs=$build/logs-tsan
mkdir -p "$logs"
echo "== configure + build (ThreadSanitizer, host code) ($(date +%T))"
start=$(date +%s)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMKERNEL_BUILD_TESTS=ON -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DMKERNEL_DEVICE_CODE=OFF -DMKERNEL_TSAN=ON >"$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; exit 1; }
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
}

# ---- format ---------------------------------------------------------------------------------------
# The project's .clang-format (Google style, 100 columns) over every C, C++ and CUDA file that git
# tracks, with clang-format 14, the version CI installs (others lay out some constructs
# differently):
#   bash scripts/test.sh format          checks (a CI stage, seconds): lists the files that differ
#   bash scripts/test.sh format --fix    rewrites them in place
# `// clang-format off` / `on` keeps a hand-aligned table as it is.
tier_format() {
local cf files out bad
cf=$(command -v clang-format-14 || true)
[ -n "$cf" ] || { echo "format: clang-format-14 not found (apt-get install clang-format-14)"; return 1; }
mapfile -t files < <(git -C "$MK_ROOT" ls-files '*.c' '*.cc' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = --fix ]; then
  (cd "$MK_ROOT" && "$cf" -i "${files[@]}") && echo "format: ${#files[@]} files formatted"
  return
fi
out=$(cd "$MK_ROOT" && "$cf" --dry-run "${files[@]}" 2>&1)
bad=$(sed -nE 's/^([^:]+):[0-9]+:[0-9]+: (warning|error): code should be clang-formatted.*/\1/p' <<<"$out" | sort | uniq -c)
if [ -n "$bad" ]; then
  echo "format: these files differ from .clang-format (places per file; bash scripts/test.sh format --fix):"
  echo "$bad"
  return 1
fi
echo "format: ${#files[@]} files match .clang-format ($("$cf" --version | head -1))"
}

# ---- headers --------------------------------------------------------------------------------------
# The shim and the plugins against the newest NCCL's headers as well as the installed ones
# (`scripts/test.sh headers` alone, a CI stage):
# nccl.h and nccl_device/ of PyPI's nvidia-nccl-cu12 wheel (MK_NCCL_NEWEST, default 2.32.3), kept in
# $BUILD/nccl-<version>/include so that a rerun needs no network; a host-only configure in
# $BUILD-nccl-<version> with MKERNEL_NCCL_INCLUDE_DIR there, then every object of plugin/ (the
# library's only sources that include nccl.h; nothing is linked). Fails when the configure did not
# take that nccl.h or an object does not compile, and then names each NCCL function or type the
# compiler could not match against that header (docs/TROUBLESHOOTING.md, "NCCL versions").
tier_headers() {
  BUILD=${BUILD:-${MK_BUILD_DIR:-$MK_ROOT/build}}
  local ver=${MK_NCCL_NEWEST:-2.32.3} inc dir tmp objs bad names rc=0 launcher=()
  inc=$(realpath -m "$BUILD/nccl-$ver/include") dir=$BUILD-nccl-$ver
  if [ ! -f "$inc/nccl.h" ]; then
    tmp=$(mktemp -d)
    python3 -m pip download --no-deps -q -d "$tmp" "nvidia-nccl-cu12==$ver" &&
      python3 - "$tmp"/nvidia_nccl_cu12-*.whl "$BUILD/nccl-$ver" <<'EOF' || rc=1
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as whl:
    names = [n for n in whl.namelist() if n.startswith("nvidia/nccl/include/")]
    for n in names:
        whl.extract(n, sys.argv[2] + "/wheel")
print(f"nvidia-nccl-cu12: {len(names)} header files")
EOF
    rm -rf "$tmp"
    if [ $rc != 0 ] || [ ! -f "$BUILD/nccl-$ver/wheel/nvidia/nccl/include/nccl.h" ]; then
      echo "headers: cannot fetch the nvidia-nccl-cu12==$ver wheel's headers"
      return 1
    fi
    mv "$BUILD/nccl-$ver/wheel/nvidia/nccl/include" "$inc" && rm -rf "$BUILD/nccl-$ver/wheel"
  fi
  echo "nccl.h: $inc ($(grep -m1 '^#define NCCL_VERSION_CODE' "$inc/nccl.h"))"
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  mkdir -p "$dir"
  cmake -S "$MK_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMKERNEL_DEVICE_CODE=OFF -DMKERNEL_BUILD_TESTS=OFF \
    -DMKERNEL_NCCL_INCLUDE_DIR="$inc" "${launcher[@]}" >"$dir/configure.log" 2>&1 || { tail -20 "$dir/configure.log"; return 1; }
  grep -F "mkernel: NCCL ${ver%.*} headers in $inc" "$dir/configure.log" ||
    { echo "headers: the configure did not take $inc"; grep "mkernel: NCCL" "$dir/configure.log"; return 1; }
  # The objects' make targets (CMake's Makefile generator: one per source of the top folder's targets).
  mapfile -t objs < <(grep -oE '^plugin/[^ :]+\.cc\.o' "$dir/Makefile" | sort -u)
  [ ${#objs[@]} -gt 0 ] || { echo "headers: no plugin/ objects in $dir/Makefile"; return 1; }
  LC_ALL=C make -C "$dir" -k -j"$MK_JOBS" "${objs[@]}" >"$dir/build.log" 2>&1 || rc=1
  # Which nccl.h the objects saw: the preprocessed net ABI names the file it included.
  if ! LC_ALL=C make -C "$dir" plugin/net/net_entry.cc.i >/dev/null 2>&1 ||
    ! grep -qF "\"$inc/nccl.h\"" "$dir/CMakeFiles/mkernel.dir/plugin/net/net_entry.cc.i"; then
    echo "headers: plugin/net/net_entry.cc did not include $inc/nccl.h"
    rc=1
  fi
  bad=$(sed -nE 's|^make\[[0-9]+\]: \*\*\* \[.*/(plugin/[^]]+)\.o\].*|\1|p' "$dir/build.log" | sort -u)
  echo "compiled against NCCL $ver: $(( ${#objs[@]} - $(grep -c . <<<"$bad") )) of ${#objs[@]} plugin/ objects"
  if [ -n "$bad" ]; then
    echo "these do not compile: $(tr "\n" " " <<<"$bad")"
    # The names: the first quoted name of an error, as in "'::ncclX' has not been declared" or
    # "conflicting declaration of C function '... ncclX(...)'" (not a "did you mean" suggestion).
    names=$(sed -nE "s/.*error: [^']*'[^']*\<(p?nccl[A-Za-z0-9_]*)\>[^']*'.*/\1/p" "$dir/build.log" | sort -u)
    echo "NCCL names in the errors: $(tr "\n" " " <<<"$names")"
    grep -E 'error:' "$dir/build.log" | sed -E 's|^[^ ]*/(plugin/)|\1|' | sort | uniq -c | sort -rn | head -20
    echo "(log: $dir/build.log)"
  fi
  return $rc
}

# ---- CI: every tier this machine can run ----------------------------------------------------------
run_ci() {
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
# mkernel.stats(), python -m mkernel.run). The CMake build stays in $BUILD-wheel between runs; it
# takes the main build's build type and architecture (the wheel users get is Release, all
# architectures) so that ccache serves it the main build's objects. The source tree must be left as
# it was.
wheel_stage() {
  local tmp rel version left rc=0 cmake_args=""
  tmp=$(mktemp -d) rel=${BUILD#"$MK_ROOT"/}
  tree_files() { git status --porcelain --ignored --untracked-files=all | grep -v "^!! $rel-wheel/" | sort; }
  tree_files >"$tmp/before"
  version=$(sed -n 's/^project(mkernel VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
  cmake_args=$( (mk_ccache_args; echo -DMKERNEL_CUDA_ARCH=90) | paste -sd';')
  python3 -m venv "$tmp/venv" &&
    SKBUILD_BUILD_DIR=$BUILD-wheel SKBUILD_CMAKE_ARGS=$cmake_args SKBUILD_CMAKE_BUILD_TYPE=RelWithDebInfo \
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
stage "format (clang-format 14)" tier_format
stage "build (sm_90 + host)" mk_build "$BUILD" -DMKERNEL_CUDA_ARCH=90 -DMKERNEL_BUILD_TESTS=ON
stage "shim + plugins: NCCL ${MK_NCCL_NEWEST:-2.32.3} headers" tier_headers
# The data movers' SASS: no local memory in their loops (`scripts/test.sh spill`; a regression
# there halves a collective's speed and no CPU test sees it).
[ $fail = 0 ] && stage "device code: movers without spills" env SPILL_CHECK=1 SPILL_WORK="$BUILD/spill" \
    bash scripts/test.sh spill 'reduceCopy|copyBytes'
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
  stage "network-fault tier (netns, tc, nft)" env NETFAULT_BUILD="$BUILD" bash scripts/test.sh netfault
fi
[ "${MK_SKIP_WHEEL:-0}" != 1 ] && stage "wheel: pip install . + python -m mkernel" wheel_stage
stage "fuzz tier (libFuzzer, bounded)" bash scripts/test.sh fuzz
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
}

case ${1:-} in
  "") run_ci ;;
  format | fuzz | headers | netfault | spill | tsan)
    tier=$1
    shift
    "tier_$tier" "$@"
    ;;
  *)
    echo "test.sh: unknown tier '$1' (format, fuzz, headers, netfault, spill or tsan; none: every tier)" >&2
    exit 2
    ;;
esac
