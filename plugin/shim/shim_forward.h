// Calls into the real NCCL, with the shim's error bookkeeping: a missing NCCL or entry point is
// an error with a message (never a crash), a failure of NCCL's is remembered as NCCL's (so that
// ncclGetLastError asks NCCL for the text).
#pragma once

#include "common/result.h"
#include "plugin/shim/real_nccl.h"
#include "plugin/shim/shim_comm.h"

namespace mkernel {
namespace shim {

template <typename Fn, typename... Args>
ncclResult_t callReal(Fn RealNccl::*fn, const char* name, Args... args) {
  const RealNccl& real = realNccl(false);
  if (!real.available)
    return toNccl(MK_ERROR(Result::InvalidUsage, "%s : no real NCCL to forward to (%s)", name,
                           real.why.c_str()));
  if (real.*fn == nullptr)
    return toNccl(MK_ERROR(Result::InvalidUsage, "%s : the real NCCL (%s) lacks this function",
                           name, real.path.c_str()));
  return fromReal((real.*fn)(args...));
}

// A handle the side table does not hold: NULL is NCCL's "comm argument is NULL"; anything else is
// NCCL's alone (a communicator NCCL made without the shim: from an id of NCCL's, a grow, a caller
// that bypassed the shim) and goes there.
template <typename Fn, typename... Args>
ncclResult_t forwardForeign(const void* comm, Fn RealNccl::*fn, const char* name, Args... args) {
  if (comm == nullptr)
    return toNccl(MK_ERROR(Result::InvalidArgument, "%s : comm argument is NULL", name));
  if (!realNccl(false).available)
    return toNccl(MK_ERROR(Result::InvalidArgument, "%s : %p is not a communicator", name, comm));
  return callReal(fn, name, args...);
}

// Whether a comm may run calls now; the error NCCL would give otherwise.
Result checkUsable(ShimComm* c, const char* name);

}  // namespace shim
}  // namespace mkernel
