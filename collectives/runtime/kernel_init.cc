// Creation of a KernelCommunicator: device state, peer memory, CTAs, the kernel's stack.
#include "collectives/runtime/kernel_communicator.h"

#ifdef MKERNEL_HAVE_DEVICE_CODE

namespace mkernel {
namespace coll {

Result KernelCommunicator::init() {
  // Before the first allocation: this communicator's blocks come from and go back to the
  // process's cache, and what is cached is freed only when the last user has left (mem_cache.h).
  MemCache::process().enter();
  memUser_ = true;
  MK_CUDA_CHECK(cudaSetDevice(opts_.cudaDev), "rank %d: cudaSetDevice", opts_.rank);
  MK_CHECK(cudrv::loadMemOps());
  int sms = 0;
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, opts_.cudaDev),
                "rank %d: SM count query", opts_.rank);
  int perSm = 0;
  MK_CHECK(persistentKernelCtasPerSm(&perSm));
  if (perSm < 1)
    return MK_ERROR(Result::InternalError,
                    "rank %d: the persistent kernel cannot be resident on GPU %d", opts_.rank,
                    opts_.cudaDev);
  const int64_t want = opts_.maxCtas > 0 ? opts_.maxCtas : params::CTAS();
  if (want < 1 || want > kMaxCtas)
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_CTAS=%lld outside 1..%d",
                    static_cast<long long>(want), kMaxCtas);

  MK_CHECK(reserveKernelStack(opts_.cudaDev));  // also loads the kernels before any of them runs
  oneShotMaxBytes_ = static_cast<uint64_t>(params::ONESHOT_MAX_BYTES());
  const int64_t launchMax = params::LAUNCH_MAX_BYTES();
  if (launchMax < 0 || static_cast<uint64_t>(launchMax) > kLaunchInboxBytes)
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_LAUNCH_MAX_BYTES=%lld outside 0..%llu",
                    static_cast<long long>(launchMax),
                    static_cast<unsigned long long>(kLaunchInboxBytes));
  launchMaxBytes_ = static_cast<uint64_t>(launchMax);
  if (const std::optional<int64_t> ringMin = params::RING_MIN_BYTES()) ringMinBytes_ = *ringMin;
  if (const std::optional<int64_t> directMax = params::DIRECT_MAX_BYTES())
    directMaxBytes_ = static_cast<uint64_t>(*directMax);
  MK_CUDA_CHECK(
      MemCache::deviceAlloc(opts_.cudaDev, sizeof(DeviceState), reinterpret_cast<void**>(&state_)),
      "rank %d: cudaMalloc(DeviceState)", opts_.rank);
  MK_CUDA_CHECK(cudaMemset(state_, 0, sizeof(DeviceState)), "rank %d: cudaMemset(DeviceState)",
                opts_.rank);
  MK_CUDA_CHECK(MemCache::hostAlloc((16 + kHierCounters) * sizeof(uint64_t), cudaHostAllocDefault,
                                    reinterpret_cast<void**>(&counterHost_)),
                "rank %d: cudaMallocHost(counters)", opts_.rank);
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&counterStream_, cudaStreamNonBlocking),
                "rank %d: cudaStreamCreate(counters)", opts_.rank);
  MK_CUDA_CHECK(
      MemCache::deviceAlloc(opts_.cudaDev, std::max<uint64_t>(oneShotMaxBytes_, 16), &staging_),
      "rank %d: cudaMalloc(staging)", opts_.rank);
  void* host = nullptr;
  MK_CUDA_CHECK(
      MemCache::hostAlloc(sizeof(HostControl), cudaHostAllocMapped | cudaHostAllocPortable, &host),
      "rank %d: cudaHostAlloc(control)", opts_.rank);
  ctl_ = static_cast<HostControl*>(host);
  std::memset(host, 0, sizeof(HostControl));
  MK_CUDA_CHECK(MemCache::hostAlloc(sizeof(WorkSlot) * kMaxSlots,
                                    cudaHostAllocMapped | cudaHostAllocPortable, &host),
                "rank %d: cudaHostAlloc(slots)", opts_.rank);
  slots_ = static_cast<WorkSlot*>(host);
  std::memset(host, 0, sizeof(WorkSlot) * kMaxSlots);
  MK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                "rank %d: cudaStreamCreate", opts_.rank);
  for (auto& ev : slotEvents_)
    MK_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "rank %d: cudaEventCreate",
                  opts_.rank);
  MK_CUDA_CHECK(cudaEventCreateWithFlags(&launchEvent_, cudaEventDisableTiming),
                "rank %d: cudaEventCreate(launch path)", opts_.rank);
  watch_ = params::LAUNCH_WATCH.is("off")   ? Watch::Off
           : params::LAUNCH_WATCH.is("all") ? Watch::All
                                            : Watch::First;
  params_.launchWatch = watch_ == Watch::Off ? 0u : watch_ == Watch::All ? 2u : 1u;
  if (watch_ != Watch::Off)
    MK_CUDA_CHECK(cudaEventCreateWithFlags(&watchPre_, cudaEventDisableTiming),
                  "rank %d: cudaEventCreate(launch watch)", opts_.rank);
  MK_CUDA_CHECK(cudaEventCreateWithFlags(&graphEvent_, cudaEventDisableTiming),
                "rank %d: cudaEventCreate(launch path, graphs)", opts_.rank);
  params_.graphEpilogueLight = params::GRAPH_EPILOGUE.is("light") ? 1u : 0u;
  // One numbering for eager and captured launch-path ops (launch_path.h), unless a test asks for
  // the host's (MKERNEL_EAGER_HOST_NUMBERS=1, agreed as every ROUTE setting).
  params_.deviceNumbers = params::EAGER_HOST_NUMBERS() ? 0u : 1u;
  const std::string pdl = params::PDL.text();
  int ccMajor = 0;
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&ccMajor, cudaDevAttrComputeCapabilityMajor, opts_.cudaDev),
                "rank %d: compute capability query", opts_.rank);
  // Programmatic dependent launch needs sm_90; early is narrowed after agreeLaunchCap.
  params_.pdl = ccMajor < 9 || pdl == "off" ? 0u : pdl == "wait" ? 1u : 2u;
  if (ccMajor < 9 && pdl != "off")
    MK_INFO(kLogInit,
            "rank %d: MKERNEL_PDL=%s ignored: GPU %d is sm_%d0, programmatic launch needs sm_90",
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
  MK_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy),
                "rank %d: cudaStreamSynchronize(legacy stream) after setup", opts_.rank);

  // Every rank reads what its GPU has left before any rank of this communicator reserves
  // (the exchange is collective), so ranks sharing a GPU split the same budget. Two
  // communicators created at the same moment on one GPU by different threads may both see the
  // whole budget: create communicators one after another (as PyTorch does).
  // Without a persistent kernel (CommOptions::persistentKernel) nothing is reserved: its CTA count
  // only splits descriptors, sized as if the GPU were free.
  const int smsLeft = SmBudget::process().available(opts_.cudaDev, sms);
  const int smsForKernel = opts_.persistentKernel ? smsLeft : std::max(smsLeft, sms - kReservedSms);
  const int64_t stagedChunk = params::STAGED_CHUNK_BYTES();
  if (stagedChunk < static_cast<int64_t>(kStagedMinChunkBytes) || stagedChunk > (int64_t(1) << 30))
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_STAGED_CHUNK_BYTES=%lld outside %llu..%llu",
                    static_cast<long long>(stagedChunk),
                    static_cast<unsigned long long>(kStagedMinChunkBytes), 1ull << 30);
  // Emulated nodes (MKERNEL_RANKS_PER_NODE in emulation): every collective runs hierarchically.
  const bool emulatedNodes =
      opts_.emulate && opts_.ranksPerNode > 0 && opts_.ranksPerNode < opts_.nRanks;
  if (emulatedNodes &&
      (opts_.nRanks % opts_.ranksPerNode != 0 || opts_.nRanks / opts_.ranksPerNode > kMaxHierNodes))
    return MK_ERROR(
        Result::InvalidArgument,
        "MKERNEL_RANKS_PER_NODE=%d: %d ranks are not whole nodes of that size (at most %d nodes)",
        opts_.ranksPerNode, opts_.nRanks, kMaxHierNodes);
  // MKERNEL_SHARED_CTAS: only where direct mode takes the large collectives (thread ranks, the
  // launch path and its direct mode on, no emulated nodes; exchangePeers drops it for staged ones)
  // (MKERNEL_GRAPH_LAUNCH=0 gives every collective to the persistent kernel).
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
  const int ringMode = emulatedNodes             ? 0
                       : params::ALGO.is("ring") ? 1
                       : params::ALGO.is("auto") ? 2
                                                 : 0;
  if (!params::LAUNCH_DIRECT() || !params::GRAPH_LAUNCH() || launchMaxBytes_ == 0 || emulatedNodes)
    sharedCtas = 0;
  MK_CHECK(exchangePeers(bs_, opts_.rank, opts_.nRanks, opts_.cudaDev, state_,
                         static_cast<int>(want), smsForKernel, opts_.emulate,
                         static_cast<uint64_t>(stagedChunk) / 16 * 16, emulatedNodes, sharedCtas,
                         &peers_, ringMode));
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
  reservedCtas_ = opts_.persistentKernel ? peers.nCtas : 0;
  SmBudget::process().reserve(opts_.cudaDev, reservedCtas_);
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
      MK_INFO(kLogInit,
              "rank %d: %d ranks of this communicator share GPU %d in this process: each posts a "
              "collective's "
              "start, then waits for the others' before queueing its end (MKERNEL_POST_FENCE)",
              opts_.rank, peers.nLocalPeers, opts_.cudaDev);
    }
  }
  for (int r = 0; r < opts_.nRanks; ++r) params_.peers[r] = peers.peers[r];
  params_.self = state_;
  void* dev = nullptr;
  MK_CUDA_CHECK(cudaHostGetDevicePointer(&dev, slots_, 0),
                "rank %d: cudaHostGetDevicePointer(slots)", opts_.rank);
  params_.slots = static_cast<const WorkSlot*>(dev);
  MK_CUDA_CHECK(cudaHostGetDevicePointer(&dev, ctl_, 0),
                "rank %d: cudaHostGetDevicePointer(control)", opts_.rank);
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
    MK_CUDA_CHECK(MemCache::deviceAlloc(opts_.cudaDev, sizeof(KernelTraceRecord) * kTraceDepth,
                                        reinterpret_cast<void**>(&trace_)),
                  "rank %d: cudaMalloc(trace)", opts_.rank);
    MK_CUDA_CHECK(cudaMemset(trace_, 0, sizeof(KernelTraceRecord) * kTraceDepth),
                  "rank %d: cudaMemset(trace)", opts_.rank);
    MK_CUDA_CHECK(MemCache::hostAlloc(sizeof(KernelTraceRecord) * kTraceDepth, cudaHostAllocDefault,
                                      reinterpret_cast<void**>(&traceHost_)),
                  "rank %d: cudaMallocHost(trace)", opts_.rank);
    MK_CUDA_CHECK(cudaStreamCreateWithFlags(&traceStream_, cudaStreamNonBlocking),
                  "rank %d: cudaStreamCreate(trace)", opts_.rank);
    MK_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy),
                  "rank %d: cudaStreamSynchronize(legacy stream) after the trace buffer",
                  opts_.rank);
  }
  params_.trace = trace_;
  params_.traceGraph = traceMode == 2 ? 1u : traceMode == 3 ? 2u : 0u;
  params_.stagingBytes = oneShotMaxBytes_;
  params_.timeoutNs = static_cast<uint64_t>(params::TIMEOUT_S()) * 1000000000ull;
  params_.idleExitNs =
      static_cast<uint64_t>(std::max<int64_t>(0, params::IDLE_EXIT_US())) * 1000ull;
  params_.testStallBarrier =
      static_cast<uint32_t>(std::max<int64_t>(0, params::TEST_STALL_BARRIER()));
  params_.hierOverlap = params::HIER_OVERLAP() ? 1u : 0u;
  if (params_.testStallBarrier != 0)
    MK_WARN(
        "rank %d: MKERNEL_TEST_STALL_BARRIER=%u: a test hook; this rank's staged collectives stop "
        "at that barrier "
        "until the communicator is aborted",
        opts_.rank, params_.testStallBarrier);
  params_.rank = opts_.rank;
  params_.nRanks = opts_.nRanks;
  params_.nCtas = peers.nCtas;
  MK_CHECK(agreeLaunchCap(smsLeft));
  // MKERNEL_PDL=early lets this rank's next launch-path kernel become resident while the current
  // one runs. With ranks sharing a GPU that kernel could hold the SMs a co-located peer's current
  // kernel needs, and the two would wait for each other: there it is wait only.
  if (params_.pdl == 2 && directSharing_ > 1) {
    params_.pdl = 1;
    MK_INFO(kLogInit, "rank %d: MKERNEL_PDL=early is wait here: %d ranks share a GPU", opts_.rank,
            directSharing_);
  }
  // Direct mode needs every peer's user buffers addressable: thread ranks of one process (not
  // staged), one node. The same on every rank (staged is agreed, nNodes is the layout).
  launchDirect_ =
      params::LAUNCH_DIRECT() && launchMaxBytes_ > 0 && !peers.staged && !hier && opts_.nRanks > 1;
  // The launch path, for captured and eager collectives alike (pathOf); off, every collective
  // takes the persistent kernel's doorbell. Every rank reads the same setting (agreed, as
  // MKERNEL_LAUNCH_MAX_BYTES).
  graphLaunch_ = params::GRAPH_LAUNCH() && launchMaxBytes_ > 0 && !hier;
  registerStatsFolder(this, [this] { foldStats(/*device=*/true); });
  if (opts_.persistentKernel)
    MK_INFO(kLogInit,
            "rank %d: persistent kernel ready: %d CTAs x %d threads, GPU %d (%d SMs, %d ranks on "
            "it)%s; "
            "device state %p, fence %p",
            opts_.rank, params_.nCtas, kKernelThreads, opts_.cudaDev, sms, peers.ranksOnMyDevice,
            peers.staged ? ", staged (process ranks)" : "", static_cast<void*>(state_),
            static_cast<void*>(fence_));
  else
    MK_INFO(kLogInit,
            "rank %d: ready without a persistent kernel (its caller runs elsewhere what needs "
            "one): no SMs "
            "reserved on GPU %d (%d SMs, %d ranks on it)%s; device state %p, fence %p",
            opts_.rank, opts_.cudaDev, sms, peers.ranksOnMyDevice,
            peers.staged ? ", staged (process ranks)" : "", static_cast<void*>(state_),
            static_cast<void*>(fence_));
  return Result::Success;
}

}  // namespace coll
}  // namespace mkernel

#endif  // MKERNEL_HAVE_DEVICE_CODE
