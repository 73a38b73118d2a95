#include "collectives/runtime/proxy_net.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/cpuset.h"
#include "common/log.h"
#include "common/param.h"
#include "topology/placement.h"
#include "topology/topology.h"

namespace mkernel {
namespace coll {

Result createProxyNet(int cudaDev, net::BackendChoice* out) {
  std::vector<std::string> rails;
  std::string order;
  const topo::NodeModel* model = nullptr;
  if (topo::localNodeModel(&model) == Result::Success) {
    rails = topo::railNicNames(model->topo, model->place, cudaDev);
    for (const std::string& n : rails) order += (order.empty() ? "" : ", ") + n;
    order = rails.empty() ? "GPU " + std::to_string(cudaDev) + " has no rail NIC in the topology"
                          : "rail NICs of GPU " + std::to_string(cudaDev) + " first: " + order;
  } else {
    order = std::string("no topology (") + lastError() + "): discovery order";
  }
  MK_CHECK(net::createNetBackend(rails, out));
  out->why += " [" + order + "]";
  MK_INFO(kLogInit | kLogNet | kLogProxy, "proxy net: %s", out->why.c_str());
  return Result::Success;
}

Result proxyMemoryFor(const std::string& gdr, int ptrSupport, const char* backend,
                      int rdmaWritesOrdering, ProxyMemory* out) {
  *out = ProxyMemory();
  if (gdr != "auto" && gdr != "0" && gdr != "1")
    return MK_ERROR(Result::InvalidArgument, "MKERNEL_PROXY_GDR=%s: want auto, 0 or 1",
                    gdr.c_str());
  const bool can = (ptrSupport & net::kPtrCuda) != 0;
  if (gdr == "0" || (gdr == "auto" && !can)) {
    out->why = gdr == "0" ? "host memory (MKERNEL_PROXY_GDR=0)"
                          : std::string("host memory (") + backend + " cannot register GPU memory)";
    return Result::Success;
  }
  if (!can)
    return MK_ERROR(
        Result::InvalidArgument,
        "MKERNEL_PROXY_GDR=1: the proxy's backend %s cannot register GPU memory (no DMA-BUF or "
        "nvidia-peermem); MKERNEL_PROXY_GDR=auto keeps its buffers in host memory",
        backend);
  out->gpu = true;
  out->flush = rdmaWritesOrdering < 100;  // cudaGPUDirectRDMAWritesOrderingOwner
  out->why =
      std::string("GPU memory registered with ") + backend +
      (out->flush
           ? " (each receive flushed: this GPU does not order the NIC's writes for its kernels)"
           : " (no flush: this GPU orders the NIC's writes for its kernels)");
  return Result::Success;
}

std::vector<int> proxyPinCpus(const std::vector<int>& placementCpus,
                              const std::vector<int>& allowed) {
  std::vector<int> out;
  for (int c : placementCpus)
    if (std::find(allowed.begin(), allowed.end(), c) != allowed.end() &&
        std::find(out.begin(), out.end(), c) == out.end())
      out.push_back(c);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> proxyCpusFor(int cudaDev, std::string* why) {
  if (!params::PROXY_PIN()) {
    *why = "not pinned (MKERNEL_PROXY_PIN=0)";
    return {};
  }
  const topo::NodeModel* model = nullptr;
  if (topo::localNodeModel(&model) != Result::Success) {
    *why = std::string("not pinned: no topology (") + lastError() + ")";
    return {};
  }
  if (cudaDev < 0 || cudaDev >= static_cast<int>(model->place.gpus.size())) {
    *why = "not pinned: GPU " + std::to_string(cudaDev) + " is not in the topology";
    return {};
  }
  const topo::GpuPlacement& g = model->place.gpus[static_cast<size_t>(cudaDev)];
  const std::vector<int> allowed = processCpus();
  std::vector<int> cpus = proxyPinCpus(g.proxyCpus, allowed);
  const std::string where =
      g.proxyNuma >= 0 ? "NUMA node " + std::to_string(g.proxyNuma) : std::string("all CPUs");
  if (cpus.empty()) {
    *why = "not pinned: the placement's CPUs " + topo::formatCpuList(g.proxyCpus) + " (" + where +
           ") are outside this process's affinity " + topo::formatCpuList(allowed);
    return {};
  }
  *why = "pinned to CPUs " + topo::formatCpuList(cpus) + " (" + where + ", near GPU " +
         std::to_string(cudaDev) +
         (g.nic >= 0 ? "'s rail NIC " + model->topo.nics[static_cast<size_t>(g.nic)].name
                     : std::string()) +
         ")";
  return cpus;
}

}  // namespace coll
}  // namespace mkernel
