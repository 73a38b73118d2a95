// Per-call routing: the mKernel, or the real NCCL.
//
// The answer must be the same on every rank (DESIGN.md §3), so it depends only on what all ranks
// share: the call's kind, dtype, op, count, the comm's size and settings — never on buffers —
// and whether the stream is being captured into a CUDA graph (every rank captures the same calls).
#pragma once

#include <string>

#include "collectives/types.h"
#include "common/result.h"
#include "plugin/shim/shim_comm.h"
#include "plugin/shim/shim_validate.h"

namespace mkernel {
namespace shim {

enum class Route { Kernel, Forward };

// MKERNEL_GRAPH: where collectives go that are enqueued while their stream is being captured into
// a CUDA graph. A captured mkernel communicator keeps its persistent kernel resident (a replay
// never passes through the host), and on the H200 an application's device allocation made while
// it was resident did not return (docs/KERNEL.md, "A product risk"). So by default they go to the
// real NCCL, which captures its own kernels. Every rank must capture the same collectives, as
// SPMD programs (torch.compile, CUDA-graph training loops) do. (GraphPath: shim_comm.h.)

inline Result parseGraphPath(const std::string& v, GraphPath* out) {
  if (v == "nccl") {
    *out = GraphPath::Nccl;
  } else if (v == "mkernel") {
    *out = GraphPath::Mkernel;
  } else {
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_GRAPH=%s: expected nccl or mkernel", v.c_str());
  }
  return Result::Success;
}

// The route of a collective the policy gave `policyRoute`, given whether its stream is being
// captured, whether a real NCCL communicator is there (not in emulation) and MKERNEL_GRAPH.
inline Route graphRoute(Route policyRoute, bool capturing, bool haveReal, GraphPath mode) {
  if (policyRoute == Route::Kernel && capturing && haveReal && mode == GraphPath::Nccl) return Route::Forward;
  return policyRoute;
}

// Decides where `call` runs: calls that are not one of the five collectives, and every call of a
// comm without an mkernel communicator, are forwarded; the collectives are decided by the comm's
// coll::SelectionPolicy. In emulation there is nothing to forward to: a call mkernel does not
// run is an InvalidUsage error with a message naming why. `args` is null for non-collectives.
// `capturing`: the call's stream is being captured into a CUDA graph (graphRoute above).
Result chooseRoute(ShimComm& comm, const Call& call, coll::CollArgs* args, bool capturing, Route* out);

}  // namespace shim
}  // namespace mkernel
