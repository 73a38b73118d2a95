// ncclNetPlugin_v9: as v10 without the comm config in connect() and without the profiler handles
// in isend/irecv.
#include "plugin/abi/net_v9.h"
#include "plugin/net/net_entry.h"

namespace mkernel {
namespace netplugin {
namespace {

using namespace abi;

ncclResult_t v9Init(ncclDebugLogger_t logger) {
  return toNcclResult(initProcess(logger, "v9"));
}

void fillV9(int dev, const DeviceInfo& d, ncclNetProperties_v9_t* p) {
  fillV9Properties(dev, d, p);
}

ncclResult_t v9GetProperties(int dev, ncclNetProperties_v9_t* props) {
  return getPropertiesAs(dev, props, fillV9);
}

ncclResult_t v9Connect(int dev, void* handle, void** sendComm,
                       ncclNetDeviceHandle_v9_t** sendDevComm) {
  clearDevComm(sendDevComm);
  return toNcclResult(connect(dev, handle, kNcclNetTrafficClassUndef, sendComm));
}

ncclResult_t v9Isend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                     void** request) {
  return toNcclResult(isend(sendComm, data, size, tag, mhandle, request));
}

ncclResult_t v9Irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                     void** request) {
  return toNcclResult(irecv(recvComm, n, data, sizes, tags, mhandles, request));
}

}  // namespace
}  // namespace netplugin
}  // namespace mkernel

using namespace mkernel::netplugin;

extern "C" {
MKERNEL_NET_EXPORT mkernel::abi::ncclNet_v9_t ncclNetPlugin_v9 = {
    kPluginName,
    v9Init,
    entryDevices,
    v9GetProperties,
    entryListen,
    v9Connect,
    entryAccept,
    entryRegMr,
    entryRegMrDmaBuf,
    entryDeregMr,
    v9Isend,
    v9Irecv,
    entryIflush,
    entryTest,
    entryCloseSend,
    entryCloseRecv,
    entryCloseListen,
    nullptr,  // getDeviceMr
    entryIrecvConsumed,
    nullptr,  // makeVDevice
};
}  // extern "C"
