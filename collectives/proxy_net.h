// The net backend of this rank's proxy (docs/PROXY.md), with its NIC chosen by the topology
// placement: the verbs backend numbers the rail NICs of the rank's GPU first (primary first), so
// that device 0 is the GPU's nearest NIC (DESIGN.md §6; issue "RDMA verbs": the NIC is chosen from
// the topology placement). MKERNEL_NET_BACKEND applies as for the net plugin.
#pragma once

#include "common/result.h"
#include "transport/net/backend.h"

namespace mkernel {
namespace coll {

// cudaDev: the rank's CUDA device index. When the node's topology cannot be discovered, the
// verbs devices keep discovery order (said in out->why).
Result createProxyNet(int cudaDev, net::BackendChoice* out);

}  // namespace coll
}  // namespace mkernel
