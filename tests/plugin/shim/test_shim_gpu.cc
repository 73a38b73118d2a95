// GPU tier, one rank, the real NCCL beside the shim (run by scripts/gpu-check.sh: ctest -L gpu).
// The test links libmkernel.so and lets the shim dlopen the real libnccl.so.2: libnccl's calls to
// its own exported names then resolve to the shim, exactly as under LD_PRELOAD, so re-entry is
// exercised for real.
#include "tests/catch.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "plugin/shim/nccl_api.h"
#include "tests/plugin/shim/shim_gpu_util.h"
#include "common/param.h"

using namespace shimtest;

namespace {

struct Env {
  Env() {
    chooseRealNccl();
    if (std::getenv("MKERNEL_TIMEOUT_S") == nullptr) setenv("MKERNEL_TIMEOUT_S", "60", 1);
    mkernel::params::resetForTesting();
  }
} gEnv;

ncclComm_t oneRankComm(ncclConfig_t* config = nullptr) {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  ncclResult_t r =
      config ? ncclCommInitRankConfig(&comm, 1, id, 0, config) : ncclCommInitRank(&comm, 1, id, 0);
  INFO(ncclGetLastError(nullptr));
  REQUIRE((r == ncclSuccess || r == ncclInProgress));
  REQUIRE(comm != nullptr);
  return comm;
}

// The real NCCL the shim loaded, for calls that must bypass the shim.
void* realLib() {
  int v = 0;
  ncclGetVersion(&v);  // makes the shim load it
  const char* path = std::getenv("MKERNEL_NCCL_LIBRARY");
  void* h = dlopen(path ? path : "libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  return h;
}

template <typename Fn>
Fn realFn(const char* name) {
  void* h = realLib();
  return h ? reinterpret_cast<Fn>(dlsym(h, name)) : nullptr;
}

// A one-rank communicator of the real NCCL, bypassing the shim (pncclCommInitRank): what NCCL
// itself answers, for the cases where the shim must answer the same.
ncclComm_t realOneRankComm() {
  auto getId = realFn<ncclResult_t (*)(ncclUniqueId*)>("pncclGetUniqueId");
  auto initRank =
      realFn<ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int)>("pncclCommInitRank");
  REQUIRE(getId != nullptr);
  REQUIRE(initRank != nullptr);
  ncclUniqueId id;
  REQUIRE(getId(&id) == ncclSuccess);
  ncclComm_t real = nullptr;
  REQUIRE(initRank(&real, 1, id, 0) == ncclSuccess);
  return real;
}

std::vector<float> ramp(size_t n, float scale = 0.5f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(i % 1000) - 7.0f;
  return v;
}

}  // namespace

TEST_CASE(
    "gpu: the handle is NCCL's own communicator: NCCL's entry points take it, and the ops the shim "
    "hands out") {
  ncclComm_t comm = oneRankComm();
  // NCCL's own functions, bypassing the shim (as a name the shim does not export, or a caller that
  // dlsyms libnccl), accept the handle.
  auto realCount = realFn<ncclResult_t (*)(ncclComm_t, int*)>("pncclCommCount");
  auto realAllReduce =
      realFn<ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                              cudaStream_t)>("pncclAllReduce");
  REQUIRE((realCount && realAllReduce));
  int count = 0;
  CHECK(realCount(comm, &count) == ncclSuccess);
  CHECK(count == 1);
  const size_t n = 1024;
  DevBuf in(n * sizeof(float)), out(n * sizeof(float));
  upload(in, ramp(n));
  poison(out);
  REQUIRE(realAllReduce(in.p, out.p, n, ncclFloat, ncclSum, comm, nullptr) == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(out, n) == ramp(n));
  // A custom op's number is NCCL's: NCCL runs it too.
  float three = 3.0f;
  ncclRedOp_t op;
  REQUIRE(ncclRedOpCreatePreMulSum(&op, &three, ncclFloat, ncclScalarHostImmediate, comm) ==
          ncclSuccess);
  std::vector<float> expect = ramp(n);
  for (float& v : expect) v *= 3.0f;
  poison(out);
  REQUIRE(realAllReduce(in.p, out.p, n, ncclFloat, op, comm, nullptr) == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(out, n) == expect);
  poison(out);
  REQUIRE(ncclAllReduce(in.p, out.p, n, ncclFloat, op, comm, nullptr) ==
          ncclSuccess);  // the shim's route
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(out, n) == expect);
  CHECK(ncclRedOpDestroy(op, comm) == ncclSuccess);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  // Inside a group the handle exists at the call, as NCCL's does; NCCL's init runs at the end.
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t grouped = nullptr;
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclCommInitRank(&grouped, 1, id, 0) == ncclSuccess);
  CHECK(grouped != nullptr);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  count = 0;
  CHECK(realCount(grouped, &count) == ncclSuccess);
  CHECK(count == 1);
  poison(out);
  REQUIRE(ncclAllReduce(in.p, out.p, n, ncclFloat, ncclSum, grouped, nullptr) == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(out, n) == ramp(n));
  CHECK(ncclCommDestroy(grouped) == ncclSuccess);
}

TEST_CASE("gpu: ncclGetVersion is the real NCCL's") {
  auto getVersion = realFn<ncclResult_t (*)(int*)>("pncclGetVersion");
  REQUIRE(getVersion != nullptr);
  int real = 0, shim = 0;
  REQUIRE(getVersion(&real) == ncclSuccess);
  REQUIRE(ncclGetVersion(&shim) == ncclSuccess);
  CHECK(shim == real);
}

TEST_CASE(
    "gpu: one rank, every collective through the shim gives the definition; AllReduce runs in "
    "mkernel") {
  ncclComm_t comm = oneRankComm();
  const mkernelStats_t before = stats();
  const size_t n = 4096;
  DevBuf in(n * sizeof(float)), out(n * sizeof(float));
  std::vector<float> host = ramp(n);
  upload(in, host);
  cudaStream_t s;
  REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
  struct Step {
    const char* name;
    int coll;
  } steps[] = {{"AllReduce", kAllReduce},
               {"AllGather", kAllGather},
               {"ReduceScatter", kReduceScatter},
               {"Broadcast", kBroadcast},
               {"Reduce", kReduce}};
  for (const Step& st : steps) {
    INFO(st.name);
    poison(out);
    ncclResult_t r = ncclSuccess;
    switch (st.coll) {
      case kAllReduce:
        r = ncclAllReduce(in.p, out.p, n, ncclFloat, ncclSum, comm, s);
        break;
      case kAllGather:
        r = ncclAllGather(in.p, out.p, n, ncclFloat, comm, s);
        break;
      case kReduceScatter:
        r = ncclReduceScatter(in.p, out.p, n, ncclFloat, ncclSum, comm, s);
        break;
      case kBroadcast:
        r = ncclBroadcast(in.p, out.p, n, ncclFloat, 0, comm, s);
        break;
      case kReduce:
        r = ncclReduce(in.p, out.p, n, ncclFloat, ncclSum, 0, comm, s);
        break;
    }
    REQUIRE(r == ncclSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(download<float>(out, n) == host);
  }
  REQUIRE(ncclAllReduce(in.p, out.p, n, ncclFloat, ncclMax, comm, s) == ncclSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(download<float>(out, n) == host);
  // In place, and another dtype.
  std::vector<int32_t> ints(n);
  for (size_t i = 0; i < n; ++i) ints[i] = static_cast<int32_t>(i) - 100;
  DevBuf ib(n * sizeof(int32_t));
  upload(ib, ints);
  REQUIRE(ncclAllReduce(ib.p, ib.p, n, ncclInt32, ncclSum, comm, s) == ncclSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(download<int32_t>(ib, n) == ints);
  cudaStreamDestroy(s);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  // The kernel folds its counters into mkernelGetStats at its next post and at finalize: read
  // them once the comm is gone. Every call ran exactly once, and the kernel ran AllReduce.
  CHECK(ranSince(before, kAllReduce) == 3);
  for (int coll : {kAllGather, kReduceScatter, kBroadcast, kReduce})
    CHECK(ranSince(before, coll) == 1);
  CHECK(kernelSince(before, kAllReduce) >= 1);
}

TEST_CASE(
    "gpu: re-entry: ncclBcast on shim and real comms, real comms' calls pass through the shim") {
  const size_t n = 1000;
  DevBuf buf(n * sizeof(float));
  std::vector<float> host = ramp(n, 2.0f);
  // A shim comm: ncclBcast is the shim's (an in-place broadcast).
  ncclComm_t comm = oneRankComm();
  upload(buf, host);
  mkernelStats_t before = stats();
  REQUIRE(ncclBcast(buf.p, n, ncclFloat, 0, comm, nullptr) == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(buf, n) == host);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(ranSince(before, kBroadcast) == 1);  // counters complete once the comm is gone

  // A comm made by the real NCCL directly: the shim forwards ncclBcast to NCCL's pncclBcast,
  // which calls ncclBroadcast through its PLT -> the shim again, with NCCL's handle -> NCCL.
  ncclComm_t real = realOneRankComm();
  upload(buf, host);
  REQUIRE(ncclBcast(buf.p, n, ncclFloat, 0, real, nullptr) == ncclSuccess);
  // Every NCCL collective's enqueue calls ncclCommGetAsyncError on its comm through the PLT.
  DevBuf out(n * sizeof(float));
  poison(out);
  REQUIRE(ncclAllReduce(buf.p, out.p, n, ncclFloat, ncclSum, real, nullptr) == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(out, n) == host);
  int count = 0;
  CHECK(ncclCommCount(real, &count) == ncclSuccess);
  CHECK(count == 1);
  ncclResult_t async = ncclInternalError;
  CHECK(ncclCommGetAsyncError(real, &async) == ncclSuccess);
  CHECK(async == ncclSuccess);
  CHECK(ncclCommDestroy(real) == ncclSuccess);
}

TEST_CASE("gpu: re-entry: NCCL's own ncclCommInitAll gets a real unique id from the shim") {
  // pncclCommInitAll calls ncclGetUniqueId through its PLT; the shim sees the caller inside
  // libnccl and hands out NCCL's id (an mkernel id would break NCCL's bootstrap).
  auto initAll = realFn<ncclResult_t (*)(ncclComm_t*, int, const int*)>("pncclCommInitAll");
  REQUIRE(initAll != nullptr);
  ncclComm_t real = nullptr;
  int dev = 0;
  REQUIRE(initAll(&real, 1, &dev) == ncclSuccess);
  const size_t n = 256;
  DevBuf in(n * sizeof(float)), out(n * sizeof(float));
  upload(in, ramp(n));
  REQUIRE(ncclAllReduce(in.p, out.p, n, ncclFloat, ncclSum, real, nullptr) == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(out, n) == ramp(n));
  CHECK(ncclCommDestroy(real) == ncclSuccess);
}

TEST_CASE("gpu: the shim's ncclCommInitAll (ndev = 1) makes a shim comm") {
  mkernelStats_t before = stats();
  ncclComm_t comms[1] = {nullptr};
  REQUIRE(ncclCommInitAll(comms, 1, nullptr) == ncclSuccess);
  CHECK(stats().commsCreated >= before.commsCreated + 1);  // the kernel side may count its own too
  int dev = -1, rank = -1;
  CHECK(ncclCommCuDevice(comms[0], &dev) == ncclSuccess);
  CHECK(ncclCommUserRank(comms[0], &rank) == ncclSuccess);
  CHECK(rank == 0);
  const size_t n = 512;
  DevBuf in(n * sizeof(float)), out(n * sizeof(float));
  upload(in, ramp(n));
  REQUIRE(ncclAllReduce(in.p, out.p, n, ncclFloat, ncclSum, comms[0], nullptr) == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(out, n) == ramp(n));
  CHECK(ncclCommDestroy(comms[0]) == ncclSuccess);
}

TEST_CASE(
    "gpu: calls mkernel does not run are forwarded on a shim comm: Send/Recv to self, AlltoAll, "
    "Gather, Scatter") {
  ncclComm_t comm = oneRankComm();
  const size_t n = 2048;
  DevBuf in(n * sizeof(float)), out(n * sizeof(float));
  upload(in, ramp(n));
  poison(out);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclSend(in.p, n, ncclFloat, 0, comm, nullptr) == ncclSuccess);
  REQUIRE(ncclRecv(out.p, n, ncclFloat, 0, comm, nullptr) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(out, n) == ramp(n));
  poison(out);
  REQUIRE(ncclAlltoAll(in.p, out.p, n, ncclFloat, comm, nullptr) == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(out, n) == ramp(n));
  poison(out);
  REQUIRE(ncclGather(in.p, out.p, n, ncclFloat, 0, comm, nullptr) == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(out, n) == ramp(n));
  poison(out);
  REQUIRE(ncclScatter(in.p, out.p, n, ncclFloat, 0, comm, nullptr) == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(out, n) == ramp(n));
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
}

TEST_CASE(
    "gpu: a group posts mkernel collectives together and forwards the rest in one real group") {
  ncclComm_t comm = oneRankComm();
  const size_t n = 3000;
  DevBuf a(n * sizeof(float)), b(n * sizeof(float)), c(n * sizeof(float)), d(n * sizeof(float)),
      e(n * sizeof(float));
  upload(a, ramp(n));
  poison(b);
  poison(c);
  poison(d);
  poison(e);
  mkernelStats_t before = stats();
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclGroupStart() == ncclSuccess);  // nested
  REQUIRE(ncclAllReduce(a.p, b.p, n, ncclFloat, ncclSum, comm, nullptr) == ncclSuccess);
  REQUIRE(ncclAllGather(a.p, c.p, n, ncclFloat, comm, nullptr) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(ncclAllReduce(a.p, d.p, n, ncclFloat, ncclMin, comm, nullptr) == ncclSuccess);
  REQUIRE(ncclSend(a.p, n, ncclFloat, 0, comm, nullptr) == ncclSuccess);
  REQUIRE(ncclRecv(e.p, n, ncclFloat, 0, comm, nullptr) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(b, n) == ramp(n));
  CHECK(download<float>(c, n) == ramp(n));
  CHECK(download<float>(d, n) == ramp(n));
  CHECK(download<float>(e, n) == ramp(n));
  // GroupSimulateEnd estimates; mkernel runs nothing. (With one rank NCCL selects no algorithm
  // and leaves the estimate undefined, -1.) The shim issues the collective to the real comm
  // inside the simulated group, so the buffer ends as NCCL itself leaves it: NCCL 2.28.9 copies
  // a one-rank collective at enqueue time, simulated or not (seen on the H200).
  auto realGroupStart = realFn<ncclResult_t (*)()>("pncclGroupStart");
  auto realSimEnd = realFn<ncclResult_t (*)(ncclSimInfo_t*)>("pncclGroupSimulateEnd");
  auto realAllReduce =
      realFn<ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                              cudaStream_t)>("pncclAllReduce");
  auto realDestroy = realFn<ncclResult_t (*)(ncclComm_t)>("pncclCommDestroy");
  REQUIRE((realGroupStart && realSimEnd && realAllReduce && realDestroy));
  ncclComm_t realComm = realOneRankComm();
  ncclSimInfo_t realSim = NCCL_SIM_INFO_INITIALIZER;
  poison(b);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<float> poisoned = download<float>(b, n);
  REQUIRE(realGroupStart() == ncclSuccess);
  REQUIRE(realAllReduce(a.p, b.p, n, ncclFloat, ncclSum, realComm, nullptr) == ncclSuccess);
  CHECK(realSimEnd(&realSim) == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const bool ncclWrites =
      std::memcmp(download<float>(b, n).data(), poisoned.data(), n * sizeof(float)) != 0;
  CHECK(realDestroy(realComm) == ncclSuccess);
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  poison(b);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclAllReduce(a.p, b.p, n, ncclFloat, ncclSum, comm, nullptr) == ncclSuccess);
  CHECK(ncclGroupSimulateEnd(&sim) == ncclSuccess);
  CHECK((sim.estimatedTime >= 0.0f || sim.estimatedTime == NCCL_UNDEF_FLOAT));
  CHECK(sim.estimatedTime == realSim.estimatedTime);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const bool shimWrites =
      std::memcmp(download<float>(b, n).data(), poisoned.data(), n * sizeof(float)) != 0;
  INFO("the real NCCL " << (ncclWrites ? "writes" : "does not write")
                        << " the output of a simulated one-rank group");
  CHECK(shimWrites == ncclWrites);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(ranSince(before, kAllReduce) == 2);  // the simulated one did not run
  CHECK(ranSince(before, kAllGather) == 1);
}

TEST_CASE("gpu: ncclCommSplit and ncclCommShrink make working comms; NOCOLOR gives NULL") {
  ncclComm_t parent = oneRankComm();
  ncclComm_t child = nullptr, none = reinterpret_cast<ncclComm_t>(0x1), grouped = nullptr,
             shrunk = nullptr;
  REQUIRE(ncclCommSplit(parent, 3, 0, &child, nullptr) == ncclSuccess);
  REQUIRE(child != nullptr);
  REQUIRE(ncclCommSplit(parent, NCCL_SPLIT_NOCOLOR, 0, &none, nullptr) == ncclSuccess);
  CHECK(none == nullptr);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclCommSplit(parent, 0, 5, &grouped, nullptr) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  REQUIRE(grouped != nullptr);
  int noRanks[1] = {-1};
  CHECK(ncclCommShrink(parent, nullptr, 0, &shrunk, nullptr, NCCL_SHRINK_DEFAULT) ==
        ncclInvalidArgument);  // as NCCL 2.28.9: the list may not be NULL
  // Excluding nobody from one rank: the shim answers what the real NCCL answers on a real
  // one-rank comm (NCCL 2.28.9 refuses it with ncclInvalidArgument on the H200).
  auto realShrink =
      realFn<ncclResult_t (*)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int)>(
          "pncclCommShrink");
  auto realDestroy = realFn<ncclResult_t (*)(ncclComm_t)>("pncclCommDestroy");
  REQUIRE((realShrink && realDestroy));
  ncclComm_t realParent = realOneRankComm(), realShrunk = nullptr;
  const ncclResult_t ncclShrinkResult =
      realShrink(realParent, noRanks, 0, &realShrunk, nullptr, NCCL_SHRINK_DEFAULT);
  const bool ncclGaveComm = realShrunk != nullptr;
  if (realShrunk != nullptr) (void)realDestroy(realShrunk);
  CHECK(realDestroy(realParent) == ncclSuccess);
  ncclResult_t shrinkResult =
      ncclCommShrink(parent, noRanks, 0, &shrunk, nullptr, NCCL_SHRINK_DEFAULT);
  INFO(ncclGetLastError(parent));
  REQUIRE(shrinkResult == ncclShrinkResult);
  CHECK((shrunk != nullptr) == ncclGaveComm);  // a failed blocking shrink: a handle or not, as NCCL
  if (shrinkResult != ncclSuccess && shrunk != nullptr) {
    (void)ncclCommDestroy(shrunk);
    shrunk = nullptr;
  }
  CHECK(ncclCommSplit(parent, -5, 0, &none, nullptr) == ncclInvalidArgument);
  int bad = 0;
  CHECK(ncclCommShrink(parent, &bad, 1, &none, nullptr, NCCL_SHRINK_DEFAULT) ==
        ncclInvalidArgument);
  const size_t n = 777;
  DevBuf in(n * sizeof(float)), out(n * sizeof(float));
  upload(in, ramp(n));
  for (ncclComm_t c : {child, grouped, shrunk}) {
    if (c == nullptr) continue;  // the shrink NCCL refuses
    int count = 0;
    CHECK(ncclCommCount(c, &count) == ncclSuccess);
    CHECK(count == 1);
    poison(out);
    REQUIRE(ncclAllReduce(in.p, out.p, n, ncclFloat, ncclSum, c, nullptr) == ncclSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(download<float>(out, n) == ramp(n));
    CHECK(ncclCommDestroy(c) == ncclSuccess);
  }
  CHECK(ncclCommDestroy(parent) == ncclSuccess);
}

TEST_CASE("gpu: ncclRedOpCreatePreMulSum, host and device scalars, on both paths") {
  ncclComm_t comm = oneRankComm();
  const size_t n = 1024;
  DevBuf in(n * sizeof(float)), out(n * sizeof(float)), scalarDev(sizeof(float));
  upload(in, ramp(n));
  float three = 3.0f, half = 0.5f;
  cudaMemcpy(scalarDev.p, &half, sizeof(float), cudaMemcpyHostToDevice);
  ncclRedOp_t byHost, byDev;
  REQUIRE(ncclRedOpCreatePreMulSum(&byHost, &three, ncclFloat, ncclScalarHostImmediate, comm) ==
          ncclSuccess);
  REQUIRE(ncclRedOpCreatePreMulSum(&byDev, scalarDev.p, ncclFloat, ncclScalarDevice, comm) ==
          ncclSuccess);
  CHECK(byHost != byDev);
  three = 100.0f;  // host-immediate: the value was taken at creation
  std::vector<float> expect3 = ramp(n), expectHalf = ramp(n);
  for (float& v : expect3) v *= 3.0f;
  for (float& v : expectHalf) v *= 0.5f;
  REQUIRE(ncclAllReduce(in.p, out.p, n, ncclFloat, byHost, comm, nullptr) == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(out, n) == expect3);
  REQUIRE(ncclReduceScatter(in.p, out.p, n, ncclFloat, byDev, comm, nullptr) == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(out, n) == expectHalf);
  CHECK(ncclAllReduce(in.p, out.p, n, ncclHalf, byHost, comm, nullptr) ==
        ncclInvalidArgument);  // dtype mismatch
  CHECK(ncclRedOpDestroy(byHost, comm) == ncclSuccess);
  CHECK(ncclAllReduce(in.p, out.p, n, ncclFloat, byHost, comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclRedOpDestroy(byHost, comm) == ncclInvalidArgument);
  CHECK(ncclRedOpDestroy(ncclSum, comm) == ncclInvalidArgument);
  CHECK(ncclRedOpDestroy(byDev, comm) == ncclSuccess);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
}

TEST_CASE("gpu: a non-blocking communicator completes and says so through ncclCommGetAsyncError") {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = oneRankComm(&config);
  ncclResult_t state = ncclInProgress;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline)
    REQUIRE(ncclCommGetAsyncError(comm, &state) == ncclSuccess);
  CHECK(state == ncclSuccess);
  const size_t n = 64;
  DevBuf in(n * sizeof(float)), out(n * sizeof(float));
  upload(in, ramp(n));
  ncclResult_t r = ncclAllReduce(in.p, out.p, n, ncclFloat, ncclSum, comm, nullptr);
  CHECK((r == ncclSuccess || r == ncclInProgress));
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download<float>(out, n) == ramp(n));
  CHECK(ncclCommGetAsyncError(comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
}

TEST_CASE("gpu: arguments are checked on a live comm with NCCL's codes and a message") {
  // Buffers are checked only with NCCL_CHECK_POINTERS=1 at creation, as in NCCL (off by default:
  // two driver calls per collective).
  setenv("NCCL_CHECK_POINTERS", "1", 1);
  ncclComm_t comm = oneRankComm();
  unsetenv("NCCL_CHECK_POINTERS");
  const size_t n = 16;
  DevBuf in(n * sizeof(float)), out(n * sizeof(float));
  std::vector<float> host(n);
  CHECK(ncclAllReduce(in.p, out.p, n, static_cast<ncclDataType_t>(ncclNumTypes), ncclSum, comm,
                      nullptr) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(comm)).find("invalid type") != std::string::npos);
  CHECK(ncclAllReduce(in.p, out.p, n, ncclFloat, static_cast<ncclRedOp_t>(77), comm, nullptr) ==
        ncclInvalidArgument);
  CHECK(ncclBroadcast(in.p, out.p, n, ncclFloat, 1, comm, nullptr) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(comm)).find("invalid root 1") != std::string::npos);
  CHECK(ncclAllReduce(in.p, out.p, std::numeric_limits<size_t>::max() / 2, ncclFloat, ncclSum, comm,
                      nullptr) == ncclInvalidArgument);
  CHECK(ncclAllReduce(host.data(), out.p, n, ncclFloat, ncclSum, comm, nullptr) ==
        ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(comm)).find("sendbuff") != std::string::npos);
  CHECK(ncclAllReduce(in.p, nullptr, n, ncclFloat, ncclSum, comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, comm, nullptr) ==
        ncclSuccess);  // nothing to move
  CHECK(ncclSend(host.data(), n, ncclFloat, 0, comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclSend(in.p, n, ncclFloat, 3, comm, nullptr) == ncclInvalidArgument);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
}

TEST_CASE("gpu: finalize, destroy, abort and revoke, and what a comm answers afterwards") {
  const size_t n = 64;
  DevBuf in(n * sizeof(float)), out(n * sizeof(float));
  ncclComm_t comm = oneRankComm();
  CHECK(ncclCommFinalize(comm) == ncclSuccess);
  CHECK(ncclAllReduce(in.p, out.p, n, ncclFloat, ncclSum, comm, nullptr) == ncclInvalidUsage);
  int count = 0;
  CHECK(ncclCommCount(comm, &count) == ncclSuccess);  // queries still answer
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  // The handle was NCCL's communicator, now freed: using it again is undefined, as with NCCL alone
  // (docs/SHIM.md, "Handles"; an emulated one stays recognised: test_shim_handles).

  ncclComm_t busy = oneRankComm();
  for (int i = 0; i < 20; ++i)
    REQUIRE(ncclAllReduce(in.p, out.p, n, ncclFloat, ncclSum, busy, nullptr) == ncclSuccess);
  auto t0 = std::chrono::steady_clock::now();
  CHECK(ncclCommAbort(busy) == ncclSuccess);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
  cudaDeviceSynchronize();

  ncclComm_t revoked = oneRankComm();
  CHECK(ncclCommRevoke(revoked, 1) == ncclInvalidArgument);
  CHECK(ncclCommRevoke(revoked, NCCL_REVOKE_DEFAULT) == ncclSuccess);
  CHECK(ncclAllReduce(in.p, out.p, n, ncclFloat, ncclSum, revoked, nullptr) == ncclInvalidUsage);
  CHECK(ncclCommFinalize(revoked) == ncclInvalidUsage);
  CHECK(ncclCommDestroy(revoked) == ncclSuccess);
}

TEST_CASE("gpu: memory, registration and windows go to the real NCCL with the real comm") {
  ncclComm_t comm = oneRankComm();
  void* buf = nullptr;
  const size_t bytes = 1 << 21;
  REQUIRE(ncclMemAlloc(&buf, bytes) == ncclSuccess);
  REQUIRE(buf != nullptr);
  void* handle = nullptr;
  CHECK(ncclCommRegister(comm, buf, bytes, &handle) == ncclSuccess);
  CHECK(ncclCommDeregister(comm, handle) == ncclSuccess);
  ncclWindow_t win = nullptr;
  ncclResult_t r = ncclCommWindowRegister(comm, buf, bytes, &win, NCCL_WIN_DEFAULT);
  INFO(ncclGetLastError(comm));
  CHECK(r == ncclSuccess);
  if (r == ncclSuccess) CHECK(ncclCommWindowDeregister(comm, win) == ncclSuccess);
  ncclTeam_t world = ncclTeamWorld(comm);
  CHECK(world.nRanks == 1);
  CHECK(world.rank == 0);
  CHECK(ncclMemFree(buf) == ncclSuccess);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
}

TEST_CASE("gpu: host cost per call, shim vs the real NCCL (printed)") {
  // Host time to enqueue one 8-byte AllReduce, back to back on one stream: the shim's checks,
  // routing and posting, against NCCL's own enqueue on a real comm. Printed for docs/SHIM.md.
  const int iters = 2000;
  DevBuf in(64), out(64);
  cudaStream_t s;
  REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
  auto timeCalls = [&](ncclComm_t comm,
                       ncclResult_t (*allReduce)(const void*, void*, size_t, ncclDataType_t,
                                                 ncclRedOp_t, ncclComm_t, cudaStream_t)) {
    for (int i = 0; i < 100; ++i)
      REQUIRE(allReduce(in.p, out.p, 2, ncclFloat, ncclSum, comm, s) == ncclSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    // Host cost alone: bursts of 48 calls after a sync, fewer than the persistent kernel's 64
    // eager slots, so no call waits for the GPU to free one (2000 calls in a row would measure
    // the GPU's rate instead). Median over 20 bursts.
    std::vector<double> burst;
    for (int rep = 0; rep < 20; ++rep) {
      REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
      auto b0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 48; ++i)
        REQUIRE(allReduce(in.p, out.p, 2, ncclFloat, ncclSum, comm, s) == ncclSuccess);
      burst.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - b0).count() /
          48);
    }
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    std::sort(burst.begin(), burst.end());
    // Back to back, including completion: the rate the GPU sustains.
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i)
      REQUIRE(allReduce(in.p, out.p, 2, ncclFloat, ncclSum, comm, s) == ncclSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    auto t2 = std::chrono::steady_clock::now();
    return std::make_pair(burst[burst.size() / 2],
                          std::chrono::duration<double, std::micro>(t2 - t0).count() / iters);
  };
  ncclComm_t comm = oneRankComm();
  auto shim = timeCalls(comm, &ncclAllReduce);
  // The same through the shim with everything forwarded (MKERNEL_DISABLE=1 at creation): the
  // shim's own cost on top of NCCL's.
  setenv("MKERNEL_DISABLE", "1", 1);
  mkernel::params::resetForTesting();
  ncclComm_t forwarding = oneRankComm();
  unsetenv("MKERNEL_DISABLE");
  mkernel::params::resetForTesting();
  auto forwarded = timeCalls(forwarding, &ncclAllReduce);
  auto realAllReduce =
      realFn<ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                              cudaStream_t)>("pncclAllReduce");
  REQUIRE(realAllReduce != nullptr);
  ncclComm_t real = realOneRankComm();
  auto nccl = timeCalls(real, realAllReduce);
  WARN(
      "host us/call for an 8-byte AllReduce, 1 rank (enqueue: median of 20 bursts of 48 calls; "
      "completion: "
      << iters << " calls back to back): shim->mkernel enqueue " << shim.first
      << " us (incl. completion " << shim.second << "); shim->NCCL enqueue " << forwarded.first
      << " us (incl. completion " << forwarded.second << "); NCCL 2.28 directly enqueue "
      << nccl.first << " us (incl. completion " << nccl.second << ")");
  CHECK(forwarded.first < nccl.first + 20.0);  // the shim adds microseconds, not tens of them
  CHECK(ncclCommDestroy(forwarding) == ncclSuccess);
  CHECK(ncclCommDestroy(real) == ncclSuccess);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  cudaStreamDestroy(s);
}

// One captured AllReduce under MKERNEL_GRAPH=`mode` (unset: the default), replayed three times:
// its output checked each time, and a device allocation after the capture returns (the hang the
// persistent kernel's residency risked, docs/KERNEL.md). Returns how many of the eager call and
// the captured one ran in mkernel and how many went to NCCL.
static std::pair<uint64_t, uint64_t> capturedAllReduce(const char* mode) {
  // MKERNEL_GRAPH is read when the communicator is created (shim_select.h, graphRoute).
  if (mode == nullptr)
    unsetenv("MKERNEL_GRAPH");
  else
    setenv("MKERNEL_GRAPH", mode, 1);
  mkernel::params::resetForTesting();
  ncclComm_t comm = oneRankComm();
  const size_t n = 4096;
  DevBuf in(n * sizeof(float)), out(n * sizeof(float));
  std::vector<float> host = ramp(n);
  upload(in, host);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  // Eager first: the kernel runs it.
  const mkernelStats_t before = stats();
  REQUIRE(ncclAllReduce(in.p, out.p, n, ncclFloat, ncclSum, comm, s) == ncclSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  const ncclResult_t r = ncclAllReduce(in.p, out.p, n, ncclFloat, ncclSum, comm, s);
  REQUIRE(cudaStreamEndCapture(s, &graph) == cudaSuccess);
  REQUIRE(r == ncclSuccess);
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  for (int rep = 0; rep < 3; ++rep) {
    poison(out);
    REQUIRE(cudaGraphLaunch(exec, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(download<float>(out, n) == host);
  }
  void* fresh = nullptr;
  CHECK(cudaMalloc(&fresh, 1 << 20) == cudaSuccess);
  cudaFree(fresh);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  unsetenv("MKERNEL_GRAPH");
  mkernel::params::resetForTesting();
  const mkernelStats_t after = stats();
  CHECK(ranSince(before, kAllReduce) == 2);  // the eager call and the captured one, each once
  return {kernelSince(before, kAllReduce),
          after.forwardedOps[kAllReduce] - before.forwardedOps[kAllReduce]};
}

TEST_CASE(
    "gpu: a captured collective the launch path takes stays in mkernel (MKERNEL_GRAPH=auto, the "
    "default)") {
  const auto ran = capturedAllReduce(nullptr);
  CHECK(ran.first == 2);  // eager and captured, both in mkernel
  CHECK(ran.second == 0);
}

TEST_CASE("gpu: with MKERNEL_GRAPH=nccl a captured collective runs in the real NCCL") {
  const auto ran = capturedAllReduce("nccl");
  CHECK(ran.first == 1);  // only the eager one ran in mkernel
  CHECK(ran.second == 1);
}
