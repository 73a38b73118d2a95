// RDMA device discovery and selection for the verbs backend: which HCA ports are used
// (MKERNEL_IB_HCA, the topology's preferred order), their addressing (RoCE v2 GID or InfiniBand
// LID), their properties, and the per-device memory registration cache.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/result.h"
#include "vendor/ibverbs.h"

namespace mkernel {
namespace net {
namespace ib {

// libibverbs through the vendor layer (vendor/ibverbs.h).
using verbs::IbvApi;
using verbs::loadIbvApi;
using verbs::portSpeedMbps;

// MKERNEL_IB_HCA, with NCCL_IB_HCA's syntax: "mlx5_0:1,mlx5_1" selects by name prefix (optionally
// one port); a leading '^' excludes the listed devices instead; a leading '=' requires exact names
// ("^=" combines both). Empty selects everything.
class HcaFilter {
 public:
  explicit HcaFilter(const std::string& spec);
  bool selects(const std::string& device, int port) const;
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    std::string name;
    int port = -1;  // -1: any port
  };
  std::vector<Entry> entries_;
  bool exclude_ = false;
  bool exact_ = false;
};

// One registered memory range, shared by every registration that falls inside it.
struct MrEntry {
  uintptr_t start = 0;
  uintptr_t end = 0;
  ibv_mr* mr = nullptr;
  int refs = 0;
  int type = 0;  // net::PtrType it was registered for
};

struct RegCacheStats {
  uint64_t registrations = 0;  // ibv_reg_mr / ibv_reg_dmabuf_mr calls made
  uint64_t hits = 0;           // registrations served by an existing range
  uint64_t live = 0;           // ranges registered now
};

// Per-device (per protection domain) registration cache: regIsGlobal = 1 lets NCCL register a
// buffer once and reuse it on every comm of the device; a sub-range of a live registration costs a
// lookup, not a kernel call.
class RegCache {
 public:
  // Host or CUDA memory. CUDA: DMA-BUF export + ibv_reg_dmabuf_mr when `useDmabuf`; if that is
  // off or fails and `peermem` (nvidia-peermem loaded), plain ibv_reg_mr on the device pointer.
  Result reg(const IbvApi& api, ibv_pd* pd, void* data, size_t size, int type, bool useDmabuf,
             bool peermem, MrEntry** out);
  // A caller-provided DMA-BUF fd (never cached: the fd, not the address, names the memory).
  Result regDmabuf(const IbvApi& api, ibv_pd* pd, void* data, size_t size, uint64_t offset, int fd,
                   int type, MrEntry** out);
  Result dereg(const IbvApi& api, MrEntry* entry);
  RegCacheStats stats() const;
  void releaseAll(const IbvApi& api);

 private:
  mutable std::mutex mu_;
  std::vector<MrEntry*> entries_;
  RegCacheStats stats_;
};

// One usable (device, port): what a net::Net "device" index names.
struct IbDevice {
  std::string name;     // unique: the verbs name, plus ":<port>" when several ports are used
  std::string ibvName;  // the verbs device name
  std::string pciPath;
  int port = 1;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  bool ownsCtx = false;  // the first port of a device closes the context
  uint8_t linkLayer = IBV_LINK_LAYER_ETHERNET;
  int gidIndex = -1;
  ibv_gid gid{};
  uint16_t lid = 0;
  ibv_mtu mtu = IBV_MTU_1024;
  int speedMbps = 0;
  uint64_t guid = 0;
  int maxQp = 0;
  int maxQpWr = 0;
  int maxCqe = 0;
  std::string ipAddress;  // the IPv4 address of a RoCE GID ("" for InfiniBand)
  RegCache cache;
};

// Opens every selected port. Devices named in `preferred` come first, in that order; the others
// follow in discovery order. Returns an empty list (not an error) when nothing is usable, with the
// reason in *why.
Result openIbDevices(const IbvApi& api, const std::vector<std::string>& preferred,
                     std::vector<IbDevice*>* out, std::string* why);
void closeIbDevices(const IbvApi& api, std::vector<IbDevice*>* devices);

// Chooses the GID of a RoCE port: MKERNEL_IB_GID_INDEX if set, else the first RoCE v2 GID that is
// an IPv4-mapped address (::ffff:a.b.c.d), else the first RoCE v2 GID, else index 0.
Result selectRoceGid(const IbvApi& api, IbDevice* dev, const ibv_port_attr& port);

}  // namespace ib
}  // namespace net
}  // namespace mkernel
