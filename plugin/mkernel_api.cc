#include "plugin/mkernel_api.h"

#include <cstddef>
#include <cstring>

#include "collectives/stats.h"
#include "common/param.h"
#include "common/version.h"

// Callers carry their own copy of mkernelStats_t (nccl-tests' patch does): a caller built against
// an older, shorter struct gets the fields that fit its `size`.
extern "C" int mkernelGetStats(mkernelStats_t* out) {
  if (out == nullptr || out->size < offsetof(mkernelStats_t, kernelOps)) return 1;
  mkernelStats_t full{};
  mkernel::coll::foldLiveStats();  // collectives finished since each communicator's last fold
  mkernel::coll::GlobalStats& s = mkernel::coll::globalStats();
  for (int i = 0; i < mkernel::coll::kNumCollTypes; ++i) {
    full.kernelOps[i] = s.kernelOps[i].load(std::memory_order_relaxed);
    full.forwardedOps[i] = s.forwardedOps[i].load(std::memory_order_relaxed);
    full.launchOps[i] = s.launchOps[i].load(std::memory_order_relaxed);
  }
  full.kernelLaunches = s.kernelLaunches.load(std::memory_order_relaxed);
  full.commsCreated = s.commsCreated.load(std::memory_order_relaxed);
  full.countersLate = s.countersLate.load(std::memory_order_relaxed);
  size_t n = out->size < sizeof(full) ? static_cast<size_t>(out->size) : sizeof(full);
  full.size = out->size;
  std::memcpy(out, &full, n);
  return 0;
}

extern "C" const char* mkernelVersionString(void) {
  return "mkernel " MKERNEL_VERSION_STRING;
}

extern "C" void mkernelResetParamsForTesting(void) {
  mkernel::params::resetThisCopyForTesting();
}
