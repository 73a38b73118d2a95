// Verbs part of discovery against real verbs devices (label "verbs": runs inside the Soft-RoCE VM
// of scripts/verbs-tier.sh, where rxe0 exists). Fails where no verbs device exists, by design.
#include "tests/catch.h"

#include <string>

#include "topology/placement.h"
#include "topology/topology.h"

using mkernel::Result;
using namespace mkernel::topo;

TEST_CASE("verbs: devices are found with port state, link layer and speed") {
  Topology t;
  std::string why;
  REQUIRE(queryVerbsNics(&t, &why));
  REQUIRE_FALSE(t.nics.empty());
  bool anyActive = false;
  for (const Nic& n : t.nics) {
    INFO("NIC " << n.name);
    CHECK(n.fromVerbs);
    CHECK_FALSE(n.name.empty());
    CHECK_FALSE(n.state.empty());
    CHECK((n.linkLayer == "Ethernet" || n.linkLayer == "InfiniBand"));
    if (n.state == "ACTIVE") {
      anyActive = true;
      CHECK(n.speedGbps > 0);
    }
  }
  CHECK(anyActive);
}

TEST_CASE("verbs: live discovery merges verbs devices; a virtual NIC is SYS to everything") {
  Topology t;
  DiscoverOptions o;
  REQUIRE(discoverTopology(o, &t) == Result::Success);
  REQUIRE_FALSE(t.nics.empty());
  for (const Nic& n : t.nics) {
    CHECK(n.fromVerbs);
    if (n.pci.busId.empty()) {  // rxe: no PCI function
      PciLocation other;
      other.busId = "0000:01:00.0";
      other.hostBridge = other.cpuAnchor = 1;
      CHECK(pciPathClass(n.pci, other) == PathClass::Sys);
    }
  }
}
