// The persistent mKernel (docs/KERNEL.md).
//
// CTA 0's first warp is the leader: it scans the doorbells, takes a Posted slot (-> Running) and
// publishes it in the dispatch queue; every CTA (the leader's too) consumes the queue in order,
// runs its part of each collective of the slot, and the last CTA to finish marks the doorbell
// Done, which releases the caller's stream (cuStreamWaitValue32). One slot is in flight at a time,
// so every rank's CTA c sees the same sequence of collectives and cross-rank barriers of CTA c
// (per-CTA epochs) match without any grid-wide barrier.
//
// Collectives move data directly between the ranks' user buffers (thread ranks of one process
// address each other's device memory): each rank's CTA c publishes its {src, dst} pointers in a
// mailbox, a first barrier makes them (and the inputs) ready, the CTA moves its share, and a
// second barrier keeps every rank's buffers untouched by peers once its stream moves on.
#include <cuda_runtime.h>

#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/algo.h"
#include "collectives/device/launch.h"
#include "collectives/device/reduce.cuh"
#include "collectives/device/sync.cuh"
#include "collectives/hier_staged.h"
#include "collectives/launch_path.h"
#include "collectives/staged.h"
#include "collectives/staged_ring.h"
#include "collectives/types.h"

namespace mkernel {
namespace coll {
namespace dev {

constexpr uint32_t kDispatchExit = 0xffffffffu;

struct SharedState {
  DeviceState* peers[kMaxRanks];
  WorkSlot slot;
  CopyPlan plan;
  uint64_t peerSrc[kMaxRanks];
  uint64_t peerDst[kMaxRanks];
  uint32_t slotIndex;
  uint32_t stop;
  uint64_t epoch;  // launch kernel, captured: the sequence number thread 0 read from graphSeq
};

// MKERNEL_KERNEL_TRACE: CTA 0's thread 0 stamps group `seq` at `point` (no-op when tracing is off).
constexpr uint64_t kNoTrace = ~0ull;
__device__ inline void traceAt(const KernelParams& p, int cta, uint64_t seq, int point) {
  if (p.trace == nullptr || cta != 0 || threadIdx.x != 0 || seq == kNoTrace) return;
  KernelTraceRecord* r = &p.trace[seq % kTraceDepth];
  r->t[point] = globalTimerNs();
  r->c[point] = clock64();
  if (point == kTraceSeen) r->seq = seq + 1;
}

// traceAt after a value has arrived (MKERNEL_KERNEL_TRACE=3): the value is stored into the stamp's
// slot first, and a store waits for its data, so the stamp's clocks are read after it (in-order
// issue); the stamp then overwrites it.
__device__ inline void traceAfter(const KernelParams& p, int cta, uint64_t seq, int point, uint64_t dep) {
  if (p.trace == nullptr || cta != 0 || threadIdx.x != 0 || seq == kNoTrace) return;
  KernelTraceRecord* r = &p.trace[seq % kTraceDepth];
  *reinterpret_cast<volatile uint64_t*>(&r->t[point]) = dep;
  asm volatile("" ::: "memory");
  r->t[point] = globalTimerNs();
  r->c[point] = clock64();
}

// ---- dtype x op dispatch (the only place that instantiates reduceCopy) ------------------------

// withPre / withPost: apply the op's pre() (PreMulSum) / post() (SumPostDiv). Both true except
// in the hierarchical path, whose partial sums take pre() once and post() once (hier_staged.h).
// Calls f with the Reducer of d's op for element type T (one instantiation per family) and
// returns what f returns.
template <typename T, typename F>
__device__ __forceinline__ auto withReducer(const WorkDesc& d, bool withPre, bool withPost, F&& f) {
  T scalar;  // PreMulSum: the scalar in the dtype's own encoding, by value or by device pointer
  if (d.scalarDevPtr) {
    scalar = loadCg(reinterpret_cast<const T*>(d.scalarDevPtr));
  } else {
    memcpy(&scalar, &d.redOp.scalarBits, sizeof(T));
  }
  const uint32_t divisor = d.redOp.divisor;
  const DevRedOpKind kind = d.redOp.kind;
  if (kind == DevRedOpKind::Prod) return f(Reducer<T, kFamilyProd>{scalar, divisor, false, false, false});
  if (kind == DevRedOpKind::Min || kind == DevRedOpKind::Max)
    return f(Reducer<T, kFamilyMinMax>{scalar, divisor, false, false, kind == DevRedOpKind::Max});
  return f(Reducer<T, kFamilySum>{scalar, divisor, withPre && kind == DevRedOpKind::PreMulSum,
                                  withPost && kind == DevRedOpKind::SumPostDiv, false});
}

template <typename T>
__device__ void reduceTyped(const CopyPlan& plan, const WorkDesc& d, bool withPre, bool withPost) {
  withReducer<T>(d, withPre, withPost, [&](auto red) { reduceCopy(plan, red); });
}

__device__ __noinline__ void reduceDispatch(const CopyPlan& plan, const WorkDesc& d, bool withPre = true,
                                            bool withPost = true) {
  switch (static_cast<DataType>(d.dtype)) {
    case DataType::Int8: reduceTyped<int8_t>(plan, d, withPre, withPost); break;
    case DataType::Uint8: reduceTyped<uint8_t>(plan, d, withPre, withPost); break;
    case DataType::Int32: reduceTyped<int32_t>(plan, d, withPre, withPost); break;
    case DataType::Uint32: reduceTyped<uint32_t>(plan, d, withPre, withPost); break;
    case DataType::Int64: reduceTyped<int64_t>(plan, d, withPre, withPost); break;
    case DataType::Uint64: reduceTyped<uint64_t>(plan, d, withPre, withPost); break;
    case DataType::Float16: reduceTyped<__half>(plan, d, withPre, withPost); break;
    case DataType::Float32: reduceTyped<float>(plan, d, withPre, withPost); break;
    case DataType::Float64: reduceTyped<double>(plan, d, withPre, withPost); break;
    case DataType::Bfloat16: reduceTyped<__nv_bfloat16>(plan, d, withPre, withPost); break;
    case DataType::Fp8E4M3: reduceTyped<__nv_fp8_e4m3>(plan, d, withPre, withPost); break;
    case DataType::Fp8E5M2: reduceTyped<__nv_fp8_e5m2>(plan, d, withPre, withPost); break;
  }
}

// The persistent kernel calls its data movers through function pointers. A function called
// directly is compiled into each kernel's call graph, its registers allocated around those of
// its callers; inside the persistent kernel that left every mover with local-memory traffic in
// its inner loop (reduceCopy<float, Sum>: 76 stores / 85 loads there, none in the launch
// kernel), whatever the register cap, the call site or the values live across it
// (docs/PERFORMANCE.md). A function whose address is taken is compiled once with
// the ABI instead: it saves the callee-saved registers it uses on entry and restores them on
// return (43 stores and 43 loads for reduceCopy<float, Sum>), and its loop runs in registers.
// The pointers are read through volatile so the compiler cannot turn the call back into a
// direct one. The launch kernel calls reduceDispatch / copyBytes directly (its graph is small
// and compiles clean); the wrappers keep their address-taken copies apart from it.
__device__ __noinline__ void reduceDispatchAbi(const CopyPlan& plan, const WorkDesc& d, bool withPre, bool withPost) {
  reduceDispatch(plan, d, withPre, withPost);
}
__device__ __noinline__ void copyBytesAbi(const CopyPlan& plan) { copyBytes(plan); }
using ReduceMover = void (*)(const CopyPlan&, const WorkDesc&, bool, bool);
using CopyMover = void (*)(const CopyPlan&);
__device__ ReduceMover gReduceMover = reduceDispatchAbi;
__device__ CopyMover gCopyMover = copyBytesAbi;

__device__ __forceinline__ void moveReduce(const CopyPlan& plan, const WorkDesc& d, bool withPre = true,
                                           bool withPost = true) {
  (*reinterpret_cast<volatile ReduceMover*>(&gReduceMover))(plan, d, withPre, withPost);
}
__device__ __forceinline__ void moveCopy(const CopyPlan& plan) {
  (*reinterpret_cast<volatile CopyMover*>(&gCopyMover))(plan);
}

// ---- one collective, this CTA's share ------------------------------------------------------------

__device__ inline bool aligned16(uint64_t p) { return (p & 15) == 0; }

// dataTypeSize() of collectives/types.h is a host constexpr function; this is its device twin.
__device__ inline uint64_t elemSize(int32_t dtype) {
  switch (static_cast<DataType>(dtype)) {
    case DataType::Int8: case DataType::Uint8: case DataType::Fp8E4M3: case DataType::Fp8E5M2: return 1;
    case DataType::Float16: case DataType::Bfloat16: return 2;
    case DataType::Int32: case DataType::Uint32: case DataType::Float32: return 4;
    default: return 8;
  }
}

// Fills sh.plan for collective d (thread 0 only). Returns false when the CTA has nothing to move.
__device__ bool planCollective(const KernelParams& p, SharedState& sh, const WorkDesc& d, int cta) {
  CopyPlan& plan = sh.plan;
  const CollType coll = static_cast<CollType>(d.coll);
  const uint64_t esz = elemSize(d.dtype);
  const size_t align = sliceAlignElems(esz);
  const int n = p.nRanks, r = p.rank;
  // The range of elements this rank handles (its rank slice, or everything), split among CTAs
  // exactly as every peer splits it.
  Slice mine;
  if (coll == CollType::AllReduce && static_cast<Algo>(d.algo) == Algo::TwoShot) {
    mine = rankSlice(d.count, n, r, align);
  } else if (coll == CollType::Broadcast || coll == CollType::Reduce) {
    mine = rankSlice(d.count, n, r, align);
  } else {
    mine = Slice{0, d.count};
  }
  Slice part = rankSlice(mine.count, d.nCtas, cta, align);
  const uint64_t start = mine.offset + part.offset;
  plan.count = part.count;
  plan.nSrc = plan.nDst = 0;
  const uint64_t myDst = sh.peerDst[r];
  switch (coll) {
    case CollType::AllReduce:
      for (int k = 0; k < n; ++k) plan.src[plan.nSrc++] = reinterpret_cast<const char*>(sh.peerSrc[k] + start * esz);
      if (static_cast<Algo>(d.algo) == Algo::TwoShot) {
        for (int k = 0; k < n; ++k) plan.dst[plan.nDst++] = reinterpret_cast<char*>(sh.peerDst[k] + start * esz);
      } else {
        plan.dst[plan.nDst++] = reinterpret_cast<char*>(myDst + start * esz);
      }
      break;
    case CollType::ReduceScatter:
      for (int k = 0; k < n; ++k)
        plan.src[plan.nSrc++] = reinterpret_cast<const char*>(sh.peerSrc[k] + (uint64_t(r) * d.count + start) * esz);
      plan.dst[plan.nDst++] = reinterpret_cast<char*>(myDst + start * esz);
      break;
    case CollType::AllGather:
      plan.src[plan.nSrc++] = reinterpret_cast<const char*>(sh.peerSrc[r] + start * esz);
      for (int k = 0; k < n; ++k)
        plan.dst[plan.nDst++] = reinterpret_cast<char*>(sh.peerDst[k] + (uint64_t(r) * d.count + start) * esz);
      break;
    case CollType::Broadcast:
      plan.src[plan.nSrc++] = reinterpret_cast<const char*>(sh.peerSrc[d.root] + start * esz);
      for (int k = 0; k < n; ++k) plan.dst[plan.nDst++] = reinterpret_cast<char*>(sh.peerDst[k] + start * esz);
      break;
    case CollType::Reduce:
      for (int k = 0; k < n; ++k) plan.src[plan.nSrc++] = reinterpret_cast<const char*>(sh.peerSrc[k] + start * esz);
      plan.dst[plan.nDst++] = reinterpret_cast<char*>(sh.peerDst[d.root] + start * esz);
      break;
  }
  bool al = true;
  for (int i = 0; i < plan.nSrc; ++i) al = al && aligned16(reinterpret_cast<uint64_t>(plan.src[i]));
  for (int i = 0; i < plan.nDst; ++i) al = al && aligned16(reinterpret_cast<uint64_t>(plan.dst[i]));
  plan.aligned = al;
  return plan.count > 0;
}

// ---- process ranks: the staged algorithm of collectives/staged.h, run by one CTA -------------------

// Copies and reductions of a whole CTA for the executors below (staged.h, hier_staged.h): thread
// 0 writes the plan into shared memory, every thread moves its share.
struct CtaMover {
  SharedState& sh;
  const WorkDesc& d;

  __device__ void copy(char* const* dsts, int nDst, const char* src, uint64_t bytes) {
    if (bytes == 0) return;
    if (threadIdx.x == 0) {
      bool al = aligned16(reinterpret_cast<uint64_t>(src));
      for (int k = 0; k < nDst; ++k) {
        sh.plan.dst[k] = dsts[k];
        al = al && aligned16(reinterpret_cast<uint64_t>(dsts[k]));
      }
      sh.plan.src[0] = src;
      sh.plan.nSrc = 1;
      sh.plan.nDst = nDst;
      sh.plan.count = bytes;
      sh.plan.aligned = al;
    }
    __syncthreads();
    moveCopy(sh.plan);
    __syncthreads();
  }
  __device__ void reduce(char* const* dsts, int nDst, const char* const* srcs, int nSrc, uint64_t elems,
                         bool withPre = true, bool withPost = true) {
    if (elems == 0) return;
    if (threadIdx.x == 0) {
      bool al = true;
      for (int k = 0; k < nSrc; ++k) {
        sh.plan.src[k] = srcs[k];
        al = al && aligned16(reinterpret_cast<uint64_t>(srcs[k]));
      }
      for (int k = 0; k < nDst; ++k) {
        sh.plan.dst[k] = dsts[k];
        al = al && aligned16(reinterpret_cast<uint64_t>(dsts[k]));
      }
      sh.plan.nSrc = nSrc;
      sh.plan.nDst = nDst;
      sh.plan.count = elems;
      sh.plan.aligned = al;
    }
    __syncthreads();
    moveReduce(sh.plan, d, withPre, withPost);
    __syncthreads();
  }
};

// MKERNEL_TEST_STALL_BARRIER (a test hook; KernelParams::testStallBarrier): this CTA stops here
// for good, in the middle of the collective, and says so; it returns (false) only on abort.
__device__ bool testStall(const KernelParams& p) {
  __syncthreads();
  if (threadIdx.x == 0) {
    p.ctl->testStalled = 1;  // a plain store: host-memory atomics need PCIe AtomicOps
    __threadfence_system();
    while (!stopRequested(p) && !hostStopRequested(p)) __nanosleep(20000);
  }
  __syncthreads();
  return false;
}

struct StagedExecutor : CtaMover {
  const KernelParams& p;
  int cta;
  uint64_t* epoch;
  bool first;  // the first barrier of the collective is its start barrier (for the error record)
  uint32_t barriers = 0;  // of this collective, for the test hook

  __device__ char* in(int rank, int parity) const {
    return p.stagedBuf[rank] + stagedRegionOffset(cta, parity, p.stagedChunkBytes);
  }
  __device__ char* out(int rank, int parity) const {
    return p.stagedBuf[rank] + stagedRegionOffset(cta, 2 + parity, p.stagedChunkBytes);
  }
  __device__ bool barrier() {
    const WaitKind what = first ? kWaitPeerStart : kWaitPeerChunk;
    first = false;
    if (p.testStallBarrier != 0 && ++barriers == p.testStallBarrier) return testStall(p);
    return ctaBarrier(p, sh.peers, cta, epoch, what, d.coll);
  }
  // A ring step's barrier (staged_ring.h): the two neighbours only.
  __device__ bool neighborBarrier(int prev, int next) {
    const WaitKind what = first ? kWaitPeerStart : kWaitPeerChunk;
    first = false;
    if (p.testStallBarrier != 0 && ++barriers == p.testStallBarrier) return testStall(p);
    return ctaBarrierPair(p, sh.peers, cta, epoch, what, d.coll, prev, next);
  }
};

__device__ bool runStaged(const KernelParams& p, SharedState& sh, const WorkDesc& d, int cta, uint64_t* epoch,
                          uint64_t* chunkSeq) {
  const CollType coll = static_cast<CollType>(d.coll);
  StagedCall c;
  c.coll = coll;
  c.twoShot = coll == CollType::AllReduce && stagedTwoShot(static_cast<Algo>(d.algo), p.nRanks);
  c.nRanks = p.nRanks;
  c.rank = p.rank;
  c.root = d.root;
  c.count = d.count;
  c.elemSize = elemSize(d.dtype);
  c.send = d.sendbuff;
  c.recv = d.recvbuff;
  c.part = rankSlice(d.count, d.nCtas, cta, sliceAlignElems(c.elemSize));
  c.chunkElems = stagedChunkElems(p.nRanks, c.elemSize, p.stagedChunkBytes);
  c.parityMask = 1;
  StagedExecutor ex{{sh, d}, p, cta, epoch, true, 0};
  if (static_cast<Algo>(d.algo) == Algo::Ring) {  // PCIe boxes, or MKERNEL_ALGO=ring
    c.chunkElems = ringStagedChunkElems(c.elemSize, p.stagedChunkBytes);
    c.hasPre = d.redOp.kind == DevRedOpKind::PreMulSum;
    c.ringOrdered = p.ringOrdered != 0;
    static_assert(kMaxRanks <= kStagedRingOrderMax, "StagedCall::ringOrder holds every rank");
    for (int q = 0; q < p.nRanks; ++q) c.ringOrder[q] = p.ringOrder[q];
    return ringStagedCollective(ex, c, chunkSeq);
  }
  return stagedCollective(ex, c, chunkSeq);
}

// ---- emulated nodes: the hierarchical algorithms of collectives/hier_staged.h ---------------------
//
// Each of the op's CTAs (MKERNEL_HIER_CTAS; 1 by default) runs its slice. Node-local regions are
// the staged buffers of this node's ranks (staged.h's layout, the CTA's own regions); the
// inter-node rounds go through channel `cta` of this rank's proxy: thread 0 posts the receives,
// then the sends, into the channel's host-mapped ring and waits for its completion counters (net
// slot s < kHierNetSlots: flag 2 s sends, 2 s + 1 receives; the totals live in DeviceState so that
// a relaunched kernel continues them).

static_assert(2 * kMaxRanks <= proxy::kRingSlots, "a rail round's commands (a send and a receive per node) fit the ring");
static_assert(2 * kHierNetSlots <= static_cast<int>(proxy::kMaxFlags), "two completion counters per net slot");

struct HierExecutor : CtaMover {
  const KernelParams& p;
  int cta;
  uint64_t* epoch;
  int node;
  int lane;  // the proxy channel and net buffers: this CTA's own, or (CTA roles) its lane's

  __device__ char* in(int local, int parity) const {
    return p.stagedBuf[node * p.perNode + local] + stagedRegionOffset(cta, parity, p.stagedChunkBytes);
  }
  __device__ char* out(int local, int parity) const {
    return p.stagedBuf[node * p.perNode + local] + stagedRegionOffset(cta, 2 + parity, p.stagedChunkBytes);
  }
  __device__ char* netSend(int slot) const {
    return p.netBuf + static_cast<uint64_t>(lane) * p.netBufBytes +
           static_cast<uint64_t>(slot) * (1 + static_cast<uint64_t>(p.nNodes)) * p.stagedChunkBytes;
  }
  __device__ proxy::ProxyRing* ring() const { return p.proxyRing + lane; }
  __device__ proxy::ProxyFlags* flags() const { return p.proxyFlags + lane; }
  __device__ char* netRecv(int slot, int m) const { return netSend(slot) + (1 + static_cast<uint64_t>(m)) * p.stagedChunkBytes; }
  // CTA 0's waits (DeviceState::hierWait): thread 0's %globaltimer around them.
  __device__ uint64_t waitStart() const { return cta == 0 && threadIdx.x == 0 ? dev::globalTimerNs() : 0; }
  __device__ void waitEnd(int k, uint64_t t0) const {
    if (cta == 0 && threadIdx.x == 0) p.self->hierWait[k] += dev::globalTimerNs() - t0;
  }
  __device__ bool nodeBarrier() {
    const uint64_t t0 = waitStart();
    const bool ok = ctaBarrier(p, sh.peers, cta, epoch, kWaitPeerChunk, d.coll, node * p.perNode, p.perNode);
    waitEnd(1, t0);
    return ok;
  }
  // CTA 0's own work (DeviceState::hierBusy), timed as its waits: is a pointer in the net buffers?
  __device__ bool isNet(const void* ptr) const {
    const char* c = static_cast<const char*>(ptr);
    return c >= p.netBuf && c < p.netBuf + static_cast<uint64_t>(p.hierCtas) * p.netBufBytes;
  }
  __device__ void busyEnd(int k, uint64_t t0) const {
    if (cta == 0 && threadIdx.x == 0) p.self->hierBusy[k] += dev::globalTimerNs() - t0;
  }
  __device__ void copy(char* const* dsts, int nDst, const char* src, uint64_t bytes) {
    if (bytes == 0) return;
    const uint64_t t0 = waitStart();
    bool net = false;
    if (cta == 0 && threadIdx.x == 0) {
      net = isNet(src);
      for (int k = 0; k < nDst; ++k) net = net || isNet(dsts[k]);
    }
    CtaMover::copy(dsts, nDst, src, bytes);
    busyEnd(net ? kBusyCopyNet : kBusyCopy, t0);
  }
  __device__ void reduce(char* const* dsts, int nDst, const char* const* srcs, int nSrc, uint64_t elems,
                         bool withPre = true, bool withPost = true) {
    if (elems == 0) return;
    const uint64_t t0 = waitStart();
    bool net = false;
    if (cta == 0 && threadIdx.x == 0) {
      for (int k = 0; k < nSrc; ++k) net = net || isNet(srcs[k]);
      for (int k = 0; k < nDst; ++k) net = net || isNet(dsts[k]);
    }
    CtaMover::reduce(dsts, nDst, srcs, nSrc, elems, withPre, withPost);
    busyEnd(net ? kBusyReduceNet : kBusyReduce, t0);
  }
  // The round's commands go to the ring as one batch (proxy::proxyReserve/Write/Publish): one
  // release fence, and no read of the host-mapped ring while it has room (the producer's head and
  // the tail it last saw live in DeviceState).
  __device__ bool railPost(int round, int slot, const char* const* sendPtr, const uint64_t* sendBytes,
                           char* const* recvPtr, const uint64_t* recvBytes) {
    const uint64_t t0 = waitStart();
    __syncthreads();  // the CTA's writes into the net buffer precede thread 0's posts
    if (threadIdx.x == 0) {
      // proxyPublish's release fence, after this barrier, orders every thread's writes into the
      // net buffer before the commands' seq (the barrier-then-fence pattern of a flag store).
      uint64_t sends = p.self->proxySends[lane][slot], recvs = p.self->proxyRecvs[lane][slot];
      uint32_t n = 0;
      for (int m = 0; m < p.nNodes; ++m) n += (recvBytes[m] != 0 ? 1u : 0u) + (sendBytes[m] != 0 ? 1u : 0u);
      proxy::ProxyProducer pr{p.self->proxyHead[lane], p.self->proxyTailSeen[lane]};
      bool ok = proxy::proxyReserve(ring(), flags(), &pr, n, p.timeoutNs) == proxy::PostStatus::kPosted;
      uint32_t i = 0;
      for (int pass = 0; pass < 2 && ok; ++pass) {  // receives first, then sends
        for (int m = 0; m < p.nNodes && ok; ++m) {
          const uint64_t bytes = pass == 0 ? recvBytes[m] : sendBytes[m];
          if (bytes == 0) continue;
          proxy::ProxyCmd c{};
          c.op = pass == 0 ? proxy::kOpRecv : proxy::kOpSend;
          c.peer = m;
          // Host-mapped memory has one address on both sides (UVA; checked at creation).
          c.addr = reinterpret_cast<uint64_t>(pass == 0 ? recvPtr[m] : sendPtr[m]);
          c.bytes = bytes;
          c.tag = round;
          c.flag = 2 * static_cast<uint32_t>(slot) + (pass == 0 ? 1u : 0u);
          proxy::proxyWrite(ring(), pr, i++, c);
          if (pass == 0) ++recvs; else ++sends;
        }
      }
      if (ok) proxy::proxyPublish(ring(), &pr, n);
      p.self->proxySends[lane][slot] = sends;
      p.self->proxyRecvs[lane][slot] = recvs;
      p.self->proxyHead[lane] = pr.head;
      p.self->proxyTailSeen[lane] = pr.tailSeen;
      if (!ok) recordError(p, cta, -1, kWaitProxy, d.coll, recvs);
      sh.stop = ok ? 0 : 1;
    }
    __syncthreads();
    busyEnd(kBusyPost, t0);
    return sh.stop == 0;
  }
  // Thread 0: until the channel's completion counters of `slot` reach sends and recvs.
  __device__ bool railWaitCounts(int slot, uint64_t sends, uint64_t recvs) {
    const uint32_t f = 2 * static_cast<uint32_t>(slot);
    bool ok = proxy::proxyWaitFlag(flags(), f, sends, p.timeoutNs) == proxy::WaitStatus::kReached;
    ok = ok && proxy::proxyWaitFlag(flags(), f + 1, recvs, p.timeoutNs) == proxy::WaitStatus::kReached;
    if (!ok) recordError(p, cta, -1, kWaitProxy, d.coll, recvs);
    return ok;
  }
  __device__ bool railWait(int slot) {
    const uint64_t t0 = waitStart();
    if (threadIdx.x == 0)
      sh.stop = railWaitCounts(slot, p.self->proxySends[lane][slot], p.self->proxyRecvs[lane][slot]) ? 0 : 1;
    waitEnd(0, t0);
    __syncthreads();  // the received bytes are read after thread 0 saw them land
    return sh.stop == 0;
  }
  // Phase times (collectives/hier_staged.h): CTA 0's AllReduce chunks in turn, into
  // DeviceState::hierTurn (device memory; the host reads it by a copy, as launchDone).
  __device__ void phaseMark(int mark) {
    if (p.hierOverlap != 0 || cta != 0) return;
    __syncthreads();  // the phase's work is done on every thread
    if (threadIdx.x == 0) {
      DeviceState* s = p.self;
      const uint64_t t = dev::globalTimerNs();
      if (mark != kPhaseChunkStart) s->hierTurn[mark == kPhaseRailEnd ? 2 : 1] += t - s->hierMark;
      if (mark == kPhaseChunkEnd) ++s->hierTurn[0];
      s->hierMark = t;
    }
  }
  // CTA roles (collectives/hier_staged.h): the lane's counters in device memory.
  __device__ void roleAdd(int k) {
    __syncthreads();  // the CTA's writes (device and host-mapped memory) precede the count
    if (threadIdx.x == 0) {
      __threadfence_system();
      atomicAdd(reinterpret_cast<unsigned long long*>(&p.self->hierRole[lane].counter[k]), 1ull);
    }
  }
  __device__ bool roleWait(int k, uint64_t target) {
    const uint64_t t0 = waitStart();
    if (threadIdx.x == 0)
      sh.stop = waitGeq(p, &p.self->hierRole[lane].counter[k], target, cta, -1, kWaitHierRole, d.coll,
                        kInternalWaitFactor * p.timeoutNs) ? 0 : 1;
    waitEnd(2, t0);
    __syncthreads();
    return sh.stop == 0;
  }
  // Sender: what its channel counts on `slot` so far, as the targets of `round` (read after the
  // round's R0 / R1 count, which roleAdd orders after these stores).
  __device__ void railPublish(int round, int slot) {
    if (threadIdx.x == 0) {
      p.self->hierRole[lane].target[round][slot][0] = p.self->proxySends[lane][slot];
      p.self->hierRole[lane].target[round][slot][1] = p.self->proxyRecvs[lane][slot];
    }
  }
  __device__ bool railWaitPublished(int round, int slot) {
    const uint64_t t0 = waitStart();
    if (threadIdx.x == 0) {
      const uint64_t* t = p.self->hierRole[lane].target[round][slot];
      sh.stop = railWaitCounts(slot, __ldcg(t), __ldcg(t + 1)) ? 0 : 1;
    }
    waitEnd(0, t0);
    __syncthreads();
    return sh.stop == 0;
  }
};

__device__ __noinline__ bool runHier(const KernelParams& p, SharedState& sh, const WorkDesc& d, int cta, uint64_t* epoch,
                        uint64_t* chunkSeq) {
  HierCall c;
  c.coll = static_cast<CollType>(d.coll);
  c.root = d.root;
  c.layout.nNodes = p.nNodes;
  c.layout.perNode = p.perNode;
  c.node = p.rank / p.perNode;
  c.local = p.rank % p.perNode;
  c.count = d.count;
  c.elemSize = elemSize(d.dtype);
  c.send = d.sendbuff;
  c.recv = d.recvbuff;
  // CTA c of d.nCtas (MKERNEL_HIER_CTAS) takes its slice, with its own proxy channel: one
  // producer per ring. Every rank splits alike (count and CTAs are shared).
  c.chunkElems = hierChunkElemsFor(c.coll, c.layout, c.elemSize, p.stagedChunkBytes);
  c.overlap = p.hierOverlap != 0;
  c.rail = p.hierRail;
  c.keepOwn = p.hierKeepOwn != 0;
  c.ahead = p.hierAhead;
  if (d.hierLanes > 0) {
    // CTA roles (MKERNEL_HIER_ROLES): lane l of d.hierLanes takes slice l; the CTAs of lanes the
    // collective does not use skip it (their counters stay where they were, on every rank alike).
    const HierRoleOf r(cta, p.hierCtas, p.hierWorkers, p.hierReducers);
    if (r.lane >= d.hierLanes) return true;
    c.part = rankSlice(d.count, d.hierLanes, r.lane, sliceAlignElems(c.elemSize));
    c.role = r.role;
    c.roleIndex = r.index;
    c.workers = p.hierWorkers;
    c.reducers = p.hierReducers;
    uint64_t* mine = p.self->ctaRole[cta];
    c.roleChunks = mine[0];
    c.roleOps = mine[1];
    HierExecutor ex{{sh, d}, p, cta, epoch, c.node, r.lane};
    const bool ok = hierCollective(ex, c, chunkSeq);
    __syncthreads();  // every thread read mine[] above
    if (threadIdx.x == 0) {
      const uint64_t chunks = hierChunksOf(c);
      mine[0] += chunks;
      mine[1] += chunks > 0 ? 1 : 0;
    }
    __syncthreads();
    return ok;
  }
  c.part = rankSlice(d.count, d.nCtas, cta, sliceAlignElems(elemSize(d.dtype)));
  HierExecutor ex{{sh, d}, p, cta, epoch, c.node, cta};
  return hierCollective(ex, c, chunkSeq);
}

__device__ bool runCollective(const KernelParams& p, SharedState& sh, const WorkDesc& d, int cta,
                              uint64_t* epoch, uint64_t traceSeq, uint64_t* chunkSeq) {
  if (cta >= d.nCtas) return true;
  if (p.nNodes > 1) return runHier(p, sh, d, cta, epoch, chunkSeq);
  if (p.staged) return runStaged(p, sh, d, cta, epoch, chunkSeq);
  const CollType coll = static_cast<CollType>(d.coll);
  const uint64_t esz = elemSize(d.dtype);
  // In-place one-shot AllReduce: peers read our input while we overwrite it, so they read a copy
  // in staging instead (each CTA copies the part it will also read back: the same split).
  const bool staged = coll == CollType::AllReduce && static_cast<Algo>(d.algo) == Algo::OneShot &&
                      d.sendbuff == d.recvbuff;
  if (staged) {
    if (threadIdx.x == 0) {
      Slice part = rankSlice(d.count, d.nCtas, cta, sliceAlignElems(esz));
      sh.plan.src[0] = reinterpret_cast<const char*>(d.sendbuff + part.offset * esz);
      sh.plan.dst[0] = reinterpret_cast<char*>(reinterpret_cast<uint64_t>(p.staging) + part.offset * esz);
      sh.plan.nSrc = sh.plan.nDst = 1;
      sh.plan.count = part.count * esz;
      sh.plan.aligned = aligned16(d.sendbuff) && aligned16(reinterpret_cast<uint64_t>(p.staging));
    }
    __syncthreads();
    moveCopy(sh.plan);
  }
  if (threadIdx.x == 0) {
    CtaMailbox* mb = &p.self->mailbox[cta];
    mb->src = staged ? reinterpret_cast<uint64_t>(p.staging) : d.sendbuff;
    mb->dst = d.recvbuff;
  }
  if (!ctaBarrier(p, sh.peers, cta, epoch, kWaitPeerStart, d.coll)) return false;
  traceAt(p, cta, traceSeq, kTraceStartBarrier);
  if (threadIdx.x < p.nRanks) {
    const CtaMailbox* mb = &sh.peers[threadIdx.x]->mailbox[cta];
    sh.peerSrc[threadIdx.x] = __ldcg(&mb->src);
    sh.peerDst[threadIdx.x] = __ldcg(&mb->dst);
  }
  __syncthreads();
  if (threadIdx.x == 0) sh.stop = planCollective(p, sh, d, cta) ? 0 : 1;
  __syncthreads();
  if (!sh.stop) {
    if (coll == CollType::Broadcast || coll == CollType::AllGather) {
      if (threadIdx.x == 0) sh.plan.count *= esz;  // copyBytes counts bytes
      __syncthreads();
      moveCopy(sh.plan);
    } else {
      moveReduce(sh.plan, d);
    }
  }
  if (p.trace != nullptr) __syncthreads();  // the whole CTA's share moved (uniform condition)
  traceAt(p, cta, traceSeq, kTraceMoved);
  const bool ok = ctaBarrier(p, sh.peers, cta, epoch, kWaitPeerEnd, d.coll);
  traceAt(p, cta, traceSeq, kTraceEndBarrier);
  return ok;
}

// ---- leader ---------------------------------------------------------------------------------------

// Marks every Posted/Running slot Done without running it: after an abort or a failure, so that
// callers' streams never hang on a dead communicator. Counts drained eager slots.
__device__ void drainDoorbells(const KernelParams& p) {
  for (int s = 0; s < kMaxSlots; ++s) {
    volatile uint32_t* db = &p.self->doorbell[s];
    uint32_t v = *db;
    if (v == kDoorbellPosted || v == kDoorbellRunning) {
      if (p.slots[s].eager) {
        p.self->eagerCompleted += 1;
        p.ctl->eagerCompleted = p.self->eagerCompleted;
      }
      __threadfence_system();
      *db = kDoorbellDone;
    }
  }
  __threadfence_system();
}

// After a failure or abort the leader thread stays to drain doorbells until the host says quit
// (or, when nothing was captured, until no eager work is outstanding for the idle time).
__device__ void leaderDrain(const KernelParams& p) {
  uint64_t idleSince = globalTimerNs();
  while (true) {
    drainDoorbells(p);
    if (p.ctl->quit) return;
    const bool pending = p.ctl->eagerEnqueued != p.self->eagerCompleted;
    if (pending || p.ctl->resident) idleSince = globalTimerNs();
    if (globalTimerNs() - idleSince > p.idleExitNs) return;
    __nanosleep(2000);
  }
}

// Warp 0 of CTA 0: waits for the slot in flight to complete, then finds the next Posted slot and
// publishes it (or kDispatchExit). Returns false when the kernel must drain instead.
__device__ bool leaderDispatch(const KernelParams& p, SharedState& sh) {
  DeviceState* self = p.self;
  const int lane = threadIdx.x & 31;
  const uint64_t seq = loadVolatile64(&self->dispatchSeq);
  bool ok = true;
  if (lane == 0) ok = waitGeq(p, &self->completedSeq, seq, 0, p.rank, kWaitSlotDone, -1, kInternalWaitFactor * p.timeoutNs);
  if (!__all_sync(0xffffffffu, ok)) return false;
  uint64_t idleSince = globalTimerNs();
  uint32_t cursor = self->leaderCursor;
  bool backoff = false;
  for (uint32_t iter = 1;; ++iter) {
    if (backoff) __nanosleep(1000);  // idle > 100 us: poll every few microseconds
    // Ballot over all doorbells: word j, bit l = slot 32 j + l is Posted.
    uint32_t posted[kMaxSlots / 32];
#pragma unroll
    for (int j = 0; j < kMaxSlots / 32; ++j)
      posted[j] = __ballot_sync(0xffffffffu, loadVolatile(&self->doorbell[32 * j + lane]) == kDoorbellPosted);
    int found = -1;
    for (int k = 0; k < kMaxSlots && found < 0; ++k) {  // first Posted slot from the cursor on
      int s = (cursor + k) % kMaxSlots;
      if ((posted[s / 32] >> (s % 32)) & 1u) found = s;
    }
    if (found >= 0) {
      // Copy the slot's descriptors from host-mapped memory into device memory: one PCIe round
      // trip (two 16-byte loads per lane) instead of one per CTA.
      constexpr int kSlotVecs = sizeof(WorkSlot) / 16;
      const uint4* from = reinterpret_cast<const uint4*>(&p.slots[found]);
      uint4* to = reinterpret_cast<uint4*>(&self->dispatched[seq % kDispatchDepth]);
      for (int v = lane; v < kSlotVecs; v += 32) __stcg(to + v, __ldcv(from + v));
      __threadfence();
      __syncwarp();
      if (lane == 0) {
        traceAt(p, 0, seq, kTraceSeen);
        self->doorbell[found] = kDoorbellRunning;
        self->dispatchSlot[seq % kDispatchDepth] = static_cast<uint32_t>(found);
        self->leaderCursor = static_cast<uint32_t>(found + 1) % kMaxSlots;
        __threadfence();
        *reinterpret_cast<volatile uint64_t*>(&self->dispatchSeq) = seq + 1;
      }
      __syncwarp();
      return true;
    }
    if ((iter & 63) == 0) {
      if (stopRequested(p) || hostStopRequested(p)) return false;
      const uint64_t now = globalTimerNs();
      const bool idleLong = now - idleSince > p.idleExitNs;
      if ((idleLong && !p.ctl->resident) || p.ctl->quit) {
        // Dekker handshake with the host's enqueue (docs/KERNEL.md): announce Exiting, then look
        // for work the host enqueued meanwhile; the host, after counting its work, looks at the
        // state. At least one of the two sees the other.
        bool exitNow = false;
        if (lane == 0) {
          p.ctl->kernelState = kKernelExiting;
          __threadfence_system();
          exitNow = p.ctl->eagerEnqueued == self->eagerCompleted && (p.ctl->quit || !p.ctl->resident);
          if (!exitNow) {
            p.ctl->kernelState = kKernelRunning;
          } else {
            self->dispatchSlot[seq % kDispatchDepth] = kDispatchExit;
            self->completedSeq = seq + 1;
            __threadfence();
            *reinterpret_cast<volatile uint64_t*>(&self->dispatchSeq) = seq + 1;
          }
        }
        if (__shfl_sync(0xffffffffu, exitNow, 0)) return true;
        idleSince = now;
      }
      backoff = now - idleSince > 100000;
    }
  }
}

// ---- the kernel -------------------------------------------------------------------------------

__global__ void __launch_bounds__(kKernelThreads, 1) persistentKernel(KernelParams p) {
  __shared__ SharedState sh;
  if (p.warmup) return;  // warmKernels
  const int cta = blockIdx.x;
  DeviceState* self = p.self;
  if (threadIdx.x < kMaxRanks) sh.peers[threadIdx.x] = threadIdx.x < p.nRanks ? p.peers[threadIdx.x] : nullptr;
  uint64_t consumed = self->ctaConsumed[cta];
  uint64_t epoch = self->ctaEpoch[cta];
  uint64_t chunkSeq = self->ctaChunk[cta];
  if (cta == 0 && threadIdx.x == 0) p.ctl->kernelState = kKernelRunning;
  __syncthreads();
  bool failed = false;
  while (true) {
    if (cta == 0 && threadIdx.x < 32) {
      bool ok = leaderDispatch(p, sh);
      if (threadIdx.x == 0) sh.stop = ok ? 0 : 1;
    }
    if (threadIdx.x == 0) {
      if (cta != 0) sh.stop = 0;
      // Wait for the next dispatch entry. Idle waiting is legitimate: no timeout, but abort and
      // failure end it.
      for (uint32_t iter = 1; !sh.stop && loadVolatile64(&self->dispatchSeq) <= consumed; ++iter) {
        if ((iter & 255) == 0 && stopRequested(p)) sh.stop = 1;
        if (iter > (1u << 14)) __nanosleep(1000);
      }
      if (!sh.stop) {
        sh.slotIndex = loadVolatile(&self->dispatchSlot[consumed % kDispatchDepth]);
        __threadfence();  // acquire: the leader's copy of the slot is read after its dispatchSeq
      }
    }
    __syncthreads();
    if (sh.stop) { failed = true; break; }
    ++consumed;
    if (sh.slotIndex == kDispatchExit) break;
    // Load the slot's descriptors: the leader's copy in device memory (L2), all at once.
    constexpr int kSlotVecs = sizeof(WorkSlot) / 16;
    if (threadIdx.x < kSlotVecs)
      reinterpret_cast<uint4*>(&sh.slot)[threadIdx.x] =
          __ldcg(reinterpret_cast<const uint4*>(&self->dispatched[(consumed - 1) % kDispatchDepth]) + threadIdx.x);
    __syncthreads();
    traceAt(p, cta, consumed - 1, kTraceLoaded);
    if (cta >= static_cast<int>(sh.slot.ctasNeeded)) continue;
    bool ok = true;
    for (uint32_t i = 0; i < sh.slot.nOps && ok; ++i)
      ok = runCollective(p, sh, sh.slot.ops[i], cta, &epoch, i == 0 ? consumed - 1 : kNoTrace, &chunkSeq);
    if (!ok) { failed = true; break; }
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      if (atomicAdd(&self->slotCtaDone, 1u) + 1 == sh.slot.ctasNeeded) {
        self->slotCtaDone = 0;
        // Host-mapped counters: stores only (a read-modify-write would cost PCIe round trips).
        for (uint32_t i = 0; i < sh.slot.nOps; ++i) {
          const int c = sh.slot.ops[i].coll;
          p.ctl->opsDone[c] = ++self->opsDone[c];
        }
        if (sh.slot.eager) {
          self->eagerCompleted += 1;
          p.ctl->eagerCompleted = self->eagerCompleted;
        }
        __threadfence_system();
        *reinterpret_cast<volatile uint32_t*>(&self->doorbell[sh.slotIndex]) = kDoorbellDone;
        __threadfence();
        *reinterpret_cast<volatile uint64_t*>(&self->completedSeq) = consumed;
      }
      traceAt(p, cta, consumed - 1, kTraceReported);
    }
  }
  if (threadIdx.x == 0) {
    self->ctaConsumed[cta] = consumed;
    self->ctaEpoch[cta] = epoch;
    self->ctaChunk[cta] = chunkSeq;
  }
  if (failed && cta == 0 && threadIdx.x == 0) {
    // The failure is recorded (or the host aborted): keep callers' streams moving until quit.
    leaderDrain(p);
    p.ctl->kernelState = kKernelExiting;
  }
}

// ---- the launch path: one small collective per launch, on the caller's stream ------------------
//
// collectives/launch_path.h describes the protocol (one flag per CTA, double-buffered inbox).
// Bounded like the persistent kernel's waits: a peer that never publishes is recorded
// (kWaitLaunchPeer) after MKERNEL_TIMEOUT_S, and abort or an earlier failure ends the wait.

// Sets up sh.plan for one copy or reduction (thread 0), then the whole CTA runs it.
__device__ void launchMove(SharedState& sh, const WorkDesc& d, bool reduce, const char* const* srcs, int nSrc,
                           char* dst, uint64_t elems, uint64_t esz) {
  if (elems == 0) return;
  if (threadIdx.x == 0) {
    bool al = aligned16(reinterpret_cast<uint64_t>(dst));
    for (int k = 0; k < nSrc; ++k) {
      sh.plan.src[k] = srcs[k];
      al = al && aligned16(reinterpret_cast<uint64_t>(srcs[k]));
    }
    sh.plan.dst[0] = dst;
    sh.plan.nSrc = nSrc;
    sh.plan.nDst = 1;
    sh.plan.count = reduce ? elems : elems * esz;
    sh.plan.aligned = al;
  }
  __syncthreads();
  if (reduce) {
    reduceDispatch(sh.plan, d);
  } else {
    copyBytes(sh.plan);
  }
  __syncthreads();
}

// Direct mode (thread ranks: every rank's buffers are addressable): CTA c publishes its op's
// buffers in launchMailbox[c] before storing launchArrive[c] = e, then runs the persistent
// kernel's direct algorithm (planCollective) over the peers' buffers, and stores launchEnd[c] = e
// and waits for every peer's launchEnd[c] >= e: until then peers may still read our input or write
// our output. The mailbox of op e is overwritten only at a later op, which starts after this
// rank's op e passed the end flags, i.e. after every peer's CTA c finished op e.
__device__ bool launchDirect(const KernelParams& p, SharedState& sh, const WorkDesc& d, int cta, uint64_t epoch,
                             int ns) {
  const int n = p.nRanks, r = p.rank;
  if (threadIdx.x == 0) {
    CtaMailbox* mb = &p.self->launch[ns].mailbox[cta];
    mb->src = d.sendbuff;
    mb->dst = d.recvbuff;
    __threadfence_system();
    storeRelease(&p.self->launch[ns].arrive[cta].epoch, epoch);
  }
  const int peer = static_cast<int>(threadIdx.x);
  bool ok = true;
  if (peer < n && peer != r)
    ok = waitGeq(p, &sh.peers[peer]->launch[ns].arrive[cta].epoch, epoch, cta, peer, kWaitLaunchPeer, d.coll);
  if (!__syncthreads_and(ok)) return false;
  if (peer < n) {
    const CtaMailbox* mb = &sh.peers[peer]->launch[ns].mailbox[cta];
    sh.peerSrc[peer] = __ldcg(&mb->src);
    sh.peerDst[peer] = __ldcg(&mb->dst);
  }
  __syncthreads();
  if (threadIdx.x == 0) sh.stop = planCollective(p, sh, d, cta) ? 0 : 1;
  __syncthreads();
  const CollType coll = static_cast<CollType>(d.coll);
  if (!sh.stop) {
    if (coll == CollType::Broadcast || coll == CollType::AllGather) {
      if (threadIdx.x == 0) sh.plan.count *= elemSize(d.dtype);  // copyBytes counts bytes
      __syncthreads();
      copyBytes(sh.plan);
    } else {
      reduceDispatch(sh.plan, d);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // our remote stores (TwoShot, Broadcast, Reduce) before the flag
    storeRelease(&p.self->launch[ns].end[cta].epoch, epoch);
  }
  ok = true;
  if (peer < n && peer != r)
    ok = waitGeq(p, &sh.peers[peer]->launch[ns].end[cta].epoch, epoch, cta, peer, kWaitLaunchPeerEnd, d.coll);
  return __syncthreads_and(ok) != 0;
}

// ---- LL mode (launch_path.h, "LL mode") ----------------------------------------------------------

// Up to 8 bytes of a user buffer (fewer at its end: the rest reads as 0).
__device__ __forceinline__ uint64_t llLoad8(const char* p, uint64_t avail) {
  if (avail >= 8 && (reinterpret_cast<uint64_t>(p) & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
  uint64_t v = 0;
  const int m = avail < 8 ? static_cast<int>(avail) : 8;
  for (int b = 0; b < m; ++b) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[b])) << (8 * b);
  return v;
}
__device__ __forceinline__ void llStore8(char* p, uint64_t v, uint64_t avail) {
  if (avail >= 8 && (reinterpret_cast<uint64_t>(p) & 7) == 0) {
    *reinterpret_cast<uint64_t*>(p) = v;
    return;
  }
  const int m = avail < 8 ? static_cast<int>(avail) : 8;
  for (int b = 0; b < m; ++b) p[b] = static_cast<char>(static_cast<uint8_t>(v >> (8 * b)));
}
// One line, both halves carrying the flag (two aligned 8-byte halves in one 16-byte store).
__device__ __forceinline__ void llPut(LlLine* line, uint64_t v, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(static_cast<uint32_t>(v)),
               "r"(flag), "r"(static_cast<uint32_t>(v >> 32)), "r"(flag)
               : "memory");
}
// Polls a line of this rank's slots until both halves carry `flag`, takes its payload and zeroes
// it. Bounded like waitGeq: false on stop, abort or timeout (recorded as kWaitLaunchPeer, with
// the half's flag seen).
__device__ __noinline__ bool llTake(const KernelParams& p, LlLine* line, uint32_t flag, uint64_t* out, int peer,
                                    int coll, uint64_t epoch) {
  uint64_t start = 0;
  for (uint32_t iter = 1;; ++iter) {
    uint32_t a, b, c, d;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                 : "l"(line)
                 : "memory");
    if (b == flag && d == flag) {
      *out = static_cast<uint64_t>(a) | (static_cast<uint64_t>(c) << 32);
      asm volatile("st.volatile.global.v4.u32 [%0], {%1, %1, %1, %1};" ::"l"(line), "r"(0u) : "memory");
      return true;
    }
    if ((iter & 255) == 0) {
      if (stopRequested(p)) return false;
      if ((iter & 8191) == 0 && hostStopRequested(p)) return false;
      const uint64_t now = globalTimerNs();
      if (start == 0) {
        start = now;
      } else if (now - start > p.timeoutNs) {
        recordError(p, static_cast<int>(blockIdx.x), peer, kWaitLaunchPeer, coll, epoch, b != flag ? b : d);
        return false;
      }
      if (iter > (1u << 16)) __nanosleep(200);
    }
  }
}

// What one CTA of an LL op works with (launchLl).
struct LlArgs {
  LlRange range;       // this CTA's lines
  uint64_t payload;    // bytes from each source to each destination
  uint64_t slotLines;  // llSlotLines(n): source k's lines start at k * slotLines
  uint64_t lineBase;   // where the op's lines start in each slot (an LL batch's later ops: after the earlier ones')
  uint64_t epoch;
  int ns, parity;
  uint32_t flag;
  uint32_t tid, nthr;  // this thread among the op's threads (the CTA's, or an LL batch op's warps)
  // MKERNEL_KERNEL_TRACE=3 (launchLlKernel, captured ops): the record the receive's own stamps go
  // to (receive begun, first poll answered, line taken, combined and stored), else kNoTrace.
  uint64_t detailSeq;
};
__device__ __forceinline__ LlLine* llOwnLine(const KernelParams& p, const LlArgs& a, int source, uint64_t i) {
  return &p.self->ll[a.ns].lines[a.parity][llSlotLine(a.slotLines, source, a.lineBase + i)];
}

// A thread's lines come in batches of kLlBatch (launch_path.h): line base + u * stride of batch
// `base` (stride: the op's threads, LlArgs::nthr), those below `end`. Each step issues all of the
// batch's loads before it uses any, so that one memory latency, not kLlBatch of them, is paid per
// batch.
__device__ __forceinline__ uint64_t llBatchLine(uint64_t base, int u, uint32_t stride) {
  return base + static_cast<uint64_t>(u) * stride;
}
// The batch's payload at byte offset `from` of a buffer (line i at from + i * 8).
template <int B = kLlBatch>
__device__ __forceinline__ void llLoadBatch(const char* from, uint64_t payload, uint64_t base, uint64_t end,
                                            uint32_t stride, uint64_t (&v)[B]) {
#pragma unroll
  for (int u = 0; u < B; ++u) {
    const uint64_t i = llBatchLine(base, u, stride);
    v[u] = i < end ? llLoad8(from + i * kLlLinePayload, payload - i * kLlLinePayload) : 0;
  }
}
template <int B = kLlBatch>
__device__ __forceinline__ void llStoreBatch(char* to, uint64_t payload, uint64_t base, uint64_t end,
                                             uint32_t stride, const uint64_t (&v)[B]) {
#pragma unroll
  for (int u = 0; u < B; ++u) {
    const uint64_t i = llBatchLine(base, u, stride);
    if (i < end) llStore8(to + i * kLlLinePayload, v[u], payload - i * kLlLinePayload);
  }
}
// Pushes the batch's payload into source slot `mine` of a peer's lines.
template <int B = kLlBatch>
__device__ __forceinline__ void llPutBatch(LlLine* peerLines, uint64_t base, uint64_t end, uint32_t stride,
                                           const uint64_t (&v)[B], uint32_t flag) {
#pragma unroll
  for (int u = 0; u < B; ++u) {
    const uint64_t i = llBatchLine(base, u, stride);
    if (i < end) llPut(peerLines + i, v[u], flag);
  }
}
// Takes the batch's lines from source k: one poll of each line, all issued together, then llTake
// for any line still missing its flag. False as llTake.
template <int B = kLlBatch>
__device__ __forceinline__ bool llTakeBatch(const KernelParams& p, const LlArgs& a, int k, uint64_t base,
                                            uint64_t end, uint64_t (&v)[B], int coll) {
  uint32_t w[B][4];
#pragma unroll
  for (int u = 0; u < B; ++u) {
    const uint64_t i = llBatchLine(base, u, a.nthr);
    if (i < end) {
      asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(w[u][0]), "=r"(w[u][1]), "=r"(w[u][2]), "=r"(w[u][3])
                   : "l"(llOwnLine(p, a, k, i))
                   : "memory");
    } else {
      w[u][0] = w[u][2] = 0;
      w[u][1] = w[u][3] = a.flag;
    }
  }
  if (a.detailSeq != kNoTrace) {
    // The first poll's answer (the compare waits for it), then the stamp.
    const bool hit = w[0][1] == a.flag && w[0][3] == a.flag;
    traceAfter(p, blockIdx.x, a.detailSeq, kTraceStartBarrier, hit ? 1 : 2);
  }
#pragma unroll
  for (int u = 0; u < B; ++u) {
    const uint64_t i = llBatchLine(base, u, a.nthr);
    if (i >= end) {
      v[u] = 0;
    } else if (w[u][1] == a.flag && w[u][3] == a.flag) {
      v[u] = static_cast<uint64_t>(w[u][0]) | (static_cast<uint64_t>(w[u][2]) << 32);
      asm volatile("st.volatile.global.v4.u32 [%0], {%1, %1, %1, %1};" ::"l"(llOwnLine(p, a, k, i)), "r"(0u)
                   : "memory");
    } else {
      // The slow path: spin on this line. Through a temporary, so that v stays in registers
      // (llTake is not inlined, and an array element whose address it took would live in local
      // memory on the fast path too).
      uint64_t t;
      if (!llTake(p, llOwnLine(p, a, k, i), a.flag, &t, k, coll, a.epoch)) return false;
      v[u] = t;
    }
  }
  traceAfter(p, blockIdx.x, a.detailSeq, kTraceMoved, v[0]);
  return true;
}

// An LL op's reduction, resolved once per op (llRedOf): its dtype and op, and the PreMulSum
// scalar's bits (loaded when it is given by device pointer).
struct LlRed {
  uint64_t scalarBits;
  uint32_t divisor;
  int32_t dtype;
  DevRedOpKind kind;
};
__device__ __forceinline__ LlRed llRedOf(const WorkDesc& d) {
  LlRed o;
  o.dtype = d.dtype;
  o.kind = d.redOp.kind;
  o.divisor = d.redOp.divisor;
  o.scalarBits = d.redOp.scalarBits;
  if (d.scalarDevPtr) {
    const void* sp = reinterpret_cast<const void*>(d.scalarDevPtr);
    switch (elemSize(d.dtype)) {
      case 1: o.scalarBits = loadCg(static_cast<const uint8_t*>(sp)); break;
      case 2: o.scalarBits = loadCg(static_cast<const uint16_t*>(sp)); break;
      case 4: o.scalarBits = loadCg(static_cast<const uint32_t*>(sp)); break;
      default: o.scalarBits = loadCg(static_cast<const uint64_t*>(sp)); break;
    }
  }
  return o;
}

// One 8-byte word of a reduction in type T: acc = pre(v) (first) or combine(acc, pre(v)), then
// post() (last), as reduceCopy combines (docs/REDUCTIONS.md).
template <typename T, int FAMILY>
__device__ __forceinline__ uint64_t llStepAs(uint64_t acc, uint64_t v, bool first, bool last, const LlRed& o) {
  constexpr int kPer = 8 / sizeof(T);
  T scalar;
  memcpy(&scalar, &o.scalarBits, sizeof(T));
  const Reducer<T, FAMILY> red{scalar, o.divisor, o.kind == DevRedOpKind::PreMulSum,
                               o.kind == DevRedOpKind::SumPostDiv, o.kind == DevRedOpKind::Max};
  T a[kPer], x[kPer];
  memcpy(a, &acc, 8);
  memcpy(x, &v, 8);
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    a[e] = first ? red.pre(x[e]) : red.combine(a[e], red.pre(x[e]));
    if (last) a[e] = red.post(a[e]);
  }
  memcpy(&acc, a, 8);
  return acc;
}
template <typename T>
__device__ __forceinline__ uint64_t llStepTyped(uint64_t acc, uint64_t v, bool first, bool last, const LlRed& o) {
  if (o.kind == DevRedOpKind::Prod) return llStepAs<T, kFamilyProd>(acc, v, first, last, o);
  if (o.kind == DevRedOpKind::Min || o.kind == DevRedOpKind::Max)
    return llStepAs<T, kFamilyMinMax>(acc, v, first, last, o);
  return llStepAs<T, kFamilySum>(acc, v, first, last, o);
}
// The dtype x op dispatch of the LL reductions, one word at a time. The loop that moves the lines
// is one, inlined, and only this step depends on the type: a receive loop instantiated per dtype
// and op family and called out of line keeps, in its SASS, the op's and the kernel's parameters
// behind generic loads and its registers in local memory.
__device__ __noinline__ uint64_t llStep(uint64_t acc, uint64_t v, bool first, bool last, LlRed o) {
  switch (static_cast<DataType>(o.dtype)) {
    case DataType::Int8: return llStepTyped<int8_t>(acc, v, first, last, o);
    case DataType::Uint8: return llStepTyped<uint8_t>(acc, v, first, last, o);
    case DataType::Int32: return llStepTyped<int32_t>(acc, v, first, last, o);
    case DataType::Uint32: return llStepTyped<uint32_t>(acc, v, first, last, o);
    case DataType::Int64: return llStepTyped<int64_t>(acc, v, first, last, o);
    case DataType::Uint64: return llStepTyped<uint64_t>(acc, v, first, last, o);
    case DataType::Float16: return llStepTyped<__half>(acc, v, first, last, o);
    case DataType::Float32: return llStepTyped<float>(acc, v, first, last, o);
    case DataType::Float64: return llStepTyped<double>(acc, v, first, last, o);
    case DataType::Bfloat16: return llStepTyped<__nv_bfloat16>(acc, v, first, last, o);
    case DataType::Fp8E4M3: return llStepTyped<__nv_fp8_e4m3>(acc, v, first, last, o);
    case DataType::Fp8E5M2: return llStepTyped<__nv_fp8_e5m2>(acc, v, first, last, o);
  }
  return acc;
}

// The reducing collectives' receive side: for each of this thread's lines, every source's 8 bytes
// in rank order (this rank's own from its input), combined as reduceCopy does (pre on each input,
// combine left to right, post), written to the output. False when a wait failed.
template <int B = kLlBatch>
__device__ __forceinline__ bool llReduceLines(const KernelParams& p, const WorkDesc& d, const LlArgs& a) {
  const int n = p.nRanks, r = p.rank;
  const CollType coll = static_cast<CollType>(d.coll);
  const uint64_t esz = elemSize(d.dtype);
  const LlRed o = llRedOf(d);
  const char* own = reinterpret_cast<const char*>(d.sendbuff) + llSendOffset(coll, d.count, esz, r);
  char* recv = reinterpret_cast<char*>(d.recvbuff);
  const uint64_t end = a.range.first + a.range.count;
  traceAt(p, blockIdx.x, a.detailSeq, kTraceLoaded);  // (MKERNEL_KERNEL_TRACE=3: receive begun)
  for (uint64_t base = a.range.first + a.tid; base < end; base += B * a.nthr) {
    uint64_t acc[B] = {};
    // The own input's loads first, whatever this rank's place in the order: the polls below are
    // volatile asm, which the compiler does not move loads across.
    uint64_t mine[B];
    llLoadBatch<B>(own, a.payload, base, end, a.nthr, mine);
    for (int k = 0; k < n; ++k) {
      uint64_t v[B];
      if (k == r) {
#pragma unroll
        for (int u = 0; u < B; ++u) v[u] = mine[u];
      } else if (!llTakeBatch<B>(p, a, k, base, end, v, d.coll)) {
        return false;
      }
#pragma unroll
      for (int u = 0; u < B; ++u)
        if (llBatchLine(base, u, a.nthr) < end) acc[u] = llStep(acc[u], v[u], k == 0, k == n - 1, o);
    }
    llStoreBatch<B>(recv, a.payload, base, end, a.nthr, acc);
  }
  traceAt(p, blockIdx.x, a.detailSeq, kTraceEndBarrier);  // (MKERNEL_KERNEL_TRACE=3: combined, stored)
  return true;
}

// What CTA blockIdx.x of an LL op works with (launch_path.h). One CTA (every op up to
// kLlBytesPerCta) divides nothing. wholeOp: every line of the op (an LL batch's op, whose warps
// may be in any CTA), no division either.
__device__ __forceinline__ LlArgs llArgs(const KernelParams& p, const WorkDesc& d, uint64_t epoch, int ns,
                                         bool wholeOp = false) {
  LlArgs a;
  a.payload = llPayloadBytes(d.count, elemSize(d.dtype));
  a.range = wholeOp ? LlRange{0, llLines(a.payload)} : llCtaLines(llLines(a.payload), gridDim.x, blockIdx.x);
  a.slotLines = llSlotLines(p.nRanks);
  a.lineBase = 0;
  a.epoch = epoch;
  a.ns = ns;
  a.parity = static_cast<int>(epoch & 1);
  a.flag = llFlag(epoch);
  a.tid = threadIdx.x;
  a.nthr = blockDim.x;
  a.detailSeq = kNoTrace;
  return a;
}

// LL phases 0 and 1 (launch_path.h), this CTA's share: the token, and every line it pushes. The
// launch kernel runs them before anything else: the peers' receives wait for these
// stores and for nothing else of this kernel, so the frame's own setup (the shared state, the
// stop flag's mirror, the barrier) overlaps the NVLink crossing instead of preceding it. Peers'
// addresses come from the kernel's parameters (no shared state is set up yet). stop: the
// communicator has failed, nothing is stored; its loads are issued before stop is tested, so that
// the stop flag's latency and the input's overlap. token: phase 0 too (an LL batch's first op only).
template <int B = kLlBatch>
__device__ __forceinline__ void llPush(const KernelParams& p, const WorkDesc& d, const LlArgs& a, bool stop,
                                      bool token = true) {
  const int n = p.nRanks, r = p.rank, cta = blockIdx.x;
  const CollType coll = static_cast<CollType>(d.coll);
  const uint64_t esz = elemSize(d.dtype);
  const uint64_t payload = a.payload;
  const uint32_t flag = a.flag;
  const int ns = a.ns;
  // Our slot's first line, in every peer. pathOf (llTakes) keeps llLines(payload) <= slotLines.
  const uint64_t mine = llSlotLine(a.slotLines, r, a.lineBase);
  const char* send = reinterpret_cast<const char*>(d.sendbuff);
  const int tid = static_cast<int>(a.tid);
  const uint64_t first = a.range.first + a.tid;
  const uint64_t end = a.range.first + a.range.count;
  const uint32_t stride = a.nthr;
  const uint64_t step = B * stride;
  // 0. The token: this rank has started op e (so it has finished op e - 1).
  if (token && !stop && cta == 0 && tid < n && tid != r) llPut(&p.peers[tid]->ll[ns].token[a.parity][r], 0, flag);
  // 1. Push, a batch at a time.
  if (coll == CollType::ReduceScatter) {
    for (uint64_t base = first; base < end; base += step) {
      for (int k = 0; k < n; ++k) {
        if (k == r) continue;
        uint64_t v[B];
        llLoadBatch<B>(send + llSendOffset(coll, d.count, esz, k), payload, base, end, stride, v);
        if (!stop) llPutBatch<B>(&p.peers[k]->ll[ns].lines[a.parity][mine], base, end, stride, v, flag);
      }
    }
  } else if (!(coll == CollType::Broadcast && r != d.root) && !(coll == CollType::Reduce && r == d.root)) {
    for (uint64_t base = first; base < end; base += step) {
      uint64_t v[B];
      llLoadBatch<B>(send, payload, base, end, stride, v);
      for (int k = 0; k < n && !stop; ++k)
        if (k != r && llSends(coll, r, k, d.root))
          llPutBatch<B>(&p.peers[k]->ll[ns].lines[a.parity][mine], base, end, stride, v, flag);
    }
  }
}

// LL phase 2 of one op, this CTA's share: its lines received, combined and written. This
// thread's answer (no barrier); false when a wait failed.
template <int B = kLlBatch>
__device__ __forceinline__ bool llReceive(const KernelParams& p, const WorkDesc& d, const LlArgs& a) {
  const int n = p.nRanks, r = p.rank;
  const CollType coll = static_cast<CollType>(d.coll);
  const uint64_t payload = a.payload;
  const char* send = reinterpret_cast<const char*>(d.sendbuff);
  char* recv = reinterpret_cast<char*>(d.recvbuff);
  const uint64_t first = a.range.first + a.tid;
  const uint64_t end = a.range.first + a.range.count;
  const uint32_t stride = a.nthr;
  const uint64_t step = B * stride;
  // 2. Receive.
  bool ok = true;
  if (coll == CollType::AllReduce || coll == CollType::ReduceScatter || (coll == CollType::Reduce && r == d.root)) {
    ok = llReduceLines<B>(p, d, a);
  } else if (coll == CollType::AllGather) {
    for (uint64_t base = first; base < end && ok; base += step) {
      for (int k = 0; k < n && ok; ++k) {
        uint64_t v[B];
        if (k == r) {
          if (send == recv + static_cast<uint64_t>(r) * payload) continue;  // in place: already there
          llLoadBatch<B>(send, payload, base, end, stride, v);
        } else {
          ok = llTakeBatch<B>(p, a, k, base, end, v, d.coll);
        }
        if (ok) llStoreBatch<B>(recv + static_cast<uint64_t>(k) * payload, payload, base, end, stride, v);
      }
    }
  } else if (coll == CollType::Broadcast && !(r == d.root && send == recv)) {
    for (uint64_t base = first; base < end && ok; base += step) {
      uint64_t v[B];
      if (r == d.root) {
        llLoadBatch<B>(send, payload, base, end, stride, v);
      } else {
        ok = llTakeBatch<B>(p, a, d.root, base, end, v, d.coll);
      }
      if (ok) llStoreBatch<B>(recv, payload, base, end, stride, v);
    }
  }
  return ok;
}

// LL phase 3: every peer's token of this exchange (CTA 0's threads 32 + peer, or peer in a CTA of
// one warp). This thread's answer. The pollers are in the second warp so that, for the small ops
// whose lines all belong to the first, they wait for the tokens while it receives (in the first
// warp the two waits would run one after the other).
__device__ bool llTokens(const KernelParams& p, const LlArgs& a, int coll) {
  const int tid = static_cast<int>(threadIdx.x) - (blockDim.x >= 64 ? 32 : 0);
  if (blockIdx.x != 0 || tid < 0 || tid >= p.nRanks || tid == p.rank) return true;
  uint64_t unused;
  return llTake(p, &p.self->ll[a.ns].token[a.parity][tid], a.flag, &unused, tid, coll, a.epoch);
}

// LL phases 2 and 3 of one op, this CTA's share (llPush ran phases 0 and 1 before). The same
// answer in every thread: false when a wait failed.
template <int B = kLlBatch>
__device__ __forceinline__ bool llFinish(const KernelParams& p, const WorkDesc& d, const LlArgs& a, uint64_t traceSeq) {
  bool ok = llReceive<B>(p, d, a);
  traceAt(p, blockIdx.x, traceSeq, kTraceMoved);  // (this thread's lines received and written)
  if (ok) ok = llTokens(p, a, d.coll);
  return __syncthreads_and(ok) != 0;
}

// One LL op's phases 2 and 3 in launchKernel (llPush ran phases 0 and 1 at the kernel's start).
// False when the communicator had failed or a wait failed.
__device__ bool launchLl(const KernelParams& p, const WorkDesc& d, uint64_t epoch, int ns, uint64_t traceSeq) {
  return llFinish(p, d, llArgs(p, d, epoch, ns), traceSeq);
}

// One launch-path collective, this CTA's share (the kernel below adds the captured launches'
// sequence numbers around it). ns: the namespace of flags and inboxes (kLaunchEager/kLaunchGraph).
// False when the communicator had failed or a wait failed.
// kDirectOnly: launchDirectKernel's instance, direct mode only (n > 1: launchDirect_ needs peers).
template <bool kDirectOnly>
__device__ __forceinline__ bool launchRun(const KernelParams& p, SharedState& sh, const WorkDesc& d, uint64_t epoch,
                                          int ns, int mode, uint64_t traceSeq) {
  const bool direct = mode == kLaunchModeDirect;
  const int cta = blockIdx.x;
  const int n = p.nRanks, r = p.rank;
  const CollType coll = static_cast<CollType>(d.coll);
  const uint64_t esz = elemSize(d.dtype);
  const bool reduce = coll == CollType::AllReduce || coll == CollType::ReduceScatter || coll == CollType::Reduce;
  if (sh.stop) return false;
  if (kDirectOnly) return launchDirect(p, sh, d, cta, epoch, ns);
  if (mode == kLaunchModeLl && n > 1) return launchLl(p, d, epoch, ns, traceSeq);
  if (direct && n > 1) return launchDirect(p, sh, d, cta, epoch, ns);
  const LaunchPart lp = launchPart(coll, d.count, n, r, d.root, gridDim.x, cta, esz);
  const char* send = reinterpret_cast<const char*>(d.sendbuff);
  char* recv = reinterpret_cast<char*>(d.recvbuff);
  const char* srcs[kMaxRanks];
  if (n == 1) {
    // Nothing to wait for: the op's own copy or reduction (pre/post ops included) in place.
    srcs[0] = send + lp.part.offset * esz;
    launchMove(sh, d, reduce, srcs, 1, recv + lp.part.offset * esz, lp.part.count, esz);
  } else {
    const int parity = static_cast<int>(epoch & 1);
    char* inbox = p.self->launch[ns].inbox[parity];
    for (int b = 0; b < lp.publishBlocks; ++b) {
      const uint64_t off = static_cast<uint64_t>(b) * d.count + lp.part.offset;
      srcs[0] = send + off * esz;
      launchMove(sh, d, false, srcs, 1, inbox + off * esz, lp.part.count, esz);
    }
    // Arrive (the CTA's inbox writes are ordered before thread 0's release by bar.sync), then
    // wait for every peer's CTA of the same index.
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      storeRelease(&p.self->launch[ns].arrive[cta].epoch, epoch);
    }
    bool ok = true;
    const int peer = static_cast<int>(threadIdx.x);
    if (peer < n && peer != r)
      ok = waitGeq(p, &sh.peers[peer]->launch[ns].arrive[cta].epoch, epoch, cta, peer, kWaitLaunchPeer, d.coll);
    if (!__syncthreads_and(ok)) return false;
    if (lp.compute && lp.part.count > 0) {
      if (coll == CollType::AllGather) {
        for (int k = 0; k < n; ++k) {
          srcs[0] = sh.peers[k]->launch[ns].inbox[parity] + lp.readOffset * esz;
          launchMove(sh, d, false, srcs, 1, recv + (static_cast<uint64_t>(k) * d.count + lp.part.offset) * esz,
                     lp.part.count, esz);
        }
      } else if (coll == CollType::Broadcast) {
        srcs[0] = sh.peers[d.root]->launch[ns].inbox[parity] + lp.readOffset * esz;
        launchMove(sh, d, false, srcs, 1, recv + lp.part.offset * esz, lp.part.count, esz);
      } else {
        for (int k = 0; k < n; ++k) srcs[k] = sh.peers[k]->launch[ns].inbox[parity] + lp.readOffset * esz;
        launchMove(sh, d, true, srcs, n, recv + lp.part.offset * esz, lp.part.count, esz);
      }
    }
  }
  return true;
}

// MKERNEL_PDL (launchPath): a launch-path kernel launched with programmatic stream serialization
// may start before the work ahead of it on the stream (the previous collective's kernel, or the
// application's) has completed; griddepcontrol.wait returns once that work has completed and its
// memory is visible, so it comes before anything the kernel reads: after it, the kernel sees
// what a plain launch would see at its start (every comment below that says "this launch started
// after that one ended" holds). pdl 2 then lets the stream's next programmatic launch (our next
// collective) become resident at once, to wait in its own pdlEnter instead of being launched
// after this kernel ends: what it saves is the launch latency between consecutive collectives.
// A kernel launched without the attribute passes griddepcontrol.wait at once.
__device__ __forceinline__ void pdlEnter(const KernelParams& p) {
#if __CUDA_ARCH__ >= 900
  if (p.pdl != 0) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (p.pdl == 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
#endif
}

// The launch-path kernels' trace record and first stamp (MKERNEL_KERNEL_TRACE): eager ops, record
// epoch - 1; with MKERNEL_KERNEL_TRACE=2 or 3 captured ops instead, record their graph number - 1,
// which CTA 0's thread 0 reads here (its start stamp taken before that read). kNoTrace otherwise.
__device__ __forceinline__ uint64_t launchTraceBegin(const KernelParams& p, bool graph, uint64_t epoch) {
  if (p.trace == nullptr || (p.traceGraph != 0) != graph) return kNoTrace;
  if (!graph) {
    traceAt(p, blockIdx.x, epoch - 1, kTraceSeen);
    return epoch - 1;
  }
  if (blockIdx.x != 0 || threadIdx.x != 0) return kNoTrace;
  const uint64_t t0 = globalTimerNs(), c0 = clock64();
  const uint64_t seq = loadVolatile64(&p.self->graphSeq);
  KernelTraceRecord* r = &p.trace[seq % kTraceDepth];
  r->t[kTraceSeen] = t0;
  r->c[kTraceSeen] = c0;
  r->seq = seq + 1;
  return seq;
}

// A captured launch-path op's numbering at its end (thread 0 of each CTA, after every thread of its
// CTA has read graphSeq): the last CTA to finish counts the op in graphOps and stores its number e.
// MKERNEL_GRAPH_EPILOGUE=light: the only order the numbering needs within this launch is that every
// CTA read graphSeq before the last CTA stores the new value. fenceFirst: the CTA read it with a
// plain load, and a fence keeps that read before its add (several CTAs); otherwise it was an
// acquire load, which does. The last CTA's acquire add keeps its store after every other CTA's add.
// The next launch sees the stores without fences: it starts after this kernel has completed (stream
// order, or an event across streams). One CTA (every LL op up to 8 KiB) needs no counter at all:
// its store follows the reads of the same word. fenced: two __threadfence and a plain atomic.
__device__ __forceinline__ void graphEpilogue(const KernelParams& p, int coll, uint64_t e, bool fenceFirst) {
  if (p.graphEpilogueLight) {
    if (gridDim.x > 1 && fenceFirst) __threadfence();
    if (gridDim.x == 1 || atomicAddAcquireGpu(&p.self->graphCtasDone, 1u) + 1 == gridDim.x) {
      if (gridDim.x > 1) p.self->graphCtasDone = 0;
      p.self->graphOps[coll] += 1;
      *reinterpret_cast<volatile uint64_t*>(&p.self->graphSeq) = e;
    }
    return;
  }
  __threadfence();
  if (atomicAdd(&p.self->graphCtasDone, 1u) + 1 == gridDim.x) {
    p.self->graphCtasDone = 0;
    p.self->graphOps[coll] += 1;
    __threadfence();
    *reinterpret_cast<volatile uint64_t*>(&p.self->graphSeq) = e;
  }
}

// epoch 0: a launch captured into a CUDA graph. Its sequence number is graphSeq + 1, read by each
// CTA at its start; the last CTA to finish stores it back (by then every CTA of this launch has
// read the old value, and the next launch of this communicator starts after this one ended:
// stream order, launch_path.h). Its flags and inbox are the graph namespace's.
// p and d are __grid_constant__: the callees take them by reference, and a plain kernel parameter
// whose address is taken is first copied to local memory (27-47 local stores at every op,
// measured); a grid constant's address is its place in the constant bank.
// The body of launchKernel and of launchDirectKernel (kDirectOnly: mode is kLaunchModeDirect).
template <bool kDirectOnly>
__device__ __forceinline__ void launchBody(const KernelParams& p, const WorkDesc& d, uint64_t epoch, uint64_t opIndex,
                                           int mode, SharedState& sh) {
  if (p.warmup) return;  // warmKernels
  pdlEnter(p);
  const bool graph = epoch == 0;
  // MKERNEL_KERNEL_TRACE, eager ops (record epoch - 1): start, set up, [LL: pushed, received],
  // collective done, reported (collbench --trace; docs/KERNEL.md, "Kernel trace").
  const uint64_t traceSeq = launchTraceBegin(p, graph, epoch);
  // Every thread reads the stop flag and (captured) the sequence number itself, so that an LL op
  // can push before the CTA's first barrier (llPush); plain volatile loads, which the input's
  // loads need not wait for. graphSeq holds the same value for every thread of every CTA during
  // this launch: only the previous launch wrote it, this one started after that one ended, and
  // this one's last CTA stores the next value only after every CTA passed its end barrier.
  const bool stop = stopRequested(p);  // a failed communicator: release the stream
  if (!kDirectOnly && mode == kLaunchModeLl && p.nRanks > 1) {
    const uint64_t e0 = !graph ? epoch : loadVolatile64(&p.self->graphSeq) + 1;
    llPush(p, d, llArgs(p, d, e0, graph ? kLaunchGraph : kLaunchEager), stop);
  }
  traceAt(p, blockIdx.x, traceSeq, kTraceLoaded);  // (LL: this thread's pushes issued)
  if (threadIdx.x == 0) {
    sh.stop = stop ? 1 : 0;
    // The value the epilogue numbers this launch with: with the light epilogue an acquire load,
    // which keeps this CTA's atomicAdd on graphCtasDone after it (launchKernel's end).
    sh.epoch = !graph ? epoch
               : (p.graphEpilogueLight ? loadAcquireGpu(&p.self->graphSeq) : loadVolatile64(&p.self->graphSeq)) + 1;
    // The launch watch (MKERNEL_LAUNCH_WATCH), for the watched ops only: a posted store into host
    // memory, whose flush would hold back the kernel's end at every op.
    if (!graph && blockIdx.x == 0 && (p.launchWatch == 2 || (p.launchWatch == 1 && epoch == 1)))
      p.ctl->launchStarted = epoch;
  }
  if (threadIdx.x < kMaxRanks) sh.peers[threadIdx.x] = threadIdx.x < p.nRanks ? p.peers[threadIdx.x] : nullptr;
  __syncthreads();
  const uint64_t e = sh.epoch;
  traceAt(p, blockIdx.x, traceSeq, kTraceStartBarrier);  // (set up)
  const bool ran = launchRun<kDirectOnly>(p, sh, d, e, graph ? kLaunchGraph : kLaunchEager, mode, traceSeq);
  traceAt(p, blockIdx.x, traceSeq, kTraceEndBarrier);
  if (!graph) {
    // Statistics and finalize: device memory (the host copies it when it needs it).
    if (ran && blockIdx.x == 0 && threadIdx.x == 0)
      *reinterpret_cast<volatile uint64_t*>(&p.self->launchDone[d.coll]) = opIndex;
    traceAt(p, blockIdx.x, traceSeq, kTraceReported);
    return;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  // (light: thread 0 read graphSeq with acquire, above)
  graphEpilogue(p, d.coll, e, /*fenceFirst=*/false);
  traceAt(p, blockIdx.x, traceSeq, kTraceReported);
}

__global__ void __launch_bounds__(kLaunchThreads, 1) launchKernel(const __grid_constant__ KernelParams p,
                                                                  const __grid_constant__ WorkDesc d, uint64_t epoch,
                                                                  uint64_t opIndex, int mode) {
  __shared__ SharedState sh;
  launchBody<false>(p, d, epoch, opIndex, mode, sh);
}

// MKERNEL_DIRECT_KERNEL=own (the default): a direct-mode op (the large collectives of
// thread ranks, launch_path.h) in a kernel of its own with kDirectThreads threads per CTA, twice
// launchKernel's: direct mode moves whole buffers, and a CTA's loads in flight are what its rate
// is bound by (reduceCopy, copyBytes: kUnroll 16-byte vectors per thread and source). launchKernel
// carries the LL and inbox modes too, whose registers (152 per thread) allow 256 threads per SM.
// The same protocol, flags, mailboxes and numbering as launchKernel's direct mode.
__global__ void __launch_bounds__(kDirectThreads, 1) launchDirectKernel(const __grid_constant__ KernelParams p,
                                                                        const __grid_constant__ WorkDesc d,
                                                                        uint64_t epoch, uint64_t opIndex) {
  __shared__ SharedState sh;
  launchBody<true>(p, d, epoch, opIndex, kLaunchModeDirect, sh);
}

// MKERNEL_LL_KERNEL=own (the default): a launch-path LL op in a kernel of its own,
// without launchKernel's frame (the shared state, the peers' table copied into it, the mode
// dispatch, a second llArgs): the token and pushes first, one barrier that agrees on the stop flag,
// the receive and the tokens (llFinish), the numbering. The same protocol, slots, flags and
// numbers as launchKernel's LL mode (the two may follow each other on a communicator).
// launchKernel's LL op takes 5.0-5.2 us from start to end on one H200 with two emulated
// ranks, where a bare kernel doing the same exchange takes under 1 us (mkernel-latbench exch-ll,
// docs/PERFORMANCE.md).
__global__ void __launch_bounds__(kLaunchThreads, 1) launchLlKernel(const __grid_constant__ KernelParams p,
                                                                    const __grid_constant__ WorkDesc d,
                                                                    uint64_t epoch, uint64_t opIndex) {
  if (p.warmup) return;  // warmKernels
  pdlEnter(p);
  const bool graph = epoch == 0;
  const int ns = graph ? kLaunchGraph : kLaunchEager;
  // The trace as launchKernel's (eager ops, or captured ones with MKERNEL_KERNEL_TRACE=2 or 3).
  const uint64_t traceSeq = launchTraceBegin(p, graph, epoch);
  // Captured: the number graphSeq + 1, the same for every thread of every CTA (launchKernel). A
  // plain volatile load, so that the input's loads (llPush) need not wait for it as they would for
  // an acquire; the epilogue's counter (several CTAs) has a fence before it instead.
  const bool stop = stopRequested(p);
  const uint64_t e = !graph ? epoch : loadVolatile64(&p.self->graphSeq) + 1;
  LlArgs a = llArgs(p, d, e, ns, /*wholeOp=*/gridDim.x == 1);
  // At most a line per thread (up to 2 KiB per source with 256 threads): the loops without
  // kLlBatch's unrolling, a quarter of the code to run (with them an 8-byte op spends most of
  // its time between consecutive stamps of a few instructions, the code the CTA's SM has to fetch).
  const bool tiny = a.range.count <= a.nthr;
  if (tiny)
    llPush<1>(p, d, a, stop);
  else
    llPush(p, d, a, stop);
  // MKERNEL_KERNEL_TRACE=3: the receive's own stamps (llReduceLines, llTakeBatch) instead of the
  // stages'; only seen and reported stay.
  const uint64_t stageSeq = p.traceGraph == 2 ? kNoTrace : traceSeq;
  if (p.traceGraph == 2) a.detailSeq = traceSeq;
  traceAt(p, blockIdx.x, stageSeq, kTraceLoaded);  // (this thread's pushes issued)
  if (!graph && blockIdx.x == 0 && threadIdx.x == 0 && (p.launchWatch == 2 || (p.launchWatch == 1 && epoch == 1)))
    p.ctl->launchStarted = epoch;
  // One answer for the CTA: a thread that saw the stop flag pushed nothing.
  bool ok = __syncthreads_or(stop) == 0;
  traceAt(p, blockIdx.x, stageSeq, kTraceStartBarrier);
  if (ok) ok = tiny ? llFinish<1>(p, d, a, stageSeq) : llFinish(p, d, a, stageSeq);
  traceAt(p, blockIdx.x, stageSeq, kTraceEndBarrier);
  if (!graph) {
    if (ok && blockIdx.x == 0 && threadIdx.x == 0)
      *reinterpret_cast<volatile uint64_t*>(&p.self->launchDone[d.coll]) = opIndex;
    traceAt(p, blockIdx.x, traceSeq, kTraceReported);
    return;
  }
  // launchKernel's graph epilogue, after every thread's last use of e (llFinish's barrier; a
  // stopped CTA passed the barrier above).
  if (threadIdx.x != 0) return;
  graphEpilogue(p, d.coll, e, /*fenceFirst=*/true);  // (graphSeq read with a plain load, above)
  traceAt(p, blockIdx.x, traceSeq, kTraceReported);
}

// The barrier between an LL batch's waves over every CTA of its grid. The batch's CTAs are
// resident together (at most launchCap_ of them, which agreeLaunchCap bounds by what the SMs hold
// with every co-located rank's), so a CTA may wait for the others, as grid.sync() does: each
// CTA's writes, then its arrival (thread 0: fence, add), then a wait for every CTA's arrival at
// this barrier (`target`: gridDim.x per barrier so far). ok: the CTA's answer so far (the same in
// every thread). Returns the CTA's answer; false also when the communicator stopped.
__device__ __noinline__ bool llGridBarrier(const KernelParams& p, uint32_t target, bool ok) {
  __shared__ int passed;
  ok = __syncthreads_and(ok) != 0;  // this CTA's writes of the wave done
  if (gridDim.x == 1) return ok;
  if (threadIdx.x == 0) {
    __threadfence();  // the CTA's writes (observed through the barrier) before its arrival
    atomicAdd(&p.self->batchArrive, 1u);
    int good = 1;
    for (uint32_t iter = 1; loadAcquireGpu32(&p.self->batchArrive) < target; ++iter)
      if ((iter & 255) == 0 && stopRequested(p)) {
        good = 0;
        break;
      }
    passed = good;
  }
  __syncthreads();
  return ok && passed != 0;
}

// MKERNEL_LL_BATCH=exchange: the batch's ops as one LL exchange (launch_path.h, "LL batches"):
// number e, one flag, one token per peer for the whole batch; op i's lines start at line
// b.lineBase[i] of each slot, after the earlier ops'. The ops run in waves (llPlanWaves, this
// rank's host): the ops of a wave at the same time, op i on warps [warpFirst[i], + warpCount[i])
// of the grid (push, then receive), a barrier over the grid's CTAs between waves (llGridBarrier),
// so that a later op's reads and writes of this rank's memory come after an earlier op's that
// they overlap. ok: the CTA's common answer so far. Returns the CTA's.
__device__ __forceinline__ bool llBatchExchange(const KernelParams& p, const LlBatch& b, uint64_t e, int ns,
                                                uint64_t traceSeq, bool ok, bool eager) {
  const int n = p.nRanks, r = p.rank;
  const int tid = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x), warp = tid / 32;
  const uint32_t flag = llFlag(e);
  // Phase 0, the batch's token: this rank has started exchange e (so it has finished e - 1).
  if (ok && tid < n && tid != r) llPut(&p.peers[tid]->ll[ns].token[static_cast<int>(e & 1)][r], 0, flag);
  uint32_t barriers = 0;
  for (int first = 0; first < b.nOps;) {
    int end = first + 1;
    while (end < b.nOps && !((b.waveMask >> end) & 1u)) ++end;
    int mine = -1;
    for (int i = first; i < end; ++i)
      if (warp >= b.warpFirst[i] && warp < b.warpFirst[i] + b.warpCount[i]) mine = i;
    if (ok && mine >= 0) {
      LlArgs a = llArgs(p, b.ops[mine], e, ns, /*wholeOp=*/true);
      a.lineBase = b.lineBase[mine];
      a.tid = static_cast<uint32_t>(tid - 32 * b.warpFirst[mine]);
      a.nthr = 32u * b.warpCount[mine];
      llPush(p, b.ops[mine], a, false, false);
      if (first == 0) {  // (thread 0's op of the first wave pushed; no set-up follows)
        traceAt(p, blockIdx.x, traceSeq, kTraceLoaded);
        traceAt(p, blockIdx.x, traceSeq, kTraceStartBarrier);
      }
      ok = llReceive(p, b.ops[mine], a);
    }
    if (end < b.nOps) ok = llGridBarrier(p, ++barriers * gridDim.x, ok);  // this wave's reads and writes done
    first = end;
  }
  traceAt(p, blockIdx.x, traceSeq, kTraceMoved);  // (every wave received)
  if (ok) ok = llTokens(p, llArgs(p, b.ops[0], e, ns, /*wholeOp=*/true), b.ops[0].coll);
  ok = __syncthreads_and(ok) != 0;
  traceAt(p, blockIdx.x, traceSeq, kTraceEndBarrier);
  if (ok && eager && tid == 0)
    for (int i = 0; i < b.nOps; ++i)
      *reinterpret_cast<volatile uint64_t*>(&p.self->launchDone[b.ops[i].coll]) = b.opIndex[i];
  // The barrier's counters back to 0 for the next launch: by the last CTA to leave (every CTA has
  // then passed every barrier of this one).
  if (barriers > 0 && gridDim.x > 1 && threadIdx.x == 0 &&
      atomicAddAcquireGpu(&p.self->batchLeft, 1u) + 1 == gridDim.x) {
    p.self->batchArrive = 0;
    p.self->batchLeft = 0;
  }
  return ok;
}

// MKERNEL_LL_BATCH=serial: op i is number e0 + i, each its own exchange, after op i - 1 ended.
__device__ __forceinline__ void llBatchSerial(const KernelParams& p, const LlBatch& b, uint64_t e0, int ns, bool ok,
                                              bool eager) {
  for (int i = 0; i < b.nOps && ok; ++i) {
    const uint64_t e = e0 + static_cast<uint64_t>(i);
    const uint64_t traceSeq = eager ? e - 1 : kNoTrace;
    traceAt(p, 0, traceSeq, kTraceSeen);
    const LlArgs a = llArgs(p, b.ops[i], e, ns);
    llPush(p, b.ops[i], a, false);
    traceAt(p, 0, traceSeq, kTraceLoaded);
    traceAt(p, 0, traceSeq, kTraceStartBarrier);
    ok = llFinish(p, b.ops[i], a, traceSeq);
    traceAt(p, 0, traceSeq, kTraceEndBarrier);
    if (ok && eager && threadIdx.x == 0)
      *reinterpret_cast<volatile uint64_t*>(&p.self->launchDone[b.ops[i].coll]) = b.opIndex[i];
    traceAt(p, 0, traceSeq, kTraceReported);
  }
}

// A group's run of LL ops in one launch (launch_path.h, "LL batches"). MKERNEL_LL_BATCH=serial
// (b.exchange 0; one CTA): op i is the communicator's launch-path op e0 + i, run after op i - 1
// has ended (its receives and its peers' tokens), which is what the LL protocol needs between
// consecutive ops of one rank. exchange (b.exchange 1): llBatchExchange, one number for the
// batch, over the grid's CTAs. Only LL code: no shared state, no other mode.
__global__ void __launch_bounds__(kLaunchThreads, 1) launchLlBatchKernel(const __grid_constant__ KernelParams p,
                                                                         const __grid_constant__ LlBatch b) {
  if (p.warmup) return;  // warmKernels
  pdlEnter(p);
  const bool graph = b.epoch == 0;
  const int ns = graph ? kLaunchGraph : kLaunchEager;
  // Captured: graphSeq is the same for every thread during this launch (launchKernel). Thread 0
  // of each CTA reads it with acquire, which keeps the epilogue's counter after its read (below).
  const uint64_t e0 =
      !graph ? b.epoch
             : (threadIdx.x == 0 ? loadAcquireGpu(&p.self->graphSeq) : loadVolatile64(&p.self->graphSeq)) + 1;
  const uint64_t eLast = e0 + (b.exchange ? 0 : static_cast<uint64_t>(b.nOps) - 1);
  // The launch watch (launchKernel's): the batch's last number, which the host watches.
  if (!graph && blockIdx.x == 0 && threadIdx.x == 0 && (p.launchWatch == 2 || (p.launchWatch == 1 && b.epoch == 1)))
    p.ctl->launchStarted = eLast;
  // One answer for the CTA (the exchange's waves meet at barriers every thread reaches).
  bool ok = __syncthreads_or(stopRequested(p)) == 0;
  if (b.exchange) {
    const uint64_t traceSeq = graph ? kNoTrace : e0 - 1;
    traceAt(p, blockIdx.x, traceSeq, kTraceSeen);
    ok = llBatchExchange(p, b, e0, ns, traceSeq, ok, !graph);
    traceAt(p, blockIdx.x, traceSeq, kTraceReported);
  } else {
    llBatchSerial(p, b, e0, ns, ok, !graph);
  }
  if (!graph || threadIdx.x != 0) return;
  // The graph epilogue (launchKernel's, for every op of the batch, run or failed, as there): the
  // batch's last number, stored by the last CTA to finish. Every thread read graphSeq before the
  // last barrier it passed (a stopped batch uses no number); thread 0's acquire read keeps its
  // CTA's add on the counter after it, and the last CTA's acquire add keeps the store after
  // every other CTA's add. One CTA needs no counter.
  if (!p.graphEpilogueLight) __threadfence();
  if (gridDim.x > 1 && atomicAddAcquireGpu(&p.self->graphCtasDone, 1u) + 1 != gridDim.x) return;
  if (gridDim.x > 1) p.self->graphCtasDone = 0;
  for (int i = 0; i < b.nOps; ++i) p.self->graphOps[b.ops[i].coll] += 1;
  if (!p.graphEpilogueLight) __threadfence();
  *reinterpret_cast<volatile uint64_t*>(&p.self->graphSeq) = eLast;
}

__global__ void probeKernel() {}
}  // namespace dev

int probeFreshStreams(int n, double seconds) {
  std::vector<cudaStream_t> streams;
  for (int i = 0; i < n; ++i) {
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) break;
    dev::probeKernel<<<1, 32, 0, s>>>();
    streams.push_back(s);
  }
  (void)cudaGetLastError();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int ran = 0;
  std::vector<bool> done(streams.size(), false);
  while (std::chrono::steady_clock::now() < deadline && ran < static_cast<int>(streams.size())) {
    for (size_t i = 0; i < streams.size(); ++i)
      if (!done[i] && cudaStreamQuery(streams[i]) == cudaSuccess) {
        done[i] = true;
        ++ran;
      }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  (void)cudaGetLastError();
  for (cudaStream_t s : streams) (void)cudaStreamDestroy(s);  // pending work still completes
  return ran;
}

Result persistentKernelLocalBytes(size_t* out) {
  cudaFuncAttributes attr;
  // Also loads the kernels now (CUDA's lazy loading would load a kernel at its first launch, and
  // loading waits for running kernels; NCCL queries its kernels at init for the same reason).
  cudaError_t err = cudaFuncGetAttributes(&attr, dev::launchLlBatchKernel);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "attributes of the LL batch kernel: %s", cudaGetErrorString(err));
  size_t batchLocal = attr.localSizeBytes;
  err = cudaFuncGetAttributes(&attr, dev::launchLlKernel);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "attributes of the LL kernel: %s", cudaGetErrorString(err));
  if (attr.localSizeBytes > batchLocal) batchLocal = attr.localSizeBytes;
  err = cudaFuncGetAttributes(&attr, dev::launchDirectKernel);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "attributes of the direct-mode kernel: %s", cudaGetErrorString(err));
  if (attr.localSizeBytes > batchLocal) batchLocal = attr.localSizeBytes;
  err = cudaFuncGetAttributes(&attr, dev::launchKernel);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "attributes of the launch-path kernel: %s", cudaGetErrorString(err));
  const size_t launchLocal = attr.localSizeBytes > batchLocal ? attr.localSizeBytes : batchLocal;
  err = cudaFuncGetAttributes(&attr, dev::persistentKernel);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "attributes of the persistent kernel: %s", cudaGetErrorString(err));
  *out = attr.localSizeBytes > launchLocal ? attr.localSizeBytes : launchLocal;
  return Result::Success;
}

Result warmKernels(cudaStream_t stream) {
  KernelParams p{};
  p.warmup = 1;
  dev::persistentKernel<<<1, kKernelThreads, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) {
    dev::launchKernel<<<1, kLaunchThreads, 0, stream>>>(p, WorkDesc{}, 0, 0, 0);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    dev::launchLlBatchKernel<<<1, kLaunchThreads, 0, stream>>>(p, LlBatch{});
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    dev::launchLlKernel<<<1, kLaunchThreads, 0, stream>>>(p, WorkDesc{}, 0, 0);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    dev::launchDirectKernel<<<1, kDirectThreads, 0, stream>>>(p, WorkDesc{}, 0, 0);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "warm-up launches of the kernels failed: %s", cudaGetErrorString(err));
  return Result::Success;
}

Result launchPersistentKernel(const KernelParams& p, cudaStream_t stream) {
  dev::persistentKernel<<<p.nCtas, kKernelThreads, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "rank %d: launching the persistent kernel (%d CTAs) failed: %s",
                    p.rank, p.nCtas, cudaGetErrorString(err));
  return Result::Success;
}

namespace {
// A launch-path kernel: with MKERNEL_PDL, through cudaLaunchKernelEx with programmatic stream
// serialization (the kernel then waits for the stream's earlier work itself: pdlEnter).
template <typename... Params, typename... Args>
cudaError_t launchPath(void (*kernel)(Params...), const KernelParams& p, int nCtas, int threads, cudaStream_t stream,
                       Args&&... args) {
  if (p.pdl == 0) {
    kernel<<<nCtas, threads, 0, stream>>>(std::forward<Args>(args)...);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(nCtas));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
}  // namespace

Result launchCollective(const KernelParams& p, const WorkDesc& d, int nCtas, uint64_t epoch, uint64_t opIndex,
                        int mode, cudaStream_t stream) {
  cudaError_t err;
  if (mode == kLaunchModeLl && p.nRanks > 1 && (p.ownKernels & kOwnKernelLl) != 0)
    err = launchPath(dev::launchLlKernel, p, nCtas, kLaunchThreads, stream, p, d, epoch, opIndex);
  else if (mode == kLaunchModeDirect && (p.ownKernels & kOwnKernelDirect) != 0)
    err = launchPath(dev::launchDirectKernel, p, nCtas, kDirectThreads, stream, p, d, epoch, opIndex);
  else
    err = launchPath(dev::launchKernel, p, nCtas, kLaunchThreads, stream, p, d, epoch, opIndex, mode);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "rank %d: launching the launch-path kernel (%d CTAs) failed: %s",
                    p.rank, nCtas, cudaGetErrorString(err));
  return Result::Success;
}

Result launchLlBatch(const KernelParams& p, const LlBatch& b, int nCtas, cudaStream_t stream) {
  cudaError_t err = launchPath(dev::launchLlBatchKernel, p, nCtas, kLaunchThreads, stream, p, b);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "rank %d: launching a batch of %d LL collectives (%d CTAs) failed: %s",
                    p.rank, b.nOps, nCtas, cudaGetErrorString(err));
  return Result::Success;
}

Result launchKernelCtasPerSm(int* out) {
  int batch = 0;
  cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, dev::launchKernel, kLaunchThreads, 0);
  if (err == cudaSuccess)
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&batch, dev::launchLlBatchKernel, kLaunchThreads, 0);
  int own = 0;
  if (err == cudaSuccess)
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&own, dev::launchLlKernel, kLaunchThreads, 0);
  if (err == cudaSuccess && own < batch) batch = own;
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "occupancy query of the launch-path kernels failed: %s",
                    cudaGetErrorString(err));
  if (batch < *out) *out = batch;  // an LL batch takes up to as many CTAs as one op
  return Result::Success;
}

Result directKernelCtasPerSm(int* out) {
  cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, dev::launchDirectKernel, kDirectThreads, 0);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "occupancy query of the direct-mode kernel failed: %s",
                    cudaGetErrorString(err));
  return Result::Success;
}

Result persistentKernelCtasPerSm(int* out) {
  cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, dev::persistentKernel, kKernelThreads, 0);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "occupancy query of the persistent kernel failed: %s",
                    cudaGetErrorString(err));
  return Result::Success;
}

}  // namespace coll
}  // namespace mkernel
