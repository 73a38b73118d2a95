// mkernel-topo's two renderings of a Topology + Placement: the human table and the JSON document
// (keys in docs/TOPOLOGY.md). Kept apart from main() so that tests check the output itself.
#pragma once

#include <string>

#include "topology/placement.h"
#include "topology/topology.h"

namespace mkernel {
namespace topo {

std::string renderTable(const Topology& topo, const Placement& place);
std::string renderJson(const Topology& topo, const Placement& place);

}  // namespace topo
}  // namespace mkernel
