// NVML part of discovery: NVLink peers, link counts and NVSwitches, through a dlopen'd
// libnvidia-ml.so.1 (never linked: the library loads on hosts without the driver).
//
// Only the symbols that have existed unversioned since NVML's first NVLink API are used, as NCCL
// does, and the PCI info struct is read through its stable prefix (bus id text, then domain, bus,
// device), which every layout of nvmlPciInfo_t shares.
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "common/dl.h"
#include "common/log.h"
#include "topology/topology.h"

namespace mkernel {
namespace topo {
namespace {

using NvmlReturn = int;  // nvmlReturn_t: 0 = NVML_SUCCESS
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr unsigned kNvmlMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS
constexpr int kNvmlRemoteIsGpu = 0;     // NVML_NVLINK_DEVICE_TYPE_GPU
constexpr int kNvmlRemoteIsSwitch = 2;  // NVML_NVLINK_DEVICE_TYPE_SWITCH

// nvmlPciInfo_t's shared prefix, padded so that any later layout fits.
struct NvmlPciInfo {
  char busIdLegacy[16];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pciDeviceId;
  unsigned pciSubSystemId;
  char rest[128];
};

struct NvmlApi {
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  NvmlReturn (*getHandleByPciBusId)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*getNvLinkState)(NvmlDevice, unsigned, int*) = nullptr;
  NvmlReturn (*getNvLinkRemotePciInfo)(NvmlDevice, unsigned, NvmlPciInfo*) = nullptr;
  NvmlReturn (*getNvLinkRemoteDeviceType)(NvmlDevice, unsigned, int*) = nullptr;  // optional
  NvmlReturn (*getName)(NvmlDevice, char*, unsigned) = nullptr;                    // optional
  const char* (*errorString)(NvmlReturn) = nullptr;
  bool loaded = false;
  std::string why;
};

NvmlApi& nvml() {
  static NvmlApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* names[] = {"libnvidia-ml.so.1", nullptr};
    void* h = dlOpenFirst(names, RTLD_NOW | RTLD_LOCAL, &api.why);
    if (h == nullptr) {
      api.why = "libnvidia-ml.so.1 not found (" + api.why + ")";
      return;
    }
    DlSymbol syms[] = {
        {"nvmlInit_v2", reinterpret_cast<void**>(&api.init), true},
        {"nvmlShutdown", reinterpret_cast<void**>(&api.shutdown), true},
        {"nvmlDeviceGetHandleByPciBusId", reinterpret_cast<void**>(&api.getHandleByPciBusId), true},
        {"nvmlDeviceGetNvLinkState", reinterpret_cast<void**>(&api.getNvLinkState), true},
        {"nvmlDeviceGetNvLinkRemotePciInfo", reinterpret_cast<void**>(&api.getNvLinkRemotePciInfo),
         true},
        {"nvmlDeviceGetNvLinkRemoteDeviceType",
         reinterpret_cast<void**>(&api.getNvLinkRemoteDeviceType), false},
        {"nvmlDeviceGetName", reinterpret_cast<void**>(&api.getName), false},
        {"nvmlErrorString", reinterpret_cast<void**>(&api.errorString), true},
    };
    if (dlLoadSymbols(h, "libnvidia-ml.so.1", syms, sizeof(syms) / sizeof(syms[0]), &api.why) !=
        Result::Success) {
      dlclose(h);
      return;
    }
    // The library stays open for the life of the process: NVML keeps driver state per process.
    api.loaded = true;
  });
  return api;
}

// "0000:1b:00.0" from the numeric fields (NVML's own text uses an 8-digit domain).
std::string busIdFromNvml(const NvmlPciInfo& p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.0", p.domain, p.bus, p.device);
  return buf;
}

}  // namespace

bool queryNvmlNvlinks(Topology* topo, std::string* why) {
  NvmlApi& api = nvml();
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
