// The net backend of this rank's proxy (docs/PROXY.md), with its NIC chosen by the topology
// placement: the verbs backend numbers the rail NICs of the rank's GPU first (primary first), so
// that device 0 is the GPU's nearest NIC (docs/TOPOLOGY.md, rails and NIC choice).
// MKERNEL_NET_BACKEND applies as for the net plugin.
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
std::vector<int> proxyPinCpus(const std::vector<int>& placementCpus,
                              const std::vector<int>& allowed);

// The CPU set for the proxy of the rank on CUDA device `cudaDev` (docs/TOPOLOGY.md, proxy
// placement: the NUMA node of its rail NIC, else of the GPU, from the topology placement), within
// the process's affinity; empty with MKERNEL_PROXY_PIN=0, without a topology, or when the two sets
// do not meet. `why` says which and the set, for the INFO line.
std::vector<int> proxyCpusFor(int cudaDev, std::string* why);

// Where the proxy's net buffers live (MKERNEL_PROXY_GDR; docs/PROXY.md, "GPU memory"). In GPU
// memory, registered with the backend, when the backend can register CUDA memory (ptrSupport has
// net::kPtrCuda: verbs with DMA-BUF or nvidia-peermem) and the variable allows it: the NIC then
// reads and writes them directly, and the kernel's copies stay in HBM. Otherwise in host-mapped
// memory, which the kernel reads and writes over PCIe and the backend from the host (the proxy
// stages through host memory; TCP can do nothing else).
struct ProxyMemory {
  bool gpu = false;    // net buffers in GPU memory, registered as net::kPtrCuda
  bool flush = false;  // the proxy flushes each receive before its flag (Proxy::setFlushReceives)
  std::string why;     // for the INFO line
};
// gdr: MKERNEL_PROXY_GDR ("auto", "1": GPU memory or an error, "0": host memory). ptrSupport:
// the backend's DeviceProps::ptrSupport; backend: its name. rdmaWritesOrdering: the GPU's
// cudaDevAttrGPUDirectRDMAWritesOrdering; from 100 (cudaGPUDirectRDMAWritesOrderingOwner) the
// NIC's writes reach the GPU's own kernels in order and need no flush, below it they do.
Result proxyMemoryFor(const std::string& gdr, int ptrSupport, const char* backend,
                      int rdmaWritesOrdering, ProxyMemory* out);

}  // namespace coll
}  // namespace mkernel
