// KernelCommunicator::enqueue: work descriptors, eager and captured slots, a group's tail.
#include "collectives/runtime/kernel_communicator.h"

#ifdef MKERNEL_HAVE_DEVICE_CODE

namespace mkernel {
namespace coll {

Result KernelCommunicator::fillDesc(const CollArgs& a, WorkDesc* d) const {
  std::memset(d, 0, sizeof(*d));
  const size_t esz = dataTypeSize(a.dtype);
  if (esz == 0)
    return MK_ERROR(Result::InvalidArgument, "rank %d: bad datatype %d", opts_.rank,
                    static_cast<int>(a.dtype));
  if ((a.coll == CollType::Broadcast || a.coll == CollType::Reduce) &&
      (a.root < 0 || a.root >= opts_.nRanks))
    return MK_ERROR(Result::InvalidArgument, "rank %d: root %d outside 0..%d", opts_.rank, a.root,
                    opts_.nRanks - 1);
  d->coll = static_cast<int32_t>(a.coll);
  d->dtype = static_cast<int32_t>(a.dtype);
  d->root = a.root;
  d->count = a.count;
  d->sendbuff = reinterpret_cast<uint64_t>(a.sendbuff);
  d->recvbuff = reinterpret_cast<uint64_t>(a.recvbuff);
  d->scalarDevPtr = reinterpret_cast<uint64_t>(a.scalarDevPtr);
  const uint64_t bytes = a.count * esz;
  d->algo = static_cast<int32_t>(Algo::Direct);
  if (a.coll == CollType::AllReduce) {
    // The kernel implements OneShot and TwoShot for AllReduce; the policy's choice wins when it
    // names one of them, else the same size rule the policy applies by default.
    if (a.algo == static_cast<int32_t>(Algo::OneShot) ||
        a.algo == static_cast<int32_t>(Algo::TwoShot))
      d->algo = a.algo;
    else
      d->algo = static_cast<int32_t>(bytes <= oneShotMaxBytes_ ? Algo::OneShot : Algo::TwoShot);
  }
  // Ring (staged_ring.h): asked for by the policy (MKERNEL_ALGO=ring, or no direct access) or,
  // for callers without a policy (algo -1), by the communicator's agreement (PeerSetup::ring:
  // MKERNEL_ALGO=ring, or a host whose GPUs are not NVLink all-to-all); it runs through the
  // staged regions, so only a staged communicator of one node has it (the others keep the default).
  // MKERNEL_RING_MIN_BYTES (staged_ring.h's ringTakes): by default what the LL mode takes stays
  // an LL push (the launch path), the rest is a ring.
  const bool ring =
      (a.algo == static_cast<int32_t>(Algo::Ring) || (a.algo < 0 && peers_.ring)) &&
      ringTakes(ringMinBytes_, llTakes(llPayloadBytes(a.count, esz), llMaxBytes_, opts_.nRanks),
                directWholeBytes(a.coll, a.count, opts_.nRanks, esz));
  if (ring && peers_.staged && params_.nNodes == 1 && opts_.nRanks > 1)
    d->algo = static_cast<int32_t>(Algo::Ring);
  d->nCtas = splitCtas(shareBytes(a.coll, a.count, a.dtype, opts_.nRanks), params_.nCtas);
  if (a.coll == CollType::AllReduce && static_cast<Algo>(d->algo) == Algo::OneShot) d->nCtas = 1;
  // Hierarchical: MKERNEL_HIER_CTAS CTAs from MKERNEL_HIER_SPLIT_MIN_BYTES, else one; each posts
  // to its own proxy channel. CTAs whose slice is empty (small counts) return at once, alike on
  // every rank.
  if (params_.nNodes > 1) {
    const uint64_t whole = directWholeBytes(a.coll, a.count, opts_.nRanks, esz);
    d->nCtas = static_cast<int32_t>(hierCtasFor(whole, hierCtas_, hierSplitMinBytes_));
    // CTA roles: every lane's CTAs take part (those of lanes beyond the op's skip it in the
    // kernel).
    if (hierRolesFor(a.coll, whole, hierWorkers_, hierSplitMinBytes_)) {
      d->hierLanes = d->nCtas;
      d->nCtas = hierRoleCtas(hierCtas_, hierWorkers_, hierReducers_);
    }
  }
  if (a.coll == CollType::AllReduce || a.coll == CollType::ReduceScatter ||
      a.coll == CollType::Reduce) {
    MK_CHECK(makeDevRedOp(a.op, a.dtype, opts_.nRanks, a.scalar, &d->redOp));
  }
  return Result::Success;
}

Result KernelCommunicator::takeEagerSlot(int* slot) {
  const int s = static_cast<int>(eagerCount_ % kEagerSlots);
  if (slotUsed_[s]) {
    // The caller's stream must have passed this slot's wait before we reuse it.
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(params::TIMEOUT_S());
    for (;;) {
      cudaError_t q = cudaEventQuery(slotEvents_[s]);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady)
        return MK_ERROR(Result::UnhandledCudaError, "rank %d: waiting for work slot %d: %s",
                        opts_.rank, s, cudaGetErrorString(q));
      if (ctl_->abortFlag)
        return MK_ERROR(Result::RemoteError, "rank %d: communicator aborted", opts_.rank);
      if (ctl_->failed) return kernelError();
      if (std::chrono::steady_clock::now() > deadline)
        return MK_ERROR(Result::InternalError,
                        "rank %d: timed out waiting for work slot %d (%d collectives in flight on "
                        "the caller's streams)",
                        opts_.rank, s, kEagerSlots);
      std::this_thread::yield();
    }
  }
  slotUsed_[s] = true;
  ++eagerCount_;
  *slot = s;
  return Result::Success;
}

Result KernelCommunicator::ensureKernel() {
  // Dekker handshake with the kernel's idle exit (docs/KERNEL.md): our work is counted (eager
  // counter or resident flag) before we look at the state; the kernel announces Exiting before it
  // looks at the counter. A full fence on each side makes at least one see the other.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (launched_ && ctl_->kernelState == kKernelRunning) return Result::Success;
  ctl_->kernelState = kKernelRunning;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  MK_CHECK(launchPersistentKernel(params_, stream_));
  launched_ = true;
  ++launches_;
  globalStats().kernelLaunches.fetch_add(1, std::memory_order_relaxed);
  MK_TRACE(kLogColl, "rank %d: persistent kernel launched (%llu)", opts_.rank,
           static_cast<unsigned long long>(launches_));
  return Result::Success;
}

// Whether `stream` is being captured (an invalidated capture is an error).
Result KernelCommunicator::captureOf(cudaStream_t stream, bool* capturing) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MK_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture), "rank %d: cudaStreamIsCapturing",
                opts_.rank);
  if (capture == cudaStreamCaptureStatusInvalidated)
    return MK_ERROR(Result::InvalidUsage, "rank %d: the stream's capture was invalidated",
                    opts_.rank);
  *capturing = capture == cudaStreamCaptureStatusActive;
  return Result::Success;
}

Result KernelCommunicator::checkUsable() {
  if (finalized_)
    return MK_ERROR(Result::InvalidUsage, "rank %d: enqueue on a finalized communicator",
                    opts_.rank);
  if (aborted_)
    return MK_ERROR(Result::InvalidUsage, "rank %d: enqueue on an aborted communicator",
                    opts_.rank);
  if (ctl_->failed) return kernelError();
  MK_CUDA_CHECK(cudaSetDevice(opts_.cudaDev), "rank %d: cudaSetDevice", opts_.rank);
  return Result::Success;
}

Result KernelCommunicator::enqueue(const CollArgs* ops, int n, cudaStream_t stream) {
  if (ops == nullptr || n < 0)
    return MK_ERROR(Result::InvalidArgument, "rank %d: enqueue of %d ops at %p", opts_.rank, n,
                    static_cast<const void*>(ops));
  std::lock_guard<std::mutex> lock(mu_);
  MK_CHECK(checkUsable());
  bool capturing = false;
  MK_CHECK(captureOf(stream, &capturing));
  MK_TRACE(kLogColl, "rank %d: enqueue of %d op(s) (%s, first count %zu) on stream %p%s",
           opts_.rank, n, n > 0 ? collName(ops[0].coll) : "-", n > 0 ? ops[0].count : size_t(0),
           static_cast<void*>(stream), capturing ? ", capturing" : "");
  if (fence_ != nullptr && !capturing) {
    // Ranks sharing this GPU: one launch at a time (an op, or a run of ops that make one LL
    // batch), each start fenced before its end wait is queued.
    for (int i = 0; i < n;) {
      // The run enqueueLocked makes one LL batch of (the same rules: kMaxOpsPerSlot, one slot's
      // lines).
      int run = 1;
      uint64_t lines = 0;
      if (batchableArgs(ops[i], &lines))
        for (uint64_t more = 0;
             run < kMaxOpsPerSlot && i + run < n && batchableArgs(ops[i + run], &more) &&
             lines + more <= llSlotLines(opts_.nRanks);
             ++run)
          lines += more;
      Result r = enqueueLocked(&ops[i], run, stream, /*capturing=*/false);
      i += run;
      const Result c = completeStartsLocked();  // also after a failure: queues what was held
      if (r == Result::Success) r = c;
      if (r != Result::Success) return r;
    }
    foldStats();
    return Result::Success;
  }
  MK_CHECK(enqueueLocked(ops, n, stream, capturing));
  foldStats();
  return Result::Success;
}

Result KernelCommunicator::enqueueStart(const CollArgs& op, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  MK_CHECK(checkUsable());
  bool capturing = false;
  MK_CHECK(captureOf(stream, &capturing));
  // Captured ops replay later, without the host: nothing to fence now (docs/KERNEL.md).
  if (fence_ == nullptr || capturing) {
    MK_CHECK(enqueueLocked(&op, 1, stream, capturing));
    foldStats();
    return Result::Success;
  }
  return enqueueLocked(&op, 1, stream, /*capturing=*/false);
}

Result KernelCommunicator::completeStarts() {
  std::lock_guard<std::mutex> lock(mu_);
  Result r = completeStartsLocked();
  foldStats();
  return r;
}

// Waits for the co-located ranks to have posted the start this rank posted last, then queues
// what was held behind it. The held tails are queued whatever the fence says: the caller's stream
// must not run ahead of the collective (a failed one ends through the kernel's own bounded waits).
Result KernelCommunicator::completeStartsLocked() {
  Result res = Result::Success;
  if (fencePending_) {
    fencePending_ = false;
    int lag = -1;
    const double timeout = static_cast<double>(params_.timeoutNs) / 1e9;
    const unsigned long long seq = static_cast<unsigned long long>(fenceSeq_);
    auto stop = [this] { return ctl_->abortFlag != 0 || ctl_->failed != 0; };
    // A first stretch of up to 5 s, then a word in the log (a peer thread busy elsewhere, or one
    // thread calling several co-located ranks' collectives outside a group), then the rest.
    const double first = std::min(timeout, 5.0);
    PostFence::Outcome outcome = fence_->wait(fenceMember_, fenceSeq_, first, stop, &lag);
    if (outcome == PostFence::Outcome::kTimedOut && timeout > first) {
      MK_WARN(
          "rank %d: collective %llu has waited %.0f s for rank %d, which shares GPU %d in this "
          "process, to post its "
          "part (a thread that drives several such ranks must call their collectives inside a "
          "group); waiting up "
          "to MKERNEL_TIMEOUT_S=%.0f s",
          opts_.rank, seq, first, lag, opts_.cudaDev, timeout);
      outcome = fence_->wait(fenceMember_, fenceSeq_, timeout - first, stop, &lag);
    }
    switch (outcome) {
      case PostFence::Outcome::kPassed:
        break;
      case PostFence::Outcome::kStopped:
        res = ctl_->failed ? kernelError()
                           : MK_ERROR(Result::RemoteError,
                                      "rank %d: aborted while waiting for rank %d (same GPU, this "
                                      "process) to post collective %llu",
                                      opts_.rank, lag, seq);
        break;
      case PostFence::Outcome::kLeft:
        res =
            MK_ERROR(Result::RemoteError,
                     "rank %d: rank %d, which shares GPU %d in this process, was finalized or "
                     "aborted before posting "
                     "collective %llu of this communicator (ranks must call the same collectives)",
                     opts_.rank, lag, opts_.cudaDev, seq);
        break;
      case PostFence::Outcome::kSameThread:
        res = MK_ERROR(Result::InvalidUsage,
                       "rank %d: rank %d shares GPU %d in this process and is driven by this same "
                       "thread, which has not "
                       "posted its part of collective %llu: a thread driving several ranks must "
                       "call their collectives "
                       "between ncclGroupStart and ncclGroupEnd (as NCCL requires)",
                       opts_.rank, lag, opts_.cudaDev, seq);
        break;
      case PostFence::Outcome::kTimedOut:
        res = MK_ERROR(Result::RemoteError,
                       "rank %d: timed out after %.0f s waiting for rank %d, which shares GPU %d "
                       "in this process, to post "
                       "collective %llu of this communicator (its thread has not called it; "
                       "MKERNEL_POST_FENCE)",
                       opts_.rank, timeout, lag, opts_.cudaDev, seq);
        break;
    }
  }
  for (const Tail& t : heldTails_) {
    Result r = runTail(t);
    if (r != Result::Success && res == Result::Success) res = r;
  }
  heldTails_.clear();
  return res;
}

Result KernelCommunicator::queueTail(const Tail& t) {
  if (holdTails_) {
    heldTails_.push_back(t);
    return Result::Success;
  }
  return runTail(t);
}

Result KernelCommunicator::runTail(const Tail& t) {
  switch (t.kind) {
    case Tail::kDoorbellWait:
      return cudrv::streamWaitValue32(t.stream, &state_->doorbell[t.slot], kDoorbellDone,
                                      cudrv::WaitCmp::Geq);
    case Tail::kSlotRecord:
      MK_CUDA_CHECK(cudaEventRecord(slotEvents_[t.slot], t.stream),
                    "rank %d: cudaEventRecord(slot)", opts_.rank);
      return Result::Success;
  }
  return Result::Success;
}

// Posts ops (mu_ held). With a fence and not capturing, exactly one launch (one op, or the ops of
// one LL batch): its start is queued, what waits for its end held for completeStartsLocked, and
// the fence told once a start was queued.
Result KernelCommunicator::enqueueLocked(const CollArgs* ops, int n, cudaStream_t stream,
                                         bool capturing) {
  const bool fenced = fence_ != nullptr && !capturing;
  const uint64_t startsBefore = startsQueued_;
  if (fenced) {
    if (fencePending_ || !heldTails_.empty())
      MK_CHECK(completeStartsLocked());  // the previous op's first
    holdTails_ = true;
  }
  // In order: launch-path ops each get a kernel launch; runs of the others share doorbell slots
  // (up to kMaxOpsPerSlot per slot). Every rank splits a group the same way (the decision
  // depends only on shared arguments).
  // Consecutive LL ops of one CTA each (batchable) are held in `batch` and launched as one
  // kernel (launchBatch) when the run ends; a run of one takes launchOp.
  WorkDesc descs[kMaxOpsPerSlot];
  int nOps = 0;
  WorkDesc batch[kMaxOpsPerSlot];
  int nBatch = 0;
  uint64_t batchLines = 0;
  Result res = Result::Success;
  auto flushBatch = [&]() {
    if (nBatch == 1) res = launchOp(batch[0], Path::kLaunchLl, capturing, stream);
    if (nBatch > 1) res = launchBatch(batch, nBatch, capturing, stream);
    nBatch = 0;
    batchLines = 0;
  };
  for (int i = 0; i < n && res == Result::Success; ++i) {
    if (ops[i].count == 0) continue;  // NCCL: a no-op (the count is the same on every rank)
    WorkDesc d;
    res = fillDesc(ops[i], &d);
    if (res != Result::Success) break;
    const Path path = pathOf(d);
    if (batchable(d, path)) {
      if (nOps > 0) res = postSlot(descs, nOps, capturing, stream);
      nOps = 0;
      // One exchange holds what one slot holds (every rank splits the same way).
      if (nBatch > 0 && batchLines + opLines(d) > llSlotLines(opts_.nRanks) &&
          res == Result::Success)
        flushBatch();
      batch[nBatch++] = d;
      batchLines += opLines(d);
      if (nBatch == kMaxOpsPerSlot && res == Result::Success) flushBatch();
      continue;
    }
    if (nBatch > 0) flushBatch();
    if (res != Result::Success) break;
    if (path != Path::kDoorbell && oneRankCopy(ops[i])) {
      if (nOps > 0) res = postSlot(descs, nOps, capturing, stream);
      nOps = 0;
      if (res == Result::Success) res = copyOneRank(ops[i], stream);
      continue;
    }
    if (path != Path::kDoorbell) {
      if (nOps > 0) res = postSlot(descs, nOps, capturing, stream);
      nOps = 0;
      if (res == Result::Success) res = launchOp(d, path, capturing, stream);
      continue;
    }
    if (static_cast<Algo>(d.algo) == Algo::Ring) ++ringOps_;
    descs[nOps++] = d;
    if (nOps == kMaxOpsPerSlot) {
      res = postSlot(descs, nOps, capturing, stream);
      nOps = 0;
    }
  }
  if (res == Result::Success && nBatch > 0) flushBatch();
  if (res == Result::Success && nOps > 0) res = postSlot(descs, nOps, capturing, stream);
  holdTails_ = false;
  if (fenced && startsQueued_ != startsBefore) {
    // Posted, even if a later call failed: the start is on the stream and the peers wait for it.
    fence_->posted(fenceMember_, ++fenceSeq_);
    fencePending_ = true;
  }
  return res;
}

}  // namespace coll
}  // namespace mkernel

#endif  // MKERNEL_HAVE_DEVICE_CODE
