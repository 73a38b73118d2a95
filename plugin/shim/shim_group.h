// ncclGroupStart/End for the shim. Groups nest and are per thread, as in NCCL.
//
// Inside a group:
//  - collectives selected for mkernel are collected and posted at the outermost ncclGroupEnd,
//    per communicator in call order (Communicator::enqueue, one call per run of one stream);
//  - forwarded calls go to the real NCCL inside one real ncclGroupStart (opened lazily at the
//    first forwarded call) and the matching real ncclGroupEnd;
//  - blocking work that needs all ranks (comm init, split, shrink — one thread may drive several
//    ranks) is deferred and run at ncclGroupEnd, all tasks concurrently, one thread each.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

#include "collectives/types.h"
#include "common/result.h"
#include "plugin/shim/nccl_api.h"
#include "plugin/shim/shim_comm.h"

namespace mkernel {
namespace shim {

bool groupActive();
void groupStart();
// The outermost end runs everything collected; inner ends only count down.
ncclResult_t groupEnd();
// As groupEnd, but nothing runs: the forwarded part (and the collected mkernel collectives,
// re-issued to the real comms for the estimate) goes to the real ncclGroupSimulateEnd. A NULL
// simInfo ends the group normally, as in NCCL.
ncclResult_t groupSimulateEnd(ncclSimInfo_t* simInfo);

// A collective for the mkernel path, posted at the outermost ncclGroupEnd.
void groupAddKernelOp(ShimComm* comm, const coll::CollArgs& args, cudaStream_t stream);
// Called before a forwarded call inside a group: opens the real group once.
ncclResult_t groupEnsureRealGroup();
// Runs `task` at the outermost ncclGroupEnd on its own thread (with `cudaDev` current).
void groupDefer(int cudaDev, std::function<Result()> task);
// An error inside a group also fails the group's ncclGroupEnd (as NCCL's ncclGroupError).
void groupRecordError(ncclResult_t r);

}  // namespace shim
}  // namespace mkernel
