// Staged collectives: how the persistent kernel runs a communicator whose ranks are processes
// (docs/KERNEL.md, "Process ranks"). One algorithm, written once as a template over an executor,
// run by the kernel (collectives/device/kernel.cu: copies and reductions by a whole CTA, barriers
// by per-CTA epoch flags) and by the CPU test (tests/collectives/test_staged.cc: rank threads,
// with a check that no staging region is overwritten while its owner reads it).
//
// Thread ranks move data directly between user buffers: one process addresses every rank's
// device memory. A process cannot address another process's user buffers (a CUDA IPC handle per
// buffer and call would cost more than the collective), so each rank shares one staging buffer
// at communicator creation (cudaIpcGetMemHandle / cudaIpcOpenMemHandle) and every collective
// goes through it, chunk by chunk, in a push model (NVLink writes are posted; remote reads stall
// a warp for the round trip, which is why the direct algorithms' pull-style ReduceScatter reached
// 106 GB/s where pushes reached 307 on two H200s, docs/PERFORMANCE.md):
//
//   push      the rank writes its chunk into slot r of the inbox region in[parity] of every rank
//             that needs it (its own included)
//   barrier   every inbox is full
//   compute   the rank reads its OWN inbox (local memory) and writes its own user buffer
//             (TwoShot AllReduce: reduce this rank's part of the chunk and push it into every
//             rank's out[parity], barrier, copy its own out[parity] into the user buffer)
//
// No barrier is needed after a chunk: regions alternate by chunk parity, and a rank writes into
// in[p] / out[p] of any rank again (two chunks later) only after the barrier of the chunk in
// between, which the region's owner reaches only once it has finished reading it. The
// next chunk's push comes before this chunk's compute (stagedCollective, below). A rank's output
// is complete when its own CTA finishes, so no end barrier is needed per collective either: one
// barrier per chunk (two for TwoShot).
//
// Staging per rank and CTA: 4 regions of chunkBytes (in[0], in[1], out[0], out[1]). An inbox
// holds nRanks slots of one chunk, so a chunk carries stagedChunkElems() = chunkBytes / nRanks
// bytes of the per-rank block. A CTA works on its part of the per-rank block (rankSlice(count,
// nCtas, cta)). Reduction order: ranks 0..n-1 on every rank, like every other algorithm
// (collectives/algo/algo.h).
#pragma once

#include <cstdint>

#include "collectives/algo/algo.h"
#include "collectives/types.h"
#include "collectives/algo/work.h"

namespace mkernel {
namespace coll {

constexpr int kStagedRegionsPerCta = 4;  // in[0], in[1], out[0], out[1]
constexpr uint64_t kStagedMinChunkBytes = 4096;

MKERNEL_HD inline uint64_t stagedRegionOffset(int cta, int region, uint64_t chunkBytes) {
  return (static_cast<uint64_t>(cta) * kStagedRegionsPerCta + static_cast<uint64_t>(region)) *
         chunkBytes;
}
MKERNEL_HD inline uint64_t stagedBufferBytes(int nCtas, uint64_t chunkBytes) {
  return stagedRegionOffset(nCtas, 0, chunkBytes);
}

// Elements of the per-rank block one chunk carries: an inbox holds one chunk per rank; a multiple
// of the 16-byte alignment, so every slot offset and chunk start keeps 16-byte vector loads
// possible (0 when chunkBytes is too small for nRanks slots).
MKERNEL_HD inline uint64_t stagedChunkElems(int nRanks, uint64_t elemSize, uint64_t chunkBytes) {
  const uint64_t bytes = chunkBytes / static_cast<uint64_t>(nRanks);
  const uint64_t align = sliceAlignElems(elemSize);
  return bytes / elemSize / align * align;
}

// TwoShot pays from 3 ranks on: with 2, OneShot moves the same bytes over the link with one
// barrier less per chunk.
MKERNEL_HD inline bool stagedTwoShot(Algo a, int nRanks) {
  return a == Algo::TwoShot && nRanks > 2;
}

constexpr int kStagedRingOrderMax = 16;  // StagedCall::ringOrder's capacity (>= kMaxRanks, work.h)

struct StagedCall {
  CollType coll;
  bool twoShot;  // AllReduce only
  int nRanks, rank, root;
  uint64_t count;  // NCCL's count (per-rank block for AllGather / ReduceScatter)
  uint64_t elemSize;
  uint64_t send, recv;  // this rank's user buffers (addresses)
  Slice part;           // this CTA's elements of the per-rank block
  uint64_t chunkElems;  // stagedChunkElems()
  uint32_t parityMask;  // 1; 0 only in the test that shows the race check catches reuse
  bool hasPre = false;  // Ring (staged_ring.h): the op has a pre() (PreMulSum)
  // Ring (staged_ring.h): the ring's order, ringOrder[p] the rank at position p
  // (MKERNEL_RING_ORDER; by default the node's placement order, PeerSetup::ringOrder); ringOrdered
  // false: rank order.
  bool ringOrdered = false;
  uint8_t ringOrder[kStagedRingOrderMax] = {};
};

// Runs call c for one CTA through executor ex, which provides:
//   char* in(int rank, int parity), char* out(int rank, int parity)   staging regions
//   void copy(char* const* dsts, int nDst, const char* src, uint64_t bytes)
//   void reduce(char* const* dsts, int nDst, const char* const* srcs, int nSrc, uint64_t elems)
//                                            (srcs in rank order; the result goes to every dst)
//   bool barrier()                                                    false: give up (error)
// Every call is made by every thread of the CTA alike (uniform control flow). *chunkSeq counts
// this CTA's chunks over the communicator's life (its parity picks the regions). False when a
// barrier failed.
// One chunk of one CTA: elements [g, g + l) of the per-rank block (l <= chunkElems), staged
// through the regions of parity `par`.
struct StagedChunk {
  uint64_t g;
  uint64_t l;
  uint64_t slot;  // bytes of one rank's slot in an inbox
  int par;
};

// push: this rank's data of the chunk into slot r of the inboxes that need it (TwoShot AllReduce:
// part k of the chunk to its owner k).
template <class Ex>
MKERNEL_HD void stagedPush(Ex& ex, const StagedCall& c, const StagedChunk& k) {
  const int n = c.nRanks, r = c.rank;
  const uint64_t esz = c.elemSize;
  char* dsts[kMaxRanks];
  const char* send = reinterpret_cast<const char*>(c.send);
  switch (c.coll) {
    case CollType::AllReduce:
      if (!c.twoShot) {
        for (int q = 0; q < n; ++q) dsts[q] = ex.in(q, k.par) + r * k.slot;
        ex.copy(dsts, n, send + k.g * esz, k.slot);
      } else {
        const uint64_t align = sliceAlignElems(esz);
        for (int q = 0; q < n; ++q) {
          const Slice s = rankSlice(k.l, n, q, align);
          dsts[0] = ex.in(q, k.par) + r * k.slot + s.offset * esz;
          ex.copy(dsts, 1, send + (k.g + s.offset) * esz, s.count * esz);
        }
      }
      break;
    case CollType::ReduceScatter:
      for (int q = 0; q < n; ++q) {
        dsts[0] = ex.in(q, k.par) + r * k.slot;
        ex.copy(dsts, 1, send + (static_cast<uint64_t>(q) * c.count + k.g) * esz, k.slot);
      }
      break;
    case CollType::AllGather:
      for (int q = 0; q < n; ++q) dsts[q] = ex.in(q, k.par) + r * k.slot;
      ex.copy(dsts, n, send + k.g * esz, k.slot);
      break;
    case CollType::Broadcast:
      if (r == c.root) {
        for (int q = 0; q < n; ++q) dsts[q] = ex.in(q, k.par);
        ex.copy(dsts, n, send + k.g * esz, k.slot);
      }
      break;
    case CollType::Reduce:
      dsts[0] = ex.in(c.root, k.par) + r * k.slot;
      ex.copy(dsts, 1, send + k.g * esz, k.slot);
      break;
  }
}

// compute: from this rank's own inbox into its own buffer, once every peer pushed the chunk
// (TwoShot AllReduce: reduce this rank's part into every rank's out region, barrier, copy its
// own out region). False when a barrier failed.
template <class Ex>
MKERNEL_HD bool stagedCompute(Ex& ex, const StagedCall& c, const StagedChunk& k) {
  const int n = c.nRanks, r = c.rank;
  const uint64_t esz = c.elemSize;
  const char* srcs[kMaxRanks];
  char* dsts[kMaxRanks];
  char* recv = reinterpret_cast<char*>(c.recv);
  const char* inbox = ex.in(r, k.par);
  switch (c.coll) {
    case CollType::AllReduce:
      if (!c.twoShot) {
        for (int q = 0; q < n; ++q) srcs[q] = inbox + q * k.slot;
        dsts[0] = recv + k.g * esz;
        ex.reduce(dsts, 1, srcs, n, k.l);
      } else {
        const Slice mine = rankSlice(k.l, n, r, sliceAlignElems(esz));
        for (int q = 0; q < n; ++q) {
          srcs[q] = inbox + q * k.slot + mine.offset * esz;
          dsts[q] = ex.out(q, k.par) + mine.offset * esz;
        }
        ex.reduce(dsts, n, srcs, n, mine.count);
        if (!ex.barrier()) return false;
        dsts[0] = recv + k.g * esz;
        ex.copy(dsts, 1, ex.out(r, k.par), k.slot);
      }
      break;
    case CollType::ReduceScatter:
      for (int q = 0; q < n; ++q) srcs[q] = inbox + q * k.slot;
      dsts[0] = recv + k.g * esz;
      ex.reduce(dsts, 1, srcs, n, k.l);
      break;
    case CollType::AllGather:
      for (int q = 0; q < n; ++q) {
        dsts[0] = recv + (static_cast<uint64_t>(q) * c.count + k.g) * esz;
        ex.copy(dsts, 1, inbox + q * k.slot, k.slot);
      }
      break;
    case CollType::Broadcast:
      dsts[0] = recv + k.g * esz;
      ex.copy(dsts, 1, inbox, k.slot);
      break;
    case CollType::Reduce:
      if (r == c.root) {
        for (int q = 0; q < n; ++q) srcs[q] = inbox + q * k.slot;
        dsts[0] = recv + k.g * esz;
        ex.reduce(dsts, 1, srcs, n, k.l);
      }
      break;
  }
  return true;
}

// The chunk at offset o of the CTA's part c.part; its regions' parity from the CTA's chunk counter.
MKERNEL_HD inline StagedChunk stagedChunkAt(const StagedCall& c, uint64_t o, uint64_t seq) {
  StagedChunk k;
  k.l = c.part.count - o < c.chunkElems ? c.part.count - o : c.chunkElems;
  k.g = c.part.offset + o;
  k.slot = k.l * c.elemSize;
  k.par = static_cast<int>(seq & c.parityMask);
  return k;
}

// Pipelined, for the collectives with one barrier per chunk (all but TwoShot AllReduce): chunk
// i + 1 is pushed right after the barrier of chunk i, before chunk i is computed, so that its
// NVLink writes (posted) drain while the CTA reads its own inbox and writes the user buffer, and
// the next barrier finds the peers' pushes mostly done. Two parities still suffice: a rank pushes
// chunk i + 2 into in[par(i)] after the barrier of chunk i + 1, which every peer reaches only
// after computing chunk i, i.e. after its last read of in[par(i)] (tests/collectives/test_staged.cc
// checks that no region is overwritten while read). The same holds across collectives: the CTA's
// chunk counter runs on, and a collective's first push follows the previous one's last barrier.
// TwoShot AllReduce (two barriers per chunk, out regions written by peers) keeps the plain order:
// push, barrier, compute.
template <class Ex>
MKERNEL_HD bool stagedCollective(Ex& ex, const StagedCall& c, uint64_t* chunkSeq) {
  if (c.part.count == 0) return true;
  const bool twoShot = c.coll == CollType::AllReduce && c.twoShot;
  if (twoShot) {
    for (uint64_t o = 0; o < c.part.count; o += c.chunkElems) {
      const StagedChunk k = stagedChunkAt(c, o, (*chunkSeq)++);
      stagedPush(ex, c, k);
      if (!ex.barrier()) return false;
      if (!stagedCompute(ex, c, k)) return false;
    }
    return true;
  }
  StagedChunk k = stagedChunkAt(c, 0, (*chunkSeq)++);
  stagedPush(ex, c, k);
  for (uint64_t o = 0; o < c.part.count; o += c.chunkElems) {
    if (!ex.barrier()) return false;
    const uint64_t next = o + c.chunkElems;
    StagedChunk nk = k;
    if (next < c.part.count) {
      nk = stagedChunkAt(c, next, (*chunkSeq)++);
      stagedPush(ex, c, nk);
    }
    if (!stagedCompute(ex, c, k)) return false;
    k = nk;
  }
  return true;
}

}  // namespace coll
}  // namespace mkernel
