// Process ranks: the staged algorithm of collectives/algo/staged.h (and the rings of
// staged_ring.h), run by one CTA through the ranks' shared staging regions.
#pragma once

#include "collectives/device/direct.cuh"

namespace mkernel {
namespace coll {
namespace dev {

// ---- process ranks: the staged algorithm of collectives/algo/staged.h, run by one CTA
// -------------------

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
  __device__ void reduce(char* const* dsts, int nDst, const char* const* srcs, int nSrc,
                         uint64_t elems, bool withPre = true, bool withPost = true) {
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

__device__ bool runStaged(const KernelParams& p, SharedState& sh, const WorkDesc& d, int cta,
                          uint64_t* epoch, uint64_t* chunkSeq) {
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

}  // namespace dev
}  // namespace coll
}  // namespace mkernel
