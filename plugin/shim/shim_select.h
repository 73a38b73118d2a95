// Per-call routing: the mKernel, or the real NCCL.
//
// The answer must be the same on every rank (docs/SHIM.md, routing), so it depends only on what all
// ranks share: the call's kind, dtype, op, count, the comm's size and settings — never on buffers —
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
// a CUDA graph. A communicator whose captured collectives take the persistent kernel's doorbell
// keeps that kernel resident (a replay never passes through the host), and on the H200 an
// application's device allocation made while it was resident did not return (docs/KERNEL.md,
// "A product risk"). The launch path's captured kernels need nothing resident (the device numbers
// the replays). So by default (auto) a captured collective stays in mkernel when the launch path
// takes it (Communicator::capturedWithoutResidency), and goes to the real NCCL, which captures its
// own kernels, when it would need the doorbell. nccl: every captured collective to NCCL; mkernel:
// every one to mkernel. Every rank must capture the same collectives, as SPMD programs
// (torch.compile, CUDA-graph training loops) do, and the choice is a function of what they share.
// (GraphPath: shim_comm.h.)

inline Result parseGraphPath(const std::string& v, GraphPath* out) {
  if (v == "auto") {
    *out = GraphPath::Auto;
  } else if (v == "nccl") {
    *out = GraphPath::Nccl;
  } else if (v == "mkernel") {
    *out = GraphPath::Mkernel;
  } else {
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_GRAPH=%s: expected auto, nccl or mkernel", v.c_str());
  }
  return Result::Success;
}

// The route of a collective the policy gave `policyRoute`, given whether its stream is being
// captured, whether a real NCCL communicator is there (not in emulation), MKERNEL_GRAPH, and
// whether mkernel would capture it without anything resident (auto's criterion).
inline Route graphRoute(Route policyRoute, bool capturing, bool haveReal, GraphPath mode, bool withoutResidency) {
  if (policyRoute != Route::Kernel || !capturing || !haveReal) return policyRoute;
  if (mode == GraphPath::Nccl || (mode == GraphPath::Auto && !withoutResidency)) return Route::Forward;
  return policyRoute;
}

// Decides where `call` runs: calls that are not one of the five collectives, calls whose per-call
// config (nccl*Config) asks for more than the defaults, and every call of a comm without an mkernel
// communicator, are forwarded; the collectives are decided by the comm's coll::SelectionPolicy.
// In emulation there is nothing to forward to: a call mkernel does not run is an InvalidUsage
// error with a message naming why. `args` is null for non-collectives.
// `capturing`: the call's stream is being captured into a CUDA graph (graphRoute above).
Result chooseRoute(ShimComm& comm, const Call& call, coll::CollArgs* args, bool capturing, Route* out);

}  // namespace shim
}  // namespace mkernel
