// mkernel's net and tuner ABI structs (plugin/abi/) against NCCL's own plugin headers, from the
// NCCL source tree given at configure time (-DMKERNEL_NCCL_SOURCE_DIR=<nccl checkout>): every
// table and struct that tree defines is compared with mkernel's, size and every member's offset.
// A mismatch fails the build of this test; the program prints which versions it compared.
#include <cstddef>
#include <cstdio>

#include "nccl_net.h"    // NCCL's: src/include/plugin
#include "nccl_tuner.h"  // NCCL's

#include "plugin/abi/net_v10.h"
#include "plugin/abi/net_v11.h"
#include "plugin/abi/net_v12.h"
#include "plugin/abi/net_v8.h"
#include "plugin/abi/net_v9.h"
#include "plugin/abi/tuner_v2.h"
#include "plugin/abi/tuner_v3.h"
#include "plugin/abi/tuner_v4.h"
#include "plugin/abi/tuner_v5.h"
#include "plugin/abi/tuner_v6.h"

#define MK_SAME_SIZE(T) \
  static_assert(sizeof(mkernel::abi::T) == sizeof(::T), "sizeof " #T " differs from NCCL's")
#define MK_SAME_OFF(T, m)                                         \
  static_assert(offsetof(mkernel::abi::T, m) == offsetof(::T, m), \
                #T "." #m " is not at NCCL's offset")

// Members of every net table (v8 on); makeVDevice from v9, finalize and setNetAttr from v11.
#define MK_NET_TABLE_BASE(T)     \
  MK_SAME_SIZE(T);               \
  MK_SAME_OFF(T, name);          \
  MK_SAME_OFF(T, init);          \
  MK_SAME_OFF(T, devices);       \
  MK_SAME_OFF(T, getProperties); \
  MK_SAME_OFF(T, listen);        \
  MK_SAME_OFF(T, connect);       \
  MK_SAME_OFF(T, accept);        \
  MK_SAME_OFF(T, regMr);         \
  MK_SAME_OFF(T, regMrDmaBuf);   \
  MK_SAME_OFF(T, deregMr);       \
  MK_SAME_OFF(T, isend);         \
  MK_SAME_OFF(T, irecv);         \
  MK_SAME_OFF(T, iflush);        \
  MK_SAME_OFF(T, test);          \
  MK_SAME_OFF(T, closeSend);     \
  MK_SAME_OFF(T, closeRecv);     \
  MK_SAME_OFF(T, closeListen);   \
  MK_SAME_OFF(T, getDeviceMr);   \
  MK_SAME_OFF(T, irecvConsumed)

#define MK_NET_PROPS_BASE(T)     \
  MK_SAME_SIZE(T);               \
  MK_SAME_OFF(T, name);          \
  MK_SAME_OFF(T, pciPath);       \
  MK_SAME_OFF(T, guid);          \
  MK_SAME_OFF(T, ptrSupport);    \
  MK_SAME_OFF(T, regIsGlobal);   \
  MK_SAME_OFF(T, speed);         \
  MK_SAME_OFF(T, port);          \
  MK_SAME_OFF(T, latency);       \
  MK_SAME_OFF(T, maxComms);      \
  MK_SAME_OFF(T, maxRecvs);      \
  MK_SAME_OFF(T, netDeviceType); \
  MK_SAME_OFF(T, netDeviceVersion)

#define MK_NET_PROPS_V9(T)     \
  MK_NET_PROPS_BASE(T);        \
  MK_SAME_OFF(T, forceFlush);  \
  MK_SAME_OFF(T, vProps);      \
  MK_SAME_OFF(T, maxP2pBytes); \
  MK_SAME_OFF(T, maxCollBytes)

MK_NET_TABLE_BASE(ncclNet_v8_t);
MK_NET_PROPS_BASE(ncclNetProperties_v8_t);
MK_NET_TABLE_BASE(ncclNet_v9_t);
MK_SAME_OFF(ncclNet_v9_t, makeVDevice);
MK_NET_PROPS_V9(ncclNetProperties_v9_t);
MK_NET_TABLE_BASE(ncclNet_v10_t);
MK_SAME_OFF(ncclNet_v10_t, makeVDevice);
MK_NET_PROPS_V9(ncclNetProperties_v10_t);
MK_SAME_SIZE(ncclNetCommConfig_v10_t);
MK_NET_TABLE_BASE(ncclNet_v11_t);
MK_SAME_OFF(ncclNet_v11_t, makeVDevice);
MK_SAME_OFF(ncclNet_v11_t, finalize);
MK_SAME_OFF(ncclNet_v11_t, setNetAttr);
MK_NET_PROPS_V9(ncclNetProperties_v11_t);
MK_SAME_OFF(ncclNetProperties_v11_t, maxMultiRequestSize);
MK_SAME_SIZE(ncclNetCommConfig_v11_t);
MK_SAME_SIZE(ncclNetVDeviceProps_v11_t);
MK_SAME_SIZE(ncclNetAttr_v11_t);
MK_SAME_OFF(ncclNetAttr_v11_t, recvCommAttr);
MK_SAME_OFF(ncclNetAttr_v11_t, op);
MK_SAME_OFF(ncclNetAttr_v11_t, algo);
MK_SAME_OFF(ncclNetAttr_v11_t, proto);
MK_SAME_SIZE(ncclNetDeviceHandle_v11_t);
MK_SAME_OFF(ncclNetDeviceHandle_v11_t, handle);
MK_SAME_OFF(ncclNetDeviceHandle_v11_t, size);
MK_SAME_OFF(ncclNetDeviceHandle_v11_t, needsProxyProgress);
#ifdef NET_V12_H_
#define MK_NET_NEWEST 12
MK_NET_TABLE_BASE(ncclNet_v12_t);
MK_SAME_OFF(ncclNet_v12_t, makeVDevice);
MK_SAME_OFF(ncclNet_v12_t, finalize);
MK_SAME_OFF(ncclNet_v12_t, setNetAttr);
MK_NET_PROPS_V9(ncclNetProperties_v12_t);
MK_SAME_OFF(ncclNetProperties_v12_t, maxMultiRequestSize);
MK_SAME_OFF(ncclNetProperties_v12_t, railId);
MK_SAME_OFF(ncclNetProperties_v12_t, planeId);
MK_SAME_SIZE(ncclNetVDeviceProps_v12_t);
MK_SAME_SIZE(ncclNetAttr_v12_t);
#else
#define MK_NET_NEWEST 11
#endif

MK_SAME_SIZE(ncclTuner_v2_t);
MK_SAME_OFF(ncclTuner_v2_t, init);
MK_SAME_OFF(ncclTuner_v2_t, getCollInfo);
MK_SAME_OFF(ncclTuner_v2_t, destroy);
MK_SAME_SIZE(ncclTuner_v3_t);
MK_SAME_OFF(ncclTuner_v3_t, getCollInfo);
MK_SAME_OFF(ncclTuner_v3_t, destroy);
MK_SAME_SIZE(ncclTuner_v4_t);
MK_SAME_OFF(ncclTuner_v4_t, getCollInfo);
MK_SAME_OFF(ncclTuner_v4_t, destroy);
MK_SAME_SIZE(ncclTuner_v5_t);
MK_SAME_OFF(ncclTuner_v5_t, init);
MK_SAME_OFF(ncclTuner_v5_t, getCollInfo);
MK_SAME_OFF(ncclTuner_v5_t, finalize);
MK_SAME_SIZE(ncclNvlDomainInfo_v5_t);
MK_SAME_SIZE(ncclTunerConstants_v5_t);
MK_SAME_OFF(ncclTunerConstants_v5_t, hwLatencies);
MK_SAME_OFF(ncclTunerConstants_v5_t, llMaxBws);
MK_SAME_OFF(ncclTunerConstants_v5_t, perChMaxNVLSTreeBws);
#ifdef TUNER_V6_H_
#define MK_TUNER_NEWEST 6
MK_SAME_SIZE(ncclTuner_v6_t);
MK_SAME_OFF(ncclTuner_v6_t, init);
MK_SAME_OFF(ncclTuner_v6_t, getCollInfo);
MK_SAME_OFF(ncclTuner_v6_t, finalize);
MK_SAME_OFF(ncclTuner_v6_t, getChunkSize);
MK_SAME_SIZE(ncclTunerConstants_v6_t);
#else
#define MK_TUNER_NEWEST 5
#endif

int main() {
  std::printf("plugin ABI equals NCCL's headers (%s): net v8..v%d, tuner v2..v%d\n",
              MKERNEL_NCCL_SOURCE_DIR, MK_NET_NEWEST, MK_TUNER_NEWEST);
  return 0;
}
