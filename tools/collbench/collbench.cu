// mkernel-collbench: AllReduce (or, --coll, another collective) through mkernel, N thread ranks on
// one GPU (emulated) or spread over several (--gpus), optionally beside the real NCCL (--nccl,
// AllReduce only).
//
// For each rank count and size: per-op latency (median, p99) over back-to-back collectives timed
// with CUDA events on rank 0's stream, eager and replayed from a CUDA graph, and a memory
// bandwidth: the minimum device-memory bytes the collective must move on one GPU (every rank's
// input read once, every rank's output written once: 2 * nRanks * bytes for an AllReduce,
// (nRanks + 1) * bytes for the others) per second of the eager median, next to cudaMemcpy
// device-to-device bandwidth (read + write) measured in the same run. "bytes" is the size
// nccl-tests reports: an AllReduce's, Broadcast's or Reduce's buffer, ReduceScatter's send buffer
// (every rank's block), AllGather's receive buffer. After the timed collectives of each size, one
// more checks the data (nccl-tests' #wrong). Progress on stderr, tables on stdout: the detailed
// one, then nccl-tests' columns (size, count, type, redop, time, algbw, busbw, #wrong) with, beside
// --nccl, NCCL's time and the ratio mkernel / NCCL on the same row; --csv FILE for the detailed
// rows, --results FILE to append the nccl-tests-column rows (docs/results/).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "vendor/cuda_driver.h"
#include "collectives/algo/work.h"
#include "common/param.h"
#include "common/result.h"
#include "tools/cli.h"
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
  // Paths to compare: launch (the default: eager collectives in a launched kernel, through the
  // inbox up to MKERNEL_LAUNCH_MAX_BYTES and in direct mode above), memop (everything
  // through the persistent kernel, stream-memop doorbell), kernel (the same with the gate kernel).
  std::vector<std::string> waits{"launch", "memop"};
  std::string mode;  // the one being run
  // --trace 1 (MKERNEL_KERNEL_TRACE=1): where the time of an eager collective goes; --trace 2
  // (MKERNEL_KERNEL_TRACE=2): of a captured one, in a graph of graphOps collectives back to back
  // with no event between them (as nccl-tests -G captures), whose time per op is graphRunUs.
  int trace = 0;
  std::string nccl;  // --nccl LIB: the real NCCL's AllReduce in the same run
  int gpus = 1;      // --gpus N: rank r runs on GPU r % N (N = 1: every rank on GPU 0, emulated)
  int ranksPerNode = 0;  // --ranks-per-node K: emulated nodes of K ranks (the hierarchical path)
  // --group K: every timed call is a group of K AllReduces (NCCL: between ncclGroupStart and
  // ncclGroupEnd; mkernel: one enqueue of K ops, MKERNEL_LL_BATCH), op k on its own window of the
  // buffers (groupWindow), as nccl-tests -m shifts each op of a group; times are per collective
  // (a group's interval / K), as nccl-tests -m reports them.
  int group = 1;
  std::string csv;
  // --results FILE: the nccl-tests-column rows appended as CSV (docs/results/), with the run's
  // date, machine, --commit and command line.
  std::string results;
  std::string commit = "unknown";
  std::string command;  // the command line, for --results
  // --sync spin|yield|blocking: how the rank threads wait for their streams
  // (cudaSetDeviceFlags(cudaDeviceSchedule*) on every GPU; default: CUDA's, which spins with more
  // cores than contexts). On emulated nodes eight spinning rank threads share the host's cores with
  // the proxies that play the NICs (docs/PERFORMANCE.md).
  std::string sync;
  // --coll: the collective timed (float sum; Broadcast and Reduce rooted at rank 0).
  mkernel::coll::CollType coll = mkernel::coll::CollType::AllReduce;
};

// Elements per rank of collective c for a size of `bytes` (nccl-tests' size, above) over n ranks.
size_t collCount(mkernel::coll::CollType c, size_t bytes, int n) {
  using mkernel::coll::CollType;
  const size_t elems = bytes / 4;
  if (c == CollType::ReduceScatter || c == CollType::AllGather)
    return std::max<size_t>(1, elems / static_cast<size_t>(n));
  return std::max<size_t>(1, elems);
}
// That size again, from the count (what the rows report).
size_t collBytes(mkernel::coll::CollType c, size_t count, int n) {
  using mkernel::coll::CollType;
  return (c == CollType::ReduceScatter || c == CollType::AllGather ? count * static_cast<size_t>(n)
                                                                   : count) *
         4;
}

// The data check (nccl-tests' #wrong): element i of rank r's send buffer is (r + 1) * (i % 13 + 1),
// small integers whose float sums are exact, so every output element has one right value.
__global__ void fillPattern(float* p, size_t n, int rank) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    p[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 13 + 1);
}

// Counts the elements of rank `rank`'s output of collective c (count: CollArgs::count over n
// ranks, root 0) that differ from the pattern's result, into *wrong.
__global__ void countWrong(const float* out, size_t count, int n, int rank,
                           mkernel::coll::CollType c, unsigned long long* wrong) {
  using mkernel::coll::CollType;
  const float ranksSum = static_cast<float>(n) * static_cast<float>(n + 1) / 2;
  const size_t total = c == CollType::AllGather ? count * static_cast<size_t>(n) : count;
  unsigned long long mine = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total;
       i += size_t(gridDim.x) * blockDim.x) {
    float want;
    switch (c) {
      case CollType::ReduceScatter:
        want = ranksSum * static_cast<float>((static_cast<size_t>(rank) * count + i) % 13 + 1);
        break;
      case CollType::AllGather:
        want = static_cast<float>(i / count + 1) * static_cast<float>(i % count % 13 + 1);
        break;
      case CollType::Broadcast:
        want = static_cast<float>(i % 13 + 1);
        break;
      default:
        want = ranksSum * static_cast<float>(i % 13 + 1);
        break;  // AllReduce, Reduce (root)
    }
    if (out[i] != want) ++mine;
  }
  if (mine) atomicAdd(wrong, mine);
}

// Rank `rank`'s part of the data check of `a` (its buffers at least as large as the collective's):
// fills the send buffer, runs the collective once, counts the wrong output elements. -1 when the
// collective could not be run. Reduce checks the root's output only.
int64_t dataCheck(mkernel::coll::Communicator* comm, mkernel::coll::CollArgs a, int n, int rank,
                  cudaStream_t stream, unsigned long long* devWrong,
                  std::function<void()> barrier) {
  using mkernel::coll::CollType;
  const size_t sendElems =
      a.coll == CollType::ReduceScatter ? a.count * static_cast<size_t>(n) : a.count;
  fillPattern<<<256, 256, 0, stream>>>(static_cast<float*>(const_cast<void*>(a.sendbuff)),
                                       sendElems, rank);
  cudaMemsetAsync(devWrong, 0, sizeof(*devWrong), stream);
  cudaStreamSynchronize(stream);
  barrier();  // every rank's input is in place before any rank's collective reads it
  if (comm->enqueue(&a, 1, stream) != Result::Success) return -1;
  if (a.coll != CollType::Reduce || rank == a.root)
    countWrong<<<256, 256, 0, stream>>>(static_cast<const float*>(a.recvbuff), a.count, n, rank,
                                        a.coll, devWrong);
  unsigned long long wrong = 0;
  cudaMemcpyAsync(&wrong, devWrong, sizeof(wrong), cudaMemcpyDeviceToHost, stream);
  if (cudaStreamSynchronize(stream) != cudaSuccess) return -1;
  return static_cast<int64_t>(wrong);
}

// Per collective: every interval of a group of k divided by k.
std::vector<float> perOp(std::vector<float> v, int k) {
  for (float& x : v) x /= static_cast<float>(k);
  return v;
}

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
  std::string wait;  // MKERNEL_STREAM_WAIT
  int ranks;
  size_t bytes;
  double eagerMed, eagerP99, graphMed, graphP99;  // microseconds
  double hostUs;  // rank 0's host time per eager enqueue (wall clock of the eager loop / iters)
  // --trace: medians (us) of the kernel's stage intervals over the eager loop (docs/KERNEL.md):
  // seen->loaded, loaded->start barrier, ->moved, ->end barrier, ->reported (SM cycles),
  // reported->next seen (%globaltimer), seen->reported (cycles); the SM clock that converted them.
  double stageUs[7] = {};
  double smGHz = 0;
  size_t traced = 0;
  double graphRunUs = 0;  // --trace 2: per op, the event-free graph's replays
  double memGBps, pctCopy;
  int64_t wrong = -1;  // elements wrong in the data check, summed over ranks (-1: not checked)
};

double percentile(std::vector<float> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// Milliseconds between consecutive events ev[0..n].
std::vector<float> intervals(const std::vector<cudaEvent_t>& ev, int n) {
  std::vector<float> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    cudaEventElapsedTime(&t[static_cast<size_t>(i)], ev[static_cast<size_t>(i)],
                         ev[static_cast<size_t>(i) + 1]);
  return t;
}

// Replays a graph of graphOps timed collectives (events ev[0..graphOps] recorded around them)
// until at least `samples` per-op times are collected.
std::vector<float> replayGraph(cudaGraphExec_t ge, cudaStream_t stream,
                               const std::vector<cudaEvent_t>& ev, int graphOps, int samples) {
  std::vector<float> out;
  while (static_cast<int>(out.size()) < samples) {
    cudaGraphLaunch(ge, stream);
    cudaStreamSynchronize(stream);
    std::vector<float> t = intervals(ev, graphOps);
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

// One table row from the samples (ms); mem GB/s counts every rank's input read once and every
// rank's output written once.
Row makeRow(const std::string& wait, int ranks, size_t bytes, const std::vector<float>& eager,
            const std::vector<float>& graph, double hostUs, double copyGBps,
            mkernel::coll::CollType coll = mkernel::coll::CollType::AllReduce) {
  Row row{};
  row.wait = wait;
  row.ranks = ranks;
  row.bytes = bytes;
  row.eagerMed = percentile(eager, 0.5) * 1e3;
  row.eagerP99 = percentile(eager, 0.99) * 1e3;
  row.graphMed = percentile(graph, 0.5) * 1e3;
  row.graphP99 = percentile(graph, 0.99) * 1e3;
  row.hostUs = hostUs;
  const double perGpu =
      coll == mkernel::coll::CollType::AllReduce ? 2.0 * ranks : ranks + 1.0;  // x bytes
  row.memGBps = perGpu * static_cast<double>(bytes) / (row.eagerMed * 1e-6) / 1e9;
  row.pctCopy = copyGBps > 0 ? 100.0 * row.memGBps / copyGBps : 0;
  return row;
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

__global__ void emptyKernel() {}

// Floors of the doorbell protocol on this GPU, one stream, no mkernel code: the median time per
// back-to-back empty kernel launch, per {write 1, wait >= 1} stream-memop pair (what enqueue()
// puts on the caller's stream, with the wait already satisfied), and per {write 1, wait == 1,
// write 0} triple.
void baselines(int iters, double* launchUs, double* pairUs, double* tripleUs) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  uint32_t* flag = nullptr;
  cudaMalloc(&flag, 4);
  cudaMemset(flag, 0, 4);
  std::vector<cudaEvent_t> ev(static_cast<size_t>(iters) + 1);
  for (auto& e : ev) cudaEventCreate(&e);
  using mkernel::cudrv::WaitCmp;
  for (int pass = 0; pass < 3; ++pass) {
    for (int i = 0; i < 20; ++i) emptyKernel<<<1, 32, 0, s>>>();
    cudaEventRecord(ev[0], s);
    for (int i = 0; i < iters; ++i) {
      if (pass == 0) {
        emptyKernel<<<1, 32, 0, s>>>();
      } else if (pass == 1) {
        mkernel::cudrv::streamWriteValue32(s, flag, 1);
        mkernel::cudrv::streamWaitValue32(s, flag, 1, WaitCmp::Geq);
      } else {
        mkernel::cudrv::streamWriteValue32(s, flag, 1);
        mkernel::cudrv::streamWaitValue32(s, flag, 1);
        mkernel::cudrv::streamWriteValue32(s, flag, 0);
      }
      cudaEventRecord(ev[static_cast<size_t>(i) + 1], s);
    }
    cudaStreamSynchronize(s);
    (pass == 0   ? *launchUs
     : pass == 1 ? *pairUs
                 : *tripleUs) = percentile(intervals(ev, iters), 0.5) * 1e3;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  cudaFree(flag);
  cudaStreamDestroy(s);
}

// Host cost of the CUDA calls a launch-path collective makes, one call at a time: the median of
// `iters` single calls timed with steady_clock, a stream sync after every 32 (outside the timing)
// so that no call waits for a full queue. `gpus` > 1 adds cudaSetDevice between two devices, as a
// thread driving both GPUs in a group (nccl-tests -g 2) does per collective.
struct BigArg {
  char bytes[640];  // about KernelParams + WorkDesc + the scalars of launchKernel's signature
};
__global__ void bigArgKernel(BigArg) {}
struct HostCosts {
  double launchUs = 0, bigLaunchUs = 0, recordUs = 0, capturingUs = 0, setSameUs = 0,
         setOtherUs = 0;
  double copyUs =
      0;  // cudaMemcpyAsync of 8 bytes device to device: the one-rank path's only CUDA call
};
HostCosts hostCosts(int iters, int gpus) {
  HostCosts h;
  cudaSetDevice(0);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t ev;
  cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  BigArg arg{};
  for (int i = 0; i < 20; ++i) bigArgKernel<<<1, 32, 0, s>>>(arg);
  cudaStreamSynchronize(s);
  auto measure = [&](auto&& call) {
    std::vector<float> us;
    us.reserve(static_cast<size_t>(iters));
    for (int i = 0; i < iters; ++i) {
      if (i % 32 == 0) cudaStreamSynchronize(s);
      const auto t0 = std::chrono::steady_clock::now();
      call();
      us.push_back(
          std::chrono::duration<float, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    cudaStreamSynchronize(s);
    return percentile(us, 0.5);
  };
  h.launchUs = measure([&] { emptyKernel<<<1, 32, 0, s>>>(); });
  h.bigLaunchUs = measure([&] { bigArgKernel<<<1, 256, 0, s>>>(arg); });
  h.recordUs = measure([&] { cudaEventRecord(ev, s); });
  h.capturingUs = measure([&] {
    cudaStreamCaptureStatus st;
    cudaStreamIsCapturing(s, &st);
  });
  h.setSameUs = measure([&] { cudaSetDevice(0); });
  void* buf = nullptr;
  if (cudaMalloc(&buf, 16) == cudaSuccess) {
    char* b = static_cast<char*>(buf);
    h.copyUs = measure([&] { cudaMemcpyAsync(b + 8, b, 8, cudaMemcpyDeviceToDevice, s); });
    cudaStreamSynchronize(s);
    cudaFree(buf);
  }
  if (gpus > 1) {
    int k = 0;
    h.setOtherUs = measure([&] { cudaSetDevice(++k & 1); });
    cudaSetDevice(0);
  }
  cudaEventDestroy(ev);
  cudaStreamDestroy(s);
  return h;
}

// The floors of emulated thread ranks on one GPU, no mkernel code: n threads, each with its own
// stream, make the calls of `kind` once per round, in step (a spin barrier between rounds, as
// ranks are by their collectives). The median wall time of a round, from thread 0's barrier exits,
// is what those calls cost when n threads contend for the driver at once (issue 5's goal: 8 us
// with 8 ranks). Kinds:
//   kFloorLaunch    each thread launches an empty kernel (a launch-path collective's one call);
//   kFloorRecord    each thread records an event on its stream;
//   kFloorFused     each thread records an event, thread 0 then makes its stream wait for the
//                   others' and launches one empty kernel and records an event, and every other
//                   thread's stream waits for that one (a fused launch's calls, after a barrier);
//   kFloorBarrier   no CUDA call: the barrier alone.
enum FloorKind { kFloorLaunch, kFloorRecord, kFloorFused, kFloorBarrier };
double threadFloorUs(int n, int rounds, FloorKind kind) {
  std::atomic<int> arrived{0};
  std::atomic<int> generation{0};
  auto barrier = [&]() {
    const int g = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
      arrived.store(0, std::memory_order_relaxed);
      generation.store(g + 1, std::memory_order_release);
    } else {
      while (generation.load(std::memory_order_acquire) == g) {
      }
    }
  };
  std::vector<float> roundUs;
  std::vector<cudaEvent_t> in(static_cast<size_t>(n)), out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t)
    threads.emplace_back([&, t] {
      cudaSetDevice(0);
      cudaStream_t s;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      cudaEventCreateWithFlags(&in[static_cast<size_t>(t)], cudaEventDisableTiming);
      cudaEventCreateWithFlags(&out[static_cast<size_t>(t)], cudaEventDisableTiming);
      for (int i = 0; i < 20; ++i) emptyKernel<<<1, 32, 0, s>>>();
      cudaStreamSynchronize(s);
      barrier();
      auto last = std::chrono::steady_clock::now();
      for (int r = 0; r < rounds; ++r) {
        switch (kind) {
          case kFloorLaunch:
            emptyKernel<<<1, 32, 0, s>>>();
            break;
          case kFloorRecord:
            cudaEventRecord(in[static_cast<size_t>(t)], s);
            break;
          case kFloorFused:
            cudaEventRecord(in[static_cast<size_t>(t)], s);
            barrier();
            if (t == 0) {
              for (int q = 1; q < n; ++q) cudaStreamWaitEvent(s, in[static_cast<size_t>(q)], 0);
              emptyKernel<<<1, 32, 0, s>>>();
              cudaEventRecord(out[0], s);
            }
            barrier();
            if (t != 0) cudaStreamWaitEvent(s, out[0], 0);
            break;
          case kFloorBarrier:
            break;
        }
        barrier();
        if (t == 0) {
          const auto now = std::chrono::steady_clock::now();
          roundUs.push_back(std::chrono::duration<float, std::micro>(now - last).count());
          last = now;
        }
      }
      cudaStreamSynchronize(s);
      barrier();  // every thread's waits are queued before any event goes
      cudaEventDestroy(in[static_cast<size_t>(t)]);
      cudaEventDestroy(out[static_cast<size_t>(t)]);
      cudaStreamDestroy(s);
    });
  for (auto& th : threads) th.join();
  return percentile(roundUs, 0.5);
}

// Medians of the stage intervals of the last `last` traced groups (flattened KernelTraceRecords,
// by seq: seq, kTracePoints %globaltimer stamps, kTracePoints clock64 stamps). The stages inside
// a kernel are measured in SM cycles (%globaltimer moves in steps of about 1 us on an H200),
// converted at the clock the records themselves show: their cycles over their nanoseconds from
// first to last stamp, summed over every record (*smGHz). The gap between kernels is %globaltimer's
// (cycles of two kernels need not share a clock). Intervals with a missing stamp (0) are skipped.
// stageUs[0..4]: the five stages; [5]: reported -> next group seen; [6]: seen -> reported.
void traceStages(const std::vector<uint64_t>& flat, size_t last, double* stageUs, double* smGHz,
                 size_t* used) {
  using mkernel::coll::kTracePoints;
  constexpr int kLast = kTracePoints - 1;
  const size_t rec = 1 + 2 * kTracePoints;
  const size_t n = flat.size() / rec;
  const size_t first = n > last ? n - last : 0;
  double cycles = 0, ns = 0;
  for (size_t i = first; i < n; ++i) {
    const uint64_t* t = &flat[i * rec + 1];
    const uint64_t* c = t + kTracePoints;
    if (t[0] != 0 && t[kLast] > t[0] && c[0] != 0 && c[kLast] > c[0]) {
      cycles += static_cast<double>(c[kLast] - c[0]);
      ns += static_cast<double>(t[kLast] - t[0]);
    }
  }
  *smGHz = ns > 0 ? cycles / ns : 0;
  const double usPerCycle = cycles > 0 ? 1e-3 / *smGHz : 0;
  std::vector<float> d[7];
  for (size_t i = first; i < n; ++i) {
    const uint64_t* t = &flat[i * rec + 1];
    const uint64_t* c = t + kTracePoints;
    for (int k = 0; k < kLast; ++k)
      if (c[k] != 0 && c[k + 1] >= c[k])
        d[k].push_back(static_cast<float>(static_cast<double>(c[k + 1] - c[k]) * usPerCycle));
    if (c[0] != 0 && c[kLast] >= c[0])
      d[6].push_back(static_cast<float>(static_cast<double>(c[kLast] - c[0]) * usPerCycle));
    if (i + 1 < n && flat[(i + 1) * rec] == flat[i * rec] + 1) {  // consecutive groups
      const uint64_t nextSeen = flat[(i + 1) * rec + 1];
      if (t[kLast] != 0 && nextSeen >= t[kLast])
        d[5].push_back(static_cast<float>(nextSeen - t[kLast]) * 1e-3f);
    }
  }
  for (int k = 0; k < 7; ++k) stageUs[k] = percentile(d[k], 0.5);
  *used = n - first;
}

// The real NCCL, dlopen'd (never linked: the same binary runs where no NCCL is installed).
struct NcclApi {
  decltype(&ncclGetVersion) getVersion = nullptr;
  decltype(&ncclCommInitAll) commInitAll = nullptr;
  decltype(&ncclAllReduce) allReduce = nullptr;
  decltype(&ncclCommDestroy) commDestroy = nullptr;
  decltype(&ncclGetErrorString) errorString = nullptr;
  decltype(&ncclGroupStart) groupStart = nullptr;
  decltype(&ncclGroupEnd) groupEnd = nullptr;
};

bool loadNccl(const std::string& lib, NcclApi* api, std::string* why) {
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    *why = dlerror();
    return false;
  }
  api->getVersion = reinterpret_cast<decltype(&ncclGetVersion)>(dlsym(h, "ncclGetVersion"));
  api->commInitAll = reinterpret_cast<decltype(&ncclCommInitAll)>(dlsym(h, "ncclCommInitAll"));
  api->allReduce = reinterpret_cast<decltype(&ncclAllReduce)>(dlsym(h, "ncclAllReduce"));
  api->commDestroy = reinterpret_cast<decltype(&ncclCommDestroy)>(dlsym(h, "ncclCommDestroy"));
  api->errorString =
      reinterpret_cast<decltype(&ncclGetErrorString)>(dlsym(h, "ncclGetErrorString"));
  api->groupStart = reinterpret_cast<decltype(&ncclGroupStart)>(dlsym(h, "ncclGroupStart"));
  api->groupEnd = reinterpret_cast<decltype(&ncclGroupEnd)>(dlsym(h, "ncclGroupEnd"));
  if (!api->getVersion || !api->commInitAll || !api->allReduce || !api->commDestroy ||
      !api->errorString || !api->groupStart || !api->groupEnd) {
    *why = lib + " lacks an NCCL entry point";
    return false;
  }
  return true;
}

// Where op k of a --group of ops of `bytes` each starts in the rank's buffers: windows one after
// another, 256-byte aligned.
size_t groupWindow(size_t bytes, int k) {
  return static_cast<size_t>(k) * ((bytes + 255) / 256 * 256);
}

// One rank's stream, its two buffers of maxBytes (the input zeroed) and iters + 1 timing events,
// on the current device, which is synchronized before it returns. False when an allocation
// failed (the rest is made anyway, for the caller to free).
struct RankBufs {
  cudaStream_t stream = nullptr;
  void* send = nullptr;
  void* recv = nullptr;
  std::vector<cudaEvent_t> ev;
};
// events: the most intervals timed on the stream at once, max(--iters, graphOps): a captured graph
// records graphOps + 1 of them (with --iters below graphOps, 16, the vector was too short and the
// capture wrote past it: a segfault).
bool makeRankBufs(size_t maxBytes, int events, RankBufs* b) {
  cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking);
  const bool ok = cudaMalloc(&b->send, maxBytes) == cudaSuccess &&
                  cudaMalloc(&b->recv, maxBytes) == cudaSuccess;
  if (ok) cudaMemset(b->send, 0, maxBytes);
  b->ev.resize(static_cast<size_t>(events) + 1);
  for (auto& e : b->ev) cudaEventCreate(&e);
  cudaDeviceSynchronize();
  return ok;
}

// NCCL's AllReduce (float sum, out of place) over the same sizes with one rank per GPU (--gpus),
// driven as the mkernel rows are: one thread per rank, each enqueueing on its own stream, CUDA
// events between back-to-back calls on rank 0's stream, eager, then captured into a graph of
// graphOps calls per rank and replayed. One thread driving every GPU in an NCCL group, as
// nccl-tests -g N does, would pay two launches per NCCL op against one per mkernel op, and the
// multi-GPU rows would not be a like comparison (docs/PERFORMANCE.md).
bool runNccl(const Options& opt, double copyGBps, std::vector<Row>* rows) {
  NcclApi api;
  std::string why;
  if (!loadNccl(opt.nccl, &api, &why)) {
    std::fprintf(stderr, "collbench: --nccl %s: %s\n", opt.nccl.c_str(), why.c_str());
    return false;
  }
  int version = 0;
  api.getVersion(&version);
  const int nG = opt.gpus;
  std::vector<ncclComm_t> comms(static_cast<size_t>(nG), nullptr);
  std::vector<int> devs(static_cast<size_t>(nG));
  for (int d = 0; d < nG; ++d) devs[static_cast<size_t>(d)] = d;
  ncclResult_t r = api.commInitAll(comms.data(), nG, devs.data());
  if (r != ncclSuccess) {
    std::fprintf(stderr, "collbench: ncclCommInitAll: %s\n", api.errorString(r));
    return false;
  }
  Barrier barrier(nG);
  std::atomic<bool> ok{true};
  auto rank = [&](int d) {
    cudaSetDevice(d);
    ncclComm_t comm = comms[static_cast<size_t>(d)];
    RankBufs b;
    if (!makeRankBufs(groupWindow(opt.maxBytes, opt.group), std::max(opt.iters, opt.graphOps), &b))
      ok = false;
    barrier.wait();
    const int iters = opt.iters;
    // Every rank runs every size (a rank that stopped early would leave its peers' NCCL kernels
    // waiting); after a failure the calls are skipped on all ranks alike (ok is shared and read
    // between barriers).
    for (size_t bytes = opt.minBytes; bytes <= opt.maxBytes; bytes *= opt.step) {
      const bool run = ok.load();
      const size_t count = std::max<size_t>(1, bytes / 4);
      bool mine = true;
      auto call = [&] {
        if (opt.group > 1) mine = mine && api.groupStart() == ncclSuccess;
        for (int k = 0; k < opt.group; ++k)
          mine = mine && api.allReduce(static_cast<char*>(b.send) + groupWindow(bytes, k),
                                       static_cast<char*>(b.recv) + groupWindow(bytes, k), count,
                                       ncclFloat, ncclSum, comm, b.stream) == ncclSuccess;
        if (opt.group > 1) mine = mine && api.groupEnd() == ncclSuccess;
      };
      if (run)
        for (int i = 0; i < 10; ++i) call();
      cudaStreamSynchronize(b.stream);
      barrier.wait();
      const auto hostStart = std::chrono::steady_clock::now();
      cudaEventRecord(b.ev[0], b.stream);
      for (int i = 0; i < iters && run; ++i) {
        call();
        cudaEventRecord(b.ev[static_cast<size_t>(i) + 1], b.stream);
      }
      const double hostUs =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - hostStart)
              .count() /
          iters / opt.group;
      cudaStreamSynchronize(b.stream);
      const std::vector<float> eager =
          run ? perOp(intervals(b.ev, iters), opt.group) : std::vector<float>{};
      barrier.wait();
      std::vector<float> graph;
      cudaGraph_t g = nullptr;
      cudaGraphExec_t ge = nullptr;
      if (run) {
        cudaStreamBeginCapture(b.stream, cudaStreamCaptureModeThreadLocal);
        cudaEventRecordWithFlags(b.ev[0], b.stream, cudaEventRecordExternal);
        for (int i = 0; i < opt.graphOps; ++i) {
          call();
          cudaEventRecordWithFlags(b.ev[static_cast<size_t>(i) + 1], b.stream,
                                   cudaEventRecordExternal);
        }
        const bool captured = cudaStreamEndCapture(b.stream, &g) == cudaSuccess;
        if (!captured || cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
          std::fprintf(stderr, "collbench: rank %d: capturing NCCL's AllReduce failed\n", d);
          mine = false;
        } else {
          cudaGraphLaunch(ge, b.stream);  // warm-up
          cudaStreamSynchronize(b.stream);
        }
      }
      barrier.wait();
      if (ge != nullptr)
        graph = perOp(replayGraph(ge, b.stream, b.ev, opt.graphOps, iters), opt.group);
      if (ge != nullptr) cudaGraphExecDestroy(ge);
      if (g != nullptr) cudaGraphDestroy(g);
      if (!mine) ok = false;
      if (d == 0 && run && mine) {
        const Row row = makeRow("nccl" + std::to_string(version), nG, count * 4, eager, graph,
                                hostUs, copyGBps);
        rows->push_back(row);
        std::fprintf(stderr,
                     "collbench: NCCL %d, %d rank(s) %12zu B  eager %9.2f us  graph %9.2f us\n",
                     version, nG, row.bytes, row.eagerMed, row.graphMed);
      }
      barrier.wait();
    }
    for (auto& e : b.ev) cudaEventDestroy(e);
    cudaFree(b.send);
    cudaFree(b.recv);
    cudaStreamDestroy(b.stream);
  };
  std::vector<std::thread> threads;
  for (int d = 0; d < nG; ++d) threads.emplace_back(rank, d);
  for (auto& t : threads) t.join();
  for (int d = 0; d < nG; ++d) {
    cudaSetDevice(d);
    api.commDestroy(comms[static_cast<size_t>(d)]);
  }
  cudaSetDevice(0);
  return ok.load();
}

// Runs all sizes for n ranks; rank 0 fills rows.
bool runRanks(int n, const Options& opt, double copyGBps, std::vector<Row>* rows) {
  mkernel::bootstrap::UniqueId id;
  if (mkernel::bootstrap::createUniqueId(&id) != Result::Success) return false;
  Barrier barrier(n);
  bool ok = true;
  std::mutex mu;
  std::atomic<int64_t> wrongSum{0};  // the data check's count of this size, over the ranks
  std::atomic<bool> unchecked{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto fail = [&](const std::string& what) {
        std::lock_guard<std::mutex> lock(mu);
        std::fprintf(stderr, "rank %d: %s: %s\n", r, what.c_str(), mkernel::lastError());
        ok = false;
      };
      const int dev = r % opt.gpus;
      cudaSetDevice(dev);
      std::unique_ptr<mkernel::bootstrap::Bootstrap> bs;
      if (mkernel::bootstrap::Bootstrap::create(id, r, n, &bs) != Result::Success)
        return fail("bootstrap");
      mkernel::coll::CommOptions co;
      co.rank = r;
      co.nRanks = n;
      co.cudaDev = dev;
      co.emulate =
          n > opt.gpus || opt.ranksPerNode > 0;  // several ranks per GPU, or nodes: emulation
      co.ranksPerNode = opt.ranksPerNode;
      std::unique_ptr<mkernel::coll::Communicator> comm;
      if (mkernel::coll::Communicator::create(co, bs.get(), &comm) != Result::Success)
        return fail("create");
      RankBufs b;
      // (--coll reducescatter / allgather: a size below 4 * n bytes still takes one element per
      // rank.)
      const size_t bufBytes = std::max(opt.maxBytes, size_t(4) * static_cast<size_t>(n));
      if (!makeRankBufs(groupWindow(bufBytes, opt.group), std::max(opt.iters, opt.graphOps), &b))
        return fail("cudaMalloc " + std::to_string(groupWindow(bufBytes, opt.group)));
      cudaStream_t stream = b.stream;
      void *send = b.send, *recv = b.recv;
      unsigned long long* devWrong = nullptr;
      if (cudaMalloc(&devWrong, sizeof(*devWrong)) != cudaSuccess)
        return fail("cudaMalloc (data check)");
      std::vector<cudaEvent_t>& ev = b.ev;
      // Every rank's allocations are done before any rank's kernel runs (a rank thread blocked in
      // the driver while its peers' kernels wait for it would stall them until the timeout).
      barrier.wait();
      const int iters = opt.iters;
      for (size_t bytes = opt.minBytes; bytes <= opt.maxBytes; bytes *= opt.step) {
        CollArgs a;
        a.coll = opt.coll;
        a.dtype = mkernel::coll::DataType::Float32;
        a.count = collCount(opt.coll, bytes, n);
        const size_t size = collBytes(opt.coll, a.count, n);
        a.sendbuff = send;
        a.recvbuff = recv;
        std::vector<CollArgs> grp(static_cast<size_t>(opt.group),
                                  a);  // --group: one enqueue of them
        const int ng = opt.group;
        for (int k = 0; k < ng; ++k) {
          grp[static_cast<size_t>(k)].sendbuff =
              static_cast<char*>(send) + groupWindow(std::max(bytes, size), k);
          grp[static_cast<size_t>(k)].recvbuff =
              static_cast<char*>(recv) + groupWindow(std::max(bytes, size), k);
        }
        // Warm-up (and the kernel launch) outside the timing.
        for (int i = 0; i < 10; ++i)
          if (comm->enqueue(grp.data(), ng, stream) != Result::Success) return fail("enqueue");
        cudaStreamSynchronize(stream);
        // Emulated nodes in turn (MKERNEL_HIER_OVERLAP=0): CTA 0's phase times over the timed loop.
        mkernel::coll::CollStats turn0;
        if (r == 0 && opt.ranksPerNode > 0) comm->stats(&turn0);
        barrier.wait();
        const auto hostStart = std::chrono::steady_clock::now();
        cudaEventRecord(ev[0], stream);
        for (int i = 0; i < iters; ++i) {
          if (comm->enqueue(grp.data(), ng, stream) != Result::Success) return fail("enqueue");
          cudaEventRecord(ev[static_cast<size_t>(i) + 1], stream);
        }
        const double hostUs =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - hostStart)
                .count() /
            iters / ng;
        cudaStreamSynchronize(stream);
        double stageUs[7] = {};
        double smGHz = 0;
        size_t traced = 0;
        if (opt.trace == 1 && r == 0) {
          std::vector<uint64_t> flat;
          if (comm->kernelTrace(&flat) != Result::Success) return fail("kernelTrace");
          traceStages(flat, static_cast<size_t>(iters), stageUs, &smGHz, &traced);
        }
        const std::vector<float> eager = perOp(intervals(ev, iters), ng);
        if (r == 0 && opt.ranksPerNode > 0) {
          // The phase times are sums over the loop, so the eager time they are set against is the
          // mean (scripts/overlap-table.py), printed for the pipelined runs too.
          mkernel::coll::CollStats turn1;
          comm->stats(&turn1);
          const uint64_t chunks = turn1.hierTurnChunks - turn0.hierTurnChunks;
          const double ops = static_cast<double>(iters) * ng;
          double mean = 0;
          for (float v : eager) mean += v;
          mean =
              mean * 1e3 / (eager.empty() ? 1.0 : static_cast<double>(eager.size()));  // ms -> us
          // CTA 0's waits, both modes: for the rail and at node barriers (DeviceState::hierWait).
          // Its own work by kind (DeviceState::hierBusy): copies and reductions, within device
          // memory / through its net buffers, and its posts to the proxy.
          double busy[mkernel::coll::kHierBusyKinds];
          for (int k = 0; k < mkernel::coll::kHierBusyKinds; ++k)
            busy[k] = (turn1.hierBusyNs[k] - turn0.hierBusyNs[k]) / 1e3 / ops;
          char waits[256];
          std::snprintf(waits, sizeof(waits),
                        "; waits: rail %.2f us, node %.2f us, role %.2f us per op; work: copy %.2f "
                        "/ %.2f net, reduce "
                        "%.2f / %.2f net, post %.2f us per op",
                        (turn1.hierWaitRailNs - turn0.hierWaitRailNs) / 1e3 / ops,
                        (turn1.hierWaitNodeNs - turn0.hierWaitNodeNs) / 1e3 / ops,
                        (turn1.hierWaitRoleNs - turn0.hierWaitRoleNs) / 1e3 / ops, busy[0], busy[1],
                        busy[2], busy[3], busy[4]);
          if (chunks > 0)
            std::printf(
                "# phases in turn, %d ranks, %zu B: eager mean %.2f us; node %.2f us, rail %.2f us "
                "per op (rank 0, "
                "CTA 0; %.1f chunks per op)%s\n",
                n, size, mean, (turn1.hierTurnNodeNs - turn0.hierTurnNodeNs) / 1e3 / ops,
                (turn1.hierTurnRailNs - turn0.hierTurnRailNs) / 1e3 / ops,
                static_cast<double>(chunks) / ops, waits);
          else
            std::printf("# hierarchical, %d ranks, %zu B: eager mean %.2f us (rank 0, CTA 0)%s\n",
                        n, size, mean, waits);
        }
        if (n == 1 && ng == 1 && bytes == opt.minBytes) {
          // One rank (issue 5's one-rank overhead): an enqueue's host time against the
          // cudaMemcpyAsync it makes (NCCL's one-rank path makes the same call), alternating on
          // this thread, one call at a time (a stream sync every 32, outside the timing).
          std::vector<float> enq, cpy;
          bool callsOk = true;
          for (int i = 0; i < 2000; ++i) {
            if (i % 32 == 0) cudaStreamSynchronize(stream);
            const auto t0 = std::chrono::steady_clock::now();
            callsOk = comm->enqueue(grp.data(), 1, stream) == Result::Success && callsOk;
            const auto t1 = std::chrono::steady_clock::now();
            callsOk = cudaMemcpyAsync(recv, send, a.count * 4, cudaMemcpyDeviceToDevice, stream) ==
                          cudaSuccess &&
                      callsOk;
            const auto t2 = std::chrono::steady_clock::now();
            enq.push_back(std::chrono::duration<float, std::micro>(t1 - t0).count());
            cpy.push_back(std::chrono::duration<float, std::micro>(t2 - t1).count());
          }
          cudaStreamSynchronize(stream);
          if (!callsOk) return fail("one-rank host split");
          std::printf(
              "# one rank (%s), %zu B: host us per call (median of 2000, alternating on one "
              "thread): enqueue %.2f, "
              "cudaMemcpyAsync %.2f\n",
              opt.mode.c_str(), a.count * 4, percentile(enq, 0.5), percentile(cpy, 0.5));
        }
        barrier.wait();
        // Graph: graphOps collectives with an event between each, replayed until >= iters samples.
        cudaGraph_t g = nullptr;
        cudaGraphExec_t ge = nullptr;
        cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
        cudaEventRecordWithFlags(ev[0], stream, cudaEventRecordExternal);
        bool capOk = true;
        for (int i = 0; i < opt.graphOps; ++i) {
          capOk = capOk && comm->enqueue(grp.data(), ng, stream) == Result::Success;
          cudaEventRecordWithFlags(ev[static_cast<size_t>(i) + 1], stream, cudaEventRecordExternal);
        }
        if (cudaStreamEndCapture(stream, &g) != cudaSuccess || !capOk) return fail("capture");
        if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) return fail("instantiate");
        cudaGraphLaunch(ge, stream);  // warm-up
        cudaStreamSynchronize(stream);
        barrier.wait();
        const std::vector<float> graph =
            perOp(replayGraph(ge, stream, ev, opt.graphOps, iters), ng);
        cudaGraphExecDestroy(ge);
        cudaGraphDestroy(g);
        // --trace 2: graphOps collectives back to back, no event between them, replayed; the
        // kernel traces these captured ops (MKERNEL_KERNEL_TRACE=2).
        double graphRunUs = 0;
        if (opt.trace >= 2) {
          cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
          for (int i = 0; i < opt.graphOps; ++i)
            capOk = capOk && comm->enqueue(grp.data(), ng, stream) == Result::Success;
          if (cudaStreamEndCapture(stream, &g) != cudaSuccess || !capOk)
            return fail("capture (trace 2)");
          if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) return fail("instantiate (trace 2)");
          cudaGraphLaunch(ge, stream);  // warm-up
          cudaStreamSynchronize(stream);
          barrier.wait();
          const int replays = std::max(1, iters / opt.graphOps);
          cudaEventRecord(ev[0], stream);
          for (int k = 0; k < replays; ++k) cudaGraphLaunch(ge, stream);
          cudaEventRecord(ev[1], stream);
          cudaStreamSynchronize(stream);
          float ms = 0;
          cudaEventElapsedTime(&ms, ev[0], ev[1]);
          graphRunUs = 1000.0 * ms / (static_cast<double>(replays) * opt.graphOps * ng);
          cudaGraphExecDestroy(ge);
          cudaGraphDestroy(g);
          std::vector<uint64_t> flat;
          if (comm->kernelTrace(&flat) != Result::Success) return fail("kernelTrace");
          traceStages(flat, static_cast<size_t>(replays * opt.graphOps), stageUs, &smGHz, &traced);
          if (r != 0) {  // the other ranks' traces here, rank 0's in the table
            std::lock_guard<std::mutex> lock(mu);
            std::printf(
                "# graph trace, rank %d, %zu B: load %.3f start %.3f move %.3f end %.3f report "
                "%.3f kernel %.3f gap %.2f\n",
                r, a.count * 4, stageUs[0], stageUs[1], stageUs[2], stageUs[3], stageUs[4],
                stageUs[6], stageUs[5]);
          }
        }
        if (comm->asyncError() != Result::Success) return fail("asyncError");
        // The data check, one collective (op 0's window) after the timed ones.
        {
          const int64_t w =
              dataCheck(comm.get(), grp[0], n, r, stream, devWrong, [&] { barrier.wait(); });
          if (w < 0)
            unchecked = true;
          else
            wrongSum += w;
        }
        barrier.wait();
        if (r == 0) {
          Row row = makeRow(opt.mode, n, size, eager, graph, hostUs, copyGBps, opt.coll);
          row.wrong = unchecked ? -1 : wrongSum.load();
          wrongSum = 0;
          unchecked = false;
          for (int k = 0; k < 7; ++k) row.stageUs[k] = stageUs[k];
          row.smGHz = smGHz;
          row.traced = traced;
          row.graphRunUs = graphRunUs;
          rows->push_back(row);
          std::fprintf(stderr,
                       "collbench: %s %d ranks %12zu B  eager %9.2f us  graph %9.2f us  host %7.2f "
                       "us/op  %8.1f GB/s\n",
                       row.wait.c_str(), n, row.bytes, row.eagerMed, row.graphMed, row.hostUs,
                       row.memGBps);
        }
        barrier.wait();
      }
      for (auto& e : ev) cudaEventDestroy(e);
      cudaStreamSynchronize(stream);
      if (comm->finalize() != Result::Success) fail("finalize");
      cudaFree(send);
      cudaFree(recv);
      cudaFree(devWrong);
      cudaStreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  return ok;
}

// nccl-tests' bus bandwidth factor for collective c over n ranks (its busBw computations).
double busBwFactor(mkernel::coll::CollType c, int n) {
  using mkernel::coll::CollType;
  const double dn = static_cast<double>(n);
  switch (c) {
    case CollType::AllReduce:
      return 2.0 * (dn - 1) / dn;
    case CollType::ReduceScatter:
    case CollType::AllGather:
      return (dn - 1) / dn;
    default:
      return 1.0;  // Broadcast, Reduce
  }
}

// The NCCL row of the same size and rank count, if --nccl measured one.
const Row* ncclRowFor(const std::vector<Row>& rows, const Row& mk) {
  for (const Row& r : rows)
    if (r.wait.rfind("nccl", 0) == 0 && r.ranks == mk.ranks && r.bytes == mk.bytes) return &r;
  return nullptr;
}

// A CSV field: quoted when it holds a comma, a quote or a line break.
std::string csvField(const std::string& v) {
  if (v.find_first_of(",\"\n") == std::string::npos) return v;
  std::string q = "\"";
  for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

// The mkernel rows in nccl-tests' columns (size, count, type, redop, time, algbw, busbw, #wrong),
// then the path that ran them and, with --nccl, NCCL's time for the same size and the ratio
// mkernel / NCCL (below 1: mkernel faster). Time: the eager median.
void printNcclTestsTable(const Options& opt, const std::vector<Row>& rows) {
  using mkernel::coll::CollType;
  const bool reduces = opt.coll != CollType::Broadcast && opt.coll != CollType::AllGather;
  std::printf(
      "# nccl-tests columns (%s; time: eager median; busbw = algbw x %s; ratio = mkernel / NCCL)\n",
      mkernel::coll::collName(opt.coll),
      opt.coll == CollType::AllReduce                                          ? "2(n-1)/n"
      : opt.coll == CollType::ReduceScatter || opt.coll == CollType::AllGather ? "(n-1)/n"
                                                                               : "1");
  std::printf("#%11s %12s %8s %6s %5s %7s %9s %8s %8s %7s %10s %8s\n", "size", "count", "type",
              "redop", "ranks", "path", "time", "algbw", "busbw", "#wrong", "nccl_time", "ratio");
  std::printf("#%11s %12s %8s %6s %5s %7s %9s %8s %8s %7s %10s %8s\n", "(B)", "(elements)", "", "",
              "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "");
  for (const Row& r : rows) {
    if (r.wait.rfind("nccl", 0) == 0) continue;
    const double algbw = r.eagerMed > 0 ? static_cast<double>(r.bytes) / 1e3 / r.eagerMed : 0;
    const double busbw = algbw * busBwFactor(opt.coll, r.ranks);
    const Row* nccl = ncclRowFor(rows, r);
    char wrong[24], ncclUs[24], ratio[24];
    std::snprintf(wrong, sizeof wrong, r.wrong < 0 ? "N/A" : "%lld",
                  static_cast<long long>(r.wrong));
    std::snprintf(ncclUs, sizeof ncclUs, nccl ? "%.2f" : "N/A", nccl ? nccl->eagerMed : 0.0);
    std::snprintf(ratio, sizeof ratio, nccl && nccl->eagerMed > 0 ? "%.2f" : "N/A",
                  nccl && nccl->eagerMed > 0 ? r.eagerMed / nccl->eagerMed : 0.0);
    std::printf("%12zu %12zu %8s %6s %5d %7s %9.2f %8.2f %8.2f %7s %10s %8s\n", r.bytes,
                r.bytes / 4, "float", reduces ? "sum" : "none", r.ranks, r.wait.c_str(), r.eagerMed,
                algbw, busbw, wrong, ncclUs, ratio);
  }
}

// --results: the same rows appended as CSV, the header first when the file is new or empty.
bool appendResults(const Options& opt, const std::vector<Row>& rows, const std::string& machine) {
  FILE* f = std::fopen(opt.results.c_str(), "a");
  if (f == nullptr) return false;
  std::fseek(f, 0, SEEK_END);
  if (std::ftell(f) == 0)
    std::fprintf(f,
                 "date,machine,commit,command,collective,size_bytes,ranks,mkernel_us,nccl_us,ratio,"
                 "busbw_gbs,wrong,path\n");
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  for (const Row& r : rows) {
    if (r.wait.rfind("nccl", 0) == 0) continue;
    const Row* nccl = ncclRowFor(rows, r);
    const double algbw = r.eagerMed > 0 ? static_cast<double>(r.bytes) / 1e3 / r.eagerMed : 0;
    std::string ncclUs, ratio, wrong;
    if (nccl) ncclUs = std::to_string(nccl->eagerMed);
    if (nccl && nccl->eagerMed > 0) ratio = std::to_string(r.eagerMed / nccl->eagerMed);
    if (r.wrong >= 0) wrong = std::to_string(r.wrong);
    std::fprintf(f, "%s,%s,%s,%s,%s,%zu,%d,%.3f,%s,%s,%.3f,%s,%s\n", date,
                 csvField(machine).c_str(), csvField(opt.commit).c_str(),
                 csvField(opt.command).c_str(), mkernel::coll::collName(opt.coll), r.bytes, r.ranks,
                 r.eagerMed, ncclUs.c_str(), ratio.c_str(), algbw * busBwFactor(opt.coll, r.ranks),
                 wrong.c_str(), csvField(r.wait).c_str());
  }
  return std::fclose(f) == 0;
}

// The command line into *opt. -1: run; otherwise the exit status (tools/cli.h).
int parseOptions(int argc, char** argv, Options* opt) {
  CLI::App app(
      "AllReduce (or, --coll, another collective) through mkernel, N thread ranks on one GPU "
      "(emulated) or\n"
      "spread over several (--gpus), optionally beside the real NCCL (--nccl, AllReduce only): "
      "per-op latency\n"
      "(median, p99), eager and replayed from a CUDA graph, and memory bandwidth. Progress on "
      "stderr, table on\n"
      "stdout.",
      "mkernel-collbench");
  mktools::setupApp(app);
  std::string coll = "allreduce";
  mktools::listOf(app.add_option("--ranks", opt->ranks, "rank counts, one run each"))
      ->check(mktools::kPositive)
      ->default_str("2,4,8");
  app.add_option("--min-bytes", opt->minBytes, "smallest size (nccl-tests' size; K, M, G accepted)")
      ->transform(mktools::kSize)
      ->capture_default_str();
  app.add_option("--max-bytes", opt->maxBytes, "largest size")
      ->transform(mktools::kSize)
      ->capture_default_str();
  app.add_option("--step", opt->step, "size multiplier from one row to the next")
      ->check(CLI::Range(2, 1 << 20))
      ->capture_default_str();
  app.add_option("--iters", opt->iters, "timed collectives per size")
      ->check(mktools::kPositive)
      ->capture_default_str();
  mktools::listOf(app.add_option("--wait", opt->waits, "paths to compare: launch, memop, kernel"))
      ->check(CLI::IsMember({"launch", "memop", "kernel"}))
      ->default_str("launch,memop");
  app.add_option("--trace", opt->trace,
                 "1: where an eager collective's time goes (MKERNEL_KERNEL_TRACE=1); 2: a captured "
                 "one's; 3: also the "
                 "LL kernel's receive")
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  app.add_option("--nccl", opt->nccl,
                 "the real NCCL's AllReduce in the same run (e.g. libnccl.so.2)")
      ->type_name("LIB");
  app.add_option("--gpus", opt->gpus, "rank r runs on GPU r % N (1: every rank on GPU 0, emulated)")
      ->check(mktools::kPositive)
      ->capture_default_str();
  app.add_option("--ranks-per-node", opt->ranksPerNode,
                 "emulated nodes of K ranks, every collective through the hierarchical path and "
                 "the proxies "
                 "(set MKERNEL_SOCKET_IFNAME=lo); MKERNEL_HIER_OVERLAP=0 runs its phases in turn")
      ->check(mktools::kNonNegative)
      ->type_name("K");
  app.add_option("--group", opt->group,
                 "every timed call a group of K AllReduces (NCCL: ncclGroupStart/End; mkernel: one "
                 "enqueue, "
                 "MKERNEL_LL_BATCH), times per collective")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  app.add_option("--sync", opt->sync,
                 "how rank threads wait for their streams "
                 "(cudaDeviceScheduleSpin/Yield/BlockingSync; default: CUDA's "
                 "choice)")
      ->check(CLI::IsMember({"spin", "yield", "blocking"}));
  app.add_option("--coll", coll,
                 "the collective timed (float sum, root 0); bytes are nccl-tests' size "
                 "(ReduceScatter: the send buffer, "
                 "AllGather: the receive buffer)")
      ->check(CLI::IsMember({"allreduce", "reducescatter", "allgather", "broadcast", "reduce"}))
      ->capture_default_str();
  app.add_option("--csv", opt->csv, "also write the rows as CSV")->type_name("FILE");
  app.add_option("--results", opt->results,
                 "append the nccl-tests-column rows to FILE as CSV (date, machine, commit, "
                 "command, collective, "
                 "size_bytes, ranks, mkernel_us, nccl_us, ratio, busbw_gbs, wrong, path), e.g. "
                 "docs/results/collbench.csv")
      ->type_name("FILE");
  app.add_option("--commit", opt->commit, "the commit recorded in --results rows")
      ->capture_default_str();
  const int rc = mktools::parseArgs(app, argc, argv);
  if (rc >= 0) return rc;
  for (int i = 0; i < argc; ++i) opt->command += (i ? " " : "") + std::string(argv[i]);
  using mkernel::coll::CollType;
  opt->coll = coll == "reducescatter" ? CollType::ReduceScatter
              : coll == "allgather"   ? CollType::AllGather
              : coll == "broadcast"   ? CollType::Broadcast
              : coll == "reduce"      ? CollType::Reduce
                                      : CollType::AllReduce;
  if (opt->coll != CollType::AllReduce && !opt->nccl.empty())
    return mktools::usageError(app, "--nccl compares AllReduce only (--coll allreduce)");
  if (opt->minBytes < 1 || opt->maxBytes < opt->minBytes)
    return mktools::usageError(app, "want 1 <= --min-bytes <= --max-bytes");
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  const int rc = parseOptions(argc, argv, &opt);
  if (rc >= 0) return rc;
  if (opt.trace) setenv("MKERNEL_KERNEL_TRACE", std::to_string(opt.trace).c_str(), 1);
  setenv("MKERNEL_SOCKET_IFNAME", "lo", 0);
  // 2 streams per rank (caller + internal): more hardware queues than CUDA's default 8, so that a
  // stream waiting on its doorbell does not hold up another rank's post (before any CUDA call).
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  int nDev = 0;
  if (cudaGetDeviceCount(&nDev) != cudaSuccess || nDev == 0) {
    std::fprintf(stderr, "mkernel-collbench: no CUDA device\n");
    return 1;
  }
  if (opt.gpus > nDev) {
    std::fprintf(stderr, "mkernel-collbench: --gpus %d but this machine has %d\n", opt.gpus, nDev);
    return 1;
  }
  if (!opt.sync.empty()) {
    const unsigned flag = opt.sync == "spin"    ? cudaDeviceScheduleSpin
                          : opt.sync == "yield" ? cudaDeviceScheduleYield
                                                : cudaDeviceScheduleBlockingSync;
    for (int d = 0; d < nDev; ++d) {
      cudaSetDevice(d);
      if (cudaSetDeviceFlags(flag) != cudaSuccess) {
        std::fprintf(stderr, "mkernel-collbench: --sync %s: cudaSetDeviceFlags on GPU %d: %s\n",
                     opt.sync.c_str(), d, cudaGetErrorString(cudaGetLastError()));
        return 1;
      }
    }
    std::fprintf(stderr, "collbench: rank threads wait for their streams with --sync %s\n",
                 opt.sync.c_str());
  }
  cudaSetDevice(0);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  const double copyGBps = copyBandwidthGBps(std::min<size_t>(opt.maxBytes, size_t(1) << 30));
  std::fprintf(stderr, "collbench: %s, %d SMs, cudaMemcpy D2D %.0f GB/s (read + write)\n",
               prop.name, prop.multiProcessorCount, copyGBps);
  double launchUs = 0, pairUs = 0, memopUs = 0;
  if (mkernel::cudrv::loadMemOps() == Result::Success)
    baselines(opt.iters, &launchUs, &pairUs, &memopUs);
  // Every size captures graphOps collectives into a graph, and each captured group holds one of
  // the communicator's 192 graph slots for good: spread them over the sizes.
  int nSizes = 0;
  for (size_t b = opt.minBytes; b <= opt.maxBytes; b *= opt.step) ++nSizes;
  opt.graphOps = std::max(1, std::min(opt.graphOps, 190 / std::max(1, nSizes)));
  std::vector<Row> rows;
  bool ok = true;
  struct {
    std::string launchMax;  // the caller's MKERNEL_LAUNCH_MAX_BYTES, for the launch rows
  } saved;
  if (const char* v = std::getenv("MKERNEL_LAUNCH_MAX_BYTES")) saved.launchMax = v;
  // NCCL first: its communicator is created and destroyed before any of mkernel's.
  if (!opt.nccl.empty()) ok = runNccl(opt, copyGBps, &rows) && ok;
  for (const std::string& w : opt.waits) {
    Options o = opt;
    o.mode = w;
    if (w == "launch") {
      setenv("MKERNEL_STREAM_WAIT", "memop", 1);
      if (saved.launchMax.empty())
        unsetenv("MKERNEL_LAUNCH_MAX_BYTES");
      else
        setenv("MKERNEL_LAUNCH_MAX_BYTES", saved.launchMax.c_str(), 1);
      // Thread ranks: above the inbox threshold the launch path's direct mode takes every size,
      // unless MKERNEL_LAUNCH_DIRECT=0.
      if (mkernel::paramInt("LAUNCH_DIRECT", 1) == 0)
        o.maxBytes = std::min<size_t>(
            o.maxBytes, static_cast<size_t>(mkernel::paramInt("LAUNCH_MAX_BYTES", 1048576)));
      if (o.maxBytes < o.minBytes) continue;
    } else if (w == "memop" || w == "kernel") {
      setenv("MKERNEL_STREAM_WAIT", w.c_str(), 1);
      setenv("MKERNEL_LAUNCH_MAX_BYTES", "0", 1);
    }
    for (int n : opt.ranks) ok = runRanks(n, o, copyGBps, &rows) && ok;
  }
  std::printf("# %s float sum, thread ranks on %d x %s (%s); D2D copy %.0f GB/s\n",
              mkernel::coll::collName(opt.coll), opt.gpus, prop.name,
              opt.gpus == 1 ? "every rank on GPU 0: emulated" : "rank r on GPU r % gpus", copyGBps);
  if (opt.group > 1)
    std::printf(
        "# --group %d: each timed call a group of %d AllReduces, each on its own window of the "
        "buffers; "
        "times per collective\n",
        opt.group, opt.group);
  if (!opt.nccl.empty())
    std::printf(
        "# NCCL rows: one rank per GPU, each driven by its own thread, as the mkernel rows' "
        "ranks\n");
  std::printf(
      "# mem GB/s = %s * bytes / eager median (each input read once, each output written once)\n",
      opt.coll == mkernel::coll::CollType::AllReduce ? "2 * ranks" : "(ranks + 1)");
  std::printf(
      "# floors, one stream: empty kernel launch %.2f us/op, memop pair (write, wait) %.2f us/op, "
      "memop triple (write, wait, write) %.2f us/op\n",
      launchUs, pairUs, memopUs);
  {
    const HostCosts h = hostCosts(2000, opt.gpus);
    std::printf(
        "# host us per call (median of 2000, one at a time): empty kernel launch %.2f, launch with "
        "a 640-byte "
        "argument %.2f, cudaEventRecord %.2f, cudaStreamIsCapturing %.2f, cudaSetDevice (same) "
        "%.2f, "
        "cudaMemcpyAsync 8 B D2D %.2f",
        h.launchUs, h.bigLaunchUs, h.recordUs, h.capturingUs, h.setSameUs, h.copyUs);
    if (opt.gpus > 1) std::printf(", cudaSetDevice (alternating) %.2f", h.setOtherUs);
    std::printf("\n");
  }
  if (opt.gpus == 1) {
    // Several thread ranks on one GPU: what n threads calling the driver at once cost per round.
    const struct {
      FloorKind kind;
      const char* what;
    } kinds[] = {
        {kFloorLaunch, "each launching an empty kernel on its own stream"},
        {kFloorRecord, "each recording an event on its own stream"},
        {kFloorFused,
         "a fused launch's calls (each records, one waits for all and launches, all wait for it)"},
        {kFloorBarrier, "no CUDA call (the barrier alone)"}};
    for (const auto& k : kinds) {
      std::string floors;
      for (int n : opt.ranks) {
        if (n < 2) continue;
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s%d: %.2f", floors.empty() ? "" : ", ", n,
                      threadFloorUs(n, 2000, k.kind));
        floors += buf;
      }
      if (!floors.empty())
        std::printf("# floors, n threads %s, in step: us per round for n = %s\n", k.what,
                    floors.c_str());
    }
  }
  std::printf("# host_us = rank 0's host time per eager enqueue; latencies in us\n");
  std::printf("%10s %5s %12s %10s %10s %10s %10s %8s %10s %7s\n", "wait", "ranks", "bytes",
              "eager_med", "eager_p99", "graph_med", "graph_p99", "host_us", "mem_GB/s", "%copy");
  for (const Row& r : rows)
    std::printf("%10s %5d %12zu %10.2f %10.2f %10.2f %10.2f %8.2f %10.1f %7.1f\n", r.wait.c_str(),
                r.ranks, r.bytes, r.eagerMed, r.eagerP99, r.graphMed, r.graphP99, r.hostUs,
                r.memGBps, r.pctCopy);
  if (opt.trace) {
    if (opt.trace >= 2)
      std::printf(
          "# --trace %d: the trace of captured collectives, %d back to back per graph, no event "
          "between them;\n"
          "# graph_run = their time per op (CUDA events around the replays)%s\n",
          opt.trace, opt.graphOps,
          opt.trace == 3 ? ";\n# --trace 3 (the LL kernel's receive): columns load..report = "
                           "start->receive begun,\n"
                           "# ->first poll answered, ->line taken, ->combined and stored, ->end"
                         : "");
    std::printf(
        "# kernel trace (rank 0, CTA 0, medians in us over the %s loop): seen->loaded, "
        "loaded->start barrier,\n"
        "# start barrier->data moved, moved->end barrier, end barrier->reported, seen->reported "
        "(SM cycles at\n"
        "# the clock sm_GHz the records show), reported->next group seen (%%globaltimer); the "
        "launch kernel's\n"
        "# columns: start->pushed (LL mode), ->set up, ->received, ->peers' tokens, ->end\n",
        opt.trace >= 2 ? "graph" : "eager");
    std::printf("%10s %5s %12s %8s %8s %8s %8s %8s %8s %8s %7s %7s %9s\n", "wait", "ranks", "bytes",
                "load", "start", "move", "end", "report", "kernel", "gap", "sm_GHz", "groups",
                "graph_run");
    for (const Row& r : rows)
      std::printf("%10s %5d %12zu %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.2f %7.3f %7zu %9.2f\n",
                  r.wait.c_str(), r.ranks, r.bytes, r.stageUs[0], r.stageUs[1], r.stageUs[2],
                  r.stageUs[3], r.stageUs[4], r.stageUs[6], r.stageUs[5], r.smGHz, r.traced,
                  r.graphRunUs);
  }
  printNcclTestsTable(opt, rows);
  if (!opt.results.empty()) {
    const std::string machine = std::to_string(nDev) + " x " + prop.name;
    if (!appendResults(opt, rows, machine)) {
      std::fprintf(stderr, "mkernel-collbench: cannot append to %s\n", opt.results.c_str());
      ok = false;
    } else {
      std::fprintf(stderr, "collbench: rows appended to %s\n", opt.results.c_str());
    }
  }
  if (!opt.csv.empty()) {
    FILE* f = std::fopen(opt.csv.c_str(), "w");
    if (f) {
      std::fprintf(f,
                   "wait,ranks,bytes,eager_med_us,eager_p99_us,graph_med_us,graph_p99_us,host_us,"
                   "mem_GBps,pct_copy,copy_GBps\n");
      for (const Row& r : rows)
        std::fprintf(f, "%s,%d,%zu,%.3f,%.3f,%.3f,%.3f,%.3f,%.2f,%.2f,%.1f\n", r.wait.c_str(),
                     r.ranks, r.bytes, r.eagerMed, r.eagerP99, r.graphMed, r.graphP99, r.hostUs,
                     r.memGBps, r.pctCopy, copyGBps);
      std::fclose(f);
    }
  }
  return ok ? 0 : 1;
}
