// Hierarchical (multi-node, rail-aligned) collectives: the partition shared by the persistent
// kernel's inter-node path and the CPU reference executor (hierarchical_ref.cc).
// docs/ALGORITHMS.md, "Hierarchical"; docs/PROXY.md for the inter-node transfers.
//
// Ranks are nNodes x perNode, rank = node * perNode + local. The rail of local index l is the set
// of ranks (j, l) for every node j: GPU l of every node, which talk through their nearest NICs.
// Every algorithm has at most three phases, each ending at a cross-rank barrier (on the GPU the
// phases are pipelined in chunks; the reference runs them one after the other):
//
// AllReduce      1 intra   rank (k,l) reduces node slice l over its node's inputs -> partial
//                2 inter   rank (k,l) reduces rail sub-slice k of slice l over the rail's partials
//                          and writes the result into every rail peer's recvbuff
//                3 intra   rank (k,l) copies its finished slice l into every local peer's recvbuff
// ReduceScatter  1 intra   rank (k,l), for every node j: reduces block (j,l) over its node's
//                          inputs -> partial j
//                2 inter   rank (k,l) reduces partial k over the rail -> its recvbuff
// AllGather      1 inter   rank (k,l) writes its block into block (k,l) of every rail peer
//                2 intra   rank (k,l) copies the rail's blocks (j,l) to every local peer
// Broadcast      1 inter   the root (kr,lr) writes its data into its rail peers (j,lr)
//                2 intra   rank (j,lr) copies it to its local peers
// Reduce         1 intra   rank (j,lr) of every node reduces its node's inputs -> partial
//                2 inter   the root (kr,lr) reduces the rail's partials -> its recvbuff
//
// Reduction order is canonical: local ranks 0..perNode-1 within a node, then nodes
// 0..nNodes-1; pre() (PreMulSum, Avg) applies to every input once in the intra-node phase,
// post() (integer Avg) once to the final result. Integer results therefore equal the flat
// algorithms' bit for bit; floating results differ only by reduction order.
#pragma once

#include <cstddef>

#include "collectives/algo/algo.h"

namespace mkernel {
namespace coll {

struct NodeLayout {
  int nNodes = 1;
  int perNode = 1;
  MKERNEL_HD int nRanks() const { return nNodes * perNode; }
  MKERNEL_HD int nodeOf(int rank) const { return rank / perNode; }
  MKERNEL_HD int localOf(int rank) const { return rank % perNode; }
  MKERNEL_HD int rankOf(int node, int local) const { return node * perNode + local; }
};

// The node layout of ranks spread over hosts (hosts[r]: an identifier of rank r's host): nodes
// are the hosts, which must hold consecutive ranks, the same number each (as torchrun and mpirun
// place them). Returns false with *why set otherwise. One host: {1, n}.
inline bool nodeLayoutOfHosts(const uint64_t* hosts, int n, NodeLayout* out, const char** why) {
  *why = "";
  int perNode = 1;
  while (perNode < n && hosts[perNode] == hosts[0]) ++perNode;
  if (n % perNode != 0) {
    *why = "the hosts do not hold the same number of ranks";
    return false;
  }
  for (int r = 0; r < n; ++r) {
    const int first = r / perNode * perNode;
    if (hosts[r] != hosts[first]) {
      *why =
          "a host's ranks are not consecutive, or the hosts do not hold the same number of ranks";
      return false;
    }
    if (r == first && r > 0)
      for (int q = 0; q < first; q += perNode)
        if (hosts[q] == hosts[r]) {
          *why = "a host's ranks are not consecutive";
          return false;
        }
  }
  out->perNode = perNode;
  out->nNodes = n / perNode;
  return true;
}

// AllReduce phase 1/3: the node slice local rank l reduces and then distributes.
MKERNEL_HD inline Slice hierNodeSlice(const NodeLayout& L, size_t count, int local,
                                      size_t alignElems) {
  return rankSlice(count, L.perNode, local, alignElems);
}

// AllReduce phase 2: the part of node slice `s` that rail member `node` reduces (absolute offset).
MKERNEL_HD inline Slice hierRailSlice(const NodeLayout& L, Slice s, int node, size_t alignElems) {
  Slice t = rankSlice(s.count, L.nNodes, node, alignElems);
  t.offset += s.offset;
  return t;
}

// Staging elements each rank needs for its partial results (phase 1 outputs).
MKERNEL_HD inline size_t hierPartialElems(CollType c, const NodeLayout& L, size_t count,
                                          size_t alignElems) {
  switch (c) {
    case CollType::AllReduce:
      return hierNodeSlice(L, count, 0, alignElems).count;  // slice 0 is the largest
    case CollType::ReduceScatter:
      return count * static_cast<size_t>(L.nNodes);
    case CollType::Reduce:
      return count;
    case CollType::AllGather:
    case CollType::Broadcast:
      return 0;
  }
  return 0;
}

}  // namespace coll
}  // namespace mkernel
