// Collective, datatype and reduction-op identifiers shared by host and device code.
// Plain header: no CUDA intrinsics, no NCCL include. Values equal NCCL's (ncclFunc_t,
// ncclDataType_t, ncclRedOp_t) so that plugin/ converts by value; plugin/ static_asserts this.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mkernel {
namespace coll {

enum class CollType : int32_t {
  Broadcast = 0,
  Reduce = 1,
  AllGather = 2,
  ReduceScatter = 3,
  AllReduce = 4,
};
constexpr int kNumCollTypes = 5;

enum class DataType : int32_t {
  Int8 = 0,
  Uint8 = 1,
  Int32 = 2,
  Uint32 = 3,
  Int64 = 4,
  Uint64 = 5,
  Float16 = 6,
  Float32 = 7,
  Float64 = 8,
  Bfloat16 = 9,
  Fp8E4M3 = 10,
  Fp8E5M2 = 11,
};
constexpr int kNumDataTypes = 12;

// Built-in ops have NCCL's values; PreMulSum is how a custom op (ncclRedOpCreatePreMulSum)
// reaches collectives/: the scalar travels in CollArgs.
enum class RedOp : int32_t {
  Sum = 0,
  Prod = 1,
  Max = 2,
  Min = 3,
  Avg = 4,
  PreMulSum = 5,
};
constexpr int kNumRedOps = 6;

constexpr size_t dataTypeSize(DataType t) {
  switch (t) {
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
    case DataType::Int64:
    case DataType::Uint64:
    case DataType::Float64:
      return 8;
  }
  return 0;
}

const char* collName(CollType c);      // "AllReduce", ...
const char* dataTypeName(DataType t);  // "float32", ...
const char* redOpName(RedOp op);       // "sum", ...

// One collective call, as the shim hands it to a Communicator. Counts are NCCL's: per-rank
// element counts (AllGather: sendcount; ReduceScatter: recvcount).
struct CollArgs {
  CollType coll = CollType::AllReduce;
  DataType dtype = DataType::Float32;
  RedOp op = RedOp::Sum;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;
  int root = 0;
  // PreMulSum: the scalar, either by value (already converted to double) or as a device pointer
  // to one element of `dtype` (NCCL's ncclScalarDevice).
  double scalar = 1.0;
  const void* scalarDevPtr = nullptr;
  // The algorithm (collectives/algo/algo.h Algo) chosen by the selection policy
  // (collectives/policy.h), which the shim consults for every call; -1 lets the Communicator apply
  // the same default rule.
  int32_t algo = -1;
};

}  // namespace coll
}  // namespace mkernel
