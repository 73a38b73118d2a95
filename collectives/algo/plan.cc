#include "collectives/algo/plan.h"

#include <cstdio>

#include "collectives/algo/reduce_host.h"

namespace mkernel {
namespace coll {

std::string Plan::describe() const {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s/%s %s %s count=%zu nRanks=%d root=%d chunk=%zuB",
                collName(args.coll), algoName(args.algo), dataTypeName(args.dtype),
                redOpName(args.op), args.count, args.nRanks, args.root, args.chunkBytes);
  return buf;
}

Result makePlan(const PlanArgs& args, Plan* out) {
  int coll = static_cast<int>(args.coll);
  if (coll < 0 || coll >= kNumCollTypes)
    return MK_ERROR(Result::InvalidArgument, "plan: invalid collective %d", coll);
  int dtype = static_cast<int>(args.dtype);
  if (dtype < 0 || dtype >= kNumDataTypes)
    return MK_ERROR(Result::InvalidArgument, "plan: invalid datatype %d", dtype);
  int algo = static_cast<int>(args.algo);
  if (algo < 0 || algo >= kNumAlgos)
    return MK_ERROR(Result::InvalidArgument, "plan: invalid algorithm %d", algo);
  if (args.nRanks < 1) return MK_ERROR(Result::InvalidArgument, "plan: nRanks %d < 1", args.nRanks);
  if ((args.coll == CollType::Broadcast || args.coll == CollType::Reduce) &&
      (args.root < 0 || args.root >= args.nRanks))
    return MK_ERROR(Result::InvalidArgument, "plan: %s root %d out of range [0, %d)",
                    collName(args.coll), args.root, args.nRanks);
  if (!algoSupports(args.coll, args.algo))
    return MK_ERROR(Result::InvalidArgument, "plan: algorithm %s does not implement %s",
                    algoName(args.algo), collName(args.coll));
  if (args.chunkBytes == 0) return MK_ERROR(Result::InvalidArgument, "plan: chunkBytes is 0");

  Plan p;
  p.args = args;
  p.elemSize = dataTypeSize(args.dtype);
  p.alignElems = sliceAlignElems(p.elemSize);
  p.chunkElems = chunkElemsFor(args.chunkBytes, p.elemSize);
  p.rounds = numRounds(args.coll, args.algo, args.count, args.nRanks, p.elemSize, p.chunkElems);
  p.stagingElems = stagingElemsNeeded(args.coll, args.algo, args.count, p.chunkElems);
  if (p.reduces()) {
    MK_CHECK(makeDevRedOp(args.op, args.dtype, args.nRanks, args.scalar, &p.redOp));
  }
  *out = p;
  return Result::Success;
}

}  // namespace coll
}  // namespace mkernel
