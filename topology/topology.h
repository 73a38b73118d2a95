// The node's topology model (docs/TOPOLOGY.md): GPUs, RDMA NICs, NUMA nodes and the PCI tree that
// joins them, plus NVLink connectivity. Built by discoverTopology() from hwloc (the live machine or
// an hwloc XML file), NVML (or an NVLink matrix file) and verbs; turned into decisions by
// computePlacement() (topology/placement.h).
//
// The model is plain data with no hwloc types in it, so that collectives/, the tuner and the tests
// use it without hwloc, and so that a placement can be computed from a model built by hand.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace mkernel {
namespace topo {

// nvidia-smi's connection classes, best first. Nvlink is printed NV<links>.
enum class PathClass : int { Self = 0, Nvlink = 1, Pix = 2, Pxb = 3, Phb = 4, Node = 5, Sys = 6 };
const char* pathClassName(PathClass c);  // "X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS"

// Where a PCI device hangs in the tree, as seen from hwloc. `bridges` lists the PCI-to-PCI
// bridges (root ports, switch up/downstream ports) from the device's parent upwards;
// `hostBridge` and `cpuAnchor` identify its host bridge and its nearest non-I/O ancestor
// (Package / Group / Machine) by hwloc's global-persistent index, unique within one topology.
struct PciLocation {
  std::string busId;              // "0000:1b:00.0"; empty when unknown (virtual NIC)
  std::vector<uint64_t> bridges;  // nearest first
  uint64_t hostBridge = 0;        // 0: unknown
  uint64_t cpuAnchor = 0;         // 0: unknown
  int numa = -1;                  // NUMA node os index, -1 when unknown or ambiguous
};

struct Gpu {
  int index = 0;  // CUDA device index (PCI bus order, CUDA_VISIBLE_DEVICES applied)
  uint16_t vendor = 0, device = 0;
  PciLocation pci;
  std::string name;  // NVML's product name ("NVIDIA H200"); "" when NVML is absent
};

struct Nic {
  std::string name;  // verbs device name ("mlx5_0"); PCI bus id when no name is known
  uint16_t vendor = 0, device = 0;
  PciLocation pci;
  int port = 1;            // first active port (1 when nothing was queried)
  std::string state;       // "ACTIVE", "DOWN", ... ("" when verbs is absent)
  std::string linkLayer;   // "InfiniBand", "Ethernet" ("" when verbs is absent)
  double speedGbps = 0;    // 0: unknown
  bool fromVerbs = false;  // verbs confirmed the device
};

struct NumaNode {
  int osIndex = 0;
  std::vector<int> cpus;  // PU os indexes
};

// NVLink connectivity between the GPUs (indexed like Topology::gpus).
struct NvlinkMatrix {
  int nGpus = 0;
  std::vector<int> links;        // nGpus x nGpus: direct GPU-GPU links (0 on the diagonal)
  std::vector<int> switchLinks;  // per GPU: links to an NVSwitch
  bool empty() const;
  // Links usable between a and b: direct ones plus, when both reach an NVSwitch, the smaller of
  // their switch link counts (what nvidia-smi prints as NV<n> on an NVSwitch system).
  int pairLinks(int a, int b) const;
  bool hasNvswitch() const;
};

struct Topology {
  std::string source;     // "live", or the hwloc XML path
  std::vector<Gpu> gpus;  // CUDA order
  std::vector<Nic> nics;  // by PCI bus id, then name
  std::vector<NumaNode> numaNodes;
  std::vector<int> allCpus;
  int nPackages = 0;
  NvlinkMatrix nvlink;
  std::string nvlinkSource;        // "nvml", a matrix file path, or "" (none)
  std::vector<std::string> notes;  // what was not found or not available, one line each
};

struct DiscoverOptions {
  std::string hwlocXml;          // empty: the live machine (MKERNEL_TOPO_XML if set)
  std::string nvlinkMatrixFile;  // empty: NVML on the live machine (MKERNEL_NVLINK_MATRIX)
  bool useNvml = true;           // only when nvlinkMatrixFile is empty and the source is live
  bool useVerbs = true;          // only on the live machine
  bool applyCudaVisibleDevices = true;  // only on the live machine
};

// The options a default caller gets: the MKERNEL_TOPO_XML / MKERNEL_NVLINK_MATRIX overrides.
DiscoverOptions defaultDiscoverOptions();

// Builds the model. Missing GPUs, NICs, NVML or verbs are not errors (they are listed in
// topo->notes); an unreadable XML or matrix file is.
Result discoverTopology(const DiscoverOptions& opts, Topology* topo);

// ---- pieces, exposed for tests and tools --------------------------------------------------------

// hwloc part: GPUs, NICs (without verbs details), NUMA nodes, CPUs. xmlPath empty = live.
Result loadHwlocTopology(const std::string& xmlPath, Topology* topo);

// NVLink matrix text format (docs/TOPOLOGY.md):
//   # comment                      anywhere after '#'
//   gpus <n>                       optional; the number of GPUs the matrix describes
//   <i> <j> <nlinks>               direct links between GPU i and GPU j (symmetric)
//   nvswitch <nlinks>              every GPU has <nlinks> links into an NVSwitch fabric
//   nvswitch <i> <nlinks>          GPU i has <nlinks> links into an NVSwitch fabric
Result parseNvlinkMatrix(const std::string& text, int nGpus, NvlinkMatrix* out, std::string* err);
Result loadNvlinkMatrixFile(const std::string& path, int nGpus, NvlinkMatrix* out);
std::string formatNvlinkMatrix(const NvlinkMatrix& m);

// NVML part (dlopen of libnvidia-ml.so.1). Fills topo->nvlink for topo->gpus; returns false with
// *why when NVML is absent or fails.
bool queryNvmlNvlinks(Topology* topo, std::string* why);

// verbs part (dlopen of libibverbs.so.1): names, ports, states, speeds; adds NICs that hwloc did
// not show (virtual ones such as rxe). Returns false with *why when verbs is absent.
bool queryVerbsNics(Topology* topo, std::string* why);

// "0-3,8,10-11" <-> {0,1,2,3,8,10,11}
std::string formatCpuList(const std::vector<int>& cpus);
std::vector<int> parseCpuList(const std::string& text);

}  // namespace topo
}  // namespace mkernel
