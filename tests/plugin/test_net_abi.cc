// The NCCL net ABI structs (plugin/abi/net_*.h) have NCCL 2.28.9's layout. The headers pin it with
// static_assert already; this test states the numbers once more where a reader looks for them and
// checks the members whose offsets matter most to NCCL.
#include "tests/catch.h"

#include <cstddef>

#include "plugin/abi/net_v10.h"
#include "plugin/abi/net_v11.h"
#include "plugin/abi/net_v8.h"
#include "plugin/abi/net_v9.h"

using namespace mkernel::abi;

// Function-table sizes: a name pointer plus N function pointers.
static_assert(sizeof(ncclNet_v11_t) == (1 + 21) * sizeof(void*), "v11: 21 functions");
static_assert(sizeof(ncclNet_v10_t) == (1 + 19) * sizeof(void*), "v10: 19 functions");
static_assert(sizeof(ncclNet_v9_t) == (1 + 19) * sizeof(void*), "v9: 19 functions");
static_assert(sizeof(ncclNet_v8_t) == (1 + 18) * sizeof(void*), "v8: 18 functions");

TEST_CASE("net ABI: table and properties sizes are NCCL 2.28.9's") {
  CHECK(sizeof(ncclNet_v11_t) == 176);
  CHECK(sizeof(ncclNet_v10_t) == 160);
  CHECK(sizeof(ncclNet_v9_t) == 160);
  CHECK(sizeof(ncclNet_v8_t) == 152);
  CHECK(sizeof(ncclNetProperties_v11_t) == 112);
  CHECK(sizeof(ncclNetProperties_v10_t) == 104);
  CHECK(sizeof(ncclNetProperties_v9_t) == 104);
  CHECK(sizeof(ncclNetProperties_v8_t) == 64);
  CHECK(sizeof(ncclNetDeviceHandle_v11_t) == 32);
  CHECK(sizeof(ncclNetVDeviceProps_v11_t) == 20);
  CHECK(sizeof(ncclNetCommConfig_v11_t) == 4);
  CHECK(sizeof(ncclNetAttr_v11_t) == 44);
}

TEST_CASE("net ABI: member offsets NCCL reads") {
  CHECK(offsetof(ncclNet_v11_t, init) == 8);
  CHECK(offsetof(ncclNet_v11_t, isend) == 80);
  CHECK(offsetof(ncclNet_v11_t, test) == 104);
  CHECK(offsetof(ncclNet_v11_t, getDeviceMr) == 136);
  CHECK(offsetof(ncclNet_v11_t, finalize) == 160);
  CHECK(offsetof(ncclNet_v10_t, connect) == 40);
  CHECK(offsetof(ncclNet_v9_t, isend) == 80);
  CHECK(offsetof(ncclNet_v8_t, irecvConsumed) == 144);
  CHECK(offsetof(ncclNetProperties_v11_t, guid) == 16);
  CHECK(offsetof(ncclNetProperties_v11_t, speed) == 36);
  CHECK(offsetof(ncclNetProperties_v11_t, maxRecvs) == 52);
  CHECK(offsetof(ncclNetProperties_v11_t, vProps) == 64);
  CHECK(offsetof(ncclNetProperties_v11_t, maxP2pBytes) == 88);
  CHECK(offsetof(ncclNetProperties_v11_t, maxCollBytes) == 96);
  CHECK(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104);
  CHECK(offsetof(ncclNetProperties_v10_t, maxCollBytes) == 96);
  CHECK(offsetof(ncclNetProperties_v8_t, speed) == 32);
  CHECK(offsetof(ncclNetProperties_v8_t, maxRecvs) == 48);
  CHECK(offsetof(ncclNetProperties_v8_t, netDeviceVersion) == 56);
}

TEST_CASE("net ABI: mkernel::Result values are ncclResult_t's") {
  CHECK(toNcclResult(mkernel::Result::Success) == ncclSuccess);
  CHECK(toNcclResult(mkernel::Result::SystemError) == ncclSystemError);
  CHECK(toNcclResult(mkernel::Result::InternalError) == ncclInternalError);
  CHECK(toNcclResult(mkernel::Result::InvalidArgument) == ncclInvalidArgument);
  CHECK(toNcclResult(mkernel::Result::InvalidUsage) == ncclInvalidUsage);
  CHECK(toNcclResult(mkernel::Result::RemoteError) == ncclRemoteError);
  CHECK(toNcclResult(mkernel::Result::InProgress) == ncclInProgress);
}
