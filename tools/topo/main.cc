// mkernel-topo: what mkernel sees of this node (GPUs, RDMA NICs, NVLink, PCIe distances) and the
// placement it derives (rail NICs, proxy CPUs, ring order). docs/TOPOLOGY.md.
#include <cstdio>
#include <cstring>
#include <string>

#include "common/result.h"
#include "tools/topo/report.h"
#include "topology/placement.h"
#include "topology/topology.h"

namespace {

void usage(FILE* f) {
  std::fprintf(f,
               "usage: mkernel-topo [--json] [--hwloc-xml FILE] [--nvlink-matrix FILE]\n"
               "  --json               print JSON instead of the table (keys: docs/TOPOLOGY.md)\n"
               "  --hwloc-xml FILE     read the topology from an hwloc XML file (lstopo --of xml)\n"
               "                       instead of this machine (default: MKERNEL_TOPO_XML)\n"
               "  --nvlink-matrix FILE describe NVLink with a matrix file instead of NVML\n"
               "                       (default: MKERNEL_NVLINK_MATRIX)\n");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mkernel;
  topo::DiscoverOptions opts = topo::defaultDiscoverOptions();
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if ((a == "--hwloc-xml" || a == "--nvlink-matrix") && i + 1 < argc) {
      (a == "--hwloc-xml" ? opts.hwlocXml : opts.nvlinkMatrixFile) = argv[++i];
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "mkernel-topo: unknown argument '%s'\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  topo::Topology t;
  if (topo::discoverTopology(opts, &t) != Result::Success) {
    std::fprintf(stderr, "mkernel-topo: %s\n", lastError());
    return 1;
  }
  topo::Placement p = topo::computePlacement(t);
  std::string out = json ? topo::renderJson(t, p) : topo::renderTable(t, p);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}
