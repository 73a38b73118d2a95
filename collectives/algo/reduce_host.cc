// NCCL 2.28's reduction arithmetic on the host (see reduce_host.h and docs/REDUCTIONS.md).
#include "collectives/algo/reduce_host.h"

#include <limits>
#include <type_traits>

namespace mkernel {
namespace coll {
namespace {

// min/max with NCCL's float semantics (fminf/fmaxf, __hmin/__hmax): a NaN operand yields the
// other operand; -0 is taken as smaller than +0 (the hardware min/max instructions do so).
template <typename F>
F floatMin(F a, F b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  if (a == b) return std::signbit(a) ? a : b;
  return a < b ? a : b;
}
template <typename F>
F floatMax(F a, F b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  if (a == b) return std::signbit(a) ? b : a;
  return a > b ? a : b;
}

// min/max of two encoded values through their float values: returns one operand unchanged
// (min/max never round); both NaN: the first.
template <typename S, typename ToFloat>
S pickMinMax(S a, S b, bool isMin, ToFloat f) {
  float fa = f(a), fb = f(b);
  float r = isMin ? floatMin(fa, fb) : floatMax(fa, fb);
  if (std::isnan(r)) return a;
  return (r == fa && std::signbit(r) == std::signbit(fa)) ? a : b;
}

// ---- per-dtype arithmetic: Storage, add, mul, min, max, and the scalar in storage form ---------

template <typename T>
struct IntArith {
  using Storage = T;
  using U = std::make_unsigned_t<T>;
  // Wrap-around as the GPU does (computed unsigned: signed overflow is UB in C++).
  static T add(T a, T b) {
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  }
  static T mul(T a, T b) {
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  }
  static T min(T a, T b) { return b < a ? b : a; }
  static T max(T a, T b) { return a < b ? b : a; }
};

template <typename F>
struct FloatArith {
  using Storage = F;
  static F add(F a, F b) { return a + b; }
  static F mul(F a, F b) { return a * b; }
  static F min(F a, F b) { return floatMin(a, b); }
  static F max(F a, F b) { return floatMax(a, b); }
};

// fp16 / bf16: the exact float result rounded once to 16 bits equals the 16-bit op's result
// (float has 24 >= 2*11+2 significand bits, so the double rounding is innocuous).
struct HalfArith {
  using Storage = uint16_t;
  static float f(uint16_t v) { return fp::halfToFloat(v); }
  static uint16_t add(uint16_t a, uint16_t b) { return fp::floatToHalf(f(a) + f(b)); }
  static uint16_t mul(uint16_t a, uint16_t b) { return fp::floatToHalf(f(a) * f(b)); }
  static uint16_t min(uint16_t a, uint16_t b) { return pickMinMax(a, b, true, f); }
  static uint16_t max(uint16_t a, uint16_t b) { return pickMinMax(a, b, false, f); }
};

struct Bf16Arith {
  using Storage = uint16_t;
  static float f(uint16_t v) { return fp::bf16ToFloat(v); }
  static uint16_t add(uint16_t a, uint16_t b) { return fp::floatToBf16(f(a) + f(b)); }
  static uint16_t mul(uint16_t a, uint16_t b) { return fp::floatToBf16(f(a) * f(b)); }
  static uint16_t min(uint16_t a, uint16_t b) { return pickMinMax(a, b, true, f); }
  static uint16_t max(uint16_t a, uint16_t b) { return pickMinMax(a, b, false, f); }
};

// fp8 through half (NCCL, sm_90): op in half (sum and product of two fp8 values are exact in
// float), rounded to half, then to fp8 with saturation to the largest finite value.
template <bool E5M2>
struct Fp8Arith {
  using Storage = uint8_t;
  static float f(uint8_t v) { return fp::fp8ToFloat(v, E5M2); }
  static uint8_t add(uint8_t a, uint8_t b) { return fp::halfRoundedToFp8(f(a) + f(b), E5M2); }
  static uint8_t mul(uint8_t a, uint8_t b) { return fp::halfRoundedToFp8(f(a) * f(b), E5M2); }
  // The result goes back through half -> fp8 with saturation too, so an infinite operand comes
  // out as the largest finite value (__nv_fp8_e5m2(__hmin(...)); seen on the H200).
  static uint8_t satInf(uint8_t v) {
    return std::isinf(f(v)) ? fp::halfRoundedToFp8(f(v), E5M2) : v;
  }
  static uint8_t min(uint8_t a, uint8_t b) { return satInf(pickMinMax(a, b, true, f)); }
  static uint8_t max(uint8_t a, uint8_t b) { return satInf(pickMinMax(a, b, false, f)); }
};

template <typename S>
S scalarFromBits(uint64_t bits) {
  S s;
  std::memcpy(&s, &bits, sizeof(S));  // little-endian: the low bytes
  return s;
}

// NCCL's FuncSumPostDiv: |x| times a reciprocal of the divisor, one correction step, sign back.
template <typename T>
T postDivide(T x, uint32_t divisor, bool isSigned) {
  using U = std::make_unsigned_t<T>;
  using Wide = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
  U ux = static_cast<U>(x);
  bool neg = isSigned && (ux >> (sizeof(T) * 8 - 1)) != 0;
  Wide xabs = neg ? static_cast<U>(-ux) : ux;
  Wide recip = static_cast<Wide>(~Wide(0)) / divisor;
  Wide q;
  if (sizeof(Wide) == 8) {
    q = static_cast<Wide>((static_cast<unsigned __int128>(xabs) * recip) >> 64);
  } else {
    q = static_cast<Wide>((static_cast<uint64_t>(xabs) * recip) >> 32);
  }
  if (xabs - q * divisor >= divisor) q += 1;
  U uq = static_cast<U>(q);
  return static_cast<T>(neg ? static_cast<U>(-uq) : uq);
}

template <typename A>
typename A::Storage preOne(const DevRedOp& op, typename A::Storage x) {
  if (op.kind != DevRedOpKind::PreMulSum) return x;
  return A::mul(x, scalarFromBits<typename A::Storage>(op.scalarBits));
}

template <typename A>
typename A::Storage reduceOne(const DevRedOp& op, typename A::Storage a, typename A::Storage b) {
  switch (op.kind) {
    case DevRedOpKind::Prod:
      return A::mul(a, b);
    case DevRedOpKind::Min:
      return A::min(a, b);
    case DevRedOpKind::Max:
      return A::max(a, b);
    default:
      return A::add(a, b);  // Sum, PreMulSum, SumPostDiv
  }
}

template <typename A>
void preOpT(const DevRedOp& op, void* dst, const void* src, size_t n) {
  using S = typename A::Storage;
  for (size_t i = 0; i < n; ++i) {
    S x;
    std::memcpy(&x, static_cast<const char*>(src) + i * sizeof(S), sizeof(S));
    x = preOne<A>(op, x);
    std::memcpy(static_cast<char*>(dst) + i * sizeof(S), &x, sizeof(S));
  }
}

template <typename A>
void reduceT(const DevRedOp& op, void* acc, const void* xs, size_t n) {
  using S = typename A::Storage;
  for (size_t i = 0; i < n; ++i) {
    S a, x;
    std::memcpy(&a, static_cast<const char*>(acc) + i * sizeof(S), sizeof(S));
    std::memcpy(&x, static_cast<const char*>(xs) + i * sizeof(S), sizeof(S));
    a = reduceOne<A>(op, a, preOne<A>(op, x));
    std::memcpy(static_cast<char*>(acc) + i * sizeof(S), &a, sizeof(S));
  }
}

template <typename T>
void postDivT(const DevRedOp& op, void* acc, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    T a;
    std::memcpy(&a, static_cast<const char*>(acc) + i * sizeof(T), sizeof(T));
    a = postDivide<T>(a, op.divisor, op.isSigned != 0);
    std::memcpy(static_cast<char*>(acc) + i * sizeof(T), &a, sizeof(T));
  }
}

// Calls fn.template operator()<Arith>() for the dtype's arithmetic.
template <typename Fn>
void dispatch(DataType t, Fn&& fn) {
  switch (t) {
    case DataType::Int8:
      fn(IntArith<int8_t>());
      break;
    case DataType::Uint8:
      fn(IntArith<uint8_t>());
      break;
    case DataType::Int32:
      fn(IntArith<int32_t>());
      break;
    case DataType::Uint32:
      fn(IntArith<uint32_t>());
      break;
    case DataType::Int64:
      fn(IntArith<int64_t>());
      break;
    case DataType::Uint64:
      fn(IntArith<uint64_t>());
      break;
    case DataType::Float16:
      fn(HalfArith());
      break;
    case DataType::Float32:
      fn(FloatArith<float>());
      break;
    case DataType::Float64:
      fn(FloatArith<double>());
      break;
    case DataType::Bfloat16:
      fn(Bf16Arith());
      break;
    case DataType::Fp8E4M3:
      fn(Fp8Arith<false>());
      break;
    case DataType::Fp8E5M2:
      fn(Fp8Arith<true>());
      break;
  }
}

// The scalar of PreMulSum in the dtype's encoding (NCCL converts 1/nRanks through float).
uint64_t scalarBitsFor(DataType t, double v) {
  uint64_t bits = 0;
  auto put = [&bits](auto s) { std::memcpy(&bits, &s, sizeof(s)); };
  float f = static_cast<float>(v);
  switch (t) {
    case DataType::Int8:
      put(static_cast<int8_t>(static_cast<int64_t>(v)));
      break;
    case DataType::Uint8:
      put(static_cast<uint8_t>(static_cast<int64_t>(v)));
      break;
    case DataType::Int32:
      put(static_cast<int32_t>(static_cast<int64_t>(v)));
      break;
    case DataType::Uint32:
      put(static_cast<uint32_t>(static_cast<int64_t>(v)));
      break;
    case DataType::Int64:
      put(static_cast<int64_t>(v));
      break;
    case DataType::Uint64:
      put(v >= 0 ? static_cast<uint64_t>(v) : static_cast<uint64_t>(static_cast<int64_t>(v)));
      break;
    case DataType::Float16:
      put(fp::floatToHalf(f));
      break;
    case DataType::Float32:
      put(f);
      break;
    case DataType::Float64:
      put(v);
      break;
    case DataType::Bfloat16:
      put(fp::floatToBf16(f));
      break;
    case DataType::Fp8E4M3:
      put(fp::floatToFp8(f, false));
      break;
    case DataType::Fp8E5M2:
      put(fp::floatToFp8(f, true));
      break;
  }
  return bits;
}

bool validDataType(DataType t) {
  return static_cast<int>(t) >= 0 && static_cast<int>(t) < kNumDataTypes;
}

}  // namespace

Result makeDevRedOp(RedOp op, DataType dtype, int nRanks, double scalar, DevRedOp* out) {
  if (!validDataType(dtype))
    return MK_ERROR(Result::InvalidArgument, "invalid datatype %d", static_cast<int>(dtype));
  if (nRanks < 1) return MK_ERROR(Result::InvalidArgument, "invalid nRanks %d", nRanks);
  DevRedOp d{};
  switch (op) {
    case RedOp::Sum:
      d.kind = DevRedOpKind::Sum;
      break;
    case RedOp::Prod:
      d.kind = DevRedOpKind::Prod;
      break;
    case RedOp::Min:
      d.kind = DevRedOpKind::Min;
      break;
    case RedOp::Max:
      d.kind = DevRedOpKind::Max;
      break;
    case RedOp::PreMulSum:
      d.kind = DevRedOpKind::PreMulSum;
      d.scalarBits = scalarBitsFor(dtype, scalar);
      break;
    case RedOp::Avg:
      if (isFloatType(dtype)) {
        d.kind = DevRedOpKind::PreMulSum;
        // fp64 keeps 1/nRanks in double; every other type gets float(1/nRanks) converted.
        d.scalarBits = scalarBitsFor(dtype, 1.0 / nRanks);
      } else {
        d.kind = DevRedOpKind::SumPostDiv;
        d.divisor = static_cast<uint32_t>(nRanks);
        d.isSigned = isSignedInt(dtype) ? 1u : 0u;
      }
      break;
    default:
      return MK_ERROR(Result::InvalidArgument, "invalid reduction op %d", static_cast<int>(op));
  }
  *out = d;
  return Result::Success;
}

void hostPreOp(const DevRedOp& op, DataType dtype, void* dst, const void* src, size_t n) {
  dispatch(dtype, [&](auto arith) { preOpT<decltype(arith)>(op, dst, src, n); });
}

void hostReduce(const DevRedOp& op, DataType dtype, void* acc, const void* x, size_t n) {
  dispatch(dtype, [&](auto arith) { reduceT<decltype(arith)>(op, acc, x, n); });
}

void hostPostOp(const DevRedOp& op, DataType dtype, void* acc, size_t n) {
  if (op.kind != DevRedOpKind::SumPostDiv) return;
  switch (dtype) {
    case DataType::Int8:
      postDivT<int8_t>(op, acc, n);
      break;
    case DataType::Uint8:
      postDivT<uint8_t>(op, acc, n);
      break;
    case DataType::Int32:
      postDivT<int32_t>(op, acc, n);
      break;
    case DataType::Uint32:
      postDivT<uint32_t>(op, acc, n);
      break;
    case DataType::Int64:
      postDivT<int64_t>(op, acc, n);
      break;
    case DataType::Uint64:
      postDivT<uint64_t>(op, acc, n);
      break;
    default:
      break;  // makeDevRedOp never builds SumPostDiv for floating types
  }
}

namespace {
template <typename T>
T loadT(const void* buf, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(buf) + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void storeT(void* buf, size_t i, T v) {
  std::memcpy(static_cast<char*>(buf) + i * sizeof(T), &v, sizeof(T));
}
// double -> integer by truncation, wrapping out-of-range values (via int64/uint64).
template <typename T>
T wrapFromDouble(double v) {
  if (v >= 0) return static_cast<T>(static_cast<uint64_t>(v));
  return static_cast<T>(static_cast<uint64_t>(static_cast<int64_t>(v)));
}
}  // namespace

double loadAsDouble(DataType t, const void* buf, size_t i) {
  switch (t) {
    case DataType::Int8:
      return loadT<int8_t>(buf, i);
    case DataType::Uint8:
      return loadT<uint8_t>(buf, i);
    case DataType::Int32:
      return loadT<int32_t>(buf, i);
    case DataType::Uint32:
      return loadT<uint32_t>(buf, i);
    case DataType::Int64:
      return static_cast<double>(loadT<int64_t>(buf, i));
    case DataType::Uint64:
      return static_cast<double>(loadT<uint64_t>(buf, i));
    case DataType::Float16:
      return fp::halfToFloat(loadT<uint16_t>(buf, i));
    case DataType::Float32:
      return loadT<float>(buf, i);
    case DataType::Float64:
      return loadT<double>(buf, i);
    case DataType::Bfloat16:
      return fp::bf16ToFloat(loadT<uint16_t>(buf, i));
    case DataType::Fp8E4M3:
      return fp::fp8ToFloat(loadT<uint8_t>(buf, i), false);
    case DataType::Fp8E5M2:
      return fp::fp8ToFloat(loadT<uint8_t>(buf, i), true);
  }
  return 0.0;
}

void storeFromDouble(DataType t, void* buf, size_t i, double v) {
  switch (t) {
    case DataType::Int8:
      storeT(buf, i, wrapFromDouble<int8_t>(v));
      break;
    case DataType::Uint8:
      storeT(buf, i, wrapFromDouble<uint8_t>(v));
      break;
    case DataType::Int32:
      storeT(buf, i, wrapFromDouble<int32_t>(v));
      break;
    case DataType::Uint32:
      storeT(buf, i, wrapFromDouble<uint32_t>(v));
      break;
    case DataType::Int64:
      storeT(buf, i, wrapFromDouble<int64_t>(v));
      break;
    case DataType::Uint64:
      storeT(buf, i, wrapFromDouble<uint64_t>(v));
      break;
    case DataType::Float16:
      storeT(buf, i, fp::floatToHalf(static_cast<float>(v)));
      break;
    case DataType::Float32:
      storeT(buf, i, static_cast<float>(v));
      break;
    case DataType::Float64:
      storeT(buf, i, v);
      break;
    case DataType::Bfloat16:
      storeT(buf, i, fp::floatToBf16(static_cast<float>(v)));
      break;
    case DataType::Fp8E4M3:
      storeT(buf, i, fp::floatToFp8(static_cast<float>(v), false));
      break;
    case DataType::Fp8E5M2:
      storeT(buf, i, fp::floatToFp8(static_cast<float>(v), true));
      break;
  }
}

uint64_t loadAsU64(DataType t, const void* buf, size_t i) {
  switch (t) {
    case DataType::Int8:
      return static_cast<uint64_t>(static_cast<int64_t>(loadT<int8_t>(buf, i)));
    case DataType::Uint8:
      return loadT<uint8_t>(buf, i);
    case DataType::Int32:
      return static_cast<uint64_t>(static_cast<int64_t>(loadT<int32_t>(buf, i)));
    case DataType::Uint32:
      return loadT<uint32_t>(buf, i);
    case DataType::Int64:
      return static_cast<uint64_t>(loadT<int64_t>(buf, i));
    case DataType::Uint64:
      return loadT<uint64_t>(buf, i);
    default:
      return 0;
  }
}

}  // namespace coll
}  // namespace mkernel
