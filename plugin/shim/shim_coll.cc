// The data-moving entries: collectives (mkernel or forwarded), their per-call-config variants (NCCL
// 2.32), and the calls that are always forwarded (AlltoAll, Gather, Scatter, Send, Recv); groups.
#include <atomic>

#include "collectives/stats.h"
#include "common/log.h"
#include "plugin/shim/nccl_api.h"
#include "plugin/shim/shim_comm.h"
#include "plugin/shim/shim_forward.h"
#include "plugin/shim/shim_group.h"
#include "plugin/shim/shim_select.h"
#include "plugin/shim/shim_validate.h"

namespace mkernel {
namespace shim {

Result checkUsable(ShimComm* c, const char* name) {
  switch (c->state.load(std::memory_order_acquire)) {
    case CommState::Ready:
      return Result::Success;
    case CommState::Initializing:
      return MK_ERROR(Result::InvalidUsage,
                      "%s : the communicator is still being created (call ncclGroupEnd first)",
                      name);
    case CommState::InitFailed:
      return MK_ERROR(static_cast<Result>(c->initResult.load()),
                      "%s : the communicator failed to initialize", name);
    case CommState::Finalized:
      return MK_ERROR(Result::InvalidUsage, "%s : the communicator was finalized", name);
    case CommState::Revoked:
      return MK_ERROR(Result::InvalidUsage, "%s : the communicator was revoked", name);
    case CommState::Destroyed:
    case CommState::Aborted:
      return MK_ERROR(Result::InvalidArgument, "%s : the communicator was %s", name,
                      commStateName(c->state.load()));
  }
  return MK_ERROR(Result::InternalError, "%s : communicator in an unknown state", name);
}

namespace {

// NCCL's *Config function for a call that came with a per-call config, when NCCL has one (2.32
// on); false otherwise (*r unset).
bool forwardWithConfig(const Call& c, ncclComm_t realComm, ncclRedOp_t op, cudaStream_t s,
                       ncclResult_t* r) {
  const RealNccl& real = realNccl(false);
  const ncclDataType_t dt = c.dtype;
  const ncclCollConfig_t* cfg = c.collConfig;
  switch (c.kind) {
    case CallKind::AllReduce:
      if (real.ncclAllReduceConfig == nullptr) return false;
      *r = fromReal(
          real.ncclAllReduceConfig(c.sendbuff, c.recvbuff, c.count, dt, op, realComm, s, cfg));
      return true;
    case CallKind::AllGather:
      if (real.ncclAllGatherConfig == nullptr) return false;
      *r =
          fromReal(real.ncclAllGatherConfig(c.sendbuff, c.recvbuff, c.count, dt, realComm, s, cfg));
      return true;
    case CallKind::ReduceScatter:
      if (real.ncclReduceScatterConfig == nullptr) return false;
      *r = fromReal(
          real.ncclReduceScatterConfig(c.sendbuff, c.recvbuff, c.count, dt, op, realComm, s, cfg));
      return true;
    case CallKind::Broadcast:
      if (real.ncclBroadcastConfig == nullptr) return false;
      *r = fromReal(
          real.ncclBroadcastConfig(c.sendbuff, c.recvbuff, c.count, dt, c.root, realComm, s, cfg));
      return true;
    case CallKind::Reduce:
      if (real.ncclReduceConfig == nullptr) return false;
      *r = fromReal(
          real.ncclReduceConfig(c.sendbuff, c.recvbuff, c.count, dt, op, c.root, realComm, s, cfg));
      return true;
    case CallKind::AlltoAll:
      if (real.ncclAlltoAllConfig == nullptr) return false;
      *r = fromReal(real.ncclAlltoAllConfig(c.sendbuff, c.recvbuff, c.count, dt, realComm, s, cfg));
      return true;
    case CallKind::Gather:
      if (real.ncclGatherConfig == nullptr) return false;
      *r = fromReal(
          real.ncclGatherConfig(c.sendbuff, c.recvbuff, c.count, dt, c.root, realComm, s, cfg));
      return true;
    case CallKind::Scatter:
      if (real.ncclScatterConfig == nullptr) return false;
      *r = fromReal(
          real.ncclScatterConfig(c.sendbuff, c.recvbuff, c.count, dt, c.root, realComm, s, cfg));
      return true;
    case CallKind::Send:
    case CallKind::Recv:
      return false;
  }
  return false;
}

ncclResult_t forwardCall(const Call& c, ncclComm_t realComm, ncclRedOp_t op, cudaStream_t s) {
  const ncclDataType_t dt = c.dtype;
  if (c.collConfig != nullptr) {
    ncclResult_t r = ncclSuccess;
    if (forwardWithConfig(c, realComm, op, s, &r)) return r;
    // An NCCL older than 2.32: the plain call serves a config of defaults; nothing serves more.
    if (!collConfigIsDefault(c.collConfig)) {
      const RealNccl& real = realNccl(false);
      return toNccl(MK_ERROR(
          Result::InvalidUsage,
          "%s : its per-call config asks for more than the defaults, and the real NCCL (%s at "
          "%s) has no nccl*Config entry points (NCCL 2.32 and newer)",
          c.name, ncclVersionText(real.version.load()).c_str(), real.path.c_str()));
    }
  }
  switch (c.kind) {
    case CallKind::AllReduce:
      return callReal(&RealNccl::ncclAllReduce, "AllReduce", c.sendbuff, c.recvbuff, c.count, dt,
                      op, realComm, s);
    case CallKind::AllGather:
      return callReal(&RealNccl::ncclAllGather, "AllGather", c.sendbuff, c.recvbuff, c.count, dt,
                      realComm, s);
    case CallKind::ReduceScatter:
      return callReal(&RealNccl::ncclReduceScatter, "ReduceScatter", c.sendbuff, c.recvbuff,
                      c.count, dt, op, realComm, s);
    case CallKind::Broadcast:
      return callReal(&RealNccl::ncclBroadcast, "Broadcast", c.sendbuff, c.recvbuff, c.count, dt,
                      c.root, realComm, s);
    case CallKind::Reduce:
      return callReal(&RealNccl::ncclReduce, "Reduce", c.sendbuff, c.recvbuff, c.count, dt, op,
                      c.root, realComm, s);
    case CallKind::AlltoAll:
      return callReal(&RealNccl::ncclAlltoAll, "AlltoAll", c.sendbuff, c.recvbuff, c.count, dt,
                      realComm, s);
    case CallKind::Gather:
      return callReal(&RealNccl::ncclGather, "Gather", c.sendbuff, c.recvbuff, c.count, dt, c.root,
                      realComm, s);
    case CallKind::Scatter:
      return callReal(&RealNccl::ncclScatter, "Scatter", c.sendbuff, c.recvbuff, c.count, dt,
                      c.root, realComm, s);
    case CallKind::Send:
      return callReal(&RealNccl::ncclSend, "Send", c.sendbuff, c.count, dt, c.root, realComm, s);
    case CallKind::Recv:
      return callReal(&RealNccl::ncclRecv, "Recv", c.recvbuff, c.count, dt, c.root, realComm, s);
  }
  return toNccl(MK_ERROR(Result::InternalError, "%s : unknown call kind", c.name));
}

// A collective on the persistent kernel's doorbell captured into a CUDA graph keeps that kernel
// resident (MKERNEL_GRAPH=mkernel, emulation, several nodes): said once per process. The capture
// state is read for this warning only, never for the route.
void warnIfCapturedOnDoorbell(const ShimComm& comm, const Call& call, cudaStream_t stream) {
  static std::atomic<bool> warned{false};
  if (warned.load(std::memory_order_relaxed)) return;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusActive)
    return;
  if (warned.exchange(true)) return;
  MK_WARN(
      "shim: %s captured into a CUDA graph runs in mkernel's persistent kernel, which then stays "
      "resident until "
      "the communicator is destroyed; device allocations made meanwhile may block "
      "(docs/KERNEL.md)%s",
      call.name,
      comm.emulate ? " (emulation has no real NCCL to give it to)"
      : comm.graphPath == GraphPath::Mkernel
          ? " (MKERNEL_GRAPH=mkernel)"
          : " (several nodes: MKERNEL_GRAPH=nccl gives it to NCCL)");
}

ncclResult_t runCall(ShimComm* comm, const Call& call, cudaStream_t stream) {
  Result st = checkUsable(comm, call.name);
  // Held for the whole call: an abort on another thread takes the communicator out of the comm,
  // but destroys it only once this call has let go.
  const std::shared_ptr<coll::Communicator> mk = kernelOf(comm);
  if (st == Result::Success && mk) {
    // A communicator the kernel stopped (dead peer, timeout) reports it, as NCCL's enqueue does
    // (its comm->asyncResult): what the kernels recorded in host memory, no CUDA call. A query
    // of the kernel's stream costs every collective host time, and while `stream` is being
    // captured it is refused and invalidates the capture (seen on the H200).
    // ncclCommGetAsyncError still asks the driver too.
    Result async = mk->asyncError(/*queryDevice=*/false);
    if (async != Result::Success && async != Result::InProgress)
      st = MK_ERROR(async, "%s : rank %d's communicator has an asynchronous error", call.name,
                    comm->rank);
  }
  ResolvedOp op;
  if (st == Result::Success) {
    const CommView view{comm->rank, comm->nRanks, comm->cudaDev, comm->checkPointers};
    std::lock_guard<std::mutex> lock(comm->opsMutex);
    st = validateCall(call, view, comm->ops, &op);
  }
  coll::CollArgs args;
  coll::CollType collType = coll::CollType::AllReduce;
  const bool isColl = collTypeOf(call.kind, &collType);
  if (isColl) {
    args.coll = collType;
    args.dtype = static_cast<coll::DataType>(call.dtype);
    args.sendbuff = call.sendbuff;
    args.recvbuff = call.recvbuff;
    args.count = call.count;
    args.root = call.root;
    if (isReduction(call.kind)) {
      args.op = op.custom ? coll::RedOp::PreMulSum : static_cast<coll::RedOp>(call.op);
      if (op.custom) {
        args.scalar = op.customOp.scalar;
        args.scalarDevPtr = op.customOp.hostScalar ? nullptr : op.customOp.scalarDev;
      }
    }
  }
  Route route = Route::Forward;
  bool doorbell = false;
  if (st == Result::Success)
    st = chooseRoute(*comm, mk.get(), call, isColl ? &args : nullptr, &route, &doorbell);
  if (st != Result::Success) {
    ncclResult_t r = toNccl(st);
    groupRecordError(r);
    return r;
  }

  if (route == Route::Kernel) {
    if (doorbell) warnIfCapturedOnDoorbell(*comm, call, stream);
    if (groupActive()) {
      groupAddKernelOp(comm, args, stream);
      return ncclSuccess;
    }
    ncclResult_t r = toNccl(mk->enqueue(&args, 1, stream));
    return r;
  }

  // A custom op's number is NCCL's own (ncclRedOpCreatePreMulSum), so it goes as it came.
  if (op.custom && !op.customOp.hasRealOp) {
    ncclResult_t r = toNccl(MK_ERROR(Result::InvalidUsage,
                                     "%s : reduction operation %d has no real NCCL counterpart",
                                     call.name, static_cast<int>(call.op)));
    groupRecordError(r);
    return r;
  }
  if (groupActive()) {
    ncclResult_t r = groupEnsureRealGroup();
    if (r != ncclSuccess) {
      groupRecordError(r);
      return r;
    }
  }
  ncclResult_t r = forwardCall(call, comm->real, call.op, stream);
  if (r == ncclSuccess && isColl) {
    coll::countForwardedOp(collType);
    comm->forwarded[static_cast<int>(collType)].fetch_add(1, std::memory_order_relaxed);
  }
  groupRecordError(r);
  return r;
}

// An error of a call inside a group also fails the group's ncclGroupEnd, as in NCCL (whose
// enqueue check records every failure, a NULL comm included, as the group's error).
ncclResult_t inGroup(ncclResult_t r) {
  groupRecordError(r);
  return r;
}

// A data call on a handle that is not ours (a real NCCL comm: an id that was not mkernel's, or
// libnccl re-entering). Inside a shim group it joins the real group, or grouped Send/Recv pairs
// would be issued one by one and deadlock.
template <typename Fn, typename... Args>
ncclResult_t forwardForeignData(const void* comm, Fn RealNccl::*fn, const char* name,
                                Args... args) {
  if (comm != nullptr && groupActive() && realNccl(false).available) {
    ncclResult_t r = groupEnsureRealGroup();
    if (r != ncclSuccess) return inGroup(r);
  }
  return inGroup(forwardForeign(comm, fn, name, args...));
}

Call makeCall(CallKind kind, const char* name, const void* sendbuff, void* recvbuff, size_t count,
              ncclDataType_t dtype, ncclRedOp_t op, int root,
              const ncclCollConfig_t* config = nullptr) {
  Call c;
  c.collConfig = config;
  c.kind = kind;
  c.name = name;
  c.sendbuff = sendbuff;
  c.recvbuff = recvbuff;
  c.count = count;
  c.dtype = dtype;
  c.op = op;
  c.root = root;
  return c;
}

}  // namespace
}  // namespace shim
}  // namespace mkernel

using mkernel::shim::Call;
using mkernel::shim::CallKind;
using mkernel::shim::callReal;
using mkernel::shim::findShimComm;
using mkernel::shim::forwardForeignData;
using mkernel::shim::makeCall;
using mkernel::shim::RealNccl;
using mkernel::shim::runCall;
using mkernel::shim::ShimComm;

// Each entry: a call NCCL makes through its own PLT goes straight back to NCCL; a handle not in
// the side table is NCCL's (or NULL); a shim comm's call is checked and routed (runCall).

MKERNEL_NCCL_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                               ncclDataType_t datatype, ncclRedOp_t op,
                                               ncclComm_t comm, cudaStream_t stream) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclAllReduce, "AllReduce", sendbuff, recvbuff, count, datatype, op,
                    comm, stream);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclAllReduce, "AllReduce", sendbuff, recvbuff,
                              count, datatype, op, comm, stream);
  return runCall(
      c, makeCall(CallKind::AllReduce, "AllReduce", sendbuff, recvbuff, count, datatype, op, 0),
      stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclAllReduceConfig(const void* sendbuff, void* recvbuff,
                                                     size_t count, ncclDataType_t datatype,
                                                     ncclRedOp_t op, ncclComm_t comm,
                                                     cudaStream_t stream,
                                                     const ncclCollConfig_t* config) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclAllReduceConfig, "ncclAllReduceConfig", sendbuff, recvbuff,
                    count, datatype, op, comm, stream, config);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclAllReduceConfig, "AllReduce", sendbuff, recvbuff,
                              count, datatype, op, comm, stream, config);
  return runCall(c,
                 makeCall(CallKind::AllReduce, "AllReduce", sendbuff, recvbuff, count, datatype, op,
                          0, config),
                 stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff,
                                               size_t sendcount, ncclDataType_t datatype,
                                               ncclComm_t comm, cudaStream_t stream) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclAllGather, "AllGather", sendbuff, recvbuff, sendcount, datatype,
                    comm, stream);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclAllGather, "AllGather", sendbuff, recvbuff,
                              sendcount, datatype, comm, stream);
  return runCall(c,
                 makeCall(CallKind::AllGather, "AllGather", sendbuff, recvbuff, sendcount, datatype,
                          ncclSum, 0),
                 stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclAllGatherConfig(const void* sendbuff, void* recvbuff,
                                                     size_t sendcount, ncclDataType_t datatype,
                                                     ncclComm_t comm, cudaStream_t stream,
                                                     const ncclCollConfig_t* config) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclAllGatherConfig, "ncclAllGatherConfig", sendbuff, recvbuff,
                    sendcount, datatype, comm, stream, config);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclAllGatherConfig, "AllGather", sendbuff, recvbuff,
                              sendcount, datatype, comm, stream, config);
  return runCall(c,
                 makeCall(CallKind::AllGather, "AllGather", sendbuff, recvbuff, sendcount, datatype,
                          ncclSum, 0, config),
                 stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff,
                                                   size_t recvcount, ncclDataType_t datatype,
                                                   ncclRedOp_t op, ncclComm_t comm,
                                                   cudaStream_t stream) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclReduceScatter, "ReduceScatter", sendbuff, recvbuff, recvcount,
                    datatype, op, comm, stream);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclReduceScatter, "ReduceScatter", sendbuff,
                              recvbuff, recvcount, datatype, op, comm, stream);
  return runCall(c,
                 makeCall(CallKind::ReduceScatter, "ReduceScatter", sendbuff, recvbuff, recvcount,
                          datatype, op, 0),
                 stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclReduceScatterConfig(const void* sendbuff, void* recvbuff,
                                                         size_t recvcount, ncclDataType_t datatype,
                                                         ncclRedOp_t op, ncclComm_t comm,
                                                         cudaStream_t stream,
                                                         const ncclCollConfig_t* config) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclReduceScatterConfig, "ncclReduceScatterConfig", sendbuff,
                    recvbuff, recvcount, datatype, op, comm, stream, config);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclReduceScatterConfig, "ReduceScatter", sendbuff,
                              recvbuff, recvcount, datatype, op, comm, stream, config);
  return runCall(c,
                 makeCall(CallKind::ReduceScatter, "ReduceScatter", sendbuff, recvbuff, recvcount,
                          datatype, op, 0, config),
                 stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                               ncclDataType_t datatype, int root, ncclComm_t comm,
                                               cudaStream_t stream) {
  // Re-entry: NCCL's own ncclBcast calls ncclBroadcast through its PLT.
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclBroadcast, "Broadcast", sendbuff, recvbuff, count, datatype,
                    root, comm, stream);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclBroadcast, "Broadcast", sendbuff, recvbuff,
                              count, datatype, root, comm, stream);
  return runCall(c,
                 makeCall(CallKind::Broadcast, "Broadcast", sendbuff, recvbuff, count, datatype,
                          ncclSum, root),
                 stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclBroadcastConfig(const void* sendbuff, void* recvbuff,
                                                     size_t count, ncclDataType_t datatype,
                                                     int root, ncclComm_t comm, cudaStream_t stream,
                                                     const ncclCollConfig_t* config) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclBroadcastConfig, "ncclBroadcastConfig", sendbuff, recvbuff,
                    count, datatype, root, comm, stream, config);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclBroadcastConfig, "Broadcast", sendbuff, recvbuff,
                              count, datatype, root, comm, stream, config);
  return runCall(c,
                 makeCall(CallKind::Broadcast, "Broadcast", sendbuff, recvbuff, count, datatype,
                          ncclSum, root, config),
                 stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype,
                                           int root, ncclComm_t comm, cudaStream_t stream) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclBcast, "Bcast", buff, count, datatype, root, comm, stream);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclBcast, "Bcast", buff, count, datatype, root,
                              comm, stream);
  // An in-place broadcast, as NCCL defines it.
  return runCall(c,
                 makeCall(CallKind::Broadcast, "Bcast", buff, buff, count, datatype, ncclSum, root),
                 stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                            ncclDataType_t datatype, ncclRedOp_t op, int root,
                                            ncclComm_t comm, cudaStream_t stream) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclReduce, "Reduce", sendbuff, recvbuff, count, datatype, op, root,
                    comm, stream);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclReduce, "Reduce", sendbuff, recvbuff, count,
                              datatype, op, root, comm, stream);
  return runCall(
      c, makeCall(CallKind::Reduce, "Reduce", sendbuff, recvbuff, count, datatype, op, root),
      stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclReduceConfig(const void* sendbuff, void* recvbuff,
                                                  size_t count, ncclDataType_t datatype,
                                                  ncclRedOp_t op, int root, ncclComm_t comm,
                                                  cudaStream_t stream,
                                                  const ncclCollConfig_t* config) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclReduceConfig, "ncclReduceConfig", sendbuff, recvbuff, count,
                    datatype, op, root, comm, stream, config);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclReduceConfig, "Reduce", sendbuff, recvbuff,
                              count, datatype, op, root, comm, stream, config);
  return runCall(
      c,
      makeCall(CallKind::Reduce, "Reduce", sendbuff, recvbuff, count, datatype, op, root, config),
      stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                              ncclDataType_t datatype, ncclComm_t comm,
                                              cudaStream_t stream) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclAlltoAll, "AlltoAll", sendbuff, recvbuff, count, datatype, comm,
                    stream);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclAlltoAll, "AlltoAll", sendbuff, recvbuff, count,
                              datatype, comm, stream);
  return runCall(
      c, makeCall(CallKind::AlltoAll, "AlltoAll", sendbuff, recvbuff, count, datatype, ncclSum, 0),
      stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclAlltoAllConfig(const void* sendbuff, void* recvbuff,
                                                    size_t count, ncclDataType_t datatype,
                                                    ncclComm_t comm, cudaStream_t stream,
                                                    const ncclCollConfig_t* config) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclAlltoAllConfig, "ncclAlltoAllConfig", sendbuff, recvbuff, count,
                    datatype, comm, stream, config);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclAlltoAllConfig, "AlltoAll", sendbuff, recvbuff,
                              count, datatype, comm, stream, config);
  return runCall(c,
                 makeCall(CallKind::AlltoAll, "AlltoAll", sendbuff, recvbuff, count, datatype,
                          ncclSum, 0, config),
                 stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                            ncclDataType_t datatype, int root, ncclComm_t comm,
                                            cudaStream_t stream) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclGather, "Gather", sendbuff, recvbuff, count, datatype, root,
                    comm, stream);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclGather, "Gather", sendbuff, recvbuff, count,
                              datatype, root, comm, stream);
  return runCall(
      c, makeCall(CallKind::Gather, "Gather", sendbuff, recvbuff, count, datatype, ncclSum, root),
      stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclGatherConfig(const void* sendbuff, void* recvbuff,
                                                  size_t count, ncclDataType_t datatype, int root,
                                                  ncclComm_t comm, cudaStream_t stream,
                                                  const ncclCollConfig_t* config) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclGatherConfig, "ncclGatherConfig", sendbuff, recvbuff, count,
                    datatype, root, comm, stream, config);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclGatherConfig, "Gather", sendbuff, recvbuff,
                              count, datatype, root, comm, stream, config);
  return runCall(c,
                 makeCall(CallKind::Gather, "Gather", sendbuff, recvbuff, count, datatype, ncclSum,
                          root, config),
                 stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                             ncclDataType_t datatype, int root, ncclComm_t comm,
                                             cudaStream_t stream) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclScatter, "Scatter", sendbuff, recvbuff, count, datatype, root,
                    comm, stream);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclScatter, "Scatter", sendbuff, recvbuff, count,
                              datatype, root, comm, stream);
  return runCall(
      c, makeCall(CallKind::Scatter, "Scatter", sendbuff, recvbuff, count, datatype, ncclSum, root),
      stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclScatterConfig(const void* sendbuff, void* recvbuff,
                                                   size_t count, ncclDataType_t datatype, int root,
                                                   ncclComm_t comm, cudaStream_t stream,
                                                   const ncclCollConfig_t* config) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclScatterConfig, "ncclScatterConfig", sendbuff, recvbuff, count,
                    datatype, root, comm, stream, config);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclScatterConfig, "Scatter", sendbuff, recvbuff,
                              count, datatype, root, comm, stream, config);
  return runCall(c,
                 makeCall(CallKind::Scatter, "Scatter", sendbuff, recvbuff, count, datatype,
                          ncclSum, root, config),
                 stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count,
                                          ncclDataType_t datatype, int peer, ncclComm_t comm,
                                          cudaStream_t stream) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclSend, "Send", sendbuff, count, datatype, peer, comm, stream);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclSend, "Send", sendbuff, count, datatype, peer,
                              comm, stream);
  return runCall(
      c, makeCall(CallKind::Send, "Send", sendbuff, nullptr, count, datatype, ncclSum, peer),
      stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype,
                                          int peer, ncclComm_t comm, cudaStream_t stream) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclRecv, "Recv", recvbuff, count, datatype, peer, comm, stream);
  ShimComm* c = findShimComm(comm);
  if (c == nullptr)
    return forwardForeignData(comm, &RealNccl::ncclRecv, "Recv", recvbuff, count, datatype, peer,
                              comm, stream);
  return runCall(
      c, makeCall(CallKind::Recv, "Recv", nullptr, recvbuff, count, datatype, ncclSum, peer),
      stream);
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclGroupStart() {
  if (MKERNEL_FROM_NCCL()) return callReal(&RealNccl::ncclGroupStart, "ncclGroupStart");
  mkernel::shim::groupStart();
  return ncclSuccess;
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclGroupEnd() {
  if (MKERNEL_FROM_NCCL()) return callReal(&RealNccl::ncclGroupEnd, "ncclGroupEnd");
  return mkernel::shim::groupEnd();
}

MKERNEL_NCCL_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  if (MKERNEL_FROM_NCCL())
    return callReal(&RealNccl::ncclGroupSimulateEnd, "ncclGroupSimulateEnd", simInfo);
  return mkernel::shim::groupSimulateEnd(simInfo);
}
