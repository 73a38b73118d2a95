// The CPU reference executor against the collectives' definitions: every collective x algorithm
// x dtype x op, 1..16 ranks, counts 0, 1, not divisible by the ranks or the alignment, several
// ring chunks, in-place and out-of-place (NCCL's aliasing offsets), every root, poisoned outputs.
#include "tests/catch.h"

#include <cstdio>
#include <map>
#include <vector>

#include "coll_test_util.h"
#include "common/result.h"

using namespace mkernel::coll;
using mkernel::Result;
using test::CaseSpec;

namespace {

const CollType kColls[] = {CollType::AllReduce, CollType::AllGather, CollType::ReduceScatter,
                           CollType::Broadcast, CollType::Reduce};
const RedOp kOps[] = {RedOp::Sum, RedOp::Prod, RedOp::Max,
                      RedOp::Min, RedOp::Avg,  RedOp::PreMulSum};

bool reduces(CollType c) {
  return c == CollType::AllReduce || c == CollType::ReduceScatter || c == CollType::Reduce;
}

std::vector<Algo> algosOf(CollType c) {
  std::vector<Algo> v;
  for (int a = 0; a < kNumAlgos; ++a)
    if (algoSupports(c, static_cast<Algo>(a))) v.push_back(static_cast<Algo>(a));
  return v;
}

CaseSpec makeSpec(CollType c, Algo algo, DataType t, RedOp op, size_t count, int n, int root,
                  size_t chunkBytes, bool inPlace, uint64_t seed) {
  CaseSpec s;
  s.args.coll = c;
  s.args.algo = algo;
  s.args.dtype = t;
  s.args.op = op;
  s.args.count = count;
  s.args.nRanks = n;
  s.args.root = root;
  s.args.chunkBytes = chunkBytes;
  s.args.scalar = test::testScalar(t);
  s.inPlace = inPlace;
  s.seed = seed;
  return s;
}

}  // namespace

TEST_CASE("reference: every collective x algorithm x dtype x op on 1, 2, 3, 5, 8 and 16 ranks") {
  // Worst norm-wise error seen per dtype, printed so that the margin to the tolerance is visible.
  std::map<int, double> worst;
  int cases = 0;
  uint64_t seed = 1;
  for (CollType c : kColls)
    for (Algo algo : algosOf(c))
      for (int t = 0; t < kNumDataTypes; ++t)
        for (RedOp op : kOps) {
          if (!reduces(c) && op != RedOp::Sum) continue;  // the op does not matter
          for (int n : {1, 2, 3, 5, 8, 16}) {
            // A count not divisible by n nor by the 16-byte alignment; small ring chunks so that
            // several rounds run.
            size_t count = static_cast<size_t>(7 * n + 13);
            int root = n > 1 ? static_cast<int>((seed * 7) % n) : 0;
            bool inPlace = (seed % 2) == 0;
            CaseSpec s = makeSpec(c, algo, static_cast<DataType>(t), op, count, n, root, 48,
                                  inPlace, seed++);
            double err = 0.0;
            std::string why = test::checkCase(s, &err);
            INFO(why);
            REQUIRE(why.empty());
            worst[t] = std::max(worst[t], err);
            ++cases;
          }
        }
  for (auto& kv : worst)
    std::printf("reference sweep: %-8s worst norm-wise error %.3g (tolerance %.3g)\n",
                dataTypeName(static_cast<DataType>(kv.first)), kv.second,
                normwiseTolerance(static_cast<DataType>(kv.first)));
  std::printf("reference sweep: %d cases\n", cases);
  CHECK(cases > 1000);
}

TEST_CASE("reference: every rank count 1..16, edge counts, in-place and every root") {
  int cases = 0;
  uint64_t seed = 1000;
  for (CollType c : kColls)
    for (Algo algo : algosOf(c))
      for (int n = 1; n <= 16; ++n) {
        const size_t counts[] = {0,
                                 1,
                                 static_cast<size_t>(n - 1),
                                 static_cast<size_t>(n + 1),
                                 static_cast<size_t>(4 * n),
                                 static_cast<size_t>(4 * n + 3),
                                 257};
        for (size_t count : counts)
          for (bool inPlace : {false, true}) {
            // Roots: all of them for the rooted collectives on one count, else one.
            const bool rooted = c == CollType::Broadcast || c == CollType::Reduce;
            const int nRoots = rooted && count == 257 ? n : 1;
            for (int k = 0; k < nRoots; ++k) {
              int root = rooted ? (nRoots == n ? k : static_cast<int>(seed % n)) : 0;
              DataType t = (seed % 3 == 0) ? DataType::Int32 : DataType::Float32;
              CaseSpec s = makeSpec(c, algo, t, RedOp::Sum, count, n, root, 32, inPlace, seed++);
              std::string why = test::checkCase(s);
              INFO(why);
              REQUIRE(why.empty());
              ++cases;
            }
          }
      }
  std::printf("reference edge sweep: %d cases\n", cases);
}

TEST_CASE("reference: ring chunking over many rounds and chunk sizes") {
  uint64_t seed = 5000;
  for (CollType c : kColls)
    for (size_t chunk : {16, 80, 256, 4096, 131072})
      for (int n : {2, 4, 7}) {
        CaseSpec s = makeSpec(c, Algo::Ring, DataType::Float64, RedOp::Sum, 1000 + n, n, n - 1,
                              chunk, (seed % 2) == 0, seed);
        ++seed;
        std::string why = test::checkCase(s);
        INFO(why);
        REQUIRE(why.empty());
      }
}

TEST_CASE("reference: traffic equals the cost model of algo.h") {
  for (CollType c : kColls)
    for (Algo algo : algosOf(c))
      for (int n : {1, 2, 4, 8})
        for (bool inPlace : {false, true}) {
          // Divisible counts: every slice and chunk has the same size.
          const size_t count = static_cast<size_t>(n) * 4 * 6;
          CaseSpec s =
              makeSpec(c, algo, DataType::Float32, RedOp::Sum, count, n, 0, 32, inPlace, 9);
          test::CaseRun run;
          REQUIRE(test::runCase(s, 0xCD, &run) == Result::Success);
          const double bytes = static_cast<double>(count * 4);
          const double model = minDeviceBytesPerRank(c, algo, n, bytes, inPlace) * n;
          INFO(run.plan.describe()
               << (inPlace ? " in-place" : "") << ": read " << run.stats.bytesRead << " + written "
               << run.stats.bytesWritten << ", model " << model);
          CHECK(static_cast<double>(run.stats.bytesRead + run.stats.bytesWritten) == Approx(model));
        }
}

TEST_CASE("reference: rejects invalid plans and missing buffers with a message") {
  Plan p;
  PlanArgs a;
  a.coll = CollType::Broadcast;
  a.algo = Algo::OneShot;
  CHECK(makePlan(a, &p) == Result::InvalidArgument);
  CHECK(std::string(mkernel::lastError()).find("does not implement") != std::string::npos);
  a.algo = Algo::Direct;
  a.nRanks = 4;
  a.root = 4;
  CHECK(makePlan(a, &p) == Result::InvalidArgument);
  a.root = 0;
  a.nRanks = 0;
  CHECK(makePlan(a, &p) == Result::InvalidArgument);
  a.nRanks = 2;
  a.chunkBytes = 0;
  CHECK(makePlan(a, &p) == Result::InvalidArgument);
  a.chunkBytes = 64;
  a.count = 8;
  REQUIRE(makePlan(a, &p) == Result::Success);
  float data[8] = {};
  RankBuffers bufs[2];
  bufs[0].send = data;  // root 0 has a send buffer but no recv buffer
  CHECK(runReference(p, bufs, nullptr) == Result::InvalidArgument);
  CHECK(std::string(mkernel::lastError()).find("rank 0") != std::string::npos);
}

TEST_CASE("reference: buffers aliased across ranks would race, and the tracker says so") {
  // The executor stages in-place one-shot inputs (send == recv on one rank); an aliasing it
  // cannot see (rank 1's recv is rank 0's send) makes rank 1 overwrite what rank 0 reads in the
  // same phase: the race detector must refuse it.
  PlanArgs a;
  a.coll = CollType::AllReduce;
  a.algo = Algo::OneShot;
  a.count = 64;
  a.nRanks = 2;
  Plan p;
  REQUIRE(makePlan(a, &p) == Result::Success);
  std::vector<float> mem(64 * 3, 1.0f);
  RankBuffers bufs[2];
  bufs[0].send = mem.data();
  bufs[0].recv = mem.data() + 64;
  bufs[1].send = mem.data() + 128;
  bufs[1].recv = mem.data();  // rank 1's result lands on rank 0's input while rank 0 reads it
  CHECK(runReference(p, bufs, nullptr) == Result::InternalError);
  CHECK(std::string(mkernel::lastError()).find("race") != std::string::npos);
}
