// Shared by the GPU probes (mkernel-queueprobe, mkernel-freeprobe): a CUDA call check that exits
// with the tool's name, and the GPU's global nanosecond timer.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

// Exits with status 2 and "TOOL: CALL failed: ERROR (FILE:LINE)" when `call` is not cudaSuccess.
#define MKT_CUDA_CHECK(tool, call)                                                                  \
  do {                                                                                              \
    cudaError_t e_ = (call);                                                                        \
    if (e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "%s: %s failed: %s (%s:%d)\n", tool, #call, cudaGetErrorString(e_), __FILE__, \
                   __LINE__);                                                                       \
      std::exit(2);                                                                                 \
    }                                                                                               \
  } while (0)

namespace mktools {

__device__ __forceinline__ unsigned long long globalNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace mktools
