// Launches of a KernelCommunicator: LL batches, single launch-path collectives, doorbell slots.
#include "collectives/runtime/kernel_communicator.h"

#ifdef MKERNEL_HAVE_DEVICE_CODE

namespace mkernel {
namespace coll {

// Whether an op joins an LL batch: LL mode, MKERNEL_LL_BATCH on (serial: ops of one CTA only).
// The same answer on every rank (pathOf and llCtas depend only on arguments every rank shares).
bool KernelCommunicator::batchable(const WorkDesc& d, Path path) const {
  return llBatch_ != LlBatchMode::Off && path == Path::kLaunchLl &&
         (llBatch_ == LlBatchMode::Exchange ||
          llCtas(llPayloadBytes(d.count, dataTypeSize(static_cast<DataType>(d.dtype))),
                 launchCap_) == 1);
}

// The same for an eager op's arguments (the fenced enqueue's runs), with its lines; a no-op is not
// batchable.
bool KernelCommunicator::batchableArgs(const CollArgs& a, uint64_t* lines) const {
  if (llBatch_ == LlBatchMode::Off || a.count == 0) return false;
  WorkDesc d;
  if (fillDesc(a, &d) != Result::Success) return false;
  *lines = opLines(d);
  return batchable(d, pathOf(d));
}

// LL lines an op takes in each slot.
uint64_t KernelCommunicator::opLines(const WorkDesc& d) {
  return llLines(llPayloadBytes(d.count, dataTypeSize(static_cast<DataType>(d.dtype))));
}

// The bytes an op reads on this rank ([send, send + *sendBytes)) and writes ([recv, ...)).
static void opRanges(const WorkDesc& d, int nRanks, uint64_t* sendBytes, uint64_t* recvBytes) {
  const uint64_t block = d.count * dataTypeSize(static_cast<DataType>(d.dtype));
  const CollType c = static_cast<CollType>(d.coll);
  *sendBytes = c == CollType::ReduceScatter ? block * static_cast<uint64_t>(nRanks) : block;
  *recvBytes = c == CollType::AllGather ? block * static_cast<uint64_t>(nRanks) : block;
}

// n > 1 batchable ops of one group as one launch and one LL exchange (launchLlBatch): one
// launch-path number for all of them, their lines one after another in each slot.
Result KernelCommunicator::launchBatch(const WorkDesc* descs, int n, bool capturing,
                                       cudaStream_t stream) {
  MK_CHECK(launchOrder(capturing, stream));
  LlBatch b{};
  b.nOps = n;
  b.exchange = llBatch_ == LlBatchMode::Exchange ? 1 : 0;
  uint64_t line = 0;
  LlBatchMem mem[kMaxOpsPerSlot] = {};
  for (int i = 0; i < n; ++i) {
    b.ops[i] = descs[i];
    b.lineBase[i] = static_cast<uint32_t>(line);
    mem[i].lines = opLines(descs[i]);
    line += mem[i].lines;
  }
  // exchange: the ops in waves by what each reads and writes on this rank (launch_path.h), over
  // as many CTAs as the batch's payload takes (llCtas, as one op of it all would; the waves meet
  // at barriers over the grid). serial: one CTA, the ops one after another, no plan.
  int ctas = 1;
  LlWaves waves{};
  if (b.exchange) {
    for (int i = 0; i < n; ++i) {
      mem[i].send = descs[i].sendbuff;
      mem[i].recv = descs[i].recvbuff;
      opRanges(descs[i], opts_.nRanks, &mem[i].sendBytes, &mem[i].recvBytes);
      // A twin (llPlanWaves): the same descriptor as an earlier op (fillDesc zeroes it whole), out
      // of place.
      mem[i].twin = -1;
      if (!llOverlap(mem[i].send, mem[i].sendBytes, mem[i].recv, mem[i].recvBytes))
        for (int j = 0; j < i && mem[i].twin < 0; ++j)
          if (std::memcmp(&descs[i], &descs[j], sizeof(WorkDesc)) == 0) mem[i].twin = j;
    }
    ctas = llCtas(line * kLlLinePayload, launchCap_);
    waves = llPlanWaves(mem, n, ctas * (kLaunchThreads / 32));
    b.waveMask = waves.startMask;
    static_assert(sizeof(b.warpFirst) == sizeof(waves.warpFirst) &&
                      sizeof(b.warpCount) == sizeof(waves.warpCount),
                  "LlBatch and LlWaves share the warp arrays' layout");
    std::memcpy(b.warpFirst, waves.warpFirst, sizeof(b.warpFirst));
    std::memcpy(b.warpCount, waves.warpCount, sizeof(b.warpCount));
  }
  llOps_ += static_cast<uint64_t>(n);
  llBatchOps_ += static_cast<uint64_t>(n);
  if (capturing) {
    b.epoch = 0;  // the device numbers them from graphSeq at every replay
    MK_CHECK(launchLlBatch(params_, b, ctas, stream));
    startsQueued_ += static_cast<uint64_t>(n);
    return Result::Success;
  }
  // exchange: one launch-path number for the batch; serial: one per op.
  b.epoch = launchSeq_ + 1;
  launchSeq_ += b.exchange ? 1 : static_cast<uint64_t>(n);
  for (int i = 0; i < n; ++i) b.opIndex[i] = ++launchIssued_[descs[i].coll];
  cudaStream_t runOn = stream;
  if (watch_ == Watch::All || (watch_ == Watch::First && b.epoch == 1)) {
    // The watch follows the batch's last op (its kernel stamps the batch's number when it starts).
    MK_CUDA_CHECK(cudaEventRecord(watchPre_, runOn), "rank %d: cudaEventRecord(launch watch)",
                  opts_.rank);
    watchEpoch_ = launchSeq_;
    watchColl_ = descs[n - 1].coll;
    watchIndex_ = b.opIndex[n - 1];
  }
  MK_CHECK(launchLlBatch(params_, b, ctas, runOn));
  startsQueued_ += static_cast<uint64_t>(n);
  MK_CHECK(launchQueued(runOn, stream, static_cast<CollType>(descs[n - 1].coll)));
  MK_TRACE(kLogColl,
           "rank %d: %d collectives launched as one LL batch (%s, epoch %llu, %llu lines, %d "
           "CTA(s), %d wave(s))",
           opts_.rank, n, b.exchange ? "one exchange" : "serial",
           static_cast<unsigned long long>(b.epoch), static_cast<unsigned long long>(line), ctas,
           waves.waves);
  return Result::Success;
}

Result KernelCommunicator::launchOp(const WorkDesc& desc, Path path, bool capturing,
                                    cudaStream_t stream) {
  const bool direct = path == Path::kLaunchDirect;
  const int mode = direct                    ? kLaunchModeDirect
                   : path == Path::kLaunchLl ? kLaunchModeLl
                                             : kLaunchModeInbox;
  MK_CHECK(launchOrder(capturing, stream));
  WorkDesc d = desc;
  const CollType c = static_cast<CollType>(d.coll);
  const uint64_t bytes =
      launchPublishElems(c, d.count, opts_.nRanks) * dataTypeSize(static_cast<DataType>(d.dtype));
  int ctas = launchCtas(bytes, launchCap_);
  if (mode == kLaunchModeLl) {
    ctas =
        llCtas(llPayloadBytes(d.count, dataTypeSize(static_cast<DataType>(d.dtype))), launchCap_);
    ++llOps_;
  }
  if (direct) {
    // The persistent kernel's split (fillDesc), capped by the CTAs all ranks on a GPU can hold at
    // once. AllReduce: TwoShot, whose in-place use is safe (each part is read and written by its
    // owner only).
    ctas =
        splitCtas(shareBytes(c, d.count, static_cast<DataType>(d.dtype), opts_.nRanks), directCap_);
    d.nCtas = ctas;
    if (c == CollType::AllReduce) d.algo = static_cast<int32_t>(Algo::TwoShot);
  }
  if (capturing) {
    // Epoch 0: the kernel takes graphSeq + 1 on the device, at every replay.
    MK_CHECK(launchCollective(params_, d, ctas, 0, 0, mode, stream));
    ++startsQueued_;
    return Result::Success;
  }
  ++launchSeq_;
  const uint64_t index = ++launchIssued_[d.coll];
  cudaStream_t runOn = stream;
  if (watch_ == Watch::All || (watch_ == Watch::First && launchSeq_ == 1)) {
    MK_CUDA_CHECK(cudaEventRecord(watchPre_, runOn), "rank %d: cudaEventRecord(launch watch)",
                  opts_.rank);
    watchEpoch_ = launchSeq_;
    watchColl_ = d.coll;
    watchIndex_ = index;
  }
  MK_CHECK(launchCollective(params_, d, ctas, launchSeq_, index, mode, runOn));
  ++startsQueued_;
  MK_CHECK(launchQueued(runOn, stream, c));
  MK_TRACE(kLogColl, "rank %d: %s launched on the launch path (%s, epoch %llu, %d CTAs)",
           opts_.rank, collName(c),
           direct                  ? "direct"
           : mode == kLaunchModeLl ? "LL"
                                   : "inbox",
           static_cast<unsigned long long>(launchSeq_), ctas);
  return Result::Success;
}

Result KernelCommunicator::postSlot(const WorkDesc* descs, int nOps, bool capturing,
                                    cudaStream_t stream) {
  // Event queries and the persistent kernel's launch on the internal stream: calls that a
  // global-mode capture would otherwise refuse. (The launch path makes none: a kernel launch and
  // an event wait on the caller's stream are capture-safe.)
  if (!opts_.persistentKernel)
    return MK_ERROR(Result::InternalError,
                    "rank %d: a collective needs the persistent kernel, and this communicator was "
                    "made without one "
                    "(CommOptions::persistentKernel: its caller routes such collectives elsewhere)",
                    opts_.rank);
  RelaxedCaptureScope relaxed;
  int ctasNeeded = 0;
  for (int k = 0; k < nOps; ++k) ctasNeeded = std::max(ctasNeeded, descs[k].nCtas);
  int slot = -1;
  if (capturing) {
    if (kEagerSlots + graphSlots_ >= kMaxSlots)
      return MK_ERROR(Result::InvalidUsage,
                      "rank %d: more than %d captured collective groups on one communicator",
                      opts_.rank, kMaxSlots - kEagerSlots);
    slot = kEagerSlots + graphSlots_++;
  } else {
    MK_CHECK(takeEagerSlot(&slot));
  }
  WorkSlot& ws = slots_[slot];
  std::memcpy(ws.ops, descs, sizeof(WorkDesc) * static_cast<size_t>(nOps));
  ws.nOps = static_cast<uint32_t>(nOps);
  ws.ctasNeeded = static_cast<uint32_t>(ctasNeeded);
  ws.eager = capturing ? 0u : 1u;
  std::atomic_thread_fence(std::memory_order_release);
  if (capturing) {
    ctl_->resident = 1;  // a replay never passes through here: the kernel must stay
  } else {
    ctl_->eagerEnqueued = ctl_->eagerEnqueued + 1;  // only this thread writes it (mu_)
  }
  MK_CHECK(ensureKernel());
  uint32_t* doorbell = &state_->doorbell[slot];
  // Two memops: Posted overwrites the previous use's Done, and only Done (3) passes the wait
  // (Free 0, Posted 1 and Running 2 are below it), so no third write back to Free. The wait is
  // the end's: held while a fenced start is posted.
  MK_CHECK(cudrv::streamWriteValue32(stream, doorbell, kDoorbellPosted));
  ++startsQueued_;
  MK_CHECK(queueTail({Tail::kDoorbellWait, stream, slot}));
  if (!capturing) MK_CHECK(queueTail({Tail::kSlotRecord, stream, slot}));
  return Result::Success;
}

}  // namespace coll
}  // namespace mkernel

#endif  // MKERNEL_HAVE_DEVICE_CODE
