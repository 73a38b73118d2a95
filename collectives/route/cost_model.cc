#include "collectives/route/cost_model.h"
#include "collectives/algo/hier_staged.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace mkernel {
namespace coll {
namespace {

constexpr int kTree = 0, kRing = 1;
constexpr const char* kProtoName[3] = {"ll", "ll128", "simple"};

// NCCL's bus bandwidth of (algorithm, protocol) on Hopper, as its tuner computes it from the
// link bandwidth (tuning.cc of 2.28.9): LL carries 8 data bytes per 16 and is capped at
// llMaxBw (141 / 45 / 35 GB/s for 1 / 2 / 4+ nodes), tree LL is a further 1/3.8; LL128 and the
// tree pay 0.92 each.
double ncclBusGBps(int algo, int proto, double bus, int nodes) {
  const double llMax = nodes == 1 ? 141.0 : nodes == 2 ? 45.0 : 35.0;
  if (algo == kTree) bus *= 0.92;
  if (proto == 0) return algo == kTree ? std::min(bus / 3.8, llMax) : std::min(bus * 0.5, llMax);
  if (proto == 1) return bus * 0.92;
  return bus;
}

int ceilLog2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

// GB/s -> bytes per microsecond.
double bytesPerUs(double gbps) {
  return gbps * 1e3;
}

}  // namespace

bool setCostParam(CostParams* p, const std::string& name, const std::string& value,
                  std::string* why) {
  // A number in [lo, hi] (above lo when loOpen); range: the same in words, for the message.
  auto number = [&](double lo, bool loOpen, double hi, const char* range, double* out) {
    char* end = nullptr;
    const double v = value.empty() ? 0.0 : std::strtod(value.c_str(), &end);
    if (value.empty() || end == nullptr || *end != '\0' || !std::isfinite(v) ||
        (loOpen ? v <= lo : v < lo) || v > hi) {
      *why = name + "=" + value + ": want " + range;
      return false;
    }
    *out = v;
    return true;
  };
  const double inf = std::numeric_limits<double>::max();
  double v = 0;
  if (name == "nvlink-gbps") {
    if (!number(0, true, inf, "a rate in GB/s above 0", &v)) return false;
    p->nvlinkGBps = v;
  } else if (name == "nic-gbps") {
    if (!number(0, true, inf, "a rate in GB/s above 0", &v)) return false;
    p->nicGBps = v;
  } else if (name == "nics") {
    const char* whole = "a whole number of NICs per node, at least 1";
    if (!number(1, false, 1 << 20, whole, &v)) return false;
    if (v != std::floor(v)) {
      *why = name + "=" + value + ": want " + whole;
      return false;
    }
    p->nicsPerNode = static_cast<int>(v);
  } else if (name == "mk-overhead-us" || name == "mk-intra-us" || name == "mk-inter-us" ||
             name == "mk-msg-us") {
    if (!number(0, false, inf, "microseconds, 0 or more", &v)) return false;
    (name == "mk-overhead-us" ? p->mkOverheadUs
     : name == "mk-intra-us"  ? p->mkIntraStepUs
     : name == "mk-inter-us"  ? p->mkInterStepUs
                              : p->mkMsgUs) = v;
  } else if (name == "hidden") {
    if (!number(0, false, 1, "a share from 0 to 1", &v)) return false;
    p->hidden = v;
  } else if (name == "rail") {
    const int r = value == "best" ? CostParams::kRailBest : hierRailByName(value);
    if (value.empty() || (value != "best" && r < 0)) {
      *why = name + "=" + value + ": want best, direct, ring or rhd";
      return false;
    }
    p->rail = r;
  } else {
    *why = "unknown parameter \"" + name +
           "\" (want nvlink-gbps, nic-gbps, nics, mk-overhead-us, mk-intra-us, mk-inter-us, "
           "mk-msg-us, hidden, rail)";
    return false;
  }
  return true;
}

bool parseCostParams(const std::string& text, CostParams* p, std::vector<std::string>* given,
                     std::string* why) {
  CostParams out = *p;
  std::vector<std::string> names;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      *why = "\"" + item + "\": want name=value";
      return false;
    }
    const std::string name = item.substr(0, eq);
    if (!setCostParam(&out, name, item.substr(eq + 1), why)) return false;
    names.push_back(name);
  }
  *p = out;
  if (given != nullptr) *given = names;
  return true;
}

CostParams policyCostParams() {
  CostParams p;
  p.mkOverheadUs = kPolicyOverheadUs;
  return p;
}

int railStepsFor(int rail, int nodes) {
  const int N = std::max(1, nodes);
  if (N == 1) return 0;
  const bool pow2 = (N & (N - 1)) == 0;
  switch (rail) {
    case kRailDirect:
      return 2;
    case kRailRing:
      return 2 * (N - 1);
    case kRailRhd:
      return pow2 ? 2 * ceilLog2(N) : 2 * (N - 1);
    default:
      return std::min(2 * (N - 1), 2 * ceilLog2(N));
  }
}

int railMessagesFor(int rail, int nodes) {
  const int N = std::max(1, nodes);
  if (N == 1) return 0;
  if (rail == kRailDirect) return 2 * (N - 1);
  return railStepsFor(rail, N);  // ring, rhd and the best of them: one message per step
}

AllReduceCost predictAllReduce(const CostParams& p, double bytes) {
  return predictCollective(p, CollType::AllReduce, bytes);
}

CollCost predictCollective(const CostParams& p, CollType coll, double bytes) {
  CollCost c;
  if (coll != CollType::AllReduce && coll != CollType::ReduceScatter &&
      coll != CollType::AllGather) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    c.ncclRingUs = c.ncclTreeUs = c.ncclUs = c.mkPipelinedUs = c.mkSerialUs = c.speedup = nan;
    c.ncclChoice = "not modelled";
    return c;
  }
  const bool ar = coll == CollType::AllReduce;
  const int N = std::max(1, p.nodes), G = std::max(1, p.gpusPerNode), R = N * G;
  const double nodeNet = p.nicGBps * p.nicsPerNode;
  // NCCL's bus bandwidth: the NVLink ring inside a node, the node's NICs between nodes.
  const double bus = N > 1 ? std::min(p.nvlinkGBps, nodeNet) : p.nvlinkGBps;
  // Ring steps, and those that cross nodes (NCCL's tuning.cc: 2 (R - 1) and 2 (N - 1) for an
  // AllReduce, R - 1 and N - 1 for ReduceScatter and AllGather).
  const int nsteps = ar ? 2 * (R - 1) : R - 1;
  const int nInter = N > 1 ? (ar ? 2 : 1) * (N - 1) : 0;
  // Algorithm bandwidth = bus bandwidth x R / nsteps (nccl-tests' busbw rules: AllReduce
  // 2 (R - 1) / R, ReduceScatter and AllGather (R - 1) / R).
  const double busToAlg = R > 1 ? static_cast<double>(R) / nsteps : 1.0;
  c.ncclRingUs = c.ncclTreeUs = std::numeric_limits<double>::infinity();
  std::string ringProto, treeProto;
  for (int proto = 0; proto < 3; ++proto) {
    // Ring: nsteps hops, of which nInter cross nodes (NCCL's latency formula).
    double intra = p.ncclNvlinkLatUs[kRing][proto];
    if (N > 1) intra = std::max(intra, p.ncclNetOverheadUs * (proto == 2 ? 3.0 : 1.0));
    const double ringLat = p.ncclBaseUs[kRing][proto] + (nsteps - nInter) * intra +
                           nInter * p.ncclNetLatUs[kRing][proto];
    const double ringUs =
        ringLat + bytes / bytesPerUs(ncclBusGBps(kRing, proto, bus, N) * busToAlg);
    if (ringUs < c.ncclRingUs) {
      c.ncclRingUs = ringUs;
      ringProto = kProtoName[proto];
    }
    if (!ar) continue;
    // Tree (AllReduce only): a chain inside each node, a binary tree across nodes, up and down.
    const double treeLat =
        p.ncclBaseUs[kTree][proto] + 2.0 * ((G - 1) * p.ncclNvlinkLatUs[kTree][proto] +
                                            ceilLog2(N) * p.ncclNetLatUs[kTree][proto]);
    const double treeUs =
        treeLat + bytes / bytesPerUs(ncclBusGBps(kTree, proto, bus, N) * busToAlg);
    if (treeUs < c.ncclTreeUs) {
      c.ncclTreeUs = treeUs;
      treeProto = kProtoName[proto];
    }
  }
  if (c.ncclTreeUs < c.ncclRingUs) {
    c.ncclUs = c.ncclTreeUs;
    c.ncclChoice = "tree/" + treeProto;
  } else {
    c.ncclUs = c.ncclRingUs;
    c.ncclChoice = "ring/" + ringProto;
  }

  // mkernel, hierarchical: NVLink reduce-scatter and all-gather ((G-1)/G of the bytes each, out
  // of every GPU's NVLink), and an AllReduce of bytes/G among the N rail peers over each GPU's
  // share of the node's NICs (2 (N-1)/N of it on the wire; steps: railStepsFor). ReduceScatter
  // and AllGather run one of the two NVLink phases and half of the rail's bytes, steps and
  // messages.
  const double railGBps = nodeNet / G;
  // share: the part of the AllReduce's phases, steps and messages that runs (ReduceScatter and
  // AllGather: half of each; their one NVLink phase is half of the AllReduce's two).
  const double share = ar ? 1.0 : 0.5;
  const double tIntra = G > 1 ? (G - 1.0) / G * bytes / bytesPerUs(p.nvlinkGBps) : 0.0;
  const double tNode = share * 2.0 * tIntra;
  const double tInter =
      N > 1 ? share * 2.0 * (N - 1.0) / N * (bytes / G) / bytesPerUs(railGBps) : 0.0;
  const double lat = p.mkOverheadUs + share * ((G > 1 ? 2.0 * p.mkIntraStepUs : 0.0) +
                                               railStepsFor(p.rail, N) * p.mkInterStepUs +
                                               railMessagesFor(p.rail, N) * p.mkMsgUs);
  c.mkSerialUs = lat + tNode + tInter;
  // Overlapped: the NVLink phases share the GPU's NVLink, the inter-node phase its NIC; the
  // pipeline hides `hidden` of the shorter (1: all of it).
  c.mkPipelinedUs = lat + std::max(tNode, tInter) + (1.0 - p.hidden) * std::min(tNode, tInter);
  c.speedup = c.ncclUs / c.mkPipelinedUs;
  return c;
}

const char* railAlgoName(int rail) {
  return hierRailName(rail);
}

}  // namespace coll
}  // namespace mkernel
