#!/bin/bash
# The verbs test tier: real RDMA verbs on Soft-RoCE (rxe) inside QEMU VMs (scripts/rdma-vm/).
# Usage: scripts/verbs-tier.sh BUILD_DIR        (called by scripts/test.sh)
#   1. one VM: ctest -L verbs (test_net_verbs: the whole net::Net suite and the verbs data path;
#      test_verbs_fault: a peer killed mid-transfer), then the NCCL net-plugin tests with
#      MKERNEL_NET_BACKEND=ib (when libmkernel.so and those tests are built), all but the cases
#      tagged [early-sends]: those need a send accepted before its receive is posted, which TCP
#      does and verbs, like NCCL's IB transport, does not (it answers NULL until the receive is
#      posted); each has a receive-first twin that runs here (docs/VERBS.md);
#      then test_proxy (the proxy ring protocol, transport/proxy) and test_hier_staged's [vm]
#      cases (the hierarchical collectives with proxies) on verbs when built;
#   2. two VMs joined by a QEMU socket netdev: verbs_pair (two hosts, data verified both ways),
#      then the same under netem loss and delay, then a cut link (docs/RELIABILITY.md).
# Prints one summary line per step. If the VM cannot start (no qemu, no kernel package) it prints
# "skipped: <reason>" and exits 0 — unless CI=true, where that is a failure (exit 1).
# Env: VM_TIMEOUT (per VM, default 480 s), VM_HOME (default <repo>/.vm).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:?usage: verbs-tier.sh BUILD_DIR}
BUILD=$(cd "$BUILD" && pwd) || { echo "verbs-tier: no build dir $1" >&2; exit 2; }
VMDIR=$REPO/scripts/rdma-vm
export VM_HOME=${VM_HOME:-$REPO/.vm}
export VM_TIMEOUT=${VM_TIMEOUT:-480}
cd "$REPO"   # the VMs share the current directory read-write: the repo, so .vm/ is visible to both

skip() {
  echo "verbs-tier: skipped: $*"
  if [ "${CI:-}" = true ]; then echo "verbs-tier: CI=true: a skipped verbs tier is a failure" >&2; exit 1; fi
  exit 0
}

for t in test_net_verbs test_verbs_fault verbs_pair; do
  [ -x "$BUILD/tests/transport/net/ib/$t" ] || { echo "verbs-tier: $BUILD/tests/transport/net/ib/$t is not built" >&2; exit 2; }
done
command -v qemu-system-x86_64 >/dev/null 2>&1 || [ "$(id -u)" = 0 ] || skip "qemu-system-x86_64 missing and not root to install it"
t0=$(date +%s)
setup_out=$("$VMDIR/setup.sh" 2>&1) || skip "$(echo "$setup_out" | tail -1)"
echo "verbs-tier: $setup_out ($(( $(date +%s) - t0 )) s)"

# --- 1. one VM --------------------------------------------------------------------------------------
PLUGIN_TESTS=""
for t in test_net_plugin test_net_plugin_proc; do
  [ -x "$BUILD/tests/plugin/$t" ] && [ -e "$BUILD/lib/libmkernel.so" ] && PLUGIN_TESTS="$PLUGIN_TESTS $t"
done
t1=$(date +%s)
VM_LOG=$(mktemp "$VM_HOME/verbs-tier.XXXXXX")
"$VMDIR/run.sh" "
step() { name=\$1; shift; s=\$(date +%s); \"\$@\"; rc=\$?; echo \"STEP \$name rc=\$rc \$(( \$(date +%s) - s ))s\"; }
ibv_devices | sed 's/^/ibv: /'
step ctest-verbs ctest --test-dir '$BUILD' -L verbs --output-on-failure --timeout 300
export MKERNEL_NET_BACKEND=ib
for t in $PLUGIN_TESTS; do step plugin-ib-\$t '$BUILD/tests/plugin/'\$t '~[early-sends]'; done
[ -x '$BUILD/tests/transport/proxy/test_proxy' ] && step proxy-ib '$BUILD/tests/transport/proxy/test_proxy'
[ -x '$BUILD/tests/transport/proxy/test_hier_staged' ] && step hier-ib '$BUILD/tests/transport/proxy/test_hier_staged' '[vm]'
" > "$VM_LOG" 2>&1
vmrc=$?
t2=$(date +%s)
if grep -q "VMINIT: userspace up" "$VM_LOG"; then :; else
  cat "$VM_LOG" >&2; rm -f "$VM_LOG"; skip "the VM did not boot (qemu rc=$vmrc)"
fi
grep -q "VMINIT: rxe0 added" "$VM_LOG" || { cat "$VM_LOG"; echo "verbs-tier: FAILED: rxe0 could not be created in the VM"; exit 1; }
cat "$VM_LOG"
STEPS=$(grep '^STEP ' "$VM_LOG")
rm -f "$VM_LOG"

# --- 2. two VMs ---------------------------------------------------------------------------------------
PAIRDIR=$(mktemp -d "$VM_HOME/pair-handles.XXXXXX")
t3=$(date +%s)
# In the same two VMs, one after another: the clean exchange, the same exchange under netem loss and
# delay on both VMs' eth0 (every byte must still arrive), and a cut link twice (the client's eth0
# drops every packet mid-run: both sides must fail within MKERNEL_TIMEOUT_S=5 plus 10 s; with the
# default retry count of 7, which Soft-RoCE treats as infinite, through the timeout; with 6, the
# client through its QP's retry-exceeded completion). Between the cuts the client removes its
# netem qdisc before it publishes its next handle, so the next connection finds the link whole.
# Each phase prints one "[vmN] STEP name rc=N Ns" line for the summary.
VP=$BUILD/tests/transport/net/ib/verbs_pair
pair_cmd() {  # role
  local vp="'$VP' $1 '$PAIRDIR'"
  echo "pstep() { name=\$1; shift; s=\$(date +%s); \"\$@\"; rc=\$?; echo \"STEP \$name rc=\$rc \$(( \$(date +%s) - s ))s\"; return \$rc; }
pstep pair-verify $vp verify
tc qdisc add dev eth0 root netem delay ${VP_DELAY:-1ms} loss ${VP_LOSS:-2%} || echo 'STEP pair-lossy rc=99 0s (tc netem failed)'
pstep pair-lossy $vp lossy
tc qdisc del dev eth0 root
MKERNEL_TIMEOUT_S=5 pstep pair-cut $vp cut
tc qdisc del dev eth0 root 2>/dev/null
MKERNEL_TIMEOUT_S=5 MKERNEL_IB_RETRY_CNT=6 pstep pair-cut-retry6 $vp cut"
}
"$VMDIR/pair.sh" "$(pair_cmd server)" "$(pair_cmd client)" > "$PAIRDIR.log" 2>&1
pairrc=$?
cat "$PAIRDIR.log"
PAIR_STEPS=$(grep -o '\[vm[12]\] STEP .*' "$PAIRDIR.log" | sed 's/^\[\(vm[12]\)\] STEP \([^ ]*\)/STEP \2-\1/')
rm -f "$PAIRDIR.log"
t4=$(date +%s)
rm -rf "$PAIRDIR"

# --- summary ------------------------------------------------------------------------------------------
echo "================ verbs tier summary ================"
fail=0
line() { printf '  %-44s %s\n' "$1" "$2"; }
[ "$vmrc" = 124 ] && { line "single VM" "FAILED: timeout after ${VM_TIMEOUT}s"; fail=1; }
[ -z "$STEPS" ] && { line "single VM" "FAILED: no step ran (VM rc=$vmrc)"; fail=1; }
while read -r _ name rcs secs; do
  [ -z "${name:-}" ] && continue
  if [ "${rcs#rc=}" = 0 ]; then line "$name" "passed ($secs)"; else line "$name" "FAILED ${rcs} ($secs)"; fail=1; fi
done <<< "$STEPS"
[ -z "$PLUGIN_TESTS" ] && line "plugin tests with MKERNEL_NET_BACKEND=ib" "not run (libmkernel.so or tests/plugin not built)"
[ "$(grep -c . <<< "$PAIR_STEPS")" -lt 8 ] && { line "two VMs" "FAILED: $(grep -c . <<< "$PAIR_STEPS") of 8 steps ran"; fail=1; }
while read -r _ name rcs secs; do
  [ -z "${name:-}" ] && continue
  if [ "${rcs#rc=}" = 0 ]; then line "$name" "passed ($secs)"; else line "$name" "FAILED ${rcs} ($secs)"; fail=1; fi
done <<< "$PAIR_STEPS"
if [ "$pairrc" = 0 ]; then line "two VMs (verbs_pair)" "passed ($(( t4 - t3 ))s)"; else line "two VMs (verbs_pair)" "FAILED rc=$pairrc"; fail=1; fi
echo "  one VM $(( t2 - t1 ))s, two VMs $(( t4 - t3 ))s, total $(( t4 - t0 ))s"
if [ "$fail" = 0 ]; then echo "verbs-tier: PASSED"; else echo "verbs-tier: FAILED"; fi
exit "$fail"
