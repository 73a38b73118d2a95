// ncclNetPlugin_v12: the table NCCL 2.30 looks for first. v11's entry points with v12's types:
// the properties carry an 8-device virtual-NIC list and the NIC's rail and plane.
#include "plugin/abi/net_v12.h"
#include "plugin/net/net_entry.h"

namespace mkernel {
namespace netplugin {
namespace {

using namespace abi;

void fillV12(int dev, const DeviceInfo& d, ncclNetProperties_v12_t* p) {
  fillV9Properties(dev, d, p);
  p->maxMultiRequestSize = 1;  // no multi-request support: one request per isend/irecv
  // NCCL groups NICs by rail and plane only when the plugin knows them; like NCCL's own plugins
  // for older versions, mkernel leaves them undefined and NCCL places NICs by PCI distance.
  p->railId = kNcclNetIdUndef;
  p->planeId = kNcclNetIdUndef;
}

ncclResult_t v12GetProperties(int dev, ncclNetProperties_v12_t* props) {
  return getPropertiesAs(dev, props, fillV12);
}

}  // namespace
}  // namespace netplugin
}  // namespace mkernel

using namespace mkernel::netplugin;

extern "C" {
MKERNEL_NET_EXPORT mkernel::abi::ncclNet_v12_t ncclNetPlugin_v12 = {
    kPluginName,
    entryInitCtx,
    entryDevices,
    v12GetProperties,
    entryListenCtx,
    entryConnectCtx,
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
    nullptr,  // getDeviceMr: no device offload; NCCL checks for NULL
    entryIrecvConsumed,
    nullptr,  // makeVDevice: no NIC fusion; NULL makes NCCL use the physical devices
    entryFinalizeCtx,
    entrySetNetAttr,
};
}  // extern "C"
