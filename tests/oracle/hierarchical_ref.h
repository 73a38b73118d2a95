// CPU reference executor of the hierarchical collectives (collectives/algo/hierarchical.h): every
// simulated rank's host buffers, phase by phase, with the race check of the flat executor (no two
// ranks touch overlapping user bytes in one phase unless both only read) and a check that every
// partial result is read only after a barrier made it visible. CI tests 2-4 nodes x 1-8 ranks
// against the flat executor and a float64 reference (tests/collectives/test_hierarchical.cc).
#pragma once

#include "collectives/algo/hierarchical.h"
#include "tests/oracle/reference.h"
#include "collectives/types.h"
#include "common/result.h"

namespace mkernel {
namespace coll {

struct HierArgs {
  CollType coll = CollType::AllReduce;
  DataType dtype = DataType::Float32;
  RedOp op = RedOp::Sum;
  size_t count = 0;  // NCCL's count (AllGather: sendcount, ReduceScatter: recvcount)
  NodeLayout layout;
  int root = 0;         // Broadcast / Reduce
  double scalar = 1.0;  // PreMulSum
};

// Runs the collective over bufs[0 .. layout.nRanks()-1] (RankBuffers as for runReference: NCCL's
// in-place conventions). InvalidArgument for a bad layout, root, dtype or op; InternalError when a
// schedule check fails. stats counts user-buffer and partial-buffer traffic and phases.
Result runHierarchicalReference(const HierArgs& args, const RankBuffers* bufs,
                                ReferenceStats* stats = nullptr);

}  // namespace coll
}  // namespace mkernel
