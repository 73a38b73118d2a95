// Process-wide counters behind mkernelGetStats(): which path ran how many collectives.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "collectives/types.h"

namespace mkernel {
namespace coll {

struct GlobalStats {
  std::atomic<uint64_t> kernelOps[kNumCollTypes];
  std::atomic<uint64_t> forwardedOps[kNumCollTypes];
  std::atomic<uint64_t> launchOps[kNumCollTypes];  // of kernelOps, those of the launch path
  std::atomic<uint64_t> kernelLaunches;
  std::atomic<uint64_t> commsCreated;
  std::atomic<uint64_t> countersLate;  // CollStats::countersLate, every communicator's
};

GlobalStats& globalStats();

// The kernels report finished collectives in host memory; a communicator adds them to
// globalStats() when it folds (at its next enqueue, stats() or finalize). Each live communicator
// registers its fold here, and mkernelGetStats runs them all first, so that a collective counts
// as soon as the stream has passed it. unregisterStatsFolder waits for a fold in progress: after
// it returns, the fold is never called again.
void registerStatsFolder(const void* key, std::function<void()> fold);
void unregisterStatsFolder(const void* key);
void foldLiveStats();

struct CollStats;

// MKERNEL_STATS=1: the line a communicator leaves when it is destroyed (the shim prints it at
// every MKERNEL_DEBUG level but NONE). `st`: what its mkernel Communicator reported (null: it had
// none, `why` says why); `forwarded`: its collectives handed to the real NCCL, per CollType.
// The same counters as mkernelGetStats, for the one communicator.
std::string commStatsLine(const CollStats* st, const uint64_t forwarded[kNumCollTypes],
                          const char* why);

inline void countKernelOp(CollType c) {
  globalStats().kernelOps[static_cast<int>(c)].fetch_add(1, std::memory_order_relaxed);
}
inline void countForwardedOp(CollType c) {
  globalStats().forwardedOps[static_cast<int>(c)].fetch_add(1, std::memory_order_relaxed);
}

}  // namespace coll
}  // namespace mkernel
