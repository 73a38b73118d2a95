// The hierarchical collectives' CPU reference (tests/oracle/hierarchical_ref.h) for 2-4 nodes x
// 1-8 ranks: every collective, integer and floating dtypes, the reduction ops, counts 0 / 1 / odd,
// in and out of place, every root. Each case runs the flat reference executor (itself checked
// against the definitions in test_reference.cc) and the hierarchical one on identical memory:
// integer results, copies and min/max must be bit-identical, floating sums within the
// norm-wise tolerance of the float64 definition, and every byte outside the receive buffers
// (guards, inputs, non-root outputs) untouched.
#include "tests/catch.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/oracle/hierarchical_ref.h"
#include "tests/collectives/coll_test_util.h"

using namespace mkernel::coll;
using namespace mkernel::coll::test;
using mkernel::Result;

namespace {

bool reducing(CollType c) {
  return c == CollType::AllReduce || c == CollType::ReduceScatter || c == CollType::Reduce;
}

// Norm-wise error of a floating reduction, scaled by the sum over ranks of |input| per element
// (the bound of a rounded sum in any order; ||expected|| alone has no accuracy left when the sum
// cancels, and this layout reorders the sum). Products and min/max: scaled by |expected|.
std::string checkScaled(const CaseRun& run, int rank, const uint8_t* got,
                        const std::vector<double>& want) {
  const PlanArgs& a = run.plan.args;
  const int n = a.nRanks;
  double errSq = 0, scaleSq = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = loadAsDouble(a.dtype, got, i);
    if (g != g) return "element " + std::to_string(i) + " is NaN";
    double scale = std::fabs(want[i]);
    if (a.op == RedOp::Sum || a.op == RedOp::Avg || a.op == RedOp::PreMulSum) {
      const size_t src =
          a.coll == CollType::ReduceScatter ? static_cast<size_t>(rank) * a.count + i : i;
      scale = 0;
      for (int q = 0; q < n; ++q)
        scale += std::fabs(loadAsDouble(a.dtype, run.inputs[static_cast<size_t>(q)].data(), src));
      if (a.op == RedOp::PreMulSum) scale *= std::fabs(a.scalar);
      if (a.op == RedOp::Avg) scale /= n;
    }
    errSq += (g - want[i]) * (g - want[i]);
    scaleSq += scale * scale;
  }
  const double rel = scaleSq > 0 ? std::sqrt(errSq / scaleSq) : std::sqrt(errSq);
  if (rel > normwiseTolerance(a.dtype))
    return "scaled norm-wise error " + std::to_string(rel) + " > " +
           std::to_string(normwiseTolerance(a.dtype));
  return "";
}

// Runs one case both ways; "" or the first difference.
std::string compareCase(CollType coll, DataType dtype, RedOp op, size_t count, NodeLayout L,
                        int root, bool inPlace, uint64_t seed, uint64_t* phases) {
  CaseSpec spec;
  spec.args.coll = coll;
  spec.args.algo = coll == CollType::AllReduce ? Algo::TwoShot : Algo::Direct;
  spec.args.dtype = dtype;
  spec.args.op = op;
  spec.args.count = count;
  spec.args.nRanks = L.nRanks();
  spec.args.root = root;
  spec.args.scalar = testScalar(dtype);
  spec.inPlace = inPlace;
  spec.seed = seed;
  const uint8_t poison = 0xff;
  CaseRun flat;
  if (runCase(spec, poison, &flat) != Result::Success)
    return std::string("flat reference failed: ") + mkernel::lastError();
  const Plan& p = flat.plan;
  const size_t es = p.elemSize;
  // The same memory as runCase laid out before it ran: guards, poisoned outputs, inputs.
  std::vector<RankMem> mem(flat.ranks.size());
  std::vector<RankBuffers> bufs(flat.ranks.size());
  for (size_t r = 0; r < mem.size(); ++r) {
    mem[r] = flat.ranks[r];
    std::memset(mem[r].mem.data(), kGuardByte, mem[r].mem.size());
    std::memset(mem[r].mem.data() + kGuardBytes, poison, mem[r].mem.size() - 2 * kGuardBytes);
    if (mem[r].hasSend && !flat.inputs[r].empty())
      std::memcpy(mem[r].mem.data() + mem[r].sendOff, flat.inputs[r].data(), flat.inputs[r].size());
    bufs[r].send = mem[r].send();
    bufs[r].recv = mem[r].recv();
  }
  HierArgs h;
  h.coll = coll;
  h.dtype = dtype;
  h.op = op;
  h.count = count;
  h.layout = L;
  h.root = root;
  h.scalar = spec.args.scalar;
  ReferenceStats st;
  if (runHierarchicalReference(h, bufs.data(), &st) != Result::Success)
    return std::string("hierarchical reference failed: ") + mkernel::lastError();
  *phases = st.phases;
  const bool exact = !reducing(coll) || !isFloatType(dtype) || op == RedOp::Min || op == RedOp::Max;
  for (size_t r = 0; r < mem.size(); ++r) {
    const std::string who = "rank " + std::to_string(r) + ": ";
    if (exact) {
      if (mem[r].mem != flat.ranks[r].mem) return who + "memory differs from the flat executor's";
      continue;
    }
    // Floating reductions: the receive buffer within tolerance, every other byte identical.
    std::vector<uint8_t> a = mem[r].mem, b = flat.ranks[r].mem;
    if (mem[r].hasRecv) {
      const size_t bytes = p.recvCount() * es;
      std::vector<double> want;
      expectedF64(flat, static_cast<int>(r), &want);
      const std::string why =
          checkScaled(flat, static_cast<int>(r), a.data() + mem[r].recvOff, want);
      if (!why.empty()) return who + "receive buffer: " + why;
      std::memset(a.data() + mem[r].recvOff, 0, bytes);
      std::memset(b.data() + mem[r].recvOff, 0, bytes);
    }
    if (a != b) return who + "bytes outside the receive buffer differ from the flat executor's";
  }
  return "";
}

const NodeLayout kLayouts[] = {{2, 1}, {2, 4}, {3, 3}, {4, 2}, {2, 8}, {4, 8}};

}  // namespace

TEST_CASE("hierarchical: every collective, 2-4 nodes x 1-8 ranks, equals the flat reference") {
  const CollType colls[] = {CollType::AllReduce, CollType::ReduceScatter, CollType::AllGather,
                            CollType::Broadcast, CollType::Reduce};
  const DataType dtypes[] = {DataType::Int32,    DataType::Uint8,   DataType::Float32,
                             DataType::Bfloat16, DataType::Fp8E4M3, DataType::Float64};
  const RedOp ops[] = {RedOp::Sum, RedOp::Prod, RedOp::Max,
                       RedOp::Min, RedOp::Avg,  RedOp::PreMulSum};
  const size_t counts[] = {0, 1, 1003};
  uint64_t seed = 1;
  int cases = 0, skipped = 0;
  for (const NodeLayout& L : kLayouts) {
    for (CollType c : colls) {
      for (DataType dt : dtypes) {
        for (RedOp op : ops) {
          if (!reducing(c) && op != RedOp::Sum) continue;
          // A product of more than 8 fp8 inputs (powers of two) leaves the type's range, and where
          // it saturates depends on the reduction order: flat and hierarchical differ legitimately.
          if (op == RedOp::Prod && dt == DataType::Fp8E4M3 && L.nRanks() > 8) {
            skipped += static_cast<int>(sizeof(counts) / sizeof(counts[0])) * 2;
            continue;
          }
          for (size_t count : counts) {
            for (bool inPlace : {false, true}) {
              const int root = static_cast<int>(seed % static_cast<uint64_t>(L.nRanks()));
              uint64_t phases = 0;
              const std::string why =
                  compareCase(c, dt, op, count, L, root, inPlace, seed++, &phases);
              INFO(collName(c) << " " << dataTypeName(dt) << " " << redOpName(op) << " count "
                               << count << " " << L.nNodes << "x" << L.perNode << " root " << root
                               << (inPlace ? " in place" : ""));
              REQUIRE(why == "");
              // AllReduce has three phases, the others two; nothing moves for count 0.
              CHECK(phases == (count == 0 ? 0u : (c == CollType::AllReduce ? 3u : 2u)));
              ++cases;
            }
          }
        }
      }
    }
  }
  CHECK(cases + skipped == 6 * (3 * 6 * 6 + 2 * 6) * 3 * 2);
  CHECK(skipped == 3 * 3 * 3 * 2);  // fp8 products on the 3 layouts of more than 8 ranks
}

TEST_CASE(
    "hierarchical: the schedule checks are live: aliased receive buffers are reported as a race") {
  // Two ranks of the same rail sharing one receive buffer: both write it in the inter-node phase.
  const NodeLayout L{2, 2};
  const size_t count = 64;
  std::vector<std::vector<float>> in(4, std::vector<float>(count, 1.0f));
  std::vector<std::vector<float>> out(4, std::vector<float>(count, 0.0f));
  std::vector<RankBuffers> bufs(4);
  for (int r = 0; r < 4; ++r) {
    bufs[static_cast<size_t>(r)].send = in[static_cast<size_t>(r)].data();
    bufs[static_cast<size_t>(r)].recv = out[static_cast<size_t>(r)].data();
  }
  bufs[2].recv = out[0].data();  // rank 2 = node 1, local 0: rank 0's rail peer
  HierArgs h;
  h.coll = CollType::AllReduce;
  h.count = count;
  h.layout = L;
  CHECK(runHierarchicalReference(h, bufs.data()) == Result::InternalError);
  CHECK(std::string(mkernel::lastError()).find("race") != std::string::npos);
  // Distinct buffers: every element is the sum over the 4 ranks.
  bufs[2].recv = out[2].data();
  REQUIRE(runHierarchicalReference(h, bufs.data()) == Result::Success);
  for (int r = 0; r < 4; ++r) CHECK(out[static_cast<size_t>(r)] == std::vector<float>(count, 4.0f));
}

TEST_CASE("hierarchical: bad layouts, roots and types are InvalidArgument") {
  float buf[4] = {};
  RankBuffers b[2] = {{buf, buf}, {buf, buf}};
  HierArgs h;
  h.count = 1;
  h.layout = NodeLayout{0, 2};
  CHECK(runHierarchicalReference(h, b) == Result::InvalidArgument);
  h.layout = NodeLayout{2, 1};
  h.coll = CollType::Broadcast;
  h.root = 2;
  CHECK(runHierarchicalReference(h, b) == Result::InvalidArgument);
  CHECK(std::string(mkernel::lastError()).find("root 2") != std::string::npos);
  h.root = 0;
  h.dtype = static_cast<DataType>(42);
  CHECK(runHierarchicalReference(h, b) == Result::InvalidArgument);
  h.dtype = DataType::Float32;
  CHECK(runHierarchicalReference(h, nullptr) == Result::InvalidArgument);
}

TEST_CASE("hierarchical: the node layout of ranks on several hosts (nodeLayoutOfHosts)") {
  auto layout = [](std::vector<uint64_t> hosts, NodeLayout* out) {
    const char* why = "";
    const bool ok = nodeLayoutOfHosts(hosts.data(), static_cast<int>(hosts.size()), out, &why);
    if (!ok) CHECK(std::string(why).size() > 0);
    return ok;
  };
  NodeLayout L;
  REQUIRE(layout({7, 7, 7, 7}, &L));
  CHECK((L.nNodes == 1 && L.perNode == 4));
  REQUIRE(layout({7, 7, 9, 9}, &L));
  CHECK((L.nNodes == 2 && L.perNode == 2));
  REQUIRE(layout({7, 9}, &L));
  CHECK((L.nNodes == 2 && L.perNode == 1));
  REQUIRE(layout({1, 1, 2, 2, 3, 3}, &L));
  CHECK((L.nNodes == 3 && L.perNode == 2));
  REQUIRE(layout({5}, &L));
  CHECK((L.nNodes == 1 && L.perNode == 1));
  CHECK(!layout({7, 7, 7, 9}, &L));        // 3 + 1
  CHECK(!layout({7, 9, 7, 9}, &L));        // interleaved
  CHECK(!layout({7, 7, 9, 9, 7, 7}, &L));  // a host twice
  CHECK(!layout({7, 7, 9, 8}, &L));        // 2 + 1 + 1
}
