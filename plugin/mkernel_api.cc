#include "plugin/mkernel_api.h"

#include "collectives/stats.h"

extern "C" int mkernelGetStats(mkernelStats_t* out) {
  if (out == nullptr || out->size < sizeof(mkernelStats_t)) return 1;
  mkernel::coll::GlobalStats& s = mkernel::coll::globalStats();
  for (int i = 0; i < mkernel::coll::kNumCollTypes; ++i) {
    out->kernelOps[i] = s.kernelOps[i].load(std::memory_order_relaxed);
    out->forwardedOps[i] = s.forwardedOps[i].load(std::memory_order_relaxed);
  }
  out->kernelLaunches = s.kernelLaunches.load(std::memory_order_relaxed);
  out->commsCreated = s.commsCreated.load(std::memory_order_relaxed);
  return 0;
}

#define MKERNEL_STR2(x) #x
#define MKERNEL_STR(x) MKERNEL_STR2(x)
extern "C" const char* mkernelVersionString(void) { return "mkernel " MKERNEL_STR(MKERNEL_VERSION); }
