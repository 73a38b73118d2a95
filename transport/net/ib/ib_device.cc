#include "transport/net/ib/ib_device.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "common/log.h"
#include "common/param.h"
#include "transport/net/ib/cuda_dmabuf.h"
#include "transport/net/net.h"

namespace mkernel {
namespace net {
namespace ib {

// ---- MKERNEL_IB_HCA
// ------------------------------------------------------------------------------

HcaFilter::HcaFilter(const std::string& spec) {
  size_t pos = 0;
  if (pos < spec.size() && spec[pos] == '^') {
    exclude_ = true;
    ++pos;
  }
  if (pos < spec.size() && spec[pos] == '=') {
    exact_ = true;
    ++pos;
  }
  while (pos < spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string item =
        spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? spec.size() : comma + 1;
    if (item.empty()) continue;
    Entry e;
    size_t colon = item.find(':');
    e.name = item.substr(0, colon);
    if (colon != std::string::npos) e.port = std::atoi(item.c_str() + colon + 1);
    if (!e.name.empty()) entries_.push_back(e);
  }
}

bool HcaFilter::selects(const std::string& device, int port) const {
  if (entries_.empty()) return true;
  bool listed = false;
  for (const Entry& e : entries_) {
    bool nameMatch = exact_ ? device == e.name : device.compare(0, e.name.size(), e.name) == 0;
    if (nameMatch && (e.port < 0 || e.port == port)) listed = true;
  }
  return exclude_ ? !listed : listed;
}

// ---- properties
// ----------------------------------------------------------------------------------

namespace {

std::string readSysfsLine(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return line;
}

bool isIpv4Mapped(const ibv_gid& g) {
  static const uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, kPrefix, sizeof(kPrefix)) == 0;
}

bool isZero(const ibv_gid& g) {
  for (uint8_t b : g.raw)
    if (b != 0) return false;
  return true;
}

std::string pciPathOf(const std::string& ibvName) {
  // A PCI NIC: /sys/class/infiniband/<dev>/device -> /sys/devices/pci.../0000:xx:yy.z. A soft
  // device (rxe, siw) has no "device" link: report its virtual sysfs directory instead.
  char buf[PATH_MAX];
  std::string base = "/sys/class/infiniband/" + ibvName;
  if (realpath((base + "/device").c_str(), buf) != nullptr) return buf;
  if (realpath(base.c_str(), buf) != nullptr) return buf;
  return std::string();
}

}  // namespace

Result selectRoceGid(const IbvApi& api, IbDevice* dev, const ibv_port_attr& port) {
  const int forced = static_cast<int>(params::IB_GID_INDEX());
  if (forced >= 0) {
    if (api.queryGid(dev->ctx, uint8_t(dev->port), forced, &dev->gid) != 0)
      return MK_ERROR(Result::SystemError,
                      "NET/IB: %s port %d: MKERNEL_IB_GID_INDEX=%d: ibv_query_gid failed",
                      dev->ibvName.c_str(), dev->port, forced);
    dev->gidIndex = forced;
  } else {
    std::string types = "/sys/class/infiniband/" + dev->ibvName + "/ports/" +
                        std::to_string(dev->port) + "/gid_attrs/types/";
    int firstV2 = -1;
    ibv_gid firstV2Gid{};
    for (int i = 0; i < port.gid_tbl_len && dev->gidIndex < 0; ++i) {
      ibv_gid g{};
      if (api.queryGid(dev->ctx, uint8_t(dev->port), i, &g) != 0 || isZero(g)) continue;
      std::string type = readSysfsLine(types + std::to_string(i));
      // Without sysfs (some containers) an IPv4-mapped GID is taken as RoCE v2.
      bool v2 = type.empty() ? isIpv4Mapped(g) : type == "RoCE v2";
      if (!v2) continue;
      if (isIpv4Mapped(g)) {
        dev->gidIndex = i;
        dev->gid = g;
      } else if (firstV2 < 0) {
        firstV2 = i;
        firstV2Gid = g;
      }
    }
    if (dev->gidIndex < 0 && firstV2 >= 0) {
      dev->gidIndex = firstV2;
      dev->gid = firstV2Gid;
    }
    if (dev->gidIndex < 0) {
      if (api.queryGid(dev->ctx, uint8_t(dev->port), 0, &dev->gid) != 0 || isZero(dev->gid))
        return MK_ERROR(Result::SystemError,
                        "NET/IB: %s port %d: no usable GID (no RoCE v2 entry, GID 0 empty)",
                        dev->ibvName.c_str(), dev->port);
      dev->gidIndex = 0;
    }
  }
  if (isIpv4Mapped(dev->gid)) {
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, dev->gid.raw + 12, ip, sizeof(ip));
    dev->ipAddress = ip;
  }
  return Result::Success;
}

// ---- device list
// ---------------------------------------------------------------------------------

Result openIbDevices(const IbvApi& api, const std::vector<std::string>& preferred,
                     std::vector<IbDevice*>* out, std::string* why) {
  out->clear();
  int n = 0;
  ibv_device** list = api.getDeviceList(&n);
  if (list == nullptr || n == 0) {
    if (list) api.freeDeviceList(list);
    *why = "no RDMA device (ibv_get_device_list found none)";
    return Result::Success;
  }
  HcaFilter filter(params::IB_HCA());
  std::vector<IbDevice*> found;
  std::string skipped;
  for (int d = 0; d < n; ++d) {
    std::string ibvName = api.getDeviceName(list[d]);
    ibv_device_attr attr{};
    ibv_context* ctx = api.openDevice(list[d]);
    if (ctx == nullptr || api.queryDevice(ctx, &attr) != 0) {
      skipped += " " + ibvName + "(cannot open)";
      if (ctx) api.closeDevice(ctx);
      continue;
    }
    std::vector<IbDevice*> ports;
    for (int p = 1; p <= attr.phys_port_cnt; ++p) {
      if (!filter.selects(ibvName, p)) continue;
      ibv_port_attr pa{};
      if (api.queryPort(ctx, uint8_t(p), &pa) != 0) continue;
      if (pa.state != IBV_PORT_ACTIVE) {
        skipped += " " + ibvName + ":" + std::to_string(p) + "(port not active)";
        continue;
      }
      if (pa.link_layer != IBV_LINK_LAYER_INFINIBAND && pa.link_layer != IBV_LINK_LAYER_ETHERNET) {
        skipped += " " + ibvName + ":" + std::to_string(p) + "(unknown link layer)";
        continue;
      }
      auto* dev = new IbDevice();
      dev->ibvName = ibvName;
      dev->port = p;
      dev->ctx = ctx;
      dev->linkLayer = pa.link_layer;
      dev->lid = pa.lid;
      dev->mtu = pa.active_mtu;
      // active_speed only: active_speed_ex (XDR) is newer than the rdma-core this builds against.
      dev->speedMbps = portSpeedMbps(pa.active_speed, pa.active_width);
      dev->guid = attr.node_guid;
      dev->maxQp = attr.max_qp;
      dev->maxQpWr = attr.max_qp_wr;
      dev->maxCqe = attr.max_cqe;
      dev->pciPath = pciPathOf(ibvName);
      if (pa.link_layer == IBV_LINK_LAYER_ETHERNET) {
        if (selectRoceGid(api, dev, pa) != Result::Success) {
          skipped += " " + ibvName + ":" + std::to_string(p) + "(no GID)";
          delete dev;
          continue;
        }
      } else {
        // InfiniBand: LID routing; GID 0 is carried too for a global route if ever needed.
        api.queryGid(ctx, uint8_t(p), 0, &dev->gid);
        dev->gidIndex = 0;
      }
      ports.push_back(dev);
    }
    if (ports.empty()) {
      api.closeDevice(ctx);
      continue;
    }
    ibv_pd* pd = api.allocPd(ctx);
    if (pd == nullptr) {
      skipped += " " + ibvName + "(ibv_alloc_pd failed)";
      for (IbDevice* dev : ports) delete dev;
      api.closeDevice(ctx);
      continue;
    }
    ports[0]->ownsCtx = true;
    for (IbDevice* dev : ports) {
      dev->pd = pd;
      dev->name = ports.size() > 1 ? ibvName + ":" + std::to_string(dev->port) : ibvName;
      found.push_back(dev);
    }
  }
  api.freeDeviceList(list);
  // The topology's rail order first (a GPU's nearest NIC is device 0 for its proxy), then the rest.
  std::stable_sort(found.begin(), found.end(), [&](IbDevice* a, IbDevice* b) {
    auto rank = [&](IbDevice* x) {
      for (size_t i = 0; i < preferred.size(); ++i)
        if (preferred[i] == x->name || preferred[i] == x->ibvName) return int(i);
      return INT32_MAX;
    };
    return rank(a) < rank(b);
  });
  *out = found;
  if (found.empty()) {
    *why = "no RDMA device usable";
    if (!filter.empty()) {
      // Name the variable the filter came from: MKERNEL_IB_HCA wins over its twin NCCL_IB_HCA.
      const char* var = std::getenv("MKERNEL_IB_HCA") != nullptr ? "MKERNEL_IB_HCA" : "NCCL_IB_HCA";
      *why += std::string(" (") + var + "=" + params::IB_HCA() + ")";
    }
    if (!skipped.empty()) *why += ":" + skipped;
  }
  return Result::Success;
}

void closeIbDevices(const IbvApi& api, std::vector<IbDevice*>* devices) {
  // Ports of one device share its context and PD: release them once, from the owning entry,
  // after all entries' registrations are gone.
  for (IbDevice* dev : *devices) dev->cache.releaseAll(api);
  for (IbDevice* dev : *devices)
    if (dev->ownsCtx) {
      api.deallocPd(dev->pd);
      api.closeDevice(dev->ctx);
    }
  for (IbDevice* dev : *devices) delete dev;
  devices->clear();
}

// ---- registration cache
// --------------------------------------------------------------------------

namespace {
constexpr int kMrAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

uintptr_t pageSize() {
  static const uintptr_t kPage = uintptr_t(sysconf(_SC_PAGESIZE));
  return kPage;
}
}  // namespace

Result RegCache::reg(const IbvApi& api, ibv_pd* pd, void* data, size_t size, int type,
                     bool useDmabuf, bool peermem, MrEntry** out) {
  if (size == 0) {
    // Nothing to register (NCCL may register empty buffers): a shared handle without an MR.
    static MrEntry empty{0, 0, nullptr, 1 << 30, -2};
    *out = &empty;
    return Result::Success;
  }
  uintptr_t addr = reinterpret_cast<uintptr_t>(data);
  uintptr_t start = addr & ~(pageSize() - 1);
  uintptr_t end = (addr + size + pageSize() - 1) & ~(pageSize() - 1);
  std::lock_guard<std::mutex> lock(mu_);
  for (MrEntry* e : entries_)
    if (e->type == type && e->start <= start && end <= e->end) {
      ++e->refs;
      ++stats_.hits;
      *out = e;
      return Result::Success;
    }
  ibv_mr* mr = nullptr;
  if (type == kPtrCuda && useDmabuf) {
    int fd = -1;
    Result exported = cudaExportDmabuf(start, end - start, &fd);
    if (exported == Result::Success) {
      mr = api.regDmabufMr(pd, 0, end - start, start, fd, kMrAccess);
      int err = errno;
      close(fd);
      if (mr == nullptr && !peermem)
        return MK_ERROR(Result::SystemError, "NET/IB: ibv_reg_dmabuf_mr(%p, %zu) failed: %s", data,
                        size, strerror(err));
      if (mr == nullptr)
        MK_INFO(kLogNet | kLogReg,
                "NET/IB: ibv_reg_dmabuf_mr(%p, %zu) failed (%s); trying nvidia-peermem", data, size,
                strerror(err));
    } else if (!peermem) {
      return exported;
    }
  }
  if (mr == nullptr) {
    if (type == kPtrCuda && !peermem && !useDmabuf)
      return MK_ERROR(Result::InvalidUsage,
                      "NET/IB: GPU memory %p: neither DMA-BUF nor nvidia-peermem", data);
    // Host memory, or CUDA memory through nvidia-peermem.
    mr = api.regMr(pd, reinterpret_cast<void*>(start), end - start, kMrAccess);
    if (mr == nullptr)
      return MK_ERROR(
          Result::SystemError, "NET/IB: ibv_reg_mr(%p, %zu) failed: %s%s", data, size,
          strerror(errno),
          errno == ENOMEM ? " (raise the locked-memory limit: ulimit -l unlimited)" : "");
  }
  auto* e = new MrEntry{start, end, mr, 1, type};
  entries_.push_back(e);
  ++stats_.registrations;
  ++stats_.live;
  *out = e;
  return Result::Success;
}

Result RegCache::regDmabuf(const IbvApi& api, ibv_pd* pd, void* data, size_t size, uint64_t offset,
                           int fd, int type, MrEntry** out) {
  if (api.regDmabufMr == nullptr)
    return MK_ERROR(Result::InvalidUsage,
                    "NET/IB: regMrDmaBuf: libibverbs has no ibv_reg_dmabuf_mr");
  ibv_mr* mr = api.regDmabufMr(pd, offset, size, reinterpret_cast<uintptr_t>(data), fd, kMrAccess);
  if (mr == nullptr)
    return MK_ERROR(Result::SystemError,
                    "NET/IB: ibv_reg_dmabuf_mr(fd %d, offset %lu, %zu) failed: %s", fd,
                    static_cast<unsigned long>(offset), size, strerror(errno));
  std::lock_guard<std::mutex> lock(mu_);
  // Not inserted in the lookup list (type -1 never matches), but owned and counted like the rest.
  auto* e = new MrEntry{reinterpret_cast<uintptr_t>(data), reinterpret_cast<uintptr_t>(data) + size,
                        mr, 1, -1};
  (void)type;
  entries_.push_back(e);
  ++stats_.registrations;
  ++stats_.live;
  *out = e;
  return Result::Success;
}

Result RegCache::dereg(const IbvApi& api, MrEntry* entry) {
  if (entry->mr == nullptr && entry->type == -2) return Result::Success;  // the empty registration
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(entries_.begin(), entries_.end(), entry);
  if (it == entries_.end())
    return MK_ERROR(Result::InvalidArgument, "NET/IB: deregMr of an unknown memory handle %p",
                    static_cast<void*>(entry));
  if (--entry->refs > 0) return Result::Success;
  entries_.erase(it);
  --stats_.live;
  int rc = api.deregMr(entry->mr);
  delete entry;
  if (rc != 0)
    return MK_ERROR(Result::SystemError, "NET/IB: ibv_dereg_mr failed: %s", strerror(rc));
  return Result::Success;
}

RegCacheStats RegCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void RegCache::releaseAll(const IbvApi& api) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!entries_.empty())
    MK_INFO(kLogNet, "NET/IB: %zu memory registration(s) still live at shutdown; releasing them",
            entries_.size());
  for (MrEntry* e : entries_) {
    api.deregMr(e->mr);
    delete e;
  }
  entries_.clear();
  stats_.live = 0;
}

}  // namespace ib
}  // namespace net
}  // namespace mkernel
