// Helpers for the GPU tiers of the shim tests: device buffers, fills, checks, stats deltas.
#pragma once

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "plugin/mkernel_api.h"
#include "common/param.h"

namespace shimtest {

// The real NCCL for the shim to forward to, when nobody said which: the one found at configure
// time, else PyTorch's wheel (on the H200 machine).
inline void chooseRealNccl() {
  if (std::getenv("MKERNEL_NCCL_LIBRARY") != nullptr) return;
  const char* candidates[] = {
      MKERNEL_REAL_NCCL_SO,
      "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"};
  for (const char* c : candidates)
    if (c[0] != '\0' && access(c, R_OK) == 0) {
      setenv("MKERNEL_NCCL_LIBRARY", c, 1);
      mkernel::params::resetForTesting();
      return;
    }
}

// Emulated thread ranks share the GPU: a cudaFree in one rank's thread waits for the whole
// device, peers' kernels included, and CUDA holds back what other threads issue after it until
// then (implicit synchronization), so a peer kernel that waits for a rank's next one stalls. A
// rank thread with `tDeferredFrees` set hands its frees to the test, which frees them once
// every rank is done.
struct DeferredFrees {
  std::mutex mu;
  std::vector<void*> ptrs;
  void freeAll() {
    std::lock_guard<std::mutex> lock(mu);
    for (void* p : ptrs) cudaFree(p);
    ptrs.clear();
  }
};
inline thread_local DeferredFrees* tDeferredFrees = nullptr;

struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) {
    if (cudaMalloc(&p, n) != cudaSuccess) p = nullptr;
  }
  ~DevBuf() {
    if (p == nullptr) return;
    if (tDeferredFrees != nullptr) {
      std::lock_guard<std::mutex> lock(tDeferredFrees->mu);
      tDeferredFrees->ptrs.push_back(p);
    } else {
      cudaFree(p);
    }
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// The copy runs on the legacy default stream, which the tests' non-blocking streams do not wait
// for, and a copy from pageable memory returns before its DMA has landed: wait for it, or a
// collective launched next on another stream may read the old contents (a wrong AllReduce in
// test_shim_emulate's split case).
template <typename T>
void upload(const DevBuf& b, const std::vector<T>& v) {
  cudaMemcpy(b.p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  cudaStreamSynchronize(cudaStreamLegacy);
}

template <typename T>
std::vector<T> download(const DevBuf& b, size_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), b.p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

inline void poison(const DevBuf& b) {
  cudaMemset(b.p, 0xff, b.bytes);  // asynchronous, on the legacy stream (upload)
  cudaStreamSynchronize(cudaStreamLegacy);
}

inline mkernelStats_t stats() {
  mkernelStats_t s;
  std::memset(&s, 0, sizeof(s));
  s.size = sizeof(s);
  mkernelGetStats(&s);
  return s;
}

// Collectives that ran (kernel + forwarded) of kind `coll` (ncclFunc_t index) since `before`.
inline uint64_t ranSince(const mkernelStats_t& before, int coll) {
  mkernelStats_t now = stats();
  return (now.kernelOps[coll] - before.kernelOps[coll]) +
         (now.forwardedOps[coll] - before.forwardedOps[coll]);
}

inline uint64_t kernelSince(const mkernelStats_t& before, int coll) {
  return stats().kernelOps[coll] - before.kernelOps[coll];
}

enum { kBroadcast = 0, kReduce = 1, kAllGather = 2, kReduceScatter = 3, kAllReduce = 4 };

}  // namespace shimtest
