// hwloc part of discovery: packages, NUMA nodes, CPUs and the PCI tree (GPUs, RDMA NICs and the
// bridges above them), from the live machine or from an hwloc XML file.
#include <hwloc.h>

#include <algorithm>
#include <cstdio>

#include "common/log.h"
#include "topology/topology.h"

namespace mkernel {
namespace topo {
namespace {

constexpr uint16_t kVendorNvidia = 0x10de;
constexpr uint16_t kVendorMellanox = 0x15b3;
constexpr uint16_t kVendorAmazon = 0x1d0f;  // EFA
constexpr uint16_t kClass3dController = 0x0302;
constexpr uint16_t kClassVgaController = 0x0300;
constexpr uint16_t kClassInfiniband = 0x0207;
constexpr uint16_t kClassEthernet = 0x0200;

std::vector<int> bitmapToVector(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  if (set == nullptr) return out;
  int i;
  hwloc_bitmap_foreach_begin(i, set) out.push_back(i);
  hwloc_bitmap_foreach_end();
  return out;
}

std::string busIdOf(const hwloc_obj_t pci) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%x", pci->attr->pcidev.domain,
                pci->attr->pcidev.bus, pci->attr->pcidev.dev, pci->attr->pcidev.func);
  return buf;
}

// The verbs name hwloc found for a NIC (its OpenFabrics OS device child), or "".
std::string openFabricsName(hwloc_obj_t pci) {
  for (hwloc_obj_t c = pci->io_first_child; c != nullptr; c = c->next_sibling) {
    if (c->type == HWLOC_OBJ_OS_DEVICE && c->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS &&
        c->name != nullptr)
      return c->name;
  }
  return "";
}

PciLocation locate(hwloc_obj_t pci) {
  PciLocation loc;
  loc.busId = busIdOf(pci);
  hwloc_obj_t p = pci->parent;
  for (; p != nullptr && p->type == HWLOC_OBJ_BRIDGE; p = p->parent) {
    if (p->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST) {
      loc.hostBridge = p->gp_index;
    } else {
      loc.bridges.push_back(p->gp_index);
    }
  }
  // The first non-I/O ancestor (Package, Group or Machine) says which CPUs and NUMA node the
  // device is local to; a Machine-level anchor with several NUMA nodes leaves numa at -1.
  if (p != nullptr) {
    loc.cpuAnchor = p->gp_index;
    if (p->nodeset != nullptr && hwloc_bitmap_weight(p->nodeset) == 1)
      loc.numa = hwloc_bitmap_first(p->nodeset);
  }
  return loc;
}

}  // namespace

Result loadHwlocTopology(const std::string& xmlPath, Topology* topo) {
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) != 0)
    return MK_ERROR(Result::SystemError, "hwloc_topology_init failed");
  // I/O objects are dropped by default: keep bridges, PCI devices and OS devices (the verbs
  // names), or there is no PCI tree to measure distances in.
  hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_ALL);
  if (!xmlPath.empty() && hwloc_topology_set_xml(t, xmlPath.c_str()) != 0) {
    hwloc_topology_destroy(t);
    return MK_ERROR(Result::InvalidArgument, "hwloc cannot read the XML file %s", xmlPath.c_str());
  }
  if (hwloc_topology_load(t) != 0) {
    hwloc_topology_destroy(t);
    return MK_ERROR(Result::SystemError, "hwloc failed to load the topology of %s",
                    xmlPath.empty() ? "this machine" : xmlPath.c_str());
  }
  topo->source = xmlPath.empty() ? "live" : xmlPath;
  topo->nPackages = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE);
  topo->allCpus = bitmapToVector(hwloc_topology_get_topology_cpuset(t));
  topo->numaNodes.clear();
  for (hwloc_obj_t n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, nullptr); n != nullptr;
       n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n)) {
    NumaNode node;
    node.osIndex = static_cast<int>(n->os_index);
    node.cpus = bitmapToVector(n->cpuset);
    topo->numaNodes.push_back(node);
  }

  topo->gpus.clear();
  topo->nics.clear();
  for (hwloc_obj_t d = hwloc_get_next_pcidev(t, nullptr); d != nullptr;
       d = hwloc_get_next_pcidev(t, d)) {
    const auto& a = d->attr->pcidev;
    std::string ofName = openFabricsName(d);
    bool isGpu = a.vendor_id == kVendorNvidia &&
                 (a.class_id == kClass3dController || a.class_id == kClassVgaController);
    bool isRdmaVendor = a.vendor_id == kVendorMellanox || a.vendor_id == kVendorAmazon;
    bool isNic = !ofName.empty() ||
                 (isRdmaVendor && (a.class_id == kClassInfiniband || a.class_id == kClassEthernet));
    if (isGpu) {
      Gpu g;
      g.vendor = a.vendor_id;
      g.device = a.device_id;
      g.pci = locate(d);
      topo->gpus.push_back(g);
    } else if (isNic) {
      Nic n;
      n.vendor = a.vendor_id;
      n.device = a.device_id;
      n.pci = locate(d);
      n.name = ofName.empty() ? n.pci.busId : ofName;
      topo->nics.push_back(n);
    }
  }
  hwloc_topology_destroy(t);

  std::sort(topo->gpus.begin(), topo->gpus.end(),
            [](const Gpu& x, const Gpu& y) { return x.pci.busId < y.pci.busId; });
  for (size_t i = 0; i < topo->gpus.size(); ++i) topo->gpus[i].index = static_cast<int>(i);
  std::sort(topo->nics.begin(), topo->nics.end(), [](const Nic& x, const Nic& y) {
    return x.pci.busId != y.pci.busId ? x.pci.busId < y.pci.busId : x.name < y.name;
  });
  MK_INFO(kLogGraph, "topology %s: %d package(s), %zu NUMA node(s), %zu GPU(s), %zu NIC(s)",
          topo->source.c_str(), topo->nPackages, topo->numaNodes.size(), topo->gpus.size(),
          topo->nics.size());
  return Result::Success;
}

std::string formatCpuList(const std::vector<int>& cpus) {
  std::vector<int> s = cpus;
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t j = i;
    while (j + 1 < s.size() && s[j + 1] == s[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(s[i]);
    if (j > i) out += '-' + std::to_string(s[j]);
    i = j + 1;
  }
  return out;
}

std::vector<int> parseCpuList(const std::string& text) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    std::string tok =
        text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int lo = 0, hi = 0;
    if (std::sscanf(tok.c_str(), "%d-%d", &lo, &hi) == 2) {
      for (int c = lo; c <= hi; ++c) out.push_back(c);
    } else if (std::sscanf(tok.c_str(), "%d", &lo) == 1) {
      out.push_back(lo);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace topo
}  // namespace mkernel
