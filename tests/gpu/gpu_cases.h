// The GPU tier's case lists (tests/gpu/test_gpu_collectives.cc), host code only, so that CPU
// tests can rebuild a case's inputs (gpu_check.h's makeInput with the case's seed: its index in
// the list + 1) and its expected result: tests/collectives/test_gpu_tolerance.cc reproduces the
// hierarchical path's bf16 rounding with them.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collectives/types.h"

namespace mkgpu {

using mkernel::coll::CollType;
using mkernel::coll::DataType;
using mkernel::coll::RedOp;

struct Case {
  CollType coll;
  DataType dtype;
  RedOp op;
  size_t count;
  bool inPlace;
  int root;
  size_t misalign;  // elements added to the send pointer (out-of-place only)
  bool scalarOnDevice;
};

constexpr double kScalar = 0.5;  // PreMulSum's scalar

inline bool reduces(CollType c) {
  return c == CollType::AllReduce || c == CollType::ReduceScatter || c == CollType::Reduce;
}

inline std::vector<Case> buildCases(int nRanks) {
  const CollType colls[] = {CollType::AllReduce, CollType::ReduceScatter, CollType::Reduce,
                            CollType::AllGather, CollType::Broadcast};
  const RedOp ops[] = {RedOp::Sum, RedOp::Prod, RedOp::Max,
                       RedOp::Min, RedOp::Avg,  RedOp::PreMulSum};
  std::vector<Case> cases;
  int seq = 0;
  for (CollType c : colls) {
    for (int t = 0; t < mkernel::coll::kNumDataTypes; ++t) {
      DataType dt = static_cast<DataType>(t);
      for (RedOp op : ops) {
        if (!reduces(c) && op != RedOp::Sum) continue;
        for (size_t count : {size_t(1), size_t(4099)}) {
          for (bool inPlace : {false, true}) {
            Case k{c, dt, op, count, inPlace, (seq++) % nRanks, 0, false};
            if (!inPlace && count == 4099) k.misalign = 1;
            if (op == RedOp::PreMulSum && (dt == DataType::Float32 || dt == DataType::Int32) &&
                inPlace)
              k.scalarOnDevice = true;
            cases.push_back(k);
          }
        }
      }
    }
  }
  // Medium: 30 KiB to 240 KiB from each rank to each peer, odd counts (the last LL line partly
  // filled); with MKERNEL_LL_MAX_BYTES raised (test_gpu_ll_max) the LL mode's larger slots of a
  // communicator with few ranks, else the inbox or direct mode.
  const DataType midTypes[] = {DataType::Int8, DataType::Float16, DataType::Float32,
                               DataType::Float64, DataType::Bfloat16};
  for (CollType c : colls) {
    for (DataType dt : midTypes) {
      for (RedOp op : {RedOp::Sum, RedOp::Avg}) {
        if (!reduces(c) && op != RedOp::Sum) continue;
        for (bool inPlace : {false, true}) {
          Case k{c, dt, op, 30011, inPlace, (seq++) % nRanks, 0, false};
          if (!inPlace) k.misalign = 1;
          cases.push_back(k);
        }
      }
    }
  }
  // Large: two-shot AllReduce, every CTA busy, 16-byte vector path.
  const DataType bigTypes[] = {DataType::Float32, DataType::Bfloat16, DataType::Int8,
                               DataType::Fp8E4M3, DataType::Float64,  DataType::Uint64};
  for (CollType c : colls) {
    for (DataType dt : bigTypes) {
      for (RedOp op : {RedOp::Sum, RedOp::Avg, RedOp::Max}) {
        if (!reduces(c) && op != RedOp::Sum) continue;
        for (bool inPlace : {false, true}) {
          size_t count = 3 * 65536 + 5;
          if (c == CollType::AllGather || c == CollType::ReduceScatter)
            count = count / static_cast<size_t>(nRanks) + 3;
          cases.push_back(Case{c, dt, op, count, inPlace, (seq++) % nRanks, 0, false});
        }
      }
    }
  }
  return cases;
}

// Direct mode's bulk (test_gpu_direct, test_gpu_direct_shared: MKERNEL_DIRECT_MAX_BYTES=0, so
// that every op above the launch threshold takes it with any number of ranks on the GPU): about
// 4 MiB of each rank's input, enough for every CTA of the op (one per 64 KiB of a rank's share, up
// to the cap), odd counts (the element loop after the 16-byte vectors), every collective, narrow
// and wide types, in and out of place, misaligned sends.
inline std::vector<Case> buildDirectCases(int nRanks) {
  const CollType colls[] = {CollType::AllReduce, CollType::ReduceScatter, CollType::Reduce,
                            CollType::AllGather, CollType::Broadcast};
  const DataType types[] = {DataType::Float32, DataType::Bfloat16, DataType::Int8,
                            DataType::Fp8E5M2, DataType::Float64,  DataType::Int32};
  std::vector<Case> cases;
  int seq = 0;
  for (CollType c : colls) {
    for (DataType dt : types) {
      for (RedOp op : {RedOp::Sum, RedOp::Max, RedOp::PreMulSum}) {
        if (!reduces(c) && op != RedOp::Sum) continue;
        const size_t esz = mkernel::coll::dataTypeSize(dt);
        for (bool inPlace : {false, true}) {
          size_t count = (size_t(4) << 20) / esz + 3;
          if (c == CollType::AllGather || c == CollType::ReduceScatter)
            count = count / static_cast<size_t>(nRanks) + 1;
          Case k{c, dt, op, count, inPlace, (seq++) % nRanks, 0, false};
          if (!inPlace && seq % 3 == 0) k.misalign = 1;
          cases.push_back(k);
        }
      }
    }
  }
  return cases;
}

inline std::string caseName(const Case& k) {
  return std::string(mkernel::coll::collName(k.coll)) + "/" + mkernel::coll::dataTypeName(k.dtype) +
         "/" + mkernel::coll::redOpName(k.op) + " count=" + std::to_string(k.count) +
         (k.inPlace ? " in-place" : " out-of-place") + " root=" + std::to_string(k.root) +
         (k.misalign ? " misaligned" : "") + (k.scalarOnDevice ? " scalar-on-device" : "");
}

}  // namespace mkgpu
