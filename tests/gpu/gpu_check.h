// Inputs, references and checks for the GPU tier.
//
// Inputs are generated from (seed, rank), so every rank thread can regenerate every peer's input
// and build the reference itself. Integers are checked bit for bit against the host reduction of
// collectives/algo/reduce_host.h (wrapping, NCCL's integer Avg); floating types against a float64
// reference with the norm-wise tolerances of docs/ALGORITHMS.md (fp64 1e-12, fp32 1e-5, fp16/bf16
// 1e-2, fp8 1e-1): ||got - ref|| / ||scale||, where the scale of a sum-like op (sum, avg,
// premulsum) is the sum over ranks of |x| per element, the standard bound of a rounded summation (a
// sum that cancels to near zero has no relative accuracy: on the H200 a one-element bf16 sum of 4
// ranks was 3% off its tiny exact value while every step rounded correctly), and |ref| otherwise.
// fp8 inputs are small integers (sums) or powers of two (products), so that rounding stays inside
// its tolerance while a wrong element still fails.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/algo/reduce_host.h"
#include "collectives/types.h"

namespace mkgpu {

using mkernel::coll::DataType;
using mkernel::coll::RedOp;

inline uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline double uniform(uint64_t& s, double lo, double hi) {
  return lo + (hi - lo) * static_cast<double>(splitmix(s) >> 11) * (1.0 / 9007199254740992.0);
}

inline bool isFp8(DataType t) {
  return t == DataType::Fp8E4M3 || t == DataType::Fp8E5M2;
}
inline bool isHalfLike(DataType t) {
  return t == DataType::Float16 || t == DataType::Bfloat16;
}

// The unit roundoff of a floating type (round to nearest: half the machine epsilon).
inline double unitRoundoff(DataType t) {
  switch (t) {
    case DataType::Float64:
      return std::ldexp(1.0, -53);
    case DataType::Float32:
      return std::ldexp(1.0, -24);
    case DataType::Float16:
      return std::ldexp(1.0, -11);
    case DataType::Bfloat16:
      return std::ldexp(1.0, -8);
    case DataType::Fp8E4M3:
      return std::ldexp(1.0, -4);
    default:
      return std::ldexp(1.0, -3);  // fp8 e5m2
  }
}

// The tolerance of docs/ALGORITHMS.md, for an algorithm that rounds at most `roundings` partial
// results on an element's way to its output (a reduction tree's internal nodes that store in the
// element type): max(the rule, (1 + u)^roundings - 1), the bound of that many roundings of relative
// error u each. The rule's 1e-2 for bf16 covers 2 roundings (u = 2^-8): the flat algorithms reduce
// every input in one pass, and round once. The hierarchical path rounds each node's partial result,
// then every step that combines nodes: N + 1 for the direct rail exchange, and N + (N - 1) for ring
// or recursive halving/doubling, as NCCL's ring rounds at each of its n - 1 hops. On one H200, bf16
// products over 8 ranks as 4 x 2 in a ring were 1.02-1.31% off, and a host simulation of the same
// order reached 2.0% (7 roundings: bound 2.8%). A missing or doubled operand moves a sum by about
// 1/8 of its scale at 8 ranks, and a product (factors in [0.75, 1.25]) by about 14% RMS over a
// case's elements: far outside.
inline double tolerance(DataType t, int roundings = 1) {
  double rule = 1e-1;
  switch (t) {
    case DataType::Float64:
      rule = 1e-12;
      break;
    case DataType::Float32:
      rule = 1e-5;
      break;
    case DataType::Float16:
    case DataType::Bfloat16:
      rule = 1e-2;
      break;
    default:
      break;
  }
  return std::max(rule, std::pow(1.0 + unitRoundoff(t), roundings) - 1.0);
}

// n elements of `t` for rank `rank` of case `seed`.
inline std::vector<uint8_t> makeInput(DataType t, RedOp op, uint64_t seed, int rank, size_t n) {
  const size_t esz = mkernel::coll::dataTypeSize(t);
  std::vector<uint8_t> buf(n * esz);
  uint64_t s = seed * 1315423911ull + static_cast<uint64_t>(rank) * 2654435761ull + 7;
  for (size_t i = 0; i < n; ++i) {
    if (!mkernel::coll::isFloatType(t)) {
      uint64_t v = splitmix(s);
      std::memcpy(&buf[i * esz], &v, esz);  // little endian: the low bytes
      continue;
    }
    double v;
    const double sign = (splitmix(s) & 1) ? -1.0 : 1.0;
    if (isFp8(t)) {
      const int range = t == DataType::Fp8E4M3 ? 2 : 1;
      if (op == RedOp::Prod)
        v = sign * ((splitmix(s) & 1) ? 2.0 : 1.0);
      else
        v = static_cast<double>(static_cast<int64_t>(splitmix(s) % (2 * range + 1)) - range);
    } else if (op == RedOp::Prod) {
      v = sign * (isHalfLike(t) ? uniform(s, 0.75, 1.25) : uniform(s, 0.5, 1.5));
    } else {
      v = uniform(s, -1.0, 1.0);
    }
    mkernel::coll::storeFromDouble(t, buf.data(), i, v);
  }
  return buf;
}

// Checks out[0..n) == reduction over ranks of in[k][offset .. offset + n) (canonical order).
// Returns "" or a description of the first problem.
inline std::string checkReduced(DataType t, RedOp op, double scalar, int nRanks,
                                const std::vector<std::vector<uint8_t>>& in, size_t offset,
                                const uint8_t* out, size_t n, int roundings = 1) {
  const size_t esz = mkernel::coll::dataTypeSize(t);
  if (!mkernel::coll::isFloatType(t)) {
    mkernel::coll::DevRedOp dop{};
    if (mkernel::coll::makeDevRedOp(op, t, nRanks, scalar, &dop) != mkernel::Result::Success)
      return "makeDevRedOp failed";
    std::vector<uint8_t> acc(n * esz), tmp(n * esz);
    mkernel::coll::hostPreOp(dop, t, acc.data(), in[0].data() + offset * esz, n);
    for (int k = 1; k < nRanks; ++k) {
      mkernel::coll::hostPreOp(dop, t, tmp.data(), in[static_cast<size_t>(k)].data() + offset * esz,
                               n);
      mkernel::coll::hostReduce(dop, t, acc.data(), tmp.data(), n);
    }
    mkernel::coll::hostPostOp(dop, t, acc.data(), n);
    for (size_t i = 0; i < n; ++i)
      if (std::memcmp(&acc[i * esz], out + i * esz, esz) != 0)
        return "element " + std::to_string(i) + ": got " +
               std::to_string(mkernel::coll::loadAsU64(t, out, i)) + " want " +
               std::to_string(mkernel::coll::loadAsU64(t, acc.data(), i));
    return "";
  }
  double errSq = 0, refSq = 0;
  size_t worst = 0;
  double worstErr = -1;
  const bool sumLike = op == RedOp::Sum || op == RedOp::Avg || op == RedOp::PreMulSum;
  for (size_t i = 0; i < n; ++i) {
    double ref = 0;
    double mag = 0;  // sum-like ops: sum over ranks of |x| (the scale of the rounding errors)
    for (int k = 0; k < nRanks; ++k) {
      double x = mkernel::coll::loadAsDouble(t, in[static_cast<size_t>(k)].data(), offset + i);
      if (op == RedOp::PreMulSum) x *= scalar;
      mag += std::fabs(x);
      if (k == 0) {
        ref = x;
        continue;
      }
      switch (op) {
        case RedOp::Prod:
          ref *= x;
          break;
        case RedOp::Max:
          ref = std::fmax(ref, x);
          break;
        case RedOp::Min:
          ref = std::fmin(ref, x);
          break;
        default:
          ref += x;
          break;
      }
    }
    if (op == RedOp::Avg) {
      ref /= nRanks;
      mag /= nRanks;
    }
    if (!sumLike) mag = std::fabs(ref);
    const double got = mkernel::coll::loadAsDouble(t, out, i);
    if (std::isnan(got)) return "element " + std::to_string(i) + " is NaN (not written?)";
    const double e = (got - ref) * (got - ref);
    errSq += e;
    refSq += mag * mag;
    if (e > worstErr) {
      worstErr = e;
      worst = i;
    }
  }
  const double rel = refSq > 0 ? std::sqrt(errSq / refSq) : std::sqrt(errSq);
  if (rel > tolerance(t, roundings))
    return "norm-wise relative error " + std::to_string(rel) + " > " +
           std::to_string(tolerance(t, roundings)) + " (worst element " + std::to_string(worst) +
           ")";
  return "";
}

}  // namespace mkgpu
