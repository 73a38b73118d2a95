#!/usr/bin/env bash
# On a GPU machine: shows that the real NCCL loads mkernel's net plugin and tuner and assigns them
# to a communicator. One rank: NCCL loads the plugins and calls init/devices/getProperties (net)
# and init (tuner), but moves no bytes through the net plugin and never asks the tuner for an
# algorithm (NCCL-ABI.md). Usage: scripts/nccl-plugin-check.sh BUILD_DIR [NCCL_LIB_DIR]
set -uo pipefail
BUILD=${1:?build dir}
NCCL_LIB_DIR=${2:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib}
PROG=$BUILD/tests/plugin/nccl_one_rank
[ -x "$PROG" ] || { echo "missing $PROG (build target nccl_one_rank)"; exit 1; }
export LD_LIBRARY_PATH=$NCCL_LIB_DIR:$BUILD/lib:${LD_LIBRARY_PATH:-}
rc=0
echo "== NCCL_NET_PLUGIN=$BUILD/lib/libnccl-net-mkernel.so (NCCL $(ls $NCCL_LIB_DIR/libnccl.so.2* | head -1))"
NCCL_NET_PLUGIN=$BUILD/lib/libnccl-net-mkernel.so NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
  "$PROG" >"${OUT:-/tmp}/net-plugin.log" 2>&1 || rc=1
grep -E "NET/Plugin|mkernel|Using network|NCCL_NET|Assigned|MKERNEL" "${OUT:-/tmp}/net-plugin.log" | head -20
grep -q "Assigned NET plugin mkernel" "${OUT:-/tmp}/net-plugin.log" || { echo "NET: mkernel was not assigned"; rc=1; }
echo "== NCCL_TUNER_PLUGIN=mkernel"
NCCL_TUNER_PLUGIN=mkernel NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING \
  "$PROG" >"${OUT:-/tmp}/tuner-plugin.log" 2>&1 || rc=1
grep -iE "tuner|mkernel" "${OUT:-/tmp}/tuner-plugin.log" | head -20
grep -qE "TUNER/Plugin: Using mkernel" "${OUT:-/tmp}/tuner-plugin.log" || { echo "TUNER: mkernel tuner not loaded"; rc=1; }
echo "nccl-plugin-check: rc=$rc"
exit $rc
