// Per-call routing: the mKernel, or the real NCCL.
//
// The answer must be the same on every rank (docs/SHIM.md, "One route on every rank"), so it
// depends only on what all ranks share: the call's kind, dtype, op, count, the comm's size and
// settings (agreed at creation) — never on buffers, nor on whether this rank's stream is being
// captured into a CUDA graph.
#pragma once

#include <string>

#include "collectives/types.h"
#include "common/result.h"
#include "plugin/shim/shim_comm.h"
#include "plugin/shim/shim_validate.h"

namespace mkernel {
namespace shim {

enum class Route { Kernel, Forward };

// MKERNEL_GRAPH: where the collectives go that mkernel would run on its persistent kernel's
// doorbell (Communicator::needsDoorbell; the launch path takes the others). A collective captured
// into a CUDA graph on the doorbell keeps that kernel resident (a replay never passes through the
// host), and on the H200 an application's device allocation made while it was resident did not
// return (docs/KERNEL.md, "A product risk"); the launch path's captured kernels need nothing
// resident. The route never depends on whether this rank's stream is being captured: ranks that
// capture a collective and ranks that run it eagerly must take the same path (docs/SHIM.md, "One
// route on every rank"). So: auto (the default) gives those collectives to the real NCCL on
// communicators of one node, and keeps them in mkernel across nodes (MKERNEL_MULTI_NODE=1: the
// hierarchical path runs on the doorbell only); nccl gives them to NCCL always, mkernel never.
// Emulation has no NCCL: they run in mkernel. (GraphPath: shim_comm.h.)

inline Result parseGraphPath(const std::string& v, GraphPath* out) {
  if (v == "auto") {
    *out = GraphPath::Auto;
  } else if (v == "nccl") {
    *out = GraphPath::Nccl;
  } else if (v == "mkernel") {
    *out = GraphPath::Mkernel;
  } else {
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_GRAPH=%s: expected auto, nccl or mkernel",
                    v.c_str());
  }
  return Result::Success;
}

// The route of a collective that mkernel would run on its doorbell: MKERNEL_GRAPH, whether a real
// NCCL communicator is there (not in emulation), and the communicator's node count.
inline Route doorbellRoute(GraphPath mode, bool haveReal, int nNodes) {
  if (!haveReal || mode == GraphPath::Mkernel) return Route::Kernel;
  if (mode == GraphPath::Nccl) return Route::Forward;
  return nNodes > 1 ? Route::Kernel : Route::Forward;
}

// Decides where `call` runs: calls that are not one of the five collectives, calls whose per-call
// config (nccl*Config) asks for more than the defaults, and every call of a comm without an mkernel
// communicator, are forwarded; the collectives are decided by the comm's coll::SelectionPolicy.
// In emulation there is nothing to forward to: a call mkernel does not run is an InvalidUsage
// error with a message naming why. `args` is null for non-collectives. *doorbell: a Kernel route
// on the persistent kernel's doorbell (doorbellRoute above).
// `mk`: the comm's mkernel communicator as the caller holds it (kernelOf), or null.
Result chooseRoute(const ShimComm& comm, coll::Communicator* mk, const Call& call,
                   coll::CollArgs* args, Route* out, bool* doorbell);

}  // namespace shim
}  // namespace mkernel
