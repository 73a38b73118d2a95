// NCCL net-plugin ABI: what every version (v8..v12) shares.
//
// Written for mkernel from the layout of NCCL 2.28.9's src/include/plugin/nccl_net.h,
// nccl_common.h and nccl_device/net_device.h. The types live in mkernel::abi so that they can never
// clash with NCCL's own headers or with the tuner ABI (plugin/abi/tuner_*.h); only their layout
// matters to NCCL, and each is pinned below with static_assert against the sizes NCCL 2.28.9
// compiles to (checked with NCCL's own headers, docs/NET_PLUGIN.md).
#pragma once

#include <nccl.h>  // ncclResult_t (its values equal mkernel::Result's)

#include <cstddef>
#include <cstdint>

#include "common/log.h"
#include "common/result.h"

namespace mkernel {
namespace abi {

constexpr int kNcclNetHandleMaxSize = 128;                 // NCCL_NET_HANDLE_MAXSIZE
constexpr int kNcclNetMaxRequests = 32;                    // NCCL_NET_MAX_REQUESTS
constexpr int kNcclNetMaxDevsPerNic = 4;                   // NCCL_NET_MAX_DEVS_PER_NIC
constexpr size_t kNcclMaxNetSizeBytes = size_t(1) << 40;   // NCCL_MAX_NET_SIZE_BYTES (1 TiB)
constexpr size_t kNcclLegacyMaxNetSize = size_t(1) << 30;  // MAX_NET_SIZE, what NCCL assumes for v8
constexpr int kNcclPtrHost = 0x1;                          // NCCL_PTR_HOST
constexpr int kNcclPtrCuda = 0x2;                          // NCCL_PTR_CUDA
constexpr int kNcclPtrDmaBuf = 0x4;                        // NCCL_PTR_DMABUF
// irecv may find *request preset to this (LL/LL128: NCCL polls flags in the data itself).
constexpr uintptr_t kNcclNetOptionalRecvCompletion = 0x1;  // NCCL_NET_OPTIONAL_RECV_COMPLETION
constexpr int kNcclNetTrafficClassUndef = -1;              // NCCL_NET_TRAFFIC_CLASS_UNDEF
constexpr int kNcclNetDeviceInvalidVersion = 0;            // NCCL_NET_DEVICE_INVALID_VERSION

// ncclDebugLogger_t: the level is NCCL's ncclDebugLogLevel, an int-sized enum whose values equal
// mkernel::LogLevel's; common/log.h declares the same signature.
using ncclDebugLogger_t = ::mkernel::NcclLogger;

// ncclProfilerCallback_t (nccl_common.h). mkernel does not emit network profiler events.
using ncclProfilerCallback_t = ncclResult_t (*)(void** eHandle, int type, void* pHandle,
                                                int64_t pluginId, void* extData);

// ncclNetDeviceType (net_device.h). mkernel's tables always report HOST: NCCL rejects any other
// type unless it is UNPACK with exactly the device-code version NCCL was built with.
enum ncclNetDeviceType : int { NCCL_NET_DEVICE_HOST = 0, NCCL_NET_DEVICE_UNPACK = 1 };
static_assert(sizeof(ncclNetDeviceType) == 4, "ncclNetDeviceType is a C enum (int)");

// ncclNetDeviceHandle_v7_t == _v8_t == ... == _v11_t (net_device.h). Only ever set to NULL by
// mkernel (no device offload), but connect/accept receive pointers to it.
struct ncclNetDeviceHandle_v11_t {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
};
using ncclNetDeviceHandle_v10_t = ncclNetDeviceHandle_v11_t;
using ncclNetDeviceHandle_v9_t = ncclNetDeviceHandle_v11_t;
using ncclNetDeviceHandle_v8_t = ncclNetDeviceHandle_v11_t;
static_assert(sizeof(ncclNetDeviceHandle_v11_t) == 32,
              "NCCL 2.28.9 ncclNetDeviceHandle_t is 32 bytes");
static_assert(offsetof(ncclNetDeviceHandle_v11_t, size) == 16, "ncclNetDeviceHandle_t.size");
static_assert(offsetof(ncclNetDeviceHandle_v11_t, needsProxyProgress) == 24,
              "ncclNetDeviceHandle_t.needsProxyProgress");

// ncclNetVDeviceProps_v9_t == _v10_t == _v11_t: the physical devices fused into one device.
struct ncclNetVDeviceProps_v11_t {
  int ndevs;
  int devs[kNcclNetMaxDevsPerNic];
};
using ncclNetVDeviceProps_v10_t = ncclNetVDeviceProps_v11_t;
using ncclNetVDeviceProps_v9_t = ncclNetVDeviceProps_v11_t;
static_assert(sizeof(ncclNetVDeviceProps_v11_t) == 20,
              "NCCL 2.28.9 ncclNetVDeviceProps_t is 20 bytes");

// mkernel::Result's values are ncclResult_t's by construction (common/result.h).
inline ncclResult_t toNcclResult(Result r) {
  return static_cast<ncclResult_t>(r);
}
static_assert(static_cast<int>(Result::InProgress) == ncclInProgress &&
                  static_cast<int>(Result::RemoteError) == ncclRemoteError,
              "mkernel::Result mirrors ncclResult_t");

}  // namespace abi
}  // namespace mkernel
