// Ranks as processes, forked before any CUDA call (test_gpu_procs, mkernel-proclat): the GPU count
// without initializing CUDA, and a forked rank's bootstrap and communicator.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "collectives/communicator.h"
#include "common/result.h"
#include "transport/bootstrap/bootstrap.h"

namespace mktools {

// The number of visible GPUs (nvidia-smi, then CUDA_VISIBLE_DEVICES), without touching CUDA.
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

// Rank `rank` of `n` on GPU (rank % nGpus), emulated when ranks share GPUs: its bootstrap from
// `id`, then its communicator. On failure `*what` names the step (mkernel::lastError() says why).
inline mkernel::Result createProcessRank(int rank, int n, int nGpus, const mkernel::bootstrap::UniqueId& id,
                                         std::unique_ptr<mkernel::bootstrap::Bootstrap>* bs,
                                         std::unique_ptr<mkernel::coll::Communicator>* comm, const char** what) {
  const int dev = rank % nGpus;
  *what = "cudaSetDevice";
  const cudaError_t err = cudaSetDevice(dev);
  if (err != cudaSuccess)
    return MK_ERROR(mkernel::Result::UnhandledCudaError, "rank %d: cudaSetDevice(%d): %s", rank, dev, cudaGetErrorString(err));
  *what = "bootstrap";
  mkernel::Result r = mkernel::bootstrap::Bootstrap::create(id, rank, n, bs);
  if (r != mkernel::Result::Success) return r;
  mkernel::coll::CommOptions opts;
  opts.rank = rank;
  opts.nRanks = n;
  opts.cudaDev = dev;
  opts.emulate = nGpus < n;
  *what = "communicator";
  return mkernel::coll::Communicator::create(opts, bs->get(), comm);
}

}  // namespace mktools
