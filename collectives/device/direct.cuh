// Thread ranks, direct mode: this CTA's share of one collective over the ranks' own
// buffers (one-shot and two-shot AllReduce, AllGather, ReduceScatter, Broadcast, Reduce;
// collectives/algo/algo.h's partition).
#pragma once

#include "collectives/device/common.cuh"

namespace mkernel {
namespace coll {
namespace dev {

// ---- one collective, this CTA's share
// ------------------------------------------------------------

__device__ inline bool aligned16(uint64_t p) {
  return (p & 15) == 0;
}

// dataTypeSize() of collectives/types.h is a host constexpr function; this is its device twin.
__device__ inline uint64_t elemSize(int32_t dtype) {
  switch (static_cast<DataType>(dtype)) {
    case DataType::Int8:
    case DataType::Uint8:
    case DataType::Fp8E4M3:
    case DataType::Fp8E5M2:
      return 1;
    case DataType::Float16:
    case DataType::Bfloat16:
      return 2;
    case DataType::Int32:
    case DataType::Uint32:
    case DataType::Float32:
      return 4;
    default:
      return 8;
  }
}

// Fills sh.plan for collective d (thread 0 only). Returns false when the CTA has nothing to move.
__device__ bool planCollective(const KernelParams& p, SharedState& sh, const WorkDesc& d, int cta) {
  CopyPlan& plan = sh.plan;
  const CollType coll = static_cast<CollType>(d.coll);
  const uint64_t esz = elemSize(d.dtype);
  const size_t align = sliceAlignElems(esz);
  const int n = p.nRanks, r = p.rank;
  // The range of elements this rank handles (its rank slice, or everything), split among CTAs
  // exactly as every peer splits it.
  Slice mine;
  if (coll == CollType::AllReduce && static_cast<Algo>(d.algo) == Algo::TwoShot) {
    mine = rankSlice(d.count, n, r, align);
  } else if (coll == CollType::Broadcast || coll == CollType::Reduce) {
    mine = rankSlice(d.count, n, r, align);
  } else {
    mine = Slice{0, d.count};
  }
  Slice part = rankSlice(mine.count, d.nCtas, cta, align);
  const uint64_t start = mine.offset + part.offset;
  plan.count = part.count;
  plan.nSrc = plan.nDst = 0;
  const uint64_t myDst = sh.peerDst[r];
  switch (coll) {
    case CollType::AllReduce:
      for (int k = 0; k < n; ++k)
        plan.src[plan.nSrc++] = reinterpret_cast<const char*>(sh.peerSrc[k] + start * esz);
      if (static_cast<Algo>(d.algo) == Algo::TwoShot) {
        for (int k = 0; k < n; ++k)
          plan.dst[plan.nDst++] = reinterpret_cast<char*>(sh.peerDst[k] + start * esz);
      } else {
        plan.dst[plan.nDst++] = reinterpret_cast<char*>(myDst + start * esz);
      }
      break;
    case CollType::ReduceScatter:
      for (int k = 0; k < n; ++k)
        plan.src[plan.nSrc++] =
            reinterpret_cast<const char*>(sh.peerSrc[k] + (uint64_t(r) * d.count + start) * esz);
      plan.dst[plan.nDst++] = reinterpret_cast<char*>(myDst + start * esz);
      break;
    case CollType::AllGather:
      plan.src[plan.nSrc++] = reinterpret_cast<const char*>(sh.peerSrc[r] + start * esz);
      for (int k = 0; k < n; ++k)
        plan.dst[plan.nDst++] =
            reinterpret_cast<char*>(sh.peerDst[k] + (uint64_t(r) * d.count + start) * esz);
      break;
    case CollType::Broadcast:
      plan.src[plan.nSrc++] = reinterpret_cast<const char*>(sh.peerSrc[d.root] + start * esz);
      for (int k = 0; k < n; ++k)
        plan.dst[plan.nDst++] = reinterpret_cast<char*>(sh.peerDst[k] + start * esz);
      break;
    case CollType::Reduce:
      for (int k = 0; k < n; ++k)
        plan.src[plan.nSrc++] = reinterpret_cast<const char*>(sh.peerSrc[k] + start * esz);
      plan.dst[plan.nDst++] = reinterpret_cast<char*>(sh.peerDst[d.root] + start * esz);
      break;
  }
  bool al = true;
  for (int i = 0; i < plan.nSrc; ++i) al = al && aligned16(reinterpret_cast<uint64_t>(plan.src[i]));
  for (int i = 0; i < plan.nDst; ++i) al = al && aligned16(reinterpret_cast<uint64_t>(plan.dst[i]));
  plan.aligned = al;
  return plan.count > 0;
}

}  // namespace dev
}  // namespace coll
}  // namespace mkernel
