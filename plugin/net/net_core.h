// The version-neutral core of mkernel's NCCL net plugin (ncclNetPlugin_v11/_v10/_v9/_v8).
//
// Each ABI version has one thin adapter file (net_v11.cc ... net_v8.cc) that converts its argument
// list to these functions; everything else — choosing the backend, validating every handle NCCL
// passes, bounding requests, and knowing when the backend's threads must stop — lives here, over
// the one transport interface net::Net (docs/ARCHITECTURE.md, layers; docs/TRANSPORT.md).
//
// Lifetime (why it is reference counted): NCCL calls v11's init() once per communicator and
// finalize() when it is done, then dlclose()s the library after the last finalize. v8-v10 have no
// finalize at all. So one process-wide backend (net::Net) is created on first use and destroyed —
// joining its threads — as soon as no v11 context is live and no listen/send/recv comm is open;
// a later call creates it again. A library destructor does the same for what is left at dlclose.
//
// Handles: comms, requests and contexts are the core's own records, kept in registries, so that a
// NULL, stale or foreign pointer from the caller is an error with a message, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/log.h"
#include "common/result.h"

namespace mkernel {
namespace netplugin {

constexpr const char* kPluginName = "mkernel";  // NCCL matches NCCL_NET case-insensitively
constexpr int kMaxGroupedRecvs = 8;  // upper bound of any device's maxRecvs (net::kMaxGroupedRecvs)

// What getProperties reports, for every version; each adapter copies the members its version has.
struct DeviceInfo {
  const char* name;     // unique per device; stays valid until the library is unloaded
  const char* pciPath;  // NULL for a virtual NIC; same lifetime as name
  uint64_t guid;
  int ptrSupport;  // NCCL_PTR_* bits
  bool regIsGlobal;
  bool forceFlush;
  int speedMbps;  // > 0 (a backend's unknown speed becomes kDefaultSpeedMbps)
  int port;
  float latencyUs;
  int maxComms;
  int maxRecvs;         // in [1, kMaxGroupedRecvs]
  size_t maxP2pBytes;   // in [1, kMaxTransferBytes]
  size_t maxCollBytes;  // in [1, kMaxTransferBytes]
};

// test() reports sizes as int in every version, so no single transfer may exceed what an int
// holds; 1 GiB (NCCL's own MAX_NET_SIZE) keeps chunking on a power of two.
constexpr size_t kMaxTransferBytes = size_t(1) << 30;
constexpr int kDefaultSpeedMbps = 10000;  // NCCL's assumption when a NIC reports no speed

// v11: one context per communicator. *ctx is NULL on failure (NCCL then calls finalize(*ctx)).
Result initContext(uint64_t commId, int trafficClass, NcclLogger logger, void** ctx);
Result finalizeContext(void* ctx);  // NULL is accepted (init failed); an unknown ctx is an error
// Checks a v11 context; *trafficClass (optional) gets the config init() recorded.
Result checkContext(void* ctx, const char* caller, int* trafficClass = nullptr);
// v8-v10: init once per load (NCCL's compat layer calls it once); no finalize.
Result initProcess(NcclLogger logger, const char* version);

Result deviceCount(int* ndev);
Result deviceInfo(int dev, DeviceInfo* info);

// trafficClass: the comm config's (v10 connect, v11 init); recorded, see docs/NET_PLUGIN.md.
Result listen(int dev, void* handle, void** listenComm);
Result connect(int dev, const void* handle, int trafficClass, void** sendComm);
Result accept(void* listenComm, void** recvComm);

Result regMr(void* comm, void* data, size_t size, int type, void** mhandle);
Result regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                   void** mhandle);
Result deregMr(void* comm, void* mhandle);

// Always write *request: NULL means back-pressure ("call again"), except for iflush where it
// means that nothing needs flushing.
Result isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request);
Result irecv(void* recvComm, int n, void** data, const size_t* sizes, const int* tags,
             void** mhandles, void** request);
Result iflush(void* recvComm, int n, void** data, const int* sizes, void** mhandles,
              void** request);
// Always writes *done; once done, `sizes` (may be NULL) gets 1 entry for a send, n for a grouped
// receive, none for a flush, and the request is gone.
Result test(void* request, int* done, int* sizes);
Result irecvConsumed(void* recvComm, int n, void* request);

Result closeSend(void* sendComm);
Result closeRecv(void* recvComm);
Result closeListen(void* listenComm);

}  // namespace netplugin
}  // namespace mkernel
