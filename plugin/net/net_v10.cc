// ncclNetPlugin_v10: init() once per process, no finalize; the comm config comes with connect().
#include "plugin/abi/net_v10.h"
#include "plugin/net/net_entry.h"

namespace mkernel {
namespace netplugin {
namespace {

using namespace abi;

ncclResult_t v10Init(ncclDebugLogger_t logger, ncclProfilerCallback_t /*no network events*/) {
  return toNcclResult(initProcess(logger, "v10"));
}

void fillV10(int dev, const DeviceInfo& d, ncclNetProperties_v10_t* p) {
  fillV9Properties(dev, d, p);
}

ncclResult_t v10GetProperties(int dev, ncclNetProperties_v10_t* props) {
  return getPropertiesAs(dev, props, fillV10);
}

ncclResult_t v10Connect(int dev, ncclNetCommConfig_v10_t* config, void* handle, void** sendComm,
                        ncclNetDeviceHandle_v10_t** sendDevComm) {
  clearDevComm(sendDevComm);
  int trafficClass = config != nullptr ? config->trafficClass : kNcclNetTrafficClassUndef;
  return toNcclResult(connect(dev, handle, trafficClass, sendComm));
}

}  // namespace
}  // namespace netplugin
}  // namespace mkernel

using namespace mkernel::netplugin;

extern "C" {
MKERNEL_NET_EXPORT mkernel::abi::ncclNet_v10_t ncclNetPlugin_v10 = {
    kPluginName,
    v10Init,
    entryDevices,
    v10GetProperties,
    entryListen,
    v10Connect,
    entryAccept,
    entryRegMr,
    entryRegMrDmaBuf,
    entryDeregMr,
    entryIsendP,
    entryIrecvP,
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
