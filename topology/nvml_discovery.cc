// NVML part of discovery: NVLink peers, link counts and NVSwitches, through the vendor layer's
// libnvidia-ml.so.1 (vendor/nvml.h).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "common/dl.h"
#include "common/log.h"
#include "topology/topology.h"
#include "vendor/nvml.h"

namespace mkernel {
namespace topo {

using namespace nvml;  // NOLINT(build/namespaces): the NVML types and constants

namespace {

// "0000:1b:00.0" from the numeric fields (NVML's own text uses an 8-digit domain).
std::string busIdFromNvml(const NvmlPciInfo& p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.0", p.domain, p.bus, p.device);
  return buf;
}

}  // namespace

bool queryNvmlNvlinks(Topology* topo, std::string* why) {
  NvmlApi& api = nvmlApi();
  if (!api.loaded) {
    *why = api.why;
    return false;
  }
  NvmlReturn r = api.init();
  if (r != kNvmlSuccess) {
    *why = std::string("nvmlInit failed: ") + api.errorString(r);
    return false;
  }
  const int n = static_cast<int>(topo->gpus.size());
  NvlinkMatrix m;
  m.nGpus = n;
  m.links.assign(static_cast<size_t>(n) * n, 0);
  m.switchLinks.assign(n, 0);
  int devicesSeen = 0;
  for (int g = 0; g < n; ++g) {
    NvmlDevice dev = nullptr;
    if (api.getHandleByPciBusId(topo->gpus[g].pci.busId.c_str(), &dev) != kNvmlSuccess) {
      MK_INFO(kLogGraph, "NVML does not know GPU %d (%s); no NVLink for it", g,
              topo->gpus[g].pci.busId.c_str());
      continue;
    }
    ++devicesSeen;
    if (api.getName != nullptr) {
      char name[96] = {0};  // NVML_DEVICE_NAME_V2_BUFFER_SIZE
      if (api.getName(dev, name, sizeof(name)) == kNvmlSuccess) topo->gpus[g].name = name;
    }
    for (unsigned link = 0; link < kNvmlMaxLinks; ++link) {
      int active = 0;
      if (api.getNvLinkState(dev, link, &active) != kNvmlSuccess || active == 0) continue;
      NvmlPciInfo remote;
      std::memset(&remote, 0, sizeof(remote));
      if (api.getNvLinkRemotePciInfo(dev, link, &remote) != kNvmlSuccess) continue;
      std::string remoteBusId = busIdFromNvml(remote);
      int peer = -1;
      for (int h = 0; h < n; ++h)
        if (topo->gpus[h].pci.busId.compare(0, 12, remoteBusId, 0, 12) == 0) peer = h;
      int remoteType = peer >= 0 ? kNvmlRemoteIsGpu : kNvmlRemoteIsSwitch;
      if (api.getNvLinkRemoteDeviceType != nullptr) {
        int t = -1;
        if (api.getNvLinkRemoteDeviceType(dev, link, &t) == kNvmlSuccess) remoteType = t;
      }
      if (remoteType == kNvmlRemoteIsSwitch) {
        ++m.switchLinks[g];
      } else if (remoteType == kNvmlRemoteIsGpu && peer >= 0 && peer != g) {
        ++m.links[static_cast<size_t>(g) * n + peer];
      }
    }
  }
  api.shutdown();
  // Each direct link was counted from both ends; keep the symmetric minimum (a link NVML reports
  // on one side only is not usable both ways).
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) {
      size_t ab = static_cast<size_t>(a) * n + b, ba = static_cast<size_t>(b) * n + a;
      m.links[ab] = m.links[ba] = std::min(m.links[ab], m.links[ba]);
    }
  topo->nvlink = m;
  if (devicesSeen == 0 && n > 0) {
    *why = "NVML knows none of the GPUs hwloc found";
    return false;
  }
  return true;
}

}  // namespace topo
}  // namespace mkernel
