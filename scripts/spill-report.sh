#!/usr/bin/env bash
# Local-memory traffic of the device code, per function and per kernel (no GPU needed):
#   bash scripts/spill-report.sh [FILTER]
# Compiles collectives/device/kernel.cu for sm_90 as the build does, then counts the STL / LDL
# (local-memory store / load) instructions of every function in the SASS, listed under the kernel
# whose call graph it belongs to (ptxas compiles a non-inlined device function once per kernel
# that calls it). A data mover with STL / LDL inside its loop keeps its data in local memory.
# FILTER (a regular expression, default "reduceCopy|copyBytes|reduceDispatch|Kernel") selects
# the rows. cuobjdump and nvdisasm come from NVIDIA's PyPI wheels (nvidia-cuda-cuobjdump,
# nvidia-cuda-nvdisasm) when the CUDA installation lacks them; SPILL_TOOLS=DIR overrides.
set -euo pipefail
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
# The CMake build's flags for kernel.cu (CMakeLists.txt), sm_90 SASS only.
"$CUDA_HOME/bin/nvcc" -DMKERNEL_HAVE_DEVICE_CODE=1 -I"$root" -O3 -DNDEBUG --generate-code=arch=compute_90,code=sm_90 \
  --extended-lambda -std=c++17 -Xptxas -v -x cu -c "$root/collectives/device/kernel.cu" -o "$work/kernel.o" \
  >"$work/ptxas.log" 2>&1 || { tail -20 "$work/ptxas.log"; exit 1; }
rm -f "$work"/kernel.*.cubin
(cd "$work" && "$tools/cuobjdump" -xelf all kernel.o >/dev/null)
"$tools/nvdisasm" -c "$work"/kernel.*sm_90.cubin >"$work/kernel.sass"
python3 - "$work/kernel.sass" "${1:-reduceCopy|copyBytes|reduceDispatch|Kernel}" <<'EOF'
import re, subprocess, sys
sass, pattern = sys.argv[1], re.compile(sys.argv[2])
counts, order, cur = {}, [], None
for line in open(sass):
    m = re.match(r'^(\$?[\w$.]+):\s*$', line)
    if m and not m.group(1).startswith('.L'):
        cur = m.group(1)
        if cur not in counts:
            counts[cur] = [0, 0, 0]
            order.append(cur)
        continue
    if cur and re.search(r'/\*[0-9a-f]{4,}\*/', line):
        counts[cur][2] += 1
        if re.search(r'\bSTL\b', line): counts[cur][0] += 1
        if re.search(r'\bLDL\b', line): counts[cur][1] += 1
def demangle(s):
    try:
        return subprocess.run(['c++filt'], input=s, capture_output=True, text=True).stdout.strip()
    except OSError:
        return s
print(f"{'kernel':18s} {'function':60s} {'STL':>5s} {'LDL':>5s} {'instr':>6s}")
for name in order:
    if counts[name][2] == 0:
        continue
    parts = name.lstrip('.').replace('text.', '').split('$')
    parts = [p for p in parts if p]
    kernel = demangle(parts[0]).split('(')[0].split('::')[-1]
    func = demangle(parts[-1]).split('(')[0].replace('mkernel::coll::dev::', '') if len(parts) > 1 else '(kernel body)'
    if not (pattern.search(func) or pattern.search(kernel) and func == '(kernel body)'):
        continue
    c = counts[name]
    print(f"{kernel:18s} {func[:60]:60s} {c[0]:5d} {c[1]:5d} {c[2]:6d}")
EOF
grep -A2 "Compiling entry function" "$work/ptxas.log" | grep -E "entry|spill|Used" | sed 's/ptxas info    : //' | grep -v "Function properties" || true
