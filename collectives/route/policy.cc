#include "collectives/policy.h"

#include <strings.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <vector>

#include "common/log.h"
#include "common/param.h"
#include "common/text.h"

namespace mkernel {
namespace coll {
namespace {

struct CollKey {
  const char* name;
  CollType coll;
};
const CollKey kCollKeys[] = {{"allreduce", CollType::AllReduce},
                             {"allgather", CollType::AllGather},
                             {"reducescatter", CollType::ReduceScatter},
                             {"broadcast", CollType::Broadcast},
                             {"reduce", CollType::Reduce}};

bool validEnums(const PolicyQuery& q) {
  int c = static_cast<int>(q.coll), t = static_cast<int>(q.dtype), o = static_cast<int>(q.op);
  return c >= 0 && c < kNumCollTypes && t >= 0 && t < kNumDataTypes && o >= 0 && o < kNumRedOps;
}

}  // namespace

const char* execPathName(ExecPath p) {
  switch (p) {
    case ExecPath::Mkernel:
      return "mkernel";
    case ExecPath::Nccl:
      return "nccl";
    case ExecPath::Unsupported:
      return "unsupported";
  }
  return "?";
}

Result parseCollectiveList(const std::string& text, uint32_t* mask) {
  uint32_t m = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string tok =
        trim(text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (strcasecmp(tok.c_str(), "all") == 0) {
      m |= (1u << kNumCollTypes) - 1;
    } else if (strcasecmp(tok.c_str(), "none") == 0 || tok.empty()) {
      // nothing to add ("none", or an empty item of "a,,b")
    } else {
      bool found = false;
      for (const CollKey& k : kCollKeys)
        if (strcasecmp(tok.c_str(), k.name) == 0) {
          m |= 1u << static_cast<int>(k.coll);
          found = true;
        }
      if (!found)
        return MK_ERROR(Result::InvalidArgument,
                        "MKERNEL_COLLECTIVES: unknown collective '%s' (use allreduce, allgather, "
                        "reducescatter, broadcast, reduce, all or none, comma-separated)",
                        tok.c_str());
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  *mask = m;
  return Result::Success;
}

Result parseAlgoName(const std::string& text, int* algo) {
  std::string t = trim(text);
  if (t.empty() || strcasecmp(t.c_str(), "auto") == 0) {
    *algo = -1;
    return Result::Success;
  }
  for (int a = 0; a < kNumAlgos; ++a)
    if (strcasecmp(t.c_str(), algoName(static_cast<Algo>(a))) == 0) {
      *algo = a;
      return Result::Success;
    }
  return MK_ERROR(Result::InvalidArgument,
                  "MKERNEL_ALGO='%s' is not an algorithm (use auto, oneshot, twoshot, direct or "
                  "ring)",
                  t.c_str());
}

Result loadPolicyConfig(PolicyConfig* cfg) {
  PolicyConfig c = *cfg;
  c.disabled = params::DISABLE();
  MK_CHECK(parseCollectiveList(params::COLLECTIVES.text(), &c.collMask));
  MK_CHECK(parseAlgoName(params::ALGO.text(), &c.forcedAlgo));
  c.oneShotMaxBytes = static_cast<size_t>(params::ONESHOT_MAX_BYTES());
  c.maxBytes = static_cast<size_t>(params::MAX_BYTES());
  c.ringChunkBytes = static_cast<size_t>(params::RING_CHUNK_BYTES());
  c.ncclCrossover = params::NCCL_CROSSOVER.is("auto");
  const std::string& model = params::COST_MODEL();
  std::vector<std::string> given;
  std::string why;
  if (!parseCostParams(model, &c.costModel, &given, &why))
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_COST_MODEL='%s': %s", model.c_str(),
                    why.c_str());
  for (const std::string& g : given) {
    c.costNicGiven = c.costNicGiven || g == "nic-gbps";
    c.costNicsGiven = c.costNicsGiven || g == "nics";
    c.costRailGiven = c.costRailGiven || g == "rail";
  }
  *cfg = c;
  return Result::Success;
}

CostParams policyModelFor(const PolicyConfig& cfg, int nRanks, int nNodes) {
  CostParams p = cfg.costModel;
  p.nodes = std::max(1, nNodes);
  p.gpusPerNode = std::max(1, (std::max(1, nRanks) + p.nodes - 1) / p.nodes);
  if (!cfg.costNicGiven && cfg.railMbps > 0) p.nicGBps = cfg.railMbps / 8000.0 * kNicEfficiency;
  if (!cfg.costNicsGiven) p.nicsPerNode = p.gpusPerNode;
  if (!cfg.costRailGiven && cfg.hierRail >= 0) p.rail = cfg.hierRail;
  return p;
}

size_t ncclCrossoverBytes(CollType c, int nRanks, int nNodes, bool directAccess, bool staged) {
  if (nRanks != 2 || nNodes != 1 || !directAccess) return 0;
  switch (c) {
    case CollType::Reduce:
      return size_t(512) << 10;
    case CollType::Broadcast:
      return size_t(2) << 20;
    case CollType::AllReduce:
      return staged ? size_t(4) << 20 : size_t(512) << 20;
    case CollType::AllGather:
      return staged ? size_t(4) << 20 : 0;
    case CollType::ReduceScatter:
      return staged ? size_t(16) << 20 : 0;
    default:
      return 0;
  }
}

size_t policyBytes(const PolicyQuery& q) {
  size_t es = dataTypeSize(q.dtype);
  size_t mult = (q.coll == CollType::AllGather || q.coll == CollType::ReduceScatter)
                    ? static_cast<size_t>(q.nRanks > 0 ? q.nRanks : 1)
                    : 1;
  size_t unit = es * mult;
  if (unit != 0 && q.count > std::numeric_limits<size_t>::max() / unit)
    return std::numeric_limits<size_t>::max();
  return q.count * unit;
}

int policySizeBucket(size_t bytes) {
  int b = 0;
  while (bytes != 0) {
    ++b;
    bytes >>= 1;
  }
  return b;
}

PolicyDecision SelectionPolicy::decide(const PolicyQuery& q) const {
  PolicyDecision d;
  // Rules 1-5: mkernel cannot (or must not) run it.
  const char* refuse = nullptr;
  if (!validEnums(q)) {
    refuse = "collective, datatype or op value unknown to mkernel";
  } else if (cfg_.disabled) {
    refuse = "MKERNEL_DISABLE=1";
  } else if ((cfg_.collMask & (1u << static_cast<int>(q.coll))) == 0) {
    refuse = "collective not in MKERNEL_COLLECTIVES";
  } else if (q.nNodes > 1 && !cfg_.kernelMultiNode) {
    refuse = "more than one node: the kernel has no inter-node path";
  } else if (q.nRanks > cfg_.kernelMaxRanks || q.nRanks < 1) {
    refuse = "more ranks than one persistent kernel addresses";
  }
  if (refuse != nullptr) {
    d.path = cfg_.emulate ? ExecPath::Unsupported : ExecPath::Nccl;
    d.reason = refuse;
    return d;
  }
  // Rule 6: a performance limit, not a capability: emulation runs everything it can.
  const size_t bytes = policyBytes(q);
  if (!cfg_.emulate && cfg_.maxBytes != 0 && bytes > cfg_.maxBytes) {
    d.path = ExecPath::Nccl;
    d.reason = "larger than MKERNEL_MAX_BYTES";
    return d;
  }
  // Rule 6b: where NCCL measured faster (ncclCrossoverBytes), unless MKERNEL_NCCL_CROSSOVER=off.
  if (!cfg_.emulate && cfg_.ncclCrossover) {
    const size_t from =
        ncclCrossoverBytes(q.coll, q.nRanks, q.nNodes, cfg_.directAccess, cfg_.stagedRanks);
    if (from != 0 && bytes >= from) {
      d.path = ExecPath::Nccl;
      d.reason = "NCCL measured faster from this size (MKERNEL_NCCL_CROSSOVER=auto)";
      return d;
    }
  }
  // Rule 6c: several nodes, where the cost model predicts NCCL faster (the collectives it models),
  // unless MKERNEL_NCCL_CROSSOVER=off. Its inputs are shared by every rank: the query's shape,
  // MKERNEL_COST_MODEL and the communicator's agreed rail NIC and form.
  if (!cfg_.emulate && cfg_.ncclCrossover && q.nNodes > 1 &&
      (q.coll == CollType::AllReduce || q.coll == CollType::ReduceScatter ||
       q.coll == CollType::AllGather)) {
    const CollCost c = predictCollective(policyModelFor(cfg_, q.nRanks, q.nNodes), q.coll,
                                         static_cast<double>(bytes));
    d.modelNcclUs = c.ncclUs;
    d.modelMkUs = c.mkPipelinedUs;
    std::snprintf(d.modelNcclChoice, sizeof(d.modelNcclChoice), "%s", c.ncclChoice.c_str());
    if (c.ncclUs < c.mkPipelinedUs) {
      d.path = ExecPath::Nccl;
      d.reason =
          "the cost model predicts NCCL faster (MKERNEL_NCCL_CROSSOVER=auto, MKERNEL_COST_MODEL)";
      return d;
    }
  }
  // Rule 7: mkernel, and the algorithm.
  d.path = ExecPath::Mkernel;
  if (cfg_.forcedAlgo >= 0 && algoSupports(q.coll, static_cast<Algo>(cfg_.forcedAlgo))) {
    d.algo = static_cast<Algo>(cfg_.forcedAlgo);
    d.reason = "MKERNEL_ALGO";
  } else if (!cfg_.directAccess) {
    d.algo = Algo::Ring;
    d.reason = "no direct peer access: ring (below MKERNEL_RING_MIN_BYTES: the LL mode)";
  } else if (q.coll == CollType::AllReduce) {
    bool small = bytes <= cfg_.oneShotMaxBytes;
    d.algo = small ? Algo::OneShot : Algo::TwoShot;
    d.reason = small ? "up to MKERNEL_ONESHOT_MAX_BYTES" : "above MKERNEL_ONESHOT_MAX_BYTES";
  } else {
    d.algo = Algo::Direct;
    d.reason = "direct peer access";
  }
  return d;
}

PolicyDecision SelectionPolicy::select(const PolicyQuery& q) {
  PolicyDecision d = decide(q);
  LogSink sink = nullptr;
  void* ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sink = sink_;
    ctx = sinkCtx_;
  }
  if (sink == nullptr && !logEnabled(LogLevel::Info, kLogColl)) return d;
  const int bucket = policySizeBucket(policyBytes(q));
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(q.coll) & 0xff) << 24) |
      (static_cast<uint64_t>(bucket) << 16) | (static_cast<uint64_t>(d.path) << 8) |
      static_cast<uint64_t>(d.path == ExecPath::Mkernel ? static_cast<int>(d.algo) : 0xff);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!logged_.insert(key).second) return d;
  }
  char sizes[64];
  if (bucket == 0) {
    std::snprintf(sizes, sizeof(sizes), "0 B");
  } else {
    size_t lo = size_t(1) << (bucket - 1);
    std::snprintf(sizes, sizeof(sizes), "%zu-%zu B", lo, lo + (lo - 1));
  }
  char model[128] = "";
  if (d.modelMkUs > 0)
    std::snprintf(model, sizeof(model), "; cost model at %zu B: NCCL %s %.1f us, mkernel %.1f us",
                  policyBytes(q), d.modelNcclChoice, d.modelNcclUs, d.modelMkUs);
  char line[448];
  std::snprintf(line, sizeof(line), "policy: %s %s (%s %s, %d ranks, %d nodes) -> %s%s%s (%s%s)",
                validEnums(q) ? collName(q.coll) : "?", sizes,
                validEnums(q) ? dataTypeName(q.dtype) : "?", validEnums(q) ? redOpName(q.op) : "?",
                q.nRanks, q.nNodes, execPathName(d.path), d.path == ExecPath::Mkernel ? "/" : "",
                d.path == ExecPath::Mkernel ? algoName(d.algo) : "", d.reason, model);
  if (sink != nullptr) {
    sink(ctx, line);
  } else {
    MK_INFO(kLogColl, "%s", line);
  }
  return d;
}

Result SelectionPolicy::unsupportedError(const PolicyQuery& q, const PolicyDecision& d) const {
  return MK_ERROR(Result::InvalidUsage,
                  "mkernel emulation (MKERNEL_EMULATE=1, no real NCCL) cannot run %s of %zu "
                  "elements (%s %s, %d ranks, %d nodes): %s",
                  validEnums(q) ? collName(q.coll) : "this collective", q.count,
                  validEnums(q) ? dataTypeName(q.dtype) : "?",
                  validEnums(q) ? redOpName(q.op) : "?", q.nRanks, q.nNodes, d.reason);
}

void SelectionPolicy::setLogSink(LogSink sink, void* ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  sink_ = sink;
  sinkCtx_ = ctx;
}

}  // namespace coll
}  // namespace mkernel
