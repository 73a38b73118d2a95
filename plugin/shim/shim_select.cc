#include "plugin/shim/shim_select.h"

#include <mutex>

#include "common/log.h"

namespace mkernel {
namespace shim {

Result chooseRoute(ShimComm& comm, const Call& call, coll::CollArgs* args, bool capturing, Route* out) {
  *out = Route::Forward;
  if (args == nullptr) {
    // Point-to-point and the collectives mkernel has no kernel for.
    if (comm.emulate)
      return MK_ERROR(Result::InvalidUsage,
                      "%s is not run by mkernel, and emulation (MKERNEL_EMULATE=1) has no real "
                      "NCCL to forward it to",
                      call.name);
    return Result::Success;
  }
  if (!collConfigIsDefault(call.collConfig)) {
    // Per-call tuning, algorithm selection, a profiler tag or a launch event: NCCL's to honour.
    if (comm.emulate)
      return MK_ERROR(Result::InvalidUsage,
                      "%s : its per-call config asks for more than the defaults, which only the real NCCL "
                      "honours, and emulation (MKERNEL_EMULATE=1) has none",
                      call.name);
    return Result::Success;
  }
  if (!comm.mk) {
    if (comm.emulate)
      return MK_ERROR(Result::InvalidUsage,
                      "%s : emulated communicator without an mkernel communicator (%s)", call.name,
                      comm.mkUnavailable.c_str());
    return Result::Success;
  }
  coll::PolicyQuery q;
  q.coll = args->coll;
  q.dtype = args->dtype;
  q.op = args->op;
  q.count = args->count;
  q.nRanks = comm.nRanks;
  q.nNodes = comm.nNodes;
  coll::PolicyDecision d = comm.policy ? comm.policy->select(q) : coll::PolicyDecision();
  switch (d.path) {
    case coll::ExecPath::Mkernel: {
      args->algo = static_cast<int32_t>(d.algo);  // one policy decides the algorithm too
      const bool withoutResidency = capturing && comm.mk->capturedWithoutResidency(*args);
      *out = graphRoute(Route::Kernel, capturing, comm.real != nullptr, comm.graphPath, withoutResidency);
      if (capturing && *out == Route::Forward) {
        static std::once_flag once;
        std::call_once(once, [&] {
          MK_INFO(kLogColl, "shim: %s captured into a CUDA graph runs in the real NCCL (MKERNEL_GRAPH=%s)%s", call.name,
                  comm.graphPath == GraphPath::Nccl ? "nccl" : "auto",
                  comm.graphPath == GraphPath::Nccl ? "" : ": mkernel would keep its persistent kernel resident for it");
        });
      } else if (capturing && !withoutResidency) {
        static std::once_flag once;
        std::call_once(once, [&] {
          MK_WARN("shim: a collective captured into a CUDA graph runs in mkernel's persistent kernel, which then "
                  "stays resident until the communicator is destroyed; device allocations made meanwhile may "
                  "block (docs/KERNEL.md)%s",
                  comm.emulate ? " (emulation has no real NCCL to give it to)" : " (MKERNEL_GRAPH=mkernel)");
        });
      }
      return Result::Success;
    }
    case coll::ExecPath::Nccl:
      if (comm.emulate)  // the policy never answers Nccl in emulation; guard the invariant anyway
        return MK_ERROR(Result::InvalidUsage,
                        "%s : the policy forwards it (%s), but emulation has no real NCCL",
                        call.name, d.reason);
      return Result::Success;
    case coll::ExecPath::Unsupported:
      return comm.policy->unsupportedError(q, d);
  }
  return MK_ERROR(Result::InternalError, "%s : unknown policy decision %d", call.name,
                  static_cast<int>(d.path));
}

}  // namespace shim
}  // namespace mkernel
