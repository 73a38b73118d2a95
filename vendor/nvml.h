// libnvidia-ml.so.1, loaded with dlopen (never linked: libmkernel.so loads on hosts without the
// driver). Only the symbols that have existed unversioned since NVML's first NVLink API are used,
// as NCCL does, and the PCI info struct is read through its stable prefix (bus id text, then
// domain, bus, device), which every layout of nvmlPciInfo_t shares.
#pragma once

#include <string>

namespace mkernel {
namespace nvml {

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
  NvmlReturn (*getName)(NvmlDevice, char*, unsigned) = nullptr;                   // optional
  const char* (*errorString)(NvmlReturn) = nullptr;
  bool loaded = false;
  std::string why;
};

// Loads libnvidia-ml.so.1 once per process (it stays open: NVML keeps driver state per process).
// `loaded` false: `why` says what is missing.
NvmlApi& nvmlApi();

}  // namespace nvml
}  // namespace mkernel
