// A Plan: one collective call, validated, with everything algo.h derives from it (chunking,
// rounds, staging regions, the device reduction operator). The persistent kernel's work
// descriptor and the CPU reference executor are both filled from a Plan, so they agree on every
// number that shapes the schedule.
#pragma once

#include <cstddef>
#include <string>

#include "collectives/algo/algo.h"
#include "collectives/types.h"
#include "common/result.h"

namespace mkernel {
namespace coll {

// Ring chunk: 128 KiB, large enough that a step's fixed cost (a flag through NVLink or PCIe,
// ~1-3 us) is small next to its transfer, small enough that pipelined rounds overlap well.
constexpr size_t kDefaultChunkBytes = 128 * 1024;

struct PlanArgs {
  CollType coll = CollType::AllReduce;
  Algo algo = Algo::OneShot;
  DataType dtype = DataType::Float32;
  RedOp op = RedOp::Sum;
  size_t count = 0;  // NCCL's count (AllGather: sendcount, ReduceScatter: recvcount)
  int nRanks = 1;
  int root = 0;  // Broadcast / Reduce
  size_t chunkBytes = kDefaultChunkBytes;
  double scalar = 1.0;  // PreMulSum
};

struct Plan {
  PlanArgs args;
  DevRedOp redOp{};  // the reduction as the kernel applies it (reduction collectives)
  size_t elemSize = 0;
  size_t alignElems = 0;    // sliceAlignElems(elemSize)
  size_t chunkElems = 0;    // chunkElemsFor(chunkBytes, elemSize) (Ring)
  size_t rounds = 0;        // numRounds(...)
  size_t stagingElems = 0;  // staging each rank needs: stagingElemsNeeded(...)

  bool reduces() const {
    return args.coll == CollType::AllReduce || args.coll == CollType::ReduceScatter ||
           args.coll == CollType::Reduce;
  }
  // Elements in each rank's send and receive buffer, as NCCL defines them.
  size_t sendCount() const {
    return args.coll == CollType::ReduceScatter ? args.count * static_cast<size_t>(args.nRanks)
                                                : args.count;
  }
  size_t recvCount() const {
    return args.coll == CollType::AllGather ? args.count * static_cast<size_t>(args.nRanks)
                                            : args.count;
  }
  // Element offset of the in-place send buffer inside the receive buffer (AllGather: the rank's
  // block of recvbuff) or of recvbuff inside sendbuff (ReduceScatter); 0 for the others.
  size_t inPlaceOffset(int rank) const {
    bool blocks = args.coll == CollType::AllGather || args.coll == CollType::ReduceScatter;
    return blocks ? args.count * static_cast<size_t>(rank) : 0;
  }
  std::string describe() const;  // "AllReduce/ring float sum count=... nRanks=... chunk=..."
};

// Validates `args` (nRanks >= 1, root in range, the algorithm implements the collective, the op
// is defined for the dtype, chunkBytes > 0) and fills *out. InvalidArgument with a message
// otherwise.
Result makePlan(const PlanArgs& args, Plan* out);

}  // namespace coll
}  // namespace mkernel
