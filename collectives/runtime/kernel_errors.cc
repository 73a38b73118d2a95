// Errors of a KernelCommunicator: the kernel's error record, the launch watch, abort, finalize,
// release.
#include "collectives/runtime/kernel_communicator.h"

#ifdef MKERNEL_HAVE_DEVICE_CODE

namespace mkernel {
namespace coll {

Result KernelCommunicator::kernelError() const {
  // The record that names the cause (reportedErrorRecord): a wait for a peer or for the proxy,
  // before a CTA's wait for another CTA of this rank, which only follows from it. The sender of a
  // lane in CTA roles (CTA 0) may itself be waiting for a worker that waits for a peer.
  const int pick = reportedErrorRecord(ctl_->errors, kMaxCtas);
  if (pick >= 0) {
    const ErrorRecord& e = ctl_->errors[pick];
    const uint32_t what = *reinterpret_cast<const volatile uint32_t*>(&e.what);
    const char* coll =
        e.coll >= 0 && e.coll < kNumCollTypes ? collName(static_cast<CollType>(e.coll)) : "-";
    if (what == kWaitPeerStart || what == kWaitPeerEnd || what == kWaitPeerChunk ||
        what == kWaitLaunchPeer || what == kWaitLaunchPeerEnd) {
      // The peer's flag as the wait last read it (ErrorRecord keeps its low 32 bits): one behind
      // means the peer never reached this point; further behind, it is stuck earlier.
      const uint32_t behind = static_cast<uint32_t>(e.epoch) - e.observed;
      // Ranks sharing this GPU (emulation): a peer that never reached this point may have issued
      // the collective and still not run, CUDA holding its kernel back (docs/RELIABILITY.md); the
      // launch watch on that rank tells.
      const char* hint = behind == 1 && peers_.ranksOnMyDevice > 1
                             ? "; ranks share this GPU: if that rank issued the collective, its "
                               "kernel has not run "
                               "(its MKERNEL_LAUNCH_WATCH report says why)"
                             : "";
      // Where this rank reads that peer's state (its address here; for thread ranks the peer's
      // own, which its "persistent kernel ready" INFO line gives).
      const void* at = e.peer >= 0 && e.peer < kMaxRanks
                           ? static_cast<const void*>(params_.peers[e.peer])
                           : nullptr;
      return MK_ERROR(Result::RemoteError,
                      "rank %d (CTA %d): timed out after %llu s waiting for rank %d %s in %s "
                      "(epoch %llu; rank %d's "
                      "flag read %llu, %u behind; its state at %p)%s",
                      e.rank, e.cta,
                      static_cast<unsigned long long>(params_.timeoutNs / 1000000000ull), e.peer,
                      waitKindName(what), coll, static_cast<unsigned long long>(e.epoch), e.peer,
                      static_cast<unsigned long long>(e.epoch - behind), behind, at, hint);
    }
    if (what == kWaitProxy && proxy_ != nullptr) {
      // The rail's transfers (hierarchical path). A proxy that stopped on a transport error (a peer
      // gone, a refused command) says which; otherwise it tells what it still waits for, so that a
      // hang names the node whose transfer never came (its ranks are this rail's nodes).
      std::call_once(proxyReportOnce_, [&] {
        proxyReport_ = proxy_->failed() ? "the proxy stopped: " + proxy_->error()
                                        : "its proxy still has: " + proxy_->pendingSummary();
      });
      return MK_ERROR(Result::RemoteError,
                      "rank %d (CTA %d): waiting for the proxy's inter-node transfers in %s failed "
                      "or timed out (%llu s); %s",
                      e.rank, e.cta, coll,
                      static_cast<unsigned long long>(params_.timeoutNs / 1000000000ull),
                      proxyReport_.c_str());
    }
    return MK_ERROR(Result::InternalError,
                    "rank %d (CTA %d): timed out after %llu s waiting for %s", e.rank, e.cta,
                    static_cast<unsigned long long>(params_.timeoutNs / 1000000000ull),
                    waitKindName(what));
  }
  return MK_ERROR(Result::InternalError,
                  "rank %d: the persistent kernel stopped on a failure it did not record",
                  opts_.rank);
}

Result KernelCommunicator::asyncError(bool queryDevice) {
  if (ctl_ == nullptr) return Result::Success;
  if (ctl_->failed) return kernelError();
  if (queryDevice && stream_ != nullptr) {
    cudaError_t q = cudaStreamQuery(stream_);
    if (q != cudaSuccess && q != cudaErrorNotReady)
      return MK_ERROR(Result::UnhandledCudaError, "rank %d: the persistent kernel failed: %s",
                      opts_.rank, cudaGetErrorString(q));
  }
  if (queryDevice) watchLaunch();
  return Result::Success;
}

// The launch watch (MKERNEL_LAUNCH_WATCH): an application polling for errors while a watched
// launch-path op is still unfinished after half the timeout learns, once per op, what holds it:
// the caller's stream (its earlier work has not completed), CUDA (the stream is ready, the kernel
// has not started: another kernel or an implicit synchronization holds it back), or the kernel
// itself (started, waiting for a peer: that peer's report says why). Several thread ranks on one
// GPU stall at their first collective in the second way (docs/RELIABILITY.md).
void KernelCommunicator::watchLaunch() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || watchEpoch_ == 0 || watchEpoch_ != launchSeq_ ||
      watchReported_ == watchEpoch_)
    return;
  const double timeout = params::timeoutSeconds();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - lastLaunchAt_).count();
  if (waited < std::max(0.5, timeout / 2)) return;
  uint64_t done[8] = {}, graphDone[8] = {};
  if (readLaunchCounters(done, graphDone) != Result::Success) return;
  if (done[watchColl_] >= watchIndex_ || ctl_->failed) return;  // finished, or failed (reported so)
  watchReported_ = watchEpoch_;
  const cudaError_t pre = cudaEventQuery(watchPre_);
  (void)cudaGetLastError();
  const bool started = ctl_->launchStarted >= watchEpoch_;
  const char* where =
      started
          ? "its kernel started and waits inside the collective (a peer's report names what for)"
      : pre == cudaSuccess
          ? "the caller's stream is ready but its kernel has not started: CUDA holds it back "
            "(another kernel, or an implicit synchronization such as a device-wide wait or a free)"
          : "its kernel has not started: the work queued before it on the caller's stream has not "
            "completed";
  // Held back by CUDA: does the GPU still start new work elsewhere? An empty kernel on each of 8
  // fresh streams tells whether only this stream's hardware queue is held (they run) or nothing
  // new starts anywhere (none runs).
  char probe[160] = "";
  if (!started && pre == cudaSuccess)
    std::snprintf(
        probe, sizeof(probe),
        "; an empty kernel launched now on each of 8 fresh streams ran on %d of them within 0.2 s",
        probeFreshStreams(8, 0.2));
  MK_WARN("rank %d: %s (launch path, epoch %llu) unfinished %.1f s after its launch: %s%s",
          opts_.rank, lastLaunchColl_, static_cast<unsigned long long>(watchEpoch_), waited, where,
          probe);
}

Result KernelCommunicator::abort() {
  // Another thread may be in finalize() or release() (the shim's exit handler aborts releases
  // still waiting for peers): the fence and the control block go away under abortMu_ only.
  std::lock_guard<std::mutex> lock(abortMu_);
  aborted_ = true;
  if (fence_ != nullptr)
    fence_->leave(fenceMember_);  // co-located peers stop waiting for this rank
  if (ctl_ != nullptr) {
    ctl_->abortFlag = 1;
    ctl_->quit = 1;
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  return Result::Success;
}

Result KernelCommunicator::waitKernelExit(double seconds) {
  if (!launched_ || stream_ == nullptr) return Result::Success;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    cudaError_t q = cudaStreamQuery(stream_);
    if (q == cudaSuccess) return Result::Success;
    if (q != cudaErrorNotReady)
      return MK_ERROR(Result::UnhandledCudaError, "rank %d: persistent kernel: %s", opts_.rank,
                      cudaGetErrorString(q));
    if (std::chrono::steady_clock::now() > deadline)
      return MK_ERROR(Result::InternalError,
                      "rank %d: the persistent kernel did not exit within %.0f s", opts_.rank,
                      seconds);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

Result KernelCommunicator::finalize() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finalized_) return Result::Success;
  const double timeout = params::timeoutSeconds();
  // Waits (bounded, abort ends it) until the work before `ev` on its stream has completed.
  auto drain = [&](cudaEvent_t ev) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    while (cudaEventQuery(ev) == cudaErrorNotReady) {
      if (ctl_->abortFlag || std::chrono::steady_clock::now() > deadline) return;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  };
  // Posted work first: every eager slot's event (the caller's streams passed its wait).
  for (int s = 0; s < kEagerSlots; ++s)
    if (slotUsed_[s]) drain(slotEvents_[s]);
  // Every eager launch-path op, through what its kernel reports (CTA 0 at its end,
  // DeviceState::launchDone), never through the caller's streams: the application may have
  // destroyed them already. (The frees in release() wait for any CTA still finishing.)
  if (lastLaunchStream_ != nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    auto allDone = [&] {
      uint64_t done[8] = {}, graphDone[8] = {};
      const Result r = readLaunchCounters(done, graphDone);
      if (r == Result::InProgress) return false;  // the copy is late: ask again until the deadline
      if (r != Result::Success) return true;      // reported; nothing to wait for
      for (int c = 0; c < kNumCollTypes; ++c)
        if (done[c] < launchIssued_[c]) return false;
      return true;
    };
    while (!allDone() && !ctl_->failed && !ctl_->abortFlag &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  // Peers may still poll our flags until they have seen our last barrier arrival.
  Result res = aborted_ ? Result::Success : bs_->barrier();
  ctl_->quit = 1;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  Result exitRes = waitKernelExit(timeout);
  finalized_ = true;
  // The device's launch-path counters come back through a copy on counterStream_, and a copy can
  // wait in a hardware queue behind a copy that another stream queued after a collective not yet
  // finished (test_gpu_stats_bound): after an abort, perhaps a co-located rank's, until its
  // timeout. The read gives up after kCounterReadBoundS, but an aborted communicator does not
  // wait even that long: it keeps what it folded last, and its proxy closes now (release()
  // below), so that its peers see it leave at once (test_gpu_hier_fail: 60 of 60 survivors in
  // 0.30 s over 30 runs).
  foldStats(/*device=*/!aborted_);
  release(/*orderly=*/res == Result::Success && exitRes == Result::Success);
  if (res != Result::Success) return res;
  return exitRes;
}

void KernelCommunicator::release(bool orderly) {
  unregisterStatsFolder(this);  // before ctl_ goes: mkernelGetStats no longer reads it
  {
    std::lock_guard<std::mutex> lock(abortMu_);
    if (fence_ != nullptr) {
      fence_->leave(fenceMember_);
      if (fence_->unref()) delete fence_;
      fence_ = nullptr;
    }
  }
  if (!orderly && launched_ && ctl_ != nullptr) {
    ctl_->abortFlag = 1;
    ctl_->quit = 1;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (waitKernelExit(5.0) != Result::Success) {
      // The kernel still reads our host memory: leaking it is the only safe choice.
      MK_WARN("rank %d: persistent kernel still running at destruction; leaking its memory",
              opts_.rank);
      std::lock_guard<std::mutex> lock(abortMu_);
      ctl_ = nullptr;
      return;  // its SMs stay reserved too: the kernel still holds them
    }
  }
  if (reservedCtas_ > 0) SmBudget::process().release(opts_.cudaDev, reservedCtas_);
  reservedCtas_ = 0;
  // The proxy first (the kernel is gone): it reads the ring and net buffers freed below, and its
  // connections close here, so that the rail peers of an aborted rank fail at once ("the proxy
  // stopped: ... failed") instead of at MKERNEL_TIMEOUT_S. After the CUDA frees below it could be
  // late: a free may wait for the whole device, where a peer's kernel (emulated nodes) still
  // waits for this rank's proxy (test_gpu_hier_fail, the node that aborts).
  if (proxy_) (void)proxy_->stop();
  proxy_.reset();
  net_.reset();
  for (auto& ev : slotEvents_) {
    if (ev) (void)cudaEventDestroy(ev);
    ev = nullptr;
  }
  if (launchEvent_) (void)cudaEventDestroy(launchEvent_);
  launchEvent_ = nullptr;
  if (watchPre_) (void)cudaEventDestroy(watchPre_);
  watchPre_ = nullptr;
  if (graphEvent_) (void)cudaEventDestroy(graphEvent_);
  graphEvent_ = nullptr;
  if (stream_) (void)cudaStreamDestroy(stream_);
  // Device and pinned memory go back to the process's MemCache, not to CUDA: a free would wait for
  // every kernel of the device and stop every other thread's CUDA calls meanwhile (mem_cache.h).
  if (slots_) MemCache::hostFree(slots_);
  HostControl* ctl = nullptr;
  {
    std::lock_guard<std::mutex> lock(abortMu_);  // abort() writes into it
    ctl = ctl_;
    ctl_ = nullptr;
  }
  if (ctl) MemCache::hostFree(ctl);
  // Device memory is read by peers' kernels once exchanged: without the finalize barrier a peer
  // may still be polling our flags, so only an orderly finalize frees it then.
  if (proxyRing_) MemCache::hostFree(proxyRing_);
  if (proxyFlags_) MemCache::hostFree(proxyFlags_);
  if (netBuf_) netBufGpu_ ? MemCache::deviceFree(netBuf_) : MemCache::hostFree(netBuf_);
  proxyRing_ = nullptr;
  proxyFlags_ = nullptr;
  netBuf_ = nullptr;
  // IPC mappings of peers' memory: closed once our kernel is gone (it was, or we returned above).
  // A cuMem DeviceState (peers_.vmmState) is closePeers' to free.
  const bool stateIsVmm = state_ != nullptr && state_ == peers_.vmmState;
  closePeers(&peers_, /*freeLocal=*/orderly || !exchanged_);
  if (orderly || !exchanged_) {
    if (!stateIsVmm) MemCache::deviceFree(state_);
    MemCache::deviceFree(staging_);
    MemCache::deviceFree(trace_);
  }
  MemCache::hostFree(traceHost_);
  if (traceStream_) (void)cudaStreamDestroy(traceStream_);
  traceHost_ = nullptr;
  traceStream_ = nullptr;
  {
    std::lock_guard<std::mutex> lock(counterMu_);
    MemCache::hostFree(counterHost_);
    if (counterStream_) (void)cudaStreamDestroy(counterStream_);
    counterHost_ = nullptr;
    counterStream_ = nullptr;
  }
  ctl_ = nullptr;
  slots_ = nullptr;
  stream_ = nullptr;
  state_ = nullptr;
  staging_ = nullptr;
  trace_ = nullptr;
  // The last communicator of the process frees what is cached. (A release that leaked its memory
  // above, its kernel still running, stays a user: nothing is freed under that kernel.)
  if (memUser_) {
    memUser_ = false;
    const BlockCache::Stats st = MemCache::process().stats();
    MK_INFO(
        kLogAlloc,
        "rank %d: released; the process's memory cache holds %zu blocks (%.1f MiB) for reuse, %llu "
        "reused so far (MKERNEL_DEFER_FREES)",
        opts_.rank, st.cachedBlocks, static_cast<double>(st.cachedBytes) / 1048576.0,
        static_cast<unsigned long long>(st.reused));
    MemCache::process().leave();
  }
}

}  // namespace coll
}  // namespace mkernel

#endif  // MKERNEL_HAVE_DEVICE_CODE
