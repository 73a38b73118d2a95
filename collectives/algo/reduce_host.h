// NCCL 2.28's reduction arithmetic, element by element, on the host.
//
// This is what the CPU reference executor (tests/oracle/reference.h) computes and what the
// persistent kernel must compute bit for bit (docs/REDUCTIONS.md lists every rule and the NCCL
// source it was read from):
//   - integers wrap (sum, prod, premul-sum); Avg = wrapped sum, then divided by nRanks rounding
//     toward zero (NCCL's reciprocal-multiply division, reproduced literally);
//   - fp32/fp64 in their own precision;
//   - fp16/bf16 in their own precision: every op rounds to 16 bits (round-to-nearest-even);
//   - fp8 e4m3/e5m2 through half: each op is done in half, rounded to half, then converted back
//     to fp8 with round-to-nearest-even and saturation to the largest finite value;
//   - Avg for floating types = PreMulSum with 1/nRanks rounded to the dtype;
//   - min/max return the other operand when one is NaN.
// The software conversions below need no CUDA header.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "collectives/algo/algo.h"
#include "collectives/types.h"
#include "common/result.h"

namespace mkernel {
namespace coll {
namespace fp {

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// IEEE binary16 -> float (exact).
inline float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bitsFloat(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  float v = static_cast<float>(mant) * (1.0f / 16777216.0f);  // subnormal: mant * 2^-24
  return sign ? -v : v;
}

// float -> binary16, round to nearest even; overflow gives inf (as __float2half_rn); NaN gives
// the canonical NaN 0x7fff (as CUDA).
inline uint16_t floatToHalf(float f) {
  uint32_t x = floatBits(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return 0x7fffu;
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  if (ax >= 0x38800000u) {                       // normal half (>= 2^-14)
    uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
  }
  // Subnormal half: |f| * 2^24 is exact; rint rounds it to nearest even (default rounding mode).
  float scaled = std::fabs(f) * 16777216.0f;
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)));
}

// bfloat16 <-> float.
inline float bf16ToFloat(uint16_t b) {
  return bitsFloat(static_cast<uint32_t>(b) << 16);
}
inline uint16_t floatToBf16(float f) {
  uint32_t x = floatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;  // canonical NaN, as CUDA
  uint32_t r = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(r >> 16);
}

// fp8 (OCP): e4m3 (bias 7, no inf, 0x7f NaN, max 448) and e5m2 (bias 15, max 57344).
inline float fp8ToFloat(uint8_t v, bool e5m2) {
  if (e5m2) return halfToFloat(static_cast<uint16_t>(v) << 8);  // e5m2 is half's top byte
  uint32_t sign = v & 0x80u;
  uint32_t exp = (v >> 3) & 0xfu;
  uint32_t mant = v & 0x7u;
  float mag;
  if (exp == 0xfu && mant == 0x7u) {
    mag = std::nanf("");
  } else if (exp == 0) {
    mag = static_cast<float>(mant) * (1.0f / 512.0f);  // mant * 2^-9
  } else {
    mag = bitsFloat(((exp + 120u) << 23) | (mant << 20));
  }
  return sign ? -mag : mag;
}

// float -> fp8 with round to nearest even and __NV_SATFINITE: magnitudes above the largest finite
// value (inf included) become that value; NaN becomes NaN (e4m3 0x7f, e5m2 0x7e, sign kept).
inline uint8_t floatToFp8(float f, bool e5m2) {
  uint8_t sign = (floatBits(f) >> 24) & 0x80u;
  float a = std::fabs(f);
  if (std::isnan(a)) return static_cast<uint8_t>(sign | (e5m2 ? 0x7eu : 0x7fu));
  const int mantBits = e5m2 ? 2 : 3;
  const int minExp = e5m2 ? -14 : -6;  // exponent of the smallest normal
  const float maxNorm = e5m2 ? 57344.0f : 448.0f;
  const uint8_t maxCode = e5m2 ? 0x7bu : 0x7eu;
  if (a > maxNorm) return static_cast<uint8_t>(sign | maxCode);
  if (a == 0.0f) return sign;
  int e = std::ilogb(a);
  if (e < minExp) e = minExp;
  // Scale so that one unit is one ulp at exponent e; the scaling is exact, rint rounds to even.
  float units = std::nearbyint(std::ldexp(a, mantBits - e));
  uint32_t u = static_cast<uint32_t>(units);  // < 2^(mantBits+1), or exactly 2^(mantBits+1)
  if (u == 0) return sign;
  if (u >= (1u << (mantBits + 1))) {  // rounded up to the next binade
    u >>= 1;
    ++e;
  }
  uint32_t code;
  if (u < (1u << mantBits)) {  // subnormal (only possible at e == minExp)
    code = u;
  } else {
    code = (static_cast<uint32_t>(e - minExp + 1) << mantBits) | (u & ((1u << mantBits) - 1u));
  }
  if (code > maxCode) code = maxCode;  // cannot happen below maxNorm; kept as a guard
  return static_cast<uint8_t>(sign | code);
}

// NCCL's fp8 arithmetic goes through half: the result of the half op is rounded to half first.
inline uint8_t halfRoundedToFp8(float exactOrFloat, bool e5m2) {
  return floatToFp8(halfToFloat(floatToHalf(exactOrFloat)), e5m2);
}

}  // namespace fp

// NCCL's device reduction for (op, dtype, nRanks, scalar), as its hostToDevRedOp() builds it:
// Avg becomes PreMulSum(1/nRanks) for floating types and SumPostDiv(nRanks) for integers;
// PreMulSum takes `scalar` converted to the dtype (through float for fp16/bf16/fp8).
Result makeDevRedOp(RedOp op, DataType dtype, int nRanks, double scalar, DevRedOp* out);

// Element-wise primitives over raw host buffers of `dtype` (n elements). dst/acc may equal src/x
// (same address); partial overlap is not allowed.
void hostPreOp(const DevRedOp& op, DataType dtype, void* dst, const void* src, size_t n);
void hostReduce(const DevRedOp& op, DataType dtype, void* acc, const void* x, size_t n);
void hostPostOp(const DevRedOp& op, DataType dtype, void* acc, size_t n);

// Element i of a buffer as a double (exact for every dtype but 64-bit integers above 2^53),
// and a double stored as element i (rounded as the dtype's conversion from float/double does;
// integers are truncated and wrapped). For tests, data generators and checkers.
double loadAsDouble(DataType dtype, const void* buf, size_t i);
void storeFromDouble(DataType dtype, void* buf, size_t i, double v);

// Exact integer view of element i (sign-extended for signed types), for integer checks.
uint64_t loadAsU64(DataType dtype, const void* buf, size_t i);

inline bool isFloatType(DataType t) {
  return t == DataType::Float16 || t == DataType::Float32 || t == DataType::Float64 ||
         t == DataType::Bfloat16 || t == DataType::Fp8E4M3 || t == DataType::Fp8E5M2;
}
inline bool isSignedInt(DataType t) {
  return t == DataType::Int8 || t == DataType::Int32 || t == DataType::Int64;
}

}  // namespace coll
}  // namespace mkernel
