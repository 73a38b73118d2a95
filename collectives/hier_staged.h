// Hierarchical AllReduce through staging and the proxy: the in-kernel form of
// collectives/hierarchical.h's three phases (docs/ALGORITHMS.md, "Hierarchical"), chunked and
// written once as a template over an executor, like collectives/staged.h. The CPU test
// (tests/collectives/test_hier_staged.cc) runs it with rank threads, node-local staging regions
// checked for early reuse, and a real transport/proxy/Proxy per rank moving the inter-node bytes
// over TCP on loopback: the same command ring the persistent kernel will post to.
//
// Ranks are nNodes x perNode (NodeLayout); rank (k, j) is local rank j of node k. For each chunk
// of l elements of the buffer (at element g of this CTA's part):
//
//   1 intra  push part q of the chunk (rankSlice(l, perNode, q)) into slot j of local rank q's
//            inbox; node barrier; reduce part j over the node's slots (pre() applied,
//            not post()) into this rank's net buffer P (registered with the proxy)
//   2 inter  among the rail (ranks (m, j) for every node m), P in nNodes sub-parts
//            t_m = rankSlice(|P|, nNodes, m): round 1 sends t_m to node m and receives t_k from
//            every other node; reduce t_k over the nodes in order 0..nNodes-1 (post() applied);
//            round 2 sends the reduced t_k to every other node and receives their t_m
//   3 intra  push every t_m of part j into the out region of every local rank (at part j's
//            offset); node barrier; copy this rank's out region into its recvbuff
//
// Reduction order: local ranks 0..perNode-1 within a node, then nodes 0..nNodes-1, the order
// hierarchical.h fixes (integers equal the flat algorithms' bits).
//
// Reuse needs no parity (unlike staged.h's single barrier per chunk): a rank pushes chunk i+1
// into a peer's inbox only after the second node barrier of chunk i, which the peer reaches
// after it has read its inbox; and into a peer's out region only after the first node barrier
// of chunk i+1, which the peer reaches after it has copied its out region of chunk i away. Net
// buffers are this rank's own: the proxy's transfers of a round complete before the round
// returns, and a receive slot is refilled only by a receive this rank posts after it has
// consumed the slot. (tests/proxy/test_hier_staged.cc breaks the second barrier on purpose and
// checks that the race check sees it.)
#pragma once

#include <cstdint>

#include "collectives/algo.h"
#include "collectives/hierarchical.h"
#include "collectives/work.h"

namespace mkernel {
namespace coll {

constexpr int kMaxHierNodes = 16;

struct HierCall {
  NodeLayout layout;
  int node, local;       // this rank
  uint64_t count;        // elements per rank
  uint64_t elemSize;
  uint64_t send, recv;   // this rank's user buffers
  Slice part;            // this CTA's elements
  uint64_t chunkElems;   // hierChunkElems()
};

// Elements of a chunk: an inbox holds perNode slots of the largest part of a chunk, so a chunk
// may be about chunkBytes of the per-rank buffer; a multiple of the 16-byte alignment.
MKERNEL_HD inline uint64_t hierChunkElems(const NodeLayout& L, uint64_t elemSize, uint64_t chunkBytes) {
  const uint64_t align = sliceAlignElems(elemSize);
  // The largest of perNode parts is at most ceil(l / perNode) rounded up to the alignment, and
  // perNode of them must fit: l <= (chunkBytes / esz / perNode - align) * perNode, aligned down.
  const uint64_t perSlot = chunkBytes / elemSize / static_cast<uint64_t>(L.perNode);
  if (perSlot <= align) return 0;
  return (perSlot - align) * static_cast<uint64_t>(L.perNode) / align * align;
}

// Bytes of one slot of an inbox (the largest part of a chunk of chunkElems elements).
MKERNEL_HD inline uint64_t hierSlotBytes(const NodeLayout& L, uint64_t chunkElems, uint64_t elemSize) {
  return rankSlice(chunkElems, L.perNode, 0, sliceAlignElems(elemSize)).count * elemSize;
}

// Runs AllReduce call c for one CTA through executor ex, which provides:
//   char* in(int local), char* out(int local)   node-local regions (perNode slots; a chunk)
//   char* netSend()                             this rank's P (>= one slot), registered
//   char* netRecv(int node)                     a slot per node (>= one sub-part), registered
//   void copy(char* const* dsts, int nDst, const char* src, uint64_t bytes)
//   void reduce(char* const* dsts, int nDst, const char* const* srcs, int nSrc, uint64_t elems,
//               bool pre, bool post)         srcs in order; pre() on every input, post() on the result
//   bool nodeBarrier()                          the node's ranks (this CTA index)
//   bool railExchange(int round, const char* const* sendPtr, const uint64_t* sendBytes,
//                     char* const* recvPtr, const uint64_t* recvBytes)
//        sends sendPtr[m] to node m and receives recvPtr[m] from node m, for every m != this
//        node, and returns once all are complete (false on a transport failure or timeout)
// Uniform control flow across the CTA's threads; false when a wait failed.
#ifdef __CUDACC__
#pragma nv_exec_check_disable  // the kernel's executor is __device__, the test's __host__
#endif
template <class Ex>
MKERNEL_HD bool hierAllReduce(Ex& ex, const HierCall& c) {
  const int G = c.layout.perNode, N = c.layout.nNodes, j = c.local, k = c.node;
  const uint64_t esz = c.elemSize;
  const uint64_t align = sliceAlignElems(esz);
  const uint64_t slotBytes = hierSlotBytes(c.layout, c.chunkElems, esz);
  const char* send = reinterpret_cast<const char*>(c.send);
  char* recv = reinterpret_cast<char*>(c.recv);
  const char* srcs[kMaxRanks];
  char* dsts[kMaxRanks];
  const char* netSrc[kMaxHierNodes];
  char* netDst[kMaxHierNodes];
  uint64_t netSendBytes[kMaxHierNodes], netRecvBytes[kMaxHierNodes];
  for (uint64_t o = 0; o < c.part.count; o += c.chunkElems) {
    const uint64_t l = c.part.count - o < c.chunkElems ? c.part.count - o : c.chunkElems;
    const uint64_t g = c.part.offset + o;
    // 1: intra-node reduce-scatter
    for (int q = 0; q < G; ++q) {
      const Slice s = rankSlice(l, G, q, align);
      dsts[0] = ex.in(q) + static_cast<uint64_t>(j) * slotBytes;
      ex.copy(dsts, 1, send + (g + s.offset) * esz, s.count * esz);
    }
    if (!ex.nodeBarrier()) return false;
    const Slice mine = rankSlice(l, G, j, align);
    char* P = ex.netSend();
    for (int q = 0; q < G; ++q) srcs[q] = ex.in(j) + static_cast<uint64_t>(q) * slotBytes;
    dsts[0] = P;
    ex.reduce(dsts, 1, srcs, G, mine.count, true, false);
    // 2: inter-node, among the rail
    for (int m = 0; m < N; ++m) {
      const Slice t = rankSlice(mine.count, N, m, align);
      netSrc[m] = P + t.offset * esz;
      netSendBytes[m] = m == k ? 0 : t.count * esz;
      netDst[m] = ex.netRecv(m);
      netRecvBytes[m] = m == k ? 0 : rankSlice(mine.count, N, k, align).count * esz;
    }
    if (!ex.railExchange(0, netSrc, netSendBytes, netDst, netRecvBytes)) return false;
    const Slice tk = rankSlice(mine.count, N, k, align);
    for (int m = 0; m < N; ++m) srcs[m] = m == k ? P + tk.offset * esz : ex.netRecv(m);
    dsts[0] = P + tk.offset * esz;
    ex.reduce(dsts, 1, srcs, N, tk.count, false, true);
    for (int m = 0; m < N; ++m) {
      const Slice t = rankSlice(mine.count, N, m, align);
      netSrc[m] = P + tk.offset * esz;
      netSendBytes[m] = m == k ? 0 : tk.count * esz;
      netDst[m] = ex.netRecv(m);
      netRecvBytes[m] = m == k ? 0 : t.count * esz;
    }
    if (!ex.railExchange(1, netSrc, netSendBytes, netDst, netRecvBytes)) return false;
    // 3: intra-node all-gather of part j
    for (int m = 0; m < N; ++m) {
      const Slice t = rankSlice(mine.count, N, m, align);
      for (int q = 0; q < G; ++q) dsts[q] = ex.out(q) + (mine.offset + t.offset) * esz;
      ex.copy(dsts, G, m == k ? P + tk.offset * esz : ex.netRecv(m), t.count * esz);
    }
    if (!ex.nodeBarrier()) return false;
    dsts[0] = recv + g * esz;
    ex.copy(dsts, 1, ex.out(j), l * esz);
  }
  return true;
}

}  // namespace coll
}  // namespace mkernel
