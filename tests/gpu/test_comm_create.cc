// Communicator::create where the persistent kernel cannot run: a build without device code says
// so (InvalidUsage), a host without a CUDA device says so (UnhandledCudaError "no CUDA device");
// with a GPU, a one-rank communicator runs an AllReduce. Hardware-free (label unit).
#include "tests/catch.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "common/result.h"
#include "transport/bootstrap/bootstrap.h"
#include "common/param.h"

using mkernel::Result;

TEST_CASE("Communicator::create explains why it cannot run, or runs") {
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 1);
  mkernel::params::resetForTesting();
  mkernel::bootstrap::UniqueId id;
  REQUIRE(mkernel::bootstrap::createUniqueId(&id) == Result::Success);
  std::unique_ptr<mkernel::bootstrap::Bootstrap> bs;
  REQUIRE(mkernel::bootstrap::Bootstrap::create(id, 0, 1, &bs) == Result::Success);
  mkernel::coll::CommOptions opts;
  std::unique_ptr<mkernel::coll::Communicator> comm;
  Result r = mkernel::coll::Communicator::create(opts, bs.get(), &comm);
  std::string msg = mkernel::lastError();
#ifndef MKERNEL_HAVE_DEVICE_CODE
  CHECK(r == Result::InvalidUsage);
  CHECK(msg.find("without device code") != std::string::npos);
  CHECK(comm == nullptr);
#else
  int nDev = 0;
  const bool gpu = cudaGetDeviceCount(&nDev) == cudaSuccess && nDev > 0;
  if (!gpu) {
    CHECK(r == Result::UnhandledCudaError);
    CHECK(msg.find("no CUDA device") != std::string::npos);
    CHECK(comm == nullptr);
    return;
  }
  REQUIRE(r == Result::Success);
  const size_t count = 1000;
  std::vector<float> host(count, 1.5f), out(count, 0.0f);
  float* buf = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&buf), count * sizeof(float)) == cudaSuccess);
  cudaMemcpy(buf, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
  mkernel::coll::CollArgs a;
  a.sendbuff = buf;
  a.recvbuff = buf;
  a.count = count;
  REQUIRE(comm->enqueue(&a, 1, nullptr) == Result::Success);
  REQUIRE(cudaMemcpy(out.data(), buf, count * sizeof(float), cudaMemcpyDeviceToHost) ==
          cudaSuccess);
  CHECK(out[0] == 1.5f);
  CHECK(out[count - 1] == 1.5f);
  CHECK(comm->asyncError() == Result::Success);
  CHECK(comm->finalize() == Result::Success);
  cudaFree(buf);
#endif
}

#ifdef MKERNEL_HAVE_DEVICE_CODE
#include "collectives/runtime/sm_budget.h"

// CommOptions::persistentKernel = false (the shim's choice on one node with a real NCCL): the
// communicator reserves no SMs, runs what the launch path takes, and refuses what would need the
// persistent kernel (MKERNEL_GRAPH_LAUNCH=0 sends every collective there).
TEST_CASE("Communicator::create without a persistent kernel holds no SMs") {
  int nDev = 0;
  if (cudaGetDeviceCount(&nDev) != cudaSuccess || nDev == 0) return;  // the case above covers it
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 1);
  for (bool graphLaunch : {true, false}) {
    setenv("MKERNEL_GRAPH_LAUNCH", graphLaunch ? "1" : "0", 1);
    mkernel::params::resetForTesting();
    mkernel::bootstrap::UniqueId id;
    REQUIRE(mkernel::bootstrap::createUniqueId(&id) == Result::Success);
    std::unique_ptr<mkernel::bootstrap::Bootstrap> bs;
    REQUIRE(mkernel::bootstrap::Bootstrap::create(id, 0, 1, &bs) == Result::Success);
    mkernel::coll::CommOptions opts;
    opts.persistentKernel = false;
    const int heldBefore = mkernel::coll::SmBudget::process().held(0);
    std::unique_ptr<mkernel::coll::Communicator> comm;
    REQUIRE(mkernel::coll::Communicator::create(opts, bs.get(), &comm) == Result::Success);
    CHECK(mkernel::coll::SmBudget::process().held(0) == heldBefore);
    mkernel::coll::CollStats st;
    comm->stats(&st);
    CHECK(st.persistentCtas == 0);
    float* buf = nullptr;
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&buf), 4096) == cudaSuccess);
    mkernel::coll::CollArgs a;
    a.sendbuff = buf;
    a.recvbuff = buf;
    a.count = 1024;
    CHECK(comm->needsDoorbell(a) == !graphLaunch);
    const Result r = comm->enqueue(&a, 1, nullptr);
    if (graphLaunch) {
      CHECK(r == Result::Success);
    } else {
      CHECK(r == Result::InternalError);
      CHECK(std::string(mkernel::lastError()).find("made without one") != std::string::npos);
    }
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    comm->stats(&st);
    CHECK(st.kernelLaunches == 0);
    CHECK(comm->finalize() == Result::Success);
    comm.reset();
    cudaFree(buf);
  }
  unsetenv("MKERNEL_GRAPH_LAUNCH");
  mkernel::params::resetForTesting();
}
#endif
