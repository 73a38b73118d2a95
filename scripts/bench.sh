#!/usr/bin/env bash
# The main command: installs what is missing, builds, and runs the mkernel benchmark on whatever
# this machine has, saying plainly what it ran and why.
#   no GPU      -> the net transport's latency/bandwidth table over loopback + the topology report
#   GPU(s)      -> also the collectives sweep: mkernel, and the real NCCL beside it in the same
#                  run where libnccl.so.2 is installed (MK_NCCL_LIB names another); one rank per
#                  GPU on multi-GPU machines, emulated ranks on one GPU otherwise
# The collectives sweep ends with nccl-tests' columns (size, count, type, redop, time, algbw,
# busbw, #wrong) and, beside NCCL, NCCL's time and the ratio mkernel / NCCL on the same row.
# MK_RECORD=1 also appends those rows to docs/results/collbench.csv (date, machine, commit,
# command, collective, size_bytes, ranks, mkernel_us, nccl_us, ratio, busbw_gbs, wrong, path);
# MK_RECORD_FILE names another file.
# Extra arguments are passed to mkernel-bench. Results: bench-results/ (CSV, and PNG plots).
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$MK_ROOT"
BUILD=${MK_BUILD_DIR:-$MK_ROOT/build}
OUTDIR=${MK_BENCH_OUT:-$MK_ROOT/bench-results}
mkdir -p "$OUTDIR"
mk_install_deps || exit 1
mk_say "build"
mk_build "$BUILD" -DMKERNEL_CUDA_ARCH=90 || exit 1

mk_say "topology (mkernel-topo)"
"$BUILD/bin/mkernel-topo" || echo "(mkernel-topo failed: see above)"

if mk_have_gpu; then
  mk_say "GPU found: collectives benchmark, then the transport benchmark"
  if [ -x "$BUILD/bin/mkernel-collbench" ]; then
    # The real NCCL beside mkernel in the same run, where one is installed (never linked: dlopen).
    nccl_lib=${MK_NCCL_LIB:-$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 /{print $NF; exit}')}
    ngpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    args=(--csv "$OUTDIR/collectives.csv")
    [ -n "$nccl_lib" ] && [ -f "$nccl_lib" ] && args+=(--nccl "$nccl_lib")
    if [ "${ngpus:-1}" -gt 1 ]; then args+=(--gpus "$ngpus" --ranks "$ngpus"); else args+=(--ranks "1,2,4,8"); fi
    if [ "${MK_RECORD:-0}" = 1 ]; then
      record=${MK_RECORD_FILE:-$MK_ROOT/docs/results/collbench.csv}
      mkdir -p "$(dirname "$record")"
      args+=(--results "$record" --commit "$(git -C "$MK_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)")
    fi
    NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} "$BUILD/bin/mkernel-collbench" "${args[@]}" || exit 1
    # The PNG next to the CSV (latency and bandwidth against size), where matplotlib is installed.
    python3 "$MK_ROOT/scripts/plot.py" bench "$OUTDIR/collectives.csv" "$OUTDIR/collectives.png" || true
  fi
else
  mk_say "no GPU found: transport benchmark only"
fi
MKERNEL_SOCKET_IFNAME=${MKERNEL_SOCKET_IFNAME:-lo} "$BUILD/bin/mkernel-bench" transport --csv "$OUTDIR/transport.csv" "$@"
