// The proxy of a KernelCommunicator spanning nodes: its net backend, rings and flags.
#include "collectives/runtime/kernel_communicator.h"

#ifdef MKERNEL_HAVE_DEVICE_CODE

namespace mkernel {
namespace coll {

Result KernelCommunicator::setupProxy() {
  const int G = perNode_, N = opts_.nRanks / G, node = opts_.rank / G, local = opts_.rank % G;
  // CTAs per hierarchical collective (MKERNEL_HIER_CTAS): at most the kernel's CTAs (each needs
  // its staged regions) and kMaxHierCtas; the smallest any rank asks for, so that every rank
  // splits each collective alike and creates as many proxy channels as its rail peers.
  const int64_t asked = params::HIER_CTAS();
  if (asked < 1 || asked > kMaxHierCtas)
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_HIER_CTAS=%lld outside 1..%d",
                    static_cast<long long>(asked), kMaxHierCtas);
  std::vector<int32_t> ctas(static_cast<size_t>(opts_.nRanks), 0);
  ctas[static_cast<size_t>(opts_.rank)] =
      static_cast<int32_t>(std::min<int64_t>(asked, peers_.nCtas));  // params_.nCtas is set later
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
  MK_CUDA_CHECK(MemCache::hostAlloc(C * sizeof(proxy::ProxyRing),
                                    cudaHostAllocMapped | cudaHostAllocPortable, &host),
                "rank %d: cudaHostAlloc(proxy rings)", opts_.rank);
  proxyRing_ = static_cast<proxy::ProxyRing*>(host);
  std::memset(host, 0, C * sizeof(proxy::ProxyRing));
  MK_CUDA_CHECK(MemCache::hostAlloc(C * sizeof(proxy::ProxyFlags),
                                    cudaHostAllocMapped | cudaHostAllocPortable, &host),
                "rank %d: cudaHostAlloc(proxy flags)", opts_.rank);
  proxyFlags_ = static_cast<proxy::ProxyFlags*>(host);
  std::memset(host, 0, C * sizeof(proxy::ProxyFlags));
  // The proxy's transport: verbs when an RDMA device is usable (this GPU's rail NICs first, from
  // the topology placement), else TCP; MKERNEL_NET_BACKEND=ib|tcp forces one
  // (transport/net/backend.h).
  net::BackendChoice choice;
  if (coll::createProxyNet(opts_.cudaDev, &choice) != Result::Success)
    return MK_ERROR(Result::SystemError, "rank %d: emulated nodes: no transport for the proxy: %s",
                    opts_.rank, lastError());
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
  if (cudaDeviceGetAttribute(&ordering, cudaDevAttrGPUDirectRDMAWritesOrdering, opts_.cudaDev) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    ordering = 0;  // unknown: flush
  }
  coll::ProxyMemory mem;
  if (coll::proxyMemoryFor(params::PROXY_GDR.text(), props.ptrSupport, net_->name(), ordering,
                           &mem) != Result::Success)
    return MK_ERROR(Result::InvalidArgument, "rank %d: %s", opts_.rank, lastError());
  // One CTA (lane): kHierNetSlots net slots, each a send buffer and a receive buffer per node.
  const size_t netBytes = static_cast<size_t>(coll::kHierNetSlots) * static_cast<size_t>(N + 1) *
                          params_.stagedChunkBytes;
  netBufGpu_ = mem.gpu;
  if (mem.gpu) {
    MK_CUDA_CHECK(MemCache::deviceAlloc(opts_.cudaDev, C * netBytes, &host),
                  "rank %d: cudaMalloc(net buffers)", opts_.rank);
  } else {
    MK_CUDA_CHECK(
        MemCache::hostAlloc(C * netBytes, cudaHostAllocMapped | cudaHostAllocPortable, &host),
        "rank %d: cudaHostAlloc(net buffers)", opts_.rank);
  }
  netBuf_ = static_cast<char*>(host);
  // The kernel writes host addresses into proxy commands: the mapping must be the identity (UVA).
  for (void* h : {static_cast<void*>(proxyRing_), static_cast<void*>(proxyFlags_),
                  mem.gpu ? nullptr : static_cast<void*>(netBuf_)}) {
    if (h == nullptr) continue;
    void* dev = nullptr;
    MK_CUDA_CHECK(cudaHostGetDevicePointer(&dev, h, 0),
                  "rank %d: cudaHostGetDevicePointer(proxy memory)", opts_.rank);
    if (dev != h)
      return MK_ERROR(Result::SystemError,
                      "rank %d: emulated nodes need unified addressing (host %p is device %p)",
                      opts_.rank, h, dev);
  }
  std::vector<proxy::ProxyChannel> channels;
  for (size_t c = 0; c < C; ++c)
    channels.push_back(proxy::ProxyChannel{proxyRing_ + c, proxyFlags_ + c});
  proxy_.reset(new proxy::Proxy(net_.get(), 0, node, N, channels));
  // Its ranks are the nodes: its messages (kernelError's proxy report among them) say so.
  proxy_->setNames("rank " + std::to_string(opts_.rank) + " (node " + std::to_string(node) +
                       ", rail " + std::to_string(local) + ")",
                   "node");
  std::vector<proxy::Handle> mine;
  MK_CHECK(proxy_->listenHandles(&mine));
  // Every rank's N listen handles (its own slot empty; each holds one handle per channel); rank
  // (k, j) connects to (m, j)'s handle k.
  const size_t hs = net::kHandleSize * C;
  std::vector<uint8_t> all(static_cast<size_t>(opts_.nRanks) * static_cast<size_t>(N) * hs, 0);
  for (int m = 0; m < N; ++m)
    if (mine[static_cast<size_t>(m)].size() == hs)
      std::memcpy(
          &all[(static_cast<size_t>(opts_.rank) * static_cast<size_t>(N) + static_cast<size_t>(m)) *
               hs],
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
  if (proxy_->registerRegion(netBuf_, C * netBytes, mem.gpu ? net::kPtrCuda : net::kPtrHost) !=
      Result::Success)
    return MK_ERROR(Result::SystemError, "rank %d: the proxy's net buffers in %s: %s%s", opts_.rank,
                    mem.why.c_str(), lastError(),
                    mem.gpu ? "; MKERNEL_PROXY_GDR=0 keeps them in host memory" : "");
  proxy_->setFlushReceives(mem.flush);
  MK_INFO(kLogInit | kLogProxy, "rank %d: proxy net buffers (%zu bytes) in %s", opts_.rank,
          C * netBytes, mem.why.c_str());
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
  const bool dataParallelDirect =
      direct && hierWorkers_ == 0;  // the AllReduce's look-ahead applies
  MK_INFO(
      kLogInit,
      "rank %d: %s node %d of %d (%d ranks each): proxy on rail %d over %s (%s; the slowest rank's "
      "device %d Mb/s), %d CTA(s) "
      "per collective from %llu bytes, 1 below; AllReduce/ReduceScatter/AllGather exchange among "
      "the rail %s, AllReduce %s%s%s",
      opts_.rank, opts_.emulate ? "emulated" : "host", node, N, G, local, net_->name(),
      choice.why.c_str(), railMbps_, hierCtas_, static_cast<unsigned long long>(hierSplitMinBytes_),
      hierRail_ == coll::kRailRing ? "ring (Broadcast/Reduce: binomial tree)"
      : hierRail_ == coll::kRailRhd
          ? "rhd (recursive halving/doubling; Broadcast/Reduce: binomial tree)"
          : "direct",
      hierWorkers_ == 0 ? "on data-parallel CTAs"
                        : ("in CTA roles: each lane 1 sender, " + std::to_string(hierWorkers_) +
                           " worker(s), " + std::to_string(hierReducers_) + " reducer(s)")
                              .c_str(),
      !dataParallelDirect ? ""
      : hierAhead_ == 2   ? ", pipelined two chunks ahead (three net slots)"
                          : ", pipelined one chunk ahead (MKERNEL_HIER_AHEAD=1)",
      // MKERNEL_HIER_KEEP_OWN (collectives/algo/hier_staged.h: hierArKeepOwn,
      // HierStepsBase::keepOwn)
      !direct ? ""
      : params_.hierKeepOwn == 0
          ? "; each rank's own piece through the net send buffer (MKERNEL_HIER_KEEP_OWN=0)"
      : hierWorkers_ == 0
          ? "; each rank's own piece stays in device memory"
          : "; each rank's own piece stays in device memory (not in the AllReduce's CTA roles)");
  return Result::Success;
}

}  // namespace coll
}  // namespace mkernel

#endif  // MKERNEL_HAVE_DEVICE_CODE
