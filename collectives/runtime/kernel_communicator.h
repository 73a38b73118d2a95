// KernelCommunicator: one rank's communicator whose collectives run in the persistent kernel
// and the launch path (internal to collectives/runtime/; collectives/communicator.h is the public
// face). Its members are defined by concern in the kernel_*.cc files beside this header:
//   kernel_init.cc     creation: device state, peers, CTAs, the kernel's stack
//   kernel_agree.cc    what the ranks agree on at creation (launch cap, hierarchical roles, rail)
//   kernel_proxy.cc    the proxy and its net backend (several nodes)
//   kernel_enqueue.cc  enqueue: descriptors, eager and captured slots, the tail of a group
//   kernel_path.cc     the path of one collective (launch, LL, direct, doorbell) and its ordering
//   kernel_launch.cc   launches: batches, single collectives, doorbell slots
//   kernel_errors.cc   errors, the launch watch, abort, finalize and release
//   kernel_stats.cc    trace, counters, statistics, and createKernelCommunicator
//
// Host side of the doorbell protocol (docs/KERNEL.md): enqueue() writes the descriptors of a
// group into a WorkSlot in host-mapped memory, makes sure the kernel runs, and puts two stream
// memops on the caller's stream: doorbell = Posted, wait doorbell >= Done. The same values on
// every call, so a CUDA graph that captured them replays correctly; a
// captured slot is dedicated to that graph forever (its descriptor must stay valid for every
// replay), an eager slot is reused once the caller's stream has passed its wait (an event).
#pragma once

#ifdef MKERNEL_HAVE_DEVICE_CODE

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "vendor/cuda_driver.h"
#include "collectives/device/launch.h"
#include "collectives/runtime/peer_memory.h"
#include "collectives/runtime/post_fence.h"
#include "collectives/runtime/proxy_net.h"
#include "collectives/algo/reduce_host.h"
#include "collectives/algo/hier_staged.h"
#include "collectives/route/launch_path.h"
#include "collectives/runtime/mem_cache.h"
#include "collectives/runtime/sm_budget.h"
#include "collectives/algo/staged.h"
#include "collectives/algo/staged_ring.h"
#include "collectives/stats.h"
#include "collectives/algo/work.h"
#include "common/check.h"
#include "common/log.h"
#include "common/param.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/net/net.h"
#include "transport/proxy/proxy.h"

namespace mkernel {
namespace coll {

// DeviceState::hierTurn (3), hierMark, hierWait (3) and hierBusy (kHierBusyKinds): one run that
// readLaunchCounters copies.
constexpr int kHierCounters = 12;

// How long readLaunchCounters waits for its copy (a few hundred bytes, microseconds when its
// hardware queue is free). A copy waits behind any copy queued earlier in a queue it shares, and
// a copy that another stream queued after a collective (an application copying a result to the
// host) waits for that collective: during a hang, until MKERNEL_TIMEOUT_S (test_gpu_stats_bound
// holds one so). Past the bound the read gives up, and the application's statistics or error poll
// (mkernelGetStats, ncclCommGetAsyncError's launch watch) returns at once instead of hanging with
// the job.
constexpr double kCounterReadBoundS = 0.25;

// Bytes per CTA below which adding CTAs does not pay (their barrier costs more than their copy).
constexpr uint64_t kBytesPerCta = 64 * 1024;

// CTAs that split a collective whose share per rank is `shareBytes` (kBytesPerCta each), at most
// `cap`: a function of shared arguments only, so every rank splits the op the same way.
inline int splitCtas(uint64_t shareBytes, int cap) {
  const uint64_t ctas = std::max<uint64_t>((shareBytes + kBytesPerCta - 1) / kBytesPerCta, 1);
  return static_cast<int>(std::min<uint64_t>(ctas, static_cast<uint64_t>(std::max(cap, 1))));
}

// Bytes of a collective's work per rank: its buffer, or for AllGather / ReduceScatter (whose
// count is per-rank) all n blocks, divided by the ranks.
inline uint64_t shareBytes(CollType c, uint64_t count, DataType dtype, int nRanks) {
  const uint64_t bytes = count * dataTypeSize(dtype);
  const uint64_t work = c == CollType::AllGather || c == CollType::ReduceScatter
                            ? bytes * static_cast<uint64_t>(nRanks)
                            : bytes;
  return work / static_cast<uint64_t>(nRanks);
}

inline const char* waitKindName(uint32_t what) {
  switch (what) {
    case kWaitPeerStart:
      return "to reach the same collective (start barrier)";
    case kWaitPeerEnd:
      return "to finish the collective (end barrier)";
    case kWaitDispatch:
      return "the leader CTA's dispatch";
    case kWaitSlotDone:
      return "worker CTAs to finish a group";
    case kWaitPeerChunk:
      return "to stage its next chunk";
    case kWaitProxy:
      return "the proxy's inter-node transfers";
    case kWaitLaunchPeer:
      return "to publish its inputs (launch path)";
    case kWaitLaunchPeerEnd:
      return "to finish the collective (launch path, direct)";
    case kWaitHierRole:
      return "another CTA of its lane (hierarchical AllReduce in CTA roles)";
  }
  return "?";
}

// Switches this thread to relaxed capture mode for its lifetime: enqueue() calls runtime APIs
// (event query, kernel launch on the internal stream) that global-mode capture of the caller's
// stream would otherwise reject.
class RelaxedCaptureScope {
 public:
  RelaxedCaptureScope() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureScope() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// Local memory (docs/KERNEL.md, "Local memory"), once per device and process, before any of
// mkernel's kernels runs there. A launch that needs more local memory than the context holds
// resizes it, and the resize waits for every kernel running in the context: a peer's kernel that
// waits for this rank, i.e. until it times out. So:
// - the stack limit is raised to what the kernels need (cudaFuncGetAttributes' localSizeBytes,
//   which is ptxas' cumulative stack, calls included: 3000 bytes for the persistent kernel, whose
//   own frame is 2576; NCCL sets the limit for its kernels the same way);
// - CU_CTX_LMEM_RESIZE_TO_MAX keeps what any launch grew (by default the driver shrinks local
//   memory again after a kernel that needed more than the limit, an application's kernel
//   included, and the next such launch resizes again);
// - each kernel is launched once as a no-op (warmKernels) and waited for, so that whatever the
//   driver does at the first launch after a new limit happens now. Without the flag (a driver
//   before 12.1) the limit gets kStackSlack more instead.
// This alone does not end the first-collective stall of patched nccl-tests with 4 thread ranks on
// one GPU (docs/RELIABILITY.md): 3 of 5 runs stalled with it.
constexpr size_t kStackSlack = 1024;
inline Result reserveKernelStack(int device) {
  static std::mutex mu;
  static std::set<int> warmed;
  std::lock_guard<std::mutex> lock(mu);
  if (warmed.count(device) != 0) return Result::Success;
  size_t need = 0;
  MK_CHECK(persistentKernelLocalBytes(&need));
  const bool keep = cudrv::keepLocalMemory() == Result::Success;
  if (!keep) {
    MK_INFO(
        kLogInit,
        "local memory cannot be kept at its largest size (%s); stack limit with %zu bytes of slack",
        lastError(), kStackSlack);
    need += kStackSlack;
  }
  size_t cur = 0;
  cudaError_t err = cudaDeviceGetLimit(&cur, cudaLimitStackSize);
  if (err != cudaSuccess || cur < need) {
    err = cudaDeviceSetLimit(cudaLimitStackSize, need);
    if (err != cudaSuccess)
      return MK_ERROR(Result::UnhandledCudaError,
                      "setting the stack limit to %zu bytes for the persistent kernel failed: %s",
                      need, cudaGetErrorString(err));
    MK_INFO(kLogInit, "stack limit raised from %zu to %zu bytes (persistent kernel)", cur, need);
  }
  cudaStream_t s = nullptr;
  err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "cudaStreamCreate(warm-up) failed: %s",
                    cudaGetErrorString(err));
  const Result warm = warmKernels(s);
  (void)cudaStreamDestroy(s);
  MK_CHECK(warm);
  warmed.insert(device);
  MK_INFO(
      kLogInit, "device %d: kernels warmed up, local memory %s", device,
      keep ? "kept at its largest size (CU_CTX_LMEM_RESIZE_TO_MAX)" : "sized by the stack limit");
  return Result::Success;
}

class KernelCommunicator final : public Communicator {
 public:
  KernelCommunicator(const CommOptions& opts, bootstrap::Bootstrap* bs) : opts_(opts), bs_(bs) {}
  ~KernelCommunicator() override { release(/*orderly=*/false); }

  Result init();
  Result enqueue(const CollArgs* ops, int n, cudaStream_t stream) override;
  bool fenced() const override { return fence_ != nullptr; }
  bool needsDoorbell(const CollArgs& op) const override;
  Result enqueueStart(const CollArgs& op, cudaStream_t stream) override;
  Result completeStarts() override;
  Result asyncError(bool queryDevice) override;
  void watchLaunch();
  Result abort() override;
  Result finalize() override;
  const CommOptions& options() const override { return opts_; }
  void stats(CollStats* out) const override;
  Result kernelTrace(std::vector<uint64_t>* out) const override;
  bool testStalled() const override { return ctl_ != nullptr && ctl_->testStalled != 0; }

 private:
  Result checkUsable();
  Result captureOf(cudaStream_t stream, bool* capturing);
  Result enqueueLocked(const CollArgs* ops, int n, cudaStream_t stream, bool capturing);
  Result completeStartsLocked();
  // What waits for a posted collective's end, queued at once or, while a fenced start is being
  // posted (holdTails_), held until completeStarts.
  struct Tail {
    enum Kind { kDoorbellWait, kSlotRecord } kind;
    cudaStream_t stream;
    int slot;
  };
  Result queueTail(const Tail& t);
  Result runTail(const Tail& t);
  Result fillDesc(const CollArgs& a, WorkDesc* d) const;
  // How an op runs: the doorbell (persistent kernel), the launch path through the inbox, or the
  // launch path's direct mode (thread ranks, above the inbox threshold).
  enum class Path { kDoorbell, kLaunchInbox, kLaunchDirect, kLaunchLl };
  Path pathOf(const WorkDesc& d) const;
  bool oneRankCopy(const CollArgs& a) const;
  Result copyOneRank(const CollArgs& a, cudaStream_t stream);
  Result launchOp(const WorkDesc& d, Path path, bool capturing, cudaStream_t stream);
  Result launchBatch(const WorkDesc* descs, int n, bool capturing, cudaStream_t stream);
  Result launchOrder(bool capturing, cudaStream_t stream);
  Result launchQueued(cudaStream_t runOn, cudaStream_t stream, CollType last);
  bool batchable(const WorkDesc& d, Path path) const;
  bool batchableArgs(const CollArgs& a, uint64_t* lines) const;
  static uint64_t opLines(const WorkDesc& d);
  Result postSlot(const WorkDesc* descs, int nOps, bool capturing, cudaStream_t stream);
  Result agreeLaunchCap(int smsLeft);
  Result setupProxy();
  Result agreeHierRoles();
  Result agreeHierRail();
  Result takeEagerSlot(int* slot);
  Result ensureKernel();
  Result kernelError() const;
  Result waitKernelExit(double seconds);
  // Folds the kernels' completion counters into the statistics. device: also the launch path's,
  // which live in device memory (readLaunchCounters: a copy; stats() and mkernelGetStats, not
  // every enqueue).
  void foldStats(bool device = false) const;
  // Copies DeviceState::launchDone and graphOps (8 each) into done / graph, and with hierTurn
  // DeviceState::hierTurn, hierMark, hierWait and hierBusy (kHierCounters, contiguous) into it.
  // Waits kCounterReadBoundS at most: InProgress when the copy has not arrived by then (counted
  // in countersLate_, warned once), and at once while that copy still waits (no other is queued
  // behind it).
  Result readLaunchCounters(uint64_t* done, uint64_t* graph, uint64_t* hierTurn = nullptr) const;
  void release(bool orderly);

  CommOptions opts_;
  bootstrap::Bootstrap* bs_;
  std::mutex mu_;
  std::mutex abortMu_;            // abort() against release() freeing what it writes (fence_, ctl_)
  bool memUser_ = false;          // counted among MemCache's users (init to the end of release)
  DeviceState* state_ = nullptr;  // device
  void* staging_ = nullptr;       // device
  KernelTraceRecord* trace_ = nullptr;      // device, MKERNEL_KERNEL_TRACE only
  KernelTraceRecord* traceHost_ = nullptr;  // pinned copy target, allocated with trace_
  // readLaunchCounters: a pinned target and a stream of its own (stream_ may hold the persistent
  // kernel; a caller's stream is the caller's).
  uint64_t* counterHost_ = nullptr;
  cudaStream_t counterStream_ = nullptr;
  mutable std::mutex counterMu_;
  mutable bool counterCopyPending_ =
      false;  // a copy that missed its bound may still run (counterMu_)
  mutable uint64_t countersLate_ =
      0;  // copies that missed it (counterMu_; CollStats::countersLate)
  cudaStream_t traceStream_ = nullptr;  // the copy's stream (not stream_: the kernel runs there)
  HostControl* ctl_ = nullptr;          // host-mapped
  WorkSlot* slots_ = nullptr;           // host-mapped
  cudaStream_t stream_ = nullptr;       // internal, non-blocking: the persistent kernel runs here
  cudaEvent_t slotEvents_[kEagerSlots] = {};
  bool slotUsed_[kEagerSlots] = {};
  uint64_t eagerCount_ = 0;
  int graphSlots_ = 0;
  KernelParams params_{};
  PeerSetup peers_;  // peers' memory; IPC mappings and the staging buffer of process ranks
  // Emulated nodes (hier_staged.h): this rank's proxy on its rail, over TCP on loopback, with
  // its ring, flags and net buffers in host-mapped memory.
  std::unique_ptr<net::Net> net_;
  std::unique_ptr<proxy::Proxy> proxy_;
  // kernelError's account of the proxy after a failed rail wait, made once (asyncError polls it).
  mutable std::once_flag proxyReportOnce_;
  mutable std::string proxyReport_;
  proxy::ProxyRing* proxyRing_ = nullptr;    // hierCtas_ rings (one proxy channel per CTA)
  proxy::ProxyFlags* proxyFlags_ = nullptr;  // hierCtas_ flag blocks
  char* netBuf_ = nullptr;                   // hierCtas_ x netBufBytes
  bool netBufGpu_ = false;  // netBuf_ in GPU memory (coll::proxyMemoryFor), else host-mapped
  int hierCtas_ = 1;        // MKERNEL_HIER_CTAS, agreed by every rank
  uint64_t hierSplitMinBytes_ = 0;          // MKERNEL_HIER_SPLIT_MIN_BYTES, agreed by every rank
  int hierWorkers_ = 0, hierReducers_ = 0;  // MKERNEL_HIER_ROLES (rank 0's), 0: data-parallel CTAs
  int hierRail_ = coll::kRailDirect;        // MKERNEL_HIER_RAIL (rank 0's, for this node count)
  int railMbps_ = 0;   // the slowest rank's rail NIC (its proxy's net device), agreed
  int hierAhead_ = 2;  // MKERNEL_HIER_AHEAD (rank 0's)
  bool launched_ = false;
  bool exchanged_ = false;
  bool aborted_ = false;
  bool finalized_ = false;
  int reservedCtas_ = 0;  // held in SmBudget until the kernel is known to have exited
  uint64_t launches_ = 0;
  uint64_t oneShotMaxBytes_ = 0;
  // The launch path (launch_path.h): eager collectives publishing at most launchMaxBytes_.
  uint64_t launchMaxBytes_ = 0;
  int launchCap_ = 1;        // CTAs per launch-path op, agreed by all ranks
  int directCap_ = 1;        // ... per direct-mode op (launchDirectKernel's, or launchCap_)
  uint64_t llMaxBytes_ = 0;  // MKERNEL_LL_MAX_BYTES, the smallest any rank asked for
  int64_t ringMinBytes_ =
      -1;                    // MKERNEL_RING_MIN_BYTES: -1 auto (what LL does not take), else bytes
  uint64_t llOps_ = 0;       // ops issued in LL mode (eager and captured)
  uint64_t ringOps_ = 0;     // ops posted as rings (the doorbell)
  uint64_t llBatchOps_ = 0;  // ... of which in an LL batch (launchBatch)
  enum class LlBatchMode { Off, Serial, Exchange };
  LlBatchMode llBatch_ = LlBatchMode::Exchange;  // MKERNEL_LL_BATCH
  bool launchDirect_ = false;              // MKERNEL_LAUNCH_DIRECT and thread ranks: larger ops too
  uint64_t directMaxBytes_ = kDirectAuto;  // MKERNEL_DIRECT_MAX_BYTES (directTakes)
  // Direct mode has no upper end with ranks sharing a GPU in direct mode (auto, or 0).
  bool directUnbounded() const { return directMaxBytes_ == kDirectAuto || directMaxBytes_ == 0; }
  int directSharing_ = 1;          // the most ranks on one GPU, agreed (directTakes)
  uint64_t launchSeq_ = 0;         // launch-path ops issued (the epoch of the next one - 1)
  uint64_t launchIssued_[8] = {};  // ... by CollType (the index the kernel reports)
  // Orders eager launch-path ops across caller streams. With one rank of this communicator on
  // this GPU it is recorded after every op (as NCCL records on the caller's stream at each
  // launch), so no stream the application may since have destroyed is ever used again. With
  // several (emulation) nothing is queued behind a launch-path kernel: it waits for its peers,
  // and a command behind it on a stream that shares a hardware queue with a peer's stream holds
  // back that peer's kernel (docs/RELIABILITY.md); it is then recorded only when the
  // stream changes, on the previous stream (which the application must not have destroyed).
  cudaEvent_t launchEvent_ = nullptr;
  bool recordEachOp_ = true;
  // Thread ranks sharing this GPU (MKERNEL_POST_FENCE, collectives/runtime/post_fence.h): the fence
  // of this process's co-located ranks (shared, reference-counted), this rank's member index, the
  // fenced collectives posted, whether the last one still waits for completeStarts, and the
  // tails held until then.
  PostFence* fence_ = nullptr;
  int fenceMember_ = 0;
  uint64_t fenceSeq_ = 0;
  bool fencePending_ = false;
  bool holdTails_ = false;
  uint64_t startsQueued_ =
      0;  // starts queued (kernel launches, doorbell writes): did a post queue one
  std::vector<Tail> heldTails_;
  // The launch watch (MKERNEL_LAUNCH_WATCH, watchLaunch): an event recorded just before a watched
  // op's kernel, that op's epoch, when the last eager op was launched, and the epoch last reported.
  enum class Watch { Off, First, All };
  Watch watch_ = Watch::First;
  cudaEvent_t watchPre_ = nullptr;
  uint64_t watchEpoch_ = 0;
  int watchColl_ = 0;
  uint64_t watchIndex_ = 0;  // its launchIssued_ index: done once launchDone[watchColl_] reaches it
  const char* lastLaunchColl_ = "-";
  std::chrono::steady_clock::time_point lastLaunchAt_{};
  uint64_t watchReported_ = 0;
  cudaStream_t lastLaunchStream_ =
      nullptr;  // set once an eager op ran; never used: it may be destroyed
  // Captured launch-path ops (MKERNEL_GRAPH_LAUNCH): the stream and capture of the last one, so
  // that a capture forked over several streams still orders them (graph namespace, launch_path.h).
  bool graphLaunch_ = false;
  int perNode_ = 0;  // hierarchical path: ranks per (emulated or real) node; 0: one node
  cudaEvent_t graphEvent_ = nullptr;
  cudaStream_t lastGraphStream_ = nullptr;
  unsigned long long lastGraphCapture_ = 0;
  mutable uint64_t foldedGraph_[kNumCollTypes] =
      {};  // graphLaunchDone folded into the statistics (statsMu_)
  uint64_t oneRankCopies_[kNumCollTypes] = {};  // launch-path ops done as a cudaMemcpyAsync
  bool oneRankKernel_ = false;                  // MKERNEL_ONE_RANK=kernel: no cudaMemcpyAsync
  mutable std::mutex statsMu_;
  mutable uint64_t folded_[kNumCollTypes] = {};
  mutable uint64_t hierTurn_[kHierCounters] =
      {};  // DeviceState::hierTurn, hierMark, hierWait, hierBusy at the last stats() (statsMu_)
  mutable uint64_t foldedLaunch_[kNumCollTypes] = {};
};

}  // namespace coll
}  // namespace mkernel

#endif  // MKERNEL_HAVE_DEVICE_CODE
