// The number of visible GPUs without initializing CUDA (nvidia-smi, then CUDA_VISIBLE_DEVICES):
// for programs that fork their ranks before any CUDA call (test_gpu_procs, mkernel-proclat).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace mktools {

inline int gpuCountNoCuda() {
  int n = 0;
  if (FILE* f = popen("nvidia-smi -L 2>/dev/null | grep -c '^GPU '", "r")) {
    if (std::fscanf(f, "%d", &n) != 1) n = 0;
    pclose(f);
  }
  const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
  if (vis != nullptr && *vis) {
    int v = 1;
    for (const char* p = vis; *p; ++p) v += *p == ',';
    n = std::min(n, v);
  }
  return n;
}

}  // namespace mktools
