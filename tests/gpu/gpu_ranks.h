// Emulated thread ranks for the GPU tier: N threads, each with its own Bootstrap over loopback,
// its own Communicator (CommOptions.emulate, all on GPU 0, or rank r on GPU r mod the device
// count with MKGPU_SPREAD=1) and its own stream. Catch2 is not
// thread-safe, so rank threads collect failures as strings and the main thread checks them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "transport/bootstrap/bootstrap.h"
#include "common/param.h"

namespace mkgpu {

struct RankCtx {
  int rank = 0;
  int nRanks = 0;
  int device = 0;  // the rank's GPU (current in its thread)
  mkernel::coll::Communicator* comm = nullptr;
  mkernel::bootstrap::Bootstrap* bs = nullptr;
  cudaStream_t stream = nullptr;
  std::vector<std::string>* failures = nullptr;
  std::mutex* failMu = nullptr;
  void fail(const std::string& what) const {
    std::lock_guard<std::mutex> lock(*failMu);
    failures->push_back("rank " + std::to_string(rank) + ": " + what);
  }

  // Pinned host staging for this rank's copies (a bump arena; reset once the stream is idle).
  // Copies to or from pageable memory must not be used while persistent kernels run: a pageable
  // device-to-host copy blocks its thread inside the driver until the stream reaches it, and the
  // driver's staging lock it holds then stops the other rank threads' copies, so a peer never
  // posts the collective this stream waits for (seen on the H200: 4 ranks timed out).
  uint8_t* hostBase = nullptr;
  size_t hostCap = 0, hostUsed = 0;
  void* hostBuf(size_t n) {
    const size_t off = (hostUsed + 255) & ~size_t(255);
    if (off + n > hostCap) return nullptr;
    hostUsed = off + n;
    return hostBase + off;
  }
  void hostReset() { hostUsed = 0; }
  // Device buffers freed by runRanks after every rank's communicator is finalized. cudaFree waits
  // for the whole device, and while another rank's persistent kernel runs that is no wait at
  // all: a kernel kept resident by a captured doorbell never exits on its own, and one still in
  // a collective waits for a peer whose next work CUDA then holds back behind the free (CUDA's
  // implicit synchronization; docs/KERNEL.md, "A product risk"). The tests free here instead.
  std::vector<void*> freeAfter;
  // Run by the rank's thread after its communicator is finalized (e.g. destroying a CUDA graph
  // whose replays keep the doorbell's kernel resident until then).
  std::vector<std::function<void()>> afterFinalize;
  template <class T>
  T* deviceAlloc(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    freeAfter.push_back(p);
    return static_cast<T*>(p);
  }
  // Stages n bytes through pinned memory and copies them to dev on the rank's stream.
  bool toDevice(void* dev, const void* src, size_t n) {
    void* p = hostBuf(n);
    if (p == nullptr) return false;
    std::memcpy(p, src, n);
    return cudaMemcpyAsync(dev, p, n, cudaMemcpyHostToDevice, stream) == cudaSuccess;
  }
  // Queues a copy of n bytes from dev into pinned memory; the result is valid after a stream sync.
  void* fromDevice(const void* dev, size_t n) {
    void* p = hostBuf(n);
    if (p == nullptr) return nullptr;
    return cudaMemcpyAsync(p, dev, n, cudaMemcpyDeviceToHost, stream) == cudaSuccess ? p : nullptr;
  }
};

// One collective's arguments.
inline mkernel::coll::CollArgs collArgs(mkernel::coll::CollType c, mkernel::coll::DataType dt,
                                        mkernel::coll::RedOp op, const void* send, void* recv,
                                        size_t count, int root = 0) {
  mkernel::coll::CollArgs a{};
  a.coll = c;
  a.dtype = dt;
  a.op = op;
  a.sendbuff = send;
  a.recvbuff = recv;
  a.count = count;
  a.root = root;
  return a;
}

// Also the first CUDA call of every GPU test: more hardware queues than CUDA's default 8 before the
// context exists (2 streams per rank; docs/KERNEL.md).
inline bool haveGpu() {
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Runs fn on n rank threads (create + fn + finalize); returns the failures of all ranks. Each rank
// gets hostBytes of pinned staging, allocated here before any persistent kernel runs.
// ranksPerNode > 0: emulated nodes of that many ranks (CommOptions.ranksPerNode: the hierarchical
// path, with a proxy per rank over TCP on loopback).
inline std::vector<std::string> runRanks(int n, const std::function<void(RankCtx&)>& fn,
                                         size_t hostBytes = size_t(32) << 20,
                                         int ranksPerNode = 0) {
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 1);
  mkernel::params::resetForTesting();
  std::vector<std::string> failures;
  std::mutex failMu;
  std::vector<uint8_t*> pinned(static_cast<size_t>(n), nullptr);
  std::vector<std::vector<void*>> frees(
      static_cast<size_t>(n));  // RankCtx::freeAfter, once all threads ended
  cudaSetDevice(0);
  for (auto& p : pinned)
    if (cudaMallocHost(reinterpret_cast<void**>(&p), hostBytes) != cudaSuccess)
      return {"cudaMallocHost failed"};
  mkernel::bootstrap::UniqueId id;
  if (mkernel::bootstrap::createUniqueId(&id) != mkernel::Result::Success)
    return {"createUniqueId failed"};
  // MKGPU_SPREAD=1: the ranks over every visible GPU (one per GPU when there are enough).
  int nDev = 1;
  const char* spread = std::getenv("MKGPU_SPREAD");
  if (spread != nullptr && std::atoi(spread) != 0 &&
      (cudaGetDeviceCount(&nDev) != cudaSuccess || nDev < 1))
    nDev = 1;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      RankCtx ctx;
      ctx.rank = r;
      ctx.nRanks = n;
      ctx.device = r % nDev;
      ctx.failures = &failures;
      ctx.failMu = &failMu;
      ctx.hostBase = pinned[static_cast<size_t>(r)];
      ctx.hostCap = hostBytes;
      cudaSetDevice(ctx.device);
      std::unique_ptr<mkernel::bootstrap::Bootstrap> bs;
      if (mkernel::bootstrap::Bootstrap::create(id, r, n, &bs) != mkernel::Result::Success) {
        ctx.fail(std::string("bootstrap: ") + mkernel::lastError());
        return;
      }
      mkernel::coll::CommOptions opts;
      opts.rank = r;
      opts.nRanks = n;
      opts.cudaDev = ctx.device;
      opts.emulate = true;
      opts.ranksPerNode = ranksPerNode;
      std::unique_ptr<mkernel::coll::Communicator> comm;
      if (mkernel::coll::Communicator::create(opts, bs.get(), &comm) != mkernel::Result::Success) {
        ctx.fail(std::string("create: ") + mkernel::lastError());
        return;
      }
      cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking);
      ctx.comm = comm.get();
      ctx.bs = bs.get();
      fn(ctx);
      cudaStreamSynchronize(ctx.stream);
      if (comm->finalize() != mkernel::Result::Success)
        ctx.fail(std::string("finalize: ") + mkernel::lastError());
      comm.reset();
      for (auto& f : ctx.afterFinalize) f();
      cudaStreamDestroy(ctx.stream);
      frees[static_cast<size_t>(r)] = std::move(ctx.freeAfter);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(r % nDev);
    for (void* p : frees[static_cast<size_t>(r)]) cudaFree(p);
  }
  cudaSetDevice(0);
  for (auto p : pinned) cudaFreeHost(p);
  return failures;
}

}  // namespace mkgpu
