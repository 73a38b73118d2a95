// Per-call routing: the mKernel, or the real NCCL.
//
// The answer must be the same on every rank (DESIGN.md §3), so it depends only on what all ranks
// share: the call's kind, dtype, op, count, the comm's size and settings — never on buffers.
#pragma once

#include <string>

#include "collectives/types.h"
#include "common/result.h"
#include "plugin/shim/shim_comm.h"
#include "plugin/shim/shim_validate.h"

namespace mkernel {
namespace shim {

enum class Route { Kernel, Forward };

// Decides where `call` runs: calls that are not one of the five collectives, and every call of a
// comm without an mkernel communicator, are forwarded; the collectives are decided by the comm's
// coll::SelectionPolicy. In emulation there is nothing to forward to: a call mkernel does not
// run is an InvalidUsage error with a message naming why. `args` is null for non-collectives.
Result chooseRoute(ShimComm& comm, const Call& call, coll::CollArgs* args, Route* out);

}  // namespace shim
}  // namespace mkernel
