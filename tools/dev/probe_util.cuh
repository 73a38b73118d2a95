// Shared by the GPU probes (mkernel-queueprobe, mkernel-freeprobe): a CUDA call check that exits
// with the tool's name, and the GPU's global nanosecond timer.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

}  // namespace mktools
