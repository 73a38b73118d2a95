#include "plugin/shim/shim_group.h"

#include <algorithm>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/param.h"
#include "plugin/shim/real_nccl.h"

namespace mkernel {
namespace shim {
namespace {

struct KernelOp {
  ShimComm* comm;
  coll::CollArgs args;
  cudaStream_t stream;
};

struct DeferredTask {
  int cudaDev;
  std::function<Result()> run;
};

struct PendingChild {
  ShimComm* child;
  std::unique_ptr<ncclComm_t> slot;  // NCCL writes the handle here at its group's end
  ncclComm_t* userOut;
};

struct GroupState {
  int depth = 0;
  bool realOpen = false;
  ncclResult_t error = ncclSuccess;
  std::vector<KernelOp> kernelOps;
  std::vector<DeferredTask> deferred;
  std::vector<ShimComm*> created;
  std::vector<PendingChild> children;
};
thread_local GroupState tGroup;

// After NCCL's group closed: an init NCCL failed leaves its comm InitFailed (mkernel's part is
// let go), and split's and shrink's children get the handles NCCL wrote.
void settleCreations(GroupState& g) {
  const RealNccl& real = realNccl(false);
  for (ShimComm* c : g.created) {
    if (c->state.load() == CommState::InitFailed || c->real == nullptr || !real.available) continue;
    ncclResult_t async = ncclSuccess;
    if (real.ncclCommGetAsyncError(c->real, &async) != ncclSuccess) continue;
    if (async == ncclSuccess || async == ncclInProgress) continue;
    MK_ERROR(static_cast<Result>(async),
             "ncclGroupEnd : rank %d: the real NCCL's communicator failed to initialize", c->rank);
    releaseKernelPart(c, /*abortive=*/true);
    c->initResult.store(static_cast<int>(async));
    c->state.store(CommState::InitFailed);
  }
  for (PendingChild& p : g.children) {
    const ncclComm_t h = *p.slot;
    if (p.child == nullptr) {
      *p.userOut = h;
      continue;
    }
    if (h == nullptr) {
      if (p.child->state.load() != CommState::InitFailed) {
        const Result why =
            MK_ERROR(Result::InternalError,
                     "ncclGroupEnd : rank %d: the real NCCL made no communicator", p.child->rank);
        releaseKernelPart(p.child, /*abortive=*/true);
        p.child->initResult.store(static_cast<int>(why));
        p.child->state.store(CommState::InitFailed);
      }
      *p.userOut = nullptr;
      continue;
    }
    p.child->real = h;
    bindHandle(p.child, h);
    *p.userOut = h;
    announceReady(p.child);
  }
}

// Runs the deferred tasks concurrently (they are the ranks of one collective setup, so they must
// all be in flight at once). Returns the first failure.
ncclResult_t runDeferred(std::vector<DeferredTask>& tasks) {
  if (tasks.empty()) return ncclSuccess;
  std::vector<Result> results(tasks.size(), Result::Success);
  std::vector<std::thread> threads;
  threads.reserve(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    auto body = [&tasks, &results, i] {
      cudaError_t err = cudaSetDevice(tasks[i].cudaDev);
      if (err != cudaSuccess) {
        results[i] =
            MK_ERROR(Result::UnhandledCudaError, "ncclGroupEnd : cudaSetDevice(%d) failed: %s",
                     tasks[i].cudaDev, cudaGetErrorString(err));
        return;
      }
      results[i] = tasks[i].run();
    };
    try {
      threads.emplace_back(body);
    } catch (const std::exception& e) {  // no exception may cross the C API
      results[i] =
          MK_ERROR(Result::SystemError, "ncclGroupEnd : cannot start a thread: %s", e.what());
    }
  }
  for (std::thread& t : threads) t.join();
  for (Result r : results)
    if (r != Result::Success) return toNccl(r);
  return ncclSuccess;
}

// Fenced communicators (thread ranks sharing a GPU, collectives/runtime/post_fence.h) in lockstep:
// round k queues the start of each such comm's k-th collective, then completes them all (each waits
// for its co-located peers' starts, then queues its end wait). A thread driving several of those
// ranks thus queues every rank's start before any rank's end wait, whatever the order of its calls.
void postFencedOps(const std::vector<ShimComm*>& comms, const std::vector<KernelOp>& ops,
                   ncclResult_t* first) {
  std::vector<std::vector<const KernelOp*>> perComm(comms.size());
  size_t rounds = 0;
  for (size_t c = 0; c < comms.size(); ++c) {
    for (const KernelOp& op : ops)
      if (op.comm == comms[c]) perComm[c].push_back(&op);
    rounds = std::max(rounds, perComm[c].size());
  }
  auto note = [first](Result r) {
    if (r != Result::Success && *first == ncclSuccess) *first = toNccl(r);
  };
  for (size_t k = 0; k < rounds; ++k) {
    std::vector<bool> started(comms.size(), false);
    std::vector<std::shared_ptr<coll::Communicator>> held(
        comms.size());  // kernelOf, for this round
    for (size_t c = 0; c < comms.size(); ++c) {
      if (k >= perComm[c].size()) continue;
      const KernelOp& op = *perComm[c][k];
      const std::shared_ptr<coll::Communicator> mk = kernelOf(op.comm);
      note(mk ? mk->enqueueStart(op.args, op.stream)
              : MK_ERROR(Result::InvalidUsage,
                         "ncclGroupEnd : rank %d's communicator was %s inside the group",
                         op.comm->rank, commStateName(op.comm->state.load())));
      started[c] = mk != nullptr;
      held[c] = mk;
    }
    for (size_t c = 0; c < comms.size(); ++c)
      if (started[c]) note(held[c]->completeStarts());
  }
}

// Posts the collected mkernel collectives: per comm, in call order, one enqueue per run of
// consecutive ops on one stream; fenced comms in lockstep (postFencedOps).
ncclResult_t postKernelOps(std::vector<KernelOp>& ops) {
  std::vector<ShimComm*> comms;  // in order of first appearance
  std::vector<ShimComm*> fenced;
  for (const KernelOp& op : ops)
    if (std::find(comms.begin(), comms.end(), op.comm) == comms.end()) {
      const std::shared_ptr<coll::Communicator> mk = kernelOf(op.comm);
      if (mk && mk->fenced()) {
        if (std::find(fenced.begin(), fenced.end(), op.comm) == fenced.end())
          fenced.push_back(op.comm);
        continue;
      }
      comms.push_back(op.comm);
    }
  ncclResult_t first = ncclSuccess;
  if (!fenced.empty()) postFencedOps(fenced, ops, &first);
  std::vector<coll::CollArgs> batch;
  for (ShimComm* comm : comms) {
    cudaStream_t stream = nullptr;
    auto flush = [&] {
      if (batch.empty()) return;
      const std::shared_ptr<coll::Communicator> mk = kernelOf(comm);
      Result r = mk ? mk->enqueue(batch.data(), static_cast<int>(batch.size()), stream)
                    : MK_ERROR(Result::InvalidUsage,
                               "ncclGroupEnd : rank %d's communicator was %s inside the group",
                               comm->rank, commStateName(comm->state.load()));
      if (r != Result::Success && first == ncclSuccess) first = toNccl(r);
      batch.clear();
    };
    for (const KernelOp& op : ops) {
      if (op.comm != comm) continue;
      if (!batch.empty() && op.stream != stream) flush();
      stream = op.stream;
      batch.push_back(op.args);
    }
    flush();
  }
  return first;
}

}  // namespace

bool groupActive() {
  return tGroup.depth > 0;
}

// NCCL 2.28 leaks its group job (160 bytes, group.cc) at the end of a group that holds nothing;
// 2.29 frees it. Every 2.28 name that can be grouped is the shim's, so with 2.28 NCCL's group is
// opened by the first call that hands NCCL something (groupEnsureRealGroup).
constexpr int kNcclFreesEmptyGroup = 22900;

void groupStart() {
  if (tGroup.depth++ > 0 || params::EMULATE()) return;
  // NCCL's group, at once: what reaches NCCL in this group through names the shim does not
  // export is grouped there too.
  const RealNccl& real = realNccl(true);
  if (real.available && real.version.load() >= kNcclFreesEmptyGroup &&
      real.ncclGroupStart != nullptr && fromReal(real.ncclGroupStart()) == ncclSuccess)
    tGroup.realOpen = true;
}

void groupAddKernelOp(ShimComm* comm, const coll::CollArgs& args, cudaStream_t stream) {
  tGroup.kernelOps.push_back({comm, args, stream});
}

ncclResult_t groupEnsureRealGroup() {
  if (tGroup.realOpen) return ncclSuccess;
  const RealNccl& real = realNccl(false);
  if (!real.available)
    return toNccl(MK_ERROR(Result::InvalidUsage, "ncclGroupStart : no real NCCL to forward to (%s)",
                           real.why.c_str()));
  ncclResult_t r = fromReal(real.ncclGroupStart());
  if (r == ncclSuccess) tGroup.realOpen = true;
  return r;
}

void groupDefer(int cudaDev, std::function<Result()> task) {
  tGroup.deferred.push_back({cudaDev, std::move(task)});
}

void groupNoteCreated(ShimComm* c) {
  tGroup.created.push_back(c);
}

ncclComm_t* groupPendingChild(ShimComm* child, ncclComm_t* userOut) {
  tGroup.children.push_back({child, std::unique_ptr<ncclComm_t>(new ncclComm_t(nullptr)), userOut});
  return tGroup.children.back().slot.get();
}

void groupRecordError(ncclResult_t r) {
  if (tGroup.depth > 0 && r != ncclSuccess && r != ncclInProgress && tGroup.error == ncclSuccess)
    tGroup.error = r;
}

ncclResult_t groupEnd() {
  if (tGroup.depth == 0)
    return toNccl(MK_ERROR(Result::InvalidUsage,
                           "ncclGroupEnd: not in a group call (no matching ncclGroupStart)"));
  if (--tGroup.depth > 0) return ncclSuccess;
  GroupState g = std::move(tGroup);
  tGroup = GroupState();
  ncclResult_t result = g.error;
  // Comms made inside the group come first: collectives in the same group may not use them.
  ncclResult_t r = runDeferred(g.deferred);
  if (result == ncclSuccess) result = r;
  if (g.error == ncclSuccess) {
    r = postKernelOps(g.kernelOps);
    if (result == ncclSuccess) result = r;
  } else if (!g.kernelOps.empty()) {
    MK_INFO(kLogColl, "shim: ncclGroupEnd drops %zu mkernel collectives of a group that failed",
            g.kernelOps.size());
  }
  if (g.realOpen) {
    r = fromReal(realNccl(false).ncclGroupEnd());
    if (result == ncclSuccess) result = r;
  }
  settleCreations(g);
  return result;
}

ncclResult_t groupSimulateEnd(ncclSimInfo_t* simInfo) {
  // As NCCL: without a simInfo there is nothing to report, and the group simply ends.
  if (simInfo == nullptr) return groupEnd();
  if (simInfo->magic != 0x74685283u)
    return toNccl(MK_ERROR(
        Result::InvalidArgument,
        "ncclGroupSimulateEnd : simInfo is not initialized (use NCCL_SIM_INFO_INITIALIZER)"));
  if (tGroup.depth == 0)
    return toNccl(MK_ERROR(Result::InvalidUsage, "ncclGroupSimulateEnd: not in a group call"));
  if (--tGroup.depth > 0) return ncclSuccess;
  GroupState g = std::move(tGroup);
  tGroup = GroupState();
  // Communicator creation is not simulated (nothing would ever create those comms otherwise).
  ncclResult_t initResult = runDeferred(g.deferred);
  if (initResult != ncclSuccess) {
    if (g.realOpen) (void)realNccl(false).ncclGroupEnd();
    settleCreations(g);
    return initResult;
  }
  const RealNccl& real = realNccl(false);
  if (!real.available)
    return toNccl(MK_ERROR(Result::InvalidUsage,
                           "ncclGroupSimulateEnd needs the real NCCL's performance model (%s)",
                           real.why.c_str()));
  if (!g.realOpen) {
    ncclResult_t r = fromReal(real.ncclGroupStart());
    if (r != ncclSuccess) return r;
  }
  struct Settle {  // whichever way this returns
    GroupState& g;
    ~Settle() { settleCreations(g); }
  } settle{g};
  // The mkernel collectives are estimated as NCCL would run them: issue them to the real comms
  // inside the simulated group (nothing is launched).
  for (const KernelOp& op : g.kernelOps) {
    if (op.comm->real == nullptr) continue;
    const coll::CollArgs& a = op.args;
    const ncclDataType_t dt = static_cast<ncclDataType_t>(a.dtype);
    // PreMulSum has no real op at hand here; Sum costs the same.
    const ncclRedOp_t rop =
        a.op == coll::RedOp::PreMulSum ? ncclSum : static_cast<ncclRedOp_t>(a.op);
    ncclResult_t r = ncclSuccess;
    switch (a.coll) {
      case coll::CollType::AllReduce:
        r = real.ncclAllReduce(a.sendbuff, a.recvbuff, a.count, dt, rop, op.comm->real, op.stream);
        break;
      case coll::CollType::AllGather:
        r = real.ncclAllGather(a.sendbuff, a.recvbuff, a.count, dt, op.comm->real, op.stream);
        break;
      case coll::CollType::ReduceScatter:
        r = real.ncclReduceScatter(a.sendbuff, a.recvbuff, a.count, dt, rop, op.comm->real,
                                   op.stream);
        break;
      case coll::CollType::Broadcast:
        r = real.ncclBroadcast(a.sendbuff, a.recvbuff, a.count, dt, a.root, op.comm->real,
                               op.stream);
        break;
      case coll::CollType::Reduce:
        r = real.ncclReduce(a.sendbuff, a.recvbuff, a.count, dt, rop, a.root, op.comm->real,
                            op.stream);
        break;
    }
    if (r != ncclSuccess) {
      (void)real.ncclGroupSimulateEnd(simInfo);
      return fromReal(r);
    }
  }
  return fromReal(real.ncclGroupSimulateEnd(simInfo));
}

}  // namespace shim
}  // namespace mkernel
