// The process-wide NodeModel (placement.h): discovery is not free (hwloc with I/O objects, NVML,
// verbs: tens of milliseconds), and every rank thread of a process must see the same model.
#include <memory>
#include <mutex>

#include "common/log.h"
#include "topology/placement.h"

namespace mkernel {
namespace topo {

Result localNodeModel(const NodeModel** out) {
  static std::mutex mu;
  static std::unique_ptr<NodeModel> model;
  if (out == nullptr) return MK_ERROR(Result::InvalidArgument, "localNodeModel: null output");
  std::lock_guard<std::mutex> lock(mu);
  if (!model) {
    std::unique_ptr<NodeModel> fresh(new NodeModel());
    MK_CHECK(discoverTopology(defaultDiscoverOptions(), &fresh->topo));
    fresh->place = computePlacement(fresh->topo);
    for (const GpuPlacement& g : fresh->place.gpus)
      MK_INFO(kLogGraph | kLogInit, "placement: GPU %d (%s) rail NIC %s, proxy CPUs %s", g.gpu,
              fresh->topo.gpus[g.gpu].pci.busId.c_str(),
              g.nic >= 0 ? fresh->topo.nics[g.nic].name.c_str() : "none",
              formatCpuList(g.proxyCpus).c_str());
    model = std::move(fresh);
  }
  *out = model.get();
  return Result::Success;
}

}  // namespace topo
}  // namespace mkernel
