// Discovery as a whole: hwloc (live or XML) + NVLink (NVML or a matrix file) + verbs, with
// CUDA_VISIBLE_DEVICES applied to the GPU list of the live machine.
#include <unistd.h>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include <algorithm>

#include "common/log.h"
#include "common/param.h"
#include "vendor/ibverbs.h"
#include "topology/topology.h"

namespace mkernel {
namespace topo {
namespace {

// The PCI bus id behind /sys/class/infiniband/<dev>/device ("" for a virtual device such as rxe,
// whose link points at a network interface rather than a PCI function).
std::string sysfsPciBusId(const char* ibdev) {
  std::string link = std::string("/sys/class/infiniband/") + ibdev + "/device";
  char target[PATH_MAX];
  ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return "";
  target[n] = '\0';
  const char* base = std::strrchr(target, '/');
  base = base ? base + 1 : target;
  unsigned d = 0, b = 0, s = 0, f = 0;
  if (std::sscanf(base, "%x:%x:%x.%x", &d, &b, &s, &f) != 4) return "";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%x", d, b, s, f);
  return buf;
}

const char* portStateName(int s) {
  switch (s) {
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER:
      return "ACTIVE_DEFER";
    default:
      return "NOP";
  }
}

// CUDA_VISIBLE_DEVICES as a list of indexes into the bus-ordered GPUs. Returns false when unset
// or not a plain index list (UUIDs/MIG names need the CUDA driver to resolve).
bool visibleDevices(int nGpus, std::vector<int>* order, std::string* note) {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  if (v == nullptr) return false;
  std::string s(v);
  order->clear();
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string tok = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (tok.empty()) break;
    char* end = nullptr;
    long idx = std::strtol(tok.c_str(), &end, 10);
    if (end == tok.c_str() || *end != '\0') {
      *note =
          "CUDA_VISIBLE_DEVICES=" + s + " is not a list of indexes; GPUs are shown in PCI order";
      return false;
    }
    // CUDA stops at the first invalid index.
    if (idx < 0 || idx >= nGpus) break;
    order->push_back(static_cast<int>(idx));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return true;
}

}  // namespace

bool queryVerbsNics(Topology* topo, std::string* why) {
  // The verbs transport's loader (one dlopen of libibverbs per process, shared with it).
  const verbs::IbvApi* ibv = verbs::loadIbvApi(why);
  if (ibv == nullptr) return false;
  int n = 0;
  ibv_device** list = ibv->getDeviceList(&n);
  if (list == nullptr) {
    // No list at all means no RDMA driver/sysfs on this host (errno says which).
    *why = std::string("ibv_get_device_list found no RDMA devices (") + std::strerror(errno) + ")";
    return false;
  }
  for (int i = 0; i < n; ++i) {
    const char* name = ibv->getDeviceName(list[i]);
    if (name == nullptr) continue;
    std::string busId = sysfsPciBusId(name);
    Nic* nic = nullptr;
    for (Nic& x : topo->nics)
      if (x.name == name || (!busId.empty() && x.pci.busId == busId)) nic = &x;
    if (nic == nullptr) {
      Nic fresh;
      fresh.name = name;
      fresh.pci.busId = busId;  // a PCI function hwloc did not show, or "" for a virtual NIC
      topo->nics.push_back(fresh);
      nic = &topo->nics.back();
    }
    nic->name = name;
    nic->fromVerbs = true;
    ibv_context* ctx = ibv->openDevice(list[i]);
    if (ctx == nullptr) {
      topo->notes.push_back(std::string("verbs device ") + name + " cannot be opened");
      continue;
    }
    ibv_device_attr dattr;
    std::memset(&dattr, 0, sizeof(dattr));
    if (ibv->queryDevice(ctx, &dattr) == 0) {
      // The first ACTIVE port describes the NIC; otherwise port 1 as it is.
      for (int p = 1; p <= dattr.phys_port_cnt; ++p) {
        ibv_port_attr pattr;
        std::memset(&pattr, 0, sizeof(pattr));
        if (ibv->queryPort(ctx, static_cast<uint8_t>(p), &pattr) != 0) continue;
        bool active = pattr.state == IBV_PORT_ACTIVE;
        if (p == 1 || active) {
          nic->port = p;
          nic->state = portStateName(pattr.state);
          nic->linkLayer = pattr.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
          nic->speedGbps = verbs::portSpeedMbps(pattr.active_speed, pattr.active_width) / 1000.0;
        }
        if (active) break;
      }
    }
    ibv->closeDevice(ctx);
  }
  ibv->freeDeviceList(list);
  return true;
}

DiscoverOptions defaultDiscoverOptions() {
  DiscoverOptions o;
  o.hwlocXml = params::TOPO_XML();
  o.nvlinkMatrixFile = params::NVLINK_MATRIX();
  return o;
}

Result discoverTopology(const DiscoverOptions& opts, Topology* topo) {
  *topo = Topology();
  MK_CHECK(loadHwlocTopology(opts.hwlocXml, topo));
  const bool live = opts.hwlocXml.empty();

  if (live && opts.applyCudaVisibleDevices) {
    std::vector<int> order;
    std::string note;
    if (visibleDevices(static_cast<int>(topo->gpus.size()), &order, &note)) {
      std::vector<Gpu> visible;
      for (int idx : order) visible.push_back(topo->gpus[idx]);
      for (size_t i = 0; i < visible.size(); ++i) visible[i].index = static_cast<int>(i);
      topo->gpus = visible;
    } else if (!note.empty()) {
      topo->notes.push_back(note);
    }
  }
  if (topo->gpus.empty())
    topo->notes.push_back("no NVIDIA GPU (PCI vendor 0x10de, class 0x0302/0x0300) found");

  const int nGpus = static_cast<int>(topo->gpus.size());
  topo->nvlink.nGpus = nGpus;
  topo->nvlink.links.assign(static_cast<size_t>(nGpus) * nGpus, 0);
  topo->nvlink.switchLinks.assign(nGpus, 0);
  if (!opts.nvlinkMatrixFile.empty()) {
    MK_CHECK(loadNvlinkMatrixFile(opts.nvlinkMatrixFile, nGpus, &topo->nvlink));
    topo->nvlinkSource = opts.nvlinkMatrixFile;
  } else if (!live && nGpus > 0) {
    topo->notes.push_back(
        "NVLink unknown: an hwloc XML topology carries no NVLink; pass an NVLink matrix");
  } else if (live && opts.useNvml && nGpus > 0) {
    std::string why;
    if (queryNvmlNvlinks(topo, &why)) {
      topo->nvlinkSource = "nvml";
    } else {
      topo->notes.push_back("NVML unavailable, NVLink unknown: " + why);
      MK_INFO(kLogGraph, "NVML unavailable, NVLink unknown: %s", why.c_str());
    }
  }

  if (live && opts.useVerbs) {
    std::string why;
    if (!queryVerbsNics(topo, &why)) {
      topo->notes.push_back("verbs unavailable, NIC names/speeds from hwloc only: " + why);
      MK_INFO(kLogGraph, "verbs unavailable: %s", why.c_str());
    }
  }
  if (topo->nics.empty())
    topo->notes.push_back("no RDMA NIC (Mellanox 0x15b3 / EFA 0x1d0f, or any verbs device) found");
  return Result::Success;
}

}  // namespace topo
}  // namespace mkernel
