// Session 37's probe: session 20's server kernel (scripts/probes/serverfloor.cu) in a green
// context. Not part of the build. On the device machine:
//   nvcc -arch=sm_90 -O2 -std=c++17 -o gs scripts/probes/greenserver.cu -lcuda && ./gs N MODE CALLS
// MODE: green (the server kernel on a stream of a green context of 8 SMs) or primary (on a stream
// of the primary context, as in session 20). CALLS, a mask of the calls each thread makes per
// round: 1 = waits until its stream is idle with cudaStreamQuery (what an eager collective of such
// a design must do), 2 = records an event after the round (as collbench does); 3 = both, 0 = none.
//
// Questions: (1) while the server kernel spins, do N threads' streams of the primary context still
// run their work (20 empty kernels, then polled with a 3 s deadline)? In session 20 they did not
// (primary). (2) Can the green context's kernel read and write memory that the primary context
// allocated (cudaMalloc) and host memory mapped for every context? (3) What does a round cost:
// each thread posts its input's address and the round, the server's CTA m waits for its post, all
// CTAs meet at a device barrier, each sums the N inputs into its rank's output and answers.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#define P(...) std::fprintf(stderr, __VA_ARGS__)
#define CU(x)                                                         \
  do {                                                                \
    CUresult r_ = (x);                                                \
    if (r_ != CUDA_SUCCESS) {                                         \
      const char* s_ = nullptr;                                       \
      cuGetErrorString(r_, &s_);                                      \
      P("%s failed: %d %s\n", #x, static_cast<int>(r_), s_ ? s_ : "?"); \
      return 1;                                                       \
    }                                                                 \
  } while (0)

struct Slot {  // one per thread, host-mapped, 64 B apart
  volatile uint64_t post;
  volatile uint64_t in;   // device address of the thread's input (one float)
  volatile uint64_t out;  // device address of its output (one float)
  uint64_t pad[5];
};

// CTA m serves thread m. arrive: N device words (64 B apart) the CTAs meet at; dev: each rank's
// input and output addresses, copied from its host slot by its CTA (so that no CTA reads the other
// slots across PCIe).
__global__ void serverKernel(Slot* slots, volatile uint64_t* done, volatile uint64_t* arrive,
                             volatile uint64_t* dev, const volatile uint32_t* quit, int n) {
  const int m = static_cast<int>(blockIdx.x);
  const int lane = static_cast<int>(threadIdx.x);
  for (uint64_t round = 1;; ++round) {
    if (lane == 0) {
      bool stop = false;
      for (;;) {
        const uint64_t p = slots[m].post;
        const uint64_t in = slots[m].in, out = slots[m].out;  // issued with the poll
        if (p >= round) {
          dev[m * 8] = in;
          dev[m * 8 + 1] = out;
          break;
        }
        if (*quit != 0) {
          stop = true;
          break;
        }
      }
      __threadfence();
      arrive[m * 8] = stop ? ~uint64_t{0} : round;
    }
    __syncwarp();
    float v = 0;
    bool stop = false;
    if (lane < n) {
      uint64_t a;
      while ((a = arrive[lane * 8]) < round) {
      }
      stop = a == ~uint64_t{0};
      if (!stop) v = *reinterpret_cast<const volatile float*>(dev[lane * 8]);
    }
    if (__any_sync(0xffffffffu, stop)) return;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) {
      *reinterpret_cast<volatile float*>(dev[m * 8 + 1]) = v + static_cast<float>(round);
      __threadfence_system();
      done[m * 8] = round;
    }
    __syncwarp();
  }
}
__global__ void emptyKernel() {}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 2;
  const bool green = argc > 2 ? std::strcmp(argv[2], "green") == 0 : true;
  const int calls = argc > 3 ? std::atoi(argv[3]) : 1;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 2000;
  CU(cuInit(0));
  cudaSetDevice(0);
  emptyKernel<<<1, 32>>>();
  cudaDeviceSynchronize();
  CUdevice dev;
  CU(cuDeviceGet(&dev, 0));
  Slot* slots = nullptr;
  uint64_t* words = nullptr;
  cudaHostAlloc(reinterpret_cast<void**>(&slots), 64 * sizeof(Slot), cudaHostAllocMapped | cudaHostAllocPortable);
  cudaHostAlloc(reinterpret_cast<void**>(&words), 136 * 64, cudaHostAllocMapped | cudaHostAllocPortable);
  std::memset(slots, 0, 64 * sizeof(Slot));
  std::memset(words, 0, 136 * 64);
  uint64_t *arrive = nullptr, *devSlots = nullptr;
  cudaMalloc(&arrive, 64 * 64);
  cudaMemset(arrive, 0, 64 * 64);
  cudaMalloc(&devSlots, 64 * 64);
  cudaMemset(devSlots, 0, 64 * 64);
  float* bufs = nullptr;  // in[t] at t * 64, out[t] at t * 64 + 32 (floats)
  cudaMalloc(&bufs, 64 * 64 * sizeof(float));
  std::vector<float> host(64 * 64, 0.f);
  for (int t = 0; t < n; ++t) host[t * 64] = static_cast<float>(t + 1);
  cudaMemcpy(bufs, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();
  for (int t = 0; t < n; ++t) {
    slots[t].in = reinterpret_cast<uint64_t>(bufs + t * 64);
    slots[t].out = reinterpret_cast<uint64_t>(bufs + t * 64 + 32);
  }
  volatile uint64_t* done = words;
  volatile uint32_t* quit = reinterpret_cast<volatile uint32_t*>(words + 128 * 8);

  CUstream ss = nullptr;
  CUgreenCtx gctx = nullptr;
  if (green) {
    CUdevResource all{}, part{}, rest{};
    CU(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    unsigned groups = 1;
    CU(cuDevSmResourceSplitByCount(&part, &groups, &all, &rest, 0, 8));
    CUdevResourceDesc desc;
    CU(cuDevResourceGenerateDesc(&desc, &part, 1));
    CU(cuGreenCtxCreate(&gctx, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    CU(cuGreenCtxStreamCreate(&ss, gctx, CU_STREAM_NON_BLOCKING, 0));
    P("green context: %u SMs of %u (min %u, align %u), %u groups\n", part.sm.smCount, all.sm.smCount,
      all.sm.minSmPartitionSize, all.sm.smCoscheduledAlignment, groups);
  } else {
    CU(cuStreamCreate(&ss, CU_STREAM_NON_BLOCKING));
  }
  cudaKernel_t k = nullptr;
  if (cudaGetKernel(&k, serverKernel) != cudaSuccess) {
    P("cudaGetKernel failed\n");
    return 1;
  }
  Slot* dslots = nullptr;
  uint64_t* dwords = nullptr;
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&dslots), slots, 0);
  cudaHostGetDevicePointer(reinterpret_cast<void**>(&dwords), words, 0);
  uint64_t* ddone = dwords;
  uint32_t* dquit = reinterpret_cast<uint32_t*>(dwords + 128 * 8);
  void* params[] = {&dslots, &ddone, &arrive, &devSlots, &dquit, const_cast<int*>(&n)};
  CU(cuLaunchKernel(reinterpret_cast<CUfunction>(k), n, 1, 1, 32, 1, 1, 0, ss, params, nullptr));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    CUresult q = cuStreamQuery(ss);
    P("server after 20 ms: %s\n", q == CUDA_ERROR_NOT_READY ? "running" : "NOT running");
  }

  std::atomic<int> arrived{0}, gen{0};
  auto barrier = [&]() {
    const int g = gen.load();
    if (arrived.fetch_add(1) + 1 == n) {
      arrived = 0;
      gen = g + 1;
    } else {
      while (gen.load() == g) {
      }
    }
  };
  std::vector<float> roundUs, evUs;
  std::atomic<bool> stalled{false};
  std::atomic<int> syncStalls{0};
  std::vector<std::thread> th;
  for (int t = 0; t < n; ++t)
    th.emplace_back([&, t] {
      cudaSetDevice(0);
      cudaStream_t s;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      std::vector<cudaEvent_t> ev(static_cast<size_t>(rounds) + 1);
      for (auto& e : ev) cudaEventCreate(&e);
      const auto s0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 20; ++i) emptyKernel<<<1, 32, 0, s>>>();
      bool ok = false;
      while (std::chrono::steady_clock::now() - s0 < std::chrono::seconds(3))
        if (cudaStreamQuery(s) == cudaSuccess) {
          ok = true;
          break;
        }
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count();
      P("t%d: 20 empty kernels on its stream %s after %.2f ms\n", t, ok ? "done" : "NOT done (stall)", ms);
      if (!ok) ++syncStalls;
      barrier();
      if (syncStalls.load() != 0) return;
      if (calls & 2) cudaEventRecord(ev[0], s);
      auto last = std::chrono::steady_clock::now();
      for (int r = 0; r < rounds && !stalled; ++r) {
        if (calls & 1)
          while (cudaStreamQuery(s) == cudaErrorNotReady) {
          }
        std::atomic_thread_fence(std::memory_order_seq_cst);
        slots[t].post = static_cast<uint64_t>(r) + 1;
        const auto dl = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        while (done[t * 8] < static_cast<uint64_t>(r) + 1 && !stalled)
          if (std::chrono::steady_clock::now() > dl && !stalled.exchange(true))
            P("t%d stalled in round %d\n", t, r + 1);
        if (calls & 2) cudaEventRecord(ev[static_cast<size_t>(r) + 1], s);
        if (t == 0) {
          const auto now = std::chrono::steady_clock::now();
          roundUs.push_back(std::chrono::duration<float, std::micro>(now - last).count());
          last = now;
        }
      }
      cudaStreamSynchronize(s);
      if (t == 0 && (calls & 2) && !stalled)
        for (int r = 1; r <= rounds; ++r) {
          float msr = 0;
          cudaEventElapsedTime(&msr, ev[static_cast<size_t>(r) - 1], ev[static_cast<size_t>(r)]);
          evUs.push_back(1000.f * msr);
        }
      for (auto& e : ev) cudaEventDestroy(e);
      cudaStreamDestroy(s);
    });
  for (auto& x : th) x.join();
  *quit = 1;
  const auto q0 = std::chrono::steady_clock::now();
  CUresult qs;
  while ((qs = cuStreamQuery(ss)) == CUDA_ERROR_NOT_READY &&
         std::chrono::steady_clock::now() - q0 < std::chrono::seconds(3)) {
  }
  P("server quit: %s\n", qs == CUDA_SUCCESS ? "ended" : "did not end");
  cudaMemcpy(host.data(), bufs, host.size() * sizeof(float), cudaMemcpyDeviceToHost);
  const float want = static_cast<float>(n * (n + 1) / 2);
  int wrong = 0;
  const uint64_t last = done[0];
  for (int t = 0; t < n; ++t)
    if (host[t * 64 + 32] != want + static_cast<float>(done[t * 8])) ++wrong;
  auto med = [](std::vector<float> v, double q) {
    if (v.empty()) return -1.0;
    std::sort(v.begin(), v.end());
    return static_cast<double>(v[static_cast<size_t>(q * (v.size() - 1))]);
  };
  std::printf(
      "n=%d %s calls=%d: stalls %d, rounds %llu, outputs wrong %d; host us per round median %.2f p99 %.2f; "
      "event us per round median %.2f p99 %.2f\n",
      n, green ? "green" : "primary", calls, syncStalls.load(), static_cast<unsigned long long>(last), wrong,
      med(roundUs, 0.5), med(roundUs, 0.99), med(evUs, 0.5), med(evUs, 0.99));
  if (gctx) {
    cuStreamDestroy(ss);
    cuGreenCtxDestroy(gctx);
  }
  return (syncStalls.load() != 0 || stalled || wrong != 0) ? 2 : 0;
}
