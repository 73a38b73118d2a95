# Shared by the emulation scripts (emulated-nccl-tests.sh, emu-stall-probe.sh): several thread
# ranks of one process on ONE GPU (MKERNEL_EMULATE=1) under LD_PRELOAD; run_test below. Source it with `build`'s
# default in $1 of the caller; set EMU_DEFAULT_TIMEOUT_S first (MKERNEL_TIMEOUT_S unless set).
# Ranks sharing a GPU in one process wait for each other inside their kernels, so nothing may
# wait for the whole device meanwhile (docs/KERNEL.md, "Emulated ranks as threads"): the third
# nccl-tests patch replaces nccl-tests' cudaDeviceSynchronize calls, eager module loading keeps
# the first launch of one of nccl-tests' kernels from waiting for the running ones, and 32
# hardware queues keep streams apart. EMU_MODULE_LOADING=LAZY gives CUDA's default back.
# shellcheck shell=bash
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build-gpu}
NCCL_HOME=${NCCL_HOME:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl}
export LD_LIBRARY_PATH=$NCCL_HOME/lib:$build/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 MKERNEL_EMULATE=1 MKERNEL_TIMEOUT_S=${MKERNEL_TIMEOUT_S:-${EMU_DEFAULT_TIMEOUT_S:-10}}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export CUDA_MODULE_LOADING=${EMU_MODULE_LOADING:-${CUDA_MODULE_LOADING:-EAGER}}
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
# run_test LIMIT OUTFILE CMD...: runs CMD (output to OUTFILE); if it is still running after LIMIT
# seconds (tenths count), dumps the debugger's view into OUTFILE.stacks and kills it (rc 124):
# cuda-gdb (batch attach; the device image has no gdb) lists the contexts, the resident kernels
# and their blocks, and every host thread's stack. Where a run stops, that says which kernels run
# and which call each rank thread is in. EMU_STACKS=0 skips the dump; EMU_GDB names another
# debugger.
run_test() {
  local limit=$1 outfile=$2 pid i gdb
  shift 2
  "$@" >"$outfile" 2>&1 &
  pid=$!
  for ((i = 0; i < limit * 10; ++i)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    gdb=${EMU_GDB:-$(command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)}
    if [ "${EMU_STACKS:-1}" = 1 ] && [ -n "$gdb" ]; then
      timeout 120 "$gdb" -p "$pid" -batch -ex "info cuda contexts" -ex "info cuda kernels" -ex "info cuda blocks" \
        -ex "info threads" -ex "thread apply all bt 16" >"$outfile.stacks" 2>&1
    fi
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return 124
  fi
  wait "$pid"
}
