#include "topology/placement.h"

#include <algorithm>
#include <cstdio>

#include "common/log.h"

namespace mkernel {
namespace topo {
namespace {

bool known(const PciLocation& l) {
  return !l.busId.empty() && (l.hostBridge != 0 || l.cpuAnchor != 0);
}

std::vector<int> numaCpus(const Topology& topo, int numa) {
  for (const NumaNode& n : topo.numaNodes)
    if (n.osIndex == numa) return n.cpus;
  return {};
}

// Ordering of GPU pairs for ring building: NVLink with more links first, then the PCI classes.
int pairCost(const Placement& p, int a, int b) {
  PathClass c = p.gpuToGpu(a, b);
  if (c == PathClass::Nvlink) return -p.gpuGpuLinks[static_cast<size_t>(a) * p.nGpus + b];
  return static_cast<int>(c);
}

// Hamiltonian cycle through NVLink edges only (backtracking, neighbours with more links first,
// then lower index). Bounded: machines have at most a few dozen GPUs, and a failed search falls
// back to the nearest-neighbour order.
bool nvlinkCycle(const Placement& p, std::vector<int>* order) {
  const int n = p.nGpus;
  std::vector<int> path{0};
  std::vector<bool> used(n, false);
  used[0] = true;
  long budget = 200000;
  std::vector<std::vector<int>> nbrs(n);
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b)
      if (a != b && p.gpuToGpu(a, b) == PathClass::Nvlink) nbrs[a].push_back(b);
    std::stable_sort(nbrs[a].begin(), nbrs[a].end(),
                     [&](int x, int y) { return pairCost(p, a, x) < pairCost(p, a, y); });
  }
  struct Rec {
    static bool go(const std::vector<std::vector<int>>& nb, const Placement& pl, int nn,
                   std::vector<int>* path, std::vector<bool>* used, long* budget) {
      if (--*budget < 0) return false;
      int last = path->back();
      if (static_cast<int>(path->size()) == nn)
        return nn <= 2 || pl.gpuToGpu(last, (*path)[0]) == PathClass::Nvlink;
      for (int nx : nb[last]) {
        if ((*used)[nx]) continue;
        (*used)[nx] = true;
        path->push_back(nx);
        if (go(nb, pl, nn, path, used, budget)) return true;
        path->pop_back();
        (*used)[nx] = false;
      }
      return false;
    }
  };
  if (!Rec::go(nbrs, p, n, &path, &used, &budget)) return false;
  *order = path;
  return true;
}

// Greedy: from GPU 0, always step to the nearest unvisited GPU (lowest index on ties). On a
// PCIe-only box this keeps GPUs under one switch, then one host bridge, then one socket together.
std::vector<int> nearestNeighbourOrder(const Placement& p) {
  const int n = p.nGpus;
  std::vector<int> order{0};
  std::vector<bool> used(n, false);
  used[0] = true;
  while (static_cast<int>(order.size()) < n) {
    int cur = order.back(), best = -1;
    for (int c = 0; c < n; ++c) {
      if (used[c]) continue;
      if (best < 0 || pairCost(p, cur, c) < pairCost(p, cur, best)) best = c;
    }
    used[best] = true;
    order.push_back(best);
  }
  return order;
}

}  // namespace

const char* pathClassName(PathClass c) {
  switch (c) {
    case PathClass::Self:
      return "X";
    case PathClass::Nvlink:
      return "NV";
    case PathClass::Pix:
      return "PIX";
    case PathClass::Pxb:
      return "PXB";
    case PathClass::Phb:
      return "PHB";
    case PathClass::Node:
      return "NODE";
    case PathClass::Sys:
      return "SYS";
  }
  return "?";
}

PathClass pciPathClass(const PciLocation& a, const PciLocation& b) {
  if (!known(a) || !known(b)) return PathClass::Sys;
  if (a.busId == b.busId) return PathClass::Self;
  if (a.hostBridge == b.hostBridge && a.cpuAnchor == b.cpuAnchor) {
    for (size_t ia = 0; ia < a.bridges.size(); ++ia) {
      auto it = std::find(b.bridges.begin(), b.bridges.end(), a.bridges[ia]);
      if (it == b.bridges.end()) continue;
      size_t ib = static_cast<size_t>(it - b.bridges.begin());
      // The lowest shared bridge is a switch's upstream port (or a root port); a device's own
      // downstream port is the one bridge allowed in between for PIX.
      return (ia <= 1 && ib <= 1) ? PathClass::Pix : PathClass::Pxb;
    }
    if (a.hostBridge != 0) return PathClass::Phb;
  }
  if (a.cpuAnchor == b.cpuAnchor) return PathClass::Node;
  if (a.numa >= 0 && a.numa == b.numa) return PathClass::Node;
  return PathClass::Sys;
}

std::string Placement::gpuGpuLabel(int a, int b) const {
  PathClass c = gpuToGpu(a, b);
  if (c == PathClass::Nvlink)
    return "NV" + std::to_string(gpuGpuLinks[static_cast<size_t>(a) * nGpus + b]);
  return pathClassName(c);
}

Placement computePlacement(const Topology& topo) {
  Placement p;
  const int ng = static_cast<int>(topo.gpus.size());
  const int nn = static_cast<int>(topo.nics.size());
  p.nGpus = ng;
  p.nNics = nn;
  p.gpuGpu.assign(static_cast<size_t>(ng) * ng, PathClass::Sys);
  p.gpuGpuLinks.assign(static_cast<size_t>(ng) * ng, 0);
  p.gpuNic.assign(static_cast<size_t>(ng) * nn, PathClass::Sys);
  p.nicNic.assign(static_cast<size_t>(nn) * nn, PathClass::Sys);
  for (int a = 0; a < ng; ++a)
    for (int b = 0; b < ng; ++b) {
      size_t i = static_cast<size_t>(a) * ng + b;
      int links = topo.nvlink.nGpus == ng ? topo.nvlink.pairLinks(a, b) : 0;
      p.gpuGpuLinks[i] = links;
      if (a == b)
        p.gpuGpu[i] = PathClass::Self;
      else if (links > 0)
        p.gpuGpu[i] = PathClass::Nvlink;
      else
        p.gpuGpu[i] = pciPathClass(topo.gpus[a].pci, topo.gpus[b].pci);
    }
  for (int g = 0; g < ng; ++g)
    for (int n = 0; n < nn; ++n)
      p.gpuNic[static_cast<size_t>(g) * nn + n] = pciPathClass(topo.gpus[g].pci, topo.nics[n].pci);
  for (int a = 0; a < nn; ++a)
    for (int b = 0; b < nn; ++b)
      p.nicNic[static_cast<size_t>(a) * nn + b] =
          a == b ? PathClass::Self : pciPathClass(topo.nics[a].pci, topo.nics[b].pci);

  // Rails: the NICs at the GPU's best distance class. Among those, the one serving the fewest
  // GPUs so far becomes the primary, so that equally near NICs split the GPUs evenly.
  std::vector<int> load(nn, 0);
  for (int g = 0; g < ng; ++g) {
    GpuPlacement gp;
    gp.gpu = g;
    if (nn > 0) {
      PathClass best = PathClass::Sys;
      for (int n = 0; n < nn; ++n) best = std::min(best, p.gpuToNic(g, n));
      for (int n = 0; n < nn; ++n)
        if (p.gpuToNic(g, n) == best) gp.rails.push_back(n);
      int primary = gp.rails[0];
      for (int n : gp.rails)
        if (load[n] < load[primary]) primary = n;
      gp.rails.erase(std::find(gp.rails.begin(), gp.rails.end(), primary));
      gp.rails.insert(gp.rails.begin(), primary);
      gp.nic = primary;
      gp.nicClass = best;
      ++load[primary];
    }
    // Proxy CPUs: the proxy touches the NIC (doorbells, completions) more than the GPU memory it
    // polls through PCIe, so the NIC's NUMA node wins; the GPU's when the NIC's is unknown.
    int numa = gp.nic >= 0 ? topo.nics[gp.nic].pci.numa : -1;
    if (numa < 0) numa = topo.gpus[g].pci.numa;
    gp.proxyCpus = numa >= 0 ? numaCpus(topo, numa) : std::vector<int>();
    gp.proxyNuma = gp.proxyCpus.empty() ? -1 : numa;
    if (gp.proxyCpus.empty()) gp.proxyCpus = topo.allCpus;
    p.gpus.push_back(gp);
  }

  // Ring order.
  if (ng > 0) {
    bool allNvlink = ng > 1, anyNvlink = false;
    for (int a = 0; a < ng; ++a)
      for (int b = 0; b < ng; ++b) {
        if (a == b) continue;
        bool nv = p.gpuToGpu(a, b) == PathClass::Nvlink;
        allNvlink = allNvlink && nv;
        anyNvlink = anyNvlink || nv;
      }
    if (allNvlink) {
      for (int g = 0; g < ng; ++g) p.ringOrder.push_back(g);
      p.ringReason =
          topo.nvlink.hasNvswitch() ? "nvswitch: PCI order" : "nvlink all-to-all: PCI order";
    } else if (anyNvlink && nvlinkCycle(p, &p.ringOrder)) {
      p.ringReason = "nvlink cycle";
    } else {
      p.ringOrder = nearestNeighbourOrder(p);
      p.ringReason = anyNvlink ? "no nvlink cycle: nearest neighbour" : "pcie: nearest neighbour";
    }
  }
  return p;
}

std::vector<std::string> railNicNames(const Topology& topo, const Placement& place, int gpu) {
  std::vector<std::string> names;
  if (gpu < 0 || gpu >= static_cast<int>(place.gpus.size())) return names;
  for (int n : place.gpus[static_cast<size_t>(gpu)].rails)
    if (n >= 0 && n < static_cast<int>(topo.nics.size()))
      names.push_back(topo.nics[static_cast<size_t>(n)].name);
  return names;
}

namespace {
// Domain, bus, device and function of "dddd:bb:dd.f" (any case, any domain width), or false.
bool parseBusId(const std::string& s, unsigned long long* key) {
  unsigned long long dom = 0;
  unsigned bus = 0, dev = 0, fn = 0;
  char tail = 0;
  if (std::sscanf(s.c_str(), "%llx:%x:%x.%x%c", &dom, &bus, &dev, &fn, &tail) != 4) return false;
  *key = (dom << 24) | (static_cast<unsigned long long>(bus) << 16) | (dev << 8) | fn;
  return true;
}
}  // namespace

bool gpusNvlinkAllToAll(const Topology& topo, const std::vector<std::string>& busIds,
                        std::string* why) {
  std::vector<int> idx;
  for (const std::string& b : busIds) {
    unsigned long long want = 0;
    if (!parseBusId(b, &want)) {
      *why = "GPU bus id '" + b + "' unreadable: taken as NVLink all-to-all";
      return true;
    }
    int found = -1;
    for (size_t g = 0; g < topo.gpus.size() && found < 0; ++g) {
      unsigned long long have = 0;
      if (parseBusId(topo.gpus[g].pci.busId, &have) && have == want) found = static_cast<int>(g);
    }
    if (found < 0) {
      *why = "GPU " + b + " is not in the topology: taken as NVLink all-to-all";
      return true;
    }
    if (std::find(idx.begin(), idx.end(), found) == idx.end()) idx.push_back(found);
  }
  if (idx.size() < 2) {
    *why = "one GPU";
    return true;
  }
  if (topo.nvlink.nGpus != static_cast<int>(topo.gpus.size())) {
    *why = "no NVLink model (NVML absent, no MKERNEL_NVLINK_MATRIX): taken as NVLink all-to-all";
    return true;
  }
  for (size_t i = 0; i < idx.size(); ++i)
    for (size_t j = i + 1; j < idx.size(); ++j)
      if (topo.nvlink.pairLinks(idx[i], idx[j]) == 0) {
        *why = "GPUs " + topo.gpus[static_cast<size_t>(idx[i])].pci.busId + " and " +
               topo.gpus[static_cast<size_t>(idx[j])].pci.busId + " have no NVLink between them";
        return false;
      }
  *why = topo.nvlink.hasNvswitch() ? "NVSwitch" : "NVLink between every pair";
  return true;
}

bool ranksInRingOrder(const Topology& topo, const Placement& place,
                      const std::vector<std::string>& rankBusIds, std::vector<int>* order,
                      std::string* why) {
  const int n = static_cast<int>(rankBusIds.size());
  order->resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) (*order)[static_cast<size_t>(r)] = r;
  std::vector<int> posOf(static_cast<size_t>(n),
                         0);  // the rank's GPU's position in place.ringOrder
  for (int r = 0; r < n; ++r) {
    const std::string& b = rankBusIds[static_cast<size_t>(r)];
    unsigned long long want = 0;
    int found = -1;
    if (parseBusId(b, &want)) {
      for (size_t g = 0; g < topo.gpus.size() && found < 0; ++g) {
        unsigned long long have = 0;
        if (parseBusId(topo.gpus[g].pci.busId, &have) && have == want) found = static_cast<int>(g);
      }
    }
    const auto at = std::find(place.ringOrder.begin(), place.ringOrder.end(), found);
    if (found < 0 || at == place.ringOrder.end()) {
      *why = "GPU " + b + " of rank " + std::to_string(r) + " is not in the topology: rank order";
      return false;
    }
    posOf[static_cast<size_t>(r)] = static_cast<int>(at - place.ringOrder.begin());
  }
  std::stable_sort(order->begin(), order->end(), [&](int a, int b) {
    return posOf[static_cast<size_t>(a)] < posOf[static_cast<size_t>(b)];
  });
  *why = "the placement's ring (" + place.ringReason + ")";
  return true;
}

}  // namespace topo
}  // namespace mkernel
