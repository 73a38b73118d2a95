// Ring collectives in the persistent kernel (docs/ALGORITHMS.md, "Ring in the kernel"): the
// schedule of collectives/algo/algo.h (ringRsSendSlice ..., chainRank, reductionPeer) run through
// the staged regions of collectives/algo/staged.h, for boxes whose GPUs should not all read and
// write each other at once (PCIe), or wherever MKERNEL_ALGO=ring asks for it. Written once as a
// template over an executor, like stagedCollective: the kernel runs it
// (collectives/device/kernel.cu, runStaged) and so does the CPU test
// (tests/collectives/test_staged.cc, with its check that no region is overwritten while it is
// read).
//
// The ring runs in the order StagedCall::ringOrder gives (MKERNEL_RING_ORDER; rank order when
// unset): "next" and "previous" below are the neighbours in that order, and the schedule's slice
// and chain arithmetic runs in ring positions (ringPosOf / ringRankAt).
// Each rank pushes into the NEXT rank's inbox only, and waits at each step only for its two
// neighbours (the executor's neighborBarrier): a step's push lands in next's in[g & 1], where g is
// the CTA's chunk counter (the same *chunkSeq that stagedCollective advances, one per step here),
// and next reads it in the following step. Two regions suffice: a rank pushes into next's
// in[g & 1] again at step g + 2, after the barrier of step g + 1, which next reaches only once it
// has finished step g + 1, whose read of in[g & 1] is its last. Across collectives the counter
// runs on, and the last step of a ring collective is a barrier of every rank (not only the
// neighbours): a following collective of any form may push into any rank's regions.
//
// Executor, beyond stagedCollective's:
//   void reduce(char* const* dsts, int nDst, const char* const* srcs, int nSrc, uint64_t elems,
//               bool withPre, bool withPost)
//   bool neighborBarrier(int prev, int next)   a barrier with those two ranks only (every rank
//                                             still counts it); false: give up
//
// A CTA works on its part (StagedCall::part, rankSlice(count, nCtas, cta)) of the buffer
// (AllReduce, Broadcast, Reduce) or of each rank's block (ReduceScatter, AllGather), in chunks of
// a whole region (ringStagedChunkElems): an inbox holds one chunk, not one slot per rank.
//   AllReduce      rounds of 2n - 1 steps; round k moves chunk k of each of the n rank slices of
//                  the part (rankSlice(part.count, n, s)): n - 1 reduce-scatter steps, the final
//                  step of slice r at rank r (store and push), n - 1 all-gather steps.
//   ReduceScatter  rounds of n steps over the blocks (the last stores, pushes nothing).
//   AllGather      rounds of n steps over the blocks.
//   Broadcast      a chain root, root + 1, ... pipelined over chunks: at step j the rank at chain
//                  position pos handles chunk j - pos (nChunks + n - 1 steps).
//   Reduce         the chain root + 1, ..., root, pipelined alike, accumulating on the way.
// Reduction order: algo.h's reductionPeer for Ring, in ring positions (slice p: p + 1, ..., p;
// Reduce: root + 1, ..., root). A partial result arrives with pre() already applied to every input
// in it, so a step combines it with pre(own) only: ops with a pre() (PreMulSum) first store
// pre(own) in the rank's own out[g & 1] region (local, unused by the ring otherwise), then combine
// without pre.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/algo/algo.h"
#include "collectives/algo/staged.h"

namespace mkernel {
namespace coll {

// Whether a collective that would be a ring (MKERNEL_ALGO=ring, or a host whose GPUs are not NVLink
// all-to-all) runs as one, after MKERNEL_RING_MIN_BYTES: `minBytes` < 0 (auto) leaves to the
// launch path's LL mode what it takes (`llTakesIt`: one one-way push of 16-byte lines to every
// peer, where a ring takes 2(n - 1) steps of a neighbour barrier each) and rings the rest; a
// number rings from that many bytes of the whole buffer (`wholeBytes`: directWholeBytes,
// nccl-tests' size); 0 rings everything. The same on every rank: its inputs are agreed.
MKERNEL_HD inline bool ringTakes(int64_t minBytes, bool llTakesIt, uint64_t wholeBytes) {
  if (minBytes < 0) return !llTakesIt;
  return wholeBytes >= static_cast<uint64_t>(minBytes);
}

// MKERNEL_RING_ORDER's list form: every rank of 0..n-1 exactly once, comma-separated ("0,2,1,3").
// False for anything else (*order then unspecified). Host only.
inline bool parseRingOrder(const std::string& text, int n, std::vector<int>* order) {
  order->clear();
  std::vector<char> seen(static_cast<size_t>(n > 0 ? n : 0), 0);
  const char* p = text.c_str();
  if (*p == '\0') return false;
  while (*p != '\0') {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (end == p || v < 0 || v >= n || seen[static_cast<size_t>(v)] ||
        (*end != ',' && *end != '\0'))
      return false;
    if (*end == ',' && end[1] == '\0') return false;  // a trailing comma
    seen[static_cast<size_t>(v)] = 1;
    order->push_back(static_cast<int>(v));
    p = *end == ',' ? end + 1 : end;
  }
  return static_cast<int>(order->size()) == n;
}

// Elements of one ring chunk: a whole staged region, a multiple of the 16-byte alignment.
MKERNEL_HD inline uint64_t ringStagedChunkElems(uint64_t elemSize, uint64_t chunkBytes) {
  const uint64_t align = sliceAlignElems(elemSize);
  return chunkBytes / elemSize / align * align;
}

// Barriers (steps) one CTA of a ring collective takes for its part of `partCount` elements: every
// rank takes the same number (the tests count them).
MKERNEL_HD inline uint64_t ringStagedSteps(CollType c, int nRanks, uint64_t partCount,
                                           uint64_t chunkElems, uint64_t elemSize) {
  if (partCount == 0) return 0;
  const uint64_t n = static_cast<uint64_t>(nRanks);
  switch (c) {
    case CollType::AllReduce:
      return numChunks(rankSlice(partCount, nRanks, 0, sliceAlignElems(elemSize)).count,
                       chunkElems) *
             (2 * n - 1);
    case CollType::ReduceScatter:
    case CollType::AllGather:
      return numChunks(partCount, chunkElems) * n;
    case CollType::Broadcast:
    case CollType::Reduce:
      return numChunks(partCount, chunkElems) + n - 1;
  }
  return 0;
}

struct RingStep {
  uint64_t g;  // the CTA's chunk counter at this step
  int par;     // region of this step's push
  int inPar;   // region of the previous step's push (this step's inbox)
  bool last;   // the collective's last step: a barrier of every rank
};

// dsts = inbox OP pre(own), post() if `post` (inbox null: pre(own) alone; own null: a copy of
// the inbox). `tmp`: this rank's own scratch region for pre(own).
template <class Ex>
MKERNEL_HD void ringCombine(Ex& ex, const StagedCall& c, char* const* dsts, int nDst,
                            const char* inbox, const char* own, uint64_t elems, bool post,
                            char* tmp) {
  if (elems == 0) return;
  if (own == nullptr) {
    ex.copy(dsts, nDst, inbox, elems * c.elemSize);
    return;
  }
  if (inbox == nullptr) {
    ex.reduce(dsts, nDst, &own, 1, elems, true, post);
    return;
  }
  const char* srcs[2] = {inbox, own};
  if (c.hasPre) {
    char* t[1] = {tmp};
    ex.reduce(t, 1, &own, 1, elems, true, false);
    srcs[1] = tmp;
  }
  ex.reduce(dsts, nDst, srcs, 2, elems, false, post);
}

// The ring's order (StagedCall::ringOrder): the rank at position `pos`, and the position of `rank`.
// The schedule below runs in positions; ranks come in only where memory is named (the neighbour
// whose inbox a step pushes into, whose barrier it waits at, and the blocks of ReduceScatter and
// AllGather, which belong to ranks).
MKERNEL_HD inline int ringRankAt(const StagedCall& c, int pos) {
  return c.ringOrdered ? c.ringOrder[pos] : pos;
}
MKERNEL_HD inline int ringPosOf(const StagedCall& c, int rank) {
  if (!c.ringOrdered) return rank;
  for (int p = 0; p < c.nRanks; ++p)
    if (c.ringOrder[p] == rank) return p;
  return rank;  // not reached: the order is a permutation (checked at creation)
}

template <class Ex>
MKERNEL_HD bool ringStepEnd(Ex& ex, const RingStep& s, int prev, int next) {
  if (s.last) return ex.barrier();
  return ex.neighborBarrier(prev, next);
}

MKERNEL_HD inline RingStep ringStepAt(const StagedCall& c, uint64_t* chunkSeq, uint64_t i,
                                      uint64_t steps) {
  RingStep s;
  s.g = (*chunkSeq)++;
  s.par = static_cast<int>(s.g & c.parityMask);
  s.inPar = static_cast<int>((s.g - 1) & c.parityMask);
  s.last = i + 1 == steps;
  return s;
}

// Runs ring collective c for one CTA (c.chunkElems: ringStagedChunkElems; c.hasPre: the op has a
// pre()). False when a barrier failed.
template <class Ex>
MKERNEL_HD bool ringStagedCollective(Ex& ex, const StagedCall& c, uint64_t* chunkSeq) {
  const int n = c.nRanks, r = c.rank, pos = ringPosOf(c, r);
  const int next = ringRankAt(c, ringNext(pos, n)), prev = ringRankAt(c, ringPrev(pos, n));
  const uint64_t esz = c.elemSize, align = sliceAlignElems(esz), ce = c.chunkElems;
  const uint64_t steps = ringStagedSteps(c.coll, n, c.part.count, ce, esz);
  if (steps == 0) return true;
  const char* send = reinterpret_cast<const char*>(c.send);
  char* recv = reinterpret_cast<char*>(c.recv);
  char* dsts[2];
  uint64_t i = 0;  // steps taken
  switch (c.coll) {
    case CollType::AllReduce: {
      const uint64_t rounds = steps / static_cast<uint64_t>(2 * n - 1);
      for (uint64_t k = 0; k < rounds; ++k) {
        for (int t = 0; t < 2 * n - 1; ++t, ++i) {
          const RingStep st = ringStepAt(c, chunkSeq, i, steps);
          // Slices by position: position p completes slice p (at t == n - 1).
          const int sl = t < n ? ringRsSendSlice(pos, t, n) : ringAgRecvSlice(pos, t - n, n);
          Slice s = rankSlice(c.part.count, n, sl, align);
          s.offset += c.part.offset;
          const Slice ch = chunkOf(s, ce, k);
          const uint64_t off = ch.offset * esz;
          const char* inbox = t > 0 ? ex.in(r, st.inPar) : nullptr;
          int nd = 0;
          if (t < n - 1) {  // reduce-scatter: the partial of slice sl on to next
            dsts[nd++] = ex.in(next, st.par);
            ringCombine(ex, c, dsts, nd, inbox, send + off, ch.count, false, ex.out(r, st.par));
          } else if (t == n - 1) {  // slice r is complete here: store it, and start its all-gather
            dsts[nd++] = recv + off;
            if (n > 1) dsts[nd++] = ex.in(next, st.par);
            ringCombine(ex, c, dsts, nd, inbox, send + off, ch.count, true, ex.out(r, st.par));
          } else {  // all-gather: store slice sl, pass it on unless next had it first
            dsts[nd++] = recv + off;
            if (t < 2 * n - 2) dsts[nd++] = ex.in(next, st.par);
            ringCombine(ex, c, dsts, nd, inbox, nullptr, ch.count, false, nullptr);
          }
          if (!ringStepEnd(ex, st, prev, next)) return false;
        }
      }
      return true;
    }
    case CollType::ReduceScatter:
    case CollType::AllGather: {
      const bool rs = c.coll == CollType::ReduceScatter;
      const uint64_t rounds = steps / static_cast<uint64_t>(n);
      for (uint64_t k = 0; k < rounds; ++k) {
        const Slice ch = chunkOf(c.part, ce, k);
        for (int t = 0; t < n; ++t, ++i) {
          const RingStep st = ringStepAt(c, chunkSeq, i, steps);
          const char* inbox = t > 0 ? ex.in(r, st.inPar) : nullptr;
          int nd = 0;
          if (rs) {
            const uint64_t block = static_cast<uint64_t>(ringRankAt(c, ringRsSendSlice(pos, t, n)));
            const char* own = send + (block * c.count + ch.offset) * esz;
            if (t < n - 1) {
              dsts[nd++] = ex.in(next, st.par);
              ringCombine(ex, c, dsts, nd, inbox, own, ch.count, false, ex.out(r, st.par));
            } else {  // block r, complete
              dsts[nd++] = recv + ch.offset * esz;
              ringCombine(ex, c, dsts, nd, inbox, own, ch.count, true, ex.out(r, st.par));
            }
          } else {
            // Step 0 stores and sends the rank's own block; step t > 0 the block that arrived.
            const uint64_t block =
                static_cast<uint64_t>(t == 0 ? r : ringRankAt(c, ringAgRecvSlice(pos, t - 1, n)));
            dsts[nd++] = recv + (block * c.count + ch.offset) * esz;
            if (t < n - 1) dsts[nd++] = ex.in(next, st.par);
            if (t == 0)
              ex.copy(dsts, nd, send + ch.offset * esz, ch.count * esz);
            else
              ringCombine(ex, c, dsts, nd, inbox, nullptr, ch.count, false, nullptr);
          }
          if (!ringStepEnd(ex, st, prev, next)) return false;
        }
      }
      return true;
    }
    case CollType::Broadcast:
    case CollType::Reduce: {
      const bool bc = c.coll == CollType::Broadcast;
      // Chain position: Broadcast root, root + 1, ...; Reduce root + 1, ..., root (chainRank), in
      // ring positions.
      const int rootPos = ringPosOf(c, c.root);
      const int cpos = bc ? modRank(pos - rootPos, n) : modRank(pos - rootPos - 1, n);
      const uint64_t nChunks = numChunks(c.part.count, ce);
      for (uint64_t j = 0; j < steps; ++j, ++i) {
        const RingStep st = ringStepAt(c, chunkSeq, i, steps);
        if (j >= static_cast<uint64_t>(cpos) && j - static_cast<uint64_t>(cpos) < nChunks) {
          const Slice ch = chunkOf(c.part, ce, j - static_cast<uint64_t>(cpos));
          const uint64_t off = ch.offset * esz;
          const bool first = cpos == 0, lastPos = cpos == n - 1;
          const char* inbox = first ? nullptr : ex.in(r, st.inPar);
          int nd = 0;
          if (bc) {
            dsts[nd++] = recv + off;
            if (!lastPos) dsts[nd++] = ex.in(next, st.par);
            if (first)
              ex.copy(dsts, nd, send + off, ch.count * esz);
            else
              ringCombine(ex, c, dsts, nd, inbox, nullptr, ch.count, false, nullptr);
          } else {
            // Only the root (the chain's end) writes its recvbuff.
            dsts[nd++] = lastPos ? recv + off : ex.in(next, st.par);
            ringCombine(ex, c, dsts, nd, inbox, send + off, ch.count, lastPos, ex.out(r, st.par));
          }
        }
        if (!ringStepEnd(ex, st, prev, next)) return false;
      }
      return true;
    }
  }
  return true;
}

}  // namespace coll
}  // namespace mkernel
