// GPU tier, process ranks (docs/KERNEL.md, "Process ranks"): N processes forked before any CUDA
// call, one communicator across them (staged collectives through CUDA IPC).
//
//   test_gpu_procs [--ranks N] [--hosts H] [--kill | --kill-mid | --kill-graph | --mixed-capture |
//                   --mismatch NAME=VALUE]
//
// Ranks sit on GPU (rank % GPUs). With fewer GPUs than ranks they are emulated (MKERNEL_EMULATE)
// and the test starts its own CUDA MPS daemon (a private pipe directory), without which kernels
// of two processes cannot run on one GPU at the same time.
//   default  every collective, in and out of place, counts from 1 element to 32 MiB (many
//            staging chunks per CTA), int32 sums (exact: any reduction order gives the same bits)
//            and a float32 AllReduce (two-shot from 3 ranks on), compared with the definition.
//   --kill   after a few collectives the last rank dies (SIGKILL, no finalize); the survivors
//            post another AllReduce and must see RemoteError from asyncError() within
//            MKERNEL_TIMEOUT_S (5 s here) plus a margin (or, sharing the dead rank's GPU under
//            MPS, UnhandledCudaError: the context is lost), their streams must drain, and abort
//            plus destruction must return.
//   --kill-mid  the same, but the last rank dies in the middle of a collective's data movement:
//            it is created with the test hook MKERNEL_TEST_STALL_BARRIER=3, so every CTA of its
//            kernel stops at the third barrier of a 32 MiB AllReduce (64 KiB staging chunks: 32
//            per CTA; two have gone into the peers' inboxes), and it kills itself once its kernel
//            says so. The survivors,
//            inside the same AllReduce, must fail at their next chunk barrier ("to stage its next
//            chunk") naming the dead rank, within the same bounds. The test fails if the hook
//            never fired.
//   --kill-graph  the ranks capture a 16 KiB AllReduce into a CUDA graph (the launch path's graph
//            namespace) and replay it once, checked; then the last rank dies and the survivors
//            replay it again: RemoteError naming the dead rank ("to publish its inputs (launch
//            path)") within the same bounds, the stream released, abort and destroy bounded.
//   MKERNEL_ALGO=ring (test_gpu_procs_ring): the same cases as rings through the staging
//            buffers (collectives/algo/staged_ring.h); the statistics must count as rings exactly
//            those MKERNEL_RING_MIN_BYTES (auto: what the LL mode does not take) sends there.
//   --release-half-posted  (2 ranks) the release of a process-rank communicator while another
//            communicator's collective is half posted (docs/RELIABILITY.md): rank 0's
//            process also holds a communicator Y of two thread ranks; Y's rank 0 posts a small
//            AllReduce (its kernel waits for Y's rank 1), then the main thread finalizes and
//            destroys the process-rank communicator, and only 300 ms later does Y's rank 1
//            upload and post its part. Y's AllReduce must be right and the release bounded. The
//            release unmaps the peer's memory: with cuMem (MKERNEL_PEER_IPC=cumem, the default)
//            that waits for nothing; with legacy CUDA IPC, cudaIpcCloseMemHandle waits for Y's
//            kernel and holds back Y's rank 1's calls until Y times out (MKERNEL_TIMEOUT_S=5
//            here): that control run (MKERNEL_PEER_IPC=legacy) must fail.
//   --mixed-capture  one route on every rank (docs/SHIM.md): every collective at three size
//            classes (LL: 2 elements; inbox: 16 Ki elements; beyond the launch path: 1 Mi + 5, the
//            persistent kernel's staged path), ranks 0..N-2 capturing it into a CUDA graph and
//            replaying it twice, the last rank running it eagerly twice; each result checked.
//   --mismatch NAME=VALUE  the last rank sets NAME=VALUE (a ROUTE setting): every rank's
//            communicator creation must fail with InvalidUsage naming NAME and each rank's value.
//   --hosts H   the ranks act as H hosts (MKERNEL_HOSTID = host<rank / (N/H)>): the communicator
//            then runs every collective hierarchically, one node per host, the rail rounds
//            through a proxy per rank over TCP on loopback (the multi-host path, without a second
//            machine); the same cases and checks. Needs a GPU per rank.
// Exit status 0 when every rank passed. No Catch2: the children are plain processes.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/route/launch_path.h"
#include "collectives/algo/staged_ring.h"
#include "common/result.h"
#include "tools/proc_ranks.h"
#include "transport/bootstrap/bootstrap.h"
#include "common/param.h"

using mkernel::Result;
using mkernel::coll::CollArgs;
using mkernel::coll::CollType;
using mkernel::coll::DataType;
using mkernel::coll::RedOp;

namespace {

int gRank = -1;
#define FAIL(...)                                   \
  do {                                              \
    std::fprintf(stderr, "rank %d: FAIL: ", gRank); \
    std::fprintf(stderr, __VA_ARGS__);              \
    std::fprintf(stderr, "\n");                     \
    return 1;                                       \
  } while (0)

int32_t input(int rank, size_t i) {
  return static_cast<int32_t>((i * 2654435761u) ^ (static_cast<uint32_t>(rank) * 40503u + 7u));
}

struct Case {
  CollType coll;
  size_t count;
  bool inPlace;
  int root;
};

size_t sendCount(const Case& c, int n) {
  return c.coll == CollType::ReduceScatter ? c.count * n : c.count;
}
size_t recvCount(const Case& c, int n) {
  return c.coll == CollType::AllGather ? c.count * n : c.count;
}

int32_t expected(const Case& c, int n, int rank, size_t e) {
  uint32_t acc = 0;
  switch (c.coll) {
    case CollType::AllReduce:
    case CollType::Reduce:
      for (int k = 0; k < n; ++k) acc += static_cast<uint32_t>(input(k, e));
      return static_cast<int32_t>(acc);
    case CollType::ReduceScatter:
      for (int k = 0; k < n; ++k)
        acc += static_cast<uint32_t>(input(k, static_cast<size_t>(rank) * c.count + e));
      return static_cast<int32_t>(acc);
    case CollType::AllGather:
      return input(static_cast<int>(e / c.count), e % c.count);
    case CollType::Broadcast:
      return input(c.root, e);
  }
  return 0;
}

enum class Kill { kNone, kBetween, kMid, kGraph };

// Inputs and poison go on the collective's stream. A cudaMemset is asynchronous and a cudaMemcpy
// from pageable memory returns before its DMA has landed, both on the legacy stream, which the
// non-blocking `stream` does not wait for: the collective could read the previous case's input
// and the poison land on its result (test_gpu_procs_4 failed 2 runs of 5 so, an AllGather element
// -1, all four ranks alike; tests/plugin/shim/shim_gpu_util.h).
bool toDevice(void* dev, const void* host, size_t bytes, cudaStream_t stream) {
  return cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream) == cudaSuccess;
}

CollArgs allReduceArgs(DataType dtype, void* send, void* recv, size_t count) {
  CollArgs a;  // AllReduce, Sum: the defaults
  a.dtype = dtype;
  a.sendbuff = send;
  a.recvbuff = recv;
  a.count = count;
  return a;
}

// --mixed-capture (see the top of this file): ranks below n - 1 capture each case and replay it
// twice, the last rank runs it eagerly twice.
int mixedCapture(int rank, int n, std::unique_ptr<mkernel::coll::Communicator>& comm,
                 cudaStream_t stream, int32_t* send, int32_t* recv, std::vector<int32_t>& host,
                 std::vector<int32_t>& got) {
  const bool capture = rank < n - 1;
  const CollType colls[] = {CollType::AllReduce, CollType::ReduceScatter, CollType::AllGather,
                            CollType::Broadcast, CollType::Reduce};
  int seq = 0, ran = 0;
  for (size_t count : {size_t(2), size_t(16) << 10, (size_t(1) << 20) + 5})
    for (CollType coll : colls) {
      const Case c{coll, count, false, (seq++) % n};
      const size_t sc = sendCount(c, n), rc = recvCount(c, n);
      for (size_t i = 0; i < sc; ++i) host[i] = input(rank, i);
      if (!toDevice(send, host.data(), sc * 4, stream)) FAIL("copy in");
      CollArgs a;
      a.coll = coll;
      a.dtype = DataType::Int32;
      a.sendbuff = send;
      a.recvbuff = recv;
      a.count = count;
      a.root = c.root;
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      if (capture) {
        if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
          FAIL("begin capture");
        const Result er = comm->enqueue(&a, 1, stream);
        if (cudaStreamEndCapture(stream, &graph) != cudaSuccess || er != Result::Success)
          FAIL("capture of %s count %zu: %s", mkernel::coll::collName(coll), count,
               mkernel::lastError());
        if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) FAIL("instantiate");
      }
      for (int rep = 0; rep < 2; ++rep) {
        if (cudaMemsetAsync(recv, 0xff, rc * 4, stream) != cudaSuccess) FAIL("memset");
        const bool posted = capture ? cudaGraphLaunch(exec, stream) == cudaSuccess
                                    : comm->enqueue(&a, 1, stream) == Result::Success;
        if (!posted || cudaStreamSynchronize(stream) != cudaSuccess ||
            comm->asyncError() != Result::Success)
          FAIL("%s %s count %zu, run %d: %s", capture ? "replay of" : "eager",
               mkernel::coll::collName(coll), count, rep, mkernel::lastError());
        if (cudaMemcpy(got.data(), recv, rc * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
          FAIL("copy out");
        if (coll == CollType::Reduce && rank != c.root) continue;
        for (size_t e = 0; e < rc; ++e)
          if (got[e] != expected(c, n, rank, e))
            FAIL("%s %s count %zu, run %d: element %zu is %d, want %d",
                 capture ? "replay of" : "eager", mkernel::coll::collName(coll), count, rep, e,
                 got[e], expected(c, n, rank, e));
      }
      ran += 2;
      if (capture) {
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      }
    }
  if (comm->finalize() != Result::Success) FAIL("finalize: %s", mkernel::lastError());
  comm.reset();
  std::fprintf(stderr, "rank %d: %d collectives %s, beside %s ranks, passed\n", rank, ran,
               capture ? "replayed from graphs" : "run eagerly",
               capture ? "an eager" : "capturing");
  return 0;
}

// The survivors of a killed rank: wait for the communicator's error (the collective in flight
// was enqueued by the caller), then drain, abort and destroy, each bounded.
int survive(int rank, int n, int nGpus, int dev, std::unique_ptr<mkernel::coll::Communicator>& comm,
            cudaStream_t stream, const char* wantWait) {
  const auto t0 = std::chrono::steady_clock::now();
  Result err = Result::Success;
  double waited = 0;
  for (;;) {
    err = comm->asyncError();
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (err != Result::Success || waited > 30) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // A survivor on another GPU than the dead rank times out waiting for it: RemoteError. One on
  // the same GPU under MPS was seen (two H200s) to take an illegal-address fault
  // when the dead client's memory went away: its CUDA context is lost (UnhandledCudaError,
  // within a second). Either way: an error, in bounded time, never a hang.
  const bool sameGpuAsDead = (n - 1) % nGpus == dev;
  const bool acceptable =
      err == Result::RemoteError || (sameGpuAsDead && err == Result::UnhandledCudaError);
  if (!acceptable)
    FAIL("after %.1f s asyncError() is %d, want RemoteError%s", waited, static_cast<int>(err),
         sameGpuAsDead ? " or UnhandledCudaError" : "");
  const std::string msg = mkernel::lastError();
  std::fprintf(stderr, "rank %d: %s after %.1f s: %s\n", rank,
               err == Result::RemoteError ? "RemoteError" : "UnhandledCudaError", waited,
               msg.c_str());
  if (err == Result::RemoteError) {
    const std::string dead = "rank " + std::to_string(n - 1);
    if (msg.find(dead) == std::string::npos) FAIL("the error does not name %s", dead.c_str());
    if (wantWait != nullptr && msg.find(wantWait) == std::string::npos)
      FAIL("the error does not say \"%s\"", wantWait);
    if (cudaStreamSynchronize(stream) != cudaSuccess) FAIL("the stream did not drain");
  }
  const auto t1 = std::chrono::steady_clock::now();
  comm->abort();
  comm.reset();
  const double teardown =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  std::fprintf(stderr, "rank %d: abort + destroy took %.2f s\n", rank, teardown);
  if (teardown > 10) FAIL("abort + destroy took %.1f s", teardown);
  return 0;
}

// --release-half-posted, rank 0's side (see the top of this file). `comm` is the process-rank
// communicator, already checked by one AllReduce.
int releaseHalfPosted(int rank, int dev, std::unique_ptr<mkernel::coll::Communicator>& comm) {
  mkernel::bootstrap::UniqueId idY;
  if (mkernel::bootstrap::createUniqueId(&idY) != Result::Success)
    FAIL("createUniqueId: %s", mkernel::lastError());
  std::unique_ptr<mkernel::bootstrap::Bootstrap> ybs[2];
  std::unique_ptr<mkernel::coll::Communicator> y[2];
  Result yres[2] = {Result::InternalError, Result::InternalError};
  std::string yerr[2];
  const size_t count = 64;
  int32_t* ybuf[2] = {nullptr, nullptr};
  {
    std::vector<std::thread> ts;
    for (int t = 0; t < 2; ++t)
      ts.emplace_back([&, t] {
        cudaSetDevice(dev);
        yres[t] = mkernel::bootstrap::Bootstrap::create(idY, t, 2, &ybs[t]);
        if (yres[t] == Result::Success) {
          mkernel::coll::CommOptions opts;
          opts.rank = t;
          opts.nRanks = 2;
          opts.cudaDev = dev;
          opts.emulate = true;
          yres[t] = mkernel::coll::Communicator::create(opts, ybs[t].get(), &y[t]);
        }
        if (yres[t] == Result::Success &&
            cudaMalloc(reinterpret_cast<void**>(&ybuf[t]), count * 4) != cudaSuccess)
          yres[t] = Result::UnhandledCudaError;
        if (yres[t] != Result::Success) yerr[t] = mkernel::lastError();
      });
    for (auto& th : ts) th.join();
  }
  for (int t = 0; t < 2; ++t)
    if (yres[t] != Result::Success) FAIL("communicator Y, rank %d: %s", t, yerr[t].c_str());
  std::atomic<bool> posted{false}, releasing{false};
  std::string said[2];
  std::vector<int32_t> got[2];
  double postToDone[2] = {0, 0};
  auto waitFlag = [](const std::atomic<bool>& f) {
    while (!f.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < 2; ++t)
    ts.emplace_back([&, t] {
      cudaSetDevice(dev);
      cudaStream_t s = nullptr;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      if (t == 1) {
        // Only once the release has had time to reach its unmapping: every CUDA call from here on
        // (the copy, the collective's launch) would wait behind a cudaIpcCloseMemHandle.
        waitFlag(releasing);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
      }
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<int32_t> mine(count, t + 1);
      const bool copied = cudaMemcpyAsync(ybuf[t], mine.data(), count * 4, cudaMemcpyHostToDevice,
                                          s) == cudaSuccess &&
                          cudaStreamSynchronize(s) == cudaSuccess;
      const CollArgs a = allReduceArgs(DataType::Int32, ybuf[t], ybuf[t], count);
      // Before the enqueue: with thread ranks sharing a GPU it returns only once the other rank
      // has posted its start (MKERNEL_POST_FENCE), while this rank's part is already queued.
      if (t == 0) posted = true;
      const Result er = copied ? y[t]->enqueue(&a, 1, s) : Result::UnhandledCudaError;
      const cudaError_t se = cudaStreamSynchronize(s);
      postToDone[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const Result ae = y[t]->asyncError();
      said[t] =
          "enqueue " + std::to_string(static_cast<int>(er)) + ", stream " + cudaGetErrorString(se) +
          ", asyncError " + std::to_string(static_cast<int>(ae)) +
          (er != Result::Success || ae != Result::Success ? std::string(": ") + mkernel::lastError()
                                                          : "");
      got[t].resize(count);
      cudaMemcpy(got[t].data(), ybuf[t], count * 4, cudaMemcpyDeviceToHost);
      cudaStreamDestroy(s);
    });
  waitFlag(posted);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // Y's rank 0 waits for its rank 1
  releasing = true;
  const auto r0 = std::chrono::steady_clock::now();
  const Result fr = comm->finalize();
  const std::string ferr = fr != Result::Success ? mkernel::lastError() : "";
  comm.reset();
  const double releaseS =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
  for (auto& th : ts) th.join();
  std::fprintf(stderr,
               "rank %d: release of the process-rank communicator %.3f s; Y's rank 0 post to done "
               "%.3f s, rank 1 "
               "(posted 300 ms into the release) %.3f s\n",
               rank, releaseS, postToDone[0], postToDone[1]);
  int bad = 0;
  for (int t = 0; t < 2; ++t) {
    size_t wrong = 0;
    for (int32_t v : got[t]) wrong += v != 3;
    if (wrong != 0) {
      std::fprintf(stderr, "rank %d: FAIL: Y's rank %d: %zu of %zu elements wrong (%s)\n", rank, t,
                   wrong, count, said[t].c_str());
      ++bad;
    }
  }
  if (fr != Result::Success) FAIL("finalize of the process-rank communicator: %s", ferr.c_str());
  if (bad != 0) return 1;
  if (releaseS > 3.0) FAIL("the release took %.1f s", releaseS);
  {
    std::vector<std::thread> fin;
    for (int t = 0; t < 2; ++t)
      fin.emplace_back([&, t] {
        cudaSetDevice(dev);
        yres[t] = y[t]->finalize();
        y[t].reset();
      });
    for (auto& th : fin) th.join();
  }
  for (int t = 0; t < 2; ++t)
    if (yres[t] != Result::Success) FAIL("finalize of Y's rank %d", t);
  for (int32_t* p : ybuf) cudaFree(p);
  std::fprintf(stderr, "rank %d: Y's AllReduce right, both communicators released\n", rank);
  return 0;
}

int child(int rank, int n, int nGpus, int hosts, const mkernel::bootstrap::UniqueId& id,
          Kill killMode, bool halfPosted, bool mixed, const std::string& mismatch) {
  gRank = rank;
  if (hosts > 1) setenv("MKERNEL_HOSTID", ("host" + std::to_string(rank / (n / hosts))).c_str(), 1);
  if (!mismatch.empty() && rank == n - 1)
    setenv(mismatch.substr(0, mismatch.find('=')).c_str(),
           mismatch.substr(mismatch.find('=') + 1).c_str(), 1);
  mkernel::params::resetForTesting();
  const bool kill = killMode == Kill::kBetween;
  // Set before the communicator reads its parameters: only the rank that will die stops.
  if (killMode == Kill::kMid && rank == n - 1) setenv("MKERNEL_TEST_STALL_BARRIER", "3", 1);
  mkernel::params::resetForTesting();
  const int dev = rank % nGpus;
  std::unique_ptr<mkernel::bootstrap::Bootstrap> bs;
  std::unique_ptr<mkernel::coll::Communicator> comm;
  const char* step = "";
  const Result made = mktools::createProcessRank(rank, n, nGpus, id, &bs, &comm, &step);
  if (!mismatch.empty()) {
    // Every rank fails alike, naming the setting.
    const std::string msg = made == Result::Success ? "" : mkernel::lastError();
    const std::string name = mismatch.substr(0, mismatch.find('='));
    if (made != Result::InvalidUsage)
      FAIL("%s with %s on rank %d: creation gave %d, want InvalidUsage (%s)", step,
           mismatch.c_str(), n - 1, static_cast<int>(made), msg.c_str());
    if (msg.find(name + ":") == std::string::npos ||
        msg.find("on rank " + std::to_string(n - 1)) == std::string::npos)
      FAIL("the error does not name %s and rank %d: %s", name.c_str(), n - 1, msg.c_str());
    std::fprintf(stderr, "rank %d: creation refused: %s\n", rank, msg.c_str());
    return 0;
  }
  if (made != Result::Success) FAIL("%s (GPU %d): %s", step, dev, mkernel::lastError());
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

  std::vector<Case> cases;
  const CollType colls[] = {CollType::AllReduce, CollType::ReduceScatter, CollType::AllGather,
                            CollType::Broadcast, CollType::Reduce};
  int seq = 0;
  for (CollType c : colls)
    for (size_t count : {size_t(1), size_t(4099), size_t(1 << 20) + 5, (size_t(8) << 20) + 3})
      for (bool inPlace : {false, true}) cases.push_back(Case{c, count, inPlace, (seq++) % n});
  if (kill) cases.resize(6);
  if (killMode == Kill::kMid || killMode == Kill::kGraph) cases.clear();
  // Every buffer before the first collective: allocations while persistent kernels run can wait
  // for them (docs/KERNEL.md).
  const size_t maxElems = (size_t(8) << 20) * static_cast<size_t>(n) + 64;
  int32_t *send = nullptr, *recv = nullptr;
  float* fbuf = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&send), maxElems * 4) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&recv), maxElems * 4) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&fbuf), (size_t(1) << 22) * 4) != cudaSuccess)
    FAIL("cudaMalloc");
  std::vector<int32_t> host(maxElems), got(maxElems);

  if (mixed) return mixedCapture(rank, n, comm, stream, send, recv, host, got);

  if (halfPosted) {
    // One AllReduce on the process-rank communicator: its peer memory is mapped and used.
    const size_t count = size_t(1) << 16;
    for (size_t i = 0; i < count; ++i) host[i] = input(rank, i);
    if (!toDevice(send, host.data(), count * 4, stream)) FAIL("copy in");
    const CollArgs a = allReduceArgs(DataType::Int32, send, recv, count);
    if (comm->enqueue(&a, 1, stream) != Result::Success ||
        cudaStreamSynchronize(stream) != cudaSuccess || comm->asyncError() != Result::Success)
      FAIL("AllReduce: %s", mkernel::lastError());
    if (cudaMemcpy(got.data(), recv, count * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
      FAIL("copy out");
    const Case k{CollType::AllReduce, count, false, 0};
    for (size_t e = 0; e < count; ++e)
      if (got[e] != expected(k, n, rank, e))
        FAIL("AllReduce: element %zu is %d, want %d", e, got[e], expected(k, n, rank, e));
    if (rank == 0) return releaseHalfPosted(rank, dev, comm);
    // Rank 1 releases at once; its finalize waits in the bootstrap barrier for rank 0's.
    if (comm->finalize() != Result::Success) FAIL("finalize: %s", mkernel::lastError());
    comm.reset();
    return 0;
  }

  if (killMode == Kill::kGraph) {
    const size_t count = size_t(1) << 12;  // 16 KiB: the launch path's inbox, captured
    for (size_t i = 0; i < count; ++i) host[i] = input(rank, i);
    if (!toDevice(send, host.data(), count * 4, stream)) FAIL("copy in");
    const CollArgs a = allReduceArgs(DataType::Int32, send, recv, count);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
      FAIL("begin capture");
    const Result er = comm->enqueue(&a, 1, stream);
    if (cudaStreamEndCapture(stream, &graph) != cudaSuccess || er != Result::Success)
      FAIL("capture: %s", mkernel::lastError());
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) FAIL("instantiate");
    if (cudaGraphLaunch(exec, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess || comm->asyncError() != Result::Success)
      FAIL("first replay: %s", mkernel::lastError());
    if (cudaMemcpy(got.data(), recv, count * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
      FAIL("copy out");
    const Case k{CollType::AllReduce, count, false, 0};
    for (size_t e = 0; e < count; ++e)
      if (got[e] != expected(k, n, rank, e))
        FAIL("first replay: element %zu is %d, want %d", e, got[e], expected(k, n, rank, e));
    mkernel::coll::CollStats st;
    comm->stats(&st);
    if (st.kernelLaunches != 0)
      FAIL("the captured AllReduce launched the persistent kernel (%llu times)",
           static_cast<unsigned long long>(st.kernelLaunches));
    if (rank == n - 1) {
      std::fprintf(stderr, "rank %d: replayed the graph once; dying now (SIGKILL)\n", rank);
      raise(SIGKILL);
    }
    if (cudaGraphLaunch(exec, stream) != cudaSuccess) FAIL("second replay");
    const int rc =
        survive(rank, n, nGpus, dev, comm, stream, "to publish its inputs (launch path)");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return rc;
  }

  if (killMode == Kill::kMid) {
    // 32 MiB per rank: far above the launch path's limit, so the persistent kernel's staged
    // algorithm runs it, in many chunks per CTA.
    const size_t count = (size_t(8) << 20) + 3;
    for (size_t i = 0; i < count; ++i) host[i] = input(rank, i);
    if (!toDevice(send, host.data(), count * 4, stream)) FAIL("copy in");
    const CollArgs a = allReduceArgs(DataType::Int32, send, recv, count);
    if (comm->enqueue(&a, 1, stream) != Result::Success) FAIL("enqueue: %s", mkernel::lastError());
    if (rank == n - 1) {
      const auto t0 = std::chrono::steady_clock::now();
      while (!comm->testStalled()) {
        if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(30))
          FAIL(
              "MKERNEL_TEST_STALL_BARRIER=3: the kernel never reported the stop (asyncError %d: "
              "%s)",
              static_cast<int>(comm->asyncError()), mkernel::lastError());
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::fprintf(
          stderr,
          "rank %d: its kernel stopped at barrier 3 of a 32 MiB AllReduce: dying now (SIGKILL)\n",
          rank);
      raise(SIGKILL);
    }
    return survive(rank, n, nGpus, dev, comm, stream, "to stage its next chunk");
  }

  for (const Case& c : cases) {
    const size_t sc = sendCount(c, n), rc = recvCount(c, n);
    for (size_t i = 0; i < sc; ++i) host[i] = input(rank, i);
    int32_t* s = send;
    int32_t* r = recv;
    if (c.inPlace) {
      r = send;
      if (c.coll == CollType::AllGather) s = send + static_cast<size_t>(rank) * c.count;
      if (c.coll == CollType::ReduceScatter) r = send + static_cast<size_t>(rank) * c.count;
    }
    if (cudaMemsetAsync(recv, 0xff, maxElems * 4, stream) != cudaSuccess) FAIL("memset");
    if (c.inPlace && c.coll == CollType::AllGather) {
      if (cudaMemsetAsync(send, 0xff, maxElems * 4, stream) != cudaSuccess) FAIL("memset");
    }
    if (!toDevice(s, host.data(), sc * 4, stream)) FAIL("copy in");
    CollArgs a;
    a.coll = c.coll;
    a.dtype = DataType::Int32;
    a.op = RedOp::Sum;
    a.sendbuff = s;
    a.recvbuff = r;
    a.count = c.count;
    a.root = c.root;
    if (comm->enqueue(&a, 1, stream) != Result::Success)
      FAIL("enqueue %s: %s", mkernel::coll::collName(c.coll), mkernel::lastError());
    if (cudaStreamSynchronize(stream) != cudaSuccess) FAIL("stream sync");
    if (comm->asyncError() != Result::Success)
      FAIL("%s count %zu: %s", mkernel::coll::collName(c.coll), c.count, mkernel::lastError());
    if (cudaMemcpy(got.data(), r, rc * 4, cudaMemcpyDeviceToHost) != cudaSuccess) FAIL("copy out");
    if (c.coll == CollType::Reduce && rank != c.root) continue;
    for (size_t e = 0; e < rc; ++e) {
      const int32_t want = expected(c, n, rank, e);
      if (got[e] != want)
        FAIL("%s count %zu %s root %d: element %zu of %zu is %d, want %d",
             mkernel::coll::collName(c.coll), c.count, c.inPlace ? "in place" : "out of place",
             c.root, e, rc, got[e], want);
    }
  }

  if (kill) {
    if (rank == n - 1) {
      std::fprintf(stderr, "rank %d: dying now (SIGKILL)\n", rank);
      raise(SIGKILL);
    }
    // The survivors: one more AllReduce that the dead rank never joins.
    const CollArgs a = allReduceArgs(DataType::Int32, send, recv, 1 << 16);
    if (comm->enqueue(&a, 1, stream) != Result::Success)
      FAIL("enqueue after the kill: %s", mkernel::lastError());
    return survive(rank, n, nGpus, dev, comm, stream, nullptr);
  }

  // float32 AllReduce large enough for two-shot (from 3 ranks on), values exact in any order.
  {
    const size_t count = size_t(1) << 22;
    std::vector<float> hf(count), gf(count);
    for (size_t i = 0; i < count; ++i)
      hf[i] = static_cast<float>(static_cast<int>((i * 7 + rank * 13) % 17) - 8) * 0.5f;
    if (!toDevice(fbuf, hf.data(), count * 4, stream)) FAIL("copy in");
    const CollArgs a = allReduceArgs(DataType::Float32, fbuf, fbuf, count);
    if (comm->enqueue(&a, 1, stream) != Result::Success ||
        cudaStreamSynchronize(stream) != cudaSuccess || comm->asyncError() != Result::Success)
      FAIL("float AllReduce: %s", mkernel::lastError());
    if (cudaMemcpy(gf.data(), fbuf, count * 4, cudaMemcpyDeviceToHost) != cudaSuccess)
      FAIL("copy out");
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int k = 0; k < n; ++k)
        want += static_cast<float>(static_cast<int>((i * 7 + k * 13) % 17) - 8) * 0.5f;
      if (gf[i] != want) FAIL("float AllReduce element %zu: %g, want %g", i, gf[i], want);
    }
  }
  mkernel::coll::CollStats st;
  comm->stats(&st);
  uint64_t ran = 0;
  for (uint64_t v : st.kernelOps) ran += v;
  if (ran != cases.size() + 1)
    FAIL("the kernel counted %llu collectives, want %zu", static_cast<unsigned long long>(ran),
         cases.size() + 1);
  // MKERNEL_ALGO=ring (test_gpu_procs_ring): every collective a ring
  // (collectives/algo/staged_ring.h) but those MKERNEL_RING_MIN_BYTES leaves to the LL mode (auto:
  // what LL takes).
  if (mkernel::params::ALGO.is("ring")) {
    const int64_t ringMin = mkernel::params::RING_MIN_BYTES().value_or(-1);
    auto ringed = [&](CollType c, size_t count) {
      return mkernel::coll::ringTakes(
          ringMin,
          mkernel::coll::llTakes(mkernel::coll::llPayloadBytes(count, 4), st.llMaxBytes, n),
          mkernel::coll::directWholeBytes(c, count, n, 4));
    };
    uint64_t want = ringed(CollType::AllReduce, size_t(1) << 22) ? 1 : 0;  // the float AllReduce
    for (const Case& c : cases) want += ringed(c.coll, c.count) ? 1 : 0;
    if (st.ringOps != want || (ringMin < 0 && want == cases.size() + 1))
      FAIL("MKERNEL_ALGO=ring: %llu of %zu collectives were rings, want %llu (LL up to %llu bytes)",
           static_cast<unsigned long long>(st.ringOps), cases.size() + 1,
           static_cast<unsigned long long>(want), static_cast<unsigned long long>(st.llMaxBytes));
    std::fprintf(stderr,
                 "rank %d: MKERNEL_ALGO=ring: %llu of %zu collectives rings, the rest LL pushes\n",
                 rank, static_cast<unsigned long long>(st.ringOps), cases.size() + 1);
  }
  if (comm->finalize() != Result::Success) FAIL("finalize: %s", mkernel::lastError());
  comm.reset();
  std::fprintf(stderr, "rank %d: %zu collectives passed (GPU %d)\n", rank, cases.size() + 1, dev);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 2;
  Kill killMode = Kill::kNone;
  int hosts = 1;
  bool halfPosted = false, mixed = false;
  std::string mismatch;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--ranks") && i + 1 < argc)
      n = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--hosts") && i + 1 < argc)
      hosts = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--kill"))
      killMode = Kill::kBetween;
    else if (!std::strcmp(argv[i], "--kill-mid"))
      killMode = Kill::kMid;
    else if (!std::strcmp(argv[i], "--kill-graph"))
      killMode = Kill::kGraph;
    else if (!std::strcmp(argv[i], "--release-half-posted"))
      halfPosted = true;
    else if (!std::strcmp(argv[i], "--mixed-capture"))
      mixed = true;
    else if (!std::strcmp(argv[i], "--mismatch") && i + 1 < argc &&
             std::strchr(argv[i + 1], '=') != nullptr)
      mismatch = argv[++i];
    else {
      std::fprintf(stderr,
                   "usage: %s [--ranks N] [--hosts H] [--kill | --kill-mid | --kill-graph | "
                   "--release-half-posted | "
                   "--mixed-capture | --mismatch NAME=VALUE]\n",
                   argv[0]);
      return 2;
    }
  }
  if (halfPosted && (n != 2 || hosts != 1 || killMode != Kill::kNone)) {
    std::fprintf(stderr,
                 "test_gpu_procs: --release-half-posted takes 2 ranks on one host, no kill\n");
    return 2;
  }
  if (halfPosted) {
    // Four ranks' kernels on one GPU (two processes, and two thread ranks in the first), all
    // resident at once; a stalled Y must fail soon.
    setenv("MKERNEL_CTAS", "8", 1);
    setenv("MKERNEL_TIMEOUT_S", "5", 1);
    mkernel::params::resetForTesting();
  }
  if (hosts < 1 || n % hosts != 0) {
    std::fprintf(stderr, "test_gpu_procs: --hosts %d does not divide --ranks %d\n", hosts, n);
    return 2;
  }
  const int nGpus = mktools::gpuCountNoCuda();
  if (nGpus < 1) {
    std::fprintf(stderr, "test_gpu_procs: no GPU\n");
    return 1;
  }
  if (hosts > 1 && nGpus < n) {
    // A GPU shared across "hosts" would not be seen as shared (hosts never share GPUs), and the
    // ranks' kernels would not fit on it together. 77: ctest reports the test as skipped
    // (SKIP_RETURN_CODE, tests/gpu/CMakeLists.txt), not passed.
    std::fprintf(stderr,
                 "test_gpu_procs: --hosts needs a GPU per rank (%d ranks, %d GPU(s)): skipped\n", n,
                 nGpus);
    return 77;
  }
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 1);
  mkernel::params::resetForTesting();
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  const bool kill = killMode != Kill::kNone;
  if (kill) setenv("MKERNEL_TIMEOUT_S", "5", 1);
  mkernel::params::resetForTesting();
  // --kill-mid: 64 KiB inboxes, so that each CTA's 1 MiB of the 32 MiB AllReduce takes 32 chunks
  // (with the default 1 MiB, two: the third barrier would never come). Every rank must agree.
  if (killMode == Kill::kMid) setenv("MKERNEL_STAGED_CHUNK_BYTES", "65536", 1);
  mkernel::params::resetForTesting();
  mktools::PrivateMps mps;  // ranks sharing a GPU
  if (nGpus < n && !mps.start("test_gpu_procs", (n + nGpus - 1) / nGpus)) return 1;
  mkernel::bootstrap::UniqueId id;
  if (mkernel::bootstrap::createUniqueId(&id) != Result::Success) {
    std::fprintf(stderr, "createUniqueId: %s\n", mkernel::lastError());
    return 1;
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(child(r, n, nGpus, hosts, id, killMode, halfPosted, mixed, mismatch));
    pids.push_back(pid);
  }
  int failed = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  for (int r = 0; r < n; ++r) {
    int status = 0;
    for (;;) {
      pid_t w = waitpid(pids[static_cast<size_t>(r)], &status, WNOHANG);
      if (w == pids[static_cast<size_t>(r)]) break;
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "rank %d: still running after 180 s: killed\n", r);
        ::kill(pids[static_cast<size_t>(r)], SIGKILL);
        waitpid(pids[static_cast<size_t>(r)], &status, 0);
        status = 1 << 8;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const bool killedOnPurpose =
        kill && r == n - 1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    if (!killedOnPurpose && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      std::fprintf(stderr, "rank %d: exit status %d%s\n", r,
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                   WIFSIGNALED(status) ? " (signal)" : "");
      ++failed;
    }
  }
  mps.stop("test_gpu_procs");
  std::printf("test_gpu_procs: %d ranks on %d GPU(s)%s%s%s: %s\n", n, nGpus < n ? nGpus : n,
              nGpus < n ? " (emulated, MPS)" : "",
              hosts > 1 ? (", as " + std::to_string(hosts) + " hosts").c_str() : "",
              halfPosted ? ", a release while another communicator's collective is half posted"
              : mixed    ? ", captured beside eager"
              : !mismatch.empty()        ? (", " + mismatch + " on the last rank").c_str()
              : killMode == Kill::kMid   ? ", one killed mid-collective"
              : killMode == Kill::kGraph ? ", one killed between graph replays"
              : kill                     ? ", one killed"
                                         : "",
              failed ? "FAILED" : "passed");
  return failed ? 1 : 0;
}
