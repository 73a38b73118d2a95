#include "plugin/shim/shim_select.h"

#include <mutex>

#include "common/log.h"

namespace mkernel {
namespace shim {

Result chooseRoute(const ShimComm& comm, coll::Communicator* mk, const Call& call,
                   coll::CollArgs* args, Route* out, bool* doorbell) {
  *out = Route::Forward;
  *doorbell = false;
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
      return MK_ERROR(
          Result::InvalidUsage,
          "%s : its per-call config asks for more than the defaults, which only the real NCCL "
          "honours, and emulation (MKERNEL_EMULATE=1) has none",
          call.name);
    return Result::Success;
  }
  if (mk == nullptr) {
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
      *out = Route::Kernel;
      if (mk->needsDoorbell(*args)) {
        *doorbell = true;
        *out = doorbellRoute(comm.graphPath, comm.real != nullptr, comm.nNodes);
        if (*out == Route::Forward) {
          static std::once_flag once;
          std::call_once(once, [&] {
            MK_INFO(kLogColl,
                    "shim: %s of %zu elements runs in the real NCCL: mkernel would run it on its "
                    "persistent kernel, "
                    "whose captures stay resident (MKERNEL_GRAPH=%s; docs/SHIM.md)",
                    call.name, args->count, comm.graphPath == GraphPath::Nccl ? "nccl" : "auto");
          });
        }
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
