// GPU tier, one rank, the real NCCL beside the shim: MKERNEL_STATS=1's line at ncclCommDestroy
// names what the communicator ran, in mkernel and in NCCL, the same counts mkernelGetStats
// gained over its life. MKERNEL_COLLECTIVES=allreduce sends its Broadcasts to NCCL.
#include "tests/catch.h"
#include "tests/stderr_capture.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "plugin/shim/nccl_api.h"
#include "tests/plugin/shim/shim_gpu_util.h"

using namespace shimtest;

namespace {

using mktest::StderrCapture;

struct Env {
  Env() {
    chooseRealNccl();
    if (std::getenv("MKERNEL_TIMEOUT_S") == nullptr) setenv("MKERNEL_TIMEOUT_S", "60", 1);
    setenv("MKERNEL_COLLECTIVES", "allreduce", 1);
  }
} gEnv;

const char* const kNames[5] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"};

}  // namespace

TEST_CASE(
    "gpu: MKERNEL_STATS=1: the destroyed communicator's line matches what mkernelGetStats "
    "counted") {
  REQUIRE(std::string(std::getenv("MKERNEL_STATS") ? std::getenv("MKERNEL_STATS") : "") == "1");
  const mkernelStats_t before = stats();
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  INFO(ncclGetLastError(nullptr));
  REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  const size_t n = 1024;
  DevBuf in(n * sizeof(float)), out(n * sizeof(float));
  REQUIRE(in.p != nullptr);
  REQUIRE(out.p != nullptr);
  for (int i = 0; i < 3; ++i)
    REQUIRE(ncclAllReduce(in.p, out.p, n, ncclFloat32, ncclSum, comm, stream) == ncclSuccess);
  for (int i = 0; i < 2; ++i)
    REQUIRE(ncclBroadcast(in.p, out.p, n, ncclFloat32, 0, comm, stream) == ncclSuccess);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  std::string log;
  {
    StderrCapture cap;
    REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
    log = cap.text();
  }
  cudaStreamDestroy(stream);
  INFO(log);
  const mkernelStats_t after = stats();
  uint64_t mk[5], fwd[5], total = 0, totalFwd = 0;
  for (int c = 0; c < 5; ++c) {
    mk[c] = after.kernelOps[c] - before.kernelOps[c];
    fwd[c] = after.forwardedOps[c] - before.forwardedOps[c];
    total += mk[c] + fwd[c];
    totalFwd += fwd[c];
  }
  CHECK(mk[kAllReduce] + fwd[kAllReduce] == 3);
  CHECK(fwd[kBroadcast] == 2);  // MKERNEL_COLLECTIVES=allreduce
  const size_t at = log.find("MKERNEL STATS comm ");
  REQUIRE(at != std::string::npos);
  const std::string line = log.substr(at, log.find('\n', at) - at);
  INFO(line);
  CHECK(line.find(" rank 0/1: " + std::to_string(total) + " collectives: persistent kernel ") !=
        std::string::npos);
  CHECK(line.find("forwarded to NCCL " + std::to_string(totalFwd) + ";") != std::string::npos);
  std::string perColl;
  const char* sep = "; mkernel/NCCL:";
  for (int c = 0; c < 5; ++c) {
    if (mk[c] == 0 && fwd[c] == 0) continue;
    perColl += std::string(sep) + " " + kNames[c] + " " + std::to_string(mk[c]) + "/" +
               std::to_string(fwd[c]);
    sep = ",";
  }
  CHECK(line.find(perColl) != std::string::npos);
}
