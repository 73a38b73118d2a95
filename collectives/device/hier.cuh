// Emulated and real nodes: the hierarchical algorithms of collectives/algo/hier_staged.h,
// node-local staging plus the proxy's rail transfers.
#pragma once

#include "collectives/device/staged.cuh"

namespace mkernel {
namespace coll {
namespace dev {

// ---- emulated nodes: the hierarchical algorithms of collectives/algo/hier_staged.h
// ---------------------
//
// Each of the op's CTAs (MKERNEL_HIER_CTAS; 1 by default) runs its slice. Node-local regions are
// the staged buffers of this node's ranks (staged.h's layout, the CTA's own regions); the
// inter-node rounds go through channel `cta` of this rank's proxy: thread 0 posts the receives,
// then the sends, into the channel's host-mapped ring and waits for its completion counters (net
// slot s < kHierNetSlots: flag 2 s sends, 2 s + 1 receives; the totals live in DeviceState so that
// a relaunched kernel continues them).

static_assert(2 * kMaxRanks <= proxy::kRingSlots,
              "a rail round's commands (a send and a receive per node) fit the ring");
static_assert(2 * kHierNetSlots <= static_cast<int>(proxy::kMaxFlags),
              "two completion counters per net slot");

struct HierExecutor : CtaMover {
  const KernelParams& p;
  int cta;
  uint64_t* epoch;
  int node;
  int lane;  // the proxy channel and net buffers: this CTA's own, or (CTA roles) its lane's

  __device__ char* in(int local, int parity) const {
    return p.stagedBuf[node * p.perNode + local] +
           stagedRegionOffset(cta, parity, p.stagedChunkBytes);
  }
  __device__ char* out(int local, int parity) const {
    return p.stagedBuf[node * p.perNode + local] +
           stagedRegionOffset(cta, 2 + parity, p.stagedChunkBytes);
  }
  __device__ char* netSend(int slot) const {
    return p.netBuf + static_cast<uint64_t>(lane) * p.netBufBytes +
           static_cast<uint64_t>(slot) * (1 + static_cast<uint64_t>(p.nNodes)) * p.stagedChunkBytes;
  }
  __device__ proxy::ProxyRing* ring() const { return p.proxyRing + lane; }
  __device__ proxy::ProxyFlags* flags() const { return p.proxyFlags + lane; }
  __device__ char* netRecv(int slot, int m) const {
    return netSend(slot) + (1 + static_cast<uint64_t>(m)) * p.stagedChunkBytes;
  }
  // CTA 0's waits (DeviceState::hierWait): thread 0's %globaltimer around them.
  __device__ uint64_t waitStart() const {
    return cta == 0 && threadIdx.x == 0 ? dev::globalTimerNs() : 0;
  }
  __device__ void waitEnd(int k, uint64_t t0) const {
    if (cta == 0 && threadIdx.x == 0) p.self->hierWait[k] += dev::globalTimerNs() - t0;
  }
  __device__ bool nodeBarrier() {
    const uint64_t t0 = waitStart();
    const bool ok =
        ctaBarrier(p, sh.peers, cta, epoch, kWaitPeerChunk, d.coll, node * p.perNode, p.perNode);
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
  __device__ void reduce(char* const* dsts, int nDst, const char* const* srcs, int nSrc,
                         uint64_t elems, bool withPre = true, bool withPost = true) {
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
  __device__ bool railPost(int round, int slot, const char* const* sendPtr,
                           const uint64_t* sendBytes, char* const* recvPtr,
                           const uint64_t* recvBytes) {
    const uint64_t t0 = waitStart();
    __syncthreads();  // the CTA's writes into the net buffer precede thread 0's posts
    if (threadIdx.x == 0) {
      // proxyPublish's release fence, after this barrier, orders every thread's writes into the
      // net buffer before the commands' seq (the barrier-then-fence pattern of a flag store).
      uint64_t sends = p.self->proxySends[lane][slot], recvs = p.self->proxyRecvs[lane][slot];
      uint32_t n = 0;
      for (int m = 0; m < p.nNodes; ++m)
        n += (recvBytes[m] != 0 ? 1u : 0u) + (sendBytes[m] != 0 ? 1u : 0u);
      proxy::ProxyProducer pr{p.self->proxyHead[lane], p.self->proxyTailSeen[lane]};
      bool ok =
          proxy::proxyReserve(ring(), flags(), &pr, n, p.timeoutNs) == proxy::PostStatus::kPosted;
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
          if (pass == 0)
            ++recvs;
          else
            ++sends;
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
    ok = ok &&
         proxy::proxyWaitFlag(flags(), f + 1, recvs, p.timeoutNs) == proxy::WaitStatus::kReached;
    if (!ok) recordError(p, cta, -1, kWaitProxy, d.coll, recvs);
    return ok;
  }
  __device__ bool railWait(int slot) {
    const uint64_t t0 = waitStart();
    if (threadIdx.x == 0)
      sh.stop = railWaitCounts(slot, p.self->proxySends[lane][slot], p.self->proxyRecvs[lane][slot])
                    ? 0
                    : 1;
    waitEnd(0, t0);
    __syncthreads();  // the received bytes are read after thread 0 saw them land
    return sh.stop == 0;
  }
  // Phase times (collectives/algo/hier_staged.h): CTA 0's AllReduce chunks in turn, into
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
  // CTA roles (collectives/algo/hier_staged.h): the lane's counters in device memory.
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
      sh.stop = waitGeq(p, &p.self->hierRole[lane].counter[k], target, cta, -1, kWaitHierRole,
                        d.coll, kInternalWaitFactor * p.timeoutNs)
                    ? 0
                    : 1;
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

__device__ __noinline__ bool runHier(const KernelParams& p, SharedState& sh, const WorkDesc& d,
                                     int cta, uint64_t* epoch, uint64_t* chunkSeq) {
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

}  // namespace dev
}  // namespace coll
}  // namespace mkernel
