// The handful of libibverbs entry points topology discovery needs (NIC names, ports, states,
// speeds), dlopen'd from libibverbs.so.1 so that the library loads on hosts without rdma-core.
// The verbs transport keeps its own, complete wrapper (transport/net/ib/); this one is read-only
// and deliberately minimal.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace mkernel {
namespace topo {

struct IbvSymbols {
  // Members are not named like the verbs functions: verbs.h defines several of those as macros.
  ibv_device** (*getDeviceList)(int* num) = nullptr;
  void (*freeDeviceList)(ibv_device** list) = nullptr;
  const char* (*getDeviceName)(ibv_device* dev) = nullptr;
  ibv_context* (*openDevice)(ibv_device* dev) = nullptr;
  int (*closeDevice)(ibv_context* ctx) = nullptr;
  int (*queryDevice)(ibv_context* ctx, ibv_device_attr* attr) = nullptr;
  int (*queryPort)(ibv_context* ctx, uint8_t port, ibv_port_attr* attr) = nullptr;
};

// Loads libibverbs.so.1 once per process. nullptr (and *why) when it is absent or incomplete.
const IbvSymbols* ibvSymbols(std::string* why);

// Link speed of a port in Gbit/s from verbs' active_speed / active_width codes (0 when unknown).
double ibvPortGbps(uint8_t activeSpeed, uint8_t activeWidth);

}  // namespace topo
}  // namespace mkernel
