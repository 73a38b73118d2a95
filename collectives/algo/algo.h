// The collective algorithms of mkernel: partition, chunking, ring schedule and reduction order.
//
// ONE definition shared by the persistent kernel (collectives/device/*.cu) and the CPU reference
// executor (tests/oracle/reference.cc): both call these functions, so the GPU moves exactly the
// elements the reference moves and reduces them in the same order; fp results are then
// bit-identical between the kernel and the reference (NCCL's equal ours only up to reduction
// order). Plain header: no CUDA intrinsics, no NCCL include; every function is MKERNEL_HD.
// docs/ALGORITHMS.md explains each algorithm, its phases and its memory traffic.
//
// Vocabulary (counts and offsets are in ELEMENTS of the collective's dtype):
//   rank slice   the part of a buffer that one rank works on: rankSlice(). For ReduceScatter and
//                AllGather the slices are NCCL's fixed per-rank blocks (blockSlice()).
//   phase        the work between two cross-rank barriers. Direct algorithms (OneShot, TwoShot,
//                Direct) have ONE phase per call: barrier (every rank's buffers are ready and
//                published) -> move/reduce -> barrier (peers are done with our buffers).
//   direct access  in direct algorithms a rank reads and writes its peers' USER buffers in place
//                (thread ranks of one process, or buffers mapped through CUDA IPC / registration).
//   staging      a per-rank buffer mapped into the peers: the inbox of ring pushes, and the copy
//                of an in-place OneShot input (peers read it while the owner overwrites its own).
//   chunk/round  Ring moves each slice in chunks of at most chunkElems elements; chunk k of every
//                slice moves in round k (chunkOf()); a chunk past a slice's end is empty but its
//                round still happens on every rank.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/types.h"

#ifndef MKERNEL_HD
#if defined(__CUDACC__)
#define MKERNEL_HD __host__ __device__
#else
#define MKERNEL_HD
#endif
#endif

namespace mkernel {
namespace coll {

// ---- algorithms -----------------------------------------------------------------------------
//
// Direct algorithms (NVLink all-to-all, one phase). "rank r" below is every rank at once;
// reductions run over ranks in canonical order (reductionPeer()).
// AllReduce     OneShot  rank r reduces ALL elements from every rank's input and writes its own
//                        recvbuff. Latency-optimal; reads nRanks x the data. An in-place rank
//                        first copies its input into its staging, which peers read instead.
//               TwoShot  rank r reduces its slice rankSlice(count, n, r) from every rank's input
//                        and writes the result into EVERY rank's recvbuff (reduce-scatter and
//                        all-gather fused in one phase). Bandwidth-optimal.
// ReduceScatter Direct   rank r reduces block r from every rank's sendbuff into its recvbuff.
// AllGather     Direct   rank r writes its sendbuff into block r of every rank's recvbuff.
// Broadcast     Direct   rank r copies slice r of the root's sendbuff into every rank's recvbuff
//                        (the root's outgoing link carries the data once, not nRanks times).
// Reduce        Direct   rank r reduces slice r from every rank's sendbuff into the root's
// recvbuff.
//
// Ring (PCIe boxes, or no direct access): neighbour pushes into the next rank's staging inbox,
// chunk by chunk (ring schedule below).
// AllReduce     Ring     nRanks-1 reduce-scatter steps, then nRanks-1 all-gather steps.
// ReduceScatter Ring     nRanks-1 reduce-scatter steps over NCCL's blocks.
// AllGather     Ring     nRanks-1 all-gather steps over NCCL's blocks.
// Broadcast     Ring     chain root -> root+1 -> ... -> root-1.
// Reduce        Ring     chain root+1 -> root+2 -> ... -> root, accumulating on the way.
enum class Algo : int32_t {
  OneShot = 0,
  TwoShot = 1,
  Ring = 2,
  Direct = 3,
};
constexpr int kNumAlgos = 4;

MKERNEL_HD inline const char* algoName(Algo a) {
  switch (a) {
    case Algo::OneShot:
      return "oneshot";
    case Algo::TwoShot:
      return "twoshot";
    case Algo::Ring:
      return "ring";
    case Algo::Direct:
      return "direct";
  }
  return "?";
}

MKERNEL_HD inline bool algoSupports(CollType c, Algo a) {
  if (a == Algo::Ring) return true;
  if (c == CollType::AllReduce) return a == Algo::OneShot || a == Algo::TwoShot;
  return a == Algo::Direct;
}

// ---- partition --------------------------------------------------------------------------------

// [offset, offset + count) in elements.
struct alignas(16) Slice {
  uint64_t offset;
  uint64_t count;
};
static_assert(sizeof(Slice) == 16, "Slice is shared with device code: keep it two uint64_t");

// Slices and chunks start at multiples of 16 bytes (relative to the buffer start) so that the
// kernel can use 16-byte vector loads when the buffers themselves are 16-byte aligned.
constexpr uint32_t kSliceAlignBytes = 16;
MKERNEL_HD inline size_t sliceAlignElems(size_t elemSize) {
  return elemSize >= kSliceAlignBytes ? 1 : kSliceAlignBytes / elemSize;
}

MKERNEL_HD inline size_t divUp(size_t a, size_t b) {
  return (a + b - 1) / b;
}
MKERNEL_HD inline size_t roundUp(size_t a, size_t b) {
  return divUp(a, b) * b;
}
MKERNEL_HD inline size_t minSize(size_t a, size_t b) {
  return a < b ? a : b;
}

// Part `rank` of `count` elements split nRanks ways (also used to split a rank's share among
// CTAs). Every part but the tail ones has ceil(count / nRanks) elements rounded UP to alignElems,
// so every offset is a multiple of alignElems; the last non-empty part takes the remainder and
// later parts are empty (count 0 at offset `count`). The imbalance is below alignElems * nRanks
// elements (16 B per rank). count == 0 gives every rank an empty part.
MKERNEL_HD inline Slice rankSlice(size_t count, int nRanks, int rank, size_t alignElems) {
  size_t per = roundUp(divUp(count, static_cast<size_t>(nRanks)), alignElems);
  size_t off = minSize(per * static_cast<size_t>(rank), count);
  Slice s;
  s.offset = off;
  s.count = minSize(per, count - off);
  return s;
}

// NCCL's fixed per-rank blocks of AllGather (recvbuff) and ReduceScatter (sendbuff).
MKERNEL_HD inline Slice blockSlice(size_t blockCount, int rank) {
  Slice s;
  s.offset = blockCount * static_cast<size_t>(rank);
  s.count = blockCount;
  return s;
}

// ---- chunking (Ring) --------------------------------------------------------------------------

// Elements per pipeline chunk for a chunk size in bytes: a multiple of the 16-byte alignment, at
// least one aligned group.
MKERNEL_HD inline size_t chunkElemsFor(size_t chunkBytes, size_t elemSize) {
  size_t align = sliceAlignElems(elemSize);
  size_t elems = (chunkBytes / elemSize) / align * align;
  return elems < align ? align : elems;
}

MKERNEL_HD inline size_t numChunks(size_t count, size_t chunkElems) {
  return divUp(count, chunkElems);
}

// Chunk k of slice s (empty, at the slice's end, when k is past it).
MKERNEL_HD inline Slice chunkOf(Slice s, size_t chunkElems, size_t k) {
  size_t off = minSize(k * chunkElems, s.count);
  Slice c;
  c.offset = s.offset + off;
  c.count = minSize(chunkElems, s.count - off);
  return c;
}

// The slices a Ring collective moves: AllReduce rank slices, NCCL blocks for AllGather /
// ReduceScatter, the whole buffer for the chains (Broadcast, Reduce).
MKERNEL_HD inline Slice ringSlice(CollType c, size_t count, int nRanks, int slice,
                                  size_t alignElems) {
  if (c == CollType::AllReduce) return rankSlice(count, nRanks, slice, alignElems);
  if (c == CollType::AllGather || c == CollType::ReduceScatter) return blockSlice(count, slice);
  Slice s;
  s.offset = 0;
  s.count = count;
  return s;
}

// Rounds of a call: Ring: chunks of its largest slice (slice 0); direct algorithms: 1 (0 when
// count is 0: nothing moves, no barrier is needed).
MKERNEL_HD inline size_t numRounds(CollType c, Algo a, size_t count, int nRanks, size_t elemSize,
                                   size_t chunkElems) {
  if (count == 0) return 0;
  if (a != Algo::Ring) return 1;
  return numChunks(ringSlice(c, count, nRanks, 0, sliceAlignElems(elemSize)).count, chunkElems);
}

// ---- staging ----------------------------------------------------------------------------------
//
// Ring AllReduce / AllGather / ReduceScatter: 2 chunk-sized inbox regions per rank, used by step
// parity (ringInboxRegion()): at step t a rank reads what was pushed into it at step t-1 while
// the previous rank pushes step t into the other region. Ring Broadcast / Reduce: 1 region (each
// rank receives once per round). A kernel that keeps several rounds in flight gives each its own
// set. OneShot: an in-place rank's whole input (count elements). Others: none.
MKERNEL_HD inline int ringInboxRegions(CollType c) {
  return (c == CollType::Broadcast || c == CollType::Reduce) ? 1 : 2;
}
MKERNEL_HD inline int ringInboxRegion(int step) {
  return step & 1;
}

MKERNEL_HD inline size_t stagingElemsNeeded(CollType c, Algo a, size_t count, size_t chunkElems) {
  if (a == Algo::Ring) return static_cast<size_t>(ringInboxRegions(c)) * chunkElems;
  if (a == Algo::OneShot) return count;
  return 0;
}

// ---- ring schedule ----------------------------------------------------------------------------

MKERNEL_HD inline int modRank(int x, int nRanks) {
  return ((x % nRanks) + nRanks) % nRanks;
}
MKERNEL_HD inline int ringNext(int rank, int nRanks) {
  return modRank(rank + 1, nRanks);
}
MKERNEL_HD inline int ringPrev(int rank, int nRanks) {
  return modRank(rank - 1, nRanks);
}

// Ring AllReduce: steps t = 0 .. 2n-2 of one round (n = nRanks):
//   t <  n-1  reduce-scatter step: push slice ringRsSendSlice(r, t): pre(own input) at t == 0,
//             else (inbox of step t-1) OP pre(own input of that slice).
//   t == n-1  the inbox holds slice r reduced by all other ranks: acc = inbox OP pre(own input),
//             post(acc) is final: store it into recvbuff and push it (the all-gather's step 0).
//   t >  n-1  all-gather: store the inbox of step t-1 (slice ringAgRecvSlice(r, t-n)) into
//             recvbuff and, while t < 2n-2, push it on.
// Ring ReduceScatter: steps 0 .. n-1 = the first n steps above (at n-1 store, do not push).
// Ring AllGather: steps 0 .. n-1: t == 0 stores own block r and pushes it; t > 0 stores the inbox
//             (block ringAgRecvSlice(r, t-1)) and pushes it while t < n-1.
// The push of step t lands in the next rank's inbox region ringInboxRegion(t).
MKERNEL_HD inline int ringRsSendSlice(int rank, int step, int nRanks) {
  return modRank(rank - step - 1, nRanks);
}
MKERNEL_HD inline int ringRsRecvSlice(int rank, int step, int nRanks) {
  return modRank(rank - step - 2, nRanks);
}
MKERNEL_HD inline int ringAgSendSlice(int rank, int step, int nRanks) {
  return modRank(rank - step, nRanks);
}
MKERNEL_HD inline int ringAgRecvSlice(int rank, int step, int nRanks) {
  return modRank(rank - step - 1, nRanks);
}
// Broadcast / Reduce chains: the rank at chain position t acts at step t; position 0 starts the
// chain, position n-1 ends it.
//   Broadcast: root, root+1, ..., root-1  (store, push on unless last).
//   Reduce:    root+1, root+2, ..., root  (acc = inbox OP pre(own input); the root post()s and
//              stores).
MKERNEL_HD inline int chainRank(CollType c, int position, int root, int nRanks) {
  return c == CollType::Reduce ? modRank(root + 1 + position, nRanks)
                               : modRank(root + position, nRanks);
}

// ---- reduction order --------------------------------------------------------------------------
//
// Element-wise, every algorithm computes
//     acc = pre(x[o_0]);  acc = acc OP pre(x[o_1]);  ...;  acc = acc OP pre(x[o_{n-1}]);  post(acc)
// where x[q] is rank q's input, pre/OP/post are NCCL's (collectives/algo/reduce_host.h) and o_i is
// reductionPeer(): loads may happen in any order, the arithmetic must follow this one, and every
// intermediate is rounded to the dtype (fp16/bf16 per op, fp8 through half, as NCCL).
//   OneShot, TwoShot, Direct: canonical order 0, 1, ..., nRanks-1, whichever rank computes
//     (so every rank of a OneShot AllReduce gets the same bits).
//   Ring AllReduce / ReduceScatter, slice p: p+1, p+2, ..., p (the slice's owner adds its input
//     last). Ring Reduce: root+1, ..., root.
// `slice` is the slice/block index for Ring AllReduce / ReduceScatter and the root for Ring Reduce.
MKERNEL_HD inline int reductionPeer(Algo a, int i, int slice, int nRanks) {
  return a == Algo::Ring ? modRank(slice + 1 + i, nRanks) : i;
}

// ---- reduction operator as the kernel applies it ---------------------------------------------
//
// NCCL's device view of a reduction (its ncclDevRedOpFull), built on the host by makeDevRedOp()
// (collectives/algo/reduce_host.h) from (RedOp, DataType, nRanks, scalar):
//   Sum, Prod, Min, Max  as named.
//   PreMulSum   pre(x) = x * scalar (rounded to the dtype), then Sum. NCCL's Avg for floating
//               types is PreMulSum with scalar = float(1/nRanks) converted to the dtype (fp64:
//               1/nRanks in double).
//   SumPostDiv  Sum, then post(acc) = acc / divisor rounded toward zero (NCCL's Avg for integers).
// pre() applies to every rank's input exactly once, when it enters the reduction; post() to the
// final result only. Sum..Min keep ncclRedOp_t's values. docs/REDUCTIONS.md has every rule.
enum class DevRedOpKind : int32_t {
  Sum = 0,
  Prod = 1,
  Max = 2,
  Min = 3,
  PreMulSum = 4,
  SumPostDiv = 5,
};

struct alignas(16) DevRedOp {
  DevRedOpKind kind;
  uint32_t divisor;   // SumPostDiv: nRanks
  uint32_t isSigned;  // SumPostDiv: 1 for int8/int32/int64 (divide |x|, then negate)
  uint32_t reserved;
  uint64_t scalarBits;  // PreMulSum: the scalar in the dtype's own encoding, in the low bytes
  uint64_t reserved2;
};
static_assert(sizeof(DevRedOp) == 32, "DevRedOp is shared with device code");

// ---- cost model -------------------------------------------------------------------------------
//
// Minimum device-memory bytes read + written per rank (averaged over ranks, roots included) for
// one call; `bytes` is NCCL's per-rank size (count * elemSize; AllGather: sendcount,
// ReduceScatter: recvcount). A read counts at the reader and a write at the writer wherever the
// memory is (a push into a peer is the pusher's write, a direct read of a peer the reader's).
// `inPlace` only matters for OneShot (+2 bytes: the copy into staging). The benchmark divides
// this by the time for a memory bandwidth next to nccl-tests' algbw/busbw; the reference
// executor counts the same traffic (tests compare). docs/ALGORITHMS.md derives each formula.
MKERNEL_HD inline double minDeviceBytesPerRank(CollType c, Algo a, int nRanks, double bytes,
                                               bool inPlace) {
  double n = nRanks;
  if (a == Algo::Ring) {
    switch (c) {
      case CollType::AllReduce:
        return (6.0 * n - 4.0) / n * bytes;
      case CollType::AllGather:
        return (3.0 * n - 1.0) * bytes;
      case CollType::ReduceScatter:
        return (3.0 * n - 1.0) * bytes;
      case CollType::Broadcast:
        return (3.0 * n - 1.0) / n * bytes;
      case CollType::Reduce:
        return (3.0 * n - 1.0) / n * bytes;
    }
    return 0.0;
  }
  switch (c) {
    case CollType::AllReduce:
      if (a == Algo::OneShot) return (n + 1.0 + (inPlace ? 2.0 : 0.0)) * bytes;
      return 2.0 * bytes;  // TwoShot: read n parts of bytes/n, write the result to n ranks
    case CollType::ReduceScatter:
      return (n + 1.0) * bytes;
    case CollType::AllGather:
      return (n + 1.0) * bytes;
    case CollType::Broadcast:
      return (1.0 + 1.0 / n) * bytes;
    case CollType::Reduce:
      return (1.0 + 1.0 / n) * bytes;
  }
  return 0.0;
}

}  // namespace coll
}  // namespace mkernel
