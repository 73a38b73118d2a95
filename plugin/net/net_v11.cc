// ncclNetPlugin_v11: the table NCCL 2.28 and 2.29 look for first. init() once per communicator
// with a context that listen/connect/finalize/setNetAttr receive; the comm config comes with
// init(). Those context entry points are v12's too (net_v12.cc).
#include "plugin/abi/net_v11.h"
#include "plugin/net/net_entry.h"

namespace mkernel {
namespace netplugin {

using namespace abi;

ncclResult_t entryInitCtx(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config,
                          ncclDebugLogger_t logger,
                          ncclProfilerCallback_t /*profiler: no network events emitted*/) {
  int trafficClass = config != nullptr ? config->trafficClass : kNcclNetTrafficClassUndef;
  return toNcclResult(initContext(commId, trafficClass, logger, ctx));
}

ncclResult_t entryListenCtx(void* ctx, int dev, void* handle, void** listenComm) {
  if (listenComm != nullptr) *listenComm = nullptr;
  Result r = checkContext(ctx, "listen");
  if (r != Result::Success) return toNcclResult(r);
  return toNcclResult(listen(dev, handle, listenComm));
}

ncclResult_t entryConnectCtx(void* ctx, int dev, void* handle, void** sendComm,
                             ncclNetDeviceHandle_v11_t** sendDevComm) {
  clearDevComm(sendDevComm);
  if (sendComm != nullptr) *sendComm = nullptr;
  int trafficClass = kNcclNetTrafficClassUndef;
  Result r = checkContext(ctx, "connect", &trafficClass);
  if (r != Result::Success) return toNcclResult(r);
  return toNcclResult(connect(dev, handle, trafficClass, sendComm));
}

ncclResult_t entryFinalizeCtx(void* ctx) {
  return toNcclResult(finalizeContext(ctx));
}

ncclResult_t entrySetNetAttr(void* ctx, ncclNetAttr_v11_t* attr) {
  Result r = checkContext(ctx, "setNetAttr");
  if (r != Result::Success) return toNcclResult(r);
  if (attr == nullptr)
    return toNcclResult(MK_ERROR(Result::InvalidArgument, "NET/%s: setNetAttr(NULL)", kPluginName));
  // Hints about the collective's flows; neither backend shapes traffic per flow, so accepted as is.
  MK_TRACE(kLogNet, "NET/%s: setNetAttr op %u algo %u proto %u: accepted", kPluginName, attr->op,
           attr->algo, attr->proto);
  return ncclSuccess;
}

namespace {

void fillV11(int dev, const DeviceInfo& d, ncclNetProperties_v11_t* p) {
  fillV9Properties(dev, d, p);
  p->maxMultiRequestSize = 1;  // no multi-request support: one request per isend/irecv
}

ncclResult_t v11GetProperties(int dev, ncclNetProperties_v11_t* props) {
  return getPropertiesAs(dev, props, fillV11);
}

}  // namespace
}  // namespace netplugin
}  // namespace mkernel

using namespace mkernel::netplugin;

extern "C" {
MKERNEL_NET_EXPORT mkernel::abi::ncclNet_v11_t ncclNetPlugin_v11 = {
    kPluginName,
    entryInitCtx,
    entryDevices,
    v11GetProperties,
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
