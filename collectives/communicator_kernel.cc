// KernelCommunicator: one rank's communicator whose collectives run in the persistent kernel.
//
// Host side of the doorbell protocol (docs/KERNEL.md): enqueue() writes the descriptors of a
// group into a WorkSlot in host-mapped memory, makes sure the kernel runs, and puts two stream
// memops on the caller's stream: doorbell = Posted, wait doorbell >= Done. The same values on
// every call, so a CUDA graph that captured them replays correctly; a
// captured slot is dedicated to that graph forever (its descriptor must stay valid for every
// replay), an eager slot is reused once the caller's stream has passed its wait (an event).
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
#include "collectives/cuda_driver.h"
#include "collectives/device/launch.h"
#include "collectives/peer_memory.h"
#include "collectives/post_fence.h"
#include "collectives/proxy_net.h"
#include "collectives/reduce_host.h"
#include "collectives/hier_staged.h"
#include "collectives/launch_path.h"
#include "collectives/mem_cache.h"
#include "collectives/sm_budget.h"
#include "collectives/staged.h"
#include "collectives/staged_ring.h"
#include "collectives/stats.h"
#include "collectives/work.h"
#include "common/log.h"
#include "common/param.h"
#include "transport/bootstrap/bootstrap.h"
#include "transport/net/net.h"
#include "transport/proxy/proxy.h"

namespace mkernel {
namespace coll {
namespace {

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
int splitCtas(uint64_t shareBytes, int cap) {
  const uint64_t ctas = std::max<uint64_t>((shareBytes + kBytesPerCta - 1) / kBytesPerCta, 1);
  return static_cast<int>(std::min<uint64_t>(ctas, static_cast<uint64_t>(std::max(cap, 1))));
}

// Bytes of a collective's work per rank: its buffer, or for AllGather / ReduceScatter (whose
// count is per-rank) all n blocks, divided by the ranks.
uint64_t shareBytes(CollType c, uint64_t count, DataType dtype, int nRanks) {
  const uint64_t bytes = count * dataTypeSize(dtype);
  const uint64_t work = c == CollType::AllGather || c == CollType::ReduceScatter ? bytes * static_cast<uint64_t>(nRanks) : bytes;
  return work / static_cast<uint64_t>(nRanks);
}

const char* waitKindName(uint32_t what) {
  switch (what) {
    case kWaitPeerStart: return "to reach the same collective (start barrier)";
    case kWaitPeerEnd: return "to finish the collective (end barrier)";
    case kWaitDispatch: return "the leader CTA's dispatch";
    case kWaitSlotDone: return "worker CTAs to finish a group";
    case kWaitPeerChunk: return "to stage its next chunk";
    case kWaitProxy: return "the proxy's inter-node transfers";
    case kWaitLaunchPeer: return "to publish its inputs (launch path)";
    case kWaitLaunchPeerEnd: return "to finish the collective (launch path, direct)";
    case kWaitHierRole: return "another CTA of its lane (hierarchical AllReduce in CTA roles)";
  }
  return "?";
}

#define MK_CUDA(call, what)                                                                  \
  do {                                                                                       \
    cudaError_t mk_cuda_err_ = (call);                                                       \
    if (mk_cuda_err_ != cudaSuccess)                                                         \
      return MK_ERROR(Result::UnhandledCudaError, "rank %d: %s failed: %s", opts_.rank, what, \
                      cudaGetErrorString(mk_cuda_err_));                                     \
  } while (0)

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
Result reserveKernelStack(int device) {
  static std::mutex mu;
  static std::set<int> warmed;
  std::lock_guard<std::mutex> lock(mu);
  if (warmed.count(device) != 0) return Result::Success;
  size_t need = 0;
  MK_CHECK(persistentKernelLocalBytes(&need));
  const bool keep = cudrv::keepLocalMemory() == Result::Success;
  if (!keep) {
    MK_INFO(kLogInit, "local memory cannot be kept at its largest size (%s); stack limit with %zu bytes of slack",
            lastError(), kStackSlack);
    need += kStackSlack;
  }
  size_t cur = 0;
  cudaError_t err = cudaDeviceGetLimit(&cur, cudaLimitStackSize);
  if (err != cudaSuccess || cur < need) {
    err = cudaDeviceSetLimit(cudaLimitStackSize, need);
    if (err != cudaSuccess)
      return MK_ERROR(Result::UnhandledCudaError, "setting the stack limit to %zu bytes for the persistent kernel failed: %s",
                      need, cudaGetErrorString(err));
    MK_INFO(kLogInit, "stack limit raised from %zu to %zu bytes (persistent kernel)", cur, need);
  }
  cudaStream_t s = nullptr;
  err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "cudaStreamCreate(warm-up) failed: %s", cudaGetErrorString(err));
  const Result warm = warmKernels(s);
  (void)cudaStreamDestroy(s);
  MK_CHECK(warm);
  warmed.insert(device);
  MK_INFO(kLogInit, "device %d: kernels warmed up, local memory %s", device,
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
  bool capturedWithoutResidency(const CollArgs& op) const override;
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
  Path pathOf(const WorkDesc& d, bool capturing) const;
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
  std::mutex abortMu_;  // abort() against release() freeing what it writes (fence_, ctl_)
  bool memUser_ = false;  // counted among MemCache's users (init to the end of release)
  DeviceState* state_ = nullptr;  // device
  void* staging_ = nullptr;       // device
  KernelTraceRecord* trace_ = nullptr;  // device, MKERNEL_KERNEL_TRACE only
  KernelTraceRecord* traceHost_ = nullptr;  // pinned copy target, allocated with trace_
  // readLaunchCounters: a pinned target and a stream of its own (stream_ may hold the persistent
  // kernel; a caller's stream is the caller's).
  uint64_t* counterHost_ = nullptr;
  cudaStream_t counterStream_ = nullptr;
  mutable std::mutex counterMu_;
  mutable bool counterCopyPending_ = false;  // a copy that missed its bound may still run (counterMu_)
  mutable uint64_t countersLate_ = 0;        // copies that missed it (counterMu_; CollStats::countersLate)
  cudaStream_t traceStream_ = nullptr;      // the copy's stream (not stream_: the kernel runs there)
  HostControl* ctl_ = nullptr;    // host-mapped
  WorkSlot* slots_ = nullptr;     // host-mapped
  cudaStream_t stream_ = nullptr;  // internal, non-blocking: the persistent kernel runs here
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
  bool netBufGpu_ = false;                   // netBuf_ in GPU memory (coll::proxyMemoryFor), else host-mapped
  int hierCtas_ = 1;                         // MKERNEL_HIER_CTAS, agreed by every rank
  uint64_t hierSplitMinBytes_ = 0;           // MKERNEL_HIER_SPLIT_MIN_BYTES, agreed by every rank
  int hierWorkers_ = 0, hierReducers_ = 0;   // MKERNEL_HIER_ROLES (rank 0's), 0: data-parallel CTAs
  int hierRail_ = coll::kRailDirect;          // MKERNEL_HIER_RAIL (rank 0's, for this node count)
  int railMbps_ = 0;                          // the slowest rank's rail NIC (its proxy's net device), agreed
  int hierAhead_ = 2;                         // MKERNEL_HIER_AHEAD (rank 0's)
  bool launched_ = false;
  bool exchanged_ = false;
  bool aborted_ = false;
  bool finalized_ = false;
  int reservedCtas_ = 0;     // held in SmBudget until the kernel is known to have exited
  uint64_t launches_ = 0;
  uint64_t oneShotMaxBytes_ = 0;
  // The launch path (launch_path.h): eager collectives publishing at most launchMaxBytes_.
  uint64_t launchMaxBytes_ = 0;
  int launchCap_ = 1;                  // CTAs per launch-path op, agreed by all ranks
  int directCap_ = 1;                  // ... per direct-mode op (launchDirectKernel's, or launchCap_)
  uint64_t llMaxBytes_ = 0;            // MKERNEL_LL_MAX_BYTES, the smallest any rank asked for
  int64_t ringMinBytes_ = -1;          // MKERNEL_RING_MIN_BYTES: -1 auto (what LL does not take), else bytes
  uint64_t llOps_ = 0;                 // ops issued in LL mode (eager and captured)
  uint64_t ringOps_ = 0;               // ops posted as rings (the doorbell)
  uint64_t llBatchOps_ = 0;            // ... of which in an LL batch (launchBatch)
  enum class LlBatchMode { Off, Serial, Exchange };
  LlBatchMode llBatch_ = LlBatchMode::Exchange;  // MKERNEL_LL_BATCH
  bool launchDirect_ = false;          // MKERNEL_LAUNCH_DIRECT and thread ranks: larger ops too
  uint64_t directMaxBytes_ = kDirectAuto;  // MKERNEL_DIRECT_MAX_BYTES (directTakes)
  // Direct mode has no upper end with ranks sharing a GPU in direct mode (auto, or 0).
  bool directUnbounded() const { return directMaxBytes_ == kDirectAuto || directMaxBytes_ == 0; }
  int directSharing_ = 1;                  // the most ranks on one GPU, agreed (directTakes)
  uint64_t launchSeq_ = 0;             // launch-path ops issued (the epoch of the next one - 1)
  uint64_t launchIssued_[8] = {};      // ... by CollType (the index the kernel reports)
  // Orders eager launch-path ops across caller streams. With one rank of this communicator on
  // this GPU it is recorded after every op (as NCCL records on the caller's stream at each
  // launch), so no stream the application may since have destroyed is ever used again. With
  // several (emulation) nothing is queued behind a launch-path kernel: it waits for its peers,
  // and a command behind it on a stream that shares a hardware queue with a peer's stream holds
  // back that peer's kernel (docs/RELIABILITY.md); it is then recorded only when the
  // stream changes, on the previous stream (which the application must not have destroyed).
  cudaEvent_t launchEvent_ = nullptr;
  bool recordEachOp_ = true;
  // Thread ranks sharing this GPU (MKERNEL_POST_FENCE, collectives/post_fence.h): the fence of
  // this process's co-located ranks (shared, reference-counted), this rank's member index, the
  // fenced collectives posted, whether the last one still waits for completeStarts, and the
  // tails held until then.
  PostFence* fence_ = nullptr;
  int fenceMember_ = 0;
  uint64_t fenceSeq_ = 0;
  bool fencePending_ = false;
  bool holdTails_ = false;
  uint64_t startsQueued_ = 0;  // starts queued (kernel launches, doorbell writes): did a post queue one
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
  cudaStream_t lastLaunchStream_ = nullptr;  // set once an eager op ran; never used: it may be destroyed
  // Captured launch-path ops (MKERNEL_GRAPH_LAUNCH): the stream and capture of the last one, so
  // that a capture forked over several streams still orders them (graph namespace, launch_path.h).
  bool graphLaunch_ = false;
  int perNode_ = 0;  // hierarchical path: ranks per (emulated or real) node; 0: one node
  cudaEvent_t graphEvent_ = nullptr;
  cudaStream_t lastGraphStream_ = nullptr;
  unsigned long long lastGraphCapture_ = 0;
  mutable uint64_t foldedGraph_[kNumCollTypes] = {};  // graphLaunchDone folded into the statistics (statsMu_)
  uint64_t oneRankCopies_[kNumCollTypes] = {};  // launch-path ops done as a cudaMemcpyAsync
  bool oneRankKernel_ = false;                     // MKERNEL_ONE_RANK=kernel: no cudaMemcpyAsync
  mutable std::mutex statsMu_;
  mutable uint64_t folded_[kNumCollTypes] = {};
  mutable uint64_t hierTurn_[kHierCounters] = {};  // DeviceState::hierTurn, hierMark, hierWait, hierBusy at the last stats() (statsMu_)
  mutable uint64_t foldedLaunch_[kNumCollTypes] = {};
};

Result KernelCommunicator::init() {
  // Before the first allocation: this communicator's blocks come from and go back to the
  // process's cache, and what is cached is freed only when the last user has left (mem_cache.h).
  MemCache::process().enter();
  memUser_ = true;
  MK_CUDA(cudaSetDevice(opts_.cudaDev), "cudaSetDevice");
  MK_CHECK(cudrv::loadMemOps());
  int sms = 0;
  MK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, opts_.cudaDev), "SM count query");
  int perSm = 0;
  MK_CHECK(persistentKernelCtasPerSm(&perSm));
  if (perSm < 1)
    return MK_ERROR(Result::InternalError, "rank %d: the persistent kernel cannot be resident on GPU %d",
                    opts_.rank, opts_.cudaDev);
  const int64_t want = opts_.maxCtas > 0 ? opts_.maxCtas : params::CTAS();
  if (want < 1 || want > kMaxCtas)
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_CTAS=%lld outside 1..%d", static_cast<long long>(want), kMaxCtas);

  MK_CHECK(reserveKernelStack(opts_.cudaDev));  // also loads the kernels before any of them runs
  oneShotMaxBytes_ = static_cast<uint64_t>(params::ONESHOT_MAX_BYTES());
  const int64_t launchMax = params::LAUNCH_MAX_BYTES();
  if (launchMax < 0 || static_cast<uint64_t>(launchMax) > kLaunchInboxBytes)
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_LAUNCH_MAX_BYTES=%lld outside 0..%llu", static_cast<long long>(launchMax),
                    static_cast<unsigned long long>(kLaunchInboxBytes));
  launchMaxBytes_ = static_cast<uint64_t>(launchMax);
  if (const std::optional<int64_t> ringMin = params::RING_MIN_BYTES()) ringMinBytes_ = *ringMin;
  if (const std::optional<int64_t> directMax = params::DIRECT_MAX_BYTES())
    directMaxBytes_ = static_cast<uint64_t>(*directMax);
  MK_CUDA(MemCache::deviceAlloc(opts_.cudaDev, sizeof(DeviceState), reinterpret_cast<void**>(&state_)), "cudaMalloc(DeviceState)");
  MK_CUDA(cudaMemset(state_, 0, sizeof(DeviceState)), "cudaMemset(DeviceState)");
  MK_CUDA(MemCache::hostAlloc((16 + kHierCounters) * sizeof(uint64_t), cudaHostAllocDefault, reinterpret_cast<void**>(&counterHost_)),
          "cudaMallocHost(counters)");
  MK_CUDA(cudaStreamCreateWithFlags(&counterStream_, cudaStreamNonBlocking), "cudaStreamCreate(counters)");
  MK_CUDA(MemCache::deviceAlloc(opts_.cudaDev, std::max<uint64_t>(oneShotMaxBytes_, 16), &staging_), "cudaMalloc(staging)");
  void* host = nullptr;
  MK_CUDA(MemCache::hostAlloc(sizeof(HostControl), cudaHostAllocMapped | cudaHostAllocPortable, &host), "cudaHostAlloc(control)");
  ctl_ = static_cast<HostControl*>(host);
  std::memset(host, 0, sizeof(HostControl));
  MK_CUDA(MemCache::hostAlloc(sizeof(WorkSlot) * kMaxSlots, cudaHostAllocMapped | cudaHostAllocPortable, &host), "cudaHostAlloc(slots)");
  slots_ = static_cast<WorkSlot*>(host);
  std::memset(host, 0, sizeof(WorkSlot) * kMaxSlots);
  MK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  for (auto& ev : slotEvents_) MK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  MK_CUDA(cudaEventCreateWithFlags(&launchEvent_, cudaEventDisableTiming), "cudaEventCreate(launch path)");
  watch_ = params::LAUNCH_WATCH.is("off") ? Watch::Off : params::LAUNCH_WATCH.is("all") ? Watch::All : Watch::First;
  params_.launchWatch = watch_ == Watch::Off ? 0u : watch_ == Watch::All ? 2u : 1u;
  if (watch_ != Watch::Off)
    MK_CUDA(cudaEventCreateWithFlags(&watchPre_, cudaEventDisableTiming), "cudaEventCreate(launch watch)");
  MK_CUDA(cudaEventCreateWithFlags(&graphEvent_, cudaEventDisableTiming), "cudaEventCreate(launch path, graphs)");
  params_.graphEpilogueLight = params::GRAPH_EPILOGUE.is("light") ? 1u : 0u;
  const std::string pdl = params::PDL.text();
  int ccMajor = 0;
  MK_CUDA(cudaDeviceGetAttribute(&ccMajor, cudaDevAttrComputeCapabilityMajor, opts_.cudaDev),
          "compute capability query");
  // Programmatic dependent launch needs sm_90; early is narrowed after agreeLaunchCap.
  params_.pdl = ccMajor < 9 || pdl == "off" ? 0u : pdl == "wait" ? 1u : 2u;
  if (ccMajor < 9 && pdl != "off")
    MK_INFO(kLogInit, "rank %d: MKERNEL_PDL=%s ignored: GPU %d is sm_%d0, programmatic launch needs sm_90",
            opts_.rank, pdl.c_str(), opts_.cudaDev, ccMajor);
  params_.ownKernels = (params::LL_KERNEL.is("own") ? kOwnKernelLl : 0u) |
                       (params::DIRECT_KERNEL.is("own") ? kOwnKernelDirect : 0u);
  oneRankKernel_ = params::ONE_RANK.is("kernel");
  llBatch_ = params::LL_BATCH.is("off")        ? LlBatchMode::Off
             : params::LL_BATCH.is("exchange") ? LlBatchMode::Exchange
                                               : LlBatchMode::Serial;
  // The memset above ran on the legacy default stream: wait for that stream alone. A device-wide
  // wait would also wait for every running kernel, and a persistent kernel kept resident by a
  // captured doorbell (another communicator's) or a thread rank's launch-path kernel waiting for
  // this rank never finishes first (docs/KERNEL.md, "A product risk").
  MK_CUDA(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize(legacy stream) after setup");

  // Every rank reads what its GPU has left before any rank of this communicator reserves
  // (the exchange is collective), so ranks sharing a GPU split the same budget. Two
  // communicators created at the same moment on one GPU by different threads may both see the
  // whole budget: create communicators one after another (as PyTorch does).
  const int smsLeft = SmBudget::process().available(opts_.cudaDev, sms);
  const int64_t stagedChunk = params::STAGED_CHUNK_BYTES();
  if (stagedChunk < static_cast<int64_t>(kStagedMinChunkBytes) || stagedChunk > (int64_t(1) << 30))
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_STAGED_CHUNK_BYTES=%lld outside %llu..%llu",
                    static_cast<long long>(stagedChunk), static_cast<unsigned long long>(kStagedMinChunkBytes),
                    1ull << 30);
  // Emulated nodes (MKERNEL_RANKS_PER_NODE in emulation): every collective runs hierarchically.
  const bool emulatedNodes = opts_.emulate && opts_.ranksPerNode > 0 && opts_.ranksPerNode < opts_.nRanks;
  if (emulatedNodes &&
      (opts_.nRanks % opts_.ranksPerNode != 0 || opts_.nRanks / opts_.ranksPerNode > kMaxHierNodes))
    return MK_ERROR(Result::InvalidArgument,
                    "MKERNEL_RANKS_PER_NODE=%d: %d ranks are not whole nodes of that size (at most %d nodes)",
                    opts_.ranksPerNode, opts_.nRanks, kMaxHierNodes);
  // MKERNEL_SHARED_CTAS: only where direct mode takes the large collectives (thread ranks, the
  // launch path and its direct mode on, no emulated nodes; exchangePeers drops it for staged ones)
  // and captured ones too (MKERNEL_GRAPH_LAUNCH=0 gives those to the persistent kernel).
  int sharedCtas = -1;
  if (const std::optional<int64_t> v = params::SHARED_CTAS()) {
    if (*v < 0 || *v > kMaxCtas)
      return MK_ERROR(Result::InvalidArgument, "MKERNEL_SHARED_CTAS=%lld: expected auto or 0..%d",
                      static_cast<long long>(*v), kMaxCtas);
    sharedCtas = static_cast<int>(*v);
  }
  // auto with a numeric upper end to direct mode (MKERNEL_DIRECT_MAX_BYTES): -2, which keeps more
  // than four ranks per GPU off (sharedPersistentCtas).
  if (sharedCtas == -1 && !directUnbounded()) sharedCtas = -2;
  // Rings (exchangePeers' ringMode): the policy (policy.cc) validates MKERNEL_ALGO's name; here
  // ring forces them, auto lets the host's NVLink decide, any other choice keeps direct access.
  // Not for emulated nodes (the hierarchical path has its own rail forms).
  const int ringMode = emulatedNodes ? 0 : params::ALGO.is("ring") ? 1 : params::ALGO.is("auto") ? 2 : 0;
  if (!params::LAUNCH_DIRECT() || !params::GRAPH_LAUNCH() || launchMaxBytes_ == 0 || emulatedNodes)
    sharedCtas = 0;
  MK_CHECK(exchangePeers(bs_, opts_.rank, opts_.nRanks, opts_.cudaDev, state_, static_cast<int>(want),
                         smsLeft, opts_.emulate, static_cast<uint64_t>(stagedChunk) / 16 * 16, emulatedNodes,
                         sharedCtas, &peers_, ringMode));
  PeerSetup& peers = peers_;
  if (peers.vmmState != nullptr) {
    // Process ranks over cuMem (MKERNEL_PEER_IPC): the DeviceState peers mapped is a cuMem block;
    // the one allocated above goes back to the cache unused.
    MemCache::deviceFree(state_);
    state_ = peers.vmmState;
  }
  // Ranks on several hosts (one node per host, exchangePeers) run hierarchically too, through
  // the same proxies, over verbs or TCP between the hosts. Emulated nodes keep their own size.
  perNode_ = emulatedNodes ? opts_.ranksPerNode : peers.hostPerNode;
  const bool hier = perNode_ > 0 && perNode_ < opts_.nRanks;
  SmBudget::process().reserve(opts_.cudaDev, peers.nCtas);
  reservedCtas_ = peers.nCtas;
  exchanged_ = true;
  recordEachOp_ = peers_.ranksOnMyDevice <= 1;  // launchEvent_
  {
    // Thread ranks sharing this GPU: one PostFence per such set, made by its lowest rank and
    // handed to the others through the bootstrap (one process: the pointer is valid in each).
    // Every rank takes part in the exchange; MKERNEL_POST_FENCE=0 (an experiment) makes none.
    std::vector<uint64_t> fences(static_cast<size_t>(opts_.nRanks), 0);
    if (params::POST_FENCE() && peers.nLocalPeers > 1 && peers.localPeers[0] == opts_.rank)
      fences[static_cast<size_t>(opts_.rank)] =
          reinterpret_cast<uint64_t>(new PostFence(peers.localPeers, peers.nLocalPeers));
    MK_CHECK(bs_->allGather(fences.data(), sizeof(uint64_t)));
    if (peers.nLocalPeers > 1 && fences[static_cast<size_t>(peers.localPeers[0])] != 0) {
      fence_ = reinterpret_cast<PostFence*>(fences[static_cast<size_t>(peers.localPeers[0])]);
      for (int m = 0; m < peers.nLocalPeers; ++m)
        if (peers.localPeers[m] == opts_.rank) fenceMember_ = m;
      MK_INFO(kLogInit, "rank %d: %d ranks of this communicator share GPU %d in this process: each posts a collective's "
              "start, then waits for the others' before queueing its end (MKERNEL_POST_FENCE)",
              opts_.rank, peers.nLocalPeers, opts_.cudaDev);
    }
  }
  for (int r = 0; r < opts_.nRanks; ++r) params_.peers[r] = peers.peers[r];
  params_.self = state_;
  void* dev = nullptr;
  MK_CUDA(cudaHostGetDevicePointer(&dev, slots_, 0), "cudaHostGetDevicePointer(slots)");
  params_.slots = static_cast<const WorkSlot*>(dev);
  MK_CUDA(cudaHostGetDevicePointer(&dev, ctl_, 0), "cudaHostGetDevicePointer(control)");
  params_.ctl = static_cast<HostControl*>(dev);
  params_.staging = staging_;
  params_.staged = peers.staged ? 1 : 0;
  params_.ringOrdered = peers.ringOrdered ? 1 : 0;
  for (int r = 0; r < kMaxRanks; ++r) params_.ringOrder[r] = peers.ringOrder[r];
  params_.stagedChunkBytes = static_cast<uint64_t>(stagedChunk) / 16 * 16;
  for (int r = 0; r < opts_.nRanks; ++r) params_.stagedBuf[r] = peers.stagedBuf[r];
  params_.nNodes = 1;
  params_.perNode = opts_.nRanks;
  if (hier) MK_CHECK(setupProxy());
  const int64_t traceMode = params::KERNEL_TRACE();
  if (traceMode != 0) {
    // Everything the trace read needs is allocated now: an allocation while persistent kernels
    // run can hold up later work until they exit (docs/KERNEL.md).
    MK_CUDA(MemCache::deviceAlloc(opts_.cudaDev, sizeof(KernelTraceRecord) * kTraceDepth, reinterpret_cast<void**>(&trace_)),
            "cudaMalloc(trace)");
    MK_CUDA(cudaMemset(trace_, 0, sizeof(KernelTraceRecord) * kTraceDepth), "cudaMemset(trace)");
    MK_CUDA(MemCache::hostAlloc(sizeof(KernelTraceRecord) * kTraceDepth, cudaHostAllocDefault, reinterpret_cast<void**>(&traceHost_)),
            "cudaMallocHost(trace)");
    MK_CUDA(cudaStreamCreateWithFlags(&traceStream_, cudaStreamNonBlocking), "cudaStreamCreate(trace)");
    MK_CUDA(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize(legacy stream) after the trace buffer");
  }
  params_.trace = trace_;
  params_.traceGraph = traceMode == 2 ? 1u : traceMode == 3 ? 2u : 0u;
  params_.stagingBytes = oneShotMaxBytes_;
  params_.timeoutNs = static_cast<uint64_t>(params::TIMEOUT_S()) * 1000000000ull;
  params_.idleExitNs = static_cast<uint64_t>(std::max<int64_t>(0, params::IDLE_EXIT_US())) * 1000ull;
  params_.testStallBarrier = static_cast<uint32_t>(std::max<int64_t>(0, params::TEST_STALL_BARRIER()));
  params_.hierOverlap = params::HIER_OVERLAP() ? 1u : 0u;
  if (params_.testStallBarrier != 0)
    MK_WARN("rank %d: MKERNEL_TEST_STALL_BARRIER=%u: a test hook; this rank's staged collectives stop at that barrier "
            "until the communicator is aborted", opts_.rank, params_.testStallBarrier);
  params_.rank = opts_.rank;
  params_.nRanks = opts_.nRanks;
  params_.nCtas = peers.nCtas;
  MK_CHECK(agreeLaunchCap(smsLeft));
  // MKERNEL_PDL=early lets this rank's next launch-path kernel become resident while the current
  // one runs. With ranks sharing a GPU that kernel could hold the SMs a co-located peer's current
  // kernel needs, and the two would wait for each other: there it is wait only.
  if (params_.pdl == 2 && directSharing_ > 1) {
    params_.pdl = 1;
    MK_INFO(kLogInit, "rank %d: MKERNEL_PDL=early is wait here: %d ranks share a GPU", opts_.rank, directSharing_);
  }
  // Direct mode needs every peer's user buffers addressable: thread ranks of one process (not
  // staged), one node. The same on every rank (staged is agreed, nNodes is the layout).
  launchDirect_ = params::LAUNCH_DIRECT() && launchMaxBytes_ > 0 && !peers.staged && !hier &&
                  opts_.nRanks > 1;
  // Captured collectives on the launch path (its graph namespace): the same decision as eager
  // ones; the rest keep the persistent kernel's replayable doorbell. Every rank reads the same
  // setting (as MKERNEL_LAUNCH_MAX_BYTES).
  graphLaunch_ = params::GRAPH_LAUNCH() && launchMaxBytes_ > 0 && !hier;
  registerStatsFolder(this, [this] { foldStats(/*device=*/true); });
  MK_INFO(kLogInit, "rank %d: persistent kernel ready: %d CTAs x %d threads, GPU %d (%d SMs, %d ranks on it)%s; "
          "device state %p, fence %p",
          opts_.rank, params_.nCtas, kKernelThreads, opts_.cudaDev, sms, peers.ranksOnMyDevice,
          peers.staged ? ", staged (process ranks)" : "", static_cast<void*>(state_), static_cast<void*>(fence_));
  return Result::Success;
}

// CTAs one launch-path op may use. Every rank's launch kernels wait for each other, so those of
// all ranks sharing a GPU must fit at once on the SMs that the persistent kernels (possibly
// resident) leave: (SMs left for persistent kernels + the ones kept free - this communicator's
// persistent CTAs on this GPU) x launch CTAs per SM, shared by the ranks on it. The minimum over
// ranks (an all-gather), so that every rank splits each op the same way. Direct-mode ops in their
// own kernel (MKERNEL_DIRECT_KERNEL=own) get the same count from that kernel's CTAs per SM.
Result KernelCommunicator::agreeLaunchCap(int smsLeft) {
  const int64_t asked = params::LAUNCH_CTAS();
  if (asked < 1 || asked > kLaunchMaxCtas)
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_LAUNCH_CTAS=%lld outside 1..%d", static_cast<long long>(asked),
                    kLaunchMaxCtas);
  int perSm = 0, perSmDirect = 0;
  MK_CHECK(launchKernelCtasPerSm(&perSm));
  MK_CHECK(directKernelCtasPerSm(&perSmDirect));
  const int ranksHere = std::max(1, peers_.ranksOnMyDevice);
  // Ranks sharing a GPU in direct mode (MKERNEL_SHARED_CTAS) whose direct mode has no upper end
  // (auto, or MKERNEL_DIRECT_MAX_BYTES=0): no collective takes the doorbell (pathOf: eager ones are
  // LL, inbox or direct; captured ones the launch path, MKERNEL_GRAPH_LAUNCH being on), so the
  // persistent kernels never run and hold no SM. Otherwise every co-located rank's may be resident
  // (a stream's doorbell queued behind a launch-path op keeps it alive) and the launch-path
  // kernels must fit beside them.
  const bool doorbellUnused = peers_.sharedDirect && directUnbounded();
  const int freeSms = smsLeft + kReservedSms - (doorbellUnused ? 0 : ranksHere * params_.nCtas);
  auto capFor = [&](int ctasPerSm, int64_t want) {
    return static_cast<int32_t>(std::max(1, std::min(static_cast<int>(want), freeSms * std::max(ctasPerSm, 1) / ranksHere)));
  };
  // Direct mode's CTAs, a power of two: one H200, AllReduce of 64 MiB to 1 GiB with 2
  // emulated ranks at 64 CTAs each 77-93% of the copy bandwidth, at 60 CTAs 69-78%; 4 ranks at 32
  // CTAs 78-93%, at 29 69-81% (every CTA's part then starts at a power-of-two fraction of the
  // range). With ranks sharing a GPU in direct mode (MKERNEL_SHARED_CTAS), as many as fit.
  const int64_t askedDirect = peers_.sharedDirect ? kLaunchMaxCtas : asked;
  std::vector<int32_t> caps(2 * static_cast<size_t>(opts_.nRanks), 0);
  caps[2 * static_cast<size_t>(opts_.rank)] = capFor(perSm, asked);
  caps[2 * static_cast<size_t>(opts_.rank) + 1] =
      (params_.ownKernels & kOwnKernelDirect) != 0 ? capFor(perSmDirect, askedDirect) : 0;
  MK_CHECK(bs_->allGather(caps.data(), 2 * sizeof(int32_t)));
  int32_t cap = caps[0], directCap = caps[1];
  for (int k = 0; k < opts_.nRanks; ++k) {
    cap = std::min(cap, caps[2 * static_cast<size_t>(k)]);
    directCap = std::min(directCap, caps[2 * static_cast<size_t>(k) + 1]);
  }
  // The most ranks on one GPU (direct mode's upper end, directTakes): the same on every rank.
  std::vector<int32_t> here(static_cast<size_t>(opts_.nRanks), 0);
  here[static_cast<size_t>(opts_.rank)] = ranksHere;
  MK_CHECK(bs_->allGather(here.data(), sizeof(int32_t)));
  directSharing_ = 1;
  for (int32_t h : here) directSharing_ = std::max(directSharing_, static_cast<int>(h));
  launchCap_ = std::max(1, static_cast<int>(cap));
  // A rank with MKERNEL_DIRECT_KERNEL=shared sent 0: then direct mode keeps launchKernel's count
  // everywhere (the kernel is each rank's own choice; the split must be the same on every rank).
  directCap_ = directCap > 0 ? static_cast<int>(directCap) : launchCap_;
  while ((directCap_ & (directCap_ - 1)) != 0) directCap_ &= directCap_ - 1;  // the power of two below
  // LL mode's limit (MKERNEL_LL_MAX_BYTES): the smallest any rank asked for, so that every rank
  // takes the same ops; off with the launch path.
  // auto: kLlAutoMaxBytes, or kLlSharedMaxBytes with more than two ranks on this GPU; never more
  // than the slots hold with this many ranks (llLimit, launch_path.h).
  uint64_t llWant = ~0ull;
  if (const std::optional<int64_t> v = params::LL_MAX_BYTES()) llWant = static_cast<uint64_t>(*v);
  const int64_t llAsked = static_cast<int64_t>(llLimit(llWant, opts_.nRanks, ranksHere));
  std::vector<int64_t> lls(static_cast<size_t>(opts_.nRanks), 0);
  // Off for emulated nodes (their collectives take the doorbell, pathOf), so that the statistics
  // report what runs.
  const bool hier = perNode_ > 0 && perNode_ < opts_.nRanks;
  lls[static_cast<size_t>(opts_.rank)] = launchMaxBytes_ > 0 && !hier ? llAsked : 0;
  MK_CHECK(bs_->allGather(lls.data(), sizeof(int64_t)));
  int64_t llMax = lls[0];
  for (int64_t v : lls) llMax = std::min(llMax, v);
  llMaxBytes_ = static_cast<uint64_t>(llMax);
  // At most kLaunchBytesPerCta per CTA: beyond that the doorbell path's CTAs move it faster.
  launchMaxBytes_ = std::min<uint64_t>(launchMaxBytes_, static_cast<uint64_t>(launchCap_) * kLaunchBytesPerCta);
  MK_INFO(kLogInit, "rank %d: launch path for eager collectives up to %llu bytes (LL mode up to %llu bytes per peer), at most %d CTAs x %d threads per op; direct mode at most %d CTAs x %d threads",
          opts_.rank, static_cast<unsigned long long>(launchMaxBytes_), static_cast<unsigned long long>(llMaxBytes_),
          launchCap_, kLaunchThreads, directCap_,
          (params_.ownKernels & kOwnKernelDirect) != 0 ? kDirectThreads : kLaunchThreads);
  return Result::Success;
}

// MKERNEL_HIER_ROLES: "off" (or 0), or "W,R": the hierarchical AllReduce runs each lane on one
// sender, W worker and R reducer CTAs (collectives/hier_staged.h, "CTA roles"), pipelined, or in
// turn with MKERNEL_HIER_OVERLAP=0. Rank 0's value is every rank's: the CTAs'
// roles must match their peers'. Needs hierCtas_ x (1 + W + R) CTAs in the persistent kernel.
Result KernelCommunicator::agreeHierRoles() {
  const std::string& v = params::HIER_ROLES();
  int32_t wr[2] = {0, 0};
  if (!v.empty() && v != "off" && v != "0") {
    int w = 0, r = 0;
    char tail = 0;
    if (std::sscanf(v.c_str(), "%d,%d%c", &w, &r, &tail) != 2 || w < 1 || w > kMaxHierRoleCtas || r < 1 ||
        r > kMaxHierRoleCtas)
      return MK_ERROR(Result::InvalidArgument, "MKERNEL_HIER_ROLES=%s: want off, or W,R (workers and reducers per lane, 1..%d each)",
                      v.c_str(), kMaxHierRoleCtas);
    wr[0] = w;
    wr[1] = r;
  }
  std::vector<int32_t> all(2 * static_cast<size_t>(opts_.nRanks), 0);
  std::memcpy(&all[2 * static_cast<size_t>(opts_.rank)], wr, sizeof(wr));
  MK_CHECK(bs_->allGather(all.data(), sizeof(wr)));
  hierWorkers_ = all[0];
  hierReducers_ = all[1];
  if (hierWorkers_ == 0) return Result::Success;
  const int need = hierRoleCtas(hierCtas_, hierWorkers_, hierReducers_);
  if (need > peers_.nCtas)
    return MK_ERROR(Result::InvalidArgument,
                    "rank %d: MKERNEL_HIER_ROLES=%d,%d with %d lane(s) (MKERNEL_HIER_CTAS) needs %d CTAs; the persistent "
                    "kernel has %d (MKERNEL_CTAS)",
                    opts_.rank, hierWorkers_, hierReducers_, hierCtas_, need, peers_.nCtas);
  return Result::Success;
}

// MKERNEL_HIER_RAIL: direct, ring or rhd (collectives/hier_staged.h, "The AllReduce's exchange
// among the rail"), and MKERNEL_HIER_AHEAD: 1 or 2 chunks (the pipelined direct AllReduce's
// look-ahead, hierAllReduce). Rank 0's values are every rank's: the steps of a chunk, and the
// order of the rounds, must match the peers'. rhd on a node count that is not a power of two runs
// ring. Every rail form runs in CTA roles too.
Result KernelCommunicator::agreeHierRail() {
  const int32_t asked = coll::hierRailByName(params::HIER_RAIL.text());
  if (asked < 0)
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_HIER_RAIL=%s: want direct, ring or rhd", params::HIER_RAIL.text());
  const int64_t ahead = params::HIER_AHEAD();
  std::vector<int32_t> all(2 * static_cast<size_t>(opts_.nRanks), 0);
  all[2 * static_cast<size_t>(opts_.rank)] = asked;
  all[2 * static_cast<size_t>(opts_.rank) + 1] = static_cast<int32_t>(ahead);
  MK_CHECK(bs_->allGather(all.data(), 2 * sizeof(int32_t)));
  const int N = opts_.nRanks / perNode_;
  hierRail_ = coll::hierRailFor(all[0], N);
  hierAhead_ = all[1];
  if (hierRail_ != all[0])
    MK_INFO(kLogInit, "rank %d: MKERNEL_HIER_RAIL=rhd needs a power-of-two node count; %d nodes exchange in a ring",
            opts_.rank, N);
  return Result::Success;
}

Result KernelCommunicator::setupProxy() {
  const int G = perNode_, N = opts_.nRanks / G, node = opts_.rank / G, local = opts_.rank % G;
  // CTAs per hierarchical collective (MKERNEL_HIER_CTAS): at most the kernel's CTAs (each needs
  // its staged regions) and kMaxHierCtas; the smallest any rank asks for, so that every rank
  // splits each collective alike and creates as many proxy channels as its rail peers.
  const int64_t asked = params::HIER_CTAS();
  if (asked < 1 || asked > kMaxHierCtas)
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_HIER_CTAS=%lld outside 1..%d", static_cast<long long>(asked), kMaxHierCtas);
  std::vector<int32_t> ctas(static_cast<size_t>(opts_.nRanks), 0);
  ctas[static_cast<size_t>(opts_.rank)] = static_cast<int32_t>(std::min<int64_t>(asked, peers_.nCtas));  // params_.nCtas is set later
  MK_CHECK(bs_->allGather(ctas.data(), sizeof(int32_t)));
  hierCtas_ = std::max(1, static_cast<int>(*std::min_element(ctas.begin(), ctas.end())));
  // Collectives below MKERNEL_HIER_SPLIT_MIN_BYTES run on one CTA (hierCtasFor): the same
  // threshold on every rank, the largest asked.
  const int64_t split = params::HIER_SPLIT_MIN_BYTES();
  std::vector<int64_t> splits(static_cast<size_t>(opts_.nRanks), 0);
  splits[static_cast<size_t>(opts_.rank)] = split;
  MK_CHECK(bs_->allGather(splits.data(), sizeof(int64_t)));
  hierSplitMinBytes_ = static_cast<uint64_t>(*std::max_element(splits.begin(), splits.end()));
  MK_CHECK(agreeHierRoles());
  MK_CHECK(agreeHierRail());
  const size_t C = static_cast<size_t>(hierCtas_);
  void* host = nullptr;
  MK_CUDA(MemCache::hostAlloc(C * sizeof(proxy::ProxyRing), cudaHostAllocMapped | cudaHostAllocPortable, &host), "cudaHostAlloc(proxy rings)");
  proxyRing_ = static_cast<proxy::ProxyRing*>(host);
  std::memset(host, 0, C * sizeof(proxy::ProxyRing));
  MK_CUDA(MemCache::hostAlloc(C * sizeof(proxy::ProxyFlags), cudaHostAllocMapped | cudaHostAllocPortable, &host), "cudaHostAlloc(proxy flags)");
  proxyFlags_ = static_cast<proxy::ProxyFlags*>(host);
  std::memset(host, 0, C * sizeof(proxy::ProxyFlags));
  // The proxy's transport: verbs when an RDMA device is usable (this GPU's rail NICs first, from the
  // topology placement), else TCP; MKERNEL_NET_BACKEND=ib|tcp forces one (transport/net/backend.h).
  net::BackendChoice choice;
  if (coll::createProxyNet(opts_.cudaDev, &choice) != Result::Success)
    return MK_ERROR(Result::SystemError, "rank %d: emulated nodes: no transport for the proxy: %s", opts_.rank,
                    lastError());
  net_ = std::move(choice.net);
  // Its net buffers in GPU memory where the backend registers it, else host-mapped
  // (MKERNEL_PROXY_GDR, coll::proxyMemoryFor).
  net::DeviceProps props;
  MK_CHECK(net_->getProperties(0, &props));
  // The rail's speed, as the selection policy's cost model reads it (CollStats::railMbps): the
  // slowest rank's device, so that every rank predicts alike.
  std::vector<int32_t> speeds(static_cast<size_t>(opts_.nRanks), 0);
  speeds[static_cast<size_t>(opts_.rank)] = static_cast<int32_t>(std::max(0, props.speedMbps));
  MK_CHECK(bs_->allGather(speeds.data(), sizeof(int32_t)));
  railMbps_ = *std::min_element(speeds.begin(), speeds.end());
  int ordering = 0;
  if (cudaDeviceGetAttribute(&ordering, cudaDevAttrGPUDirectRDMAWritesOrdering, opts_.cudaDev) != cudaSuccess) {
    (void)cudaGetLastError();
    ordering = 0;  // unknown: flush
  }
  coll::ProxyMemory mem;
  if (coll::proxyMemoryFor(params::PROXY_GDR.text(), props.ptrSupport, net_->name(), ordering, &mem) != Result::Success)
    return MK_ERROR(Result::InvalidArgument, "rank %d: %s", opts_.rank, lastError());
  // One CTA (lane): kHierNetSlots net slots, each a send buffer and a receive buffer per node.
  const size_t netBytes = static_cast<size_t>(coll::kHierNetSlots) * static_cast<size_t>(N + 1) * params_.stagedChunkBytes;
  netBufGpu_ = mem.gpu;
  if (mem.gpu) {
    MK_CUDA(MemCache::deviceAlloc(opts_.cudaDev, C * netBytes, &host), "cudaMalloc(net buffers)");
  } else {
    MK_CUDA(MemCache::hostAlloc(C * netBytes, cudaHostAllocMapped | cudaHostAllocPortable, &host), "cudaHostAlloc(net buffers)");
  }
  netBuf_ = static_cast<char*>(host);
  // The kernel writes host addresses into proxy commands: the mapping must be the identity (UVA).
  for (void* h : {static_cast<void*>(proxyRing_), static_cast<void*>(proxyFlags_), mem.gpu ? nullptr : static_cast<void*>(netBuf_)}) {
    if (h == nullptr) continue;
    void* dev = nullptr;
    MK_CUDA(cudaHostGetDevicePointer(&dev, h, 0), "cudaHostGetDevicePointer(proxy memory)");
    if (dev != h)
      return MK_ERROR(Result::SystemError, "rank %d: emulated nodes need unified addressing (host %p is device %p)",
                      opts_.rank, h, dev);
  }
  std::vector<proxy::ProxyChannel> channels;
  for (size_t c = 0; c < C; ++c) channels.push_back(proxy::ProxyChannel{proxyRing_ + c, proxyFlags_ + c});
  proxy_.reset(new proxy::Proxy(net_.get(), 0, node, N, channels));
  // Its ranks are the nodes: its messages (kernelError's proxy report among them) say so.
  proxy_->setNames("rank " + std::to_string(opts_.rank) + " (node " + std::to_string(node) + ", rail " +
                       std::to_string(local) + ")",
                   "node");
  std::vector<proxy::Handle> mine;
  MK_CHECK(proxy_->listenHandles(&mine));
  // Every rank's N listen handles (its own slot empty; each holds one handle per channel); rank
  // (k, j) connects to (m, j)'s handle k.
  const size_t hs = net::kHandleSize * C;
  std::vector<uint8_t> all(static_cast<size_t>(opts_.nRanks) * static_cast<size_t>(N) * hs, 0);
  for (int m = 0; m < N; ++m)
    if (mine[static_cast<size_t>(m)].size() == hs)
      std::memcpy(&all[(static_cast<size_t>(opts_.rank) * static_cast<size_t>(N) + static_cast<size_t>(m)) * hs],
                  mine[static_cast<size_t>(m)].data(), hs);
  MK_CHECK(bs_->allGather(all.data(), static_cast<size_t>(N) * hs));
  std::vector<proxy::Handle> fromPeers(static_cast<size_t>(N));
  for (int m = 0; m < N; ++m) {
    if (m == node) continue;
    const size_t peer = static_cast<size_t>(m * G + local);
    const uint8_t* h = &all[(peer * static_cast<size_t>(N) + static_cast<size_t>(node)) * hs];
    fromPeers[static_cast<size_t>(m)].assign(h, h + hs);
  }
  MK_CHECK(proxy_->connectAll(fromPeers));
  if (proxy_->registerRegion(netBuf_, C * netBytes, mem.gpu ? net::kPtrCuda : net::kPtrHost) != Result::Success)
    return MK_ERROR(Result::SystemError, "rank %d: the proxy's net buffers in %s: %s%s", opts_.rank, mem.why.c_str(),
                    lastError(), mem.gpu ? "; MKERNEL_PROXY_GDR=0 keeps them in host memory" : "");
  proxy_->setFlushReceives(mem.flush);
  MK_INFO(kLogInit | kLogProxy, "rank %d: proxy net buffers (%zu bytes) in %s", opts_.rank, C * netBytes, mem.why.c_str());
  // The proxy thread near its NIC (docs/TOPOLOGY.md): the placement's CPUs, MKERNEL_PROXY_PIN.
  std::string pinWhy;
  const std::vector<int> proxyCpus = coll::proxyCpusFor(opts_.cudaDev, &pinWhy);
  MK_CHECK(proxy_->start(proxyCpus));
  MK_INFO(kLogInit | kLogProxy, "rank %d: proxy %s", opts_.rank, pinWhy.c_str());
  params_.proxyRing = proxyRing_;
  params_.proxyFlags = proxyFlags_;
  params_.netBuf = netBuf_;
  params_.netBufBytes = netBytes;
  params_.hierCtas = hierCtas_;
  params_.hierWorkers = hierWorkers_;
  params_.hierReducers = hierReducers_;
  params_.hierRail = hierRail_;
  params_.hierKeepOwn = params::HIER_KEEP_OWN() ? 1u : 0u;
  params_.hierAhead = hierAhead_;
  params_.nNodes = N;
  params_.perNode = G;
  const bool direct = hierRail_ == coll::kRailDirect;
  const bool dataParallelDirect = direct && hierWorkers_ == 0;  // the AllReduce's look-ahead applies
  MK_INFO(kLogInit,
          "rank %d: %s node %d of %d (%d ranks each): proxy on rail %d over %s (%s; the slowest rank's device %d Mb/s), %d CTA(s) "
          "per collective from %llu bytes, 1 below; AllReduce/ReduceScatter/AllGather exchange among the rail %s, AllReduce %s%s%s",
          opts_.rank, opts_.emulate ? "emulated" : "host", node, N, G, local, net_->name(), choice.why.c_str(), railMbps_, hierCtas_,
          static_cast<unsigned long long>(hierSplitMinBytes_),
          hierRail_ == coll::kRailRing   ? "ring (Broadcast/Reduce: binomial tree)"
          : hierRail_ == coll::kRailRhd ? "rhd (recursive halving/doubling; Broadcast/Reduce: binomial tree)"
                                        : "direct",
          hierWorkers_ == 0 ? "on data-parallel CTAs"
                            : ("in CTA roles: each lane 1 sender, " + std::to_string(hierWorkers_) + " worker(s), " +
                               std::to_string(hierReducers_) + " reducer(s)").c_str(),
          !dataParallelDirect ? ""
          : hierAhead_ == 2   ? ", pipelined two chunks ahead (three net slots)"
                              : ", pipelined one chunk ahead (MKERNEL_HIER_AHEAD=1)",
          // MKERNEL_HIER_KEEP_OWN (collectives/hier_staged.h: hierArKeepOwn, HierStepsBase::keepOwn)
          !direct                    ? ""
          : params_.hierKeepOwn == 0 ? "; each rank's own piece through the net send buffer (MKERNEL_HIER_KEEP_OWN=0)"
          : hierWorkers_ == 0        ? "; each rank's own piece stays in device memory"
                                     : "; each rank's own piece stays in device memory (not in the AllReduce's CTA roles)");
  return Result::Success;
}

Result KernelCommunicator::fillDesc(const CollArgs& a, WorkDesc* d) const {
  std::memset(d, 0, sizeof(*d));
  const size_t esz = dataTypeSize(a.dtype);
  if (esz == 0) return MK_ERROR(Result::InvalidArgument, "rank %d: bad datatype %d", opts_.rank, static_cast<int>(a.dtype));
  if ((a.coll == CollType::Broadcast || a.coll == CollType::Reduce) && (a.root < 0 || a.root >= opts_.nRanks))
    return MK_ERROR(Result::InvalidArgument, "rank %d: root %d outside 0..%d", opts_.rank, a.root, opts_.nRanks - 1);
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
    if (a.algo == static_cast<int32_t>(Algo::OneShot) || a.algo == static_cast<int32_t>(Algo::TwoShot))
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
  const bool ring = (a.algo == static_cast<int32_t>(Algo::Ring) || (a.algo < 0 && peers_.ring)) &&
                    ringTakes(ringMinBytes_, llTakes(llPayloadBytes(a.count, esz), llMaxBytes_, opts_.nRanks),
                              directWholeBytes(a.coll, a.count, opts_.nRanks, esz));
  if (ring && peers_.staged && params_.nNodes == 1 && opts_.nRanks > 1) d->algo = static_cast<int32_t>(Algo::Ring);
  d->nCtas = splitCtas(shareBytes(a.coll, a.count, a.dtype, opts_.nRanks), params_.nCtas);
  if (a.coll == CollType::AllReduce && static_cast<Algo>(d->algo) == Algo::OneShot) d->nCtas = 1;
  // Hierarchical: MKERNEL_HIER_CTAS CTAs from MKERNEL_HIER_SPLIT_MIN_BYTES, else one; each posts
  // to its own proxy channel. CTAs whose slice is empty (small counts) return at once, alike on
  // every rank.
  if (params_.nNodes > 1) {
    const uint64_t whole = directWholeBytes(a.coll, a.count, opts_.nRanks, esz);
    d->nCtas = static_cast<int32_t>(hierCtasFor(whole, hierCtas_, hierSplitMinBytes_));
    // CTA roles: every lane's CTAs take part (those of lanes beyond the op's skip it in the kernel).
    if (hierRolesFor(a.coll, whole, hierWorkers_, hierSplitMinBytes_)) {
      d->hierLanes = d->nCtas;
      d->nCtas = hierRoleCtas(hierCtas_, hierWorkers_, hierReducers_);
    }
  }
  if (a.coll == CollType::AllReduce || a.coll == CollType::ReduceScatter || a.coll == CollType::Reduce) {
    MK_CHECK(makeDevRedOp(a.op, a.dtype, opts_.nRanks, a.scalar, &d->redOp));
  }
  return Result::Success;
}

Result KernelCommunicator::takeEagerSlot(int* slot) {
  const int s = static_cast<int>(eagerCount_ % kEagerSlots);
  if (slotUsed_[s]) {
    // The caller's stream must have passed this slot's wait before we reuse it.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(params::TIMEOUT_S());
    for (;;) {
      cudaError_t q = cudaEventQuery(slotEvents_[s]);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady)
        return MK_ERROR(Result::UnhandledCudaError, "rank %d: waiting for work slot %d: %s", opts_.rank, s, cudaGetErrorString(q));
      if (ctl_->abortFlag) return MK_ERROR(Result::RemoteError, "rank %d: communicator aborted", opts_.rank);
      if (ctl_->failed) return kernelError();
      if (std::chrono::steady_clock::now() > deadline)
        return MK_ERROR(Result::InternalError,
                        "rank %d: timed out waiting for work slot %d (%d collectives in flight on the caller's streams)",
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
  MK_TRACE(kLogColl, "rank %d: persistent kernel launched (%llu)", opts_.rank, static_cast<unsigned long long>(launches_));
  return Result::Success;
}

// Whether `stream` is being captured (an invalidated capture is an error).
Result KernelCommunicator::captureOf(cudaStream_t stream, bool* capturing) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  MK_CUDA(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (capture == cudaStreamCaptureStatusInvalidated)
    return MK_ERROR(Result::InvalidUsage, "rank %d: the stream's capture was invalidated", opts_.rank);
  *capturing = capture == cudaStreamCaptureStatusActive;
  return Result::Success;
}

Result KernelCommunicator::checkUsable() {
  if (finalized_) return MK_ERROR(Result::InvalidUsage, "rank %d: enqueue on a finalized communicator", opts_.rank);
  if (aborted_) return MK_ERROR(Result::InvalidUsage, "rank %d: enqueue on an aborted communicator", opts_.rank);
  if (ctl_->failed) return kernelError();
  MK_CUDA(cudaSetDevice(opts_.cudaDev), "cudaSetDevice");
  return Result::Success;
}

Result KernelCommunicator::enqueue(const CollArgs* ops, int n, cudaStream_t stream) {
  if (ops == nullptr || n < 0) return MK_ERROR(Result::InvalidArgument, "rank %d: enqueue of %d ops at %p", opts_.rank, n, static_cast<const void*>(ops));
  std::lock_guard<std::mutex> lock(mu_);
  MK_CHECK(checkUsable());
  bool capturing = false;
  MK_CHECK(captureOf(stream, &capturing));
  MK_TRACE(kLogColl, "rank %d: enqueue of %d op(s) (%s, first count %zu) on stream %p%s", opts_.rank, n,
           n > 0 ? collName(ops[0].coll) : "-", n > 0 ? ops[0].count : size_t(0), static_cast<void*>(stream),
           capturing ? ", capturing" : "");
  if (fence_ != nullptr && !capturing) {
    // Ranks sharing this GPU: one launch at a time (an op, or a run of ops that make one LL
    // batch), each start fenced before its end wait is queued.
    for (int i = 0; i < n;) {
      // The run enqueueLocked makes one LL batch of (the same rules: kMaxOpsPerSlot, one slot's lines).
      int run = 1;
      uint64_t lines = 0;
      if (batchableArgs(ops[i], &lines))
        for (uint64_t more = 0; run < kMaxOpsPerSlot && i + run < n && batchableArgs(ops[i + run], &more) &&
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
      MK_WARN("rank %d: collective %llu has waited %.0f s for rank %d, which shares GPU %d in this process, to post its "
              "part (a thread that drives several such ranks must call their collectives inside a group); waiting up "
              "to MKERNEL_TIMEOUT_S=%.0f s",
              opts_.rank, seq, first, lag, opts_.cudaDev, timeout);
      outcome = fence_->wait(fenceMember_, fenceSeq_, timeout - first, stop, &lag);
    }
    switch (outcome) {
      case PostFence::Outcome::kPassed:
        break;
      case PostFence::Outcome::kStopped:
        res = ctl_->failed ? kernelError()
                           : MK_ERROR(Result::RemoteError, "rank %d: aborted while waiting for rank %d (same GPU, this process) to post collective %llu",
                                      opts_.rank, lag, seq);
        break;
      case PostFence::Outcome::kLeft:
        res = MK_ERROR(Result::RemoteError,
                       "rank %d: rank %d, which shares GPU %d in this process, was finalized or aborted before posting "
                       "collective %llu of this communicator (ranks must call the same collectives)",
                       opts_.rank, lag, opts_.cudaDev, seq);
        break;
      case PostFence::Outcome::kSameThread:
        res = MK_ERROR(Result::InvalidUsage,
                       "rank %d: rank %d shares GPU %d in this process and is driven by this same thread, which has not "
                       "posted its part of collective %llu: a thread driving several ranks must call their collectives "
                       "between ncclGroupStart and ncclGroupEnd (as NCCL requires)",
                       opts_.rank, lag, opts_.cudaDev, seq);
        break;
      case PostFence::Outcome::kTimedOut:
        res = MK_ERROR(Result::RemoteError,
                       "rank %d: timed out after %.0f s waiting for rank %d, which shares GPU %d in this process, to post "
                       "collective %llu of this communicator (its thread has not called it; MKERNEL_POST_FENCE)",
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
      return cudrv::streamWaitValue32(t.stream, &state_->doorbell[t.slot], kDoorbellDone, cudrv::WaitCmp::Geq);
    case Tail::kSlotRecord:
      MK_CUDA(cudaEventRecord(slotEvents_[t.slot], t.stream), "cudaEventRecord(slot)");
      return Result::Success;
  }
  return Result::Success;
}

// Posts ops (mu_ held). With a fence and not capturing, exactly one launch (one op, or the ops of
// one LL batch): its start is queued, what waits for its end held for completeStartsLocked, and
// the fence told once a start was queued.
Result KernelCommunicator::enqueueLocked(const CollArgs* ops, int n, cudaStream_t stream, bool capturing) {
  const bool fenced = fence_ != nullptr && !capturing;
  const uint64_t startsBefore = startsQueued_;
  if (fenced) {
    if (fencePending_ || !heldTails_.empty()) MK_CHECK(completeStartsLocked());  // the previous op's first
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
    const Path path = pathOf(d, capturing);
    if (batchable(d, path)) {
      if (nOps > 0) res = postSlot(descs, nOps, capturing, stream);
      nOps = 0;
      // One exchange holds what one slot holds (every rank splits the same way).
      if (nBatch > 0 && batchLines + opLines(d) > llSlotLines(opts_.nRanks) && res == Result::Success) flushBatch();
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

KernelCommunicator::Path KernelCommunicator::pathOf(const WorkDesc& d, bool capturing) const {
  // Captured ops replay without the host: they take the launch path's graph namespace (the
  // device keeps its sequence numbers) or, with MKERNEL_GRAPH_LAUNCH=0, the doorbell (a
  // replayable protocol). Emulated nodes (the hierarchy through the proxies) take the doorbell.
  if ((capturing && !graphLaunch_) || launchMaxBytes_ == 0 || params_.nNodes > 1) return Path::kDoorbell;
  // Rings run in the persistent kernel only (the launch path's modes are all-to-all).
  if (static_cast<Algo>(d.algo) == Algo::Ring) return Path::kDoorbell;
  const CollType c = static_cast<CollType>(d.coll);
  const uint64_t bytes = launchPublishElems(c, d.count, opts_.nRanks) * dataTypeSize(static_cast<DataType>(d.dtype));
  // One rank: a copy (or PreMulSum's kernel) at any size; nothing to exchange.
  if (opts_.nRanks == 1) return Path::kLaunchInbox;
  // LL mode (launch_path.h): small ops push 16-byte lines, thread and process ranks alike.
  if (llTakes(llPayloadBytes(d.count, dataTypeSize(static_cast<DataType>(d.dtype))), llMaxBytes_, opts_.nRanks))
    return Path::kLaunchLl;
  if (bytes <= launchMaxBytes_) return Path::kLaunchInbox;
  if (!launchDirect_) return Path::kDoorbell;
  // Direct mode's upper end applies to eager ops: a captured op on the doorbell would keep the
  // persistent kernel resident for the graph's life (docs/KERNEL.md, "A product risk").
  if (capturing) return Path::kLaunchDirect;
  return directTakes(c, directWholeBytes(c, d.count, opts_.nRanks, dataTypeSize(static_cast<DataType>(d.dtype))),
                     directMaxBytes_, directSharing_, peers_.sharedDirect)
             ? Path::kLaunchDirect
             : Path::kDoorbell;
}

bool KernelCommunicator::capturedWithoutResidency(const CollArgs& op) const {
  if (op.count == 0) return true;  // a no-op: nothing is captured
  WorkDesc d;
  if (fillDesc(op, &d) != Result::Success) return false;  // (the shim validated it already)
  return pathOf(d, /*capturing=*/true) != Path::kDoorbell;
}

// One rank, eager, launch-path size: every collective but PreMulSum is a copy (Avg divides by 1;
// in place, nothing), which cudaMemcpyAsync does with less overhead than a kernel, as NCCL's
// own one-rank path. PreMulSum multiplies, so it takes the launch-path kernel.
bool KernelCommunicator::oneRankCopy(const CollArgs& a) const {
  if (opts_.nRanks != 1 || oneRankKernel_) return false;
  const bool reduces = a.coll == CollType::AllReduce || a.coll == CollType::ReduceScatter || a.coll == CollType::Reduce;
  return !(reduces && a.op == RedOp::PreMulSum);
}

Result KernelCommunicator::copyOneRank(const CollArgs& a, cudaStream_t stream) {
  const size_t bytes = a.count * dataTypeSize(a.dtype);
  if (a.sendbuff != a.recvbuff)
    MK_CUDA(cudaMemcpyAsync(a.recvbuff, a.sendbuff, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync (one rank)");
  ++startsQueued_;
  const int c = static_cast<int>(a.coll);
  {
    std::lock_guard<std::mutex> lock(statsMu_);
    ++oneRankCopies_[c];
  }
  globalStats().kernelOps[c].fetch_add(1, std::memory_order_relaxed);
  globalStats().launchOps[c].fetch_add(1, std::memory_order_relaxed);
  return Result::Success;
}

// Before a launch-path launch on `stream`: the order against the previous one.
Result KernelCommunicator::launchOrder(bool capturing, cudaStream_t stream) {
  // One launch-path op at a time per communicator and namespace (launch_path.h): an eager op on
  // another stream than the previous one waits for that op through launchEvent_ (recordEachOp_:
  // recorded after every op, so the old stream is never used again). A stream destroyed right
  // after an op and a new one at the same address, while that op still runs, would escape the
  // wait; waiting at every op would close that too, for half a microsecond of host time per
  // call, which every caller would pay.
  // Captured ops: only within one capture (a stream outside it cannot be waited for while
  // capturing); graphs holding collectives of one communicator must not run concurrently, as
  // with NCCL.
  if (capturing) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    MK_CUDA(cudaStreamGetCaptureInfo(stream, &st, &id), "cudaStreamGetCaptureInfo");
    if (lastGraphStream_ != nullptr && lastGraphStream_ != stream && id == lastGraphCapture_) {
      MK_CUDA(cudaEventRecord(graphEvent_, lastGraphStream_), "cudaEventRecord(launch path, capture)");
      MK_CUDA(cudaStreamWaitEvent(stream, graphEvent_, 0), "cudaStreamWaitEvent(launch path, capture)");
    }
    lastGraphStream_ = stream;
    lastGraphCapture_ = id;
  } else if (lastLaunchStream_ != nullptr && lastLaunchStream_ != stream && recordEachOp_) {
    MK_CUDA(cudaStreamWaitEvent(stream, launchEvent_, 0), "cudaStreamWaitEvent(launch path)");
  } else if (lastLaunchStream_ != nullptr && lastLaunchStream_ != stream) {
    if (cudaEventRecord(launchEvent_, lastLaunchStream_) == cudaSuccess) {
      MK_CUDA(cudaStreamWaitEvent(stream, launchEvent_, 0), "cudaStreamWaitEvent(launch path)");
    } else {
      (void)cudaGetLastError();  // that stream is gone: its work still completes, unordered
      MK_INFO(kLogColl, "rank %d: the stream of the previous launch-path collective is gone; not waiting for it",
              opts_.rank);
    }
  }
  return Result::Success;
}

// After an eager launch-path launch on runOn (the caller's stream): what the next launch orders
// itself after.
Result KernelCommunicator::launchQueued(cudaStream_t runOn, cudaStream_t stream, CollType last) {
  lastLaunchColl_ = collName(last);
  lastLaunchAt_ = std::chrono::steady_clock::now();
  if (recordEachOp_) MK_CUDA(cudaEventRecord(launchEvent_, runOn), "cudaEventRecord(launch path)");
  lastLaunchStream_ = runOn;
  return Result::Success;
}

// Whether an op joins an LL batch: LL mode, MKERNEL_LL_BATCH on (serial: ops of one CTA only).
// The same answer on every rank (pathOf and llCtas depend only on arguments every rank shares).
bool KernelCommunicator::batchable(const WorkDesc& d, Path path) const {
  return llBatch_ != LlBatchMode::Off && path == Path::kLaunchLl &&
         (llBatch_ == LlBatchMode::Exchange ||
          llCtas(llPayloadBytes(d.count, dataTypeSize(static_cast<DataType>(d.dtype))), launchCap_) == 1);
}

// The same for an eager op's arguments (the fenced enqueue's runs), with its lines; a no-op is not
// batchable.
bool KernelCommunicator::batchableArgs(const CollArgs& a, uint64_t* lines) const {
  if (llBatch_ == LlBatchMode::Off || a.count == 0) return false;
  WorkDesc d;
  if (fillDesc(a, &d) != Result::Success) return false;
  *lines = opLines(d);
  return batchable(d, pathOf(d, /*capturing=*/false));
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
Result KernelCommunicator::launchBatch(const WorkDesc* descs, int n, bool capturing, cudaStream_t stream) {
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
      // A twin (llPlanWaves): the same descriptor as an earlier op (fillDesc zeroes it whole), out of place.
      mem[i].twin = -1;
      if (!llOverlap(mem[i].send, mem[i].sendBytes, mem[i].recv, mem[i].recvBytes))
        for (int j = 0; j < i && mem[i].twin < 0; ++j)
          if (std::memcmp(&descs[i], &descs[j], sizeof(WorkDesc)) == 0) mem[i].twin = j;
    }
    ctas = llCtas(line * kLlLinePayload, launchCap_);
    waves = llPlanWaves(mem, n, ctas * (kLaunchThreads / 32));
    b.waveMask = waves.startMask;
    static_assert(sizeof(b.warpFirst) == sizeof(waves.warpFirst) && sizeof(b.warpCount) == sizeof(waves.warpCount),
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
    MK_CUDA(cudaEventRecord(watchPre_, runOn), "cudaEventRecord(launch watch)");
    watchEpoch_ = launchSeq_;
    watchColl_ = descs[n - 1].coll;
    watchIndex_ = b.opIndex[n - 1];
  }
  MK_CHECK(launchLlBatch(params_, b, ctas, runOn));
  startsQueued_ += static_cast<uint64_t>(n);
  MK_CHECK(launchQueued(runOn, stream, static_cast<CollType>(descs[n - 1].coll)));
  MK_TRACE(kLogColl,
           "rank %d: %d collectives launched as one LL batch (%s, epoch %llu, %llu lines, %d CTA(s), %d wave(s))",
           opts_.rank, n, b.exchange ? "one exchange" : "serial", static_cast<unsigned long long>(b.epoch),
           static_cast<unsigned long long>(line), ctas, waves.waves);
  return Result::Success;
}

Result KernelCommunicator::launchOp(const WorkDesc& desc, Path path, bool capturing, cudaStream_t stream) {
  const bool direct = path == Path::kLaunchDirect;
  const int mode = direct ? kLaunchModeDirect : path == Path::kLaunchLl ? kLaunchModeLl : kLaunchModeInbox;
  MK_CHECK(launchOrder(capturing, stream));
  WorkDesc d = desc;
  const CollType c = static_cast<CollType>(d.coll);
  const uint64_t bytes = launchPublishElems(c, d.count, opts_.nRanks) * dataTypeSize(static_cast<DataType>(d.dtype));
  int ctas = launchCtas(bytes, launchCap_);
  if (mode == kLaunchModeLl) {
    ctas = llCtas(llPayloadBytes(d.count, dataTypeSize(static_cast<DataType>(d.dtype))), launchCap_);
    ++llOps_;
  }
  if (direct) {
    // The persistent kernel's split (fillDesc), capped by the CTAs all ranks on a GPU can hold at
    // once. AllReduce: TwoShot, whose in-place use is safe (each part is read and written by its
    // owner only).
    ctas = splitCtas(shareBytes(c, d.count, static_cast<DataType>(d.dtype), opts_.nRanks), directCap_);
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
    MK_CUDA(cudaEventRecord(watchPre_, runOn), "cudaEventRecord(launch watch)");
    watchEpoch_ = launchSeq_;
    watchColl_ = d.coll;
    watchIndex_ = index;
  }
  MK_CHECK(launchCollective(params_, d, ctas, launchSeq_, index, mode, runOn));
  ++startsQueued_;
  MK_CHECK(launchQueued(runOn, stream, c));
  MK_TRACE(kLogColl, "rank %d: %s launched on the launch path (%s, epoch %llu, %d CTAs)", opts_.rank, collName(c),
           direct ? "direct" : mode == kLaunchModeLl ? "LL" : "inbox", static_cast<unsigned long long>(launchSeq_), ctas);
  return Result::Success;
}

Result KernelCommunicator::postSlot(const WorkDesc* descs, int nOps, bool capturing, cudaStream_t stream) {
  // Event queries and the persistent kernel's launch on the internal stream: calls that a
  // global-mode capture would otherwise refuse. (The launch path makes none: a kernel launch and
  // an event wait on the caller's stream are capture-safe.)
  RelaxedCaptureScope relaxed;
  int ctasNeeded = 0;
  for (int k = 0; k < nOps; ++k) ctasNeeded = std::max(ctasNeeded, descs[k].nCtas);
  int slot = -1;
  if (capturing) {
    if (kEagerSlots + graphSlots_ >= kMaxSlots)
      return MK_ERROR(Result::InvalidUsage, "rank %d: more than %d captured collective groups on one communicator",
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

Result KernelCommunicator::kernelError() const {
  // The record that names the cause (reportedErrorRecord): a wait for a peer or for the proxy,
  // before a CTA's wait for another CTA of this rank, which only follows from it. The sender of a
  // lane in CTA roles (CTA 0) may itself be waiting for a worker that waits for a peer.
  const int pick = reportedErrorRecord(ctl_->errors, kMaxCtas);
  if (pick >= 0) {
    const ErrorRecord& e = ctl_->errors[pick];
    const uint32_t what = *reinterpret_cast<const volatile uint32_t*>(&e.what);
    const char* coll = e.coll >= 0 && e.coll < kNumCollTypes ? collName(static_cast<CollType>(e.coll)) : "-";
    if (what == kWaitPeerStart || what == kWaitPeerEnd || what == kWaitPeerChunk || what == kWaitLaunchPeer ||
        what == kWaitLaunchPeerEnd) {
      // The peer's flag as the wait last read it (ErrorRecord keeps its low 32 bits): one behind
      // means the peer never reached this point; further behind, it is stuck earlier.
      const uint32_t behind = static_cast<uint32_t>(e.epoch) - e.observed;
      // Ranks sharing this GPU (emulation): a peer that never reached this point may have issued
      // the collective and still not run, CUDA holding its kernel back (docs/RELIABILITY.md); the
      // launch watch on that rank tells.
      const char* hint = behind == 1 && peers_.ranksOnMyDevice > 1
                             ? "; ranks share this GPU: if that rank issued the collective, its kernel has not run "
                               "(its MKERNEL_LAUNCH_WATCH report says why)"
                             : "";
      // Where this rank reads that peer's state (its address here; for thread ranks the peer's
      // own, which its "persistent kernel ready" INFO line gives).
      const void* at = e.peer >= 0 && e.peer < kMaxRanks ? static_cast<const void*>(params_.peers[e.peer]) : nullptr;
      return MK_ERROR(Result::RemoteError,
                      "rank %d (CTA %d): timed out after %llu s waiting for rank %d %s in %s (epoch %llu; rank %d's "
                      "flag read %llu, %u behind; its state at %p)%s",
                      e.rank, e.cta, static_cast<unsigned long long>(params_.timeoutNs / 1000000000ull), e.peer,
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
                      "rank %d (CTA %d): waiting for the proxy's inter-node transfers in %s failed or timed out (%llu s); %s",
                      e.rank, e.cta, coll, static_cast<unsigned long long>(params_.timeoutNs / 1000000000ull),
                      proxyReport_.c_str());
    }
    return MK_ERROR(Result::InternalError, "rank %d (CTA %d): timed out after %llu s waiting for %s",
                    e.rank, e.cta, static_cast<unsigned long long>(params_.timeoutNs / 1000000000ull), waitKindName(what));
  }
  return MK_ERROR(Result::InternalError, "rank %d: the persistent kernel stopped on a failure it did not record", opts_.rank);
}

Result KernelCommunicator::asyncError(bool queryDevice) {
  if (ctl_ == nullptr) return Result::Success;
  if (ctl_->failed) return kernelError();
  if (queryDevice && stream_ != nullptr) {
    cudaError_t q = cudaStreamQuery(stream_);
    if (q != cudaSuccess && q != cudaErrorNotReady)
      return MK_ERROR(Result::UnhandledCudaError, "rank %d: the persistent kernel failed: %s", opts_.rank, cudaGetErrorString(q));
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
  if (!lock.owns_lock() || watchEpoch_ == 0 || watchEpoch_ != launchSeq_ || watchReported_ == watchEpoch_) return;
  const double timeout = params::timeoutSeconds();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - lastLaunchAt_).count();
  if (waited < std::max(0.5, timeout / 2)) return;
  uint64_t done[8] = {}, graphDone[8] = {};
  if (readLaunchCounters(done, graphDone) != Result::Success) return;
  if (done[watchColl_] >= watchIndex_ || ctl_->failed) return;  // finished, or failed (reported so)
  watchReported_ = watchEpoch_;
  const cudaError_t pre = cudaEventQuery(watchPre_);
  (void)cudaGetLastError();
  const bool started = ctl_->launchStarted >= watchEpoch_;
  const char* where = started ? "its kernel started and waits inside the collective (a peer's report names what for)"
                      : pre == cudaSuccess
                          ? "the caller's stream is ready but its kernel has not started: CUDA holds it back "
                            "(another kernel, or an implicit synchronization such as a device-wide wait or a free)"
                          : "its kernel has not started: the work queued before it on the caller's stream has not completed";
  // Held back by CUDA: does the GPU still start new work elsewhere? An empty kernel on each of 8
  // fresh streams tells whether only this stream's hardware queue is held (they run) or nothing
  // new starts anywhere (none runs).
  char probe[160] = "";
  if (!started && pre == cudaSuccess)
    std::snprintf(probe, sizeof(probe), "; an empty kernel launched now on each of 8 fresh streams ran on %d of them within 0.2 s",
                  probeFreshStreams(8, 0.2));
  MK_WARN("rank %d: %s (launch path, epoch %llu) unfinished %.1f s after its launch: %s%s", opts_.rank, lastLaunchColl_,
          static_cast<unsigned long long>(watchEpoch_), waited, where, probe);
}

Result KernelCommunicator::abort() {
  // Another thread may be in finalize() or release() (the shim's exit handler aborts releases
  // still waiting for peers): the fence and the control block go away under abortMu_ only.
  std::lock_guard<std::mutex> lock(abortMu_);
  aborted_ = true;
  if (fence_ != nullptr) fence_->leave(fenceMember_);  // co-located peers stop waiting for this rank
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
      return MK_ERROR(Result::UnhandledCudaError, "rank %d: persistent kernel: %s", opts_.rank, cudaGetErrorString(q));
    if (std::chrono::steady_clock::now() > deadline)
      return MK_ERROR(Result::InternalError, "rank %d: the persistent kernel did not exit within %.0f s", opts_.rank, seconds);
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
    while (!allDone() && !ctl_->failed && !ctl_->abortFlag && std::chrono::steady_clock::now() < deadline)
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
      MK_WARN("rank %d: persistent kernel still running at destruction; leaking its memory", opts_.rank);
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
    MK_INFO(kLogAlloc, "rank %d: released; the process's memory cache holds %zu blocks (%.1f MiB) for reuse, %llu "
            "reused so far (MKERNEL_DEFER_FREES)",
            opts_.rank, st.cachedBlocks, static_cast<double>(st.cachedBytes) / 1048576.0,
            static_cast<unsigned long long>(st.reused));
    MemCache::process().leave();
  }
}

Result KernelCommunicator::kernelTrace(std::vector<uint64_t>* out) const {
  if (trace_ == nullptr) return MK_ERROR(Result::InvalidUsage, "rank %d: kernel tracing is off (MKERNEL_KERNEL_TRACE=1)", opts_.rank);
  std::vector<KernelTraceRecord> recs(kTraceDepth);
  // Into pinned memory (a pageable device-to-host copy would hold the driver's staging path while
  // peers' kernels may still need this process), on a stream of its own (stream_ is busy with the
  // persistent kernel); both allocated at init.
  cudaError_t err = cudaMemcpyAsync(traceHost_, trace_, sizeof(KernelTraceRecord) * kTraceDepth,
                                    cudaMemcpyDeviceToHost, traceStream_);
  if (err == cudaSuccess) err = cudaStreamSynchronize(traceStream_);
  if (err == cudaSuccess) std::memcpy(recs.data(), traceHost_, sizeof(KernelTraceRecord) * kTraceDepth);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "rank %d: reading the kernel trace: %s", opts_.rank, cudaGetErrorString(err));
  std::sort(recs.begin(), recs.end(), [](const KernelTraceRecord& a, const KernelTraceRecord& b) { return a.seq < b.seq; });
  out->clear();
  for (const KernelTraceRecord& r : recs) {
    if (r.seq == 0) continue;
    out->push_back(r.seq);
    for (int i = 0; i < kTracePoints; ++i) out->push_back(r.t[i]);
    for (int i = 0; i < kTracePoints; ++i) out->push_back(r.c[i]);
  }
  return Result::Success;
}

static_assert(offsetof(DeviceState, hierWait) == offsetof(DeviceState, hierTurn) + 4 * sizeof(uint64_t) &&
                  offsetof(DeviceState, hierBusy) == offsetof(DeviceState, hierTurn) + 7 * sizeof(uint64_t) &&
                  7 + kHierBusyKinds == kHierCounters,
              "readLaunchCounters copies hierTurn, hierMark, hierWait and hierBusy as one run");
static_assert(sizeof(CollStats::hierBusyNs) == kHierBusyKinds * sizeof(uint64_t), "CollStats::hierBusyNs has every HierBusy");

Result KernelCommunicator::readLaunchCounters(uint64_t* done, uint64_t* graph, uint64_t* hierTurn) const {
  std::lock_guard<std::mutex> lock(counterMu_);
  if (state_ == nullptr || counterHost_ == nullptr) return Result::InvalidUsage;  // released: nothing to read
  RelaxedCaptureScope relaxed;  // a copy on our own stream, legal while the caller captures
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
    err = cudaMemcpyAsync(counterHost_, state_->launchDone, 8 * sizeof(uint64_t), cudaMemcpyDeviceToHost, counterStream_);
  if (err == cudaSuccess)
    err = cudaMemcpyAsync(counterHost_ + 8, state_->graphOps, 8 * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                          counterStream_);
  if (err == cudaSuccess && hierTurn != nullptr)
    err = cudaMemcpyAsync(counterHost_ + 16, state_->hierTurn, kHierCounters * sizeof(uint64_t), cudaMemcpyDeviceToHost, counterStream_);
  if (err == cudaSuccess) {
    // Polled, not cudaStreamSynchronize: that call cannot give up.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kCounterReadBoundS);
    for (int polls = 0; (err = cudaStreamQuery(counterStream_)) == cudaErrorNotReady; ++polls) {
      if (std::chrono::steady_clock::now() >= deadline) {
        counterCopyPending_ = true;
        if (countersLate_++ == 0)
          MK_WARN("rank %d: a copy of the launch path's counters (device memory) did not arrive within %.2f s: it waits in "
                  "a hardware queue behind other work, such as a copy that another stream queued after a collective "
                  "that has not finished (streams share CUDA_DEVICE_MAX_CONNECTIONS queues); until it arrives, the "
                  "statistics leave out launch-path collectives finished since the last read (mkernelGetStats: "
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
    return MK_ERROR(Result::UnhandledCudaError, "rank %d: reading the launch path's counters: %s", opts_.rank,
                    cudaGetErrorString(err));
  std::memcpy(done, counterHost_, 8 * sizeof(uint64_t));
  std::memcpy(graph, counterHost_ + 8, 8 * sizeof(uint64_t));
  if (hierTurn != nullptr) std::memcpy(hierTurn, counterHost_ + 16, kHierCounters * sizeof(uint64_t));
  return Result::Success;
}

void KernelCommunicator::foldStats(bool device) const {
  if (ctl_ == nullptr) return;
  uint64_t done[8] = {}, graphDone[8] = {}, turn[kHierCounters] = {};
  const bool haveLaunch = device && readLaunchCounters(done, graphDone, params_.nNodes > 1 ? turn : nullptr) == Result::Success;
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
      globalStats().kernelOps[c].fetch_add(graphDone[c] - foldedGraph_[c], std::memory_order_relaxed);
      globalStats().launchOps[c].fetch_add(graphDone[c] - foldedGraph_[c], std::memory_order_relaxed);
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
  out->directThreads = !launchDirect_ ? 0 : (params_.ownKernels & kOwnKernelDirect) != 0 ? kDirectThreads : kLaunchThreads;
  out->directCtas = launchDirect_ ? directCap_ : 0;
  out->sharedDirect = peers_.sharedDirect;
  out->persistentCtas = params_.nCtas;
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

}  // namespace

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
