// ncclGetUniqueId and communicator creation (ncclCommInitRank, ...Config, ...Scalable,
// ncclCommInitAll), and what split and shrink share with them (createBlocking).
#include "plugin/shim/shim_init.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/stats.h"
#include "common/log.h"
#include "common/param.h"
#include "common/text.h"
#include "plugin/shim/real_nccl.h"
#include "plugin/shim/shim_forward.h"
#include "plugin/shim/shim_group.h"
#include "plugin/shim/shim_select.h"

namespace mkernel {
namespace shim {

bool emulationRequested() {
  return params::EMULATE();
}

ncclConfig_t realConfigFor(const ncclConfig_t* user) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  if (user != nullptr) {
    // An application built against an older nccl.h passes a smaller struct: copy what it has.
    const size_t n = user->size < sizeof(cfg) ? user->size : sizeof(cfg);
    std::memcpy(&cfg, user, n);
    cfg.size = sizeof(cfg);
    cfg.version = NCCL_VERSION_CODE;
  }
  cfg.blocking = 1;
  return cfg;
}

Result checkConfig(const ncclConfig_t* config, const char* caller) {
  if (config == nullptr) return Result::Success;
  if (config->magic != 0xcafebeefu || config->size < offsetof(ncclConfig_t, netName))
    return MK_ERROR(
        Result::InvalidArgument,
        "%s : the config is not initialized (use NCCL_CONFIG_INITIALIZER): magic 0x%x, size %zu",
        caller, config->magic, config->size);
  if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
    return MK_ERROR(Result::InvalidArgument, "%s : config.blocking %d is not 0 or 1", caller,
                    config->blocking);
  return Result::Success;
}

namespace {

// The mkernel Communicator, agreed by all ranks: if any rank cannot make one, none uses it
// (the selection must be identical everywhere, or ranks would wait on different paths).
Result createKernelComm(ShimComm* c, const CommSetup& s) {
  // The policy first: a malformed MKERNEL_* selection setting fails the comm on every rank alike.
  coll::PolicyConfig pc;
  MK_CHECK(coll::loadPolicyConfig(&pc));
  MK_CHECK(parseGraphPath(params::GRAPH.text(), &c->graphPath));
  pc.emulate = s.emulate;
  // Several nodes: the kernel's hierarchical path (through the proxies) takes them in emulation
  // (MKERNEL_RANKS_PER_NODE) and, for ranks on several hosts, only with MKERNEL_MULTI_NODE=1: it
  // has run on emulated nodes only, and stalls there in some runs (docs/RELIABILITY.md).
  const bool multiNodeAllowed = s.emulate || params::MULTI_NODE();
  pc.kernelMultiNode = multiNodeAllowed;
  c->policy.reset(new coll::SelectionPolicy(pc));
  if (pc.disabled && !s.emulate) {
    c->mkUnavailable = "MKERNEL_DISABLE=1";
    MK_INFO(kLogInit, "shim: rank %d: MKERNEL_DISABLE=1, every call goes to NCCL", s.rank);
    return Result::Success;
  }
  if (c->nNodes > 1 && !multiNodeAllowed) {
    // No communicator at all: no staging, proxies or connections for collectives NCCL runs.
    noteCrossHostFallback(c, s.rank);
    return Result::Success;
  }
  coll::CommOptions opts;
  opts.rank = s.rank;
  opts.nRanks = s.nRanks;
  opts.cudaDev = s.cudaDev;
  opts.emulate = s.emulate;
  opts.ranksPerNode = s.emulate ? static_cast<int>(params::RANKS_PER_NODE()) : 0;
  opts.blocking = c->blocking;
  opts.settingsAgreed = true;  // setupComm
  // What needs the persistent kernel goes to NCCL (MKERNEL_GRAPH=auto on one node, or nccl): no
  // SMs are reserved for one, so communicators do not compete for them by creation order.
  opts.persistentKernel =
      doorbellRoute(c->graphPath, /*haveReal=*/!s.emulate, c->nNodes) == Route::Kernel;
  std::unique_ptr<coll::Communicator> created;
  Result made = coll::Communicator::create(opts, c->bootstrap.get(), &created);
  setKernel(c, std::shared_ptr<coll::Communicator>(std::move(created)));
  std::string why = made == Result::Success ? "" : lastError();
  std::vector<int> ok(static_cast<size_t>(s.nRanks), 0);
  ok[static_cast<size_t>(s.rank)] = made == Result::Success ? 1 : 0;
  MK_CHECK(c->bootstrap->allGather(ok.data(), sizeof(int)));
  int failedRank = -1;
  for (int r = 0; r < s.nRanks && failedRank < 0; ++r)
    if (!ok[static_cast<size_t>(r)]) failedRank = r;
  if (failedRank < 0) {
    // What the communicator agreed at creation, so the same on every rank; set before it is
    // handed out. Process ranks stage every collective: the policy's crossovers for them
    // (policy.h). Several nodes: the rail NIC's speed and the rail form, the cost model's inputs
    // (rule 6c).
    coll::CollStats st;
    kernelOf(c)->stats(&st);
    if (st.staged || st.hierCtas > 0) {
      pc.stagedRanks = st.staged;
      // Rings for every collective (a host whose GPUs are not NVLink all-to-all, or
      // MKERNEL_ALGO=ring): the policy's rule 7 picks Ring without direct access.
      if (st.ring) pc.directAccess = false;
      if (st.hierCtas > 0) {
        pc.railMbps = st.railMbps;
        pc.hierRail = st.hierRail;
        const coll::CostParams m = coll::policyModelFor(pc, s.nRanks, c->nNodes);
        MK_INFO(kLogInit | kLogTune,
                "shim: rank %d: %d nodes of %d ranks: the policy's cost model (rule 6c%s) reads "
                "rail NICs of %d Mb/s (%.1f GB/s "
                "each, %d per node), rail exchange %s, per call %.1f us",
                s.rank, c->nNodes, m.gpusPerNode,
                !s.emulate && pc.ncclCrossover
                    ? ""
                    : ", not applied: emulation or MKERNEL_NCCL_CROSSOVER=off",
                pc.railMbps, m.nicGBps, m.nicsPerNode,
                m.rail < 0 ? "best" : coll::railAlgoName(m.rail), m.mkOverheadUs);
      }
      c->policy.reset(new coll::SelectionPolicy(pc));
    }
    return Result::Success;
  }
  if (const std::shared_ptr<coll::Communicator> mk = takeKernel(c)) mk->abort();
  c->mkUnavailable = made != Result::Success
                         ? why
                         : "rank " + std::to_string(failedRank) + " could not create one";
  if (s.emulate)
    return MK_ERROR(made != Result::Success ? made : Result::InvalidUsage,
                    "%s : rank %d: emulation needs mkernel's communicator: %s", s.caller, s.rank,
                    c->mkUnavailable.c_str());
  MK_INFO(kLogInit, "shim: rank %d: mkernel collectives unavailable (%s); every call goes to NCCL",
          s.rank, c->mkUnavailable.c_str());
  return Result::Success;
}

// Nodes, for the selection policy: distinct hosts, or MKERNEL_RANKS_PER_NODE-sized virtual nodes
// in emulation. Identical on every rank by construction.
Result countNodes(ShimComm* c, const CommSetup& s) {
  if (s.emulate) {
    const int64_t rpn = params::RANKS_PER_NODE();
    c->nNodes = rpn > 0 ? static_cast<int>((s.nRanks + rpn - 1) / rpn) : 1;
    return Result::Success;
  }
  std::vector<uint64_t> hosts(static_cast<size_t>(s.nRanks), 0);
  hosts[static_cast<size_t>(s.rank)] = bootstrap::Bootstrap::hostHash();
  MK_CHECK(c->bootstrap->allGather(hosts.data(), sizeof(uint64_t)));
  std::sort(hosts.begin(), hosts.end());
  c->nNodes = static_cast<int>(std::unique(hosts.begin(), hosts.end()) - hosts.begin());
  return Result::Success;
}

}  // namespace

Result setupComm(ShimComm* c, const CommSetup& s) {
  c->idHash = fnv1a(s.id.bytes, sizeof(s.id.bytes));  // the communicator's identity here
  c->rank = s.rank;
  c->nRanks = s.nRanks;
  c->cudaDev = s.cudaDev;
  c->emulate = s.emulate;
  c->blocking = s.config == nullptr || s.config->blocking != 0;
  if (s.config != nullptr) {
    c->config = realConfigFor(s.config);
    c->config.blocking = s.config->blocking;  // the user's choice, inherited by split/shrink
  }
  Result r = bootstrap::Bootstrap::create(s.id, s.rank, s.nRanks, &c->bootstrap);
  // Before anything that depends on them, MKERNEL_DISABLE and MKERNEL_EMULATE included.
  if (r == Result::Success) r = coll::agreeRouteSettings(*c->bootstrap, s.caller);
  if (r == Result::Success) r = countNodes(c, s);
  if (r == Result::Success) r = createKernelComm(c, s);
  if (r != Result::Success) {
    releaseKernelPart(c, /*abortive=*/true);
    c->initResult.store(static_cast<int>(r));
    c->state.store(CommState::InitFailed, std::memory_order_release);
    return r;
  }
  coll::globalStats().commsCreated.fetch_add(1, std::memory_order_relaxed);
  c->initResult.store(ncclSuccess);
  c->state.store(CommState::Ready, std::memory_order_release);
  announceReady(c);
  return Result::Success;
}

namespace {

// The real NCCL's id rides in the mkernel id's bytes past the bootstrap's fields: a tag, then
// kRealIdRoom bytes of NCCL's id. NCCL's own ids use their first 40 bytes (its bootstrap handle:
// a magic, a socket address and, from 2.29 on, a rank count); the rest must be zero to fit.
constexpr size_t kRealIdTagAt = 56;
constexpr size_t kRealIdAt = 64;
constexpr size_t kRealIdRoom = sizeof(ncclUniqueId) - kRealIdAt;
constexpr uint32_t kRealIdTag = 0x4449434eu;  // "NCID"
static_assert(bootstrap::kUniqueIdUsedBytes <= kRealIdTagAt,
              "the real id's tag overlaps the bootstrap's fields");

}  // namespace

bool embedRealId(ncclUniqueId* id, const ncclUniqueId& real) {
  for (size_t i = kRealIdRoom; i < sizeof(real.internal); ++i)
    if (real.internal[i] != 0) return false;
  std::memcpy(id->internal + kRealIdTagAt, &kRealIdTag, sizeof(kRealIdTag));
  std::memcpy(id->internal + kRealIdAt, real.internal, kRealIdRoom);
  return true;
}

bool realIdOf(const ncclUniqueId& id, ncclUniqueId* real) {
  uint32_t tag = 0;
  std::memcpy(&tag, id.internal + kRealIdTagAt, sizeof(tag));
  if (tag != kRealIdTag) return false;
  std::memset(real, 0, sizeof(*real));
  std::memcpy(real->internal, id.internal + kRealIdAt, kRealIdRoom);
  return true;
}

ncclResult_t makeUniqueId(ncclUniqueId* out, const char* caller) {
  bootstrap::UniqueId id;
  Result r = bootstrap::createUniqueId(&id);
  if (r != Result::Success) return toNccl(r);
  static_assert(sizeof(id.bytes) == sizeof(out->internal), "unique id sizes differ");
  ncclUniqueId made;
  std::memcpy(made.internal, id.bytes, sizeof(id.bytes));
  if (!emulationRequested()) {
    // Without a real NCCL the id carries none, and creation says why on every rank.
    const RealNccl& real = realNccl(true);
    if (real.available && real.ncclGetUniqueId != nullptr) {
      ncclUniqueId realId;
      const ncclResult_t rr = fromReal(real.ncclGetUniqueId(&realId));
      if (rr != ncclSuccess) {
        MK_ERROR(static_cast<Result>(rr), "%s : the real ncclGetUniqueId failed: %s", caller,
                 real.ncclGetLastError ? real.ncclGetLastError(nullptr) : "");
        return rr;
      }
      if (!embedRealId(&made, realId))
        return toNccl(MK_ERROR(
            Result::InternalError,
            "%s : the real NCCL's unique id uses more than its first %zu bytes: it does not fit "
            "beside mkernel's (NCCL %s)",
            caller, kRealIdRoom, ncclVersionText(real.version.load()).c_str()));
    }
  }
  *out = made;
  return ncclSuccess;
}

ncclResult_t createBlocking(ShimComm* child, const std::function<Result()>& kernelPart,
                            const MakeReal& makeReal, bool emulate, const char* caller,
                            ncclComm_t* newcomm) {
  *newcomm = nullptr;
  const Result kr = kernelPart();
  if (kr != Result::Success) {
    if (child != nullptr && child->state.load() != CommState::InitFailed) {
      releaseKernelPart(child, /*abortive=*/true);
      child->initResult.store(static_cast<int>(kr));
      child->state.store(CommState::InitFailed);
    }
    return toNccl(kr);
  }
  if (emulate) {
    if (child != nullptr) {
      bindHandle(child, newStandInHandle());
      *newcomm = child->handle();
      announceReady(child);
    }
    return ncclSuccess;
  }
  ncclComm_t real = nullptr;
  const ncclResult_t rr = fromReal(makeReal(&real));
  if (rr != ncclSuccess || (child != nullptr && real == nullptr)) {
    const RealNccl& lib = realNccl(false);
    const Result why = rr != ncclSuccess ? static_cast<Result>(rr) : Result::InternalError;
    MK_ERROR(why, "%s : rank %d: the real NCCL's call %s: %s", caller, child ? child->rank : -1,
             rr != ncclSuccess ? "failed" : "made no communicator",
             lib.ncclGetLastError ? lib.ncclGetLastError(nullptr) : "");
    if (child != nullptr) {
      releaseKernelPart(child, /*abortive=*/true);
      child->initResult.store(static_cast<int>(why));
      child->state.store(CommState::InitFailed);
    }
    *newcomm = real;  // NCCL's own handle, if it left one: outside the side table, NCCL's alone
    return rr != ncclSuccess ? rr : toNccl(why);
  }
  if (child == nullptr) {
    *newcomm = real;  // NCCL_SPLIT_NOCOLOR: NULL from NCCL too
    return ncclSuccess;
  }
  child->real = real;
  bindHandle(child, real);
  *newcomm = real;
  announceReady(child);
  return ncclSuccess;
}

namespace {

// ncclCommInitRank{,Config,Scalable}: validation, then mkernel's part and NCCL's communicator, now
// or (inside a group) NCCL's queued in NCCL's group and mkernel's at ncclGroupEnd.
ncclResult_t initRank(ncclComm_t* newcomm, int nranks, int nId, const ncclUniqueId* commIds,
                      int rank, const ncclConfig_t* config, const char* caller) {
  params::warnUnknownOnce();
  announceShimOnce();
  if (newcomm == nullptr)
    return toNccl(MK_ERROR(Result::InvalidArgument, "%s : comm argument is NULL", caller));
  *newcomm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return toNccl(MK_ERROR(Result::InvalidArgument, "%s : invalid rank requested : %d/%d", caller,
                           rank, nranks));
  Result cr = checkConfig(config, caller);
  if (cr != Result::Success) return toNccl(cr);
  const bool emulate = emulationRequested();
  if (!emulate) {
    cr = checkRealNcclVersion(realNccl(true), caller);
    if (cr != Result::Success) return toNccl(cr);
  }
  int dev = -1;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess)
    return toNccl(MK_ERROR(Result::UnhandledCudaError, "%s : no CUDA device: %s", caller,
                           cudaGetErrorString(err)));

  CommSetup s;
  std::memcpy(s.id.bytes, commIds[0].internal, sizeof(s.id.bytes));
  s.rank = rank;
  s.nRanks = nranks;
  s.cudaDev = dev;
  s.emulate = emulate;
  s.caller = caller;
  const bool ours = bootstrap::isMkernelId(s.id);
  if (!ours) {
    // An id from the real NCCL (made by a process without the shim): nothing to build our
    // bootstrap on, so the comm can only be NCCL's.
    if (s.emulate)
      return toNccl(MK_ERROR(Result::InvalidArgument,
                             "%s : the unique id was not made by mkernel's ncclGetUniqueId",
                             caller));
    const RealNccl& real = realNccl(true);
    if (!real.available)
      return toNccl(MK_ERROR(Result::SystemError, "%s : the unique id is NCCL's, and %s", caller,
                             real.why.c_str()));
    ncclConfig_t cfg = realConfigFor(config);
    ncclResult_t r =
        nId > 1 ? fromReal(real.ncclCommInitRankScalable(newcomm, nranks, rank, nId,
                                                         const_cast<ncclUniqueId*>(commIds), &cfg))
                : fromReal(real.ncclCommInitRankConfig(newcomm, nranks, commIds[0], rank, &cfg));
    if (r != ncclSuccess) return r;
    MK_INFO(kLogInit, "shim: %s got a real NCCL unique id: rank %d uses NCCL directly", caller,
            rank);
    return ncclSuccess;
  }

  // NCCL's ids, from the mkernel ids (makeUniqueId put them there).
  std::vector<ncclUniqueId> realIds(static_cast<size_t>(emulate ? 0 : nId));
  if (!emulate) {
    const RealNccl& real = realNccl(true);
    if (!real.available)
      return toNccl(MK_ERROR(Result::SystemError,
                             "%s : rank %d: %s (or set MKERNEL_EMULATE=1 to run without NCCL)",
                             caller, rank, real.why.c_str()));
    for (int i = 0; i < nId; ++i)
      if (!realIdOf(commIds[i], &realIds[static_cast<size_t>(i)]))
        return toNccl(MK_ERROR(
            Result::InvalidUsage,
            "%s : rank %d: unique id %d carries no real NCCL id (its ncclGetUniqueId ran with "
            "MKERNEL_EMULATE=1 or without a real NCCL to load)",
            caller, rank, i));
  }
  ShimComm* c = newShimComm();
  c->rank = rank;
  c->nRanks = nranks;
  c->cudaDev = dev;
  c->emulate = emulate;
  ncclConfig_t userConfig = config ? realConfigFor(config) : ncclConfig_t(NCCL_CONFIG_INITIALIZER);
  if (config != nullptr) userConfig.blocking = config->blocking;
  const bool hasConfig = config != nullptr;
  MakeReal makeReal = [nranks, rank, realIds, userConfig, hasConfig](ncclComm_t* out) {
    const RealNccl& real = realNccl(false);
    ncclConfig_t cfg = realConfigFor(hasConfig ? &userConfig : nullptr);
    if (realIds.size() > 1)
      return real.ncclCommInitRankScalable(out, nranks, rank, static_cast<int>(realIds.size()),
                                           const_cast<ncclUniqueId*>(realIds.data()), &cfg);
    return real.ncclCommInitRankConfig(out, nranks, realIds[0], rank, &cfg);
  };
  if (groupActive()) {
    if (emulate) {
      bindHandle(c, newStandInHandle());
    } else {
      // NCCL's creation queued in NCCL's group: the handle exists now, NCCL's init runs at
      // ncclGroupEnd, after mkernel's part (deferred below).
      ncclResult_t rr = groupEnsureRealGroup();
      ncclComm_t h = nullptr;
      if (rr == ncclSuccess) rr = fromReal(makeReal(&h));
      if (rr != ncclSuccess) {
        c->initResult.store(static_cast<int>(rr));
        c->state.store(CommState::InitFailed);
        *newcomm = h;  // NCCL's, if it left one
        return rr;
      }
      c->real = h;
      bindHandle(c, h);
      groupNoteCreated(c);
    }
    *newcomm = c->handle();
    groupDefer(dev, [c, s, userConfig, hasConfig]() mutable {
      s.config = hasConfig ? &userConfig : nullptr;
      return setupComm(c, s);
    });
    return ncclSuccess;
  }
  s.config = hasConfig ? &userConfig : nullptr;
  return createBlocking(
      c, [c, &s] { return setupComm(c, s); }, makeReal, emulate, caller, newcomm);
}

}  // namespace
}  // namespace shim
}  // namespace mkernel

using mkernel::Result;
using mkernel::shim::toNccl;

namespace {
// A failed creation inside a group also fails the group's ncclGroupEnd, as in NCCL.
ncclResult_t recordInGroup(ncclResult_t r) {
  mkernel::shim::groupRecordError(r);
  return r;
}
}  // namespace

MKERNEL_NCCL_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  const void* caller = __builtin_return_address(0);
  // Re-entry: NCCL's own ncclCommInitAll asks for an id of its own kind.
  if (mkernel::shim::fromRealNccl(caller) || mkernel::shim::calledFromRealNccl(caller))
    return mkernel::shim::callReal(&mkernel::shim::RealNccl::ncclGetUniqueId, "ncclGetUniqueId",
                                   uniqueId);
  mkernel::shim::announceShimOnce();
  if (uniqueId == nullptr)
    return toNccl(MK_ERROR(Result::InvalidArgument, "ncclGetUniqueId : uniqueId argument is NULL"));
  return mkernel::shim::makeUniqueId(uniqueId, "ncclGetUniqueId");
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                                  int rank) {
  return recordInGroup(
      mkernel::shim::initRank(comm, nranks, 1, &commId, rank, nullptr, "ncclCommInitRank"));
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks,
                                                        ncclUniqueId commId, int rank,
                                                        ncclConfig_t* config) {
  return recordInGroup(
      mkernel::shim::initRank(comm, nranks, 1, &commId, rank, config, "ncclCommInitRankConfig"));
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks,
                                                          int myrank, int nId,
                                                          ncclUniqueId* commIds,
                                                          ncclConfig_t* config) {
  if (nId < 1 || commIds == nullptr || nId > nranks)
    return recordInGroup(toNccl(MK_ERROR(
        Result::InvalidArgument, "ncclCommInitRankScalable : %d unique ids at %p for %d ranks", nId,
        static_cast<void*>(commIds), nranks)));
  // Every rank holds the same ids in the same order: the first one's root serves mkernel's
  // rendezvous; NCCL's gets every id's NCCL id.
  return recordInGroup(mkernel::shim::initRank(newcomm, nranks, nId, commIds, myrank, config,
                                               "ncclCommInitRankScalable"));
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  using namespace mkernel::shim;
  mkernel::params::warnUnknownOnce();
  mkernel::shim::announceShimOnce();
  if (comms == nullptr)
    return toNccl(MK_ERROR(Result::InvalidArgument, "ncclCommInitAll : comms argument is NULL"));
  if (ndev < 1)
    return toNccl(MK_ERROR(Result::InvalidArgument, "ncclCommInitAll : invalid ndev %d", ndev));
  const bool emulate = emulationRequested();
  if (!emulate) {
    Result vr = checkRealNcclVersion(realNccl(true), "ncclCommInitAll");
    if (vr != Result::Success) return toNccl(vr);
  }
  int nDevices = 0;
  cudaError_t err = cudaGetDeviceCount(&nDevices);
  if (err != cudaSuccess)
    return toNccl(MK_ERROR(Result::UnhandledCudaError, "ncclCommInitAll : no CUDA device: %s",
                           cudaGetErrorString(err)));
  std::vector<int> devs(static_cast<size_t>(ndev));
  for (int i = 0; i < ndev; ++i) {
    devs[static_cast<size_t>(i)] = devlist ? devlist[i] : i;
    if (devs[static_cast<size_t>(i)] < 0 || devs[static_cast<size_t>(i)] >= nDevices)
      return toNccl(MK_ERROR(Result::InvalidArgument,
                             "ncclCommInitAll : invalid device %d (this host has %d)",
                             devs[static_cast<size_t>(i)], nDevices));
    for (int j = 0; j < i && !emulate; ++j)
      if (devs[static_cast<size_t>(j)] == devs[static_cast<size_t>(i)])
        return toNccl(MK_ERROR(Result::InvalidUsage,
                               "ncclCommInitAll : duplicate device %d in devlist (ranks may share "
                               "a GPU only with MKERNEL_EMULATE=1)",
                               devs[static_cast<size_t>(i)]));
  }
  ncclUniqueId uid;
  ncclResult_t ur = makeUniqueId(&uid, "ncclCommInitAll");
  if (ur != ncclSuccess) return ur;
  ncclUniqueId realId;
  if (!emulate) {
    const RealNccl& real = realNccl(true);
    if (!real.available)
      return toNccl(MK_ERROR(Result::SystemError,
                             "ncclCommInitAll : %s (or set MKERNEL_EMULATE=1 to run without NCCL)",
                             real.why.c_str()));
    if (!realIdOf(uid, &realId))
      return toNccl(
          MK_ERROR(Result::InternalError, "ncclCommInitAll : no real NCCL id in the unique id"));
  }
  mkernel::bootstrap::UniqueId id;
  std::memcpy(id.bytes, uid.internal, sizeof(id.bytes));
  // One thread per rank: creation is collective, and NCCL's ncclCommInitAll semantics (one
  // process, ndev ranks) are the shim's here, not NCCL's (which would get shim ids). Each rank
  // makes mkernel's part and then its NCCL communicator, as ncclCommInitRank outside a group.
  std::vector<ShimComm*> made(static_cast<size_t>(ndev), nullptr);
  std::vector<ncclComm_t> handles(static_cast<size_t>(ndev), nullptr);
  std::vector<ncclResult_t> results(static_cast<size_t>(ndev), ncclSuccess);
  for (int i = 0; i < ndev; ++i) made[static_cast<size_t>(i)] = newShimComm();
  std::vector<std::thread> threads;
  for (int i = 0; i < ndev; ++i) {
    auto body = [&, i] {
      const size_t k = static_cast<size_t>(i);
      cudaError_t e = cudaSetDevice(devs[k]);
      if (e != cudaSuccess) {
        const Result r =
            MK_ERROR(Result::UnhandledCudaError, "ncclCommInitAll : cudaSetDevice(%d): %s", devs[k],
                     cudaGetErrorString(e));
        made[k]->state.store(CommState::InitFailed);
        made[k]->initResult.store(static_cast<int>(r));
        results[k] = toNccl(r);
        return;
      }
      CommSetup s;
      s.id = id;
      s.rank = i;
      s.nRanks = ndev;
      s.cudaDev = devs[k];
      s.emulate = emulate;
      s.caller = "ncclCommInitAll";
      MakeReal makeReal = [i, ndev, &realId](ncclComm_t* out) {
        ncclConfig_t cfg = realConfigFor(nullptr);
        return realNccl(false).ncclCommInitRankConfig(out, ndev, realId, i, &cfg);
      };
      results[k] = createBlocking(
          made[k], [&] { return setupComm(made[k], s); }, makeReal, emulate, "ncclCommInitAll",
          &handles[k]);
    };
    try {
      threads.emplace_back(body);
    } catch (const std::exception& e) {  // no exception may cross the C API
      results[static_cast<size_t>(i)] = toNccl(
          MK_ERROR(Result::SystemError, "ncclCommInitAll : cannot start a thread: %s", e.what()));
    }
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < ndev; ++i) {
    if (results[static_cast<size_t>(i)] != ncclSuccess) {
      for (int j = 0; j < ndev; ++j) {
        ShimComm* c = made[static_cast<size_t>(j)];
        if (results[static_cast<size_t>(j)] == ncclSuccess) {
          c->state.store(CommState::Aborted);
          releaseShimComm(c, /*abortive=*/true);
        } else if (c->real == nullptr && handles[static_cast<size_t>(j)] != nullptr) {
          (void)realNccl(false).ncclCommAbort(
              handles[static_cast<size_t>(j)]);  // NCCL's, left by its failure
        }
        comms[j] = nullptr;
      }
      return results[static_cast<size_t>(i)];
    }
  }
  for (int i = 0; i < ndev; ++i) comms[i] = handles[static_cast<size_t>(i)];
  return ncclSuccess;
}
