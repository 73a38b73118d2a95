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
// between, which the region's owner reaches only once it has finished reading it. A rank's output
// is complete when its own CTA finishes, so no end barrier is needed per collective either: one
// barrier per chunk (two for TwoShot).
//
// Staging per rank and CTA: 4 regions of chunkBytes (in[0], in[1], out[0], out[1]). An inbox
// holds nRanks slots of one chunk, so a chunk carries stagedChunkElems() = chunkBytes / nRanks
// bytes of the per-rank block. A CTA works on its part of the per-rank block (rankSlice(count,
// nCtas, cta)). Reduction order: ranks 0..n-1 on every rank, like every other algorithm
// (collectives/algo.h).
#pragma once

#include <cstdint>

#include "collectives/algo.h"
#include "collectives/types.h"
#include "collectives/work.h"

namespace mkernel {
namespace coll {

constexpr int kStagedRegionsPerCta = 4;  // in[0], in[1], out[0], out[1]
constexpr uint64_t kStagedMinChunkBytes = 4096;

MKERNEL_HD inline uint64_t stagedRegionOffset(int cta, int region, uint64_t chunkBytes) {
  return (static_cast<uint64_t>(cta) * kStagedRegionsPerCta + static_cast<uint64_t>(region)) * chunkBytes;
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
MKERNEL_HD inline bool stagedTwoShot(Algo a, int nRanks) { return a == Algo::TwoShot && nRanks > 2; }

struct StagedCall {
  CollType coll;
  bool twoShot;          // AllReduce only
  int nRanks, rank, root;
  uint64_t count;        // NCCL's count (per-rank block for AllGather / ReduceScatter)
  uint64_t elemSize;
  uint64_t send, recv;   // this rank's user buffers (addresses)
  Slice part;            // this CTA's elements of the per-rank block
  uint64_t chunkElems;   // stagedChunkElems()
  uint32_t parityMask;   // 1; 0 only in the test that shows the race check catches reuse
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
template <class Ex>
MKERNEL_HD bool stagedCollective(Ex& ex, const StagedCall& c, uint64_t* chunkSeq) {
  const int n = c.nRanks, r = c.rank;
  const uint64_t esz = c.elemSize;
  const uint64_t align = sliceAlignElems(esz);
  const char* srcs[kMaxRanks];
  char* dsts[kMaxRanks];
  const char* send = reinterpret_cast<const char*>(c.send);
  char* recv = reinterpret_cast<char*>(c.recv);
  for (uint64_t o = 0; o < c.part.count; o += c.chunkElems) {
    const uint64_t l = c.part.count - o < c.chunkElems ? c.part.count - o : c.chunkElems;
    const uint64_t g = c.part.offset + o;  // first element of the chunk in the per-rank block
    const uint64_t slot = l * esz;         // bytes of one rank's slot in an inbox
    const int par = static_cast<int>((*chunkSeq)++ & c.parityMask);
    // push: into slot r of the inboxes that need this rank's data
    switch (c.coll) {
      case CollType::AllReduce:
        if (!c.twoShot) {
          for (int k = 0; k < n; ++k) dsts[k] = ex.in(k, par) + r * slot;
          ex.copy(dsts, n, send + g * esz, slot);
        } else {
          for (int k = 0; k < n; ++k) {  // part k of the chunk to its owner
            const Slice s = rankSlice(l, n, k, align);
            dsts[0] = ex.in(k, par) + r * slot + s.offset * esz;
            ex.copy(dsts, 1, send + (g + s.offset) * esz, s.count * esz);
          }
        }
        break;
      case CollType::ReduceScatter:
        for (int k = 0; k < n; ++k) {
          dsts[0] = ex.in(k, par) + r * slot;
          ex.copy(dsts, 1, send + (static_cast<uint64_t>(k) * c.count + g) * esz, slot);
        }
        break;
      case CollType::AllGather:
        for (int k = 0; k < n; ++k) dsts[k] = ex.in(k, par) + r * slot;
        ex.copy(dsts, n, send + g * esz, slot);
        break;
      case CollType::Broadcast:
        if (r == c.root) {
          for (int k = 0; k < n; ++k) dsts[k] = ex.in(k, par);
          ex.copy(dsts, n, send + g * esz, slot);
        }
        break;
      case CollType::Reduce:
        dsts[0] = ex.in(c.root, par) + r * slot;
        ex.copy(dsts, 1, send + g * esz, slot);
        break;
    }
    if (!ex.barrier()) return false;
    // compute: from this rank's own inbox into its own buffer
    const char* inbox = ex.in(r, par);
    switch (c.coll) {
      case CollType::AllReduce:
        if (!c.twoShot) {
          for (int k = 0; k < n; ++k) srcs[k] = inbox + k * slot;
          dsts[0] = recv + g * esz;
          ex.reduce(dsts, 1, srcs, n, l);
        } else {
          const Slice mine = rankSlice(l, n, r, align);
          for (int k = 0; k < n; ++k) {
            srcs[k] = inbox + k * slot + mine.offset * esz;
            dsts[k] = ex.out(k, par) + mine.offset * esz;
          }
          ex.reduce(dsts, n, srcs, n, mine.count);
          if (!ex.barrier()) return false;
          dsts[0] = recv + g * esz;
          ex.copy(dsts, 1, ex.out(r, par), slot);
        }
        break;
      case CollType::ReduceScatter:
        for (int k = 0; k < n; ++k) srcs[k] = inbox + k * slot;
        dsts[0] = recv + g * esz;
        ex.reduce(dsts, 1, srcs, n, l);
        break;
      case CollType::AllGather:
        for (int k = 0; k < n; ++k) {
          dsts[0] = recv + (static_cast<uint64_t>(k) * c.count + g) * esz;
          ex.copy(dsts, 1, inbox + k * slot, slot);
        }
        break;
      case CollType::Broadcast:
        dsts[0] = recv + g * esz;
        ex.copy(dsts, 1, inbox, slot);
        break;
      case CollType::Reduce:
        if (r == c.root) {
          for (int k = 0; k < n; ++k) srcs[k] = inbox + k * slot;
          dsts[0] = recv + g * esz;
          ex.reduce(dsts, 1, srcs, n, l);
        }
        break;
    }
  }
  return true;
}

}  // namespace coll
}  // namespace mkernel
