// NCCL net-plugin ABI v12 (ncclNet_v12_t, exported as ncclNetPlugin_v12): the version NCCL 2.30
// tries first. Layout written from NCCL 2.30.7's src/include/plugin/net/net_v12.h.
//
// What is new against v11: a virtual device fuses up to 8 physical ones (4 in v11), and the
// properties end with the NIC's rail and plane (int16_t each; NCCL_NET_ID_UNDEF when unknown).
// The function table is v11's with the v12 types.
#pragma once

#include "plugin/abi/net_v11.h"

namespace mkernel {
namespace abi {

constexpr int kNcclNetMaxDevsPerNicV12 = 8;  // NCCL_NET_MAX_DEVS_PER_NIC_V12
constexpr int16_t kNcclNetIdUndef = -1;      // NCCL_NET_ID_UNDEF

using ncclNetDeviceHandle_v12_t = ncclNetDeviceHandle_v11_t;
using ncclNetCommConfig_v12_t = ncclNetCommConfig_v11_t;
using ncclNetCommAttr_v12_t = ncclNetCommAttr_v11_t;
using ncclNetAttr_v12_t = ncclNetAttr_v11_t;

struct ncclNetVDeviceProps_v12_t {
  int ndevs;
  int devs[kNcclNetMaxDevsPerNicV12];
};
static_assert(sizeof(ncclNetVDeviceProps_v12_t) == 36,
              "NCCL 2.30.7 ncclNetVDeviceProps_v12_t is 36 bytes");

struct ncclNetProperties_v12_t {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;  // Mbps
  int port;
  float latency;  // microseconds
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v12_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
  int16_t railId;   // the NIC's rail, kNcclNetIdUndef when not known
  int16_t planeId;  // the NIC's plane, kNcclNetIdUndef when not known
};
static_assert(sizeof(ncclNetProperties_v12_t) == 128,
              "NCCL 2.30.7 ncclNetProperties_v12_t is 128 bytes");
static_assert(offsetof(ncclNetProperties_v12_t, vProps) == 64, "ncclNetProperties_v12_t.vProps");
static_assert(offsetof(ncclNetProperties_v12_t, maxP2pBytes) == 104,
              "ncclNetProperties_v12_t.maxP2pBytes");
static_assert(offsetof(ncclNetProperties_v12_t, maxMultiRequestSize) == 120,
              "ncclNetProperties_v12_t.maxMultiRequestSize");
static_assert(offsetof(ncclNetProperties_v12_t, railId) == 124, "ncclNetProperties_v12_t.railId");
static_assert(offsetof(ncclNetProperties_v12_t, planeId) == 126, "ncclNetProperties_v12_t.planeId");

struct ncclNet_v12_t {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v12_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v12_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v12_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v12_t* netAttr);
};
static_assert(sizeof(ncclNet_v12_t) == 176,
              "NCCL 2.30.7 ncclNet_v12_t is a name and 21 function pointers");
static_assert(offsetof(ncclNet_v12_t, makeVDevice) == 152, "ncclNet_v12_t.makeVDevice");
static_assert(offsetof(ncclNet_v12_t, setNetAttr) == 168, "ncclNet_v12_t.setNetAttr");

}  // namespace abi
}  // namespace mkernel
