// Ranks as processes, forked before any CUDA call (test_gpu_procs, mkernel-proclat): the GPU count
// without initializing CUDA, and a forked rank's bootstrap and communicator.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <unistd.h>

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
inline mkernel::Result createProcessRank(int rank, int n, int nGpus,
                                         const mkernel::bootstrap::UniqueId& id,
                                         std::unique_ptr<mkernel::bootstrap::Bootstrap>* bs,
                                         std::unique_ptr<mkernel::coll::Communicator>* comm,
                                         const char** what) {
  const int dev = rank % nGpus;
  *what = "cudaSetDevice";
  const cudaError_t err = cudaSetDevice(dev);
  if (err != cudaSuccess)
    return MK_ERROR(mkernel::Result::UnhandledCudaError, "rank %d: cudaSetDevice(%d): %s", rank,
                    dev, cudaGetErrorString(err));
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
  // The clients of one MPS server share one pool of hardware work queues, each client taking
  // CUDA_DEVICE_MAX_CONNECTIONS of them for itself (NVIDIA's MPS guide,
  // "CUDA_DEVICE_MAX_CONNECTIONS"). With 32 each, 2 clients on the H200 started and 4 did not:
  // every process's cudaSetDevice failed with "out of memory", then "busy or unavailable". So the
  // forked ranks get at most kMpsConnections / clientsPerGpu each (and at most what the variable
  // says, 8 if unset: CUDA's default).
  static constexpr int kMpsConnections = 64;
  bool start(const char* what, int clientsPerGpu) {
    const char* set = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    hadConnections_ = set != nullptr;
    if (set != nullptr) connections_ = set;
    int conn = set != nullptr && std::atoi(set) > 0 ? std::atoi(set) : 8;
    const int most = std::max(1, kMpsConnections / std::max(1, clientsPerGpu));
    if (conn > most) {
      std::fprintf(stderr,
                   "%s: %d processes per GPU under CUDA MPS: CUDA_DEVICE_MAX_CONNECTIONS=%d for "
                   "each (was %d)\n",
                   what, clientsPerGpu, most, conn);
      conn = most;
    }
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", std::to_string(conn).c_str(), 1);
    char tmpl[] = "/tmp/mkernel-mps-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::fprintf(stderr, "%s: cannot make a directory for CUDA MPS\n", what);
      restoreConnections();
      return false;
    }
    dir_ = tmpl;
    setenv("CUDA_MPS_PIPE_DIRECTORY", dir_.c_str(), 1);
    setenv("CUDA_MPS_LOG_DIRECTORY", dir_.c_str(), 1);
    if (std::system("nvidia-cuda-mps-control -d") != 0) {
      std::fprintf(stderr,
                   "%s: ranks sharing a GPU need CUDA MPS, and nvidia-cuda-mps-control -d failed\n",
                   what);
      dir_.clear();
      restoreConnections();
      return false;
    }
    return true;
  }
  // Quits the daemon, waits (up to 10 s) until it no longer answers (`quit` returns at once, and
  // a next daemon should find the GPU left), and gives CUDA_DEVICE_MAX_CONNECTIONS back its value.
  void stop(const char* what) {
    if (dir_.empty()) return;
    restoreConnections();
    if (std::system("echo quit | nvidia-cuda-mps-control") != 0)
      std::fprintf(stderr, "%s: stopping the MPS daemon failed\n", what);
    bool gone = false;
    for (int i = 0; i < 100 && !gone; ++i) {
      gone = std::system("echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1") != 0;
      if (!gone) usleep(100 * 1000);
    }
    if (!gone) std::fprintf(stderr, "%s: the MPS daemon still answers 10 s after quit\n", what);
    dir_.clear();
  }

 private:
  void restoreConnections() {
    if (hadConnections_) {
      setenv("CUDA_DEVICE_MAX_CONNECTIONS", connections_.c_str(), 1);
    } else {
      unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
    }
  }
  std::string dir_;
  bool hadConnections_ = false;
  std::string connections_;  // CUDA_DEVICE_MAX_CONNECTIONS before start()
};

}  // namespace mktools
