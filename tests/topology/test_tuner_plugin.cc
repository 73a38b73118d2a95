// The NCCL tuner tables v6..v2 as NCCL uses them: dlopen the built libnccl-tuner-mkernel.so,
// dlsym ncclTunerPlugin_v6.._v2, init with each fixture's topology (MKERNEL_TOPO_XML +
// MKERNEL_NVLINK_MATRIX), and drive getCollInfo over every collective and size.
#include <dlfcn.h>
#include "tests/catch.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/param.h"
#include "plugin/abi/tuner_v2.h"
#include "plugin/abi/tuner_v3.h"
#include "plugin/abi/tuner_v4.h"
#include "plugin/abi/tuner_v5.h"
#include "plugin/abi/tuner_v6.h"

using namespace mkernel::abi;

namespace {

constexpr int kA = kNcclNumAlgorithms, kP = kNcclNumProtocols;
constexpr int TREE = 0, RING = 1, NVLS = 4, PAT = 6, LL = 0, LL128 = 1, SIMPLE = 2;
constexpr size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

void* lib() {
  static void* h = dlopen(MKERNEL_TUNER_LIB, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) FAIL("dlopen " MKERNEL_TUNER_LIB ": " << dlerror());
  return h;
}
template <typename T>
T* sym(const char* name) {
  T* t = static_cast<T*>(dlsym(lib(), name));
  REQUIRE(t != nullptr);
  REQUIRE(std::string(t->name) == "mkernel");
  return t;
}

// This file plays NCCL run with NCCL_DEBUG=INFO: the library hands over only the lines NCCL would
// print (common/log.cc), and the tests read INFO ones.
struct NcclDebugInfo {
  NcclDebugInfo() { setenv("NCCL_DEBUG", "INFO", /*overwrite=*/0); }
} gNcclDebugInfo;

std::vector<std::string> gLog;
void captureLog(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  gLog.push_back(buf);
}
bool logged(const char* what) {
  for (const std::string& l : gLog)
    if (l.find(what) != std::string::npos) return true;
  return false;
}

std::string fixture(const char* name) {
  return std::string(MKERNEL_TOPO_FIXTURES) + "/" + name;
}

// The environment a user would set. xml/nvl null: unset.
void env(const char* tunerPlugin, const char* mkTuner, const char* xml, const char* nvl) {
  auto set = [](const char* k, const char* v) {
    v ? setenv(k, v, 1) : unsetenv(k);
    mkernel::params::resetForTesting();
  };
  set("NCCL_TUNER_PLUGIN", tunerPlugin);
  set("MKERNEL_TUNER", mkTuner);
  set("MKERNEL_TOPO_XML", xml ? fixture(xml).c_str() : nullptr);
  set("MKERNEL_NVLINK_MATRIX", nvl ? fixture(nvl).c_str() : nullptr);
  unsetenv("MKERNEL_TUNER_CONFIG");
  unsetenv("MKERNEL_NVLS");
  mkernel::params::resetForTesting();
}

struct Table {
  float v[kA][kP];
  Table() {
    for (int a = 0; a < kA; ++a)
      for (int p = 0; p < kP; ++p) v[a][p] = 20.0f + 3 * a + p;
    for (int p = 0; p < kP; ++p)
      v[2][p] = v[3][p] = v[4][p] = v[5][p] = -1.0f;  // no CollNet, no NVLS
  }
  float** ptr() { return reinterpret_cast<float**>(&v[0][0]); }
  // The entry NCCL would pick: the cheapest in [0, 3.6e9).
  std::pair<int, int> pick() const {
    int ba = -1, bp = -1;
    for (int a = 0; a < kA; ++a)
      for (int p = 0; p < kP; ++p)
        if (v[a][p] >= 0 && (ba < 0 || v[a][p] < v[ba][bp])) {
          ba = a;
          bp = p;
        }
    return {ba, bp};
  }
};

using Pick = std::pair<int, int>;

// Every collective x 1 B..4 GiB (powers of 4): no -1 changes, no NaN, channels in range.
// Returns how many of the kSweepCalls tables were changed.
constexpr int kSweepCalls = 5 * 17;
template <typename Fn>
int sweep(Fn getCollInfo) {
  int changedTables = 0, call = 0;
  for (int coll = 0; coll < 5; ++coll)
    for (size_t bytes = 1; bytes <= 4 * GiB; bytes *= 4) {
      Table in;
      if (++call % 3 == 0) in.v[TREE][LL128] = -1.0f;  // as on GPUs/paths where NCCL disables it
      Table out = in;
      int ch = 0;
      REQUIRE(getCollInfo(coll, bytes, &out, &ch) == ncclSuccess);
      REQUIRE(ch >= 0);
      REQUIRE(ch <= 64);
      bool changed = false;
      for (int a = 0; a < kA; ++a)
        for (int p = 0; p < kP; ++p) {
          REQUIRE_FALSE(std::isnan(out.v[a][p]));
          if (in.v[a][p] < 0) REQUIRE(out.v[a][p] == in.v[a][p]);
          changed = changed || out.v[a][p] != in.v[a][p];
        }
      changedTables += changed ? 1 : 0;
    }
  return changedTables;
}

}  // namespace

TEST_CASE("tuner plugin: all five tables exported under the name mkernel") {
  sym<ncclTuner_v6_t>("ncclTunerPlugin_v6");
  sym<ncclTuner_v5_t>("ncclTunerPlugin_v5");
  sym<ncclTuner_v4_t>("ncclTunerPlugin_v4");
  sym<ncclTuner_v3_t>("ncclTunerPlugin_v3");
  sym<ncclTuner_v2_t>("ncclTunerPlugin_v2");
}

TEST_CASE("tuner plugin: neutral unless asked (loaded through NCCL_NET_PLUGIN=mkernel)") {
  auto* v5 = sym<ncclTuner_v5_t>("ncclTunerPlugin_v5");
  const char* cases[][2] = {
      {nullptr, nullptr}, {"libnccl-tuner-other.so", nullptr}, {"mkernel", "0"}};
  for (auto& c : cases) {
    env(c[0], c[1], "dgx-h100.xml", "nvswitch-8gpu.nvl");
    gLog.clear();
    void* ctx = nullptr;
    ncclNvlDomainInfo_v5_t nvl{1, 8, 8};
    REQUIRE(v5->init(&ctx, 42, 16, 2, captureLog, &nvl, nullptr) == ncclSuccess);
    CHECK(logged("neutral"));
    int changed = sweep([&](int coll, size_t bytes, Table* t, int* ch) {
      return v5->getCollInfo(ctx, static_cast<ncclFunc_t>(coll), bytes, 1, t->ptr(), kA, kP, 0, ch);
    });
    CHECK(changed == 0);
    REQUIRE(v5->finalize(ctx) == ncclSuccess);
  }
}

TEST_CASE("tuner plugin v5: DGX-H100 fixture, NVSwitch; constants left unchanged") {
  auto* v5 = sym<ncclTuner_v5_t>("ncclTunerPlugin_v5");
  env("/opt/x/libnccl-tuner-mkernel.so", nullptr, "dgx-h100.xml", "nvswitch-8gpu.nvl");
  gLog.clear();
  ncclTunerConstants_v5_t constants;
  double* d = reinterpret_cast<double*>(&constants);
  for (size_t i = 0; i < sizeof(constants) / sizeof(double); ++i) d[i] = 1.5 * i;
  ncclTunerConstants_v5_t before = constants;
  ncclNvlDomainInfo_v5_t nvl{1, 8, 8};
  void* ctx = nullptr;
  REQUIRE(v5->init(&ctx, 7, 8, 1, captureLog, &nvl, &constants) == ncclSuccess);
  CHECK(std::memcmp(&before, &constants, sizeof(constants)) == 0);
  CHECK(logged("steering NCCL"));
  CHECK(logged("NVSwitch"));
  auto call = [&](int coll, size_t bytes, Table* t, int* ch) {
    return v5->getCollInfo(ctx, static_cast<ncclFunc_t>(coll), bytes, 1, t->ptr(), kA, kP, 0, ch);
  };
  CHECK(sweep(call) == kSweepCalls);
  Table t;
  int ch = 0;
  REQUIRE(call(4, 4 * KiB, &t, &ch) == ncclSuccess);
  CHECK(t.pick() == Pick(RING, LL));
  Table m;
  Table one;  // the measured 2 x H200 crossover: LL is still fastest at 1 MiB
  REQUIRE(call(4, 1 * MiB, &one, &ch) == ncclSuccess);
  CHECK(one.pick() == Pick(RING, LL));
  REQUIRE(call(4, 4 * MiB, &m, &ch) == ncclSuccess);
  CHECK(m.pick() == Pick(RING, LL128));
  Table l;
  REQUIRE(call(2, 1 * GiB, &l, &ch) == ncclSuccess);
  CHECK(l.pick() == Pick(RING, SIMPLE));
  CHECK(ch == 0);
  CHECK(logged("AllReduce"));
  REQUIRE(v5->finalize(ctx) == ncclSuccess);

  // NVLS offered by NCCL and allowed by MKERNEL_NVLS=1: preferred for large all-reduce.
  setenv("MKERNEL_NVLS", "1", 1);
  mkernel::params::resetForTesting();
  REQUIRE(v5->init(&ctx, 8, 8, 1, captureLog, &nvl, &constants) == ncclSuccess);
  Table n;
  for (int p = 0; p < kP; ++p) n.v[NVLS][p] = 30.0f;
  REQUIRE(call(4, 1 * GiB, &n, &ch) == ncclSuccess);
  CHECK(n.pick() == Pick(NVLS, SIMPLE));
  REQUIRE(v5->finalize(ctx) == ncclSuccess);
  unsetenv("MKERNEL_NVLS");
  mkernel::params::resetForTesting();
}

TEST_CASE("tuner plugin v5: NCCL's NVLink domains override the node model") {
  auto* v5 = sym<ncclTuner_v5_t>("ncclTunerPlugin_v5");
  env("mkernel", nullptr, "dgx-h100.xml", "nvswitch-8gpu.nvl");
  ncclNvlDomainInfo_v5_t oneRankDomains{8, 1, 1};  // every rank alone in its domain
  void* ctx = nullptr;
  REQUIRE(v5->init(&ctx, 9, 8, 1, captureLog, &oneRankDomains, nullptr) == ncclSuccess);
  Table t;
  int ch = 0;
  REQUIRE(v5->getCollInfo(ctx, ncclFuncAllReduce, 512 * KiB, 1, t.ptr(), kA, kP, 0, &ch) ==
          ncclSuccess);
  CHECK(t.pick() == Pick(RING, SIMPLE));  // PCIe rules: no LL128 preference
  REQUIRE(v5->finalize(ctx) == ncclSuccess);
}

TEST_CASE("tuner plugin v4: PCIe-only 4-GPU fixture") {
  auto* v4 = sym<ncclTuner_v4_t>("ncclTunerPlugin_v4");
  env(nullptr, "1", "pcie-4gpu.xml", "none.nvl");
  void* ctx = nullptr;
  REQUIRE(v4->init(4, 1, captureLog, &ctx) == ncclSuccess);
  auto call = [&](int coll, size_t bytes, Table* t, int* ch) {
    return v4->getCollInfo(ctx, static_cast<ncclFunc_t>(coll), bytes, 1, t->ptr(), kA, kP, 0, ch);
  };
  CHECK(sweep(call) == kSweepCalls);
  Table s, m;
  int ch = 0;
  REQUIRE(call(4, 1 * KiB, &s, &ch) == ncclSuccess);
  CHECK(s.pick() == Pick(RING, LL));
  REQUIRE(call(4, 512 * KiB, &m, &ch) == ncclSuccess);
  CHECK(m.pick() == Pick(RING, SIMPLE));
  REQUIRE(v4->destroy(ctx) == ncclSuccess);
}

TEST_CASE("tuner plugin v3: two-socket fixture across 2 nodes, with user rules") {
  auto* v3 = sym<ncclTuner_v3_t>("ncclTunerPlugin_v3");
  env("mkernel", nullptr, "2socket-nics-on-0.xml", "none.nvl");
  std::string rulesPath = std::string(MKERNEL_TEST_TMPDIR) + "/tuner_rules.conf";
  FILE* f = std::fopen(rulesPath.c_str(), "w");
  REQUIRE(f != nullptr);
  std::fputs("# test rules\nallreduce,0,2K,ring,ll,99\nthis line is wrong\n", f);
  std::fclose(f);
  setenv("MKERNEL_TUNER_CONFIG", rulesPath.c_str(), 1);
  mkernel::params::resetForTesting();
  gLog.clear();
  void* ctx = nullptr;
  REQUIRE(v3->init(8, 2, captureLog, &ctx) == ncclSuccess);
  CHECK(logged("1 rule(s)"));
  CHECK(logged("line 3"));
  auto call = [&](int coll, size_t bytes, Table* t, int* ch) {
    return v3->getCollInfo(ctx, static_cast<ncclFunc_t>(coll), bytes, 1, t->ptr(), kA, kP, ch);
  };
  CHECK(sweep(call) == kSweepCalls);
  Table r, s, l;
  int ch = 0;
  REQUIRE(call(4, 1 * KiB, &r, &ch) == ncclSuccess);
  CHECK(r.pick() == Pick(RING, LL));  // the rule
  CHECK(ch == 64);                    // 99 clamped
  ch = 0;
  REQUIRE(call(4, 16 * KiB, &s, &ch) == ncclSuccess);
  CHECK(s.pick() == Pick(TREE, LL));  // policy: across nodes, small
  CHECK(ch == 0);
  REQUIRE(call(4, 256 * MiB, &l, &ch) == ncclSuccess);
  CHECK(l.pick() == Pick(RING, SIMPLE));
  REQUIRE(v3->destroy(ctx) == ncclSuccess);
  unsetenv("MKERNEL_TUNER_CONFIG");
  mkernel::params::resetForTesting();
}

TEST_CASE("tuner plugin v2: one algorithm/protocol back, respecting NVLS/CollNet support") {
  auto* v2 = sym<ncclTuner_v2_t>("ncclTunerPlugin_v2");
  env("mkernel", nullptr, "dgx-h100.xml", "nvswitch-8gpu.nvl");
  setenv("MKERNEL_NVLS", "1", 1);
  mkernel::params::resetForTesting();
  void* ctx = nullptr;
  REQUIRE(v2->init(4, 4, captureLog, &ctx) == ncclSuccess);  // one GPU per node
  int algo = -1, proto = -1, ch = 0;
  REQUIRE(v2->getCollInfo(ctx, ncclFuncAllGather, 16 * KiB, 0, 0, 1, &algo, &proto, &ch) ==
          ncclSuccess);
  CHECK(algo == PAT);
  CHECK(proto == SIMPLE);
  algo = proto = -1;
  REQUIRE(v2->getCollInfo(ctx, ncclFuncAllReduce, 1 * GiB, 0, 0, 1, &algo, &proto, &ch) ==
          ncclSuccess);
  CHECK(algo == RING);  // NVLS allowed by the user, but NCCL says unsupported
  CHECK(proto == SIMPLE);
  algo = proto = -1;
  REQUIRE(v2->getCollInfo(ctx, static_cast<ncclFunc_t>(ncclFuncSendRecv), 1024, 0, 0, 1, &algo,
                          &proto, &ch) == ncclSuccess);
  CHECK(algo == -1);  // not a collective the tuner steers: NCCL keeps its own choice
  CHECK(proto == -1);
  REQUIRE(v2->destroy(ctx) == ncclSuccess);
  unsetenv("MKERNEL_NVLS");
  mkernel::params::resetForTesting();

  env(nullptr, nullptr, "dgx-h100.xml", "nvswitch-8gpu.nvl");  // neutral
  REQUIRE(v2->init(8, 1, captureLog, &ctx) == ncclSuccess);
  algo = proto = -1;
  REQUIRE(v2->getCollInfo(ctx, ncclFuncAllReduce, 1 * MiB, 0, 0, 1, &algo, &proto, &ch) ==
          ncclSuccess);
  CHECK(algo == -1);
  CHECK(proto == -1);
  REQUIRE(v2->destroy(ctx) == ncclSuccess);
}

TEST_CASE("tuner plugin v6: v5's policy, NCCL's chunk size (getChunkSize NULL)") {
  auto* v6 = sym<ncclTuner_v6_t>("ncclTunerPlugin_v6");
  auto* v5 = sym<ncclTuner_v5_t>("ncclTunerPlugin_v5");
  CHECK(v6->getChunkSize == nullptr);  // optional in v6: NULL keeps NCCL's computed chunk size
  env("/opt/x/libnccl-tuner-mkernel.so", nullptr, "dgx-h100.xml", "nvswitch-8gpu.nvl");
  ncclNvlDomainInfo_v6_t nvl{1, 8, 8};
  void* c6 = nullptr;
  void* c5 = nullptr;
  REQUIRE(v6->init(&c6, 11, 8, 1, captureLog, &nvl, nullptr) == ncclSuccess);
  REQUIRE(v5->init(&c5, 12, 8, 1, captureLog, &nvl, nullptr) == ncclSuccess);
  // Every size of every collective gets the same choice through either table.
  for (int coll = 0; coll < 5; ++coll)
    for (size_t bytes = 8; bytes <= 1 * GiB; bytes *= 8) {
      INFO("coll " << coll << " bytes " << bytes);
      Table a, b;
      int cha = 0, chb = 0;
      REQUIRE(v6->getCollInfo(c6, static_cast<ncclFunc_t>(coll), bytes, 1, a.ptr(), kA, kP, 0,
                              &cha) == ncclSuccess);
      REQUIRE(v5->getCollInfo(c5, static_cast<ncclFunc_t>(coll), bytes, 1, b.ptr(), kA, kP, 0,
                              &chb) == ncclSuccess);
      CHECK(a.pick() == b.pick());
      CHECK(cha == chb);
    }
  REQUIRE(v6->finalize(c6) == ncclSuccess);
  REQUIRE(v5->finalize(c5) == ncclSuccess);
}
