// collectives/policy.h: determinism, MKERNEL_* overrides, emulation, logging once per class.
#include "tests/catch.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/policy.h"
#include "common/result.h"
#include "common/param.h"

using namespace mkernel::coll;
using mkernel::Result;

namespace {

// Sets MKERNEL_<name> for the scope of one test (and restores "unset" after).
struct EnvGuard {
  std::vector<std::string> names;
  void set(const char* name, const char* value) {
    std::string full = std::string("MKERNEL_") + name;
    setenv(full.c_str(), value, 1);
    names.push_back(full);
    mkernel::params::resetForTesting();
  }
  ~EnvGuard() {
    for (const std::string& n : names) unsetenv(n.c_str());
    mkernel::params::resetForTesting();
  }
};

PolicyQuery query(CollType c, DataType t, size_t count, int nRanks = 8, int nNodes = 1,
                  RedOp op = RedOp::Sum) {
  PolicyQuery q;
  q.coll = c;
  q.dtype = t;
  q.op = op;
  q.count = count;
  q.nRanks = nRanks;
  q.nNodes = nNodes;
  return q;
}

PolicyConfig envConfig() {
  PolicyConfig cfg;
  REQUIRE(loadPolicyConfig(&cfg) == Result::Success);
  return cfg;
}

}  // namespace

TEST_CASE("policy: defaults: one-shot small AllReduce, two-shot large, direct for the rest") {
  SelectionPolicy pol(envConfig());
  PolicyDecision d = pol.decide(query(CollType::AllReduce, DataType::Float32, 1024));
  CHECK(d.path == ExecPath::Mkernel);
  CHECK(d.algo == Algo::OneShot);
  // 32 KiB is the default one-shot limit: 8192 floats is still one-shot, 8193 is not.
  CHECK(pol.decide(query(CollType::AllReduce, DataType::Float32, 8192)).algo == Algo::OneShot);
  CHECK(pol.decide(query(CollType::AllReduce, DataType::Float32, 8193)).algo == Algo::TwoShot);
  for (CollType c :
       {CollType::AllGather, CollType::ReduceScatter, CollType::Broadcast, CollType::Reduce}) {
    PolicyDecision x = pol.decide(query(c, DataType::Bfloat16, 1 << 20));
    CHECK(x.path == ExecPath::Mkernel);
    CHECK(x.algo == Algo::Direct);
  }
  CHECK(pol.decide(query(CollType::AllReduce, DataType::Float32, 0)).path == ExecPath::Mkernel);
}

TEST_CASE("policy: the decision depends only on shared inputs and is the same on every rank") {
  // Ranks build their policy from the same config; the decision for every query must agree,
  // and repeat (no hidden state such as a call counter).
  PolicyConfig cfg = envConfig();
  SelectionPolicy r0(cfg), r1(cfg);
  for (int c = 0; c < kNumCollTypes; ++c)
    for (int t = 0; t < kNumDataTypes; ++t)
      for (size_t count : {size_t(0), size_t(1), size_t(1000), size_t(1) << 24})
        for (int n : {1, 2, 8, 16, 32})
          for (int nodes : {1, 2}) {
            PolicyQuery q =
                query(static_cast<CollType>(c), static_cast<DataType>(t), count, n, nodes);
            PolicyDecision a = r0.select(q), b = r1.decide(q), again = r0.decide(q);
            CHECK(a.path == b.path);
            CHECK(a.path == again.path);
            if (a.path == ExecPath::Mkernel) {
              CHECK(a.algo == b.algo);
              CHECK(algoSupports(q.coll, a.algo));
            }
          }
}

TEST_CASE("policy: MKERNEL_DISABLE, MKERNEL_COLLECTIVES and MKERNEL_MAX_BYTES send work to NCCL") {
  {
    EnvGuard env;
    env.set("DISABLE", "1");
    SelectionPolicy pol(envConfig());
    PolicyDecision d = pol.decide(query(CollType::AllReduce, DataType::Float32, 16));
    CHECK(d.path == ExecPath::Nccl);
    CHECK(std::string(d.reason).find("MKERNEL_DISABLE") != std::string::npos);
  }
  {
    EnvGuard env;
    env.set("COLLECTIVES", "AllReduce, broadcast");
    SelectionPolicy pol(envConfig());
    CHECK(pol.decide(query(CollType::AllReduce, DataType::Float32, 16)).path == ExecPath::Mkernel);
    CHECK(pol.decide(query(CollType::Broadcast, DataType::Float32, 16)).path == ExecPath::Mkernel);
    CHECK(pol.decide(query(CollType::AllGather, DataType::Float32, 16)).path == ExecPath::Nccl);
    CHECK(pol.decide(query(CollType::Reduce, DataType::Float32, 16)).path == ExecPath::Nccl);
  }
  {
    EnvGuard env;
    env.set("COLLECTIVES", "none");
    SelectionPolicy pol(envConfig());
    CHECK(pol.decide(query(CollType::AllReduce, DataType::Float32, 16)).path == ExecPath::Nccl);
  }
  {
    EnvGuard env;
    env.set("MAX_BYTES", "4096");
    SelectionPolicy pol(envConfig());
    CHECK(pol.decide(query(CollType::AllReduce, DataType::Float32, 1024)).path ==
          ExecPath::Mkernel);
    CHECK(pol.decide(query(CollType::AllReduce, DataType::Float32, 1025)).path == ExecPath::Nccl);
    // AllGather counts its whole buffer: 8 ranks x 128 floats = 4096 B, x 129 is over.
    CHECK(pol.decide(query(CollType::AllGather, DataType::Float32, 128)).path == ExecPath::Mkernel);
    CHECK(pol.decide(query(CollType::AllGather, DataType::Float32, 129)).path == ExecPath::Nccl);
  }
}

TEST_CASE(
    "policy: where NCCL measured faster (2 ranks, one node) it runs there, unless "
    "MKERNEL_NCCL_CROSSOVER=off") {
  SelectionPolicy pol(envConfig());
  // The path `p` picks for `bytes` of float32 (AllGather/ReduceScatter: the whole buffer,
  // policyBytes).
  auto pathIn = [](const SelectionPolicy& p, CollType c, size_t bytes, int nRanks) {
    const size_t per = (c == CollType::AllGather || c == CollType::ReduceScatter) ? 4 * nRanks : 4;
    return p.decide(query(c, DataType::Float32, bytes / per, nRanks)).path;
  };
  auto path = [&](CollType c, size_t bytes, int nRanks = 2) {
    return pathIn(pol, c, bytes, nRanks);
  };
  CHECK(path(CollType::Reduce, (512 << 10) - 4) == ExecPath::Mkernel);
  CHECK(path(CollType::Reduce, 512 << 10) == ExecPath::Nccl);
  CHECK(path(CollType::Broadcast, (2 << 20) - 4) == ExecPath::Mkernel);
  CHECK(path(CollType::Broadcast, 2 << 20) == ExecPath::Nccl);
  CHECK(path(CollType::AllReduce, (size_t(512) << 20) - 4) == ExecPath::Mkernel);
  CHECK(path(CollType::AllReduce, size_t(512) << 20) == ExecPath::Nccl);
  CHECK(std::string(pol.decide(query(CollType::Reduce, DataType::Float32, 1 << 20, 2)).reason)
            .find("MKERNEL_NCCL_CROSSOVER") != std::string::npos);
  // mkernel measured faster or equal: AllGather and ReduceScatter stay at every size.
  CHECK(path(CollType::AllGather, size_t(8) << 30) == ExecPath::Mkernel);
  CHECK(path(CollType::ReduceScatter, size_t(8) << 30) == ExecPath::Mkernel);
  // Only the measured configuration: 2 ranks on one node.
  CHECK(path(CollType::Reduce, 64 << 20, 4) == ExecPath::Mkernel);
  CHECK(path(CollType::Reduce, 64 << 20, 8) == ExecPath::Mkernel);
  CHECK(ncclCrossoverBytes(CollType::Reduce, 2, 2, true) == 0);
  CHECK(ncclCrossoverBytes(CollType::Reduce, 2, 1, false) == 0);
  // Process ranks (staged): AllReduce and AllGather from 4 MiB, ReduceScatter from 16 MiB.
  {
    PolicyConfig cfg = envConfig();
    cfg.stagedRanks = true;
    SelectionPolicy staged(cfg);
    auto spath = [&](CollType c, size_t bytes, int nRanks = 2) {
      return pathIn(staged, c, bytes, nRanks);
    };
    CHECK(spath(CollType::AllReduce, (4 << 20) - 4) == ExecPath::Mkernel);
    CHECK(spath(CollType::AllReduce, 4 << 20) == ExecPath::Nccl);
    CHECK(spath(CollType::AllGather, (4 << 20) - 8) == ExecPath::Mkernel);
    CHECK(spath(CollType::AllGather, 4 << 20) == ExecPath::Nccl);
    CHECK(spath(CollType::ReduceScatter, (16 << 20) - 8) == ExecPath::Mkernel);
    CHECK(spath(CollType::ReduceScatter, 16 << 20) == ExecPath::Nccl);
    CHECK(spath(CollType::Reduce, 512 << 10) == ExecPath::Nccl);
    CHECK(spath(CollType::Broadcast, 2 << 20) == ExecPath::Nccl);
    // Small ones stay in mkernel; other rank counts are not measured.
    CHECK(spath(CollType::AllReduce, 1 << 20) == ExecPath::Mkernel);
    CHECK(spath(CollType::AllReduce, 64 << 20, 4) == ExecPath::Mkernel);
    // Thread ranks keep their own table.
    CHECK(path(CollType::AllReduce, 64 << 20) == ExecPath::Mkernel);
    CHECK(ncclCrossoverBytes(CollType::AllGather, 2, 1, true, false) == 0);
    CHECK(ncclCrossoverBytes(CollType::AllGather, 2, 1, true, true) == (size_t(4) << 20));
  }
  {
    PolicyConfig cfg = envConfig();
    cfg.emulate = true;  // no real NCCL to give it to
    SelectionPolicy emu(cfg);
    CHECK(emu.decide(query(CollType::Reduce, DataType::Float32, 1 << 24, 2)).path ==
          ExecPath::Mkernel);
  }
  {
    EnvGuard env;
    env.set("NCCL_CROSSOVER", "off");
    SelectionPolicy off(envConfig());
    CHECK(off.decide(query(CollType::Reduce, DataType::Float32, 1 << 24, 2)).path ==
          ExecPath::Mkernel);
    CHECK(off.decide(query(CollType::AllReduce, DataType::Float32, size_t(1) << 28, 2)).path ==
          ExecPath::Mkernel);
  }
  {
    EnvGuard env;
    env.set("NCCL_CROSSOVER", "sometimes");  // invalid: warned about, the default (auto) holds
    PolicyConfig cfg;
    REQUIRE(loadPolicyConfig(&cfg) == Result::Success);
    CHECK(cfg.ncclCrossover);
  }
}

TEST_CASE("policy: MKERNEL_ALGO and MKERNEL_ONESHOT_MAX_BYTES steer the algorithm") {
  {
    EnvGuard env;
    env.set("ALGO", "ring");
    SelectionPolicy pol(envConfig());
    for (int c = 0; c < kNumCollTypes; ++c)
      CHECK(pol.decide(query(static_cast<CollType>(c), DataType::Float32, 100)).algo == Algo::Ring);
  }
  {
    EnvGuard env;
    env.set("ALGO", "TwoShot");  // AllReduce only: the others stay auto
    SelectionPolicy pol(envConfig());
    CHECK(pol.decide(query(CollType::AllReduce, DataType::Float32, 1)).algo == Algo::TwoShot);
    CHECK(pol.decide(query(CollType::AllGather, DataType::Float32, 1)).algo == Algo::Direct);
  }
  {
    EnvGuard env;
    env.set("ONESHOT_MAX_BYTES", "0");
    SelectionPolicy pol(envConfig());
    CHECK(pol.decide(query(CollType::AllReduce, DataType::Float32, 1)).algo == Algo::TwoShot);
    CHECK(pol.decide(query(CollType::AllReduce, DataType::Float32, 0)).algo == Algo::OneShot);
  }
  PolicyConfig pcie = envConfig();
  pcie.directAccess = false;
  SelectionPolicy pol(pcie);
  CHECK(pol.decide(query(CollType::AllReduce, DataType::Float32, 1)).algo == Algo::Ring);
  CHECK(pol.decide(query(CollType::Broadcast, DataType::Float32, 1)).algo == Algo::Ring);
}

// Invalid values are warned about by the settings registry (tests/common checks the warning) and
// the defaults hold.
TEST_CASE("policy: invalid settings leave the defaults in effect") {
  PolicyConfig defaults;
  REQUIRE(loadPolicyConfig(&defaults) == Result::Success);
  PolicyConfig cfg;
  {
    EnvGuard env;
    env.set("COLLECTIVES", "allreduce,alltoall");
    REQUIRE(loadPolicyConfig(&cfg) == Result::Success);
    CHECK(cfg.collMask == defaults.collMask);
    CHECK(cfg.collMask == (1u << kNumCollTypes) - 1);
  }
  {
    EnvGuard env;
    env.set("ALGO", "tree");
    REQUIRE(loadPolicyConfig(&cfg) == Result::Success);
    CHECK(cfg.forcedAlgo == -1);
  }
  {
    EnvGuard env;
    env.set("MAX_BYTES", "-1");
    REQUIRE(loadPolicyConfig(&cfg) == Result::Success);
    CHECK(cfg.maxBytes == 0);
  }
  {
    EnvGuard env;
    env.set("RING_CHUNK_BYTES", "0");
    REQUIRE(loadPolicyConfig(&cfg) == Result::Success);
    CHECK(cfg.ringChunkBytes == 131072);
  }
  {
    EnvGuard env;
    env.set("RING_CHUNK_BYTES", "64K");
    REQUIRE(loadPolicyConfig(&cfg) == Result::Success);
    CHECK(cfg.ringChunkBytes == 65536);
  }
}

TEST_CASE("policy: multi-node, too many ranks and emulation") {
  PolicyConfig cfg = envConfig();
  SelectionPolicy real(cfg);
  CHECK(real.decide(query(CollType::AllReduce, DataType::Float32, 64, 16, 2)).path ==
        ExecPath::Nccl);
  CHECK(real.decide(query(CollType::AllReduce, DataType::Float32, 64, 17, 1)).path ==
        ExecPath::Nccl);
  cfg.kernelMultiNode = true;
  cfg.ncclCrossover = false;  // rule 6c (below) would give this small AllReduce to NCCL
  CHECK(
      SelectionPolicy(cfg).decide(query(CollType::AllReduce, DataType::Float32, 64, 16, 2)).path ==
      ExecPath::Mkernel);

  PolicyConfig emu = envConfig();
  emu.emulate = true;
  emu.maxBytes = 16;  // a performance limit: ignored in emulation
  SelectionPolicy pol(emu);
  CHECK(pol.decide(query(CollType::AllReduce, DataType::Float32, 1 << 20)).path ==
        ExecPath::Mkernel);
  PolicyQuery multi = query(CollType::AllGather, DataType::Int8, 10, 8, 2);
  PolicyDecision d = pol.decide(multi);
  CHECK(d.path == ExecPath::Unsupported);
  CHECK(pol.unsupportedError(multi, d) == Result::InvalidUsage);
  std::string msg = mkernel::lastError();
  CHECK(msg.find("AllGather") != std::string::npos);
  CHECK(msg.find("inter-node") != std::string::npos);
  emu.disabled = true;
  CHECK(SelectionPolicy(emu).decide(query(CollType::Reduce, DataType::Float32, 1)).path ==
        ExecPath::Unsupported);
  // Values outside the enums (the shim validates first; the policy must not index with them).
  CHECK(real.decide(query(static_cast<CollType>(7), DataType::Float32, 1)).path == ExecPath::Nccl);
}

TEST_CASE("policy: a decision is logged once per (collective, power-of-two size class)") {
  SelectionPolicy pol(envConfig());
  std::vector<std::string> lines;
  pol.setLogSink(
      [](void* ctx, const char* line) {
        static_cast<std::vector<std::string>*>(ctx)->push_back(line);
      },
      &lines);
  for (int i = 0; i < 3; ++i) {
    pol.select(query(CollType::AllReduce, DataType::Float32, 256));  // 1024 B: class 1024-2047
    pol.select(query(CollType::AllReduce, DataType::Float32, 300));  // 1200 B: same class
    pol.select(query(CollType::AllReduce, DataType::Int8, 1500));    // 1500 B: same class
  }
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("AllReduce 1024-2047 B") != std::string::npos);
  CHECK(lines[0].find("mkernel/oneshot") != std::string::npos);
  pol.select(query(CollType::AllReduce, DataType::Float32, 512));  // 2048 B: next class
  pol.select(query(CollType::Broadcast, DataType::Float32, 256));  // other collective
  pol.select(query(CollType::AllReduce, DataType::Float32, 0));    // 0 B
  pol.select(query(CollType::AllReduce, DataType::Float32, 0));
  CHECK(lines.size() == 4);
  CHECK(policySizeBucket(0) == 0);
  CHECK(policySizeBucket(1) == 1);
  CHECK(policySizeBucket(1023) == 10);
  CHECK(policySizeBucket(1024) == 11);
  PolicyQuery huge = query(CollType::AllGather, DataType::Float64, ~size_t(0) / 2);
  CHECK(policyBytes(huge) == ~size_t(0));  // saturates instead of wrapping
}

// Rule 6c: several nodes, MKERNEL_NCCL_CROSSOVER=auto: NCCL where the cost model predicts it
// faster. The figures are mkernel-model's with 400 Gb/s rail NICs and the policy's parameters
// (`mkernel-model --nodes 2 --gpus 8 --policy rail=direct`, and `--nodes 8 --gpus 2`; the kernel
// addresses 16 ranks): on 2 nodes of 8, NCCL's tree/LL 25.2 us against mkernel's 38.9 us (28.9
// per call, two NVLink steps of 1, two rail steps of 4) up to 128 KiB, mkernel from 512 KiB; on 8
// nodes of 2, NCCL's 38.0-38.4 us against 38.9-39.0 up to 8 KiB, mkernel from 32 KiB.
TEST_CASE("policy: several nodes: NCCL where the cost model predicts it faster (rule 6c)") {
  PolicyConfig cfg = envConfig();
  cfg.kernelMultiNode = true;
  cfg.railMbps = 400000;  // the communicator's agreed rail NIC (CollStats::railMbps)
  cfg.hierRail = 0;       // direct (CollStats::hierRail)
  SelectionPolicy pol(cfg);
  // bytes: nccl-tests' size, of Int8 elements; 16 ranks on `nodes` nodes.
  auto path = [&](const SelectionPolicy& p, CollType c, size_t bytes, int nodes) {
    return p
        .decide(query(c, DataType::Int8, bytes / (c == CollType::AllReduce ? 1 : 16), 16, nodes))
        .path;
  };
  PolicyDecision d = pol.decide(query(CollType::AllReduce, DataType::Float32, 2, 16, 2));
  CHECK(d.path == ExecPath::Nccl);
  CHECK(std::string(d.reason).find("cost model") != std::string::npos);
  CHECK(d.modelNcclUs == Approx(25.2).margin(0.05));
  CHECK(d.modelMkUs == Approx(38.9).margin(0.05));
  CHECK(std::string(d.modelNcclChoice) == "tree/ll");
  CHECK(path(pol, CollType::AllReduce, 128 << 10, 2) == ExecPath::Nccl);
  CHECK(path(pol, CollType::AllReduce, 512 << 10, 2) == ExecPath::Mkernel);
  CHECK(path(pol, CollType::AllReduce, size_t(1) << 30, 2) == ExecPath::Mkernel);
  CHECK(path(pol, CollType::AllReduce, 8, 8) == ExecPath::Nccl);
  CHECK(path(pol, CollType::AllReduce, 8 << 10, 8) == ExecPath::Nccl);
  for (size_t b = 32 << 10; b <= (size_t(1) << 30); b *= 4) {
    INFO(b << " B");
    CHECK(path(pol, CollType::AllReduce, b, 8) == ExecPath::Mkernel);
  }
  // ReduceScatter and AllGather (nccl-tests' sizes): NCCL's ring/LL up to 512 KiB at 2 nodes.
  CHECK(path(pol, CollType::ReduceScatter, 512 << 10, 2) == ExecPath::Nccl);
  CHECK(path(pol, CollType::ReduceScatter, 2 << 20, 2) == ExecPath::Mkernel);
  CHECK(path(pol, CollType::AllGather, 64, 2) == ExecPath::Nccl);
  // Broadcast and Reduce are not modelled: mkernel, and the model not consulted.
  d = pol.decide(query(CollType::Broadcast, DataType::Float32, 2, 16, 2));
  CHECK(d.path == ExecPath::Mkernel);
  CHECK(d.modelMkUs == 0);
  CHECK(path(pol, CollType::Reduce, 8, 2) == ExecPath::Mkernel);
  // One node: the model is not consulted.
  CHECK(pol.decide(query(CollType::AllReduce, DataType::Float32, 2, 8, 1)).modelMkUs == 0);

  // The rail NIC's speed is an input. With nothing hidden (MKERNEL_COST_MODEL=hidden=0), a 128 MiB
  // AllReduce on 2 x 8 is NCCL's at 400 Gb/s (858.9 against 1067.3 us) and mkernel's at 100 Gb/s,
  // where NCCL's ring is NIC-bound too (2753.0 against 2115.8 us).
  {
    EnvGuard env;
    env.set("COST_MODEL", "hidden=0");
    PolicyConfig c = envConfig();
    c.kernelMultiNode = true;
    c.hierRail = 0;
    c.railMbps = 400000;
    CHECK(path(SelectionPolicy(c), CollType::AllReduce, 128 << 20, 2) == ExecPath::Nccl);
    c.railMbps = 100000;
    CHECK(path(SelectionPolicy(c), CollType::AllReduce, 128 << 20, 2) == ExecPath::Mkernel);
    // ... unless MKERNEL_COST_MODEL names the NIC rate itself.
    env.set("COST_MODEL", "hidden=0,nic-gbps=48");
    PolicyConfig given = envConfig();
    given.kernelMultiNode = true;
    given.hierRail = 0;
    given.railMbps = 100000;
    CHECK(given.costNicGiven);
    CHECK(path(SelectionPolicy(given), CollType::AllReduce, 128 << 20, 2) == ExecPath::Nccl);
  }
  // The per-call overhead decides small messages: at the design goal of 8 us, 18 us beats 25.2.
  {
    EnvGuard env;
    env.set("COST_MODEL", "mk-overhead-us=8");
    PolicyConfig c = envConfig();
    c.kernelMultiNode = true;
    c.hierRail = 0;
    PolicyDecision fast =
        SelectionPolicy(c).decide(query(CollType::AllReduce, DataType::Float32, 2, 16, 2));
    CHECK(fast.path == ExecPath::Mkernel);
    CHECK(fast.modelMkUs == Approx(18.0).margin(0.05));
  }
  // The rail form the communicator runs: ring over 8 nodes is 14 steps of 4 us (+ 28.9 + 2).
  {
    PolicyConfig c = cfg;
    c.hierRail = 1;
    CHECK(SelectionPolicy(c)
              .decide(query(CollType::AllReduce, DataType::Float32, 2, 16, 8))
              .modelMkUs == Approx(86.9).margin(0.05));
    CHECK(policyModelFor(c, 16, 8).rail == 1);
    CHECK(policyModelFor(c, 16, 8).gpusPerNode == 2);
    CHECK(policyModelFor(c, 16, 8).nicsPerNode == 2);
    CHECK(policyModelFor(c, 16, 8).nicGBps == Approx(48.0));
    CHECK(policyModelFor(c, 12, 8).gpusPerNode == 2);  // uneven: rounded up
  }
  // MKERNEL_NCCL_CROSSOVER=off and emulation: mkernel everywhere.
  {
    PolicyConfig c = cfg;
    c.ncclCrossover = false;
    CHECK(path(SelectionPolicy(c), CollType::AllReduce, 8, 2) == ExecPath::Mkernel);
    c = cfg;
    c.emulate = true;
    CHECK(path(SelectionPolicy(c), CollType::AllReduce, 8, 2) == ExecPath::Mkernel);
  }
  // The INFO line says what the model predicted.
  std::vector<std::string> lines;
  pol.setLogSink(
      [](void* ctx, const char* line) {
        static_cast<std::vector<std::string>*>(ctx)->push_back(line);
      },
      &lines);
  pol.select(query(CollType::AllReduce, DataType::Float32, 2, 16, 2));
  REQUIRE(lines.size() == 1);
  INFO(lines[0]);
  CHECK(lines[0].find("-> nccl") != std::string::npos);
  CHECK(lines[0].find("cost model at 8 B: NCCL tree/ll 25.2 us, mkernel 38.9 us") !=
        std::string::npos);
}

TEST_CASE("policy: MKERNEL_COST_MODEL: bad items fail naming the variable and the item") {
  PolicyConfig cfg;
  for (const char* bad :
       {"nic-gbps=0", "nic-gbps=fast", "nics=1.5", "nics=0", "hidden=2", "mk-overhead-us=-1",
        "rail=tree", "speed=3", "mk-overhead-us", "hidden=0.5,nvlink-gbps="}) {
    INFO(bad);
    EnvGuard env;
    env.set("COST_MODEL", bad);
    CHECK(loadPolicyConfig(&cfg) == Result::InvalidArgument);
    const std::string msg = mkernel::lastError();
    INFO(msg);
    CHECK(msg.find("MKERNEL_COST_MODEL") != std::string::npos);
  }
  EnvGuard env;
  env.set("COST_MODEL", "nvlink-gbps=400,nics=4,mk-inter-us=6.5,rail=rhd,hidden=0.7,");
  REQUIRE(loadPolicyConfig(&cfg) == Result::Success);
  CHECK(cfg.costModel.nvlinkGBps == 400);
  CHECK(cfg.costModel.nicsPerNode == 4);
  CHECK(cfg.costModel.mkInterStepUs == 6.5);
  CHECK(cfg.costModel.rail == 2);
  CHECK(cfg.costModel.hidden == 0.7);
  CHECK(cfg.costModel.mkOverheadUs == kPolicyOverheadUs);  // not given: the policy's default
  CHECK(cfg.costNicsGiven);
  CHECK(cfg.costRailGiven);
  CHECK(!cfg.costNicGiven);
  cfg.hierRail = 0;
  cfg.railMbps = 200000;
  CHECK(policyModelFor(cfg, 16, 2).nicsPerNode == 4);  // given: not one per GPU
  CHECK(policyModelFor(cfg, 16, 2).rail == 2);         // given: not the communicator's
  CHECK(policyModelFor(cfg, 16, 2).nicGBps == Approx(24.0));
}
