// Process-wide counters behind mkernelGetStats(): which path ran how many collectives.
#pragma once

#include <atomic>
#include <cstdint>

#include "collectives/types.h"

namespace mkernel {
namespace coll {

struct GlobalStats {
  std::atomic<uint64_t> kernelOps[kNumCollTypes];
  std::atomic<uint64_t> forwardedOps[kNumCollTypes];
  std::atomic<uint64_t> launchOps[kNumCollTypes];  // of kernelOps, those of the launch path
  std::atomic<uint64_t> kernelLaunches;
  std::atomic<uint64_t> commsCreated;
};

GlobalStats& globalStats();

inline void countKernelOp(CollType c) {
  globalStats().kernelOps[static_cast<int>(c)].fetch_add(1, std::memory_order_relaxed);
}
inline void countForwardedOp(CollType c) {
  globalStats().forwardedOps[static_cast<int>(c)].fetch_add(1, std::memory_order_relaxed);
}

}  // namespace coll
}  // namespace mkernel
