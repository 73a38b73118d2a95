#include "plugin/tuner/tuner_core.h"

#include <dlfcn.h>
#include <strings.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "collectives/tuner_policy.h"
#include "common/param.h"
#include "common/version.h"
#include "topology/topology.h"

namespace mkernel {
namespace tuner {
namespace {

struct TunerContext {
  uint64_t commId = 0;
  bool active = false;
  coll::TunerSystem sys;
  std::vector<coll::TunerRule> rules;
  // One INFO line per (collective, size class) decision, so the log shows the policy at work
  // without a line per collective call.
  std::atomic<uint32_t> logged{0};
};

// What the policy needs from the node's topology. Discovery (hwloc with I/O, NVML) costs tens of
// milliseconds, so it runs once per process per MKERNEL_TOPO_XML / MKERNEL_NVLINK_MATRIX pair.
struct NodeFacts {
  bool known = false;
  bool nvlink = false;
  bool nvswitch = false;
  int nGpus = 0;
};

NodeFacts nodeFacts() {
  static std::mutex mu;
  static std::map<std::string, NodeFacts> cache;
  topo::DiscoverOptions opts = topo::defaultDiscoverOptions();
  // The job may see one GPU per process; the NVLink layout is a property of the whole node.
  opts.applyCudaVisibleDevices = false;
  opts.useVerbs = false;
  std::string key = opts.hwlocXml + '\n' + opts.nvlinkMatrixFile;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  NodeFacts f;
  topo::Topology t;
  if (topo::discoverTopology(opts, &t) == Result::Success) {
    f.nGpus = static_cast<int>(t.gpus.size());
    f.known = !t.nvlinkSource.empty() || f.nGpus <= 1;
    bool all = f.nGpus >= 2;
    for (int a = 0; a < f.nGpus; ++a)
      for (int b = a + 1; b < f.nGpus; ++b) all = all && t.nvlink.pairLinks(a, b) > 0;
    f.nvlink = all;
    f.nvswitch = t.nvlink.hasNvswitch();
  }
  cache[key] = f;
  return f;
}

}  // namespace

bool tunerRequested(std::string* why) {
  if (params::TUNER.is("1")) {
    *why = "MKERNEL_TUNER=1";
    return true;
  }
  if (params::TUNER.is("0")) {
    *why = "MKERNEL_TUNER=0";
    return false;
  }
  const char* plugin = std::getenv("NCCL_TUNER_PLUGIN");
  if (plugin != nullptr && strcasestr(plugin, "mkernel") != nullptr) {
    *why = std::string("NCCL_TUNER_PLUGIN=") + plugin;
    return true;
  }
  *why = plugin ? std::string("NCCL_TUNER_PLUGIN=") + plugin + " does not name mkernel"
                : std::string("NCCL_TUNER_PLUGIN unset (loaded through the net plugin)");
  return false;
}

Result tunerInit(uint64_t commId, size_t nRanks, size_t nNodes, NcclLogger logger,
                 const NvlDomainSummary& nvl, void** context) {
  if (context == nullptr)
    return MK_ERROR(Result::InvalidArgument, "tuner init: null context pointer");
  if (logger != nullptr) setNcclLogger(logger);
  params::warnUnknownOnce();
  std::unique_ptr<TunerContext> ctx(new (std::nothrow) TunerContext());
  if (!ctx) return MK_ERROR(Result::SystemError, "tuner init: out of memory");
  ctx->commId = commId;
  std::string why;
  ctx->active = tunerRequested(&why);
  // The startup line, once per process, at the first communicator's init (NCCL's logger is set).
  static std::once_flag announced;
  std::call_once(announced, [&why, active = ctx->active] {
    Dl_info self{};
    const char* path =
        dladdr(reinterpret_cast<void*>(&tunerInit), &self) != 0 && self.dli_fname != nullptr
            ? self.dli_fname
            : "?";
    logStartupLine("mkernel %s loaded as NCCL tuner plugin from %s; %s (%s)",
                   MKERNEL_VERSION_STRING, path,
                   active ? "steers NCCL's algorithm and protocol choices"
                          : "stays neutral, NCCL's choices unchanged",
                   why.c_str());
  });
  if (!ctx->active) {
    MK_INFO(kLogInit | kLogTune,
            "tuner: neutral, NCCL's choices unchanged (%s; set MKERNEL_TUNER=1 or "
            "NCCL_TUNER_PLUGIN=mkernel to steer)",
            why.c_str());
    *context = ctx.release();
    return Result::Success;
  }

  coll::TunerSystem& s = ctx->sys;
  s.nRanks = nRanks > 0 ? static_cast<int>(nRanks) : 1;
  s.nNodes = nNodes > 0 ? static_cast<int>(nNodes) : 1;
  s.ranksPerNode = (s.nRanks + s.nNodes - 1) / s.nNodes;
  s.nvlsAllowed = params::NVLS();
  NodeFacts facts = nodeFacts();
  s.topologyKnown = facts.known;
  s.nvlink = facts.nvlink;
  s.nvswitch = facts.nvswitch;
  if (nvl.nNvlDomains > 0) {
    // NCCL's domains describe this communicator's ranks, which the node model cannot: a domain of
    // one rank means its traffic leaves the GPU over PCIe or the network.
    bool nvlinkFromNccl = nvl.minRanksPerDomain >= 2;
    if (facts.known && nvlinkFromNccl != facts.nvlink)
      MK_INFO(kLogTune,
              "tuner: NCCL reports %d NVLink domain(s) of %d..%d ranks; using that over the node "
              "model (nvlink=%d)",
              nvl.nNvlDomains, nvl.minRanksPerDomain, nvl.maxRanksPerDomain, facts.nvlink ? 1 : 0);
    s.nvlink = nvlinkFromNccl;
    if (!nvlinkFromNccl) s.nvswitch = false;
    s.topologyKnown = true;
  }

  const std::string& rulesPath = params::TUNER_CONFIG();
  if (!rulesPath.empty()) {
    std::vector<std::string> warnings;
    if (coll::loadTunerRulesFile(rulesPath, &ctx->rules, &warnings) != Result::Success)
      MK_WARN("tuner: %s has no usable rule; using the built-in policy only", rulesPath.c_str());
    for (const std::string& w : warnings) MK_WARN("tuner: %s %s", rulesPath.c_str(), w.c_str());
  }
  MK_INFO(kLogInit | kLogTune,
          "tuner: steering NCCL (%s): comm 0x%llx, %d rank(s), %d node(s), %d per node, %s%s%s, "
          "%zu rule(s)%s",
          why.c_str(), static_cast<unsigned long long>(commId), s.nRanks, s.nNodes, s.ranksPerNode,
          s.topologyKnown ? "" : "topology unknown, ",
          s.nvswitch ? "NVSwitch" : (s.nvlink ? "NVLink" : "PCIe"),
          s.nvlsAllowed ? ", NVLS allowed" : "", ctx->rules.size(),
          rulesPath.empty() ? "" : (" from " + rulesPath).c_str());
  *context = ctx.release();
  return Result::Success;
}

void tunerGetCollInfo(void* context, int coll, size_t nBytes, float* table, int numAlgo,
                      int numProto, int* nChannels) {
  TunerContext* ctx = static_cast<TunerContext*>(context);
  if (ctx == nullptr || !ctx->active) return;
  coll::TunerDecision d = coll::applyTunerPolicy(ctx->sys, ctx->rules, coll, nBytes, table, numAlgo,
                                                 numProto, nChannels);
  if (coll < 0 || coll >= coll::kNumCollTypes) {
    MK_TRACE(kLogTune, "tuner: coll %d (%zu bytes): %s", coll, nBytes, d.reason);
    return;
  }
  uint32_t bit = 1u << (coll * 3 + static_cast<int>(coll::tunerSizeClass(ctx->sys, nBytes)));
  if ((ctx->logged.fetch_or(bit, std::memory_order_relaxed) & bit) == 0) {
    MK_INFO(kLogTune, "tuner: %s %zu bytes (%s) -> %s/%s%s%s: %s",
            coll::collName(static_cast<coll::CollType>(coll)), nBytes,
            coll::sizeClassName(coll::tunerSizeClass(ctx->sys, nBytes)),
            d.algo >= 0 ? coll::tunerAlgoName(d.algo) : "NCCL's",
            d.proto >= 0 ? coll::tunerProtoName(d.proto) : "choice",
            d.nChannels > 0 ? ", channels " : "",
            d.nChannels > 0 ? std::to_string(d.nChannels).c_str() : "", d.reason);
  }
}

Result tunerFinalize(void* context) {
  delete static_cast<TunerContext*>(context);
  return Result::Success;
}

}  // namespace tuner
}  // namespace mkernel
