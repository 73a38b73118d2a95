// Entry points shared by every net ABI version: convert to the core's types, return ncclResult_t.
#include "plugin/net/net_entry.h"

#include <dlfcn.h>

#include <mutex>

#include "common/log.h"
#include "common/param.h"
#include "common/version.h"

namespace mkernel {
namespace netplugin {

using abi::toNcclResult;

namespace {

// The startup line of the net plugin, once per process: at NCCL's first devices() call, which
// follows its init() in every ABI version (NCCL's logger is set by then).
void announceOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!logStartupEnabled()) return;
    Dl_info self{};
    const char* path =
        dladdr(reinterpret_cast<void*>(&announceOnce), &self) != 0 && self.dli_fname != nullptr
            ? self.dli_fname
            : "?";
    logStartupLine("mkernel %s loaded as NCCL net plugin (NET/%s, MKERNEL_NET_BACKEND=%s) from %s",
                   MKERNEL_VERSION_STRING, kPluginName, paramString("NET_BACKEND").c_str(), path);
  });
}

}  // namespace

ncclResult_t entryDevices(int* ndev) {
  announceOnce();
  return toNcclResult(deviceCount(ndev));
}

ncclResult_t entryListen(int dev, void* handle, void** listenComm) {
  return toNcclResult(listen(dev, handle, listenComm));
}

ncclResult_t entryAccept(void* listenComm, void** recvComm,
                         abi::ncclNetDeviceHandle_v11_t** recvDevComm) {
  clearDevComm(recvDevComm);
  return toNcclResult(accept(listenComm, recvComm));
}

ncclResult_t entryRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return toNcclResult(regMr(comm, data, size, type, mhandle));
}

ncclResult_t entryRegMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle) {
  return toNcclResult(regMrDmaBuf(comm, data, size, type, offset, fd, mhandle));
}

ncclResult_t entryDeregMr(void* comm, void* mhandle) {
  return toNcclResult(deregMr(comm, mhandle));
}

ncclResult_t entryIsendP(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                         void* phandle, void** request) {
  return toNcclResult(isend(sendComm, data, size, tag, mhandle, request));
}

ncclResult_t entryIrecvP(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                         void** mhandles, void** phandles, void** request) {
  return toNcclResult(irecv(recvComm, n, data, sizes, tags, mhandles, request));
}

ncclResult_t entryIflush(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request) {
  return toNcclResult(iflush(recvComm, n, data, sizes, mhandles, request));
}

ncclResult_t entryTest(void* request, int* done, int* sizes) {
  return toNcclResult(test(request, done, sizes));
}

ncclResult_t entryCloseSend(void* sendComm) {
  return toNcclResult(closeSend(sendComm));
}
ncclResult_t entryCloseRecv(void* recvComm) {
  return toNcclResult(closeRecv(recvComm));
}
ncclResult_t entryCloseListen(void* listenComm) {
  return toNcclResult(closeListen(listenComm));
}

ncclResult_t entryIrecvConsumed(void* recvComm, int n, void* request) {
  return toNcclResult(irecvConsumed(recvComm, n, request));
}

}  // namespace netplugin
}  // namespace mkernel
