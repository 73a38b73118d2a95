#include "collectives/proxy_net.h"

#include <string>
#include <vector>

#include "common/log.h"
#include "topology/placement.h"

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

}  // namespace coll
}  // namespace mkernel
