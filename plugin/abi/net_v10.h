// NCCL net-plugin ABI v10 (ncclNet_v10_t, exported as ncclNetPlugin_v10). Layout written from NCCL
// 2.28.9's src/include/plugin/net/net_v10.h.
//
// Against v11: init() runs once per process (NCCL's compat layer reference-counts it) and has no
// context; the comm config reaches connect() instead; there is no finalize() and no setNetAttr();
// properties lack maxMultiRequestSize.
#pragma once

#include "plugin/abi/net_common.h"

namespace mkernel {
namespace abi {

struct ncclNetCommConfig_v10_t {
  int trafficClass;
};

struct ncclNetProperties_v10_t {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v10_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
};
static_assert(sizeof(ncclNetProperties_v10_t) == 104,
              "NCCL 2.28.9 ncclNetProperties_v10_t is 104 bytes");
static_assert(offsetof(ncclNetProperties_v10_t, vProps) == 64, "ncclNetProperties_v10_t.vProps");
static_assert(offsetof(ncclNetProperties_v10_t, maxCollBytes) == 96,
              "ncclNetProperties_v10_t.maxCollBytes");

struct ncclNet_v10_t {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v10_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v10_t** recvDevComm);
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
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v10_t* props);
};
static_assert(sizeof(ncclNet_v10_t) == 160,
              "NCCL 2.28.9 ncclNet_v10_t is a name and 19 function pointers");
static_assert(offsetof(ncclNet_v10_t, makeVDevice) == 152, "ncclNet_v10_t.makeVDevice");

}  // namespace abi
}  // namespace mkernel
