#!/usr/bin/env bash
# Local-memory traffic of the device code, per function and per kernel (no GPU needed):
#   bash scripts/spill-report.sh [FILTER]
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
# any kernel has more local-memory traffic in its body than scripts/spill-baseline.txt allows
# (SPILL_BASELINE=FILE overrides), as launchDirectKernel's did in session 18 when a loop around
# its call left it too few registers (the op ran at half speed on the device).
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
for line in open(os.environ.get('SPILL_BASELINE') or os.environ['SPILL_ROOT'] + '/scripts/spill-baseline.txt'):
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
                   f"(allowed {allowed.get((kernel, func), 0)}, scripts/spill-baseline.txt)")
if os.environ.get('SPILL_CHECK') == '1':
    movers = sum(1 for name in order if re.search(r'reduceCopy|copyBytes', name))
    if movers == 0:
        sys.exit("spill-report: no data mover found in the SASS (the check would pass vacuously)")
    if bad:
        sys.exit("spill-report: data movers spill to local memory:\n  " + "\n  ".join(bad))
    print(f"spill-report: no data mover spills beyond scripts/spill-baseline.txt ({movers} mover instances checked)")
EOF
grep -A2 "Compiling entry function" "$work/ptxas.log" | grep -E "entry|spill|Used" | sed 's/ptxas info    : //' | grep -v "Function properties" || true
