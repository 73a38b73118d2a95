#include "collectives/tuner_policy.h"

#include <strings.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/log.h"
#include "common/text.h"

namespace mkernel {
namespace coll {
namespace {

const char* const kAlgoNames[kTunerNumAlgos] = {
    "TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT"};
const char* const kProtoNames[kTunerNumProtos] = {"LL", "LL128", "SIMPLE"};
const char* const kCollNames[kNumCollTypes] = {"broadcast", "reduce", "allgather", "reducescatter",
                                               "allreduce"};

// NCCL never selects an entry at or above this cost (its "effectively infinite" bound).
constexpr float kNcclMaxUsableCost = 3.6e9f;

// Protocol preference per size class: the first is the policy's pick, the rest are fallbacks
// for when NCCL disabled it (e.g. LL128 off on this GPU or path).
struct ProtoOrder {
  int n;
  int p[kTunerNumProtos];
};
ProtoOrder protoOrder(const TunerSystem& sys, SizeClass sc) {
  switch (sc) {
    case SizeClass::Small:
      return {3, {kProtoLL, kProtoLL128, kProtoSimple}};
    case SizeClass::Medium:
      if (sys.nvlink) return {3, {kProtoLL128, kProtoSimple, kProtoLL}};
      return {3, {kProtoSimple, kProtoLL128, kProtoLL}};
    case SizeClass::Large:
      break;
  }
  return {3, {kProtoSimple, kProtoLL128, kProtoLL}};
}

void addAlgo(TunerCandidates* c, int algo, const ProtoOrder& po) {
  for (int i = 0; i < po.n; ++i) c->add(algo, po.p[i]);
}

bool usable(const float* table, int numProto, int algo, int proto) {
  float v = table[algo * numProto + proto];
  return v >= 0.0f && v < kNcclMaxUsableCost;  // false for -1 (ignored) and for NaN
}

bool ruleMatches(const TunerRule& r, int coll, size_t nBytes, const TunerSystem& sys) {
  return (r.coll == kTunerAny || r.coll == coll) && nBytes >= r.minBytes && nBytes <= r.maxBytes &&
         (r.nNodes == kTunerAny || r.nNodes == sys.nNodes) &&
         (r.nRanks == kTunerAny || r.nRanks == sys.nRanks);
}

bool isAny(const std::string& s) {
  return s == "*" || s == "-1" || strcasecmp(s.c_str(), "any") == 0;
}

// A name from `names` (case-insensitive), its index as a number, or "*"/"any"/-1.
bool parseEnum(const std::string& s, const char* const* names, int n, int* out) {
  if (isAny(s)) {
    *out = kTunerAny;
    return true;
  }
  for (int i = 0; i < n; ++i)
    if (strcasecmp(s.c_str(), names[i]) == 0) {
      *out = i;
      return true;
    }
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (end != s.c_str() && *end == '\0' && v >= 0 && v < n) {
    *out = static_cast<int>(v);
    return true;
  }
  return false;
}

// Bytes with an optional binary suffix: 4096, 64K, 16M, 4G.
bool parseBytes(const std::string& s, size_t* out) {
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str() || errno != 0 || s[0] == '-') return false;
  std::string suffix(end);
  unsigned shift = 0;
  if (suffix.empty())
    shift = 0;
  else if (strcasecmp(suffix.c_str(), "K") == 0)
    shift = 10;
  else if (strcasecmp(suffix.c_str(), "M") == 0)
    shift = 20;
  else if (strcasecmp(suffix.c_str(), "G") == 0)
    shift = 30;
  else
    return false;
  if (shift > 0 && v > (~0ull >> shift)) return false;
  *out = static_cast<size_t>(v << shift);
  return true;
}

bool parseCount(const std::string& s, int* out) {
  if (isAny(s)) {
    *out = kTunerAny;
    return true;
  }
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0' || v < 0 || v > 1 << 20) return false;
  *out = static_cast<int>(v);
  return true;
}

}  // namespace

const char* tunerAlgoName(int algo) {
  return algo >= 0 && algo < kTunerNumAlgos ? kAlgoNames[algo] : "?";
}
const char* tunerProtoName(int proto) {
  return proto >= 0 && proto < kTunerNumProtos ? kProtoNames[proto] : "?";
}

SizeBounds tunerSizeBounds(const TunerSystem& sys) {
  if (sys.nNodes <= 1) return sys.nvlink ? kBoundsOneNodeNvlink : kBoundsOneNodePcie;
  return sys.nvlink ? kBoundsMultiNodeNvlink : kBoundsMultiNodePcie;
}

SizeClass tunerSizeClass(const TunerSystem& sys, size_t nBytes) {
  const SizeBounds b = tunerSizeBounds(sys);
  if (nBytes <= b.smallMax) return SizeClass::Small;
  if (nBytes <= b.mediumMax) return SizeClass::Medium;
  return SizeClass::Large;
}

const char* sizeClassName(SizeClass c) {
  switch (c) {
    case SizeClass::Small:
      return "small";
    case SizeClass::Medium:
      return "medium";
    case SizeClass::Large:
      return "large";
  }
  return "?";
}

void TunerCandidates::add(int a, int p) {
  for (int i = 0; i < n; ++i)
    if (algo[i] == a && proto[i] == p) return;
  if (n == kMaxTunerCandidates) return;
  algo[n] = a;
  proto[n] = p;
  ++n;
}

// Whether NCCL's tree has fewer latency steps than its ring for an AllReduce: 2 x ((ranks per
// node - 1) + ceil(log2 nodes)) against 2 x (ranks - 1).
static bool treeFewerSteps(const TunerSystem& sys) {
  int log2Nodes = 0;
  while ((1 << log2Nodes) < sys.nNodes) ++log2Nodes;
  const int perNode = sys.ranksPerNode > 0 ? sys.ranksPerNode : 1;
  const int ranks = sys.nRanks > 0 ? sys.nRanks : perNode * sys.nNodes;
  return (perNode - 1) + log2Nodes < ranks - 1;
}

TunerCandidates policyCandidates(const TunerSystem& sys, CollType coll, size_t nBytes) {
  TunerCandidates c;
  const SizeClass sc = tunerSizeClass(sys, nBytes);
  const ProtoOrder po = protoOrder(sys, sc);
  const ProtoOrder simpleFirst = {1, {kProtoSimple}};
  const bool multiNode = sys.nNodes > 1;
  switch (coll) {
    case CollType::AllReduce:
      if (!multiNode) {
        if (sys.nvlsAllowed && sys.nvswitch && sc == SizeClass::Large) {
          c.add(kAlgoNvls, kProtoSimple);
          c.reason = "allreduce, one node, NVSwitch, large, MKERNEL_NVLS=1: NVLS/SIMPLE";
        } else {
          c.reason =
              "allreduce on one node: RING (full bandwidth; NCCL's intra-node tree is a chain)";
        }
        addAlgo(&c, kAlgoRing, po);
        addAlgo(&c, kAlgoTree, po);
      } else if (sc != SizeClass::Large && treeFewerSteps(sys)) {
        c.reason =
            "allreduce across nodes, small/medium: TREE (latency grows with log(nodes), not ranks)";
        addAlgo(&c, kAlgoTree, po);
        addAlgo(&c, kAlgoRing, po);
      } else if (sc != SizeClass::Large) {
        // 2 or 3 nodes of one rank: the tree's log(nodes) hops are as many as the ring's, so
        // nothing favours it (two H200s over the net path: TREE/LL at 2 KiB 0.74x
        // of NCCL's own choice).
        c.reason = "allreduce across few nodes, small/medium: RING (a tree takes as many steps)";
        addAlgo(&c, kAlgoRing, po);
        addAlgo(&c, kAlgoTree, po);
      } else {
        if (sys.nvlsAllowed && sys.nvswitch) {
          c.add(kAlgoNvlsTree, kProtoSimple);
          c.reason = "allreduce across nodes, large, NVSwitch, MKERNEL_NVLS=1: NVLS_TREE/SIMPLE";
        } else {
          c.reason = "allreduce across nodes, large: RING (bandwidth-optimal on rail-aligned NICs)";
        }
        addAlgo(&c, kAlgoRing, po);
        addAlgo(&c, kAlgoTree, po);
      }
      break;
    case CollType::AllGather:
    case CollType::ReduceScatter:
      if (multiNode && sys.ranksPerNode == 1 && sc != SizeClass::Large) {
        // PAT exists for one rank per node only, and only with SIMPLE.
        addAlgo(&c, kAlgoPat, simpleFirst);
        c.reason = "allgather/reducescatter, one GPU per node, small/medium: PAT (log steps)";
      } else if (!multiNode && sys.nvlsAllowed && sys.nvswitch && sc == SizeClass::Large) {
        c.add(kAlgoNvls, kProtoSimple);
        c.reason =
            "allgather/reducescatter, one node, NVSwitch, large, MKERNEL_NVLS=1: NVLS/SIMPLE";
      } else {
        c.reason = "allgather/reducescatter: RING";
      }
      addAlgo(&c, kAlgoRing, po);
      break;
    case CollType::Broadcast:
    case CollType::Reduce:
      c.reason = "broadcast/reduce: RING (NCCL's only algorithm for them)";
      addAlgo(&c, kAlgoRing, po);
      break;
  }
  return c;
}

TunerDecision applyTunerPolicy(const TunerSystem& sys, const std::vector<TunerRule>& rules,
                               int coll, size_t nBytes, float* table, int numAlgo, int numProto,
                               int* nChannels) {
  TunerDecision d;
  if (coll < 0 || coll >= kNumCollTypes) {
    d.reason = "not one of the five collectives the tuner steers: table untouched";
    return d;
  }
  if (table == nullptr || numProto != kTunerNumProtos || numAlgo < 1 || numAlgo > kTunerNumAlgos) {
    d.reason = "unexpected cost-table shape: table untouched";
    return d;
  }
  const TunerCandidates policy = policyCandidates(sys, static_cast<CollType>(coll), nBytes);
  TunerCandidates chosen = policy;
  d.reason = policy.reason;

  for (const TunerRule& r : rules) {
    if (!ruleMatches(r, coll, nBytes, sys)) continue;
    d.ruleLine = r.line;
    if (r.nChannels > 0 && nChannels != nullptr) {
      *nChannels = std::min(std::max(r.nChannels, 1), kTunerMaxChannels);
      d.nChannels = *nChannels;
      d.changed = true;
    }
    if (r.algo == kTunerAny && r.proto == kTunerAny) {
      d.reason = "rule without algorithm/protocol: NCCL's choice kept";
      return d;
    }
    // The rule's combinations, in the policy's order first, then any other matching entry.
    TunerCandidates fromRule;
    for (int i = 0; i < policy.n; ++i)
      if ((r.algo == kTunerAny || r.algo == policy.algo[i]) &&
          (r.proto == kTunerAny || r.proto == policy.proto[i]))
        fromRule.add(policy.algo[i], policy.proto[i]);
    for (int a = 0; a < kTunerNumAlgos; ++a)
      for (int p = 0; p < kTunerNumProtos; ++p)
        if ((r.algo == kTunerAny || r.algo == a) && (r.proto == kTunerAny || r.proto == p))
          fromRule.add(a, p);
    bool any = false;
    for (int i = 0; i < fromRule.n && !any; ++i)
      any = fromRule.algo[i] < numAlgo &&
            usable(table, numProto, fromRule.algo[i], fromRule.proto[i]);
    if (any) {
      chosen = fromRule;
      d.reason = "rule from MKERNEL_TUNER_CONFIG";
    } else {
      d.reason = "rule's algorithm/protocol unusable here: built-in policy";
      d.ruleLine = 0;
    }
    break;
  }

  for (int i = 0; i < chosen.n; ++i) {
    int a = chosen.algo[i], p = chosen.proto[i];
    if (a >= numAlgo || !usable(table, numProto, a, p)) continue;
    table[a * numProto + p] = 0.0f;
    d.algo = a;
    d.proto = p;
    d.changed = true;
    return d;
  }
  d.reason = "no candidate usable in NCCL's table: table untouched";
  return d;
}

Result parseTunerRules(const std::string& text, std::vector<TunerRule>* rules,
                       std::vector<std::string>* warnings) {
  std::istringstream in(text);
  std::string line;
  int lineNo = 0, content = 0;
  const size_t before = rules->size();
  while (std::getline(in, line)) {
    ++lineNo;
    size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    if (trim(line).empty()) continue;
    ++content;
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string tok; std::getline(ss, tok, ',');) f.push_back(trim(tok));
    TunerRule r;
    r.line = lineNo;
    std::string bad;
    if (f.size() < 6 || f.size() > 8)
      bad = "expected 6 to 8 comma-separated fields";
    else if (!parseEnum(f[0], kCollNames, kNumCollTypes, &r.coll))
      bad = "unknown collective '" + f[0] + "'";
    else if (!isAny(f[1]) && !parseBytes(f[1], &r.minBytes))
      bad = "bad minBytes '" + f[1] + "'";
    else if (!isAny(f[2]) && !parseBytes(f[2], &r.maxBytes))
      bad = "bad maxBytes '" + f[2] + "'";
    else if (!parseEnum(f[3], kAlgoNames, kTunerNumAlgos, &r.algo))
      bad = "unknown algorithm '" + f[3] + "'";
    else if (!parseEnum(f[4], kProtoNames, kTunerNumProtos, &r.proto))
      bad = "unknown protocol '" + f[4] + "'";
    else if (!parseCount(f[5], &r.nChannels))
      bad = "bad nChannels '" + f[5] + "'";
    else if (f.size() > 6 && !parseCount(f[6], &r.nNodes))
      bad = "bad nNodes '" + f[6] + "'";
    else if (f.size() > 7 && !parseCount(f[7], &r.nRanks))
      bad = "bad nRanks '" + f[7] + "'";
    else if (r.minBytes > r.maxBytes)
      bad = "minBytes > maxBytes";
    if (!bad.empty()) {
      warnings->push_back("line " + std::to_string(lineNo) + ": " + bad + " (rule ignored)");
      continue;
    }
    if (r.nChannels == kTunerAny) r.nChannels = 0;
    if (r.nChannels > kTunerMaxChannels) {
      warnings->push_back("line " + std::to_string(lineNo) + ": nChannels " +
                          std::to_string(r.nChannels) + " clamped to " +
                          std::to_string(kTunerMaxChannels));
      r.nChannels = kTunerMaxChannels;
    }
    rules->push_back(r);
  }
  if (content > 0 && rules->size() == before) return Result::InvalidArgument;
  return Result::Success;
}

Result loadTunerRulesFile(const std::string& path, std::vector<TunerRule>* rules,
                          std::vector<std::string>* warnings) {
  std::ifstream f(path);
  if (!f)
    return MK_ERROR(Result::InvalidArgument, "cannot open the tuner rules file %s", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  if (parseTunerRules(ss.str(), rules, warnings) != Result::Success)
    return MK_ERROR(Result::InvalidArgument, "tuner rules file %s has no usable rule",
                    path.c_str());
  return Result::Success;
}

}  // namespace coll
}  // namespace mkernel
