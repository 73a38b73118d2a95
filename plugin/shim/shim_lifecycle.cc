// Communicator lifetime and queries: ncclCommSplit, ncclCommShrink, ncclCommFinalize,
// ncclCommDestroy, ncclCommAbort, ncclCommRevoke, ncclCommGetAsyncError, ncclCommCount,
// ncclCommCuDevice, ncclCommUserRank.
#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "common/log.h"
#include "plugin/shim/nccl_api.h"
#include "plugin/shim/real_nccl.h"
#include "plugin/shim/shim_comm.h"
#include "plugin/shim/shim_forward.h"
#include "plugin/shim/shim_group.h"
#include "plugin/shim/shim_init.h"

namespace mkernel {
namespace shim {
namespace {

// Split and shrink are allowed on a ready comm and on a revoked one (NCCL's recovery path).
Result checkParentUsable(ShimComm* p, const char* name) {
  CommState s = p->state.load(std::memory_order_acquire);
  if (s == CommState::Ready || s == CommState::Revoked) return Result::Success;
  return checkUsable(p, name);
}

// The members of a new comm agree on an mkernel unique id: its rank 0 makes one and sends it to
// the others over the parent's bootstrap. `members` are parent ranks in new-rank order.
Result shareChildId(ShimComm* p, const std::vector<int>& members, uint32_t seq,
                    bootstrap::UniqueId* id) {
  if (members.front() == p->rank) {
    MK_CHECK(bootstrap::createUniqueId(id));
    for (size_t i = 1; i < members.size(); ++i)
      MK_CHECK(p->bootstrap->send(members[i], shimTag(seq), id, sizeof(*id)));
    return Result::Success;
  }
  return p->bootstrap->recv(members.front(), shimTag(seq), id, sizeof(*id));
}

// mkernel's part of a split's or shrink's child: an mkernel id from the child's rank 0, then
// setupComm. `child` null (NCCL_SPLIT_NOCOLOR): nothing.
Result buildChild(ShimComm* p, ShimComm* child, const std::vector<int>& members, uint32_t seq,
                  const ncclConfig_t* config, const char* caller) {
  if (child == nullptr) return Result::Success;
  CommSetup s;
  s.caller = caller;
  s.emulate = p->emulate;
  s.cudaDev = p->cudaDev;
  s.nRanks = static_cast<int>(members.size());
  s.rank = static_cast<int>(std::find(members.begin(), members.end(), p->rank) - members.begin());
  s.config = config;
  Result r = shareChildId(p, members, seq, &s.id);
  if (r == Result::Success) return setupComm(child, s);
  child->initResult.store(static_cast<int>(r));
  child->state.store(CommState::InitFailed);
  return r;
}

// mkernel's part of a split: colors and keys all-gathered over the parent's bootstrap (every rank,
// NCCL_SPLIT_NOCOLOR ones too), then the child of this rank's color.
Result splitTask(ShimComm* p, ShimComm* child, int color, int key, const ncclConfig_t* config) {
  const uint32_t seq = p->splitSeq++;
  struct Entry {
    int color, key;
  };
  std::vector<Entry> all(static_cast<size_t>(p->nRanks));
  all[static_cast<size_t>(p->rank)] = {color, key};
  Result r = p->bootstrap->allGather(all.data(), sizeof(Entry));
  if (r != Result::Success) {
    if (child) {
      child->initResult.store(static_cast<int>(r));
      child->state.store(CommState::InitFailed);
    }
    return r;
  }
  std::vector<int> members;
  for (int i = 0; i < p->nRanks; ++i)
    if (color != NCCL_SPLIT_NOCOLOR && all[static_cast<size_t>(i)].color == color)
      members.push_back(i);
  // New ranks follow the keys; equal keys keep the parent's order (as NCCL).
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[static_cast<size_t>(a)].key < all[static_cast<size_t>(b)].key;
  });
  return buildChild(p, child, members, seq, config ? config : &p->config, "ncclCommSplit");
}

// Split or shrink inside a group: NCCL's call now, queued in NCCL's group (NCCL writes the child's
// handle at its group's end, into a slot of the shim's group: groupPendingChild), and mkernel's
// part at ncclGroupEnd, before NCCL's group closes. In emulation the stand-in is there at once.
ncclResult_t deferChild(ShimComm* p, ShimComm* child, std::function<Result()> kernelPart,
                        const MakeReal& makeReal, ncclComm_t* newcomm, const char* caller) {
  *newcomm = nullptr;
  if (!p->emulate) {
    ncclResult_t rr = groupEnsureRealGroup();
    if (rr == ncclSuccess) rr = fromReal(makeReal(groupPendingChild(child, newcomm)));
    if (rr != ncclSuccess) {
      const RealNccl& real = realNccl(false);
      MK_ERROR(static_cast<Result>(rr), "%s : rank %d: the real NCCL's call failed: %s", caller,
               p->rank, real.ncclGetLastError ? real.ncclGetLastError(p->real) : "");
      if (child != nullptr) {
        child->initResult.store(static_cast<int>(rr));
        child->state.store(CommState::InitFailed);
      }
      groupRecordError(rr);
      return rr;
    }
  } else if (child != nullptr) {
    bindHandle(child, newStandInHandle());
    *newcomm = child->handle();
  }
  groupDefer(p->cudaDev, std::move(kernelPart));
  return ncclSuccess;
}

// Posted work completes first, then the kernel and its resources go; the comm still answers
// queries until ncclCommDestroy.
Result finalizeNow(ShimComm* c) {
  if (const std::shared_ptr<mkernel::coll::Communicator> mk = kernelOf(c)) {
    Result r = mk->finalize();
    keepCommStats(c);
    takeKernel(c);
    c->mkUnavailable = "finalized";
    MK_CHECK(r);
  }
  if (c->real != nullptr) {
    ncclResult_t rr = callReal(&RealNccl::ncclCommFinalize, "ncclCommFinalize", c->real);
    if (rr != ncclSuccess) return static_cast<Result>(rr);
  }
  return Result::Success;
}

}  // namespace
}  // namespace shim
}  // namespace mkernel

using mkernel::Result;
using namespace mkernel::shim;

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key,
                                               ncclComm_t* newcomm, ncclConfig_t* config) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclCommSplit, "ncclCommSplit", comm, color, key, newcomm, config);
  ShimComm* p = findShimComm(comm);
  if (p == nullptr)
    return forwardForeign(comm, &RealNccl::ncclCommSplit, "ncclCommSplit", comm, color, key,
                          newcomm, config);
  if (newcomm == nullptr)
    return toNccl(MK_ERROR(Result::InvalidArgument, "ncclCommSplit : newcomm argument is NULL"));
  *newcomm = nullptr;
  Result r = checkParentUsable(p, "ncclCommSplit");
  if (r == Result::Success && color < 0 && color != NCCL_SPLIT_NOCOLOR)
    r = MK_ERROR(Result::InvalidArgument,
                 "ncclCommSplit : invalid color %d (>= 0 or NCCL_SPLIT_NOCOLOR)", color);
  if (r == Result::Success) r = checkConfig(config, "ncclCommSplit");
  if (r != Result::Success) {
    groupRecordError(toNccl(r));
    return toNccl(r);
  }
  ShimComm* child = color == NCCL_SPLIT_NOCOLOR ? nullptr : newShimComm();
  const bool hasConfig = config != nullptr;
  const ncclConfig_t cfg = hasConfig ? *config : ncclConfig_t(NCCL_CONFIG_INITIALIZER);
  MakeReal makeReal = [p, color, key, cfg, hasConfig](ncclComm_t* out) {
    ncclConfig_t rc = realConfigFor(hasConfig ? &cfg : &p->config);
    return realNccl(false).ncclCommSplit(p->real, color, key, out, &rc);
  };
  std::function<Result()> kernelPart = [p, child, color, key, cfg, hasConfig] {
    return splitTask(p, child, color, key, hasConfig ? &cfg : nullptr);
  };
  if (groupActive())
    return deferChild(p, child, std::move(kernelPart), makeReal, newcomm, "ncclCommSplit");
  return createBlocking(child, kernelPart, makeReal, p->emulate, "ncclCommSplit", newcomm);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList,
                                                int excludeRanksCount, ncclComm_t* newcomm,
                                                ncclConfig_t* config, int shrinkFlags) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclCommShrink, "ncclCommShrink", comm, excludeRanksList,
                    excludeRanksCount, newcomm, config, shrinkFlags);
  ShimComm* p = findShimComm(comm);
  if (p == nullptr)
    return forwardForeign(comm, &RealNccl::ncclCommShrink, "ncclCommShrink", comm, excludeRanksList,
                          excludeRanksCount, newcomm, config, shrinkFlags);
  if (newcomm == nullptr)
    return toNccl(MK_ERROR(Result::InvalidArgument, "ncclCommShrink : newcomm argument is NULL"));
  *newcomm = nullptr;
  Result r = checkParentUsable(p, "ncclCommShrink");
  // As NCCL (seen on 2.28.9: a NULL list is ncclInvalidArgument even with a count of 0).
  if (r == Result::Success && excludeRanksList == nullptr)
    r = MK_ERROR(Result::InvalidArgument, "ncclCommShrink : excludeRanksList argument is NULL");
  if (r == Result::Success && excludeRanksCount < 0)
    r = MK_ERROR(Result::InvalidArgument, "ncclCommShrink : invalid excludeRanksCount %d",
                 excludeRanksCount);
  if (r == Result::Success && shrinkFlags != NCCL_SHRINK_DEFAULT &&
      shrinkFlags != NCCL_SHRINK_ABORT)
    r = MK_ERROR(Result::InvalidArgument, "ncclCommShrink : invalid shrinkFlags 0x%x", shrinkFlags);
  std::vector<bool> excluded(static_cast<size_t>(p->nRanks), false);
  for (int i = 0; r == Result::Success && i < excludeRanksCount; ++i) {
    const int x = excludeRanksList[i];
    if (x < 0 || x >= p->nRanks)
      r = MK_ERROR(Result::InvalidArgument, "ncclCommShrink : excluded rank %d out of range 0..%d",
                   x, p->nRanks - 1);
    else if (x == p->rank)
      r = MK_ERROR(Result::InvalidArgument, "ncclCommShrink : rank %d is in its own exclude list",
                   x);
    else
      excluded[static_cast<size_t>(x)] = true;
  }
  if (r == Result::Success) r = checkConfig(config, "ncclCommShrink");
  if (r != Result::Success) {
    groupRecordError(toNccl(r));
    return toNccl(r);
  }
  std::vector<int> members;  // survivors keep their order (NCCL fills the gaps)
  for (int i = 0; i < p->nRanks; ++i)
    if (!excluded[static_cast<size_t>(i)]) members.push_back(i);
  if (shrinkFlags & NCCL_SHRINK_ABORT) {
    // Terminate the parent's work first; the parent is only fit for destruction afterwards.
    if (const std::shared_ptr<mkernel::coll::Communicator> mk = kernelOf(p)) {
      keepCommStats(p);
      mk->abort();
      takeKernel(p);
      p->mkUnavailable = "aborted by ncclCommShrink(NCCL_SHRINK_ABORT)";
    }
    p->state.store(CommState::Revoked);
  }
  // The survivors alone take part: excluded ranks may be dead, so no collective of the parent's
  // bootstrap is used, only point-to-point messages among survivors.
  const uint32_t seq = p->splitSeq++;
  ShimComm* child = newShimComm();
  const ncclConfig_t cfg = config ? *config : p->config;
  // NCCL's call runs before this returns (inside a group, queued in NCCL's group): the caller's
  // list is still valid then.
  MakeReal makeReal = [&](ncclComm_t* out) {
    ncclConfig_t rc = realConfigFor(&cfg);
    return realNccl(false).ncclCommShrink(p->real, excludeRanksList, excludeRanksCount, out, &rc,
                                          shrinkFlags);
  };
  std::function<Result()> kernelPart = [p, child, members, seq, cfg] {
    return buildChild(p, child, members, seq, &cfg, "ncclCommShrink");
  };
  if (groupActive())
    return deferChild(p, child, std::move(kernelPart), makeReal, newcomm, "ncclCommShrink");
  return createBlocking(child, kernelPart, makeReal, p->emulate, "ncclCommShrink", newcomm);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (MKERNEL_FROM_NCCL()) return callReal(&RealNccl::ncclCommFinalize, "ncclCommFinalize", comm);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclCommFinalize, "ncclCommFinalize", comm);
  Result r = checkUsable(c, "ncclCommFinalize");
  if (r != Result::Success) return toNccl(r);
  c->state.store(CommState::Finalized, std::memory_order_release);
  // Inside a group (one thread finalizing several ranks) all of them run together at
  // ncclGroupEnd: the mkernel communicator's finalize waits for its peers.
  if (groupActive()) {
    groupDefer(c->cudaDev, [c] { return finalizeNow(c); });
    return ncclSuccess;
  }
  return toNccl(finalizeNow(c));
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (MKERNEL_FROM_NCCL()) return callReal(&RealNccl::ncclCommDestroy, "ncclCommDestroy", comm);
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclCommDestroy, "ncclCommDestroy", comm);
  CommState s = c->state.load();
  for (;;) {
    if (s == CommState::Destroyed || s == CommState::Aborted)
      return toNccl(MK_ERROR(Result::InvalidArgument,
                             "ncclCommDestroy : the communicator was already %s",
                             commStateName(s)));
    if (s == CommState::Initializing)
      return toNccl(MK_ERROR(Result::InvalidUsage,
                             "ncclCommDestroy : the communicator is still being created"));
    if (c->state.compare_exchange_weak(s, CommState::Destroyed)) break;
  }
  if (s == CommState::InitFailed) {
    // Nothing of mkernel's to wait for; NCCL's communicator, if its own init failed, takes an
    // abort (NCCL's destroy refuses such a comm).
    releaseShimComm(c, /*abortive=*/true);
    return ncclSuccess;
  }
  // As ncclCommFinalize: inside a group, every rank's teardown runs together at ncclGroupEnd.
  if (groupActive()) {
    groupDefer(c->cudaDev, [c] {
      releaseShimComm(c, /*abortive=*/false);
      return Result::Success;
    });
    return ncclSuccess;
  }
  destroyShimComm(c);
  return ncclSuccess;
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (MKERNEL_FROM_NCCL()) return callReal(&RealNccl::ncclCommAbort, "ncclCommAbort", comm);
  if (comm == nullptr) return ncclSuccess;  // as NCCL
  ShimComm* c = findShimComm(comm);
  if (c == nullptr) return forwardForeign(comm, &RealNccl::ncclCommAbort, "ncclCommAbort", comm);
  CommState s = c->state.exchange(CommState::Aborted);
  if (s == CommState::Destroyed || s == CommState::Aborted) {
    c->state.store(s);
    return toNccl(MK_ERROR(Result::InvalidArgument,
                           "ncclCommAbort : the communicator was already %s", commStateName(s)));
  }
  // Never waits: the kernel, the bootstrap's waits and the real comm are all aborted.
  releaseShimComm(c, /*abortive=*/true);
  return ncclSuccess;
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclCommRevoke, "ncclCommRevoke", comm, revokeFlags);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclCommRevoke, "ncclCommRevoke", comm, revokeFlags);
  if (revokeFlags != NCCL_REVOKE_DEFAULT)
    return toNccl(MK_ERROR(Result::InvalidArgument,
                           "ncclCommRevoke : revokeFlags must be NCCL_REVOKE_DEFAULT, got %d",
                           revokeFlags));
  Result r = checkUsable(c, "ncclCommRevoke");
  if (r != Result::Success) return toNccl(r);
  // In-flight mkernel work stops now; the comm then only serves destroy, split and shrink.
  if (const std::shared_ptr<mkernel::coll::Communicator> mk = kernelOf(c)) {
    keepCommStats(c);
    mk->abort();
    takeKernel(c);
    c->mkUnavailable = "revoked";
  }
  if (c->real != nullptr) {
    ncclResult_t rr = callReal(&RealNccl::ncclCommRevoke, "ncclCommRevoke", c->real, revokeFlags);
    if (rr != ncclSuccess) return rr;
  }
  c->state.store(CommState::Revoked, std::memory_order_release);
  return ncclSuccess;
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  // NCCL calls it on its own comms through its PLT (2.28's enqueue, for every collective of a
  // non-blocking comm): straight back to NCCL.
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclCommGetAsyncError, "ncclCommGetAsyncError", comm, asyncError);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclCommGetAsyncError, "ncclCommGetAsyncError", comm,
                          asyncError);
  if (asyncError == nullptr)
    return toNccl(
        MK_ERROR(Result::InvalidArgument, "ncclCommGetAsyncError : asyncError argument is NULL"));
  switch (c->state.load(std::memory_order_acquire)) {
    case CommState::Initializing:
      *asyncError = ncclInProgress;
      return ncclSuccess;
    case CommState::InitFailed:
      *asyncError = static_cast<ncclResult_t>(c->initResult.load());
      return ncclSuccess;
    case CommState::Destroyed:
    case CommState::Aborted:
      return toNccl(checkUsable(c, "ncclCommGetAsyncError"));
    default:
      break;
  }
  const std::shared_ptr<mkernel::coll::Communicator> mk = kernelOf(c);
  ncclResult_t mine = mk ? static_cast<ncclResult_t>(mk->asyncError()) : ncclSuccess;
  ncclResult_t theirs = ncclSuccess;
  if (c->real != nullptr) {
    ncclResult_t rr =
        callReal(&RealNccl::ncclCommGetAsyncError, "ncclCommGetAsyncError", c->real, &theirs);
    if (rr != ncclSuccess) return rr;
  }
  // An error of either side first, then "in progress" if either is still busy.
  // The side that failed is remembered, as for a call's failure: ncclGetErrorString and
  // ncclGetLastError then point at that side's log and message.
  auto isError = [](ncclResult_t r) { return r != ncclSuccess && r != ncclInProgress; };
  if (isError(mine))
    *asyncError = toNccl(static_cast<Result>(mine));
  else if (isError(theirs))
    *asyncError = fromReal(theirs);
  else if (mine == ncclInProgress || theirs == ncclInProgress)
    *asyncError = ncclInProgress;
  else
    *asyncError = ncclSuccess;
  return ncclSuccess;
}

namespace {

// Queries answer for any comm that still exists (NCCL answers them after finalize too).
ncclResult_t queryCheck(ShimComm* c, const void* out, const char* name, const char* outName) {
  if (out == nullptr)
    return toNccl(MK_ERROR(Result::InvalidArgument, "%s : %s argument is NULL", name, outName));
  CommState s = c->state.load(std::memory_order_acquire);
  if (s == CommState::Destroyed || s == CommState::Aborted) return toNccl(checkUsable(c, name));
  return ncclSuccess;
}

}  // namespace

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (MKERNEL_FROM_NCCL()) return callReal(&RealNccl::ncclCommCount, "ncclCommCount", comm, count);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclCommCount, "ncclCommCount", comm, count);
  ncclResult_t r = queryCheck(c, count, "ncclCommCount", "count");
  if (r == ncclSuccess) *count = c->nRanks;
  return r;
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclCommCuDevice, "ncclCommCuDevice", comm, device);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclCommCuDevice, "ncclCommCuDevice", comm, device);
  ncclResult_t r = queryCheck(c, device, "ncclCommCuDevice", "device");
  if (r == ncclSuccess) *device = c->cudaDev;
  return r;
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclCommUserRank, "ncclCommUserRank", comm, rank);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeign(comm, &RealNccl::ncclCommUserRank, "ncclCommUserRank", comm, rank);
  ncclResult_t r = queryCheck(c, rank, "ncclCommUserRank", "rank");
  if (r == ncclSuccess) *rank = c->rank;
  return r;
}
