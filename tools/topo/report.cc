#include "tools/topo/report.h"

#include <cstdio>
#include <sstream>

namespace mkernel {
namespace topo {
namespace {

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string jsonNumaOrNull(int numa) {
  return numa >= 0 ? std::to_string(numa) : "null";
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

std::string jsonNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
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
        << (topo.gpus[g.gpu].name.empty() ? std::string() : ", " + topo.gpus[g.gpu].name) << "): rail NIC ";
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
  std::ostringstream o;
  o << "{\n  \"source\": " << jsonString(topo.source) << ",\n";
  o << "  \"nvlink_source\": "
    << (topo.nvlinkSource.empty() ? std::string("null") : jsonString(topo.nvlinkSource)) << ",\n";
  o << "  \"packages\": " << topo.nPackages << ",\n  \"numa_nodes\": [";
  for (size_t i = 0; i < topo.numaNodes.size(); ++i)
    o << (i ? ", " : "") << "{\"index\": " << topo.numaNodes[i].osIndex
      << ", \"cpus\": " << jsonString(formatCpuList(topo.numaNodes[i].cpus)) << "}";
  o << "],\n  \"gpus\": [";
  for (size_t i = 0; i < p.gpus.size(); ++i) {
    const GpuPlacement& g = p.gpus[i];
    const Gpu& gpu = topo.gpus[g.gpu];
    o << (i ? "," : "") << "\n    {\"index\": " << gpu.index
      << ", \"pci\": " << jsonString(gpu.pci.busId)
      << ", \"name\": " << (gpu.name.empty() ? std::string("null") : jsonString(gpu.name))
      << ", \"numa\": " << jsonNumaOrNull(gpu.pci.numa)
      << ", \"nic\": " << (g.nic >= 0 ? jsonString(topo.nics[g.nic].name) : std::string("null"))
      << ", \"nic_distance\": "
      << (g.nic >= 0 ? jsonString(pathClassName(g.nicClass)) : std::string("null"))
      << ", \"rails\": [";
    for (size_t r = 0; r < g.rails.size(); ++r)
      o << (r ? ", " : "") << jsonString(topo.nics[g.rails[r]].name);
    o << "], \"cpus\": " << jsonString(formatCpuList(g.proxyCpus))
      << ", \"cpus_numa\": " << jsonNumaOrNull(g.proxyNuma) << "}";
  }
  o << "\n  ],\n  \"nics\": [";
  for (size_t i = 0; i < topo.nics.size(); ++i) {
    const Nic& nic = topo.nics[i];
    o << (i ? "," : "") << "\n    {\"name\": " << jsonString(nic.name)
      << ", \"pci\": " << (nic.pci.busId.empty() ? std::string("null") : jsonString(nic.pci.busId))
      << ", \"numa\": " << jsonNumaOrNull(nic.pci.numa) << ", \"port\": " << nic.port
      << ", \"state\": " << (nic.state.empty() ? std::string("null") : jsonString(nic.state))
      << ", \"link_layer\": "
      << (nic.linkLayer.empty() ? std::string("null") : jsonString(nic.linkLayer))
      << ", \"speed_gbps\": "
      << (nic.speedGbps > 0 ? jsonNumber(nic.speedGbps) : std::string("null")) << "}";
  }
  o << "\n  ],\n  \"distance\": {\"labels\": [";
  const int n = p.nGpus + p.nNics;
  for (int i = 0; i < n; ++i) o << (i ? ", " : "") << jsonString(rowName(p, i));
  o << "], \"matrix\": [";
  for (int r = 0; r < n; ++r) {
    o << (r ? "," : "") << "\n    [";
    for (int c = 0; c < n; ++c) o << (c ? ", " : "") << jsonString(cell(p, r, c));
    o << "]";
  }
  o << "\n  ]},\n  \"ring\": [";
  for (size_t i = 0; i < p.ringOrder.size(); ++i) o << (i ? ", " : "") << p.ringOrder[i];
  o << "],\n  \"ring_reason\": " << jsonString(p.ringReason) << ",\n  \"notes\": [";
  for (size_t i = 0; i < topo.notes.size(); ++i) o << (i ? ", " : "") << jsonString(topo.notes[i]);
  o << "]\n}\n";
  return o.str();
}

}  // namespace topo
}  // namespace mkernel
