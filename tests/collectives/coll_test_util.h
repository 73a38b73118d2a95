// Helpers of the collectives tests: a portable PRNG, data generators per (dtype, op), rank
// buffers laid out as NCCL's in-place / out-of-place calls lay them out, and the straightforward
// definitions every executor result is compared with.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/algo/plan.h"
#include "collectives/algo/reduce_host.h"
#include "tests/oracle/reference.h"

namespace mkernel {
namespace coll {
namespace test {

// splitmix64: the same numbers on every platform (std distributions are not).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
};

inline bool isLowPrecision(DataType t) {
  return t == DataType::Float16 || t == DataType::Bfloat16 || t == DataType::Fp8E4M3 ||
         t == DataType::Fp8E5M2;
}
inline bool isFp8(DataType t) {
  return t == DataType::Fp8E4M3 || t == DataType::Fp8E5M2;
}

// The PreMulSum scalar the tests use: exact in every dtype.
inline double testScalar(DataType t) {
  return isFloatType(t) ? 0.5 : 3.0;
}

// Fills n elements of one rank's input with data whose exact reduction the dtype can carry to
// within the verification tolerance of docs/ALGORITHMS.md (integers: any bits, wrap-around
// included).
inline void fillInput(Rng& rng, DataType t, RedOp op, int nRanks, void* buf, size_t n) {
  const size_t es = dataTypeSize(t);
  for (size_t i = 0; i < n; ++i) {
    if (!isFloatType(t)) {
      uint64_t bits = rng.next();
      std::memcpy(static_cast<char*>(buf) + i * es, &bits, es);
      continue;
    }
    double v;
    if (op == RedOp::Prod) {
      // Low precision: signed powers of two (exact products); else values near 1.
      if (isLowPrecision(t)) {
        int k = rng.below(8);
        v = k == 0 ? 0.5 : (k == 1 ? 2.0 : 1.0);
      } else {
        v = rng.uniform(0.5, 2.0);
      }
      if (rng.below(2)) v = -v;
    } else if (op == RedOp::Min || op == RedOp::Max) {
      v = rng.uniform(-100.0, 100.0);
    } else if (isFp8(t)) {
      // {-1, 0, 1}, about two non-zero inputs per element over all ranks: partial sums stay
      // small integers, which fp8 holds exactly (e5m2 has 2 mantissa bits: 9 rounds to 8, and
      // 3 x 0.1875 to 0.5), so fp8's per-step rounding stays within its 1e-1 tolerance.
      int k = rng.below(2 * (nRanks > 2 ? nRanks : 2));
      v = k == 0 ? -1.0 : (k == 1 ? 1.0 : 0.0);
    } else if (isLowPrecision(t)) {
      v = rng.uniform(0.25, 1.0);  // positive: no cancellation in 16-bit sums
    } else {
      v = rng.uniform(-1.0, 1.0);
    }
    storeFromDouble(t, buf, i, v);
  }
}

// One simulated rank's memory: `send` and `recv` point into `mem` (in place: into the same
// region at NCCL's offsets), with guard bytes around everything to catch stray writes.
struct RankMem {
  std::vector<uint8_t> mem;
  size_t sendOff = 0, recvOff = 0;  // byte offsets into mem
  bool hasSend = false, hasRecv = false;
  const void* send() const { return hasSend ? mem.data() + sendOff : nullptr; }
  void* recv() { return hasRecv ? mem.data() + recvOff : nullptr; }
};

constexpr size_t kGuardBytes = 64;
constexpr uint8_t kGuardByte = 0xEE;

struct CaseSpec {
  PlanArgs args;
  bool inPlace = false;
  uint64_t seed = 1;
};

// What the executor produced, per rank: the recv buffer contents and the whole memory.
struct CaseRun {
  Plan plan;
  std::vector<RankMem> ranks;
  std::vector<std::vector<uint8_t>> inputs;  // each rank's input (sendCount elements)
  ReferenceStats stats;
};

// Lays out the buffers, fills inputs and poisons outputs with `poison`, runs the reference.
Result runCase(const CaseSpec& spec, uint8_t poison, CaseRun* out);

// The collective's definition, one output element at a time.
//   expectedOrdered: NCCL's arithmetic (reduce_host.h) in reductionPeer() order: the executor
//                    (and the GPU) must match it bit for bit.
//   expectedExactInt: integers computed independently in 64-bit wrapping arithmetic.
//   expectedF64:     floats computed in float64 (Avg: with 1/nRanks rounded to the dtype, as NCCL
//                    defines it for floating types).
// Each fills the expected recv buffer of rank `rank` (recvCount elements; empty when the rank
// receives nothing: Reduce non-root).
void expectedOrdered(const CaseRun& run, int rank, std::vector<uint8_t>* out);
void expectedExactInt(const CaseRun& run, int rank, std::vector<uint64_t>* out);
void expectedF64(const CaseRun& run, int rank, std::vector<double>* out);

// Checks everything about one case (both poisons, guards, definitions); "" when all is well,
// else a description of the first failure.
std::string checkCase(const CaseSpec& spec, double* worstRelErr = nullptr);

}  // namespace test
}  // namespace coll
}  // namespace mkernel
