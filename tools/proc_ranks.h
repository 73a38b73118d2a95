// Ranks as processes, forked before any CUDA call (test_gpu_procs, mkernel-proclat): the GPU count
// without initializing CUDA, and a forked rank's bootstrap and communicator.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

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

// A private CUDA MPS daemon (its own pipe and log directory under /tmp), without which two
// processes' kernels on one GPU do not run at the same time. start() sets the directory variables
// the forked ranks inherit; stop() quits the daemon. `what` names the program in messages.
class PrivateMps {
 public:
  bool start(const char* what) {
    char tmpl[] = "/tmp/mkernel-mps-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::fprintf(stderr, "%s: cannot make a directory for CUDA MPS\n", what);
      return false;
    }
    dir_ = tmpl;
    setenv("CUDA_MPS_PIPE_DIRECTORY", dir_.c_str(), 1);
    setenv("CUDA_MPS_LOG_DIRECTORY", dir_.c_str(), 1);
    if (std::system("nvidia-cuda-mps-control -d") != 0) {
      std::fprintf(stderr, "%s: ranks sharing a GPU need CUDA MPS, and nvidia-cuda-mps-control -d failed\n", what);
      dir_.clear();
      return false;
    }
    return true;
  }
  void stop(const char* what) {
    if (dir_.empty()) return;
    if (std::system("echo quit | nvidia-cuda-mps-control") != 0)
      std::fprintf(stderr, "%s: stopping the MPS daemon failed\n", what);
    dir_.clear();
  }

 private:
  std::string dir_;
};

}  // namespace mktools
