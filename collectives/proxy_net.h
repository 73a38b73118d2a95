// The net backend of this rank's proxy (docs/PROXY.md), with its NIC chosen by the topology
// placement: the verbs backend numbers the rail NICs of the rank's GPU first (primary first), so
// that device 0 is the GPU's nearest NIC (DESIGN.md §6; issue "RDMA verbs": the NIC is chosen from
// the topology placement). MKERNEL_NET_BACKEND applies as for the net plugin.
#pragma once

#include <string>
#include <vector>

#include "common/result.h"
#include "transport/net/backend.h"

namespace mkernel {
namespace coll {

// cudaDev: the rank's CUDA device index. When the node's topology cannot be discovered, the
// verbs devices keep discovery order (said in out->why).
Result createProxyNet(int cudaDev, net::BackendChoice* out);

// The CPUs a proxy thread is pinned to: the placement's CPUs that this process may run on (an
// empty result: no pinning, since pinning outside the process's affinity fails).
std::vector<int> proxyPinCpus(const std::vector<int>& placementCpus, const std::vector<int>& allowed);

// The CPU set for the proxy of the rank on CUDA device `cudaDev` (DESIGN.md §6: the NUMA node of
// its rail NIC, else of the GPU, from the topology placement), within the process's affinity;
// empty with MKERNEL_PROXY_PIN=0, without a topology, or when the two sets do not meet. `why`
// says which and the set, for the INFO line.
std::vector<int> proxyCpusFor(int cudaDev, std::string* why);

}  // namespace coll
}  // namespace mkernel
