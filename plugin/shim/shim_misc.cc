// The rest of the API: version, error strings, memory, registration, windows, the device API's
// host entries, custom reduction ops.
#include <cstring>
#include <string>

#include "vendor/cuda_driver.h"
#include "common/log.h"
#include "common/param.h"
#include "plugin/shim/nccl_api.h"
#include "plugin/shim/real_nccl.h"
#include "plugin/shim/shim_comm.h"
#include "plugin/shim/shim_forward.h"
#include "plugin/shim/shim_group.h"
#include "plugin/shim/shim_init.h"
#include "plugin/shim/shim_validate.h"

using mkernel::Result;
using namespace mkernel::shim;

namespace {

// The NCCL that handle-less calls go to: in emulation only one the process already holds.
const RealNccl& realForHandleless() {
  return realNccl(!emulationRequested());
}

// A shim comm's real NCCL comm for calls the shim only forwards (registration, windows, the
// device API); emulated comms have none, and say so.
Result realCommOf(ShimComm* c, const char* name, ncclComm_t* out) {
  MK_CHECK(checkUsable(c, name));
  if (c->real == nullptr)
    return MK_ERROR(Result::InvalidUsage,
                    "%s is not supported in emulation (MKERNEL_EMULATE=1): it needs the real NCCL",
                    name);
  // Registration and windows are collective in NCCL: one thread registering for several ranks
  // does it inside a group, which must then be a real group too.
  if (groupActive() && groupEnsureRealGroup() != ncclSuccess)
    return MK_ERROR(Result::InvalidUsage, "%s : could not open the real NCCL group", name);
  *out = c->real;
  return Result::Success;
}

// The most custom ops a comm's table holds (NCCL numbers its ops from ncclNumOps up, reusing the
// slots of destroyed ones).
constexpr int kMaxCustomOps = 1 << 16;

// Ranks per node for the emulated device-API teams (MKERNEL_RANKS_PER_NODE, else one node).
int emulatedLsaSize(const ShimComm* c) {
  int rpn = static_cast<int>(mkernel::params::RANKS_PER_NODE());
  return rpn > 0 && rpn < c->nRanks ? rpn : c->nRanks;
}

}  // namespace

MKERNEL_NCCL_EXPORT ncclResult_t ncclGetVersion(int* version) {
  if (MKERNEL_FROM_NCCL()) return callReal(&RealNccl::ncclGetVersion, "ncclGetVersion", version);
  announceShimOnce();
  if (version == nullptr)
    return toNccl(MK_ERROR(Result::InvalidArgument, "ncclGetVersion : version argument is NULL"));
  // PyTorch checks this against the NCCL it was built with: always the real NCCL's number.
  const RealNccl& real = realForHandleless();
  if (real.available) return callReal(&RealNccl::ncclGetVersion, "ncclGetVersion", version);
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

// NCCL's texts, except for the code of a failure that arose in mkernel: its text names mkernel's
// log (MKERNEL_DEBUG, MKERNEL_DEBUG_SUBSYS), where the details are, not NCCL_DEBUG.
MKERNEL_NCCL_EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  if (MKERNEL_FROM_NCCL()) {  // NCCL's own messages: NCCL's text
    const RealNccl& real = realNccl(false);
    if (real.available && real.ncclGetErrorString != nullptr)
      return real.ncclGetErrorString(result);
  }
  if (result != ncclSuccess && failureIsMkernels(result) && static_cast<int>(result) > 0 &&
      static_cast<int>(result) <= static_cast<int>(Result::InProgress))
    return mkernel::resultString(static_cast<Result>(result));
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

MKERNEL_NCCL_EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  // The message of whichever side failed last: the shim's own, or the real NCCL's.
  if (!lastFailureWasOurs() || MKERNEL_FROM_NCCL()) {
    const RealNccl& real = realNccl(false);
    if (real.available && real.ncclGetLastError != nullptr) {
      const ShimComm* c = findShimComm(comm);
      return real.ncclGetLastError(c != nullptr && c->real == nullptr ? nullptr
                                                                      : comm);  // never a stand-in
    }
  }
  return mkernel::lastError();
}

// In emulation (MKERNEL_EMULATE=1) both are served here, even when the real NCCL is loaded
// (nccl-tests links it): emulation creates no real communicator, so nothing needs NCCL's own
// allocator, and the real ncclMemAlloc starts NCCL's own CUDA runtime. With that runtime started
// under CUDA_MODULE_LOADING=EAGER (which emulation needs), thread ranks sharing the GPU stall at
// their first collective with the whole GPU taking no new work (mkernel-emuprobe,
// docs/RELIABILITY.md: 0 of 4 runs passed; with the real NCCL loaded but
// NCCL_CUMEM_ENABLE=0, 2 of 4; with cuMem buffers mapped without NCCL, 4 of 4).
// The memory is mapped as NCCL maps it (cuMemCreate / cuMemMap), not cudaMalloc'd: a cudaFree
// waits for every kernel of the device and holds back every other thread's CUDA calls meanwhile,
// so one thread rank's ncclMemFree while another's collective is half posted would stop them all
// until MKERNEL_TIMEOUT_S (mkernel-freeprobe); cuMemUnmap / cuMemRelease wait for
// nothing.
MKERNEL_NCCL_EXPORT ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  // Handle-less and re-entered from libnccl: the real allocator when there is one (its cuMem
  // allocations are what NCCL's registration expects); our own mapping without it, or in emulation.
  if (MKERNEL_FROM_NCCL()) return callReal(&RealNccl::ncclMemAlloc, "ncclMemAlloc", ptr, size);
  const RealNccl& real = realForHandleless();
  if (real.available && !emulationRequested())
    return callReal(&RealNccl::ncclMemAlloc, "ncclMemAlloc", ptr, size);
  if (ptr == nullptr || size == 0)
    return toNccl(MK_ERROR(Result::InvalidArgument,
                           "ncclMemAlloc : invalid argument (ptr %p, size %zu)",
                           static_cast<void*>(ptr), size));
  const Result r = mkernel::cudrv::vmmAlloc(ptr, size);
  if (r != Result::Success) {
    const std::string why = mkernel::lastError();
    return toNccl(MK_ERROR(r, "ncclMemAlloc : mapping %zu bytes failed: %s", size, why.c_str()));
  }
  return ncclSuccess;
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclMemFree(void* ptr) {
  if (MKERNEL_FROM_NCCL()) return callReal(&RealNccl::ncclMemFree, "ncclMemFree", ptr);
  const RealNccl& real = realForHandleless();
  if (real.available && !emulationRequested())
    return callReal(&RealNccl::ncclMemFree, "ncclMemFree", ptr);
  if (ptr == nullptr) return ncclSuccess;
  const Result r = mkernel::cudrv::vmmFree(ptr);
  if (r != Result::Success) {
    const std::string why = mkernel::lastError();
    return toNccl(MK_ERROR(r, "ncclMemFree : freeing %p failed: %s", ptr, why.c_str()));
  }
  return ncclSuccess;
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size,
                                                  void** handle) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclCommRegister, "ncclCommRegister", comm, buff, size, handle);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclCommRegister, "ncclCommRegister", comm, buff, size,
                          handle);
  ncclComm_t real = nullptr;
  Result r = realCommOf(c, "ncclCommRegister", &real);
  if (r != Result::Success) return toNccl(r);
  return callReal(&RealNccl::ncclCommRegister, "ncclCommRegister", real, buff, size, handle);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclCommDeregister, "ncclCommDeregister", comm, handle);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclCommDeregister, "ncclCommDeregister", comm, handle);
  ncclComm_t real = nullptr;
  Result r = realCommOf(c, "ncclCommDeregister", &real);
  if (r != Result::Success) return toNccl(r);
  return callReal(&RealNccl::ncclCommDeregister, "ncclCommDeregister", real, handle);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                                        ncclWindow_t* win, int winFlags) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclCommWindowRegister, "ncclCommWindowRegister", comm, buff, size,
                    win, winFlags);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclCommWindowRegister, "ncclCommWindowRegister", comm,
                          buff, size, win, winFlags);
  ncclComm_t real = nullptr;
  Result r = realCommOf(c, "ncclCommWindowRegister", &real);
  if (r != Result::Success) return toNccl(r);
  return callReal(&RealNccl::ncclCommWindowRegister, "ncclCommWindowRegister", real, buff, size,
                  win, winFlags);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclCommWindowDeregister, "ncclCommWindowDeregister", comm, win);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclCommWindowDeregister, "ncclCommWindowDeregister",
                          comm, win);
  ncclComm_t real = nullptr;
  Result r = realCommOf(c, "ncclCommWindowDeregister", &real);
  if (r != Result::Success) return toNccl(r);
  return callReal(&RealNccl::ncclCommWindowDeregister, "ncclCommWindowDeregister", real, win);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclDevCommCreate(ncclComm_t comm,
                                                   ncclDevCommRequirements_t const* reqs,
                                                   ncclDevComm_t* outDevComm) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclDevCommCreate, "ncclDevCommCreate", comm, reqs, outDevComm);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclDevCommCreate, "ncclDevCommCreate", comm, reqs,
                          outDevComm);
  ncclComm_t real = nullptr;
  Result r = realCommOf(c, "ncclDevCommCreate", &real);
  if (r != Result::Success) return toNccl(r);
  return callReal(&RealNccl::ncclDevCommCreate, "ncclDevCommCreate", real, reqs, outDevComm);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const* devComm) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclDevCommDestroy, "ncclDevCommDestroy", comm, devComm);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclDevCommDestroy, "ncclDevCommDestroy", comm, devComm);
  ncclComm_t real = nullptr;
  Result r = realCommOf(c, "ncclDevCommDestroy", &real);
  if (r != Result::Success) return toNccl(r);
  return callReal(&RealNccl::ncclDevCommDestroy, "ncclDevCommDestroy", real, devComm);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclGinBarrierCreateRequirement(
    ncclComm_t comm, ncclTeam_t team, int nBarriers, ncclGinBarrierHandle_t* outHandle,
    ncclDevResourceRequirements_t* outReq) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclGinBarrierCreateRequirement, "ncclGinBarrierCreateRequirement",
                    comm, team, nBarriers, outHandle, outReq);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclGinBarrierCreateRequirement,
                          "ncclGinBarrierCreateRequirement", comm, team, nBarriers, outHandle,
                          outReq);
  ncclComm_t real = nullptr;
  Result r = realCommOf(c, "ncclGinBarrierCreateRequirement", &real);
  if (r != Result::Success) return toNccl(r);
  return callReal(&RealNccl::ncclGinBarrierCreateRequirement, "ncclGinBarrierCreateRequirement",
                  real, team, nBarriers, outHandle, outReq);
}

// Teams: the real comm's when there is one; emulated comms compute them as NCCL's device-side
// inline functions do (nccl_device/impl/core__funcs.h), with MKERNEL_RANKS_PER_NODE ranks per
// LSA (NVLink) domain.
namespace {

template <typename Fn>
bool realTeam(ncclComm_t comm, ShimComm* c, Fn RealNccl::*fn, ncclTeam_t* out) {
  const RealNccl& real = realNccl(false);
  if (!real.available || real.*fn == nullptr) return false;
  if (c == nullptr) {
    *out = (real.*fn)(comm);
    return true;
  }
  if (c->real == nullptr) return false;
  *out = (real.*fn)(c->real);
  return true;
}

ncclTeam_t emptyTeam(const char* name, const void* comm) {
  MK_ERROR(Result::InvalidArgument, "%s : %p is not a usable communicator", name, comm);
  return ncclTeam_t{0, 0, 0};
}

}  // namespace

MKERNEL_NCCL_EXPORT ncclTeam_t ncclTeamWorld(ncclComm_t comm) {
  ShimComm* c = MKERNEL_FROM_NCCL() ? nullptr : findShimComm(comm);
  ncclTeam_t t{};
  if (realTeam(comm, c, &RealNccl::ncclTeamWorld, &t)) return t;
  if (c == nullptr) return emptyTeam("ncclTeamWorld", comm);
  return ncclTeam_t{c->nRanks, c->rank, 1};
}

MKERNEL_NCCL_EXPORT ncclTeam_t ncclTeamLsa(ncclComm_t comm) {
  ShimComm* c = MKERNEL_FROM_NCCL() ? nullptr : findShimComm(comm);
  ncclTeam_t t{};
  if (realTeam(comm, c, &RealNccl::ncclTeamLsa, &t)) return t;
  if (c == nullptr) return emptyTeam("ncclTeamLsa", comm);
  const int lsa = emulatedLsaSize(c);
  return ncclTeam_t{lsa, c->rank % lsa, 1};
}

MKERNEL_NCCL_EXPORT ncclTeam_t ncclTeamRail(ncclComm_t comm) {
  ShimComm* c = MKERNEL_FROM_NCCL() ? nullptr : findShimComm(comm);
  ncclTeam_t t{};
  if (realTeam(comm, c, &RealNccl::ncclTeamRail, &t)) return t;
  if (c == nullptr) return emptyTeam("ncclTeamRail", comm);
  const int lsa = emulatedLsaSize(c);
  return ncclTeam_t{c->nRanks / lsa, c->rank / lsa, lsa};
}

MKERNEL_NCCL_EXPORT int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank) {
  ShimComm* c = MKERNEL_FROM_NCCL() ? nullptr : findShimComm(comm);
  const RealNccl& real = realNccl(false);
  if (real.available && real.ncclTeamRankToWorld != nullptr && (c == nullptr || c->real != nullptr))
    return real.ncclTeamRankToWorld(c ? c->real : comm, team, rank);
  if (c == nullptr) {
    emptyTeam("ncclTeamRankToWorld", comm);
    return -1;
  }
  return c->rank + (rank - team.rank) * team.stride;
}

MKERNEL_NCCL_EXPORT int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank) {
  ShimComm* c = MKERNEL_FROM_NCCL() ? nullptr : findShimComm(comm);
  const RealNccl& real = realNccl(false);
  if (real.available && real.ncclTeamRankToLsa != nullptr && (c == nullptr || c->real != nullptr))
    return real.ncclTeamRankToLsa(c ? c->real : comm, team, rank);
  if (c == nullptr) {
    emptyTeam("ncclTeamRankToLsa", comm);
    return -1;
  }
  return c->rank % emulatedLsaSize(c) + (rank - team.rank) * team.stride;
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                                          ncclDataType_t datatype,
                                                          ncclScalarResidence_t residence,
                                                          ncclComm_t comm) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclRedOpCreatePreMulSum, "ncclRedOpCreatePreMulSum", op, scalar,
                    datatype, residence, comm);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclRedOpCreatePreMulSum, "ncclRedOpCreatePreMulSum", op,
                          scalar, datatype, residence, comm);
  Result r = checkUsable(c, "ncclRedOpCreatePreMulSum");
  if (r == Result::Success && op == nullptr)
    r = MK_ERROR(Result::InvalidArgument, "ncclRedOpCreatePreMulSum : op argument is NULL");
  if (r == Result::Success &&
      (static_cast<int>(datatype) < 0 || static_cast<int>(datatype) >= ncclNumTypes))
    r = MK_ERROR(Result::InvalidArgument, "ncclRedOpCreatePreMulSum : invalid type %d",
                 static_cast<int>(datatype));
  if (r == Result::Success && residence != ncclScalarHostImmediate && residence != ncclScalarDevice)
    r = MK_ERROR(Result::InvalidArgument, "ncclRedOpCreatePreMulSum : invalid residence %d",
                 static_cast<int>(residence));
  CustomOp made;
  made.live = true;
  made.dtype = datatype;
  made.hostScalar = residence == ncclScalarHostImmediate;
  if (r == Result::Success) {
    if (made.hostScalar) {
      r = scalarToDouble(scalar, datatype, &made.scalar);
    } else if (scalar == nullptr) {
      r = MK_ERROR(Result::InvalidArgument, "ncclRedOpCreatePreMulSum : scalar is NULL");
    } else {
      made.scalarDev = scalar;
    }
  }
  if (r != Result::Success) return toNccl(r);
  int value = 0;
  if (c->real != nullptr) {
    // NCCL's op first: its number is the one the application gets, so that NCCL knows it wherever
    // it arrives (a forwarded call, an entry point the shim does not export).
    ncclRedOp_t realOp = ncclSum;
    ncclResult_t rr = callReal(&RealNccl::ncclRedOpCreatePreMulSum, "ncclRedOpCreatePreMulSum",
                               &realOp, scalar, datatype, residence, c->real);
    if (rr != ncclSuccess) return rr;
    std::memcpy(&value, &realOp, sizeof(value));
    made.hasRealOp = true;
    if (value < ncclNumOps || value - ncclNumOps >= kMaxCustomOps) {
      (void)callReal(&RealNccl::ncclRedOpDestroy, "ncclRedOpDestroy", realOp, c->real);
      return toNccl(MK_ERROR(
          Result::InternalError,
          "ncclRedOpCreatePreMulSum : the real NCCL's op number %d is outside %d..%d, the range of "
          "mkernel's table",
          value, static_cast<int>(ncclNumOps), static_cast<int>(ncclNumOps) + kMaxCustomOps - 1));
    }
    std::lock_guard<std::mutex> lock(c->opsMutex);
    const size_t ix = static_cast<size_t>(value - ncclNumOps);
    if (ix >= c->ops.size()) c->ops.resize(ix + 1);
    c->ops[ix] = made;
  } else {
    // Emulation: numbered as NCCL numbers its own, the first free slot.
    std::lock_guard<std::mutex> lock(c->opsMutex);
    size_t ix = 0;
    while (ix < c->ops.size() && c->ops[ix].live) ++ix;
    if (ix == c->ops.size())
      c->ops.push_back(made);
    else
      c->ops[ix] = made;
    value = ncclNumOps + static_cast<int>(ix);
  }
  *op = static_cast<ncclRedOp_t>(value);
  return ncclSuccess;
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclRedOpDestroy, "ncclRedOpDestroy", op, comm);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclRedOpDestroy, "ncclRedOpDestroy", op, comm);
  Result r = checkUsable(c, "ncclRedOpDestroy");
  if (r != Result::Success) return toNccl(r);
  if (static_cast<int>(op) < ncclNumOps)
    return toNccl(MK_ERROR(Result::InvalidArgument, "ncclRedOpDestroy : operator %d is a built-in",
                           static_cast<int>(op)));
  CustomOp dead;
  {
    std::lock_guard<std::mutex> lock(c->opsMutex);
    const size_t ix = static_cast<size_t>(static_cast<int>(op) - ncclNumOps);
    if (ix >= c->ops.size() || !c->ops[ix].live)
      return toNccl(MK_ERROR(Result::InvalidArgument,
                             "ncclRedOpDestroy : operator %d unknown to this communicator",
                             static_cast<int>(op)));
    dead = c->ops[ix];
    c->ops[ix].live = false;
  }
  if (dead.hasRealOp && c->real != nullptr)
    return callReal(&RealNccl::ncclRedOpDestroy, "ncclRedOpDestroy", op, c->real);
  return ncclSuccess;
}
