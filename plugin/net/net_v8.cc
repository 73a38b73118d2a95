// ncclNetPlugin_v8: as v9 with int sizes in isend/irecv, and properties without forceFlush,
// vProps and the transfer bounds (NCCL then assumes 1 GiB, which is mkernel's bound anyway).
#include "plugin/abi/net_v8.h"
#include "plugin/net/net_entry.h"

namespace mkernel {
namespace netplugin {
namespace {

using namespace abi;

ncclResult_t v8Init(ncclDebugLogger_t logger) {
  return toNcclResult(initProcess(logger, "v8"));
}

void fillV8(int /*dev*/, const DeviceInfo& d, ncclNetProperties_v8_t* p) {
  fillBaseProperties(d, p);
}

ncclResult_t v8GetProperties(int dev, ncclNetProperties_v8_t* props) {
  return getPropertiesAs(dev, props, fillV8);
}

ncclResult_t v8Connect(int dev, void* handle, void** sendComm,
                       ncclNetDeviceHandle_v8_t** sendDevComm) {
  clearDevComm(sendDevComm);
  return toNcclResult(connect(dev, handle, kNcclNetTrafficClassUndef, sendComm));
}

ncclResult_t v8Isend(void* sendComm, void* data, int size, int tag, void* mhandle, void** request) {
  if (request != nullptr) *request = nullptr;
  if (size < 0)
    return toNcclResult(
        MK_ERROR(Result::InvalidArgument, "NET/%s: isend of %d bytes", kPluginName, size));
  return toNcclResult(isend(sendComm, data, static_cast<size_t>(size), tag, mhandle, request));
}

ncclResult_t v8Irecv(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                     void** request) {
  if (request != nullptr) *request = nullptr;
  if (n < 1 || n > kMaxGroupedRecvs || sizes == nullptr)
    return toNcclResult(MK_ERROR(Result::InvalidArgument, "NET/%s: irecv of %d buffers (sizes %p)",
                                 kPluginName, n, static_cast<void*>(sizes)));
  size_t wide[kMaxGroupedRecvs];
  for (int i = 0; i < n; ++i) {
    if (sizes[i] < 0)
      return toNcclResult(MK_ERROR(Result::InvalidArgument, "NET/%s: irecv buffer %d of %d bytes",
                                   kPluginName, i, sizes[i]));
    wide[i] = static_cast<size_t>(sizes[i]);
  }
  return toNcclResult(irecv(recvComm, n, data, wide, tags, mhandles, request));
}

}  // namespace
}  // namespace netplugin
}  // namespace mkernel

using namespace mkernel::netplugin;

extern "C" {
MKERNEL_NET_EXPORT mkernel::abi::ncclNet_v8_t ncclNetPlugin_v8 = {
    kPluginName,
    v8Init,
    entryDevices,
    v8GetProperties,
    entryListen,
    v8Connect,
    entryAccept,
    entryRegMr,
    entryRegMrDmaBuf,
    entryDeregMr,
    v8Isend,
    v8Irecv,
    entryIflush,
    entryTest,
    entryCloseSend,
    entryCloseRecv,
    entryCloseListen,
    nullptr,  // getDeviceMr
    entryIrecvConsumed,
};
}  // extern "C"
