#include "tools/topo/report.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>

namespace mkernel {
namespace topo {
namespace {

// NUMA node or null (unknown).
nlohmann::ordered_json numaOrNull(int numa) {
  return numa >= 0 ? nlohmann::ordered_json(numa) : nlohmann::ordered_json(nullptr);
}

// A string, or null when empty.
nlohmann::ordered_json stringOrNull(const std::string& s) {
  return s.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(s);
}

// The document's layout: one top-level key per line; an array of objects or arrays (gpus, nics,
// the distance matrix) one element per line; everything else on one line with ", " and ": "
// between items. nlohmann-json writes every scalar (escapes, numbers).
void layout(const nlohmann::ordered_json& j, int depth, bool oneLine, std::string* out) {
  const std::string pad(static_cast<size_t>(2 * depth), ' ');
  if (j.is_object()) {
    const bool top = depth == 0 && !oneLine;
    *out += '{';
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      *out += first ? "" : ",";
      *out += top ? "\n  " : (first ? "" : " ");
      *out += nlohmann::ordered_json(it.key()).dump() + ": ";
      layout(it.value(), top ? 1 : depth, oneLine, out);
      first = false;
    }
    *out += top ? "\n}" : "}";
  } else if (j.is_array()) {
    bool ofContainers = !j.empty() && !oneLine;
    for (const auto& e : j) ofContainers = ofContainers && e.is_structured();
    *out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      *out += i ? "," : "";
      *out += ofContainers ? "\n" + pad + "  " : (i ? " " : "");
      layout(j[i], depth, true, out);
    }
    *out += ofContainers ? "\n" + pad + "]" : "]";
  } else {
    *out += j.dump();
  }
}

std::string numaText(int numa) {
  return numa >= 0 ? std::to_string(numa) : "N/A";
}

// The label of a cell in the combined GPU+NIC matrix (rows/columns: GPUs first, then NICs).
std::string cell(const Placement& p, int r, int c) {
  const int ng = p.nGpus;
  if (r < ng && c < ng) return p.gpuGpuLabel(r, c);
  if (r < ng) return pathClassName(p.gpuToNic(r, c - ng));
  if (c < ng) return pathClassName(p.gpuToNic(c, r - ng));
  return pathClassName(p.nicNic[static_cast<size_t>(r - ng) * p.nNics + (c - ng)]);
}

std::string rowName(const Placement& p, int i) {
  return i < p.nGpus ? "GPU" + std::to_string(i) : "NIC" + std::to_string(i - p.nGpus);
}

std::string speedText(double gbps) {
  if (gbps <= 0) return "speed unknown";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g Gbps", gbps);
  return buf;
}

}  // namespace

std::string renderTable(const Topology& topo, const Placement& p) {
  std::ostringstream o;
  o << "mkernel-topo: " << (topo.source == "live" ? "this machine" : topo.source) << ", "
    << topo.nPackages << " package(s), " << topo.numaNodes.size() << " NUMA node(s), "
    << topo.allCpus.size() << " CPU(s), " << topo.gpus.size() << " GPU(s), " << topo.nics.size()
    << " RDMA NIC(s); NVLink from "
    << (topo.nvlinkSource.empty() ? std::string("nowhere (unknown)") : topo.nvlinkSource) << "\n";
  const int n = p.nGpus + p.nNics;
  if (n > 0) {
    char buf[64];
    o << "\n      ";
    for (int c = 0; c < n; ++c) {
      std::snprintf(buf, sizeof(buf), "%-6s", rowName(p, c).c_str());
      o << buf;
    }
    o << "CPU Affinity    NUMA Affinity\n";
    for (int r = 0; r < n; ++r) {
      std::snprintf(buf, sizeof(buf), "%-6s", rowName(p, r).c_str());
      o << buf;
      for (int c = 0; c < n; ++c) {
        std::snprintf(buf, sizeof(buf), "%-6s", cell(p, r, c).c_str());
        o << buf;
      }
      if (r < p.nGpus) {
        int numa = topo.gpus[r].pci.numa;
        std::vector<int> cpus;
        for (const NumaNode& nn : topo.numaNodes)
          if (nn.osIndex == numa) cpus = nn.cpus;
        std::snprintf(buf, sizeof(buf), "%-16s%s",
                      cpus.empty() ? "N/A" : formatCpuList(cpus).c_str(), numaText(numa).c_str());
        o << buf;
      }
      o << "\n";
    }
    o << "\nLegend: X = self, NV# = # NVLinks (through NVSwitch when present), PIX = one PCIe "
         "switch,"
         " PXB = several PCIe bridges, PHB = one host bridge, NODE = host bridges of one NUMA node,"
         " SYS = across sockets (or unknown)\n";
  }
  if (!topo.nics.empty()) {
    o << "\nNICs:\n";
    for (size_t i = 0; i < topo.nics.size(); ++i) {
      const Nic& nic = topo.nics[i];
      o << "  NIC" << i << ": " << nic.name << "  pci "
        << (nic.pci.busId.empty() ? "-" : nic.pci.busId) << "  NUMA " << numaText(nic.pci.numa)
        << "  port " << nic.port << "  " << (nic.state.empty() ? "state unknown" : nic.state)
        << "  " << (nic.linkLayer.empty() ? "link layer unknown" : nic.linkLayer) << "  "
        << speedText(nic.speedGbps) << "\n";
    }
  }
  if (!p.gpus.empty()) {
    o << "\nPlacement:\n";
    for (const GpuPlacement& g : p.gpus) {
      o << "  GPU" << g.gpu << " (" << topo.gpus[g.gpu].pci.busId
        << (topo.gpus[g.gpu].name.empty() ? std::string() : ", " + topo.gpus[g.gpu].name)
        << "): rail NIC ";
      if (g.nic < 0) {
        o << "none";
      } else {
        o << topo.nics[g.nic].name << " (" << pathClassName(g.nicClass) << "), rails";
        for (int r : g.rails) o << " " << topo.nics[r].name;
      }
      o << "; proxy CPUs " << formatCpuList(g.proxyCpus);
      if (g.proxyNuma >= 0) o << " (NUMA " << g.proxyNuma << ")";
      o << "\n";
    }
    o << "  ring order:";
    for (int g : p.ringOrder) o << " " << g;
    o << "  (" << p.ringReason << ")\n";
  }
  if (!topo.notes.empty()) {
    o << "\nNot found / not available:\n";
    for (const std::string& s : topo.notes) o << "  - " << s << "\n";
  }
  return o.str();
}

std::string renderJson(const Topology& topo, const Placement& p) {
  using nlohmann::ordered_json;
  ordered_json doc;
  doc["source"] = topo.source;
  doc["nvlink_source"] = stringOrNull(topo.nvlinkSource);
  doc["packages"] = topo.nPackages;
  doc["numa_nodes"] = ordered_json::array();
  for (const auto& nn : topo.numaNodes)
    doc["numa_nodes"].push_back({{"index", nn.osIndex}, {"cpus", formatCpuList(nn.cpus)}});
  doc["gpus"] = ordered_json::array();
  for (const GpuPlacement& g : p.gpus) {
    const Gpu& gpu = topo.gpus[g.gpu];
    ordered_json rails = ordered_json::array();
    for (int r : g.rails) rails.push_back(topo.nics[r].name);
    doc["gpus"].push_back(
        {{"index", gpu.index},
         {"pci", gpu.pci.busId},
         {"name", stringOrNull(gpu.name)},
         {"numa", numaOrNull(gpu.pci.numa)},
         {"nic", g.nic >= 0 ? ordered_json(topo.nics[g.nic].name) : ordered_json(nullptr)},
         {"nic_distance",
          g.nic >= 0 ? ordered_json(pathClassName(g.nicClass)) : ordered_json(nullptr)},
         {"rails", rails},
         {"cpus", formatCpuList(g.proxyCpus)},
         {"cpus_numa", numaOrNull(g.proxyNuma)}});
  }
  doc["nics"] = ordered_json::array();
  for (const Nic& nic : topo.nics) {
    // A whole number of Gbps as an integer (400, not 400.0).
    ordered_json speed = nullptr;
    if (nic.speedGbps > 0)
      speed = nic.speedGbps == std::floor(nic.speedGbps)
                  ? ordered_json(static_cast<int64_t>(nic.speedGbps))
                  : ordered_json(nic.speedGbps);
    doc["nics"].push_back({{"name", nic.name},
                           {"pci", stringOrNull(nic.pci.busId)},
                           {"numa", numaOrNull(nic.pci.numa)},
                           {"port", nic.port},
                           {"state", stringOrNull(nic.state)},
                           {"link_layer", stringOrNull(nic.linkLayer)},
                           {"speed_gbps", speed}});
  }
  const int n = p.nGpus + p.nNics;
  ordered_json labels = ordered_json::array(), matrix = ordered_json::array();
  for (int i = 0; i < n; ++i) labels.push_back(rowName(p, i));
  for (int r = 0; r < n; ++r) {
    ordered_json row = ordered_json::array();
    for (int c = 0; c < n; ++c) row.push_back(cell(p, r, c));
    matrix.push_back(row);
  }
  doc["distance"] = {{"labels", labels}, {"matrix", matrix}};
  doc["ring"] = p.ringOrder;
  doc["ring_reason"] = p.ringReason;
  doc["notes"] = topo.notes;
  std::string out;
  layout(doc, 0, false, &out);
  return out + "\n";
}

}  // namespace topo
}  // namespace mkernel
