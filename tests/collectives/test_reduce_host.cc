// collectives/algo/reduce_host.h: the software fp16/bf16/fp8 conversions and NCCL's reduction
// rules.
#include "tests/catch.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "coll_test_util.h"
#include "collectives/algo/reduce_host.h"

using namespace mkernel::coll;
using mkernel::Result;

namespace {

// The finite value of the other code nearest to v, ties to the code with an even last bit:
// brute force over all codes, independent of floatToFp8's arithmetic.
uint8_t nearestFp8(float v, bool e5m2) {
  const float maxNorm = e5m2 ? 57344.0f : 448.0f;
  if (std::fabs(v) > maxNorm)
    return static_cast<uint8_t>((v < 0 ? 0x80 : 0) | (e5m2 ? 0x7b : 0x7e));
  int best = -1;
  double bestDist = 1e300;
  for (int c = 0; c < 256; ++c) {
    float f = fp::fp8ToFloat(static_cast<uint8_t>(c), e5m2);
    if (!std::isfinite(f)) continue;
    if ((c & 0x80) != (std::signbit(v) ? 0x80 : 0)) continue;  // keep the sign (of zero too)
    double d = std::fabs(static_cast<double>(f) - v);
    if (d < bestDist || (d == bestDist && (c & 1) == 0)) {
      best = c;
      bestDist = d;
    }
  }
  return static_cast<uint8_t>(best);
}

template <typename T>
T apply(const DevRedOp& op, DataType t, std::initializer_list<T> xs) {
  T acc{};
  bool first = true;
  for (T x : xs) {
    if (first) {
      hostPreOp(op, t, &acc, &x, 1);
      first = false;
    } else {
      hostReduce(op, t, &acc, &x, 1);
    }
  }
  hostPostOp(op, t, &acc, 1);
  return acc;
}

DevRedOp opFor(RedOp op, DataType t, int nRanks = 2, double scalar = 1.0) {
  DevRedOp d{};
  REQUIRE(makeDevRedOp(op, t, nRanks, scalar, &d) == Result::Success);
  return d;
}

}  // namespace

TEST_CASE("fp16: every half converts to float and back unchanged") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = fp::halfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      CHECK(std::isnan(fp::halfToFloat(fp::floatToHalf(f))));
      continue;
    }
    REQUIRE(fp::floatToHalf(f) == h);
  }
}

#if defined(__FLT16_MAX__)
TEST_CASE("fp16: float -> half rounds as the compiler's _Float16 (round to nearest even)") {
  test::Rng rng(3);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng.next());
    // Mostly values in half's range, including subnormals and overflow.
    if (i % 2 == 0) bits = (bits & 0x807fffffu) | ((100u + (bits >> 23) % 50u) << 23);
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) continue;
    _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    INFO("float bits " << std::hex << bits);
    REQUIRE(fp::floatToHalf(f) == want);
  }
  // Midpoints between neighbours go to the even one.
  for (uint16_t h = 0; h < 0x7bff; ++h) {
    double mid = (static_cast<double>(fp::halfToFloat(h)) + fp::halfToFloat(h + 1)) / 2;
    uint16_t want = (h & 1) ? h + 1 : h;
    REQUIRE(fp::floatToHalf(static_cast<float>(mid)) == want);
  }
}
#endif

TEST_CASE("fp16 / bf16: known values, overflow and NaN") {
  CHECK(fp::floatToHalf(1.0f) == 0x3c00);
  CHECK(fp::floatToHalf(-2.0f) == 0xc000);
  CHECK(fp::floatToHalf(65504.0f) == 0x7bff);
  CHECK(fp::floatToHalf(65519.0f) == 0x7bff);
  CHECK(fp::floatToHalf(65520.0f) == 0x7c00);  // ties to even: rounds up to inf
  CHECK(fp::floatToHalf(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(fp::floatToHalf(std::ldexp(1.0f, -25)) == 0x0000);  // tie between 0 and 2^-24: even
  CHECK(fp::floatToHalf(std::ldexp(3.0f, -26)) == 0x0001);
  CHECK(fp::floatToHalf(std::nanf("")) == 0x7fff);
  CHECK(fp::floatToBf16(1.0f) == 0x3f80);
  CHECK(fp::floatToBf16(fp::bf16ToFloat(0x3f81)) == 0x3f81);
  // 1 + 2^-8 is halfway between bf16 1.0 (even) and 1.0078125: rounds to 1.0.
  CHECK(fp::floatToBf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);
  CHECK(fp::floatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);
  CHECK(fp::floatToBf16(std::numeric_limits<float>::max()) == 0x7f80);  // overflows to inf
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float f = fp::bf16ToFloat(static_cast<uint16_t>(b));
    if (!std::isnan(f)) REQUIRE(fp::floatToBf16(f) == b);
  }
}

TEST_CASE("fp8: decode, round to nearest even, saturate as __NV_SATFINITE") {
  for (bool e5m2 : {false, true}) {
    for (int c = 0; c < 256; ++c) {
      float f = fp::fp8ToFloat(static_cast<uint8_t>(c), e5m2);
      if (std::isfinite(f)) REQUIRE(fp::floatToFp8(f, e5m2) == c);
    }
    test::Rng rng(e5m2 ? 11 : 12);
    for (int i = 0; i < 20000; ++i) {
      float v = static_cast<float>(std::ldexp(rng.uniform(-1.0, 1.0), rng.below(40) - 20));
      INFO("value " << v << (e5m2 ? " e5m2" : " e4m3"));
      REQUIRE(fp::floatToFp8(v, e5m2) == nearestFp8(v, e5m2));
    }
  }
  CHECK(fp::fp8ToFloat(0x7e, false) == 448.0f);
  CHECK(std::isnan(fp::fp8ToFloat(0x7f, false)));
  CHECK(fp::fp8ToFloat(0x01, false) == std::ldexp(1.0f, -9));
  CHECK(fp::fp8ToFloat(0x7b, true) == 57344.0f);
  CHECK(std::isinf(fp::fp8ToFloat(0x7c, true)));
  CHECK(fp::floatToFp8(1000.0f, false) == 0x7e);
  CHECK(fp::floatToFp8(-1000.0f, false) == 0xfe);
  CHECK(fp::floatToFp8(std::numeric_limits<float>::infinity(), false) == 0x7e);
  CHECK(fp::floatToFp8(std::numeric_limits<float>::infinity(), true) == 0x7b);
  CHECK(fp::floatToFp8(61440.0f, true) == 0x7b);  // would be inf without saturation
  CHECK(fp::floatToFp8(464.0f, false) == 0x7e);   // tie above the max: saturates
  CHECK(fp::floatToFp8(std::nanf(""), false) == 0x7f);
}

TEST_CASE("integers: sum and prod wrap, min/max respect signedness") {
  DevRedOp sum = opFor(RedOp::Sum, DataType::Int8), prod = opFor(RedOp::Prod, DataType::Uint8);
  CHECK(apply<int8_t>(sum, DataType::Int8, {127, 1}) == -128);
  CHECK(apply<uint8_t>(prod, DataType::Uint8, {200, 2}) == 144);
  DevRedOp prod32 = opFor(RedOp::Prod, DataType::Int32);
  CHECK(apply<int32_t>(prod32, DataType::Int32, {65536, 65536}) == 0);
  CHECK(apply<int32_t>(prod32, DataType::Int32, {-2147483647 - 1, -1}) == -2147483647 - 1);
  CHECK(apply<int8_t>(opFor(RedOp::Min, DataType::Int8), DataType::Int8, {-1, 1}) == -1);
  CHECK(apply<uint8_t>(opFor(RedOp::Min, DataType::Uint8), DataType::Uint8, {255, 1}) == 1);
  CHECK(apply<int64_t>(opFor(RedOp::Max, DataType::Int64), DataType::Int64,
                       {std::numeric_limits<int64_t>::min(), -5, 3}) == 3);
  CHECK(apply<uint64_t>(opFor(RedOp::Max, DataType::Uint64), DataType::Uint64, {~0ull, 1}) ==
        ~0ull);
  DevRedOp pm = opFor(RedOp::PreMulSum, DataType::Uint32, 2, 3.0);
  CHECK(apply<uint32_t>(pm, DataType::Uint32, {0x80000000u, 1}) == 0x80000003u);
}

TEST_CASE("integer Avg: wrapped sum divided by nRanks toward zero (NCCL's reciprocal division)") {
  // Exhaustive for 8-bit sums, every divisor 1..16 and a few large ones.
  for (uint32_t div : {1u, 2u, 3u, 5u, 7u, 9u, 13u, 16u, 1000u, 65535u, 2147483647u}) {
    DevRedOp s = opFor(RedOp::Avg, DataType::Int8, static_cast<int>(div));
    DevRedOp u = opFor(RedOp::Avg, DataType::Uint8, static_cast<int>(div));
    CHECK(s.kind == DevRedOpKind::SumPostDiv);
    for (int v = -128; v < 128; ++v) {
      int8_t x = static_cast<int8_t>(v);
      hostPostOp(s, DataType::Int8, &x, 1);
      REQUIRE(x == static_cast<int8_t>(v / static_cast<int>(div)));
      uint8_t y = static_cast<uint8_t>(v + 128);
      hostPostOp(u, DataType::Uint8, &y, 1);
      REQUIRE(y == static_cast<uint8_t>((v + 128) / static_cast<int>(div)));
    }
  }
  // 32- and 64-bit: random values and the extremes, against plain division.
  test::Rng rng(5);
  for (int i = 0; i < 20000; ++i) {
    uint32_t div = 1 + static_cast<uint32_t>(rng.next() % (i % 2 ? 16 : 2147483647u));
    uint64_t bits =
        i < 8 ? (i < 4 ? (~0ull >> i) : (1ull << 63) + static_cast<uint64_t>(i - 4)) : rng.next();
    int64_t s64 = static_cast<int64_t>(bits);
    DevRedOp op = opFor(RedOp::Avg, DataType::Int64, static_cast<int>(div));
    int64_t got = s64;
    hostPostOp(op, DataType::Int64, &got, 1);
    uint64_t mag = s64 < 0 ? 0 - static_cast<uint64_t>(s64) : static_cast<uint64_t>(s64);
    int64_t want = static_cast<int64_t>(s64 < 0 ? 0 - mag / div : mag / div);
    REQUIRE(got == want);
    uint64_t ugot = bits;
    hostPostOp(opFor(RedOp::Avg, DataType::Uint64, static_cast<int>(div)), DataType::Uint64, &ugot,
               1);
    REQUIRE(ugot == bits / div);
    uint32_t u32 = static_cast<uint32_t>(bits);
    hostPostOp(opFor(RedOp::Avg, DataType::Uint32, static_cast<int>(div)), DataType::Uint32, &u32,
               1);
    REQUIRE(u32 == static_cast<uint32_t>(bits) / div);
    int32_t s32 = static_cast<int32_t>(bits);
    hostPostOp(opFor(RedOp::Avg, DataType::Int32, static_cast<int>(div)), DataType::Int32, &s32, 1);
    int64_t w32 = static_cast<int32_t>(bits);
    REQUIRE(s32 == static_cast<int32_t>(w32 / static_cast<int64_t>(div)));
  }
}

TEST_CASE("float Avg is PreMulSum with 1/nRanks rounded to the dtype, through float") {
  DevRedOp h = opFor(RedOp::Avg, DataType::Float16, 3);
  CHECK(h.kind == DevRedOpKind::PreMulSum);
  CHECK(h.scalarBits == fp::floatToHalf(static_cast<float>(1.0 / 3)));
  CHECK(h.scalarBits == 0x3555);
  DevRedOp d = opFor(RedOp::Avg, DataType::Float64, 3);
  double s;
  std::memcpy(&s, &d.scalarBits, 8);
  CHECK(s == 1.0 / 3);
  DevRedOp f8 = opFor(RedOp::Avg, DataType::Fp8E4M3, 3);
  CHECK(fp::fp8ToFloat(static_cast<uint8_t>(f8.scalarBits), false) == 0.34375f);
  // avg(x, y, z) in half = x*s + y*s + z*s, each product and sum rounded to half.
  uint16_t one = fp::floatToHalf(1.0f);
  uint16_t r = apply<uint16_t>(h, DataType::Float16, {one, one, one});
  uint16_t third = fp::floatToHalf(fp::halfToFloat(0x3555));
  uint16_t two = fp::floatToHalf(fp::halfToFloat(third) + fp::halfToFloat(third));
  CHECK(r == fp::floatToHalf(fp::halfToFloat(two) + fp::halfToFloat(third)));
}

TEST_CASE("16-bit and fp8 sums round at every step, fp8 through half") {
  // fp16: 2048 + 1 + 1 stays 2048 when each add rounds to half (ulp 2 there), 2050 in float.
  DevRedOp sum = opFor(RedOp::Sum, DataType::Float16);
  uint16_t big = fp::floatToHalf(2048.0f), one = fp::floatToHalf(1.0f);
  CHECK(fp::halfToFloat(apply<uint16_t>(sum, DataType::Float16, {big, one, one})) == 2048.0f);
  DevRedOp bsum = opFor(RedOp::Sum, DataType::Bfloat16);
  uint16_t b256 = fp::floatToBf16(256.0f), b1 = fp::floatToBf16(1.0f);
  CHECK(fp::bf16ToFloat(apply<uint16_t>(bsum, DataType::Bfloat16, {b256, b1, b1})) == 256.0f);
  // e4m3: 16 + 1 -> 17 is a tie between 16 and 18: even mantissa -> 16; fp8 saturation on sums.
  DevRedOp f8 = opFor(RedOp::Sum, DataType::Fp8E4M3);
  uint8_t e16 = fp::floatToFp8(16.0f, false), e1 = fp::floatToFp8(1.0f, false);
  CHECK(fp::fp8ToFloat(apply<uint8_t>(f8, DataType::Fp8E4M3, {e16, e1}), false) == 16.0f);
  uint8_t e448 = fp::floatToFp8(448.0f, false);
  CHECK(apply<uint8_t>(f8, DataType::Fp8E4M3, {e448, e448}) == 0x7e);
  // e5m2: 57344 + 57344 overflows half (inf), which saturates back to 57344.
  DevRedOp f5 = opFor(RedOp::Sum, DataType::Fp8E5M2);
  CHECK(apply<uint8_t>(f5, DataType::Fp8E5M2, {0x7b, 0x7b}) == 0x7b);
  // Double rounding through half: e5m2 1.25 * 1.25 = 1.5625 -> half exact -> e5m2 1.5.
  DevRedOp p5 = opFor(RedOp::Prod, DataType::Fp8E5M2);
  uint8_t e125 = fp::floatToFp8(1.25f, true);
  CHECK(fp::fp8ToFloat(apply<uint8_t>(p5, DataType::Fp8E5M2, {e125, e125}), true) == 1.5f);
}

TEST_CASE("min/max: a NaN operand yields the other one; -0 is below +0") {
  DevRedOp mn = opFor(RedOp::Min, DataType::Float32), mx = opFor(RedOp::Max, DataType::Float32);
  float nan = std::nanf("");
  CHECK(apply<float>(mn, DataType::Float32, {nan, 2.0f}) == 2.0f);
  CHECK(apply<float>(mx, DataType::Float32, {2.0f, nan, 1.0f}) == 2.0f);
  CHECK(std::signbit(apply<float>(mn, DataType::Float32, {0.0f, -0.0f})));
  CHECK_FALSE(std::signbit(apply<float>(mx, DataType::Float32, {-0.0f, 0.0f})));
  DevRedOp hmn = opFor(RedOp::Min, DataType::Float16);
  CHECK(apply<uint16_t>(hmn, DataType::Float16, {0x7e00, 0x3c00}) == 0x3c00);
  CHECK(apply<uint16_t>(hmn, DataType::Float16, {0x3c00, 0xbc00}) == 0xbc00);
  DevRedOp f8mx = opFor(RedOp::Max, DataType::Fp8E4M3);
  CHECK(apply<uint8_t>(f8mx, DataType::Fp8E4M3, {0x7f, 0x38}) == 0x38);
}

TEST_CASE("makeDevRedOp rejects what NCCL rejects") {
  DevRedOp d{};
  CHECK(makeDevRedOp(static_cast<RedOp>(9), DataType::Float32, 2, 1.0, &d) ==
        Result::InvalidArgument);
  CHECK(makeDevRedOp(RedOp::Sum, static_cast<DataType>(12), 2, 1.0, &d) == Result::InvalidArgument);
  CHECK(makeDevRedOp(RedOp::Sum, DataType::Float32, 0, 1.0, &d) == Result::InvalidArgument);
}
