// Session 20's server-kernel probe (docs/KERNEL.md, "A server kernel: probed in session 20, not
// built"). Not part of the build. On the device machine:
//   nvcc -arch=sm_90 -O2 -std=c++17 -o sf scripts/probes/serverfloor.cu && ./sf N IDLE
// N threads each post a round number into a host-mapped word and poll their done word; one
// resident kernel of N CTAs (CTA 0 polls every post word, then each CTA writes its thread's done
// word) answers. IDLE=1: each thread first polls cudaStreamQuery on its own stream and records an
// event after the round. Before the rounds each thread launches 20 empty kernels on its own
// stream and synchronizes it: on the H200 (session 20) that synchronization never returned while
// the server kernel spun, with 2 and 8 threads.
#include <cuda_runtime_api.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
#include <algorithm>
#include <cstdint>
// CTA m answers thread m; CTA 0's thread k polls post[k * 8].
__global__ void floorServerKernel(const volatile uint64_t* post, volatile uint64_t* done, const volatile uint32_t* quit,
                                  volatile uint64_t* go, int n) {
  const int m = static_cast<int>(blockIdx.x);
  for (uint64_t round = 1;; ++round) {
    if (m == 0) {
      __shared__ int stop;
      if (threadIdx.x == 0) stop = 0;
      __syncthreads();
      if (static_cast<int>(threadIdx.x) < n)
        while (post[threadIdx.x * 8] < round)
          if (*quit != 0) {
            stop = 1;
            break;
          }
      __syncthreads();
      if (threadIdx.x == 0) *go = stop != 0 ? ~uint64_t{0} : round;
      if (stop != 0) return;
    }
    if (threadIdx.x == 0) {
      uint64_t g;
      while ((g = *go) < round)
        if (*quit != 0) g = ~uint64_t{0};  // (the host gave up: a stalled round)
      if (g == ~uint64_t{0}) return;
      __threadfence_system();
      done[m * 8] = round;
    }
    __syncthreads();
  }
}
__global__ void emptyKernel() {}
#define P(...) do { std::fprintf(stderr, __VA_ARGS__); } while (0)
int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 2;
  const int idle = argc > 2 ? atoi(argv[2]) : 0;
  const int warm = argc > 3 ? atoi(argv[3]) : 1;
  cudaSetDevice(0);
  if (warm) { emptyKernel<<<1,32>>>(); cudaDeviceSynchronize(); P("warm ok\n"); }
  uint64_t* words = nullptr; uint64_t* go = nullptr;
  P("hostalloc %s\n", cudaGetErrorString(cudaHostAlloc(&words, 136 * 64, cudaHostAllocMapped)));
  std::memset(words, 0, 136 * 64);
  cudaMalloc(&go, 8); cudaMemset(go, 0, 8); cudaDeviceSynchronize();
  cudaStream_t ss; cudaStreamCreateWithFlags(&ss, cudaStreamNonBlocking);
  uint64_t* d = nullptr; cudaHostGetDevicePointer((void**)&d, words, 0);
  P("devptr %p host %p\n", (void*)d, (void*)words);
  floorServerKernel<<<n, 32, 0, ss>>>(d, d + 64 * 8, (uint32_t*)(d + 128 * 8), go, n);
  P("launch %s\n", cudaGetErrorString(cudaGetLastError()));
  std::atomic<int> arrived{0}, gen{0};
  auto barrier = [&]() { int g = gen.load(); if (arrived.fetch_add(1) + 1 == n) { arrived = 0; gen = g + 1; } else while (gen.load() == g) {} };
  std::vector<float> us; std::vector<std::thread> th; std::atomic<bool> stalled{false};
  for (int t = 0; t < n; ++t) th.emplace_back([&, t] {
    cudaSetDevice(0); cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    for (int i = 0; i < 20; ++i) emptyKernel<<<1, 32, 0, s>>>();
    P("t%d sync %s\n", t, cudaGetErrorString(cudaStreamSynchronize(s)));
    barrier();
    auto last = std::chrono::steady_clock::now();
    for (int r = 0; r < 2000 && !stalled; ++r) {
      if (idle) while (cudaStreamQuery(s) == cudaErrorNotReady) {}
      volatile uint64_t* post = words + t * 8; volatile uint64_t* done = words + 64 * 8 + t * 8;
      std::atomic_thread_fence(std::memory_order_seq_cst);
      *post = r + 1;
      auto dl = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (*done < (uint64_t)r + 1 && !stalled) if (std::chrono::steady_clock::now() > dl && !stalled.exchange(true))
        P("t%d stalled round %d post %llu done %llu kernel %s\n", t, r + 1, (unsigned long long)*post, (unsigned long long)*done, cudaGetErrorString(cudaStreamQuery(ss)));
      if (idle) cudaEventRecord(e, s);
      barrier();
      if (t == 0) { auto now = std::chrono::steady_clock::now(); us.push_back(std::chrono::duration<float, std::micro>(now - last).count()); last = now; }
    }
    P("t%d loop done\n", t);
    cudaStreamSynchronize(s);
  });
  for (auto& x : th) x.join();
  *(volatile uint32_t*)(words + 128 * 8) = 1;
  P("quit; sync %s\n", cudaGetErrorString(cudaStreamSynchronize(ss)));
  std::sort(us.begin(), us.end());
  std::printf("n=%d idle=%d median %.2f us per round (%zu)\n", n, idle, us.empty() ? -1.0 : us[us.size() / 2], us.size());
}
