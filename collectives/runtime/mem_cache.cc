#include "collectives/runtime/mem_cache.h"

#include <cuda_runtime.h>

#include <cstring>

#include "common/log.h"
#include "common/param.h"

namespace mkernel {
namespace coll {

void BlockCache::enter() {
  std::lock_guard<std::mutex> lock(mu_);
  ++users_;
}

void BlockCache::leave() {
  std::vector<std::pair<BlockKind, void*>> out;
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (users_ > 0) --users_;
    if (users_ == 0) {
      for (const auto& e : free_) bytes += e.first.second * e.second.size();
      trimLocked(&out);
    }
  }
  if (!out.empty())
    MK_INFO(kLogAlloc,
            "memory cache: the process's last communicator is released: freeing %zu cached blocks "
            "(%.1f MiB)",
            out.size(), static_cast<double>(bytes) / 1048576.0);
  for (auto& b : out) ops_.free(b.first, b.second);
}

void BlockCache::trimLocked(std::vector<std::pair<BlockKind, void*>>* out) {
  for (auto& e : free_) {
    for (const Rest& r : e.second) {
      out->emplace_back(e.first.first, r.p);
      blocks_.erase(r.p);
    }
  }
  stats_.freed += out->size();
  free_.clear();
}

bool BlockCache::take(const BlockKind& kind, size_t bytes, void** p) {
  *p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find({kind, bytes});
    if (it != free_.end() && !it->second.empty() &&
        std::chrono::duration<double>(Clock::now() - it->second.front().since).count() >= graceS_) {
      *p = it->second.front().p;
      it->second.erase(it->second.begin());
      if (it->second.empty()) free_.erase(it);
      ++stats_.reused;
    }
  }
  if (*p != nullptr) {
    if (ops_.clear(kind, *p, bytes)) return true;
    std::lock_guard<std::mutex> lock(mu_);  // kept for a later try; the caller reads the error
    free_[{kind, bytes}].push_back(Rest{*p, Clock::now()});
    *p = nullptr;
    return false;
  }
  if (!ops_.alloc(kind, bytes, p)) return false;
  std::lock_guard<std::mutex> lock(mu_);
  blocks_[*p] = {kind, bytes};
  ++stats_.allocated;
  return true;
}

void BlockCache::give(const BlockKind& kind, void* p, bool defer) {
  if (p == nullptr) return;
  BlockKind k = kind;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(p);
    if (it != blocks_.end()) {
      k = it->second.first;
      if (defer && users_ > 0) {
        free_[it->second].push_back(Rest{p, Clock::now()});
        ++stats_.deferred;
        return;
      }
      blocks_.erase(it);
    }
    ++stats_.freed;
  }
  ops_.free(k, p);
}

BlockCache::Stats BlockCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.users = users_;
  for (const auto& e : free_) {
    s.cachedBlocks += e.second.size();
    s.cachedBytes += e.first.second * e.second.size();
  }
  return s;
}

BlockCache& MemCache::process() {
  static BlockCache* cache = new BlockCache(
      BlockCache::Ops{[](const BlockKind& kind, size_t bytes, void** p) {
                        return (kind.host ? cudaHostAlloc(p, bytes, kind.flags)
                                          : cudaMalloc(p, bytes)) == cudaSuccess;
                      },
                      [](const BlockKind& kind, void* p) {
                        const cudaError_t err = kind.host ? cudaFreeHost(p) : cudaFree(p);
                        if (err != cudaSuccess) {
                          MK_WARN("freeing %s memory at %p failed: %s",
                                  kind.host ? "pinned host" : "device", p, cudaGetErrorString(err));
                          (void)cudaGetLastError();
                        }
                      },
                      [](const BlockKind& kind, void* p, size_t bytes) {
                        if (kind.host) {
                          std::memset(p, 0, bytes);
                          return true;
                        }
                        // On the legacy stream, waited for alone: communicator setup's own pattern
                        // (a device-wide wait would wait for running kernels).
                        return cudaMemset(p, 0, bytes) == cudaSuccess &&
                               cudaStreamSynchronize(cudaStreamLegacy) == cudaSuccess;
                      }},
      MemCache::kReuseGraceS);
  return *cache;  // never destroyed: releases may run in background threads at exit
}

bool MemCache::deferFrees() {
  return params::DEFER_FREES();
}

namespace {
cudaError_t takeOrError(const BlockKind& kind, size_t bytes, void** p) {
  if (MemCache::process().take(kind, bytes, p)) return cudaSuccess;
  const cudaError_t err = cudaGetLastError();
  return err != cudaSuccess ? err : cudaErrorMemoryAllocation;
}
}  // namespace

cudaError_t MemCache::deviceAlloc(int dev, size_t bytes, void** p) {
  BlockKind k;
  k.device = dev;
  return takeOrError(k, bytes, p);
}

cudaError_t MemCache::hostAlloc(size_t bytes, unsigned flags, void** p) {
  BlockKind k;
  k.host = true;
  k.flags = flags;
  return takeOrError(k, bytes, p);
}

void MemCache::deviceFree(void* p) {
  process().give(BlockKind{}, p, deferFrees());
}

void MemCache::hostFree(void* p) {
  BlockKind k;
  k.host = true;
  process().give(k, p, deferFrees());
}

}  // namespace coll
}  // namespace mkernel
