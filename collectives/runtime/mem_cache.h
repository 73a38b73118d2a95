// MemCache: the device and pinned host memory of communicators, kept for reuse instead of freed
// while other communicators of the process live (docs/KERNEL.md, "Frees that stop the process").
//
// A cudaFree, cudaFreeHost or cudaHostUnregister waits for every kernel on the device to end, and
// while it waits every CUDA call of every other thread of the process waits behind it: kernel
// launches, event records, copies, cudaMalloc (mkernel-freeprobe, one H200: 27 of 27
// pairs of such a free and another call waited for the kernel; cudaDeviceSynchronize blocked no
// other thread, cudaFreeAsync and cuMemRelease waited for nothing). Thread ranks sharing a GPU
// have kernels that wait for a peer's thread to post its part. So a communicator released while
// another one's collective is half posted stops the process: the release's free waits for the
// posted rank's kernel, that kernel waits for its peer, and the peer's thread waits in its next
// CUDA call behind the free, until the kernel's timeout (the split-communicator stall,
// docs/RELIABILITY.md).
//
// So a communicator's release returns its blocks here, and a new communicator takes a block of
// the same kind, device and size before it allocates. What is cached is freed for real only when
// the last communicator of the process has been released: then no mkernel kernel of the process
// can wait for a host thread. A returned block is reused only kReuseGraceS after its return: a
// free's device-wide wait would cover a launch-path CTA still finishing after CTA 0 reported its
// op done (finalize waits for that report), and such a CTA, past its end barrier, ends within
// microseconds. MKERNEL_DEFER_FREES=0 frees at each release instead (for experiments and for the
// test that shows the stall).
//
// BlockCache is the host-only ledger, with the allocator passed in (tested on the CPU:
// tests/collectives/test_mem_cache.cc); MemCache::process() is the one over CUDA.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

namespace mkernel {
namespace coll {

// What a block is: device memory of one GPU, or pinned host memory with its allocation flags.
struct BlockKind {
  bool host = false;
  int device = -1;     // device blocks: the GPU
  unsigned flags = 0;  // host blocks: cudaHostAlloc's flags
  bool operator<(const BlockKind& o) const {
    if (host != o.host) return host < o.host;
    if (device != o.device) return device < o.device;
    return flags < o.flags;
  }
};

class BlockCache {
 public:
  struct Ops {
    // Allocates `bytes` of `kind` into *p; false on failure (the CUDA error is the caller's to
    // read).
    std::function<bool(const BlockKind& kind, size_t bytes, void** p)> alloc;
    // Frees for real.
    std::function<void(const BlockKind& kind, void* p)> free;
    // Zeroes a reused block (a fresh allocation's contents are the allocator's); false on failure.
    std::function<bool(const BlockKind& kind, void* p, size_t bytes)> clear;
  };
  struct Stats {
    uint64_t allocated = 0;  // fresh allocations
    uint64_t reused = 0;     // taken from the cache
    uint64_t deferred = 0;   // frees kept for later
    uint64_t freed = 0;      // real frees
    size_t cachedBlocks = 0;
    size_t cachedBytes = 0;
    int users = 0;
  };

  // graceS: how long a returned block rests before take() reuses it.
  BlockCache(Ops ops, double graceS) : ops_(std::move(ops)), graceS_(graceS) {}

  // A communicator begins (before its first alloc) or ends (after its last give) its use.
  // The last end frees what is cached, outside the lock.
  void enter();
  void leave();

  // A block of exactly `bytes` of `kind`: a cached one (cleared) if there is one, else a fresh one.
  bool take(const BlockKind& kind, size_t bytes, void** p);
  // Returns a block from take(): cached while communicators live (defer), freed now otherwise.
  // A pointer take() did not hand out is freed now as `kind` says.
  void give(const BlockKind& kind, void* p, bool defer);

  Stats stats() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Rest {
    void* p;
    Clock::time_point since;
  };
  void trimLocked(std::vector<std::pair<BlockKind, void*>>* out);

  Ops ops_;
  double graceS_;
  mutable std::mutex mu_;
  int users_ = 0;
  std::map<void*, std::pair<BlockKind, size_t>> blocks_;  // handed out and cached ones
  std::map<std::pair<BlockKind, size_t>, std::vector<Rest>>
      free_;  // cached, by kind and size, oldest first
  Stats stats_;
};

// The process's cache over CUDA (cudaMalloc / cudaHostAlloc, cudaFree / cudaFreeHost).
class MemCache {
 public:
  static constexpr double kReuseGraceS = 1.0;
  static BlockCache& process();
  // MKERNEL_DEFER_FREES (default 1): cache released blocks while communicators live.
  static bool deferFrees();
  // cudaMalloc on the current device `dev` / cudaHostAlloc with `flags`, through the cache.
  static cudaError_t deviceAlloc(int dev, size_t bytes, void** p);
  static cudaError_t hostAlloc(size_t bytes, unsigned flags, void** p);
  // Their frees: cached while communicators live (and MKERNEL_DEFER_FREES is on), else now.
  static void deviceFree(void* p);
  static void hostFree(void* p);
};

}  // namespace coll
}  // namespace mkernel
