// NCCL net-plugin ABI v9 (ncclNet_v9_t, exported as ncclNetPlugin_v9). Layout written from NCCL
// 2.28.9's src/include/plugin/net/net_v9.h.
//
// Against v10: init() takes only the logger; connect() has no comm config; isend/irecv have no
// profiler handle (phandle) argument. Properties are laid out as v10's.
#pragma once

#include "plugin/abi/net_common.h"

namespace mkernel {
namespace abi {

struct ncclNetProperties_v9_t {
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
  ncclNetVDeviceProps_v9_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
};
static_assert(sizeof(ncclNetProperties_v9_t) == 104,
              "NCCL 2.28.9 ncclNetProperties_v9_t is 104 bytes");
static_assert(offsetof(ncclNetProperties_v9_t, maxP2pBytes) == 88,
              "ncclNetProperties_v9_t.maxP2pBytes");

struct ncclNet_v9_t {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v9_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v9_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
};
static_assert(sizeof(ncclNet_v9_t) == 160,
              "NCCL 2.28.9 ncclNet_v9_t is a name and 19 function pointers");
static_assert(offsetof(ncclNet_v9_t, makeVDevice) == 152, "ncclNet_v9_t.makeVDevice");

}  // namespace abi
}  // namespace mkernel
