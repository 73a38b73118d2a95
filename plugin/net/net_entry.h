// Entry points whose C signature is the same in every net ABI version (v8..v12), shared by the
// per-version tables in net_v12.cc ... net_v8.cc, and the property fillers each version composes.
#pragma once

#include <cstring>

#include "plugin/abi/net_v11.h"
#include "plugin/net/net_core.h"

// The five tables are the library's exported net-plugin symbols (NCCL finds them with dlsym).
#define MKERNEL_NET_EXPORT __attribute__((visibility("default")))

namespace mkernel {
namespace netplugin {

ncclResult_t entryDevices(int* ndev);
ncclResult_t entryListen(int dev, void* handle, void** listenComm);  // v8-v10 (no ctx)
ncclResult_t entryAccept(void* listenComm, void** recvComm,
                         abi::ncclNetDeviceHandle_v11_t** recvDevComm);
ncclResult_t entryRegMr(void* comm, void* data, size_t size, int type, void** mhandle);
ncclResult_t entryRegMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
ncclResult_t entryDeregMr(void* comm, void* mhandle);
// v10 and v11: isend/irecv with the profiler handles, which mkernel ignores.
ncclResult_t entryIsendP(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                         void* phandle, void** request);
ncclResult_t entryIrecvP(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                         void** mhandles, void** phandles, void** request);
ncclResult_t entryIflush(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
ncclResult_t entryTest(void* request, int* done, int* sizes);
ncclResult_t entryCloseSend(void* sendComm);
ncclResult_t entryCloseRecv(void* recvComm);
ncclResult_t entryCloseListen(void* listenComm);
ncclResult_t entryIrecvConsumed(void* recvComm, int n, void* request);
// v11 and v12 (net_v11.cc): a context per communicator from init(), which listen, connect,
// finalize and setNetAttr receive; the traffic class comes with init()'s config.
ncclResult_t entryInitCtx(void** ctx, uint64_t commId, abi::ncclNetCommConfig_v11_t* config,
                          abi::ncclDebugLogger_t logger, abi::ncclProfilerCallback_t profiler);
ncclResult_t entryListenCtx(void* ctx, int dev, void* handle, void** listenComm);
ncclResult_t entryConnectCtx(void* ctx, int dev, void* handle, void** sendComm,
                             abi::ncclNetDeviceHandle_v11_t** sendDevComm);
ncclResult_t entryFinalizeCtx(void* ctx);
ncclResult_t entrySetNetAttr(void* ctx, abi::ncclNetAttr_v11_t* attr);

// Sets the device-offload out-parameter of connect/accept: mkernel offers none (netDeviceType
// HOST), and NCCL reads the pointer it passed in.
inline void clearDevComm(abi::ncclNetDeviceHandle_v11_t** devComm) {
  if (devComm != nullptr) *devComm = nullptr;
}

// Members every version's properties have. NCCL reads all of them from an uninitialised struct.
template <typename Props>
void fillBaseProperties(const DeviceInfo& d, Props* p) {
  std::memset(p, 0, sizeof(*p));
  p->name = const_cast<char*>(d.name);
  p->pciPath = const_cast<char*>(d.pciPath);
  p->guid = d.guid;
  p->ptrSupport = d.ptrSupport;
  p->regIsGlobal = d.regIsGlobal ? 1 : 0;
  p->speed = d.speedMbps;
  p->port = d.port;
  p->latency = d.latencyUs;
  p->maxComms = d.maxComms;
  p->maxRecvs = d.maxRecvs;
  p->netDeviceType = abi::NCCL_NET_DEVICE_HOST;
  p->netDeviceVersion = abi::kNcclNetDeviceInvalidVersion;
}

// v9 and later add forceFlush, the virtual-device list and the transfer bounds.
template <typename Props>
void fillV9Properties(int dev, const DeviceInfo& d, Props* p) {
  fillBaseProperties(d, p);
  p->forceFlush = d.forceFlush ? 1 : 0;
  p->vProps.ndevs = 1;  // a physical device is its own one-member virtual device
  p->vProps.devs[0] = dev;
  p->maxP2pBytes = d.maxP2pBytes;
  p->maxCollBytes = d.maxCollBytes;
}

template <typename Props>
ncclResult_t getPropertiesAs(int dev, Props* props, void (*fill)(int, const DeviceInfo&, Props*)) {
  if (props == nullptr)
    return abi::toNcclResult(
        MK_ERROR(Result::InvalidArgument, "NET/%s: getProperties(%d, NULL)", kPluginName, dev));
  DeviceInfo info;
  Result r = deviceInfo(dev, &info);
  if (r != Result::Success) return abi::toNcclResult(r);
  fill(dev, info, props);
  return ncclSuccess;
}

}  // namespace netplugin
}  // namespace mkernel
