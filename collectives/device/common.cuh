// The persistent kernel's shared pieces: the CTA's shared state, kernel tracing
// (MKERNEL_KERNEL_TRACE, a test hook), and the data movers (the one place that instantiates
// reduceCopy for every dtype x op, behind function pointers that keep one copy of it).
#pragma once

#include <cuda_runtime.h>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>
#include "collectives/algo/algo.h"
#include "collectives/device/launch.h"
#include "collectives/device/reduce.cuh"
#include "collectives/device/sync.cuh"
#include "collectives/algo/hier_staged.h"
#include "collectives/route/launch_path.h"
#include "collectives/algo/staged.h"
#include "collectives/algo/staged_ring.h"
#include "collectives/types.h"

namespace mkernel {
namespace coll {
namespace dev {

constexpr uint32_t kDispatchExit = 0xffffffffu;

struct SharedState {
  DeviceState* peers[kMaxRanks];
  WorkSlot slot;
  CopyPlan plan;
  uint64_t peerSrc[kMaxRanks];
  uint64_t peerDst[kMaxRanks];
  uint32_t slotIndex;
  uint32_t stop;
  uint64_t epoch;  // launch kernel, captured: the sequence number thread 0 read from graphSeq
};

// MKERNEL_KERNEL_TRACE: CTA 0's thread 0 stamps group `seq` at `point` (no-op when tracing is off).
constexpr uint64_t kNoTrace = ~0ull;
__device__ inline void traceAt(const KernelParams& p, int cta, uint64_t seq, int point) {
  if (p.trace == nullptr || cta != 0 || threadIdx.x != 0 || seq == kNoTrace) return;
  KernelTraceRecord* r = &p.trace[seq % kTraceDepth];
  r->t[point] = globalTimerNs();
  r->c[point] = clock64();
  if (point == kTraceSeen) r->seq = seq + 1;
}

// traceAt after a value has arrived (MKERNEL_KERNEL_TRACE=3): the value is stored into the stamp's
// slot first, and a store waits for its data, so the stamp's clocks are read after it (in-order
// issue); the stamp then overwrites it.
__device__ inline void traceAfter(const KernelParams& p, int cta, uint64_t seq, int point,
                                  uint64_t dep) {
  if (p.trace == nullptr || cta != 0 || threadIdx.x != 0 || seq == kNoTrace) return;
  KernelTraceRecord* r = &p.trace[seq % kTraceDepth];
  *reinterpret_cast<volatile uint64_t*>(&r->t[point]) = dep;
  asm volatile("" ::: "memory");
  r->t[point] = globalTimerNs();
  r->c[point] = clock64();
}

// ---- dtype x op dispatch (the only place that instantiates reduceCopy) ------------------------

// withPre / withPost: apply the op's pre() (PreMulSum) / post() (SumPostDiv). Both true except
// in the hierarchical path, whose partial sums take pre() once and post() once (hier_staged.h).
// Calls f with the Reducer of d's op for element type T (one instantiation per family) and
// returns what f returns.
template <typename T, typename F>
__device__ __forceinline__ auto withReducer(const WorkDesc& d, bool withPre, bool withPost, F&& f) {
  T scalar;  // PreMulSum: the scalar in the dtype's own encoding, by value or by device pointer
  if (d.scalarDevPtr) {
    scalar = loadCg(reinterpret_cast<const T*>(d.scalarDevPtr));
  } else {
    memcpy(&scalar, &d.redOp.scalarBits, sizeof(T));
  }
  const uint32_t divisor = d.redOp.divisor;
  const DevRedOpKind kind = d.redOp.kind;
  if (kind == DevRedOpKind::Prod)
    return f(Reducer<T, kFamilyProd>{scalar, divisor, false, false, false});
  if (kind == DevRedOpKind::Min || kind == DevRedOpKind::Max)
    return f(Reducer<T, kFamilyMinMax>{scalar, divisor, false, false, kind == DevRedOpKind::Max});
  return f(Reducer<T, kFamilySum>{scalar, divisor, withPre && kind == DevRedOpKind::PreMulSum,
                                  withPost && kind == DevRedOpKind::SumPostDiv, false});
}

template <typename T>
__device__ void reduceTyped(const CopyPlan& plan, const WorkDesc& d, bool withPre, bool withPost) {
  withReducer<T>(d, withPre, withPost, [&](auto red) { reduceCopy(plan, red); });
}

__device__ __noinline__ void reduceDispatch(const CopyPlan& plan, const WorkDesc& d,
                                            bool withPre = true, bool withPost = true) {
  switch (static_cast<DataType>(d.dtype)) {
    case DataType::Int8:
      reduceTyped<int8_t>(plan, d, withPre, withPost);
      break;
    case DataType::Uint8:
      reduceTyped<uint8_t>(plan, d, withPre, withPost);
      break;
    case DataType::Int32:
      reduceTyped<int32_t>(plan, d, withPre, withPost);
      break;
    case DataType::Uint32:
      reduceTyped<uint32_t>(plan, d, withPre, withPost);
      break;
    case DataType::Int64:
      reduceTyped<int64_t>(plan, d, withPre, withPost);
      break;
    case DataType::Uint64:
      reduceTyped<uint64_t>(plan, d, withPre, withPost);
      break;
    case DataType::Float16:
      reduceTyped<__half>(plan, d, withPre, withPost);
      break;
    case DataType::Float32:
      reduceTyped<float>(plan, d, withPre, withPost);
      break;
    case DataType::Float64:
      reduceTyped<double>(plan, d, withPre, withPost);
      break;
    case DataType::Bfloat16:
      reduceTyped<__nv_bfloat16>(plan, d, withPre, withPost);
      break;
    case DataType::Fp8E4M3:
      reduceTyped<__nv_fp8_e4m3>(plan, d, withPre, withPost);
      break;
    case DataType::Fp8E5M2:
      reduceTyped<__nv_fp8_e5m2>(plan, d, withPre, withPost);
      break;
  }
}

// The persistent kernel calls its data movers through function pointers. A function called
// directly is compiled into each kernel's call graph, its registers allocated around those of
// its callers; inside the persistent kernel that left every mover with local-memory traffic in
// its inner loop (reduceCopy<float, Sum>: 76 stores / 85 loads there, none in the launch
// kernel), whatever the register cap, the call site or the values live across it
// (docs/PERFORMANCE.md). A function whose address is taken is compiled once with
// the ABI instead: it saves the callee-saved registers it uses on entry and restores them on
// return (43 stores and 43 loads for reduceCopy<float, Sum>), and its loop runs in registers.
// The pointers are read through volatile so the compiler cannot turn the call back into a
// direct one. The launch kernel calls reduceDispatch / copyBytes directly (its graph is small
// and compiles clean); the wrappers keep their address-taken copies apart from it.
__device__ __noinline__ void reduceDispatchAbi(const CopyPlan& plan, const WorkDesc& d,
                                               bool withPre, bool withPost) {
  reduceDispatch(plan, d, withPre, withPost);
}
__device__ __noinline__ void copyBytesAbi(const CopyPlan& plan) {
  copyBytes(plan);
}
using ReduceMover = void (*)(const CopyPlan&, const WorkDesc&, bool, bool);
using CopyMover = void (*)(const CopyPlan&);
__device__ ReduceMover gReduceMover = reduceDispatchAbi;
__device__ CopyMover gCopyMover = copyBytesAbi;

__device__ __forceinline__ void moveReduce(const CopyPlan& plan, const WorkDesc& d,
                                           bool withPre = true, bool withPost = true) {
  (*reinterpret_cast<volatile ReduceMover*>(&gReduceMover))(plan, d, withPre, withPost);
}
__device__ __forceinline__ void moveCopy(const CopyPlan& plan) {
  (*reinterpret_cast<volatile CopyMover*>(&gCopyMover))(plan);
}

}  // namespace dev
}  // namespace coll
}  // namespace mkernel
