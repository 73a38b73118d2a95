// mkernel-collbench: AllReduce through the persistent kernel, N emulated thread ranks on one GPU.
//
// For each rank count and size: per-op latency (median, p99) over back-to-back collectives timed
// with CUDA events on rank 0's stream, eager and replayed from a CUDA graph, and a memory
// bandwidth: the minimum device-memory bytes an AllReduce must move on one GPU (every rank's
// input read once, every rank's output written once: 2 * nRanks * bytes) per second of the
// eager median, next to cudaMemcpy device-to-device bandwidth (read + write) measured in the
// same run. Progress on stderr, table on stdout, --csv FILE for the rows.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "common/result.h"
#include "transport/bootstrap/bootstrap.h"

namespace {

using mkernel::Result;
using mkernel::coll::CollArgs;

struct Options {
  std::vector<int> ranks{2, 4, 8};
  size_t minBytes = 8;
  size_t maxBytes = size_t(1) << 30;
  size_t step = 8;
  int iters = 1000;
  int graphOps = 16;  // collectives per captured graph (each uses one of the 192 graph slots)
  std::string csv;
};

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
};

struct Row {
  int ranks;
  size_t bytes;
  double eagerMed, eagerP99, graphMed, graphP99;  // microseconds
  double memGBps, pctCopy;
};

double percentile(std::vector<float> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

double copyBandwidthGBps(size_t bytes) {
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  const int reps = 20;
  cudaEventRecord(e0);
  for (int i = 0; i < reps; ++i) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) * reps / (ms * 1e-3) / 1e9;
}

// Runs all sizes for n ranks; rank 0 fills rows.
bool runRanks(int n, const Options& opt, double copyGBps, std::vector<Row>* rows) {
  mkernel::bootstrap::UniqueId id;
  if (mkernel::bootstrap::createUniqueId(&id) != Result::Success) return false;
  Barrier barrier(n);
  bool ok = true;
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto fail = [&](const std::string& what) {
        std::lock_guard<std::mutex> lock(mu);
        std::fprintf(stderr, "rank %d: %s: %s\n", r, what.c_str(), mkernel::lastError());
        ok = false;
      };
      cudaSetDevice(0);
      std::unique_ptr<mkernel::bootstrap::Bootstrap> bs;
      if (mkernel::bootstrap::Bootstrap::create(id, r, n, &bs) != Result::Success) return fail("bootstrap");
      mkernel::coll::CommOptions co;
      co.rank = r;
      co.nRanks = n;
      co.emulate = true;
      std::unique_ptr<mkernel::coll::Communicator> comm;
      if (mkernel::coll::Communicator::create(co, bs.get(), &comm) != Result::Success) return fail("create");
      cudaStream_t stream;
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      void *send = nullptr, *recv = nullptr;
      if (cudaMalloc(&send, opt.maxBytes) != cudaSuccess || cudaMalloc(&recv, opt.maxBytes) != cudaSuccess)
        return fail("cudaMalloc " + std::to_string(opt.maxBytes));
      cudaMemset(send, 0, opt.maxBytes);
      const int iters = opt.iters;
      std::vector<cudaEvent_t> ev(static_cast<size_t>(iters) + 1);
      for (auto& e : ev) cudaEventCreate(&e);
      for (size_t bytes = opt.minBytes; bytes <= opt.maxBytes; bytes *= opt.step) {
        CollArgs a;
        a.dtype = mkernel::coll::DataType::Float32;
        a.count = std::max<size_t>(1, bytes / 4);
        a.sendbuff = send;
        a.recvbuff = recv;
        // Warm-up (and the kernel launch) outside the timing.
        for (int i = 0; i < 10; ++i)
          if (comm->enqueue(&a, 1, stream) != Result::Success) return fail("enqueue");
        cudaStreamSynchronize(stream);
        barrier.wait();
        std::vector<float> eager(static_cast<size_t>(iters));
        cudaEventRecord(ev[0], stream);
        for (int i = 0; i < iters; ++i) {
          if (comm->enqueue(&a, 1, stream) != Result::Success) return fail("enqueue");
          cudaEventRecord(ev[static_cast<size_t>(i) + 1], stream);
        }
        cudaStreamSynchronize(stream);
        for (int i = 0; i < iters; ++i) cudaEventElapsedTime(&eager[static_cast<size_t>(i)], ev[static_cast<size_t>(i)], ev[static_cast<size_t>(i) + 1]);
        barrier.wait();
        // Graph: graphOps collectives with an event between each, replayed until >= iters samples.
        std::vector<float> graph;
        cudaGraph_t g = nullptr;
        cudaGraphExec_t ge = nullptr;
        cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
        cudaEventRecordWithFlags(ev[0], stream, cudaEventRecordExternal);
        bool capOk = true;
        for (int i = 0; i < opt.graphOps; ++i) {
          capOk = capOk && comm->enqueue(&a, 1, stream) == Result::Success;
          cudaEventRecordWithFlags(ev[static_cast<size_t>(i) + 1], stream, cudaEventRecordExternal);
        }
        if (cudaStreamEndCapture(stream, &g) != cudaSuccess || !capOk) return fail("capture");
        if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) return fail("instantiate");
        cudaGraphLaunch(ge, stream);  // warm-up
        cudaStreamSynchronize(stream);
        barrier.wait();
        while (static_cast<int>(graph.size()) < iters) {
          cudaGraphLaunch(ge, stream);
          cudaStreamSynchronize(stream);
          for (int i = 0; i < opt.graphOps; ++i) {
            float ms = 0;
            cudaEventElapsedTime(&ms, ev[static_cast<size_t>(i)], ev[static_cast<size_t>(i) + 1]);
            graph.push_back(ms);
          }
        }
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        if (comm->asyncError() != Result::Success) return fail("asyncError");
        if (r == 0) {
          Row row{};
          row.ranks = n;
          row.bytes = a.count * 4;
          row.eagerMed = percentile(eager, 0.5) * 1e3;
          row.eagerP99 = percentile(eager, 0.99) * 1e3;
          row.graphMed = percentile(graph, 0.5) * 1e3;
          row.graphP99 = percentile(graph, 0.99) * 1e3;
          row.memGBps = 2.0 * n * static_cast<double>(row.bytes) / (row.eagerMed * 1e-6) / 1e9;
          row.pctCopy = copyGBps > 0 ? 100.0 * row.memGBps / copyGBps : 0;
          rows->push_back(row);
          std::fprintf(stderr, "collbench: %d ranks %12zu B  eager %9.2f us  graph %9.2f us  %8.1f GB/s\n", n,
                       row.bytes, row.eagerMed, row.graphMed, row.memGBps);
        }
        barrier.wait();
      }
      for (auto& e : ev) cudaEventDestroy(e);
      cudaStreamSynchronize(stream);
      if (comm->finalize() != Result::Success) fail("finalize");
      cudaFree(send);
      cudaFree(recv);
      cudaStreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  return ok;
}

std::vector<int> parseList(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

int usage() {
  std::fprintf(stderr,
               "usage: mkernel-collbench [--ranks 2,4,8] [--min-bytes 8] [--max-bytes 1073741824] "
               "[--step 8] [--iters 1000] [--csv FILE]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const char* v = argv[++i];
    if (a == "--ranks") opt.ranks = parseList(v);
    else if (a == "--min-bytes") opt.minBytes = std::strtoull(v, nullptr, 10);
    else if (a == "--max-bytes") opt.maxBytes = std::strtoull(v, nullptr, 10);
    else if (a == "--step") opt.step = std::strtoull(v, nullptr, 10);
    else if (a == "--iters") opt.iters = std::atoi(v);
    else if (a == "--csv") opt.csv = v;
    else return usage();
  }
  if (opt.step < 2 || opt.minBytes < 1 || opt.iters < 1) return usage();
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 0);
  // 2 streams per rank (caller + internal): more hardware queues than CUDA's default 8, so that a
  // stream waiting on its doorbell does not hold up another rank's post (before any CUDA call).
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  int nDev = 0;
  if (cudaGetDeviceCount(&nDev) != cudaSuccess || nDev == 0) {
    std::fprintf(stderr, "mkernel-collbench: no CUDA device\n");
    return 1;
  }
  cudaSetDevice(0);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  const double copyGBps = copyBandwidthGBps(std::min<size_t>(opt.maxBytes, size_t(1) << 30));
  std::fprintf(stderr, "collbench: %s, %d SMs, cudaMemcpy D2D %.0f GB/s (read + write)\n", prop.name,
               prop.multiProcessorCount, copyGBps);
  // Every size captures graphOps collectives into a graph, and each captured group holds one of
  // the communicator's 192 graph slots for good: spread them over the sizes.
  int nSizes = 0;
  for (size_t b = opt.minBytes; b <= opt.maxBytes; b *= opt.step) ++nSizes;
  opt.graphOps = std::max(1, std::min(opt.graphOps, 190 / std::max(1, nSizes)));
  std::vector<Row> rows;
  bool ok = true;
  for (int n : opt.ranks) ok = runRanks(n, opt, copyGBps, &rows) && ok;
  std::printf("# AllReduce float sum, emulated thread ranks on one %s; D2D copy %.0f GB/s\n", prop.name, copyGBps);
  std::printf("# mem GB/s = 2 * ranks * bytes / eager median (each input read once, each output written once)\n");
  std::printf("%5s %12s %11s %11s %11s %11s %10s %7s\n", "ranks", "bytes", "eager_med", "eager_p99", "graph_med",
              "graph_p99", "mem_GB/s", "%copy");
  for (const Row& r : rows)
    std::printf("%5d %12zu %11.2f %11.2f %11.2f %11.2f %10.1f %7.1f\n", r.ranks, r.bytes, r.eagerMed, r.eagerP99,
                r.graphMed, r.graphP99, r.memGBps, r.pctCopy);
  if (!opt.csv.empty()) {
    FILE* f = std::fopen(opt.csv.c_str(), "w");
    if (f) {
      std::fprintf(f, "ranks,bytes,eager_med_us,eager_p99_us,graph_med_us,graph_p99_us,mem_GBps,pct_copy,copy_GBps\n");
      for (const Row& r : rows)
        std::fprintf(f, "%d,%zu,%.3f,%.3f,%.3f,%.3f,%.2f,%.2f,%.1f\n", r.ranks, r.bytes, r.eagerMed, r.eagerP99,
                     r.graphMed, r.graphP99, r.memGBps, r.pctCopy, copyGBps);
      std::fclose(f);
    }
  }
  return ok ? 0 : 1;
}
