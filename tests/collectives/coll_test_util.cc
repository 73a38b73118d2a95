#include "coll_test_util.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "common/result.h"

namespace mkernel {
namespace coll {
namespace test {
namespace {

// Slice whose reduction order an element of the output follows (reductionPeer()'s `slice`).
int orderSliceOf(const Plan& p, int rank, size_t elem) {
  const PlanArgs& a = p.args;
  if (a.algo != Algo::Ring) return 0;
  if (a.coll == CollType::ReduceScatter) return rank;
  if (a.coll == CollType::Reduce) return a.root;
  for (int s = 0; s < a.nRanks; ++s) {  // AllReduce: the rank slice holding the element
    Slice sl = rankSlice(a.count, a.nRanks, s, p.alignElems);
    if (elem >= sl.offset && elem < sl.offset + sl.count) return s;
  }
  return 0;
}

bool receives(const Plan& p, int rank) {
  return p.args.coll != CollType::Reduce || rank == p.args.root;
}

// Input element index of output element `i` of rank `rank` (reductions: the same index in every
// rank's input; AllGather / Broadcast: the source rank and index).
size_t inputIndex(const Plan& p, int rank, size_t i) {
  return p.args.coll == CollType::ReduceScatter ? p.args.count * rank + i : i;
}

}  // namespace

Result runCase(const CaseSpec& spec, uint8_t poison, CaseRun* out) {
  CaseRun& run = *out;
  MK_CHECK(makePlan(spec.args, &run.plan));
  const Plan& p = run.plan;
  const PlanArgs& a = p.args;
  const size_t es = p.elemSize;
  const int n = a.nRanks;
  run.ranks.assign(n, RankMem{});
  run.inputs.assign(n, {});
  Rng rng(spec.seed);
  for (int r = 0; r < n; ++r) {
    RankMem& m = run.ranks[r];
    m.hasSend = a.coll != CollType::Broadcast || r == a.root;
    m.hasRecv = receives(p, r);
    const size_t sendBytes = p.sendCount() * es, recvBytes = p.recvCount() * es;
    run.inputs[r].resize(sendBytes);
    fillInput(rng, a.dtype, a.op, n, run.inputs[r].data(), p.sendCount());
    // In place, the buffers overlap as NCCL defines it; the bigger one holds the smaller.
    const bool overlap = spec.inPlace && m.hasSend && m.hasRecv;
    const size_t region = overlap ? std::max(sendBytes, recvBytes) : sendBytes + recvBytes;
    m.mem.assign(region + 2 * kGuardBytes, kGuardByte);
    std::memset(m.mem.data() + kGuardBytes, poison, region);
    if (overlap) {
      size_t inner = p.inPlaceOffset(r) * es;
      m.sendOff = kGuardBytes + (a.coll == CollType::AllGather ? inner : 0);
      m.recvOff = kGuardBytes + (a.coll == CollType::ReduceScatter ? inner : 0);
    } else {
      m.sendOff = kGuardBytes;
      m.recvOff = kGuardBytes + sendBytes;
    }
    if (m.hasSend && sendBytes)
      std::memcpy(m.mem.data() + m.sendOff, run.inputs[r].data(), sendBytes);
  }
  std::vector<RankBuffers> bufs(n);
  for (int r = 0; r < n; ++r) {
    bufs[r].send = run.ranks[r].send();
    bufs[r].recv = run.ranks[r].recv();
  }
  return runReference(p, bufs.data(), &run.stats);
}

void expectedOrdered(const CaseRun& run, int rank, std::vector<uint8_t>* out) {
  const Plan& p = run.plan;
  const PlanArgs& a = p.args;
  const size_t es = p.elemSize;
  out->clear();
  if (!receives(p, rank)) return;
  out->resize(p.recvCount() * es);
  for (size_t i = 0; i < p.recvCount(); ++i) {
    uint8_t* dst = out->data() + i * es;
    if (a.coll == CollType::AllGather) {
      int src = static_cast<int>(i / a.count);
      std::memcpy(dst, run.inputs[src].data() + (i % a.count) * es, es);
      continue;
    }
    if (a.coll == CollType::Broadcast) {
      std::memcpy(dst, run.inputs[a.root].data() + i * es, es);
      continue;
    }
    const size_t in = inputIndex(p, rank, i);
    const int slice = orderSliceOf(p, rank, i);
    for (int k = 0; k < a.nRanks; ++k) {
      const uint8_t* x = run.inputs[reductionPeer(a.algo, k, slice, a.nRanks)].data() + in * es;
      if (k == 0) {
        hostPreOp(p.redOp, a.dtype, dst, x, 1);
      } else {
        hostReduce(p.redOp, a.dtype, dst, x, 1);
      }
    }
    hostPostOp(p.redOp, a.dtype, dst, 1);
  }
}

void expectedExactInt(const CaseRun& run, int rank, std::vector<uint64_t>* out) {
  const Plan& p = run.plan;
  const PlanArgs& a = p.args;
  out->clear();
  if (!receives(p, rank)) return;
  const int bits = static_cast<int>(p.elemSize * 8);
  const uint64_t mask = bits == 64 ? ~0ull : ((1ull << bits) - 1);
  const bool sgn = isSignedInt(a.dtype);
  auto sext = [&](uint64_t v) -> int64_t {  // the value as a signed 64-bit number
    v &= mask;
    if (sgn && bits < 64 && (v >> (bits - 1))) v |= ~mask;
    return static_cast<int64_t>(v);
  };
  out->resize(p.recvCount());
  for (size_t i = 0; i < p.recvCount(); ++i) {
    if (a.coll == CollType::AllGather || a.coll == CollType::Broadcast) {
      int src = a.coll == CollType::AllGather ? static_cast<int>(i / a.count) : a.root;
      size_t idx = a.coll == CollType::AllGather ? i % a.count : i;
      (*out)[i] = loadAsU64(a.dtype, run.inputs[src].data(), idx) & mask;
      continue;
    }
    const size_t in = inputIndex(p, rank, i);
    uint64_t acc = 0;
    for (int r = 0; r < a.nRanks; ++r) {
      uint64_t x = loadAsU64(a.dtype, run.inputs[r].data(), in) & mask;
      if (a.op == RedOp::PreMulSum) x = (x * static_cast<uint64_t>(testScalar(a.dtype))) & mask;
      if (r == 0) {
        acc = x;
        continue;
      }
      switch (a.op) {
        case RedOp::Prod:
          acc = (acc * x) & mask;
          break;
        case RedOp::Min:
          acc = sgn ? (sext(x) < sext(acc) ? x : acc) : (x < acc ? x : acc);
          break;
        case RedOp::Max:
          acc = sgn ? (sext(x) > sext(acc) ? x : acc) : (x > acc ? x : acc);
          break;
        default:
          acc = (acc + x) & mask;
          break;
      }
    }
    if (a.op == RedOp::Avg) {  // the wrapped sum divided by nRanks, toward zero
      if (sgn) {
        int64_t s = sext(acc);
        uint64_t mag = s < 0 ? 0 - static_cast<uint64_t>(s) : static_cast<uint64_t>(s);
        uint64_t q = mag / static_cast<uint64_t>(a.nRanks);
        acc = (s < 0 ? 0 - q : q) & mask;
      } else {
        acc = acc / static_cast<uint64_t>(a.nRanks);
      }
    }
    (*out)[i] = acc & mask;
  }
}

void expectedF64(const CaseRun& run, int rank, std::vector<double>* out) {
  const Plan& p = run.plan;
  const PlanArgs& a = p.args;
  out->clear();
  if (!receives(p, rank)) return;
  // NCCL's Avg for floats multiplies every input by 1/nRanks rounded to the dtype.
  std::vector<uint8_t> scalarBuf(8);
  storeFromDouble(a.dtype, scalarBuf.data(), 0, 1.0 / a.nRanks);
  const double avgScale =
      a.dtype == DataType::Float64 ? 1.0 / a.nRanks : loadAsDouble(a.dtype, scalarBuf.data(), 0);
  out->resize(p.recvCount());
  for (size_t i = 0; i < p.recvCount(); ++i) {
    if (a.coll == CollType::AllGather || a.coll == CollType::Broadcast) {
      int src = a.coll == CollType::AllGather ? static_cast<int>(i / a.count) : a.root;
      size_t idx = a.coll == CollType::AllGather ? i % a.count : i;
      (*out)[i] = loadAsDouble(a.dtype, run.inputs[src].data(), idx);
      continue;
    }
    const size_t in = inputIndex(p, rank, i);
    double acc = 0.0;
    for (int r = 0; r < a.nRanks; ++r) {
      double x = loadAsDouble(a.dtype, run.inputs[r].data(), in);
      if (a.op == RedOp::PreMulSum) x *= testScalar(a.dtype);
      if (a.op == RedOp::Avg) x *= avgScale;
      if (r == 0) {
        acc = x;
      } else if (a.op == RedOp::Prod) {
        acc *= x;
      } else if (a.op == RedOp::Min) {
        acc = std::fmin(acc, x);
      } else if (a.op == RedOp::Max) {
        acc = std::fmax(acc, x);
      } else {
        acc += x;
      }
    }
    (*out)[i] = acc;
  }
}

std::string checkCase(const CaseSpec& spec, double* worstRelErr) {
  CaseRun runA, runB;
  std::ostringstream why;
  if (runCase(spec, 0xCD, &runA) != Result::Success)
    return std::string("reference failed: ") + lastError();
  if (runCase(spec, 0x3B, &runB) != Result::Success)
    return std::string("reference failed (2nd poison): ") + lastError();
  const Plan& p = runA.plan;
  const PlanArgs& a = p.args;
  const size_t es = p.elemSize;
  const std::string desc = p.describe() + (spec.inPlace ? " in-place" : " out-of-place");
  double worst = 0.0;
  for (int r = 0; r < a.nRanks; ++r) {
    RankMem& ma = runA.ranks[r];
    RankMem& mb = runB.ranks[r];
    // Guards: nothing written outside the buffers.
    for (size_t g = 0; g < kGuardBytes; ++g)
      if (ma.mem[g] != kGuardByte || ma.mem[ma.mem.size() - 1 - g] != kGuardByte)
        return desc + ": rank " + std::to_string(r) + " wrote outside its buffers";
    if (!receives(p, r)) {
      // Reduce non-root: its memory holds its input and the poison, untouched.
      size_t sendBytes = p.sendCount() * es;
      if (sendBytes != 0 &&
          std::memcmp(ma.mem.data() + ma.sendOff, runA.inputs[r].data(), sendBytes) != 0)
        return desc + ": non-root rank " + std::to_string(r) + "'s input was modified";
      for (size_t b = kGuardBytes; b < ma.mem.size() - kGuardBytes; ++b) {
        bool inSend = b >= ma.sendOff && b < ma.sendOff + sendBytes;
        if (!inSend && ma.mem[b] != 0xCD)
          return desc + ": non-root rank " + std::to_string(r) + "'s recv buffer was written";
      }
      continue;
    }
    const size_t recvBytes = p.recvCount() * es;
    const uint8_t* ga = ma.mem.data() + ma.recvOff;
    const uint8_t* gb = mb.mem.data() + mb.recvOff;
    // Every output element written: two runs poisoned differently must agree.
    if (recvBytes != 0 && std::memcmp(ga, gb, recvBytes) != 0) {
      for (size_t b = 0; b < recvBytes; ++b)
        if (ga[b] != gb[b])
          return desc + ": rank " + std::to_string(r) + " element " + std::to_string(b / es) +
                 " was never written";
    }
    // Bit for bit against NCCL's arithmetic in the documented order.
    std::vector<uint8_t> ordered;
    expectedOrdered(runA, r, &ordered);
    if (recvBytes != 0 && std::memcmp(ga, ordered.data(), recvBytes) != 0) {
      for (size_t i = 0; i < p.recvCount(); ++i)
        if (std::memcmp(ga + i * es, ordered.data() + i * es, es) != 0) {
          why << desc << ": rank " << r << " element " << i << " = " << loadAsDouble(a.dtype, ga, i)
              << ", ordered definition " << loadAsDouble(a.dtype, ordered.data(), i);
          return why.str();
        }
    }
    // Against the independent definition.
    if (!isFloatType(a.dtype)) {
      std::vector<uint64_t> exact;
      expectedExactInt(runA, r, &exact);
      const uint64_t mask = es == 8 ? ~0ull : ((1ull << (es * 8)) - 1);
      for (size_t i = 0; i < p.recvCount(); ++i)
        if ((loadAsU64(a.dtype, ga, i) & mask) != exact[i]) {
          why << desc << ": rank " << r << " element " << i << " = "
              << (loadAsU64(a.dtype, ga, i) & mask) << ", exact " << exact[i];
          return why.str();
        }
    } else {
      std::vector<double> f64;
      expectedF64(runA, r, &f64);
      std::string msg;
      double err = 0.0;
      if (!checkNormwise(a.dtype, ga, f64.data(), p.recvCount(), &msg, &err))
        return desc + ": rank " + std::to_string(r) + ": " + msg;
      worst = std::max(worst, err);
    }
  }
  if (worstRelErr) *worstRelErr = worst;
  return "";
}

}  // namespace test
}  // namespace coll
}  // namespace mkernel
