// NCCL net-plugin ABI v8 (ncclNet_v8_t, exported as ncclNetPlugin_v8). Layout written from NCCL
// 2.28.9's src/include/plugin/net/net_v8.h.
//
// Against v9: sizes are int (isend's size, irecv's sizes); properties have no forceFlush, vProps,
// maxP2pBytes or maxCollBytes (NCCL then assumes 1 GiB transfers at most); there is no makeVDevice.
#pragma once

#include "plugin/abi/net_common.h"

namespace mkernel {
namespace abi {

struct ncclNetProperties_v8_t {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
};
static_assert(sizeof(ncclNetProperties_v8_t) == 64,
              "NCCL 2.28.9 ncclNetProperties_v8_t is 64 bytes");
static_assert(offsetof(ncclNetProperties_v8_t, speed) == 32, "ncclNetProperties_v8_t.speed");
static_assert(offsetof(ncclNetProperties_v8_t, netDeviceVersion) == 56,
              "ncclNetProperties_v8_t.netDeviceVersion");

struct ncclNet_v8_t {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v8_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** recvDevComm);
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request);
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
};
static_assert(sizeof(ncclNet_v8_t) == 152,
              "NCCL 2.28.9 ncclNet_v8_t is a name and 18 function pointers");
static_assert(offsetof(ncclNet_v8_t, irecvConsumed) == 144, "ncclNet_v8_t.irecvConsumed");

}  // namespace abi
}  // namespace mkernel
