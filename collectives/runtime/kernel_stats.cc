// A KernelCommunicator's trace, launch counters and statistics, and createKernelCommunicator.
#include "collectives/runtime/kernel_communicator.h"

#ifdef MKERNEL_HAVE_DEVICE_CODE

namespace mkernel {
namespace coll {

Result KernelCommunicator::kernelTrace(std::vector<uint64_t>* out) const {
  if (trace_ == nullptr)
    return MK_ERROR(Result::InvalidUsage, "rank %d: kernel tracing is off (MKERNEL_KERNEL_TRACE=1)",
                    opts_.rank);
  std::vector<KernelTraceRecord> recs(kTraceDepth);
  // Into pinned memory (a pageable device-to-host copy would hold the driver's staging path while
  // peers' kernels may still need this process), on a stream of its own (stream_ is busy with the
  // persistent kernel); both allocated at init.
  cudaError_t err = cudaMemcpyAsync(traceHost_, trace_, sizeof(KernelTraceRecord) * kTraceDepth,
                                    cudaMemcpyDeviceToHost, traceStream_);
  if (err == cudaSuccess) err = cudaStreamSynchronize(traceStream_);
  if (err == cudaSuccess)
    std::memcpy(recs.data(), traceHost_, sizeof(KernelTraceRecord) * kTraceDepth);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "rank %d: reading the kernel trace: %s", opts_.rank,
                    cudaGetErrorString(err));
  std::sort(recs.begin(), recs.end(),
            [](const KernelTraceRecord& a, const KernelTraceRecord& b) { return a.seq < b.seq; });
  out->clear();
  for (const KernelTraceRecord& r : recs) {
    if (r.seq == 0) continue;
    out->push_back(r.seq);
    for (int i = 0; i < kTracePoints; ++i) out->push_back(r.t[i]);
    for (int i = 0; i < kTracePoints; ++i) out->push_back(r.c[i]);
  }
  return Result::Success;
}

static_assert(offsetof(DeviceState, hierWait) ==
                      offsetof(DeviceState, hierTurn) + 4 * sizeof(uint64_t) &&
                  offsetof(DeviceState, hierBusy) ==
                      offsetof(DeviceState, hierTurn) + 7 * sizeof(uint64_t) &&
                  7 + kHierBusyKinds == kHierCounters,
              "readLaunchCounters copies hierTurn, hierMark, hierWait and hierBusy as one run");
static_assert(sizeof(CollStats::hierBusyNs) == kHierBusyKinds * sizeof(uint64_t),
              "CollStats::hierBusyNs has every HierBusy");

Result KernelCommunicator::readLaunchCounters(uint64_t* done, uint64_t* graph,
                                              uint64_t* hierTurn) const {
  std::lock_guard<std::mutex> lock(counterMu_);
  if (state_ == nullptr || counterHost_ == nullptr)
    return Result::InvalidUsage;  // released: nothing to read
  RelaxedCaptureScope relaxed;    // a copy on our own stream, legal while the caller captures
  int prev = -1;
  (void)cudaGetDevice(&prev);
  if (prev != opts_.cudaDev) (void)cudaSetDevice(opts_.cudaDev);
  struct RestoreDevice {
    int prev, dev;
    ~RestoreDevice() {
      if (prev >= 0 && prev != dev) (void)cudaSetDevice(prev);
    }
  } restore{prev, opts_.cudaDev};
  cudaError_t err = cudaSuccess;
  // The copy that missed its bound last time may still wait in its hardware queue: another
  // queued behind it would wait as long, so none is, until it has run.
  if (counterCopyPending_) {
    err = cudaStreamQuery(counterStream_);
    if (err == cudaErrorNotReady) return Result::InProgress;
    counterCopyPending_ = false;
  }
  if (err == cudaSuccess)
    err = cudaMemcpyAsync(counterHost_, state_->launchDone, 8 * sizeof(uint64_t),
                          cudaMemcpyDeviceToHost, counterStream_);
  if (err == cudaSuccess)
    err = cudaMemcpyAsync(counterHost_ + 8, state_->graphOps, 8 * sizeof(uint64_t),
                          cudaMemcpyDeviceToHost, counterStream_);
  if (err == cudaSuccess && hierTurn != nullptr)
    err = cudaMemcpyAsync(counterHost_ + 16, state_->hierTurn, kHierCounters * sizeof(uint64_t),
                          cudaMemcpyDeviceToHost, counterStream_);
  if (err == cudaSuccess) {
    // Polled, not cudaStreamSynchronize: that call cannot give up.
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(kCounterReadBoundS);
    for (int polls = 0; (err = cudaStreamQuery(counterStream_)) == cudaErrorNotReady; ++polls) {
      if (std::chrono::steady_clock::now() >= deadline) {
        counterCopyPending_ = true;
        if (countersLate_++ == 0)
          MK_WARN(
              "rank %d: a copy of the launch path's counters (device memory) did not arrive within "
              "%.2f s: it waits in "
              "a hardware queue behind other work, such as a copy that another stream queued after "
              "a collective "
              "that has not finished (streams share CUDA_DEVICE_MAX_CONNECTIONS queues); until it "
              "arrives, the "
              "statistics leave out launch-path collectives finished since the last read "
              "(mkernelGetStats: "
              "countersLate)",
              opts_.rank, kCounterReadBoundS);
        globalStats().countersLate.fetch_add(1, std::memory_order_relaxed);
        return Result::InProgress;
      }
      if (polls < 100)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "rank %d: reading the launch path's counters: %s",
                    opts_.rank, cudaGetErrorString(err));
  std::memcpy(done, counterHost_, 8 * sizeof(uint64_t));
  std::memcpy(graph, counterHost_ + 8, 8 * sizeof(uint64_t));
  if (hierTurn != nullptr)
    std::memcpy(hierTurn, counterHost_ + 16, kHierCounters * sizeof(uint64_t));
  return Result::Success;
}

void KernelCommunicator::foldStats(bool device) const {
  if (ctl_ == nullptr) return;
  uint64_t done[8] = {}, graphDone[8] = {}, turn[kHierCounters] = {};
  const bool haveLaunch =
      device &&
      readLaunchCounters(done, graphDone, params_.nNodes > 1 ? turn : nullptr) == Result::Success;
  std::lock_guard<std::mutex> lock(statsMu_);
  if (haveLaunch && params_.nNodes > 1) std::memcpy(hierTurn_, turn, sizeof(turn));
  for (int c = 0; c < kNumCollTypes; ++c) {
    const uint64_t opsDone = ctl_->opsDone[c];
    if (opsDone > folded_[c]) {
      globalStats().kernelOps[c].fetch_add(opsDone - folded_[c], std::memory_order_relaxed);
      folded_[c] = opsDone;
    }
    if (!haveLaunch) continue;
    // The launch path's ops count as the kernel's too (mkernel ran them), and apart.
    if (done[c] > foldedLaunch_[c]) {
      globalStats().kernelOps[c].fetch_add(done[c] - foldedLaunch_[c], std::memory_order_relaxed);
      globalStats().launchOps[c].fetch_add(done[c] - foldedLaunch_[c], std::memory_order_relaxed);
      foldedLaunch_[c] = done[c];
    }
    // ... and so do captured ones, once per execution (graph replays).
    if (graphDone[c] > foldedGraph_[c]) {
      globalStats().kernelOps[c].fetch_add(graphDone[c] - foldedGraph_[c],
                                           std::memory_order_relaxed);
      globalStats().launchOps[c].fetch_add(graphDone[c] - foldedGraph_[c],
                                           std::memory_order_relaxed);
      foldedGraph_[c] = graphDone[c];
    }
  }
}

void KernelCommunicator::stats(CollStats* out) const {
  foldStats(/*device=*/true);
  std::lock_guard<std::mutex> lock(statsMu_);
  for (int c = 0; c < kNumCollTypes; ++c) {
    out->kernelOps[c] = folded_[c] + foldedLaunch_[c] + foldedGraph_[c] + oneRankCopies_[c];
    out->launchOps[c] = foldedLaunch_[c] + foldedGraph_[c] + oneRankCopies_[c];
    out->forwarded[c] = 0;
  }
  out->kernelLaunches = launches_;
  out->launchMaxBytes = launchMaxBytes_;
  out->llMaxBytes = llMaxBytes_;
  out->llOps = llOps_;
  out->ringOps = ringOps_;
  out->ring = peers_.ring;
  static_assert(sizeof(out->ringOrder) >= kMaxRanks, "CollStats::ringOrder holds every rank");
  out->ringOrdered = peers_.ringOrdered;
  for (int r = 0; r < kMaxRanks; ++r) out->ringOrder[r] = peers_.ringOrder[r];
  out->llBatchOps = llBatchOps_;
  out->oneRankCopies = 0;
  for (uint64_t v : oneRankCopies_) out->oneRankCopies += v;
  out->launchDirect = launchDirect_;
  out->directSharing = directSharing_;
  out->pdl = static_cast<int>(params_.pdl);
  out->directThreads = !launchDirect_                                 ? 0
                       : (params_.ownKernels & kOwnKernelDirect) != 0 ? kDirectThreads
                                                                      : kLaunchThreads;
  out->directCtas = launchDirect_ ? directCap_ : 0;
  out->sharedDirect = peers_.sharedDirect;
  out->persistentCtas = opts_.persistentKernel ? params_.nCtas : 0;
  out->hierCtas = params_.nNodes > 1 ? hierCtas_ : 0;
  out->hierWorkers = params_.nNodes > 1 ? hierWorkers_ : 0;
  out->hierReducers = params_.nNodes > 1 ? hierReducers_ : 0;
  out->hierRail = params_.nNodes > 1 ? hierRail_ : 0;
  out->railMbps = params_.nNodes > 1 ? railMbps_ : 0;
  out->hierTurnChunks = hierTurn_[0];
  out->hierTurnNodeNs = hierTurn_[1];
  out->hierTurnRailNs = hierTurn_[2];
  out->hierWaitRailNs = hierTurn_[4];
  out->hierWaitNodeNs = hierTurn_[5];
  out->hierWaitRoleNs = hierTurn_[6];
  for (int k = 0; k < kHierBusyKinds; ++k) out->hierBusyNs[k] = hierTurn_[7 + k];
  out->staged = peers_.staged;
  std::lock_guard<std::mutex> counterLock(counterMu_);
  out->countersLate = countersLate_;
}

Result createKernelCommunicator(const CommOptions& opts, bootstrap::Bootstrap* bootstrap,
                                std::unique_ptr<Communicator>* out) {
  std::unique_ptr<KernelCommunicator> comm(new KernelCommunicator(opts, bootstrap));
  MK_CHECK(comm->init());
  *out = std::move(comm);
  return Result::Success;
}

}  // namespace coll
}  // namespace mkernel

#endif  // MKERNEL_HAVE_DEVICE_CODE
