// Stand-in for libmkernel.so's query entry point, for the nccl-tests patch selftest: exports
// mkernelGetStats (same layout as plugin/mkernel_api.h) with counters the selftest drives
// through fakeMkernelAdd. Preloaded like the real library, so dlsym(RTLD_DEFAULT) finds it.
#include <stdint.h>

typedef struct {
  uint64_t size;
  uint64_t kernelOps[5];
  uint64_t forwardedOps[5];
  uint64_t kernelLaunches;
  uint64_t commsCreated;
} mkernelStats_t;

static mkernelStats_t counters;

__attribute__((visibility("default"))) void fakeMkernelAdd(int coll, uint64_t kernelOps,
                                                           uint64_t forwardedOps) {
  counters.kernelOps[coll] += kernelOps;
  counters.forwardedOps[coll] += forwardedOps;
}

__attribute__((visibility("default"))) int mkernelGetStats(mkernelStats_t* out) {
  if (out == 0 || out->size < sizeof(mkernelStats_t)) return 1;
  for (int c = 0; c < 5; c++) {
    out->kernelOps[c] = counters.kernelOps[c];
    out->forwardedOps[c] = counters.forwardedOps[c];
  }
  return 0;
}
