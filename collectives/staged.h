// Staged collectives: how the persistent kernel runs a communicator whose ranks are processes
// (docs/KERNEL.md, "Process ranks"). One algorithm, written once as a template over an executor,
// run by the kernel (collectives/device/kernel.cu: copies and reductions by a whole CTA, barriers
// by per-CTA epoch flags) and by the CPU test (tests/collectives/test_staged.cc: rank threads,
// with a check that no staging region is overwritten while a peer reads it).
//
// Thread ranks move data directly between user buffers: one process addresses every rank's
// device memory. A process cannot address another process's user buffers (a CUDA IPC handle per
// buffer and call would cost more than the collective), so each rank shares one staging buffer
// at communicator creation (cudaIpcGetMemHandle / cudaIpcOpenMemHandle) and every collective
// goes through it, chunk by chunk, in a pull model:
//
//   copy-in   the rank copies its input chunk into its own staging region in[parity]
//   barrier   every rank's chunk is in staging
//   compute   the rank reads its peers' in[parity] and writes only its OWN user buffer
//             (TwoShot AllReduce: reduce this rank's part into out[parity], barrier, gather
//             every rank's out[parity] part)
//
// No barrier is needed after a chunk: regions alternate by chunk parity, and a rank writes
// in[p] / out[p] again (two chunks later) only after the barrier of the chunk in between, which
// no peer reaches before it has finished reading them. A rank's output is complete when its own
// CTA finishes, so no end barrier is needed per collective either: one barrier per chunk
// (two for TwoShot).
//
// Staging per rank and CTA: 4 regions of chunkBytes (in[0], in[1], out[0], out[1]). A CTA
// works on its part of the per-rank block (rankSlice(count, nCtas, cta)) in chunks of
// stagedChunkElems() elements; ReduceScatter stages all nRanks blocks of a chunk in in[p].
// Reduction order: ranks 0..n-1 on every rank, like every other algorithm (collectives/algo.h).
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

// Elements of the per-rank block one chunk carries: a multiple of the 16-byte alignment, so every
// region offset and chunk start keeps 16-byte vector loads possible. ReduceScatter stages all
// nRanks blocks of the chunk in one region.
MKERNEL_HD inline uint64_t stagedChunkElems(CollType c, int nRanks, uint64_t elemSize, uint64_t chunkBytes) {
  const uint64_t bytes = c == CollType::ReduceScatter ? chunkBytes / static_cast<uint64_t>(nRanks) : chunkBytes;
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
//   void copy(char* dst, const char* src, uint64_t bytes)
//   void reduce(char* dst, const char* const* srcs, int nSrc, uint64_t elems)   in rank order
//   bool barrier()                                                    false: give up (error)
// Every call is made by every thread of the CTA alike (uniform control flow). *chunkSeq counts
// this CTA's chunks over the communicator's life (its parity picks the regions). False when a
// barrier failed.
#ifdef __CUDACC__
#pragma nv_exec_check_disable  // the kernel's executor is __device__, the test's __host__
#endif
template <class Ex>
MKERNEL_HD bool stagedCollective(Ex& ex, const StagedCall& c, uint64_t* chunkSeq) {
  const int n = c.nRanks, r = c.rank;
  const uint64_t esz = c.elemSize;
  const uint64_t align = sliceAlignElems(esz);
  const char* srcs[kMaxRanks];
  for (uint64_t o = 0; o < c.part.count; o += c.chunkElems) {
    const uint64_t l = c.part.count - o < c.chunkElems ? c.part.count - o : c.chunkElems;
    const uint64_t g = c.part.offset + o;  // first element of the chunk in the per-rank block
    const int par = static_cast<int>((*chunkSeq)++ & c.parityMask);
    char* myIn = ex.in(r, par);
    const char* send = reinterpret_cast<const char*>(c.send);
    char* recv = reinterpret_cast<char*>(c.recv);
    // copy-in
    if (c.coll == CollType::ReduceScatter) {
      for (int k = 0; k < n; ++k)
        ex.copy(myIn + static_cast<uint64_t>(k) * l * esz, send + (static_cast<uint64_t>(k) * c.count + g) * esz, l * esz);
    } else if (c.coll != CollType::Broadcast || r == c.root) {
      ex.copy(myIn, send + g * esz, l * esz);
    }
    if (!ex.barrier()) return false;
    switch (c.coll) {
      case CollType::AllReduce:
        if (!c.twoShot) {
          for (int k = 0; k < n; ++k) srcs[k] = ex.in(k, par);
          ex.reduce(recv + g * esz, srcs, n, l);
        } else {
          const Slice mine = rankSlice(l, n, r, align);
          for (int k = 0; k < n; ++k) srcs[k] = ex.in(k, par) + mine.offset * esz;
          ex.reduce(ex.out(r, par) + mine.offset * esz, srcs, n, mine.count);
          if (!ex.barrier()) return false;
          for (int k = 0; k < n; ++k) {
            const Slice s = rankSlice(l, n, k, align);
            ex.copy(recv + (g + s.offset) * esz, ex.out(k, par) + s.offset * esz, s.count * esz);
          }
        }
        break;
      case CollType::ReduceScatter:
        for (int k = 0; k < n; ++k) srcs[k] = ex.in(k, par) + static_cast<uint64_t>(r) * l * esz;
        ex.reduce(recv + g * esz, srcs, n, l);
        break;
      case CollType::AllGather:
        for (int k = 0; k < n; ++k)
          ex.copy(recv + (static_cast<uint64_t>(k) * c.count + g) * esz, ex.in(k, par), l * esz);
        break;
      case CollType::Broadcast:
        ex.copy(recv + g * esz, ex.in(c.root, par), l * esz);
        break;
      case CollType::Reduce:
        if (r == c.root) {
          for (int k = 0; k < n; ++k) srcs[k] = ex.in(k, par);
          ex.reduce(recv + g * esz, srcs, n, l);
        }
        break;
    }
  }
  return true;
}

}  // namespace coll
}  // namespace mkernel
