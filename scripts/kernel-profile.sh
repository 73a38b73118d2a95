#!/usr/bin/env bash
# Each kernel's own GPU time, by Nsight Compute (ncu), on one GPU with one rank: no peer to wait
# for, so ncu can run every kernel alone (a rank's kernel that waits for a peer GPU's cannot be).
#   bash scripts/kernel-profile.sh        (repository root; on the device machine)
# Builds mkernel-collbench and profiles its one-rank AllReduce from 8 B to KP_MAX_BYTES (32 KiB)
# three ways, KP_ITERS (20) eager ops and a graph of as many per size:
#   - mkernel's launch kernel (MKERNEL_ONE_RANK=kernel: the launch path's kernel frame, no
#     exchange), and collbench's empty-kernel floors (emptyKernel, bigArgKernel) in that run;
#   - (KP_VARIANT="VAR=value ...") the launch kernel again with those settings;
#   - (KP_NCCL=1) NCCL's one-rank AllReduce (whatever kernel NCCL launches for it);
# each with ncu's cache control in KP_CACHE ("all none": caches flushed before every kernel, as
# ncu does by default, and not); then prints, per kernel name, the count and the median / min of
# gpu__time_duration, with the registers, block and grid size ncu reports. Raw CSV in
# build-gpu/logs-profile, copied to $OUT.
#   (KP_DETAILS=N) then ncu's full set (--set full: source counters and warp-state sampling)
# over N eager launch kernels of 8 B (one rank, caches kept), KP_DETAILS_SKIP (10)
# launches in: the details page (details.txt) and the SASS lines with the most stall samples
# (hot.txt; scripts/ncu-hot.py), where the launch kernel's time goes before any exchange.
set -u -o pipefail
build=${KP_BUILD:-$(cd "$(dirname "$0")/.." && pwd)/build-gpu}
logs=$build/logs-profile
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"
NCU=${KP_NCU:-/usr/local/cuda/bin/ncu}
[ -x "$NCU" ] || { echo "kernel-profile: no ncu at $NCU"; exit 1; }
fail=0

step "1. build"
gpu_build "${KP_JOBS:-16}" mkernel-collbench
export LD_LIBRARY_PATH=$NCCL_HOME/lib:$build/lib:${LD_LIBRARY_PATH:-}

metrics=gpu__time_duration.sum,launch__registers_per_thread,launch__block_size,launch__grid_size
profile() {  # NAME CACHE ENV... -- COLLBENCH ARGS...: one ncu run into $logs/NAME.csv
  local name=$1 cache=$2 envs=()
  shift
  shift
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  step "2. ncu: $name"
  env "${envs[@]}" timeout 300 "$NCU" --csv --print-units base --cache-control "$cache" --metrics "$metrics" \
    -k 'regex:launchKernel|ncclDevKernel|ncclKernel|emptyKernel|bigArgKernel|persistentKernel' \
    "$build/bin/mkernel-collbench" "$@" >"$logs/$name.csv" 2>"$logs/$name.err" ||
    { echo "$name: ncu failed"; tail -5 "$logs/$name.err"; fail=1; }
  grep -m3 -i "ERR_NVGPUCTRPERM\|permission" "$logs/$name.err" && fail=1
}
args=(--ranks 1 --max-bytes "${KP_MAX_BYTES:-32768}" --step 8 --iters "${KP_ITERS:-20}")
csvs=()
for cache in ${KP_CACHE:-all none}; do
  profile "mkernel-kernel-cache-$cache" "$cache" MKERNEL_ONE_RANK=kernel -- "${args[@]}" --wait launch
  csvs+=("$logs/mkernel-kernel-cache-$cache.csv")
  # KP_VARIANT="VAR=value ...": the same run again with these settings (e.g.
  # MKERNEL_GRAPH_EPILOGUE=light), in the same call.
  if [ -n "${KP_VARIANT:-}" ]; then
    # shellcheck disable=SC2086  # VAR=value words
    profile "mkernel-kernel-variant-cache-$cache" "$cache" MKERNEL_ONE_RANK=kernel $KP_VARIANT -- "${args[@]}" --wait launch
    csvs+=("$logs/mkernel-kernel-variant-cache-$cache.csv")
  fi
  # NCCL 2.28.9's one-rank AllReduce launched no kernel in session 14 (a copy, as mkernel's
  # default), so its run adds only the floors again: KP_NCCL=1 to have it anyway.
  if [ "${KP_NCCL:-0}" = 1 ]; then
    profile "nccl-cache-$cache" "$cache" MKERNEL_ONE_RANK=copy -- "${args[@]}" --wait launch --nccl "$NCCL_HOME/lib/libnccl.so.2"
    csvs+=("$logs/nccl-cache-$cache.csv")
  fi
done

step "3. table"
python3 - "${csvs[@]}" <<'EOF' | tee "$logs/table.txt"
import csv, statistics, sys
for path in sys.argv[1:]:
    rows = {}
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        key = r["Kernel Name"].split("(")[0][:60]
        d = rows.setdefault(key, {"t": [], "info": {}})
        m, v = r["Metric Name"], r["Metric Value"].replace(",", "")
        if m == "gpu__time_duration.sum":
            d["t"].append(float(v) / 1000.0)
        else:
            d["info"][m.split("__")[1]] = v
    print(f"# {path.split('/')[-1]}: gpu__time_duration per kernel, us")
    print(f"{'kernel':60s} {'n':>5s} {'median':>8s} {'min':>8s}  regs block grid")
    for k, d in sorted(rows.items()):
        if not d["t"]:
            continue
        i = d["info"]
        print(f"{k:60s} {len(d['t']):5d} {statistics.median(d['t']):8.2f} {min(d['t']):8.2f}  "
              f"{i.get('registers_per_thread', '-')} {i.get('block_size', '-')} {i.get('grid_size', '-')}")
EOF
[ "${PIPESTATUS[0]}" = 0 ] || fail=1
save table.txt

if [ "${KP_DETAILS:-0}" != 0 ]; then
  step "4. ncu --set full: $KP_DETAILS launch kernels"
  rep=$logs/details
  MKERNEL_ONE_RANK=kernel timeout 300 "$NCU" --set full --import-source yes --cache-control none \
    -k regex:launchKernel --launch-skip "${KP_DETAILS_SKIP:-10}" --launch-count "$KP_DETAILS" \
    -f -o "$rep" "$build/bin/mkernel-collbench" --ranks 1 --max-bytes 8 --iters 20 --wait launch \
    >"$logs/details.out" 2>&1 || { echo "details: ncu failed"; tail -5 "$logs/details.out"; fail=1; }
  if [ -f "$rep.ncu-rep" ]; then
    "$NCU" -i "$rep.ncu-rep" --page details --print-details all >"$logs/details.txt" 2>&1 || fail=1
    "$NCU" -i "$rep.ncu-rep" --page source --csv --print-source sass >"$logs/source.csv" 2>"$logs/source.err" ||
      { echo "details: no source page"; tail -3 "$logs/source.err"; }
    python3 "$(dirname "$0")/ncu-hot.py" "$logs/source.csv" "${KP_HOT_LINES:-40}" | tee "$logs/hot.txt" || fail=1
    grep -E "Duration|Registers Per|Local Memory|Stack Size|Warp Cycles Per Issued|Issued Ipc|Executed Instructions|L1/TEX Hit|L2 Hit|Achieved Occupancy" \
      "$logs/details.txt" | head -60
    save details.txt
    save hot.txt
  fi
fi
echo "kernel-profile: fail=$fail"
exit "$fail"
