#include "vendor/ibverbs.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>

#include "common/dl.h"
#include "common/log.h"

namespace mkernel {
namespace verbs {

int IbvApi::queryPort(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) const {
  std::memset(attr, 0, sizeof(*attr));
  verbs_context* vctx = verbs_get_ctx_op(ctx, query_port);
  if (vctx != nullptr) return vctx->query_port(ctx, port, attr, sizeof(*attr));
  return queryPortCompat(ctx, port, attr);
}

const char* IbvApi::statusText(ibv_wc_status status) const {
  return wcStatusStr != nullptr ? wcStatusStr(status) : "unknown work completion status";
}

namespace {

struct Loaded {
  IbvApi api;
  std::string why;
  bool ok = false;
};

void load(Loaded* l) {
  static const char* const kNames[] = {"libibverbs.so.1", "libibverbs.so", nullptr};
  // RTLD_LOCAL: the providers (librxe, libmlx5) are found by libibverbs itself.
  void* h = dlOpenFirst(kNames, RTLD_NOW | RTLD_LOCAL, &l->why);
  if (h == nullptr) {
    l->why = "libibverbs not found (" + l->why + ")";
    return;
  }
  IbvApi& a = l->api;
  DlSymbol syms[] = {
      {"ibv_get_device_list", reinterpret_cast<void**>(&a.getDeviceList), true},
      {"ibv_free_device_list", reinterpret_cast<void**>(&a.freeDeviceList), true},
      {"ibv_get_device_name", reinterpret_cast<void**>(&a.getDeviceName), true},
      {"ibv_open_device", reinterpret_cast<void**>(&a.openDevice), true},
      {"ibv_close_device", reinterpret_cast<void**>(&a.closeDevice), true},
      {"ibv_query_device", reinterpret_cast<void**>(&a.queryDevice), true},
      {"ibv_query_port", reinterpret_cast<void**>(&a.queryPortCompat), true},
      {"ibv_query_gid", reinterpret_cast<void**>(&a.queryGid), true},
      {"ibv_alloc_pd", reinterpret_cast<void**>(&a.allocPd), true},
      {"ibv_dealloc_pd", reinterpret_cast<void**>(&a.deallocPd), true},
      {"ibv_reg_mr", reinterpret_cast<void**>(&a.regMr), true},
      {"ibv_reg_dmabuf_mr", reinterpret_cast<void**>(&a.regDmabufMr), false},
      {"ibv_dereg_mr", reinterpret_cast<void**>(&a.deregMr), true},
      {"ibv_create_cq", reinterpret_cast<void**>(&a.createCq), true},
      {"ibv_destroy_cq", reinterpret_cast<void**>(&a.destroyCq), true},
      {"ibv_create_qp", reinterpret_cast<void**>(&a.createQp), true},
      {"ibv_modify_qp", reinterpret_cast<void**>(&a.modifyQp), true},
      {"ibv_destroy_qp", reinterpret_cast<void**>(&a.destroyQp), true},
      {"ibv_wc_status_str", reinterpret_cast<void**>(&a.wcStatusStr), true},
  };
  if (dlLoadSymbols(h, "libibverbs", syms, int(sizeof(syms) / sizeof(syms[0])), &l->why) !=
      Result::Success) {
    // The handle is kept open: a partially filled table must not point into unmapped code.
    a = IbvApi();
    return;
  }
  l->ok = true;
  MK_INFO(kLogInit | kLogNet, "NET/IB: libibverbs loaded (dmabuf registration %s)",
          a.regDmabufMr != nullptr ? "available" : "not available");
}

}  // namespace

const IbvApi* loadIbvApi(std::string* why) {
  static Loaded loaded;
  static std::once_flag once;
  std::call_once(once, [] { load(&loaded); });
  if (!loaded.ok) {
    if (why) *why = loaded.why;
    return nullptr;
  }
  return &loaded.api;
}

int portSpeedMbps(uint32_t activeSpeed, uint8_t activeWidth) {
  // Bit i of active_speed: SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR, XDR (per lane, Mbps).
  static const int kLaneMbps[] = {2500, 5000, 10000, 10000, 14000, 25000, 50000, 100000, 200000};
  // Bit i of active_width: 1x, 4x, 8x, 12x, 2x.
  static const int kLanes[] = {1, 4, 8, 12, 2};
  int lane = kLaneMbps[0];
  for (int i = 0; i < int(sizeof(kLaneMbps) / sizeof(int)); ++i)
    if (activeSpeed & (1u << i)) {
      lane = kLaneMbps[i];
      break;
    }
  int lanes = kLanes[0];
  for (int i = 0; i < int(sizeof(kLanes) / sizeof(int)); ++i)
    if (activeWidth & (1u << i)) {
      lanes = kLanes[i];
      break;
    }
  return lane * lanes;
}

}  // namespace verbs
}  // namespace mkernel
