// mkernel-queueprobe: can kernels that wait for each other, launched by several host threads of
// one process on one GPU, each on its own stream, all run at once? Thread-emulated ranks need
// exactly that (docs/KERNEL.md, "Emulated ranks as threads"); patched nccl-tests with 4 thread
// ranks stalled at its first collective (docs/RELIABILITY.md).
//
// Each round, N threads pass a host barrier and each launches `meet` (one CTA: store my flag, wait
// until every rank's flag holds this round's number, or give up after --timeout-ms) on its
// stream, then synchronizes it. A round stalls when any kernel gave up. Stream variants:
//   fresh    new non-blocking streams every round, created one after another by the main thread
//   touched  as fresh, then the main thread records an event on each stream in turn (the
//            stream's first work, submitted in host order) before the threads launch
//   kernel   as fresh, then the main thread runs an empty kernel on each stream and waits
//   own      every thread creates its stream itself, at the same time as the others
//   reused   streams made once (fresh) and used by every round
//   foreign  as fresh, but the streams are made (and polled for completion, in a cudaStreamQuery
//            loop, as nccl-tests does) by a second CUDA runtime, the shared libcudart.so that
//            an application links, while this program's static runtime launches the kernels:
//            the situation of libmkernel.so (static runtime) inside nccl-tests
// --gaps G1,G2,...: before the rank streams, the main thread makes G streams that stay alive
// for the round (so the rank streams come later in the context's order of streams); --strides
// S1,...: S-1 such streams between consecutive rank streams. Both apply to every variant but own.
// --kernel mkernel: the waiting kernel shaped like mkernel's launch-path kernel (static shared
// memory, the other threads at a barrier, a host-mapped word polled while waiting).
// --after record|kernel: every thread queues a command on its stream right after its kernel: an
// event record or an empty
// kernel (the application's next op): does a command that must wait for a waiting kernel hold
// back, behind it in a shared hardware queue, another stream's kernel? (none: nothing after
// the kernel, the default.)
// --stagger-us U: rank r sleeps r x U microseconds after the common start before launching, so
// that each rank's commands reach the GPU before the next rank's (as rank threads that arrive
// at a collective at different times).
// --fence: every thread waits at a host barrier, once all ranks' kernels are launched, before it
// queues the --after command: the rule mkernel follows for ranks sharing a GPU (nothing that
// waits for a collective's end is queued before every co-located rank has queued its start).
// Prints a table: variant, ranks, gap, stride, rounds, stalled rounds, median round time.
//   mkernel-queueprobe [--ranks 2,4,8] [--rounds 50] [--timeout-ms 200] [--variants
//   fresh,touched,...]
//                      [--gaps 0] [--strides 1] [--kernel plain|mkernel] [--after
//                      none|record|kernel]
//                      [--stagger-us 0] [--fence]
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/check.h"
#include "tools/cli.h"
#include "tools/dev/probe_util.cuh"

namespace {

using mktools::globalNs;

// Rank `me` of n: publishes `epoch`, then waits for every rank's flag to reach it. 256 threads,
// one CTA, like a launch-path op of mkernel; thread 0 does the exchange.
__global__ void __launch_bounds__(256, 1) meet(unsigned* flags, int n, int me, unsigned epoch,
                                               unsigned long long timeoutNs, unsigned* gaveUp) {
  if (threadIdx.x != 0) return;
  volatile unsigned* f = flags;
  __threadfence_system();
  f[me] = epoch;
  __threadfence_system();
  const unsigned long long t0 = globalNs();
  for (int k = 0; k < n; ++k) {
    while (f[k] < epoch) {
      if (globalNs() - t0 > timeoutNs) {
        atomicAdd(gaveUp, 1u);
        return;
      }
    }
  }
}

// The same exchange shaped like mkernel's launch-path kernel: static shared memory written by
// every thread, the CTA's other threads waiting at a barrier, and a host-mapped word polled in
// the wait (mkernel's stop flag).
__global__ void __launch_bounds__(256, 1)
    meetLike(unsigned* flags, int n, int me, unsigned epoch, unsigned long long timeoutNs,
             unsigned* gaveUp, const volatile unsigned* hostStop) {
  __shared__ volatile unsigned sh[384];
  for (int i = threadIdx.x; i < 384; i += blockDim.x) sh[i] = epoch + i;
  __syncthreads();
  bool ok = true;
  if (threadIdx.x == 0) {
    volatile unsigned* f = flags;
    __threadfence_system();
    f[me] = epoch;
    __threadfence_system();
    const unsigned long long t0 = globalNs();
    for (int k = 0; k < n && ok; ++k) {
      while (f[k] < epoch) {
        if (*hostStop != 0 || globalNs() - t0 > timeoutNs) {
          atomicAdd(gaveUp, 1u);
          ok = false;
          break;
        }
      }
    }
  }
  if (!__syncthreads_and(ok)) return;
  if (sh[threadIdx.x] != epoch + threadIdx.x) atomicAdd(gaveUp, 1u);
}

__global__ void empty() {}

// A reusable spinning barrier for the rank threads and the main thread.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void wait() {
    const int gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_acq_rel);
    } else {
      while (gen_.load(std::memory_order_acquire) == gen) std::this_thread::yield();
    }
  }

 private:
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<int> gen_{0};
};

// The application's CUDA runtime (a second instance beside this program's static one).
struct ForeignRuntime {
  cudaError_t (*setDevice)(int) = nullptr;
  cudaError_t (*streamCreate)(cudaStream_t*, unsigned) = nullptr;
  cudaError_t (*streamDestroy)(cudaStream_t) = nullptr;
  cudaError_t (*streamQuery)(cudaStream_t) = nullptr;
  bool load() {
    void* h = nullptr;
    for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"})
      if ((h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    if (h == nullptr) return false;
    setDevice = reinterpret_cast<decltype(setDevice)>(dlsym(h, "cudaSetDevice"));
    streamCreate = reinterpret_cast<decltype(streamCreate)>(dlsym(h, "cudaStreamCreateWithFlags"));
    streamDestroy = reinterpret_cast<decltype(streamDestroy)>(dlsym(h, "cudaStreamDestroy"));
    streamQuery = reinterpret_cast<decltype(streamQuery)>(dlsym(h, "cudaStreamQuery"));
    return setDevice && streamCreate && streamDestroy && streamQuery;
  }
};
ForeignRuntime gForeign;
enum class After { None, Record, Kernel };
After gAfter = After::None;  // --after
unsigned gStaggerUs = 0;     // --stagger-us
bool gFence = false;         // --fence

struct Row {
  std::string variant;
  int ranks = 0, gap = 0, stride = 1, rounds = 0, stalled = 0;
  double medianMs = 0;
};

Row probe(const std::string& variant, int n, int gap, int stride, int rounds,
          unsigned long long timeoutNs, bool like) {
  unsigned* flags = nullptr;
  unsigned* gaveUp = nullptr;
  MK_CUDA_OR_EXIT(cudaMalloc(&flags, sizeof(unsigned) * n));
  MK_CUDA_OR_EXIT(cudaMemset(flags, 0, sizeof(unsigned) * n));
  MK_CUDA_OR_EXIT(cudaMallocManaged(&gaveUp, sizeof(unsigned)));
  *gaveUp = 0;
  unsigned* hostStop = nullptr;
  MK_CUDA_OR_EXIT(
      cudaHostAlloc(&hostStop, sizeof(unsigned), cudaHostAllocMapped | cudaHostAllocPortable));
  *hostStop = 0;
  unsigned* hostStopDev = nullptr;
  MK_CUDA_OR_EXIT(cudaHostGetDevicePointer(&hostStopDev, hostStop, 0));
  MK_CUDA_OR_EXIT(cudaDeviceSynchronize());
  std::vector<cudaStream_t> streams(static_cast<size_t>(n), nullptr);
  std::vector<cudaStream_t> fillers;
  auto filler = [&] {
    cudaStream_t f = nullptr;
    MK_CUDA_OR_EXIT(cudaStreamCreateWithFlags(&f, cudaStreamNonBlocking));
    fillers.push_back(f);
  };
  const bool foreign = variant == "foreign";
  if (foreign) MK_CUDA_OR_EXIT(gForeign.setDevice(0));
  auto makeStreams = [&] {
    for (int g = 0; g < gap; ++g) filler();
    for (size_t k = 0; k < streams.size(); ++k) {
      if (k > 0)
        for (int f = 1; f < stride; ++f) filler();
      if (foreign) {
        MK_CUDA_OR_EXIT(gForeign.streamCreate(&streams[k], cudaStreamNonBlocking));
      } else {
        MK_CUDA_OR_EXIT(cudaStreamCreateWithFlags(&streams[k], cudaStreamNonBlocking));
      }
    }
  };
  auto dropStreams = [&] {
    for (auto& s : streams) {
      if (s != nullptr) MK_CUDA_OR_EXIT(foreign ? gForeign.streamDestroy(s) : cudaStreamDestroy(s));
      s = nullptr;
    }
    for (auto f : fillers) MK_CUDA_OR_EXIT(cudaStreamDestroy(f));
    fillers.clear();
  };
  if (variant == "reused") makeStreams();
  cudaEvent_t ev;
  MK_CUDA_OR_EXIT(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));

  SpinBarrier start(n + 1), done(n + 1), launched(n);
  std::atomic<bool> quit{false};
  std::atomic<unsigned> epoch{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      MK_CUDA_OR_EXIT(cudaSetDevice(0));
      if (foreign) MK_CUDA_OR_EXIT(gForeign.setDevice(0));
      cudaEvent_t after = nullptr;
      if (gAfter == After::Record)
        MK_CUDA_OR_EXIT(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
      for (;;) {
        start.wait();
        if (quit.load()) {
          if (after != nullptr) MK_CUDA_OR_EXIT(cudaEventDestroy(after));
          return;
        }
        cudaStream_t& s = streams[static_cast<size_t>(r)];
        if (variant == "own") MK_CUDA_OR_EXIT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        if (gStaggerUs > 0)
          std::this_thread::sleep_for(
              std::chrono::microseconds(static_cast<long long>(r) * gStaggerUs));
        if (like) {
          meetLike<<<1, 256, 0, s>>>(flags, n, r, epoch.load(), timeoutNs, gaveUp, hostStopDev);
        } else {
          meet<<<1, 256, 0, s>>>(flags, n, r, epoch.load(), timeoutNs, gaveUp);
        }
        MK_CUDA_OR_EXIT(cudaGetLastError());
        if (gFence) launched.wait();
        if (after != nullptr) MK_CUDA_OR_EXIT(cudaEventRecord(after, s));
        if (gAfter == After::Kernel) {
          empty<<<1, 1, 0, s>>>();
          MK_CUDA_OR_EXIT(cudaGetLastError());
        }
        if (foreign) {
          cudaError_t q;
          while ((q = gForeign.streamQuery(s)) == cudaErrorNotReady) std::this_thread::yield();
          MK_CUDA_OR_EXIT(q);
        } else {
          MK_CUDA_OR_EXIT(cudaStreamSynchronize(s));
        }
        done.wait();
      }
    });
  }
  Row row{variant, n, gap, stride, rounds, 0, 0.0};
  std::vector<double> ms;
  for (int k = 1; k <= rounds; ++k) {
    if (variant == "fresh" || variant == "touched" || variant == "kernel" || foreign) makeStreams();
    if (variant == "touched")
      for (auto s : streams) MK_CUDA_OR_EXIT(cudaEventRecord(ev, s));
    if (variant == "kernel") {
      for (auto s : streams) empty<<<1, 1, 0, s>>>();
      MK_CUDA_OR_EXIT(cudaDeviceSynchronize());
    }
    epoch.store(static_cast<unsigned>(k));
    const unsigned before = *gaveUp;
    const auto t0 = std::chrono::steady_clock::now();
    start.wait();
    done.wait();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (*gaveUp != before) ++row.stalled;
    if (variant != "reused") dropStreams();
  }
  quit.store(true);
  start.wait();
  for (auto& t : threads) t.join();
  dropStreams();
  std::sort(ms.begin(), ms.end());
  row.medianMs = ms.empty() ? 0 : ms[ms.size() / 2];
  MK_CUDA_OR_EXIT(cudaEventDestroy(ev));
  MK_CUDA_OR_EXIT(cudaFree(flags));
  MK_CUDA_OR_EXIT(cudaFree(gaveUp));
  MK_CUDA_OR_EXIT(cudaFreeHost(hostStop));
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ranks = {2, 4, 8};
  int rounds = 50;
  unsigned long long timeoutMs = 200;
  std::vector<std::string> variants = {"fresh", "touched", "kernel", "own", "reused"};
  std::vector<int> gaps = {0}, strides = {1};
  bool like = false;
  std::string kernel = "plain", after = "none";
  CLI::App app(
      "Whether kernels that wait for each other, launched by several threads of one process on one "
      "GPU\n"
      "(thread-emulated ranks), all run at once, per way of making the streams.",
      "mkernel-queueprobe");
  mktools::setupApp(app);
  mktools::listOf(app.add_option("--ranks", ranks, "thread counts, one row each"))
      ->check(mktools::kPositive)
      ->default_str("2,4,8");
  app.add_option("--rounds", rounds, "rounds per row")
      ->check(mktools::kPositive)
      ->capture_default_str();
  app.add_option("--timeout-ms", timeoutMs, "a round not done by then stalled")
      ->check(mktools::kPositive)
      ->capture_default_str();
  mktools::listOf(app.add_option("--variants", variants, "ways of making the streams"))
      ->check(CLI::IsMember({"fresh", "touched", "kernel", "own", "reused", "foreign"}))
      ->default_str("fresh,touched,kernel,own,reused");
  mktools::listOf(app.add_option("--gaps", gaps, "G: streams made before the rank streams"))
      ->check(mktools::kNonNegative)
      ->default_str("0");
  mktools::listOf(
      app.add_option("--strides", strides, "S: S-1 streams between consecutive rank streams"))
      ->check(mktools::kPositive)
      ->default_str("1");
  app.add_option("--kernel", kernel, "the waiting kernel")
      ->check(CLI::IsMember({"plain", "mkernel"}))
      ->capture_default_str();
  app.add_option("--after", after, "what each rank queues after its kernel")
      ->check(CLI::IsMember({"none", "record", "kernel"}))
      ->capture_default_str();
  app.add_option("--stagger-us", gStaggerUs, "delay between the ranks' launches, us")
      ->capture_default_str();
  app.add_flag("--fence", gFence, "a host barrier before the after-command");
  const int rc = mktools::parseArgs(app, argc, argv);
  if (rc >= 0) return rc;
  like = kernel == "mkernel";
  gAfter = after == "record" ? After::Record : after == "kernel" ? After::Kernel : After::None;
  MK_CUDA_OR_EXIT(cudaSetDevice(0));
  MK_CUDA_OR_EXIT(cudaFree(nullptr));
  const char* conns = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const char* loading = std::getenv("CUDA_MODULE_LOADING");
  std::printf(
      "# mkernel-queueprobe: CUDA_DEVICE_MAX_CONNECTIONS=%s CUDA_MODULE_LOADING=%s, timeout %llu "
      "ms, %s kernel%s, "
      "stagger %u us%s\n",
      conns ? conns : "(unset)", loading ? loading : "(unset)", timeoutMs,
      like ? "mkernel-like" : "plain",
      gAfter == After::Record   ? ", an event recorded after each kernel"
      : gAfter == After::Kernel ? ", an empty kernel queued after each kernel"
                                : "",
      gStaggerUs, gFence ? ", host barrier before the after-command" : "");
  std::printf("%-8s %5s %4s %6s %6s %7s %10s\n", "variant", "ranks", "gap", "stride", "rounds",
              "stalled", "median_ms");
  int anyStalled = 0;
  for (const std::string& v : variants) {
    if (v == "foreign" && gForeign.streamCreate == nullptr && !gForeign.load()) {
      std::fprintf(stderr,
                   "mkernel-queueprobe: variant foreign: no shared libcudart.so to load (%s)\n",
                   dlerror());
      return 2;
    }
    if (v != "fresh" && v != "touched" && v != "kernel" && v != "own" && v != "reused" &&
        v != "foreign") {
      std::fprintf(stderr, "mkernel-queueprobe: unknown variant %s\n", v.c_str());
      return 2;
    }
    for (int n : ranks)
      for (int gap : gaps)
        for (int stride : strides) {
          if (gap < 0 || stride < 1) {
            std::fprintf(stderr, "mkernel-queueprobe: gaps must be >= 0 and strides >= 1\n");
            return 2;
          }
          const Row r = probe(v, n, gap, stride, rounds, timeoutMs * 1000000ull, like);
          std::printf("%-8s %5d %4d %6d %6d %7d %10.3f\n", r.variant.c_str(), r.ranks, r.gap,
                      r.stride, r.rounds, r.stalled, r.medianMs);
          std::fflush(stdout);
          anyStalled |= r.stalled != 0;
        }
  }
  return anyStalled ? 1 : 0;
}
