// collectives/tuner_policy: the decisions per system and size class, the invariants over every
// collective x size x table, and the MKERNEL_TUNER_CONFIG rules.
#include "tests/catch.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "collectives/tuner_policy.h"

using namespace mkernel::coll;
using mkernel::Result;

namespace {

constexpr int kA = kTunerNumAlgos, kP = kTunerNumProtos;

struct Table {
  float v[kA * kP];
  Table() {
    // NCCL-like: everything usable except CollNet (no SHARP) and NVLS (multicast off).
    for (int a = 0; a < kA; ++a)
      for (int p = 0; p < kP; ++p) v[a * kP + p] = 10.0f + a + 0.5f * p;
    for (int p = 0; p < kP; ++p)
      v[kAlgoCollnetDirect * kP + p] = v[kAlgoCollnetChain * kP + p] = -1.0f;
  }
  void disable(int a, int p) { v[a * kP + p] = -1.0f; }
};

struct Pick {
  int algo, proto;
  bool operator==(const Pick& o) const { return algo == o.algo && proto == o.proto; }
};

Pick decide(const TunerSystem& s, CollType c, size_t bytes, Table t = Table(),
            const std::vector<TunerRule>& rules = {}, int* channels = nullptr) {
  int ch = 0;
  TunerDecision d = applyTunerPolicy(s, rules, static_cast<int>(c), bytes, t.v, kA, kP,
                                     channels ? channels : &ch);
  return {d.algo, d.proto};
}

TunerSystem system(int nRanks, int nNodes, bool nvlink, bool nvswitch) {
  TunerSystem s;
  s.nRanks = nRanks;
  s.nNodes = nNodes;
  s.ranksPerNode = (nRanks + nNodes - 1) / nNodes;
  s.topologyKnown = true;
  s.nvlink = nvlink;
  s.nvswitch = nvswitch;
  return s;
}

const size_t KiB = 1024, MiB = 1024 * 1024, GiB = 1024 * MiB;

}  // namespace

TEST_CASE("policy: one NVSwitch node (DGX-H100, 8 ranks)") {
  TunerSystem s = system(8, 1, true, true);
  CHECK(decide(s, CollType::AllReduce, 1 * KiB) == Pick{kAlgoRing, kProtoLL});
  CHECK(decide(s, CollType::AllReduce, 2 * MiB) == Pick{kAlgoRing, kProtoLL});
  CHECK(decide(s, CollType::AllReduce, 2 * MiB + 1) == Pick{kAlgoRing, kProtoLL128});
  CHECK(decide(s, CollType::AllReduce, 8 * MiB) == Pick{kAlgoRing, kProtoLL128});
  CHECK(decide(s, CollType::AllReduce, 8 * MiB + 1) == Pick{kAlgoRing, kProtoSimple});
  CHECK(decide(s, CollType::AllReduce, 256 * MiB) == Pick{kAlgoRing, kProtoSimple});
  CHECK(decide(s, CollType::AllGather, 1 * MiB) == Pick{kAlgoRing, kProtoLL});
  CHECK(decide(s, CollType::AllGather, 4 * MiB) == Pick{kAlgoRing, kProtoLL128});
  CHECK(decide(s, CollType::Broadcast, 8) == Pick{kAlgoRing, kProtoLL});
  // NVLS only when asked for, and only where NCCL offers it.
  Table withNvls;
  for (int p = 0; p < kP; ++p) withNvls.v[kAlgoNvls * kP + p] = 5.0f;
  CHECK(decide(s, CollType::AllReduce, 256 * MiB, withNvls) == Pick{kAlgoRing, kProtoSimple});
  s.nvlsAllowed = true;
  CHECK(decide(s, CollType::AllReduce, 256 * MiB, withNvls) == Pick{kAlgoNvls, kProtoSimple});
  CHECK(decide(s, CollType::AllReduce, 256 * MiB, Table()) ==
        Pick{kAlgoNvls, kProtoSimple});  // 10+4 usable
  Table nvlsOff;
  for (int p = 0; p < kP; ++p) nvlsOff.disable(kAlgoNvls, p);
  CHECK(decide(s, CollType::AllReduce, 256 * MiB, nvlsOff) == Pick{kAlgoRing, kProtoSimple});
  CHECK(decide(s, CollType::AllReduce, 4 * KiB, withNvls) ==
        Pick{kAlgoRing, kProtoLL});  // small: no NVLS
}

TEST_CASE("policy: PCIe-only node prefers SIMPLE above the LL range") {
  TunerSystem s = system(4, 1, false, false);
  CHECK(decide(s, CollType::AllReduce, 4 * KiB) == Pick{kAlgoRing, kProtoLL});
  CHECK(decide(s, CollType::AllReduce, 512 * KiB) == Pick{kAlgoRing, kProtoSimple});
  CHECK(decide(s, CollType::ReduceScatter, 64 * MiB) == Pick{kAlgoRing, kProtoSimple});
  CHECK(tunerSizeClass(s, 512 * KiB) == SizeClass::Medium);
  CHECK(tunerSizeClass(s, 2 * MiB) == SizeClass::Large);
}

TEST_CASE("policy: across nodes, TREE for latency, RING for bandwidth, PAT for one GPU per node") {
  TunerSystem s = system(16, 2, true, true);
  CHECK(decide(s, CollType::AllReduce, 4 * KiB) == Pick{kAlgoTree, kProtoLL});
  CHECK(decide(s, CollType::AllReduce, 4 * MiB) == Pick{kAlgoTree, kProtoLL128});
  CHECK(decide(s, CollType::AllReduce, 1 * GiB) == Pick{kAlgoRing, kProtoSimple});
  CHECK(decide(s, CollType::AllGather, 4 * KiB) ==
        Pick{kAlgoRing, kProtoLL});  // 8 per node: no PAT
  Table noTree;
  for (int p = 0; p < kP; ++p) noTree.disable(kAlgoTree, p);
  CHECK(decide(s, CollType::AllReduce, 4 * KiB, noTree) == Pick{kAlgoRing, kProtoLL});
  Table noLL128;
  for (int a = 0; a < kA; ++a) noLL128.disable(a, kProtoLL128);
  CHECK(decide(s, CollType::AllReduce, 4 * MiB, noLL128) == Pick{kAlgoTree, kProtoSimple});

  // 2 or 3 nodes of one GPU: a tree takes as many steps as the ring, which keeps NCCL's own
  // preference (RING first); from 4 nodes of one GPU the tree is shorter (2 < 3 hops).
  TunerSystem two = system(2, 2, false, false);
  CHECK(decide(two, CollType::AllReduce, 4 * KiB) == Pick{kAlgoRing, kProtoLL});
  CHECK(decide(two, CollType::AllReduce, 1 * GiB) == Pick{kAlgoRing, kProtoSimple});
  CHECK(decide(system(3, 3, false, false), CollType::AllReduce, 4 * KiB) ==
        Pick{kAlgoRing, kProtoLL});
  CHECK(decide(system(4, 4, false, false), CollType::AllReduce, 4 * KiB) ==
        Pick{kAlgoTree, kProtoLL});
  CHECK(decide(system(4, 2, false, false), CollType::AllReduce, 4 * KiB) ==
        Pick{kAlgoTree, kProtoLL});  // 1+1 < 3

  TunerSystem one = system(4, 4, false, false);  // one GPU per node
  CHECK(decide(one, CollType::AllGather, 64 * KiB) == Pick{kAlgoPat, kProtoSimple});
  CHECK(decide(one, CollType::ReduceScatter, 512 * KiB) == Pick{kAlgoPat, kProtoSimple});
  CHECK(decide(one, CollType::AllGather, 1 * GiB) == Pick{kAlgoRing, kProtoSimple});
  Table noPat;
  for (int p = 0; p < kP; ++p) noPat.disable(kAlgoPat, p);
  CHECK(decide(one, CollType::AllGather, 64 * KiB, noPat) == Pick{kAlgoRing, kProtoLL});
}

TEST_CASE("policy invariants: every collective x 1 B..4 GiB x system x table") {
  std::vector<TunerSystem> systems = {system(8, 1, true, true),   system(4, 1, true, false),
                                      system(4, 1, false, false), system(16, 2, true, true),
                                      system(4, 4, false, false), system(64, 8, true, true)};
  systems[0].nvlsAllowed = systems[3].nvlsAllowed = true;
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> cost(0.5f, 1e4f);
  int decisions = 0;
  for (const TunerSystem& s : systems)
    for (int coll = 0; coll < 11; ++coll)
      for (size_t bytes = 1; bytes <= 4 * GiB; bytes = bytes * 2 + (bytes % 3)) {
        for (int variant = 0; variant < 4; ++variant) {
          float in[kA * kP];
          for (float& v : in) v = (rng() % 4 == 0) ? -1.0f : cost(rng);
          if (variant == 3)
            for (float& v : in) v = -1.0f;
          float out[kA * kP];
          std::memcpy(out, in, sizeof(in));
          int ch = 0;
          TunerDecision d = applyTunerPolicy(s, {}, coll, bytes, out, kA, kP, &ch);
          CHECK(ch == 0);
          int changed = 0;
          for (int i = 0; i < kA * kP; ++i) {
            REQUIRE_FALSE(std::isnan(out[i]));
            if (in[i] < 0) REQUIRE(out[i] == in[i]);  // never enables what NCCL excluded
            if (out[i] != in[i]) {
              ++changed;
              REQUIRE(out[i] == 0.0f);
              REQUIRE(i == d.algo * kP + d.proto);
            }
          }
          REQUIRE(changed <= 1);
          if (coll >= kNumCollTypes || variant == 3) REQUIRE(changed == 0);
          if (changed == 1) {
            ++decisions;
            if (!s.nvlsAllowed) REQUIRE((d.algo != kAlgoNvls && d.algo != kAlgoNvlsTree));
            REQUIRE((d.algo != kAlgoCollnetDirect && d.algo != kAlgoCollnetChain));
          }
        }
      }
  CHECK(decisions > 1000);
}

TEST_CASE("policy: unknown table shapes and collectives leave everything untouched") {
  TunerSystem s = system(8, 1, true, true);
  Table t;
  Table orig = t;
  int ch = 0;
  CHECK_FALSE(applyTunerPolicy(s, {}, 4, 1024, t.v, kA, 4, &ch).changed);
  CHECK_FALSE(applyTunerPolicy(s, {}, 4, 1024, t.v, 9, kP, &ch).changed);
  CHECK_FALSE(applyTunerPolicy(s, {}, 4, 1024, nullptr, kA, kP, &ch).changed);
  CHECK_FALSE(applyTunerPolicy(s, {}, 7, 1024, t.v, kA, kP, &ch).changed);
  CHECK(std::memcmp(t.v, orig.v, sizeof(t.v)) == 0);
  // A table with fewer algorithms (older NCCL): rows beyond numAlgo are never touched.
  Table small;
  TunerDecision d = applyTunerPolicy(s, {}, 4, 4 * MiB, small.v, 2, kP, &ch);
  CHECK(d.algo == kAlgoRing);
  CHECK(d.proto == kProtoLL128);
}

TEST_CASE("rules: parsing, suffixes, errors") {
  std::vector<TunerRule> rules;
  std::vector<std::string> warn;
  const char* text =
      "# coll,minBytes,maxBytes,algo,proto,nChannels[,nNodes[,nRanks]]\n"
      "allreduce, 0, 64K, tree, simple, 0\n"
      "AllGather,1M,1G,*,LL128,200,2\n"
      "*,-1,*,*,*,8,*,16\n"
      "allreduce,0,1K,tree\n"     // too few fields
      "bogus,0,1K,tree,ll,0\n"    // unknown collective
      "reduce,4K,1K,ring,ll,0\n"  // min > max
      "reduce,0,1X,ring,ll,0\n";  // bad suffix
  REQUIRE(parseTunerRules(text, &rules, &warn) == Result::Success);
  REQUIRE(rules.size() == 3);
  CHECK(rules[0].coll == static_cast<int>(CollType::AllReduce));
  CHECK(rules[0].maxBytes == 64 * KiB);
  CHECK(rules[0].algo == kAlgoTree);
  CHECK(rules[0].proto == kProtoSimple);
  CHECK(rules[0].line == 2);
  CHECK(rules[1].minBytes == 1 * MiB);
  CHECK(rules[1].maxBytes == 1 * GiB);
  CHECK(rules[1].algo == kTunerAny);
  CHECK(rules[1].nChannels == kTunerMaxChannels);  // 200 clamped
  CHECK(rules[1].nNodes == 2);
  CHECK(rules[2].coll == kTunerAny);
  CHECK(rules[2].nRanks == 16);
  CHECK(warn.size() == 5);  // 4 bad lines + the clamp
  std::vector<TunerRule> none;
  CHECK(parseTunerRules("nonsense\n", &none, &warn) == Result::InvalidArgument);
  CHECK(parseTunerRules("# only a comment\n\n", &none, &warn) == Result::Success);
}

TEST_CASE("rules: first match wins over the policy; unusable rules fall back") {
  TunerSystem s = system(16, 2, true, true);
  std::vector<TunerRule> rules;
  std::vector<std::string> warn;
  REQUIRE(parseTunerRules("allreduce,0,64K,ring,simple,0\n"
                          "allreduce,0,1G,collnet_direct,*,0\n"
                          "allgather,*,*,*,*,12\n"
                          "broadcast,*,*,*,ll128,0,4\n",
                          &rules, &warn) == Result::Success);
  CHECK(decide(s, CollType::AllReduce, 4 * KiB, Table(), rules) == Pick{kAlgoRing, kProtoSimple});
  // CollNet is -1 in the table: the rule cannot apply, the policy decides.
  CHECK(decide(s, CollType::AllReduce, 1 * MiB, Table(), rules) == Pick{kAlgoTree, kProtoLL128});
  int ch = 0;
  Table t;
  Table orig = t;
  TunerDecision d =
      applyTunerPolicy(s, rules, static_cast<int>(CollType::AllGather), 1 * MiB, t.v, kA, kP, &ch);
  CHECK(ch == 12);
  CHECK(d.changed);
  CHECK(d.algo == kTunerAny);
  CHECK(std::memcmp(t.v, orig.v, sizeof(t.v)) == 0);  // channels only, NCCL's algorithm kept
  // nNodes=4 does not match a 2-node job.
  CHECK(decide(s, CollType::Broadcast, 1 * MiB, Table(), rules) == Pick{kAlgoRing, kProtoLL128});
  TunerSystem four = system(32, 4, true, true);
  CHECK(decide(four, CollType::Broadcast, 64 * MiB, Table(), rules) ==
        Pick{kAlgoRing, kProtoLL128});
}
