// mkernel-topo: what mkernel sees of this node (GPUs, RDMA NICs, NVLink, PCIe distances) and the
// placement it derives (rail NICs, proxy CPUs, ring order). docs/TOPOLOGY.md.
#include <cstdio>
#include <string>

#include "common/result.h"
#include "tools/cli.h"
#include "tools/topo/report.h"
#include "topology/placement.h"
#include "topology/topology.h"

int main(int argc, char** argv) {
  using namespace mkernel;
  topo::DiscoverOptions opts = topo::defaultDiscoverOptions();
  bool json = false;
  CLI::App app(
      "What mkernel sees of this node (GPUs, RDMA NICs, NVLink, PCIe distances) and the placement "
      "it\n"
      "derives (rail NICs, proxy CPUs, ring order), as a table like nvidia-smi topo -m, or JSON.",
      "mkernel-topo");
  mktools::setupApp(app);
  app.add_flag("--json", json, "print JSON instead of the table (keys: docs/TOPOLOGY.md)");
  app.add_option(
         "--hwloc-xml", opts.hwlocXml,
         "read the topology from an hwloc XML file (lstopo --of xml) instead of this machine "
         "(default: MKERNEL_TOPO_XML)")
      ->type_name("FILE");
  app.add_option(
         "--nvlink-matrix", opts.nvlinkMatrixFile,
         "describe NVLink with a matrix file instead of NVML (default: MKERNEL_NVLINK_MATRIX)")
      ->type_name("FILE");
  const int rc = mktools::parseArgs(app, argc, argv);
  if (rc >= 0) return rc;
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
