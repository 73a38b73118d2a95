// mkernel's own C entry points (exported from libmkernel.so), found with dlsym by nccl-tests'
// patch, mkernel-bench and the tests to prove which path ran.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MKERNEL_API __attribute__((visibility("default")))

// Per-process totals since load, per collective (index = ncclFunc_t: Broadcast 0, Reduce 1,
// AllGather 2, ReduceScatter 3, AllReduce 4).
typedef struct {
  uint64_t size;             // sizeof(mkernelStats_t), set by the caller
  uint64_t kernelOps[5];     // collectives run by mkernel's kernels (persistent and launch path)
  uint64_t forwardedOps[5];  // collectives forwarded to the real NCCL
  uint64_t kernelLaunches;   // persistent-kernel (re)launches
  uint64_t commsCreated;     // shim communicators created
  uint64_t launchOps[5];     // of kernelOps, those run by the launch path (small eager ones)
  // Reads of a communicator's launch-path counters (a copy from device memory) that gave up after
  // 0.25 s, the copy held in a hardware queue behind other work (such as a copy queued after a
  // collective that hangs): launchOps and kernelOps lag until a later read succeeds. This call
  // waits no longer than that for each communicator.
  uint64_t countersLate;
} mkernelStats_t;

MKERNEL_API int mkernelGetStats(mkernelStats_t* stats);  // 0 on success
MKERNEL_API const char* mkernelVersionString(void);

// Tests only: the library's MKERNEL_* settings are read again at their next use (after a test
// changed the environment). Settings are otherwise read once per process.
MKERNEL_API void mkernelResetParamsForTesting(void);

#ifdef __cplusplus
}
#endif
