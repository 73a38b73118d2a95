// Element-wise reductions of the persistent kernel, with NCCL's semantics (docs/ALGORITHMS.md):
// integers wrap (arithmetic in the unsigned type), fp16/bf16 round to 16 bits at every operation,
// fp8 goes through half and is rounded back (saturating to the largest finite value) at every
// operation, PreMulSum multiplies each input by the scalar in the element type, SumPostDiv
// (integer Avg) divides the wrapped sum once, truncating toward zero.
//
// reduceCopy() is the one data-moving primitive of every reducing collective: it reads nSrc
// inputs (combined in source order, i.e. canonical rank order, collectives/algo/algo.h) and writes
// the result to nDst outputs, with 16-byte loads when every pointer is 16-byte aligned. Loads use
// ld.global.cg (L2 only): data written by other SMs since our last read must not come from a
// stale L1 line.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "collectives/algo/work.h"

namespace mkernel {
namespace coll {
namespace dev {

constexpr int kUnroll = 4;  // 16-byte vectors in flight per thread and source

template <typename T>
__device__ __forceinline__ T loadCg(const T* p) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "size");
  T out;
  if constexpr (sizeof(T) == 1) {
    unsigned short v;  // no 8-bit .cg load intrinsic: load the byte through a 16-bit register
    asm volatile("ld.global.cg.u8 %0, [%1];" : "=h"(v) : "l"(p));
    uint8_t b = static_cast<uint8_t>(v);
    memcpy(&out, &b, 1);
  } else if constexpr (sizeof(T) == 2) {
    unsigned short v = __ldcg(reinterpret_cast<const unsigned short*>(p));
    memcpy(&out, &v, 2);
  } else if constexpr (sizeof(T) == 4) {
    unsigned int v = __ldcg(reinterpret_cast<const unsigned int*>(p));
    memcpy(&out, &v, 4);
  } else {
    unsigned long long v = __ldcg(reinterpret_cast<const unsigned long long*>(p));
    memcpy(&out, &v, 8);
  }
  return out;
}

// ---- arithmetic per element type -------------------------------------------------------------

template <typename T, typename Enable = void>
struct Arith;

template <typename T>
struct Arith<T, std::enable_if_t<std::is_integral<T>::value>> {
  using U = std::make_unsigned_t<T>;
  static __device__ __forceinline__ T add(T a, T b) { return T(U(U(a) + U(b))); }
  static __device__ __forceinline__ T mul(T a, T b) {
    // Promote below 32 bits so that the product of two uint8/int8 values cannot overflow int.
    using W = std::conditional_t<(sizeof(T) < 4), uint32_t, U>;
    return T(U(W(U(a)) * W(U(b))));
  }
  static __device__ __forceinline__ T min(T a, T b) { return a < b ? a : b; }
  static __device__ __forceinline__ T max(T a, T b) { return a < b ? b : a; }
  static __device__ __forceinline__ T div(T a, uint32_t n) { return T(a / T(n)); }  // truncates
  static __device__ __forceinline__ T fromDouble(double x) { return T(static_cast<int64_t>(x)); }
};

template <typename T>
struct Arith<T, std::enable_if_t<std::is_floating_point<T>::value>> {
  static __device__ __forceinline__ T add(T a, T b) { return a + b; }
  static __device__ __forceinline__ T mul(T a, T b) { return a * b; }
  static __device__ __forceinline__ T min(T a, T b) { return fmin(a, b); }
  static __device__ __forceinline__ T max(T a, T b) { return fmax(a, b); }
  static __device__ __forceinline__ T div(T a, uint32_t n) { return a / T(n); }
  static __device__ __forceinline__ T fromDouble(double x) { return T(x); }
};

template <>
struct Arith<__half> {
  using T = __half;
  static __device__ __forceinline__ T add(T a, T b) { return __hadd(a, b); }
  static __device__ __forceinline__ T mul(T a, T b) { return __hmul(a, b); }
  static __device__ __forceinline__ T min(T a, T b) { return __hmin(a, b); }
  static __device__ __forceinline__ T max(T a, T b) { return __hmax(a, b); }
  static __device__ __forceinline__ T div(T a, uint32_t n) {
    return __float2half(__half2float(a) / n);
  }
  static __device__ __forceinline__ T fromDouble(double x) { return __double2half(x); }
};

template <>
struct Arith<__nv_bfloat16> {
  using T = __nv_bfloat16;
  static __device__ __forceinline__ T add(T a, T b) { return __hadd(a, b); }
  static __device__ __forceinline__ T mul(T a, T b) { return __hmul(a, b); }
  static __device__ __forceinline__ T min(T a, T b) { return __hmin(a, b); }
  static __device__ __forceinline__ T max(T a, T b) { return __hmax(a, b); }
  static __device__ __forceinline__ T div(T a, uint32_t n) {
    return __float2bfloat16(__bfloat162float(a) / n);
  }
  static __device__ __forceinline__ T fromDouble(double x) { return __double2bfloat16(x); }
};

// fp8: each operation converts to half, computes in half, and rounds back (satfinite), as NCCL.
template <typename F8>
struct ArithFp8 {
  static __device__ __forceinline__ __half h(F8 a) { return static_cast<__half>(a); }
  static __device__ __forceinline__ F8 add(F8 a, F8 b) { return F8(__hadd(h(a), h(b))); }
  static __device__ __forceinline__ F8 mul(F8 a, F8 b) { return F8(__hmul(h(a), h(b))); }
  static __device__ __forceinline__ F8 min(F8 a, F8 b) { return __hlt(h(b), h(a)) ? b : a; }
  static __device__ __forceinline__ F8 max(F8 a, F8 b) { return __hlt(h(a), h(b)) ? b : a; }
  static __device__ __forceinline__ F8 div(F8 a, uint32_t n) {
    return F8(__float2half(__half2float(h(a)) / n));
  }
  static __device__ __forceinline__ F8 fromDouble(double x) { return F8(__double2half(x)); }
};
template <>
struct Arith<__nv_fp8_e4m3> : ArithFp8<__nv_fp8_e4m3> {};
template <>
struct Arith<__nv_fp8_e5m2> : ArithFp8<__nv_fp8_e5m2> {};

// ---- the reduction functor ---------------------------------------------------------------------

// Three instantiations per dtype keep the compile time in bounds (DESIGN: the .cu must build in a
// few minutes on 2 cores): the Sum family (Sum, PreMulSum, SumPostDiv) shares one with run-time
// pre/post flags, Min and Max share one with a run-time select, Prod has its own. The flags are
// uniform across the CTA, so the branches cost nothing next to the memory traffic.
enum ReducerFamily : int { kFamilySum = 0, kFamilyProd = 1, kFamilyMinMax = 2 };

template <typename T, int FAMILY>
struct Reducer {
  T scalar;          // PreMulSum
  uint32_t divisor;  // SumPostDiv
  bool preMul;       // Sum family: multiply each input by scalar
  bool postDiv;      // Sum family: divide the result by divisor (integers)
  bool isMax;        // MinMax family
  __device__ __forceinline__ T pre(T x) const {
    if constexpr (FAMILY == kFamilySum) return preMul ? Arith<T>::mul(x, scalar) : x;
    return x;
  }
  __device__ __forceinline__ T combine(T a, T b) const {
    if constexpr (FAMILY == kFamilyProd) return Arith<T>::mul(a, b);
    if constexpr (FAMILY == kFamilyMinMax) return isMax ? Arith<T>::max(a, b) : Arith<T>::min(a, b);
    return Arith<T>::add(a, b);
  }
  __device__ __forceinline__ T post(T x) const {
    if constexpr (FAMILY == kFamilySum && std::is_integral<T>::value)
      return postDiv ? Arith<T>::div(x, divisor) : x;
    return x;
  }
};

// Pointers of one reduceCopy, prepared in shared memory by the calling CTA.
struct CopyPlan {
  const char* src[kMaxRanks];
  char* dst[kMaxRanks];
  int nSrc;
  int nDst;
  uint64_t count;  // elements
  bool aligned;    // every src/dst 16-byte aligned
};

template <typename T, int FAMILY>
__device__ __noinline__ void reduceCopy(const CopyPlan& plan, Reducer<T, FAMILY> red) {
  constexpr int kElems = 16 / sizeof(T);
  // Narrow types unpack 8-16 elements per vector: fewer vectors in flight keep them in registers.
  constexpr int kUnroll = sizeof(T) >= 4 ? 4 : 2;
  const int nSrc = plan.nSrc, nDst = plan.nDst;
  const uint64_t count = plan.count;
  uint64_t done = 0;
  if (plan.aligned) {
    const uint64_t nVec = count / kElems;
    const uint64_t stride = uint64_t(blockDim.x) * kUnroll;
    for (uint64_t v0 = threadIdx.x; v0 < nVec; v0 += stride) {
      // Loads of the next source are issued before the current one is combined, so that a
      // remote source's NVLink round trip overlaps the local one's instead of following it
      // (the first two sources' loads leave back to back).
      uint4 acc[kUnroll], in[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        uint64_t v = v0 + uint64_t(u) * blockDim.x;
        if (v < nVec) acc[u] = __ldcg(reinterpret_cast<const uint4*>(plan.src[0]) + v);
      }
      if (nSrc > 1) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          uint64_t v = v0 + uint64_t(u) * blockDim.x;
          if (v < nVec) in[u] = __ldcg(reinterpret_cast<const uint4*>(plan.src[1]) + v);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        T* a = reinterpret_cast<T*>(&acc[u]);
#pragma unroll
        for (int e = 0; e < kElems; ++e) a[e] = red.pre(a[e]);
      }
      for (int s = 1; s < nSrc; ++s) {
        uint4 next[kUnroll];
        if (s + 1 < nSrc) {
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) {
            uint64_t v = v0 + uint64_t(u) * blockDim.x;
            if (v < nVec) next[u] = __ldcg(reinterpret_cast<const uint4*>(plan.src[s + 1]) + v);
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          T* a = reinterpret_cast<T*>(&acc[u]);
          const T* b = reinterpret_cast<const T*>(&in[u]);
#pragma unroll
          for (int e = 0; e < kElems; ++e) a[e] = red.combine(a[e], red.pre(b[e]));
          if (s + 1 < nSrc) in[u] = next[u];
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        uint64_t v = v0 + uint64_t(u) * blockDim.x;
        if (v >= nVec) continue;
        T* a = reinterpret_cast<T*>(&acc[u]);
#pragma unroll
        for (int e = 0; e < kElems; ++e) a[e] = red.post(a[e]);
        for (int d = 0; d < nDst; ++d) reinterpret_cast<uint4*>(plan.dst[d])[v] = acc[u];
      }
    }
    done = nVec * kElems;
  }
  for (uint64_t i = done + threadIdx.x; i < count; i += blockDim.x) {
    T acc = red.pre(loadCg(reinterpret_cast<const T*>(plan.src[0]) + i));
    for (int s = 1; s < nSrc; ++s)
      acc = red.combine(acc, red.pre(loadCg(reinterpret_cast<const T*>(plan.src[s]) + i)));
    acc = red.post(acc);
    for (int d = 0; d < nDst; ++d) reinterpret_cast<T*>(plan.dst[d])[i] = acc;
  }
}

// Copies count bytes from src[0] to every dst (Broadcast, AllGather, one-shot staging).
__device__ __noinline__ void copyBytes(const CopyPlan& plan) {
  const int nDst = plan.nDst;
  const uint64_t bytes = plan.count;
  uint64_t done = 0;
  if (plan.aligned) {
    const uint64_t nVec = bytes / 16;
    const uint4* src = reinterpret_cast<const uint4*>(plan.src[0]);
    const uint64_t stride = uint64_t(blockDim.x) * kUnroll;
    for (uint64_t v0 = threadIdx.x; v0 < nVec; v0 += stride) {
      uint4 val[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        uint64_t v = v0 + uint64_t(u) * blockDim.x;
        if (v < nVec) val[u] = __ldcg(src + v);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        uint64_t v = v0 + uint64_t(u) * blockDim.x;
        if (v >= nVec) continue;
        for (int d = 0; d < nDst; ++d) reinterpret_cast<uint4*>(plan.dst[d])[v] = val[u];
      }
    }
    done = nVec * 16;
  }
  for (uint64_t i = done + threadIdx.x; i < bytes; i += blockDim.x) {
    uint8_t b = loadCg(reinterpret_cast<const uint8_t*>(plan.src[0]) + i);
    for (int d = 0; d < nDst; ++d) reinterpret_cast<uint8_t*>(plan.dst[d])[i] = b;
  }
}

}  // namespace dev
}  // namespace coll
}  // namespace mkernel
