// GPU tier, emulation (MKERNEL_EMULATE=1): 2-4 thread ranks share the one GPU through the shim's
// API, with no real NCCL behind them. Calls mkernel does not run must fail with a message.
#include "tests/catch.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "plugin/shim/nccl_api.h"
#include "tests/plugin/shim/shim_gpu_util.h"
#include "common/param.h"

using namespace shimtest;

namespace {

struct Env {
  Env() {
    setenv("MKERNEL_EMULATE", "1", 1);
    mkernel::params::resetForTesting();
    if (std::getenv("MKERNEL_TIMEOUT_S") == nullptr) setenv("MKERNEL_TIMEOUT_S", "60", 1);
    mkernel::params::resetForTesting();
  }
} gEnv;

// Runs body(rank, comm, stream) on nRanks threads, each with its own shim comm of one id and its
// own stream: ranks sharing a GPU must not share a stream (rank 0's collective would wait, on
// the legacy default stream, for peers queued behind it).
void runRanks(int nRanks, const std::function<void(int, ncclComm_t, cudaStream_t)>& body) {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<ncclComm_t> comms(static_cast<size_t>(nRanks), nullptr);
  std::vector<ncclResult_t> results(static_cast<size_t>(nRanks), ncclInternalError);
  std::vector<std::thread> threads;
  for (int r = 0; r < nRanks; ++r)
    threads.emplace_back([&, r] {
      cudaSetDevice(0);
      results[static_cast<size_t>(r)] =
          ncclCommInitRank(&comms[static_cast<size_t>(r)], nRanks, id, r);
    });
  for (std::thread& t : threads) t.join();
  threads.clear();
  for (int r = 0; r < nRanks; ++r) {
    INFO("rank " << r << ": " << ncclGetLastError(nullptr));
    REQUIRE(results[static_cast<size_t>(r)] == ncclSuccess);
  }
  // Catch2's assertions are not thread-safe: ranks record, the main thread checks. Device
  // buffers are freed once every rank is done (DeferredFrees).
  DeferredFrees frees;
  for (int r = 0; r < nRanks; ++r)
    threads.emplace_back([&, r] {
      cudaSetDevice(0);
      tDeferredFrees = &frees;
      cudaStream_t stream = nullptr;
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      body(r, comms[static_cast<size_t>(r)], stream);
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
      tDeferredFrees = nullptr;
    });
  for (std::thread& t : threads) t.join();
  threads.clear();
  frees.freeAll();
  for (int r = 0; r < nRanks; ++r)
    threads.emplace_back([&, r] {
      results[static_cast<size_t>(r)] = ncclCommDestroy(comms[static_cast<size_t>(r)]);
    });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < nRanks; ++r) CHECK(results[static_cast<size_t>(r)] == ncclSuccess);
}

}  // namespace

TEST_CASE("emulate: 2 and 4 thread ranks on one GPU: the five collectives give the definition") {
  for (int nRanks : {2, 4}) {
    const size_t n = 1000;  // not a multiple of the rank count's slices on purpose
    std::vector<std::vector<float>> got(static_cast<size_t>(nRanks) * 5);
    std::vector<ncclResult_t> errs(static_cast<size_t>(nRanks), ncclSuccess);
    runRanks(nRanks, [&](int rank, ncclComm_t comm, cudaStream_t s) {
      DevBuf in(n * nRanks * sizeof(float)), out(n * nRanks * sizeof(float));
      std::vector<float> mine(n * static_cast<size_t>(nRanks));
      for (size_t i = 0; i < mine.size(); ++i)
        mine[i] = static_cast<float>(rank + 1) * 0.25f + static_cast<float>(i % 7);
      upload(in, mine);
      auto run = [&](int slot, ncclResult_t r, size_t outCount) {
        if (r != ncclSuccess) errs[static_cast<size_t>(rank)] = r;
        cudaStreamSynchronize(s);
        got[static_cast<size_t>(rank * 5 + slot)] = download<float>(out, outCount);
      };
      run(0, ncclAllReduce(in.p, out.p, n, ncclFloat, ncclSum, comm, s), n);
      run(1, ncclAllGather(in.p, out.p, n, ncclFloat, comm, s), n * nRanks);
      run(2, ncclReduceScatter(in.p, out.p, n, ncclFloat, ncclSum, comm, s), n);
      run(3, ncclBroadcast(in.p, out.p, n, ncclFloat, nRanks - 1, comm, s), n);
      run(4, ncclReduce(in.p, out.p, n, ncclFloat, ncclMax, 0, comm, s), n);
    });
    INFO(nRanks << " ranks");
    for (ncclResult_t e : errs) CHECK(e == ncclSuccess);
    auto input = [&](int rank, size_t i) {
      return static_cast<float>(rank + 1) * 0.25f + static_cast<float>(i % 7);
    };
    for (int rank = 0; rank < nRanks; ++rank) {
      const auto& ar = got[static_cast<size_t>(rank * 5 + 0)];
      const auto& ag = got[static_cast<size_t>(rank * 5 + 1)];
      const auto& rs = got[static_cast<size_t>(rank * 5 + 2)];
      const auto& bc = got[static_cast<size_t>(rank * 5 + 3)];
      for (size_t i = 0; i < n; ++i) {
        float sum = 0, sumRs = 0;
        for (int r = 0; r < nRanks; ++r) {
          sum += input(r, i);
          sumRs += input(r, static_cast<size_t>(rank) * n + i);
        }
        CHECK(ar[i] == Approx(sum).epsilon(1e-5));
        CHECK(rs[i] == Approx(sumRs).epsilon(1e-5));
        CHECK(bc[i] == input(nRanks - 1, i));
      }
      for (int r = 0; r < nRanks; ++r)
        for (size_t i = 0; i < n; i += 97) CHECK(ag[static_cast<size_t>(r) * n + i] == input(r, i));
    }
    const auto& red = got[0 * 5 + 4];  // rank 0 is the root
    for (size_t i = 0; i < n; ++i) CHECK(red[i] == input(nRanks - 1, i));
  }
}

TEST_CASE("emulate: one thread creates 4 ranks inside a group (deferred to ncclGroupEnd)") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comms[4] = {};
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < 4; ++r) REQUIRE(ncclCommInitRank(&comms[r], 4, id, r) == ncclSuccess);
  ncclResult_t state = ncclSuccess;
  CHECK(ncclCommGetAsyncError(comms[0], &state) == ncclSuccess);
  CHECK(state == ncclInProgress);  // not made until the group ends
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  CHECK(ncclCommGetAsyncError(comms[0], &state) == ncclSuccess);
  CHECK(state == ncclSuccess);
  // One thread drives all four ranks: their collectives go in one group.
  const size_t n = 333;
  std::vector<std::unique_ptr<DevBuf>> bufs;
  cudaStream_t streams[4];
  for (int r = 0; r < 4; ++r) {
    bufs.emplace_back(new DevBuf(n * sizeof(int32_t)));
    upload(*bufs.back(), std::vector<int32_t>(n, r + 1));
    REQUIRE(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking) == cudaSuccess);
  }
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < 4; ++r)
    REQUIRE(ncclAllReduce(bufs[r]->p, bufs[r]->p, n, ncclInt32, ncclSum, comms[r], streams[r]) ==
            ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  for (int r = 0; r < 4; ++r) {
    REQUIRE(cudaStreamSynchronize(streams[r]) == cudaSuccess);
    cudaStreamDestroy(streams[r]);
  }
  for (int r = 0; r < 4; ++r) CHECK(download<int32_t>(*bufs[r], n) == std::vector<int32_t>(n, 10));
  REQUIRE(ncclGroupStart() == ncclSuccess);  // destroy is collective for the kernel: one group
  for (int r = 0; r < 4; ++r) CHECK(ncclCommDestroy(comms[r]) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
}

TEST_CASE("emulate: ncclCommInitAll may put every rank on device 0") {
  ncclComm_t comms[3] = {};
  int devs[3] = {0, 0, 0};
  REQUIRE(ncclCommInitAll(comms, 3, devs) == ncclSuccess);
  for (int r = 0; r < 3; ++r) {
    int rank = -1, count = 0;
    CHECK(ncclCommUserRank(comms[r], &rank) == ncclSuccess);
    CHECK(ncclCommCount(comms[r], &count) == ncclSuccess);
    CHECK(rank == r);
    CHECK(count == 3);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) threads.emplace_back([&, r] { ncclCommDestroy(comms[r]); });
  for (std::thread& t : threads) t.join();
}

// NCCL's single-process teardown (its examples, nccl-tests -t/-g): one thread destroys every
// rank's comm in turn, outside a group. Each ncclCommDestroy must return without waiting for
// members that only this same thread will destroy later: with a 2 s grace each, 8 ranks' first
// member's finalize barrier would wait 14 s for the last and fail under a short MKERNEL_TIMEOUT_S
// (nccl-tests -t 8 on the H200: "timed out after 10 s waiting for 1 bytes from peer 7", then a
// crash at exit).
TEST_CASE(
    "emulate: one thread destroys 4 ranks in turn, outside a group, without waiting for each") {
  for (int round = 0; round < 2; ++round) {
    INFO("round " << round);
    ncclComm_t comms[4] = {};
    int devs[4] = {0, 0, 0, 0};
    REQUIRE(ncclCommInitAll(comms, 4, devs) == ncclSuccess);
    const size_t n = 1000;
    std::vector<std::unique_ptr<DevBuf>> bufs;
    cudaStream_t streams[4];
    for (int r = 0; r < 4; ++r) {
      bufs.emplace_back(new DevBuf(n * sizeof(float)));
      upload(*bufs.back(), std::vector<float>(n, 1.0f));
      REQUIRE(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking) == cudaSuccess);
    }
    REQUIRE(ncclGroupStart() == ncclSuccess);
    for (int r = 0; r < 4; ++r)
      REQUIRE(ncclAllReduce(bufs[r]->p, bufs[r]->p, n, ncclFloat32, ncclSum, comms[r],
                            streams[r]) == ncclSuccess);
    REQUIRE(ncclGroupEnd() == ncclSuccess);
    for (int r = 0; r < 4; ++r) {
      REQUIRE(cudaStreamSynchronize(streams[r]) == cudaSuccess);
      cudaStreamDestroy(streams[r]);
      CHECK(download<float>(*bufs[r], n) == std::vector<float>(n, 4.0f));
    }
    double slowest = 0, total = 0;
    for (int r = 0; r < 4; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      CHECK(ncclCommDestroy(comms[r]) == ncclSuccess);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      slowest = std::max(slowest, s);
      total += s;
    }
    // Members 0-2 return at once; the last waits at most the grace for the finalize barrier,
    // which every member has reached by then.
    INFO("slowest destroy " << slowest << " s, all four " << total << " s");
    CHECK(total < 2.0);
  }
}

TEST_CASE("emulate: what needs the real NCCL fails with ncclInvalidUsage and says why") {
  std::vector<std::string> messages(2);
  std::vector<ncclResult_t> codes(2 * 4, ncclSuccess);
  runRanks(2, [&](int rank, ncclComm_t comm, cudaStream_t s) {
    DevBuf buf(1024);
    void* handle = nullptr;
    codes[static_cast<size_t>(rank * 4 + 0)] = ncclSend(buf.p, 16, ncclFloat, 1 - rank, comm, s);
    messages[static_cast<size_t>(rank)] = ncclGetLastError(comm);
    codes[static_cast<size_t>(rank * 4 + 1)] = ncclAlltoAll(buf.p, buf.p, 16, ncclFloat, comm, s);
    codes[static_cast<size_t>(rank * 4 + 2)] = ncclCommRegister(comm, buf.p, 1024, &handle);
    codes[static_cast<size_t>(rank * 4 + 3)] =
        ncclAllReduce(buf.p, buf.p, 16, ncclFloat, ncclSum, comm, s);
    cudaStreamSynchronize(s);
  });
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(codes[static_cast<size_t>(rank * 4 + 0)] == ncclInvalidUsage);
    CHECK(messages[static_cast<size_t>(rank)].find("MKERNEL_EMULATE") != std::string::npos);
    CHECK(codes[static_cast<size_t>(rank * 4 + 1)] == ncclInvalidUsage);
    CHECK(codes[static_cast<size_t>(rank * 4 + 2)] == ncclInvalidUsage);
    CHECK(codes[static_cast<size_t>(rank * 4 + 3)] == ncclSuccess);  // and the comm still works
  }
}

TEST_CASE("emulate: ncclCommSplit by parity, then collectives on the halves") {
  // Every communicator's CTAs stay reserved on the GPU while it lives
  // (collectives/runtime/sm_budget.h): 4 emulated ranks x the default 32 CTAs take all 128 SMs an
  // H200 lends persistent kernels, and the halves would fail with "cannot fit" on the H200. 8 CTAs
  // each: 32 for the parent, 32 for the two halves.
  setenv("MKERNEL_CTAS", "8", 1);
  mkernel::params::resetForTesting();
  std::vector<std::vector<int32_t>> got(4);
  std::vector<int> sizes(4, 0);
  // What each rank's calls returned, and the last error then: a wrong sum with every call
  // successful (seen once in three runs on the H200) must say so.
  std::vector<std::string> said(4);
  runRanks(4, [&](int rank, ncclComm_t comm, cudaStream_t s) {
    ncclComm_t half = nullptr;
    std::string& log = said[static_cast<size_t>(rank)];
    const ncclResult_t sr = ncclCommSplit(comm, rank % 2, -rank, &half, nullptr);
    log += "split " + std::to_string(sr);
    if (sr != ncclSuccess || half == nullptr) {
      log += std::string(": ") + ncclGetLastError(comm);
      return;
    }
    {
      // The half's handle, to match the shim's "comm %p rank r/2 ... ready" INFO line (ctest runs
      // this test with MKERNEL_DEBUG=INFO for INIT, docs/RELIABILITY.md).
      char at[32];
      std::snprintf(at, sizeof(at), " (half %p)", static_cast<void*>(half));
      log += at;
    }
    ncclCommCount(half, &sizes[static_cast<size_t>(rank)]);
    DevBuf buf(64 * sizeof(int32_t));
    upload(buf, std::vector<int32_t>(64, rank));
    const ncclResult_t ar = ncclAllReduce(buf.p, buf.p, 64, ncclInt32, ncclSum, half, s);
    const cudaError_t se = cudaStreamSynchronize(s);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(half, &async);
    log += ", allreduce " + std::to_string(ar) + ", stream " + cudaGetErrorString(se) + ", async " +
           std::to_string(async);
    if (ar != ncclSuccess || async != ncclSuccess)
      log += std::string(": ") + ncclGetLastError(half);
    got[static_cast<size_t>(rank)] = download<int32_t>(buf, 64);
    ncclCommDestroy(half);
  });
  for (int rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank << ": " << said[static_cast<size_t>(rank)]);
    CHECK(sizes[static_cast<size_t>(rank)] == 2);
    CHECK(got[static_cast<size_t>(rank)] ==
          std::vector<int32_t>(64, rank % 2 == 0 ? 0 + 2 : 1 + 3));
  }
  unsetenv("MKERNEL_CTAS");
  mkernel::params::resetForTesting();
}

// The split-communicator stall (docs/RELIABILITY.md): while one rank of communicator A has posted
// an AllReduce (its kernel waits for its peer) and the peer's thread has not, the last member of
// communicator B is destroyed. A release that cudaFree's / cudaFreeHost's its memory waits for
// every kernel of the device, A's waiting one included, and meanwhile every CUDA call of every
// other thread waits behind it (mkernel-freeprobe), so A's second rank cannot even allocate its
// buffer, and A's kernel times out. Releases return their memory to the process's MemCache
// (collectives/runtime/mem_cache.h); MKERNEL_DEFER_FREES=0 frees at release instead, and this case
// then fails after MKERNEL_TIMEOUT_S.
TEST_CASE("emulate: destroying one communicator while another's collective is half posted") {
  setenv("MKERNEL_CTAS", "8", 1);  // two communicators of two ranks: 32 CTAs in all
  mkernel::params::resetForTesting();
  ncclUniqueId idA, idB;
  REQUIRE(ncclGetUniqueId(&idA) == ncclSuccess);
  REQUIRE(ncclGetUniqueId(&idB) == ncclSuccess);
  ncclComm_t a[2] = {}, b[2] = {};
  ncclResult_t initRes[4] = {ncclInternalError, ncclInternalError, ncclInternalError,
                             ncclInternalError};
  {
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&, t] {
        cudaSetDevice(0);
        initRes[t] =
            t < 2 ? ncclCommInitRank(&a[t], 2, idA, t) : ncclCommInitRank(&b[t - 2], 2, idB, t - 2);
      });
    for (auto& th : ts) th.join();
  }
  unsetenv("MKERNEL_CTAS");
  mkernel::params::resetForTesting();
  for (int t = 0; t < 4; ++t) {
    INFO("init " << t << ": " << ncclGetLastError(nullptr));
    REQUIRE(initRes[t] == ncclSuccess);
  }
  std::atomic<bool> aPosting{false}, bDestroying{false};
  std::vector<std::vector<int32_t>> got(2);
  std::vector<std::string> said(2);
  ncclResult_t destroyB[2] = {ncclInternalError, ncclInternalError};
  DeferredFrees frees;
  auto waitFor = [](const std::atomic<bool>& f) {
    while (!f.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {  // A's ranks
      cudaSetDevice(0);
      tDeferredFrees = &frees;
      cudaStream_t s = nullptr;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      if (r == 1) {
        // Only once B's release has had time to reach its frees: every CUDA call from here on
        // (the allocation, the copy, the collective's launch) would wait behind such a free.
        waitFor(bDestroying);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
      }
      DevBuf buf(64 * sizeof(int32_t));
      upload(buf, std::vector<int32_t>(64, r + 1));
      if (r == 0) aPosting = true;
      const ncclResult_t ar = ncclAllReduce(buf.p, buf.p, 64, ncclInt32, ncclSum, a[r], s);
      const cudaError_t se = cudaStreamSynchronize(s);
      said[static_cast<size_t>(r)] =
          "allreduce " + std::to_string(ar) + ", stream " + cudaGetErrorString(se) +
          (ar != ncclSuccess ? std::string(": ") + ncclGetLastError(a[r]) : "");
      got[static_cast<size_t>(r)] = download<int32_t>(buf, 64);
      cudaStreamDestroy(s);
      tDeferredFrees = nullptr;
    });
  ts.emplace_back([&] {  // B's rank 0: destroyed first, its release waits for rank 1's
    cudaSetDevice(0);
    destroyB[0] = ncclCommDestroy(b[0]);
  });
  ts.emplace_back([&] {  // B's rank 1: the last member, destroyed while A's rank 0 waits
    cudaSetDevice(0);
    waitFor(aPosting);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // A's rank 0 has posted
    bDestroying = true;
    destroyB[1] = ncclCommDestroy(b[1]);
  });
  for (auto& th : ts) th.join();
  frees.freeAll();
  for (int r = 0; r < 2; ++r) {
    INFO("A's rank " << r << ": " << said[static_cast<size_t>(r)]);
    CHECK(got[static_cast<size_t>(r)] == std::vector<int32_t>(64, 1 + 2));
    CHECK(destroyB[r] == ncclSuccess);
  }
  for (int r = 0; r < 2; ++r) CHECK(ncclCommDestroy(a[r]) == ncclSuccess);
}

// The same stall through the application's own memory: nccl-tests -R and PyTorch's NCCL memory
// pool allocate with ncclMemAlloc, and a thread rank's ncclMemFree while a peer's collective is
// half posted would wait, as a cudaFree, for that collective's kernel, holding back the peer's
// allocation and post behind it. The shim maps ncclMemAlloc's memory with cuMem, as NCCL
// does, and its ncclMemFree (cuMemUnmap / cuMemRelease) waits for nothing. The rank buffers are
// ncclMemAlloc's too (the kernel reads and writes such mappings directly). With `plainFree` the
// freeing thread calls cudaFree on a cudaMalloc'd block instead: the hidden control case below,
// which must fail (run it by name with MKERNEL_TIMEOUT_S=5).
static void freeWhileHalfPosted(bool plainFree) {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t c[2] = {};
  ncclResult_t initRes[2] = {ncclInternalError, ncclInternalError};
  {
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        cudaSetDevice(0);
        initRes[r] = ncclCommInitRank(&c[r], 2, id, r);
      });
    for (auto& th : ts) th.join();
  }
  for (int r = 0; r < 2; ++r) {
    INFO("init " << r << ": " << ncclGetLastError(nullptr));
    REQUIRE(initRes[r] == ncclSuccess);
  }
  void* victim = nullptr;  // the block the third thread frees
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  if (plainFree)
    REQUIRE(cudaMalloc(&victim, 1 << 20) == cudaSuccess);
  else
    REQUIRE(ncclMemAlloc(&victim, 1 << 20) == ncclSuccess);
  std::atomic<bool> posted{false}, freeing{false};
  std::vector<std::vector<int32_t>> got(2);
  std::vector<std::string> said(2);
  ncclResult_t freed = ncclInternalError;
  ncclResult_t ownFreed[2] = {ncclInternalError, ncclInternalError};
  const size_t n = 64;
  auto waitFor = [](const std::atomic<bool>& f) {
    while (!f.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      cudaSetDevice(0);
      cudaStream_t s = nullptr;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      if (r == 1) {
        waitFor(freeing);  // every CUDA call from here on would wait behind a blocking free
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
      }
      void* buf = nullptr;
      if (ncclMemAlloc(&buf, n * sizeof(int32_t)) != ncclSuccess) {
        said[static_cast<size_t>(r)] = std::string("ncclMemAlloc: ") + ncclGetLastError(nullptr);
        posted = true;
        return;
      }
      const std::vector<int32_t> mine(n, r + 1);
      cudaMemcpy(buf, mine.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice);
      if (r == 0) posted = true;
      const ncclResult_t ar = ncclAllReduce(buf, buf, n, ncclInt32, ncclSum, c[r], s);
      const cudaError_t se = cudaStreamSynchronize(s);
      said[static_cast<size_t>(r)] =
          "allreduce " + std::to_string(ar) + ", stream " + cudaGetErrorString(se) +
          (ar != ncclSuccess ? std::string(": ") + ncclGetLastError(c[r]) : "");
      got[static_cast<size_t>(r)].resize(n);
      cudaMemcpy(got[static_cast<size_t>(r)].data(), buf, n * sizeof(int32_t),
                 cudaMemcpyDeviceToHost);
      cudaStreamDestroy(s);
      // Its collective is done, while the persistent kernel may still be resident: a free that
      // waited for it would wait out the idle timeout. (Checked on the main thread: Catch2's
      // assertions are not thread-safe.)
      ownFreed[static_cast<size_t>(r)] = ncclMemFree(buf);
    });
  ts.emplace_back([&] {
    cudaSetDevice(0);
    waitFor(posted);
    std::this_thread::sleep_for(
        std::chrono::milliseconds(300));  // rank 0's kernel waits for rank 1
    freeing = true;
    freed = plainFree ? (cudaFree(victim) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError)
                      : ncclMemFree(victim);
  });
  for (auto& th : ts) th.join();
  CHECK(freed == ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << said[static_cast<size_t>(r)]);
    CHECK(got[static_cast<size_t>(r)] == std::vector<int32_t>(n, 1 + 2));
    CHECK(ownFreed[r] == ncclSuccess);
  }
  for (int r = 0; r < 2; ++r) CHECK(ncclCommDestroy(c[r]) == ncclSuccess);
}

TEST_CASE("emulate: ncclMemFree while another rank's collective is half posted") {
  freeWhileHalfPosted(false);
}

TEST_CASE("emulate: control: cudaFree while another rank's collective is half posted (must fail)",
          "[.][freecontrol]") {
  freeWhileHalfPosted(true);
}

TEST_CASE("emulate: premul-sum across ranks") {
  std::vector<std::vector<float>> got(2);
  runRanks(2, [&](int rank, ncclComm_t comm, cudaStream_t s) {
    float scalar = 0.5f;
    ncclRedOp_t op;
    if (ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm) !=
        ncclSuccess)
      return;
    DevBuf buf(128 * sizeof(float));
    upload(buf, std::vector<float>(128, static_cast<float>(rank + 1)));
    ncclAllReduce(buf.p, buf.p, 128, ncclFloat, op, comm, s);
    cudaStreamSynchronize(s);
    got[static_cast<size_t>(rank)] = download<float>(buf, 128);
    ncclRedOpDestroy(op, comm);
  });
  for (int rank = 0; rank < 2; ++rank)
    CHECK(got[static_cast<size_t>(rank)] == std::vector<float>(128, 1.5f));
}

// One thread drives four ranks sharing the GPU and queues three collectives per rank in one group,
// rank by rank. Each rank must post its start of a collective, and may queue what waits for its
// end only once every co-located rank has posted its start (collectives/runtime/post_fence.h): the
// shim posts the group in lockstep, collective by collective across the ranks. Posted rank by rank
// instead, rank 0's fence would wait for ranks that only this thread can post later. ctest also
// runs this with one hardware queue for every stream (test_shim_emulate_hol), where any command
// waiting for a collective ahead of a peer's start holds that start back.
TEST_CASE("emulate: one thread, four ranks, three collectives each in one group, rank by rank",
          "[hol]") {
  ncclComm_t comms[4] = {};
  int devs[4] = {0, 0, 0, 0};
  // The 4 MiB AllReduces must take the doorbell: no small persistent kernels for direct mode.
  setenv("MKERNEL_SHARED_CTAS", "0", 1);
  mkernel::params::resetForTesting();
  REQUIRE(ncclCommInitAll(comms, 4, devs) == ncclSuccess);
  unsetenv("MKERNEL_SHARED_CTAS");
  mkernel::params::resetForTesting();
  const size_t small = 1000, large = size_t(1) << 20;  // 4 KiB (launch path), 4 MiB (the doorbell)
  std::vector<std::unique_ptr<DevBuf>> a, b, c;
  cudaStream_t streams[4];
  for (int r = 0; r < 4; ++r) {
    a.emplace_back(new DevBuf(small * sizeof(int32_t)));
    b.emplace_back(new DevBuf(small * sizeof(int32_t)));
    c.emplace_back(new DevBuf(large * sizeof(int32_t)));
    upload(*a.back(), std::vector<int32_t>(small, r + 1));
    upload(*b.back(), std::vector<int32_t>(small, r == 2 ? 77 : -1));
    upload(*c.back(), std::vector<int32_t>(large, 10 * (r + 1)));
    REQUIRE(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking) == cudaSuccess);
  }
  mkernelStats_t before{};
  before.size = sizeof(before);
  REQUIRE(mkernelGetStats(&before) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < 4; ++r) {
    CHECK(ncclAllReduce(a[r]->p, a[r]->p, small, ncclInt32, ncclSum, comms[r], streams[r]) ==
          ncclSuccess);
    CHECK(ncclBroadcast(b[r]->p, b[r]->p, small, ncclInt32, 2, comms[r], streams[r]) ==
          ncclSuccess);
    CHECK(ncclAllReduce(c[r]->p, c[r]->p, large, ncclInt32, ncclSum, comms[r], streams[r]) ==
          ncclSuccess);
  }
  const ncclResult_t end = ncclGroupEnd();
  INFO(ncclGetLastError(comms[0]));
  REQUIRE(end == ncclSuccess);
  for (int r = 0; r < 4; ++r) REQUIRE(cudaStreamSynchronize(streams[r]) == cudaSuccess);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("posted and completed in " << seconds << " s");
  CHECK(seconds < 10.0);  // MKERNEL_TIMEOUT_S is 60 here: no rank waited for a timeout
  for (int r = 0; r < 4; ++r) {
    CHECK(download<int32_t>(*a[r], small) == std::vector<int32_t>(small, 10));
    CHECK(download<int32_t>(*b[r], small) == std::vector<int32_t>(small, 77));
    CHECK(download<int32_t>(*c[r], large) == std::vector<int32_t>(large, 100));
    cudaStreamDestroy(streams[r]);
  }
  mkernelStats_t after{};
  after.size = sizeof(after);
  REQUIRE(mkernelGetStats(&after) == 0);
  uint64_t ran = 0;
  for (int k = 0; k < 5; ++k) ran += after.kernelOps[k] - before.kernelOps[k];
  CHECK(ran == 12);                                     // every collective on mkernel's kernels
  CHECK(after.kernelLaunches > before.kernelLaunches);  // the 4 MiB AllReduces took the doorbell
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < 4; ++r) CHECK(ncclCommDestroy(comms[r]) == ncclSuccess);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
}
