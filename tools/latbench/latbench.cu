// mkernel-latbench: the latency floors under a small collective, each the median of --reps runs:
//
//   gap       K back-to-back one-CTA kernels on one stream, each storing one word: plain launches,
//             PDL wait (programmatic stream serialization, griddepcontrol.wait first) and PDL early
//             (also griddepcontrol.launch_dependents at its start); eager (one host thread) and
//             as one CUDA graph of K kernels. us per kernel.
//   pingpong  (2 GPUs) one thread per GPU bouncing a counter N times in one kernel each: push (the
//             writer stores into the reader's memory, the reader polls its own) and pull (the
//             writer stores into its own memory, the reader polls the writer's over NVLink).
//             One-way us = round-trip time / 2, by %globaltimer.
//   exchange  (2 GPUs) K kernels per GPU, a host thread each, each kernel storing its number into
//             the peer's flag and spinning on its own until the peer's arrives: the frame-free
//             floor of a kernel-per-op two-rank LL collective. plain / PDL wait / PDL early,
//             eager and in CUDA graphs. us per op (CUDA events on each GPU's stream).
//   exch-ll   the same the LL way, on 256 threads: an 8-byte input, one 16-byte volatile line
//             with two flag halves, a poll of the own line, its zeroing, the output, a barrier.
//
//   mkernel-latbench [--kernels 2000] [--round-trips 20000] [--reps 5] [--same-gpu]
//   --same-gpu: both sides on GPU 0 (two streams), the floors of emulated ranks.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/check.h"
#include "tools/cli.h"

namespace {

__device__ __forceinline__ void pdlEnter(int pdl) {
#if __CUDA_ARCH__ >= 900
  if (pdl != 0) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (pdl == 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
#endif
}

__device__ __forceinline__ uint64_t globalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void storeSys(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t loadSys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__global__ void gapKernel(uint64_t* word, int pdl) {
  pdlEnter(pdl);
  if (threadIdx.x == 0) *word += 1;
}

// Its number: the next value of a counter in its own GPU's memory (stream order keeps one kernel
// at a time on it), so that graph replays keep counting.
__global__ void exchangeKernel(uint64_t* counter, uint64_t* peerFlag, const uint64_t* myFlag,
                               int pdl) {
  pdlEnter(pdl);
  if (threadIdx.x != 0) return;
  const uint64_t e = *counter + 1;
  *counter = e;
  storeSys(peerFlag, e);
  while (loadSys(myFlag) < e) {
  }
}

// The same exchange the LL way (launch_path.h, "LL mode"), on 256 threads: thread 0 loads 8 bytes
// of input, stores them with the op's number as one 16-byte volatile line into the peer's slot,
// polls its own slot's line until both flag halves carry the number, zeroes it, stores the sum
// into the output; then a barrier over the CTA.
struct LlSlot {
  uint32_t w[4];
};
__global__ void __launch_bounds__(256)
    exchangeLlKernel(uint64_t* counter, LlSlot* peerLine, LlSlot* myLine, const uint64_t* in,
                     uint64_t* out, int pdl) {
  pdlEnter(pdl);
  if (threadIdx.x == 0) {
    const uint64_t e = *counter + 1;
    *counter = e;
    const uint32_t flag = static_cast<uint32_t>(e);
    const uint64_t v = *in;
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(peerLine),
                 "r"(static_cast<uint32_t>(v)), "r"(flag), "r"(static_cast<uint32_t>(v >> 32)),
                 "r"(flag)
                 : "memory");
    uint32_t a, b, c, d;
    do {
      asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                   : "l"(myLine)
                   : "memory");
    } while (b != flag || d != flag);
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %1, %1, %1};" ::"l"(myLine), "r"(0u)
                 : "memory");
    *out = v + (static_cast<uint64_t>(a) | (static_cast<uint64_t>(c) << 32));
  }
  __syncthreads();
}

// first: GPU 0's side (it starts each round trip). out: where this side writes, in: where it polls.
__global__ void pingKernel(uint64_t* out, const uint64_t* in, int iters, int first, uint64_t base,
                           uint64_t* ns) {
  if (threadIdx.x != 0) return;
  const uint64_t t0 = globalTimer();
  for (int i = 1; i <= iters; ++i) {
    const uint64_t v = base + static_cast<uint64_t>(i);
    if (first) storeSys(out, v);
    while (loadSys(in) < v) {
    }
    if (!first) storeSys(out, v);
  }
  *ns = globalTimer() - t0;
}

// One CTA of `threads` on s: a plain launch (pdl 0), or cudaLaunchKernelEx with programmatic
// stream serialization (the kernel's pdlEnter waits).
template <typename... Params, typename... Args>
cudaError_t launchOne(void (*k)(Params...), cudaStream_t s, int pdl, int threads, Args... args) {
  if (pdl == 0) {
    k<<<1, threads, 0, s>>>(args...);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, k, args...);
}

cudaError_t launch(void (*k)(uint64_t*, int), cudaStream_t s, int pdl, uint64_t* word) {
  return launchOne(k, s, pdl, 32, word, pdl);
}

struct ExArgs {
  uint64_t* counter;
  uint64_t* peerFlag;
  const uint64_t* myFlag;
  LlSlot* peerLine;
  LlSlot* myLine;
  const uint64_t* in;
  uint64_t* out;
};

cudaError_t launchExchange(cudaStream_t s, int pdl, int ll, const ExArgs& x) {
  if (ll)
    return launchOne(exchangeLlKernel, s, pdl, 256, x.counter, x.peerLine, x.myLine, x.in, x.out,
                     pdl);
  return launchOne(exchangeKernel, s, pdl, 32, x.counter, x.peerFlag, x.myFlag, pdl);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

const char* kPdlName[3] = {"plain", "pdl-wait", "pdl-early"};

// The two sides' GPUs: 0 and 1, or both 0 with --same-gpu (two streams of one GPU: the floors
// without NVLink, for emulated ranks).
int gSide[2] = {0, 1};

// Gap: one GPU, one stream.
void gapRows(int kernels, int reps) {
  MK_CUDA_OR_EXIT(cudaSetDevice(0));
  cudaStream_t s;
  MK_CUDA_OR_EXIT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint64_t* word;
  MK_CUDA_OR_EXIT(cudaMalloc(&word, 8));
  cudaEvent_t a, b;
  MK_CUDA_OR_EXIT(cudaEventCreate(&a));
  MK_CUDA_OR_EXIT(cudaEventCreate(&b));
  for (int graph = 0; graph <= 1; ++graph)
    for (int pdl = 0; pdl <= 2; ++pdl) {
      cudaGraphExec_t exec = nullptr;
      if (graph) {
        cudaGraph_t g;
        MK_CUDA_OR_EXIT(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int k = 0; k < kernels; ++k) MK_CUDA_OR_EXIT(launch(gapKernel, s, pdl, word));
        MK_CUDA_OR_EXIT(cudaStreamEndCapture(s, &g));
        MK_CUDA_OR_EXIT(cudaGraphInstantiate(&exec, g, 0));
        MK_CUDA_OR_EXIT(cudaGraphDestroy(g));
        MK_CUDA_OR_EXIT(cudaGraphLaunch(exec, s));  // warm-up
      } else {
        for (int k = 0; k < 100; ++k) MK_CUDA_OR_EXIT(launch(gapKernel, s, pdl, word));
      }
      MK_CUDA_OR_EXIT(cudaStreamSynchronize(s));
      std::vector<double> us;
      for (int r = 0; r < reps; ++r) {
        MK_CUDA_OR_EXIT(cudaEventRecord(a, s));
        if (graph)
          MK_CUDA_OR_EXIT(cudaGraphLaunch(exec, s));
        else
          for (int k = 0; k < kernels; ++k) MK_CUDA_OR_EXIT(launch(gapKernel, s, pdl, word));
        MK_CUDA_OR_EXIT(cudaEventRecord(b, s));
        MK_CUDA_OR_EXIT(cudaEventSynchronize(b));
        float ms = 0;
        MK_CUDA_OR_EXIT(cudaEventElapsedTime(&ms, a, b));
        us.push_back(1000.0 * ms / kernels);
      }
      if (exec) MK_CUDA_OR_EXIT(cudaGraphExecDestroy(exec));
      std::printf("gap        %-6s %-10s %8.2f us per kernel\n", graph ? "graph" : "eager",
                  kPdlName[pdl], median(us));
    }
  MK_CUDA_OR_EXIT(cudaFree(word));
  MK_CUDA_OR_EXIT(cudaStreamDestroy(s));
}

struct Gpu {
  cudaStream_t s;
  uint64_t* flag;  // 128-byte block: [0] exchange flag, [8] ping flag, [12] LL line
  uint64_t* counter;
  uint64_t* io;  // [0] input, [1] output
  uint64_t* ns;
  cudaEvent_t a, b;
};

void pingRows(Gpu* g, int iters, int reps) {
  for (int pull = 0; pull <= 1; ++pull) {
    std::vector<double> us;
    for (int r = 0; r < reps + 1; ++r) {
      const uint64_t base =
          static_cast<uint64_t>(pull * (reps + 1) + r) * static_cast<uint64_t>(iters);
      for (int d = 0; d < 2; ++d) {
        MK_CUDA_OR_EXIT(cudaSetDevice(gSide[d]));
        // push: write the peer's word, poll our own; pull: write our own, poll the peer's.
        uint64_t* out = pull ? g[d].flag + 8 : g[1 - d].flag + 8;
        const uint64_t* in = pull ? g[1 - d].flag + 8 : g[d].flag + 8;
        pingKernel<<<1, 32, 0, g[d].s>>>(out, in, iters, d == 0, base, g[d].ns);
        MK_CUDA_OR_EXIT(cudaGetLastError());
      }
      uint64_t ns = 0;
      for (int d = 0; d < 2; ++d) {
        MK_CUDA_OR_EXIT(cudaSetDevice(gSide[d]));
        MK_CUDA_OR_EXIT(cudaStreamSynchronize(g[d].s));
      }
      MK_CUDA_OR_EXIT(cudaSetDevice(gSide[0]));
      MK_CUDA_OR_EXIT(cudaMemcpy(&ns, g[0].ns, 8, cudaMemcpyDeviceToHost));
      if (r > 0) us.push_back(ns / 1000.0 / iters / 2);  // run 0 warms up
    }
    std::printf("pingpong   %-6s %-10s %8.3f us one way (%d round trips)\n", pull ? "pull" : "push",
                "", median(us), iters);
  }
}

void exchangeRows(Gpu* g, int kernels, int reps) {
  for (int ll = 0; ll <= 1; ++ll)
    for (int graph = 0; graph <= 1; ++graph)
      for (int pdl = 0; pdl <= 2; ++pdl) {
        std::vector<double> us[2];
        cudaGraphExec_t exec[2] = {nullptr, nullptr};
        std::atomic<int> ready{0};
        auto body = [&](int d) {
          MK_CUDA_OR_EXIT(cudaSetDevice(gSide[d]));
          ExArgs x;
          x.counter = g[d].counter;
          x.peerFlag = g[1 - d].flag;
          x.myFlag = g[d].flag;
          x.peerLine = reinterpret_cast<LlSlot*>(g[1 - d].flag + 12);
          x.myLine = reinterpret_cast<LlSlot*>(g[d].flag + 12);
          x.in = g[d].io;
          x.out = g[d].io + 1;
          if (graph) {
            cudaGraph_t gr;
            MK_CUDA_OR_EXIT(cudaStreamBeginCapture(g[d].s, cudaStreamCaptureModeThreadLocal));
            for (int k = 0; k < kernels; ++k) MK_CUDA_OR_EXIT(launchExchange(g[d].s, pdl, ll, x));
            MK_CUDA_OR_EXIT(cudaStreamEndCapture(g[d].s, &gr));
            MK_CUDA_OR_EXIT(cudaGraphInstantiate(&exec[d], gr, 0));
            MK_CUDA_OR_EXIT(cudaGraphDestroy(gr));
          }
          for (int r = 0; r < reps + 1; ++r) {
            // Both threads start each run together.
            ready.fetch_add(1);
            while (ready.load() < 2 * (r + 1)) {
            }
            MK_CUDA_OR_EXIT(cudaEventRecord(g[d].a, g[d].s));
            if (graph)
              MK_CUDA_OR_EXIT(cudaGraphLaunch(exec[d], g[d].s));
            else
              for (int k = 0; k < kernels; ++k) MK_CUDA_OR_EXIT(launchExchange(g[d].s, pdl, ll, x));
            MK_CUDA_OR_EXIT(cudaEventRecord(g[d].b, g[d].s));
            MK_CUDA_OR_EXIT(cudaEventSynchronize(g[d].b));
            float ms = 0;
            MK_CUDA_OR_EXIT(cudaEventElapsedTime(&ms, g[d].a, g[d].b));
            if (r > 0) us[d].push_back(1000.0 * ms / kernels);
          }
          if (exec[d]) MK_CUDA_OR_EXIT(cudaGraphExecDestroy(exec[d]));
        };
        std::thread t0(body, 0), t1(body, 1);
        t0.join();
        t1.join();
        std::printf("%-10s %-6s %-10s %8.2f us per op (GPU 0), %.2f (GPU 1)\n",
                    ll ? "exch-ll" : "exchange", graph ? "graph" : "eager", kPdlName[pdl],
                    median(us[0]), median(us[1]));
      }
}

}  // namespace

int main(int argc, char** argv) {
  int kernels = 2000, iters = 20000, reps = 5;
  bool sameGpu = false;
  CLI::App app(
      "The latency floors under a small collective: kernel-to-kernel gaps with and without "
      "programmatic\n"
      "dependent launch, NVLink ping-pong, a frame-free two-GPU flag exchange per kernel.",
      "mkernel-latbench");
  mktools::setupApp(app);
  app.add_option("--kernels", kernels, "kernels per run")
      ->check(mktools::kPositive)
      ->capture_default_str();
  app.add_option("--round-trips", iters, "ping-pong round trips per run")
      ->check(mktools::kPositive)
      ->capture_default_str();
  app.add_option("--reps", reps, "runs (median reported)")
      ->check(mktools::kPositive)
      ->capture_default_str();
  app.add_flag("--same-gpu", sameGpu, "both sides of pingpong and exchange on GPU 0, two streams");
  const int rc = mktools::parseArgs(app, argc, argv);
  if (rc >= 0) return rc;
  int n = 0;
  MK_CUDA_OR_EXIT(cudaGetDeviceCount(&n));
  cudaDeviceProp prop{};
  MK_CUDA_OR_EXIT(cudaGetDeviceProperties(&prop, 0));
  std::printf("# mkernel-latbench: %s, %d GPU(s), %d kernels per run, median of %d runs\n",
              prop.name, n, kernels, reps);
  gapRows(kernels, reps);
  if (sameGpu) {
    gSide[1] = 0;
    std::printf("# --same-gpu: both sides of pingpong and exchange on GPU 0, two streams\n");
  } else if (n < 2) {
    std::printf("# pingpong and exchange need 2 GPUs (or --same-gpu): skipped\n");
    return 0;
  }
  Gpu g[2];
  for (int d = 0; d < 2; ++d) {
    MK_CUDA_OR_EXIT(cudaSetDevice(gSide[d]));
    if (!sameGpu) {
      int can = 0;
      MK_CUDA_OR_EXIT(cudaDeviceCanAccessPeer(&can, d, 1 - d));
      if (!can) {
        std::printf("# GPU %d cannot access GPU %d: pingpong and exchange skipped\n", d, 1 - d);
        return 0;
      }
      MK_CUDA_OR_EXIT(cudaDeviceEnablePeerAccess(1 - d, 0));
    }
    MK_CUDA_OR_EXIT(cudaStreamCreateWithFlags(&g[d].s, cudaStreamNonBlocking));
    MK_CUDA_OR_EXIT(cudaMalloc(&g[d].flag, 128));
    MK_CUDA_OR_EXIT(cudaMemset(g[d].flag, 0, 128));
    MK_CUDA_OR_EXIT(cudaMalloc(&g[d].counter, 8));
    MK_CUDA_OR_EXIT(cudaMemset(g[d].counter, 0, 8));
    MK_CUDA_OR_EXIT(cudaMalloc(&g[d].io, 16));
    MK_CUDA_OR_EXIT(cudaMemset(g[d].io, 0, 16));
    MK_CUDA_OR_EXIT(cudaMalloc(&g[d].ns, 8));
    MK_CUDA_OR_EXIT(cudaEventCreate(&g[d].a));
    MK_CUDA_OR_EXIT(cudaEventCreate(&g[d].b));
    MK_CUDA_OR_EXIT(cudaDeviceSynchronize());
  }
  pingRows(g, iters, reps);
  exchangeRows(g, kernels, reps);
  return 0;
}
