#include "topology/ibv_symbols.h"

#include <dlfcn.h>

#include <mutex>

#include "common/dl.h"

namespace mkernel {
namespace topo {

const IbvSymbols* ibvSymbols(std::string* why) {
  static IbvSymbols syms;
  static bool loaded = false;
  static std::string failure;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* names[] = {"libibverbs.so.1", nullptr};
    void* h = dlOpenFirst(names, RTLD_NOW | RTLD_LOCAL, &failure);
    if (h == nullptr) {
      failure = "libibverbs.so.1 not found (" + failure + ")";
      return;
    }
    DlSymbol table[] = {
        {"ibv_get_device_list", reinterpret_cast<void**>(&syms.getDeviceList), true},
        {"ibv_free_device_list", reinterpret_cast<void**>(&syms.freeDeviceList), true},
        {"ibv_get_device_name", reinterpret_cast<void**>(&syms.getDeviceName), true},
        {"ibv_open_device", reinterpret_cast<void**>(&syms.openDevice), true},
        {"ibv_close_device", reinterpret_cast<void**>(&syms.closeDevice), true},
        {"ibv_query_device", reinterpret_cast<void**>(&syms.queryDevice), true},
        {"ibv_query_port", reinterpret_cast<void**>(&syms.queryPort), true},
    };
    if (dlLoadSymbols(h, "libibverbs.so.1", table, sizeof(table) / sizeof(table[0]), &failure) !=
        Result::Success) {
      dlclose(h);
      return;
    }
    loaded = true;  // kept open: device lists and contexts point into it
  });
  if (!loaded) {
    if (why) *why = failure;
    return nullptr;
  }
  return &syms;
}

double ibvPortGbps(uint8_t activeSpeed, uint8_t activeWidth) {
  // Per-lane rates of the IB speed codes (SDR .. XDR); FDR10 is 10 Gbps per lane.
  double lane = 0;
  switch (activeSpeed) {
    case 1:
      lane = 2.5;
      break;  // SDR
    case 2:
      lane = 5.0;
      break;  // DDR
    case 4:
      lane = 10.0;
      break;  // QDR
    case 8:
      lane = 10.0;
      break;  // FDR10
    case 16:
      lane = 14.0;
      break;  // FDR
    case 32:
      lane = 25.0;
      break;  // EDR
    case 64:
      lane = 50.0;
      break;  // HDR
    case 128:
      lane = 100.0;
      break;  // NDR
    default:
      lane = 0;
      break;
  }
  int lanes = 0;
  switch (activeWidth) {
    case 1:
      lanes = 1;
      break;
    case 2:
      lanes = 4;
      break;
    case 4:
      lanes = 8;
      break;
    case 8:
      lanes = 12;
      break;
    case 16:
      lanes = 2;
      break;
    default:
      lanes = 0;
      break;
  }
  return lane * lanes;
}

}  // namespace topo
}  // namespace mkernel
