// mkernel-proclat: small-AllReduce latency with ranks as processes (docs/PERFORMANCE.md; issue 5's
// 8-rank latency goal). Thread ranks of one process share one CUDA context, and their kernel
// launches queue behind one another in it (8 thread ranks on one H200: 42 µs per 8 B AllReduce,
// of which the launches are most); process ranks, one context each (under CUDA MPS when they
// share a GPU, which the tool starts itself), launch in parallel.
//
// Per rank count: N processes forked before any CUDA call, on GPU (rank % GPUs), one communicator
// (mkernel's Communicator, as test_gpu_procs). Per size, every rank: warm-up, then --iters
// back-to-back float AllReduces (sum) on its stream with a CUDA event after each; the eager
// latency is the interval between consecutive events (median and p99, as mkernel-collbench), host
// time per enqueue beside it. Rank 0's numbers are printed; every rank checks its last result
// against the definition first (a wrong sum fails the run). One table row per size.
//   mkernel-proclat [--ranks 2,4,8] [--min-bytes 8] [--max-bytes 32768] [--step 4] [--iters 1000]
//                   [--csv FILE]
// Exit status 0 when every run passed.
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "common/result.h"
#include "tools/cli.h"
#include "tools/proc_ranks.h"
#include "transport/bootstrap/bootstrap.h"

using mkernel::Result;
using mkernel::coll::CollArgs;

namespace {

struct Options {
  std::vector<int> ranks = {2, 4, 8};
  size_t minBytes = 8, maxBytes = 32768, step = 4;
  int iters = 1000;
  std::string csv;
};

struct Row {
  int ranks = 0;
  size_t bytes = 0;
  double med = 0, p99 = 0, hostUs = 0;
};

double percentile(std::vector<float> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t k =
      std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5));
  return v[k];
}

// One rank: its rows go to `out` (rank 0 only) as "bytes med p99 host" lines.
int child(int rank, int n, int nGpus, const mkernel::bootstrap::UniqueId& id, const Options& o,
          int out) {
  auto fail = [rank](const char* what) {
    std::fprintf(stderr, "mkernel-proclat: rank %d: %s: %s\n", rank, what, mkernel::lastError());
    return 1;
  };
  std::unique_ptr<mkernel::bootstrap::Bootstrap> bs;
  std::unique_ptr<mkernel::coll::Communicator> comm;
  const char* step = "";
  if (mktools::createProcessRank(rank, n, nGpus, id, &bs, &comm, &step) != Result::Success)
    return fail(step);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const size_t maxCount = std::max<size_t>(1, o.maxBytes / 4);
  float *send = nullptr, *recv = nullptr, *pinned = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&send), maxCount * 4) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&recv), maxCount * 4) != cudaSuccess ||
      cudaMallocHost(reinterpret_cast<void**>(&pinned), maxCount * 4) != cudaSuccess)
    return fail("allocation");
  // Small integers: every reduction order gives the same sum.
  for (size_t i = 0; i < maxCount; ++i)
    pinned[i] = static_cast<float>((i + static_cast<size_t>(rank) * 3) % 7);
  cudaMemcpyAsync(send, pinned, maxCount * 4, cudaMemcpyHostToDevice, stream);
  cudaStreamSynchronize(stream);
  std::vector<cudaEvent_t> ev(static_cast<size_t>(o.iters) + 1);
  for (auto& e : ev) cudaEventCreate(&e);
  for (size_t bytes = o.minBytes; bytes <= o.maxBytes; bytes *= o.step) {
    CollArgs a;  // AllReduce, Sum
    a.dtype = mkernel::coll::DataType::Float32;
    a.count = std::max<size_t>(1, bytes / 4);
    a.sendbuff = send;
    a.recvbuff = recv;
    for (int i = 0; i < 20; ++i)
      if (comm->enqueue(&a, 1, stream) != Result::Success) return fail("enqueue");
    cudaStreamSynchronize(stream);
    // The definition, before the timing: a fast wrong answer is no answer.
    cudaMemcpyAsync(pinned, recv, a.count * 4, cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    if (comm->asyncError() != Result::Success) return fail("asyncError");
    for (size_t i = 0; i < a.count; ++i) {
      float want = 0;
      for (int k = 0; k < n; ++k) want += static_cast<float>((i + static_cast<size_t>(k) * 3) % 7);
      if (pinned[i] != want) {
        std::fprintf(stderr, "mkernel-proclat: rank %d: %zu B: element %zu is %g, want %g\n", rank,
                     bytes, i, static_cast<double>(pinned[i]), static_cast<double>(want));
        return 1;
      }
    }
    if (bs->barrier() != Result::Success) return fail("barrier");
    const auto h0 = std::chrono::steady_clock::now();
    cudaEventRecord(ev[0], stream);
    for (int i = 0; i < o.iters; ++i) {
      if (comm->enqueue(&a, 1, stream) != Result::Success) return fail("enqueue");
      cudaEventRecord(ev[static_cast<size_t>(i) + 1], stream);
    }
    const double hostUs =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - h0).count() /
        o.iters;
    cudaStreamSynchronize(stream);
    if (comm->asyncError() != Result::Success) return fail("asyncError");
    std::vector<float> us(static_cast<size_t>(o.iters));
    for (int i = 0; i < o.iters; ++i) {
      float ms = 0;
      cudaEventElapsedTime(&ms, ev[static_cast<size_t>(i)], ev[static_cast<size_t>(i) + 1]);
      us[static_cast<size_t>(i)] = ms * 1000.0f;
    }
    if (rank == 0) {
      char line[160];
      const int len = std::snprintf(line, sizeof(line), "%zu %.3f %.3f %.3f\n", a.count * 4,
                                    percentile(us, 0.5), percentile(us, 0.99), hostUs);
      if (write(out, line, static_cast<size_t>(len)) != len) return fail("pipe");
    }
    if (bs->barrier() != Result::Success) return fail("barrier");
  }
  for (auto& e : ev) cudaEventDestroy(e);
  if (comm->finalize() != Result::Success) return fail("finalize");
  comm.reset();
  cudaFree(send);
  cudaFree(recv);
  cudaFreeHost(pinned);
  return 0;
}

// One rank count: fork, collect rank 0's rows, wait (bounded) for every rank.
bool runRanks(int n, int nGpus, const Options& o, std::vector<Row>* rows) {
  mkernel::bootstrap::UniqueId id;
  if (mkernel::bootstrap::createUniqueId(&id) != Result::Success) {
    std::fprintf(stderr, "mkernel-proclat: createUniqueId: %s\n", mkernel::lastError());
    return false;
  }
  int fds[2];
  if (pipe(fds) != 0) return false;
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      _exit(child(r, n, nGpus, id, o, fds[1]));
    }
    pids.push_back(pid);
  }
  close(fds[1]);
  std::string text;
  char buf[512];
  for (ssize_t got; (got = read(fds[0], buf, sizeof(buf))) > 0;)
    text.append(buf, static_cast<size_t>(got));
  close(fds[0]);
  bool ok = true;
  for (int r = 0; r < n; ++r) {
    int status = 0;
    waitpid(pids[static_cast<size_t>(r)], &status, 0);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      std::fprintf(stderr, "mkernel-proclat: %d ranks: rank %d failed (status %d)\n", n, r, status);
      ok = false;
    }
  }
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const std::string line =
        text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    Row row;
    row.ranks = n;
    if (std::sscanf(line.c_str(), "%zu %lf %lf %lf", &row.bytes, &row.med, &row.p99, &row.hostUs) ==
        4)
      rows->push_back(row);
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app(
      "Small-AllReduce latency with ranks as processes (forked before any CUDA call; under CUDA "
      "MPS when\n"
      "they share a GPU), against thread ranks' one-context launches.",
      "mkernel-proclat");
  mktools::setupApp(app);
  mktools::listOf(app.add_option("--ranks", o.ranks, "process rank counts, one run each (1 to 64)"))
      ->check(CLI::Range(1, 64))
      ->default_str("2,4,8");
  app.add_option("--min-bytes", o.minBytes, "smallest size (K, M, G accepted; at least 4)")
      ->transform(mktools::kSize)
      ->check(CLI::Range(uint64_t(4), uint64_t(1) << 40).description(""))
      ->capture_default_str();
  app.add_option("--max-bytes", o.maxBytes, "largest size")
      ->transform(mktools::kSize)
      ->capture_default_str();
  app.add_option("--step", o.step, "size multiplier from one row to the next")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  app.add_option("--iters", o.iters, "timed collectives per size (at least 10)")
      ->check(CLI::Range(10, 1 << 30))
      ->capture_default_str();
  app.add_option("--csv", o.csv, "also write the rows as CSV")->type_name("FILE");
  const int rc = mktools::parseArgs(app, argc, argv);
  if (rc >= 0) return rc;
  if (o.maxBytes < o.minBytes) return mktools::usageError(app, "--max-bytes is below --min-bytes");
  const int nGpus = mktools::gpuCountNoCuda();
  if (nGpus < 1) {
    std::fprintf(stderr, "mkernel-proclat: no GPU\n");
    return 2;
  }
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 0);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  int most = 0;
  for (int r : o.ranks) most = std::max(most, r);
  // Processes sharing a GPU need CUDA MPS: a private daemon for each step, its clients' hardware
  // queues capped (PrivateMps::start).
  mktools::PrivateMps mps;
  std::printf(
      "# AllReduce float sum, process ranks on %d GPU(s) (rank r on GPU r %% %d%s); eager latency "
      "= interval\n"
      "# between CUDA events after consecutive back-to-back collectives on rank 0's stream, %d per "
      "size\n",
      nGpus, nGpus, most > nGpus ? "; ranks sharing a GPU under CUDA MPS" : "", o.iters);
  std::printf("%6s %12s %10s %10s %9s\n", "ranks", "bytes", "eager_med", "eager_p99", "host_us");
  std::fflush(stdout);
  std::vector<Row> all;
  bool ok = true;
  for (int n : o.ranks) {
    std::fprintf(stderr, "mkernel-proclat: %d process ranks ...\n", n);
    std::vector<Row> rows;
    if (n > nGpus && !mps.start("mkernel-proclat", (n + nGpus - 1) / nGpus)) return 2;
    ok = runRanks(n, nGpus, o, &rows) && ok;
    mps.stop("mkernel-proclat");
    for (const Row& r : rows) {
      std::printf("%6d %12zu %10.2f %10.2f %9.2f\n", r.ranks, r.bytes, r.med, r.p99, r.hostUs);
      all.push_back(r);
    }
    std::fflush(stdout);
  }
  if (!o.csv.empty()) {
    if (FILE* f = std::fopen(o.csv.c_str(), "w")) {
      std::fprintf(f, "ranks,bytes,eager_med_us,eager_p99_us,host_us\n");
      for (const Row& r : all)
        std::fprintf(f, "%d,%zu,%.3f,%.3f,%.3f\n", r.ranks, r.bytes, r.med, r.p99, r.hostUs);
      std::fclose(f);
    }
  }
  return ok ? 0 : 1;
}
