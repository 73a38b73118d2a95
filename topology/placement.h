// Placement decisions derived from a Topology (docs/TOPOLOGY.md): each GPU's rail NIC(s), the CPUs
// its proxy thread is pinned to, the distance class of every GPU-GPU / GPU-NIC / NIC-NIC pair and
// the intra-node ring order. Pure functions of the model: the same model gives the same placement
// on every rank, which the kernel's rail/ring order relies on.
#pragma once

#include <string>
#include <vector>

#include "topology/topology.h"

namespace mkernel {
namespace topo {

// PCIe/CPU distance class between two PCI locations (never Nvlink or Self):
//   PIX  both below one PCIe switch (at most one bridge between each device and the shared bridge)
//   PXB  a shared PCIe bridge, but through several switch levels
//   PHB  the same host bridge (root complex), no shared switch
//   NODE different host bridges of the same CPU package / NUMA node
//   SYS  across the CPU interconnect, or unknown location (virtual NIC)
PathClass pciPathClass(const PciLocation& a, const PciLocation& b);

struct GpuPlacement {
  int gpu = 0;
  int nic = -1;            // primary rail NIC (index into Topology::nics), -1: none
  std::vector<int> rails;  // every NIC at the GPU's best distance class, primary first
  PathClass nicClass = PathClass::Sys;
  int proxyNuma = -1;          // NUMA node the proxy CPUs belong to (-1: all CPUs)
  std::vector<int> proxyCpus;  // the proxy thread's CPU set
};

struct Placement {
  int nGpus = 0;
  int nNics = 0;
  std::vector<PathClass> gpuGpu;  // nGpus x nGpus
  std::vector<int> gpuGpuLinks;   // nGpus x nGpus NVLink count (for NV<n>)
  std::vector<PathClass> gpuNic;  // nGpus x nNics
  std::vector<PathClass> nicNic;  // nNics x nNics
  std::vector<GpuPlacement> gpus;
  std::vector<int> ringOrder;  // GPU indexes; neighbours in this order are ring neighbours
  std::string ringReason;      // why this order ("nvlink all-to-all", "nvlink cycle", "pcie")

  PathClass gpuToGpu(int a, int b) const { return gpuGpu[static_cast<size_t>(a) * nGpus + b]; }
  PathClass gpuToNic(int g, int n) const { return gpuNic[static_cast<size_t>(g) * nNics + n]; }
  // "X", "NV18", "PIX", ... as nvidia-smi topo -m prints them.
  std::string gpuGpuLabel(int a, int b) const;
};

Placement computePlacement(const Topology& topo);

// Whether the GPUs with these PCI bus ids ("0000:1B:00.0" as CUDA writes them; duplicates are
// one GPU) reach each other all-to-all over NVLink (direct links, or an NVSwitch both reach), so
// that every rank may read and write every other at once: the direct algorithms' premise. A PCIe
// box (NVLink model present, some pair without a link) is not: the selection policy then runs
// rings (collectives/algo/staged_ring.h). One GPU is. Unknown (no NVLink model, as without NVML, or
// a bus id the model lacks) counts as all-to-all, the default before this rule, and says so in
// *why.
bool gpusNvlinkAllToAll(const Topology& topo, const std::vector<std::string>& busIds,
                        std::string* why);

// The ranks of one host in ring order, for rings in the persistent kernel (MKERNEL_RING_ORDER=auto,
// collectives/runtime/peer_memory.cc): rankBusIds[r] is rank r's GPU (bus id as CUDA writes it);
// the ranks are sorted by their GPU's position in place.ringOrder (PCIe: nearest neighbour, sockets
// together; partial NVLink: its cycle), ranks of one GPU together in rank order. *order[p] is the
// rank at position p. False, with *order the rank order and *why saying so, when a bus id is
// unreadable or not in the model.
bool ranksInRingOrder(const Topology& topo, const Placement& place,
                      const std::vector<std::string>& rankBusIds, std::vector<int>* order,
                      std::string* why);

// The verbs names of GPU `gpu`'s rail NICs, primary first (empty for an unknown GPU or none):
// the order the proxy's verbs backend numbers its devices in (net::ib::setIbPreferredDevices).
std::vector<std::string> railNicNames(const Topology& topo, const Placement& place, int gpu);

// This process's node: discovered once (defaultDiscoverOptions(), so MKERNEL_TOPO_XML /
// MKERNEL_NVLINK_MATRIX apply, and CUDA_VISIBLE_DEVICES on the live machine, so GPU indexes are
// this process's CUDA device indexes) and kept for the life of the process. What the proxy
// (CPU pinning, NIC choice) and the kernel's ring/rail order read. Thread-safe; a failed
// discovery is reported on every call (MK_ERROR) and retried.
struct NodeModel {
  Topology topo;
  Placement place;
};
Result localNodeModel(const NodeModel** out);

}  // namespace topo
}  // namespace mkernel
