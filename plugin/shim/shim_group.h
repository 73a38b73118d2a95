// ncclGroupStart/End for the shim. Groups nest and are per thread, as in NCCL.
//
// Inside a group:
//  - NCCL's group is open too (the outermost ncclGroupStart opens it, unless emulating; with NCCL
//    2.28 the first call that hands NCCL something does), so that forwarded calls, NCCL's part of
//    creations, and the entry points the shim does not export (they reach NCCL directly) are all
//    in NCCL's group, closed by the outermost ncclGroupEnd;
//  - collectives selected for mkernel are collected and posted at the outermost ncclGroupEnd,
//    per communicator in call order (Communicator::enqueue, one call per run of one stream);
//  - blocking work that needs all ranks (mkernel's part of init, split, shrink — one thread may
//    drive several ranks) is deferred and run at ncclGroupEnd, all tasks concurrently, one thread
//    each, before NCCL's group closes (mkernel's rendezvous first, as outside a group);
//  - once NCCL's group closed, the communicators it created are checked (an init that failed in
//    NCCL leaves its comm InitFailed) and split's and shrink's children get their handles.
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
// Called before a forwarded call inside a group: opens the real group if it is not open yet.
ncclResult_t groupEnsureRealGroup();
// An init whose NCCL communicator was queued in NCCL's group: checked once the group closed.
void groupNoteCreated(ShimComm* c);
// A slot for the handle NCCL writes at its group's end (split and shrink inside a group, as NCCL
// hands their communicators out only then); `child` gets it then, entered in the side table, and
// *userOut too (NULL when NCCL made none: `child` then fails). `child` null: NCCL_SPLIT_NOCOLOR.
ncclComm_t* groupPendingChild(ShimComm* child, ncclComm_t* userOut);
// Runs `task` at the outermost ncclGroupEnd on its own thread (with `cudaDev` current).
void groupDefer(int cudaDev, std::function<Result()> task);
// An error inside a group also fails the group's ncclGroupEnd (as NCCL's ncclGroupError).
void groupRecordError(ncclResult_t r);

}  // namespace shim
}  // namespace mkernel
