// ncclGetUniqueId and communicator creation (ncclCommInitRank, ...Config, ...Scalable,
// ncclCommInitAll).
#include "plugin/shim/shim_init.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/stats.h"
#include "common/log.h"
#include "common/param.h"
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

// Rank 0 asks the real NCCL for a unique id and broadcasts it over the bootstrap; every rank then
// creates the real comm. The broadcast carries rank 0's success, so a failure there fails all.
Result createRealComm(ShimComm* c, const CommSetup& s) {
  struct RealIdMsg {
    int ok;
    ncclUniqueId id;
  } msg{};
  const RealNccl& real = realNccl(true);
  if (s.rank == 0) {
    msg.ok = real.available && real.ncclGetUniqueId != nullptr &&
             real.ncclGetUniqueId(&msg.id) == ncclSuccess;
  }
  MK_CHECK(c->bootstrap->broadcast(&msg, sizeof(msg), 0));
  if (!real.available)
    return MK_ERROR(Result::SystemError,
                    "%s : rank %d: %s (or set MKERNEL_EMULATE=1 to run without NCCL)", s.caller,
                    s.rank, real.why.c_str());
  if (!msg.ok)
    return MK_ERROR(Result::SystemError,
                    "%s : rank %d: rank 0 could not get a unique id from the real NCCL", s.caller,
                    s.rank);
  ncclConfig_t cfg = realConfigFor(s.config);
  ncclResult_t r = real.ncclCommInitRankConfig(&c->real, s.nRanks, msg.id, s.rank, &cfg);
  if (r != ncclSuccess) {
    c->real = nullptr;
    fromReal(r);
    return MK_ERROR(static_cast<Result>(r),
                    "%s : rank %d: the real ncclCommInitRankConfig failed: %s", s.caller, s.rank,
                    real.ncclGetLastError ? real.ncclGetLastError(nullptr) : "");
  }
  return Result::Success;
}

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
  Result made = coll::Communicator::create(opts, c->bootstrap.get(), &c->mk);
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
    c->mk->stats(&st);
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
                "shim: rank %d: %d nodes of %d ranks: the policy's cost model (rule 6c%s) reads rail NICs of %d Mb/s (%.1f GB/s "
                "each, %d per node), rail exchange %s, per call %.1f us",
                s.rank, c->nNodes, m.gpusPerNode, !s.emulate && pc.ncclCrossover ? "" : ", not applied: emulation or MKERNEL_NCCL_CROSSOVER=off",
                pc.railMbps, m.nicGBps, m.nicsPerNode, m.rail < 0 ? "best" : coll::railAlgoName(m.rail), m.mkOverheadUs);
      }
      c->policy.reset(new coll::SelectionPolicy(pc));
    }
    return Result::Success;
  }
  if (c->mk) {
    c->mk->abort();
    c->mk.reset();
  }
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
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the unique id: the communicator's identity here
  for (char b : s.id.bytes) h = (h ^ static_cast<unsigned char>(b)) * 1099511628211ull;
  c->idHash = h;
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
  if (r == Result::Success) r = countNodes(c, s);
  if (r == Result::Success && !s.emulate) {
    if (s.realGiven) {
      c->real = s.real;
    } else {
      r = createRealComm(c, s);
    }
  }
  if (r == Result::Success) r = createKernelComm(c, s);
  if (r != Result::Success) {
    releaseShimComm(c, /*abortive=*/true);
    c->initResult.store(static_cast<int>(r));
    c->state.store(CommState::InitFailed, std::memory_order_release);
    return r;
  }
  coll::globalStats().commsCreated.fetch_add(1, std::memory_order_relaxed);
  c->initResult.store(ncclSuccess);
  c->state.store(CommState::Ready, std::memory_order_release);
  MK_INFO(kLogInit, "shim: comm %p rank %d/%d on device %d ready (%s%s)", static_cast<void*>(c),
          s.rank, s.nRanks, s.cudaDev, c->mk ? "mkernel" : "NCCL only",
          s.emulate ? ", emulated" : "");
  return Result::Success;
}

namespace {

// ncclCommInitRank{,Config,Scalable}: validation, then setupComm now or at ncclGroupEnd.
ncclResult_t initRank(ncclComm_t* newcomm, int nranks, const ncclUniqueId& commId, int rank,
                      const ncclConfig_t* config, const char* caller) {
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
  int dev = -1;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess)
    return toNccl(MK_ERROR(Result::UnhandledCudaError, "%s : no CUDA device: %s", caller,
                           cudaGetErrorString(err)));

  CommSetup s;
  std::memcpy(s.id.bytes, commId.internal, sizeof(s.id.bytes));
  s.rank = rank;
  s.nRanks = nranks;
  s.cudaDev = dev;
  s.emulate = emulationRequested();
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
    ncclComm_t realComm = nullptr;
    ncclResult_t r = fromReal(real.ncclCommInitRankConfig(&realComm, nranks, commId, rank, &cfg));
    if (r != ncclSuccess) return r;
    MK_INFO(kLogInit, "shim: %s got a real NCCL unique id: rank %d uses NCCL directly", caller,
            rank);
    *newcomm = realComm;
    return ncclSuccess;
  }

  ShimComm* c = newShimComm();
  ncclConfig_t userConfig = config ? realConfigFor(config) : ncclConfig_t(NCCL_CONFIG_INITIALIZER);
  if (config != nullptr) userConfig.blocking = config->blocking;
  const bool hasConfig = config != nullptr;
  *newcomm = c->handle();
  if (groupActive()) {
    groupDefer(dev, [c, s, userConfig, hasConfig]() mutable {
      s.config = hasConfig ? &userConfig : nullptr;
      return setupComm(c, s);
    });
    return ncclSuccess;
  }
  s.config = hasConfig ? &userConfig : nullptr;
  return toNccl(setupComm(c, s));
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
  mkernel::shim::announceShimOnce();
  if (uniqueId == nullptr)
    return toNccl(MK_ERROR(Result::InvalidArgument, "ncclGetUniqueId : uniqueId argument is NULL"));
  // Re-entry: NCCL's own ncclCommInitAll asks for an id of its own kind.
  if (mkernel::shim::calledFromRealNccl(caller))
    return mkernel::shim::callReal(&mkernel::shim::RealNccl::ncclGetUniqueId, "ncclGetUniqueId",
                                   uniqueId);
  mkernel::bootstrap::UniqueId id;
  Result r = mkernel::bootstrap::createUniqueId(&id);
  if (r != Result::Success) return toNccl(r);
  static_assert(sizeof(id.bytes) == sizeof(uniqueId->internal), "unique id sizes differ");
  std::memcpy(uniqueId->internal, id.bytes, sizeof(id.bytes));
  return ncclSuccess;
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                                  int rank) {
  return recordInGroup(
      mkernel::shim::initRank(comm, nranks, commId, rank, nullptr, "ncclCommInitRank"));
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks,
                                                        ncclUniqueId commId, int rank,
                                                        ncclConfig_t* config) {
  return recordInGroup(
      mkernel::shim::initRank(comm, nranks, commId, rank, config, "ncclCommInitRankConfig"));
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks,
                                                          int myrank, int nId,
                                                          ncclUniqueId* commIds,
                                                          ncclConfig_t* config) {
  if (nId < 1 || commIds == nullptr)
    return recordInGroup(
        toNccl(MK_ERROR(Result::InvalidArgument, "ncclCommInitRankScalable : %d unique ids at %p",
                        nId, static_cast<void*>(commIds))));
  // Every rank holds the same ids in the same order; the first one's root serves the rendezvous.
  return recordInGroup(mkernel::shim::initRank(newcomm, nranks, commIds[0], myrank, config,
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
  int nDevices = 0;
  cudaError_t err = cudaGetDeviceCount(&nDevices);
  if (err != cudaSuccess)
    return toNccl(MK_ERROR(Result::UnhandledCudaError, "ncclCommInitAll : no CUDA device: %s",
                           cudaGetErrorString(err)));
  const bool emulate = emulationRequested();
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
  mkernel::bootstrap::UniqueId id;
  Result r = mkernel::bootstrap::createUniqueId(&id);
  if (r != Result::Success) return toNccl(r);
  // One thread per rank: creation is collective, and NCCL's ncclCommInitAll semantics (one
  // process, ndev ranks) are the shim's here, not NCCL's (which would get shim ids).
  std::vector<ShimComm*> made(static_cast<size_t>(ndev), nullptr);
  std::vector<Result> results(static_cast<size_t>(ndev), Result::Success);
  for (int i = 0; i < ndev; ++i) made[static_cast<size_t>(i)] = newShimComm();
  std::vector<std::thread> threads;
  for (int i = 0; i < ndev; ++i) {
    auto body = [&, i] {
      const size_t k = static_cast<size_t>(i);
      cudaError_t e = cudaSetDevice(devs[k]);
      if (e != cudaSuccess) {
        results[k] = MK_ERROR(Result::UnhandledCudaError, "ncclCommInitAll : cudaSetDevice(%d): %s",
                              devs[k], cudaGetErrorString(e));
        made[k]->state.store(CommState::InitFailed);
        made[k]->initResult.store(static_cast<int>(results[k]));
        return;
      }
      CommSetup s;
      s.id = id;
      s.rank = i;
      s.nRanks = ndev;
      s.cudaDev = devs[k];
      s.emulate = emulate;
      s.caller = "ncclCommInitAll";
      results[k] = setupComm(made[k], s);
    };
    try {
      threads.emplace_back(body);
    } catch (const std::exception& e) {  // no exception may cross the C API
      results[static_cast<size_t>(i)] =
          MK_ERROR(Result::SystemError, "ncclCommInitAll : cannot start a thread: %s", e.what());
    }
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < ndev; ++i) {
    if (results[static_cast<size_t>(i)] != Result::Success) {
      for (ShimComm* c : made) {
        releaseShimComm(c, /*abortive=*/true);
        c->state.store(CommState::Aborted);
      }
      for (int j = 0; j < ndev; ++j) comms[j] = nullptr;
      return toNccl(results[static_cast<size_t>(i)]);
    }
  }
  for (int i = 0; i < ndev; ++i) comms[i] = made[static_cast<size_t>(i)]->handle();
  return ncclSuccess;
}
