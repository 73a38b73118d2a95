#include "vendor/nvml.h"

#include <dlfcn.h>

#include <mutex>

#include "common/dl.h"

namespace mkernel {
namespace nvml {

NvmlApi& nvmlApi() {
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

}  // namespace nvml
}  // namespace mkernel
