// NCCL net-plugin ABI v11 (ncclNet_v11_t, exported as ncclNetPlugin_v11): the version NCCL 2.28
// tries first. Layout written from NCCL 2.28.9's src/include/plugin/net/net_v11.h.
//
// What is new against v10: init() is called once per communicator and returns a context that
// listen/connect/finalize/setNetAttr receive; the comm config (traffic class) moved from connect()
// to init(); finalize() tells the plugin when a communicator is done with it.
#pragma once

#include "plugin/abi/net_common.h"

namespace mkernel {
namespace abi {

struct ncclNetCommConfig_v11_t {
  int trafficClass;  // kNcclNetTrafficClassUndef unless the application set one
};
static_assert(sizeof(ncclNetCommConfig_v11_t) == 4, "ncclNetCommConfig_v11_t");

struct ncclNetProperties_v11_t {
  char* name;     // unique per device: NCCL's topology is keyed on it
  char* pciPath;  // /sys PCI directory, or NULL for a virtual NIC
  uint64_t guid;
  int ptrSupport;  // kNcclPtrHost | kNcclPtrCuda | kNcclPtrDmaBuf
  int regIsGlobal;
  int forceFlush;
  int speed;  // Mbps
  int port;
  float latency;  // microseconds
  int maxComms;
  int maxRecvs;  // grouped-receive width
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v11_t vProps;
  size_t maxP2pBytes;  // NCCL fails connection setup unless in (0, 1 TiB]
  size_t maxCollBytes;
  int maxMultiRequestSize;
};
static_assert(sizeof(ncclNetProperties_v11_t) == 112,
              "NCCL 2.28.9 ncclNetProperties_v11_t is 112 bytes");
static_assert(offsetof(ncclNetProperties_v11_t, latency) == 44, "ncclNetProperties_v11_t.latency");
static_assert(offsetof(ncclNetProperties_v11_t, netDeviceType) == 56,
              "ncclNetProperties_v11_t.netDeviceType");
static_assert(offsetof(ncclNetProperties_v11_t, vProps) == 64, "ncclNetProperties_v11_t.vProps");
static_assert(offsetof(ncclNetProperties_v11_t, maxP2pBytes) == 88,
              "ncclNetProperties_v11_t.maxP2pBytes");
static_assert(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104,
              "ncclNetProperties_v11_t.maxMultiRequestSize");

// ncclNetCommAttr_v11_t / ncclNetAttr_v11_t: hints passed through setNetAttr().
struct ncclNetCommAttr_v11_t {
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
};
struct ncclNetAttr_v11_t {
  ncclNetCommAttr_v11_t sendCommAttr;
  ncclNetCommAttr_v11_t recvCommAttr;
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
};
static_assert(sizeof(ncclNetAttr_v11_t) == 44, "ncclNetAttr_v11_t");

struct ncclNet_v11_t {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config,
                       ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v11_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm,
                         ncclNetDeviceHandle_v11_t** recvDevComm);
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
  ncclResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v11_t* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v11_t* netAttr);
};
static_assert(sizeof(ncclNet_v11_t) == 176,
              "NCCL 2.28.9 ncclNet_v11_t is a name and 21 function pointers");
static_assert(offsetof(ncclNet_v11_t, irecvConsumed) == 144, "ncclNet_v11_t.irecvConsumed");
static_assert(offsetof(ncclNet_v11_t, finalize) == 160, "ncclNet_v11_t.finalize");
static_assert(offsetof(ncclNet_v11_t, setNetAttr) == 168, "ncclNet_v11_t.setNetAttr");

}  // namespace abi
}  // namespace mkernel
