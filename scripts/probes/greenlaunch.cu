// Session 37's second probe: do launches into separate green contexts escape the serialisation of
// one context's launches? Not part of the build. On the device machine:
//   nvcc -arch=sm_90 -O2 -std=c++17 -o gl scripts/probes/greenlaunch.cu -lcuda && ./gl N MODE
// N threads, in step (a spin barrier between rounds, as collbench's floors), 2,000 rounds; the
// median wall time of a round from thread 0's barrier exits. MODE:
//   primary  each thread launches an empty kernel on its own stream of the primary context
//            (collbench's launch floor: about 20 us per round for 8 threads on the H200);
//   green    each thread launches it on a stream of its own green context (8 SMs each);
//   ordered  each thread orders that launch after its primary stream and its primary stream after
//            it, as a collective would have to: event record on the primary stream, the green
//            stream waits for it, the launch, an event record on the green stream, the primary
//            stream waits for that.
//   pordered the same five calls with a second stream of the primary context in place of the
//            green one (the control for `ordered`).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#define P(...) std::fprintf(stderr, __VA_ARGS__)

__global__ void emptyKernel() {}

static bool ok(CUresult r, const char* what, int t) {
  if (r == CUDA_SUCCESS) return true;
  const char* s = nullptr;
  cuGetErrorString(r, &s);
  P("t%d: %s failed: %d %s\n", t, what, static_cast<int>(r), s ? s : "?");
  return false;
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 8;
  const std::string mode = argc > 2 ? argv[2] : "green";
  const int rounds = 2000;
  cuInit(0);
  cudaSetDevice(0);
  emptyKernel<<<1, 32>>>();
  cudaDeviceSynchronize();
  CUcontext primary = nullptr;
  cuCtxGetCurrent(&primary);
  CUdevice dev;
  cuDeviceGet(&dev, 0);
  cudaKernel_t k = nullptr;
  cudaGetKernel(&k, emptyKernel);
  const bool green = mode == "green" || mode == "ordered";
  std::vector<CUgreenCtx> gctx(static_cast<size_t>(n), nullptr);
  if (green) {
    CUdevResource all{};
    if (!ok(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource", -1)) return 1;
    std::vector<CUdevResource> parts(static_cast<size_t>(n));
    CUdevResource rest{};
    unsigned groups = static_cast<unsigned>(n);
    if (!ok(cuDevSmResourceSplitByCount(parts.data(), &groups, &all, &rest, 0, 8), "cuDevSmResourceSplitByCount", -1))
      return 1;
    if (groups < static_cast<unsigned>(n)) {
      P("only %u groups of 8 SMs\n", groups);
      return 1;
    }
    for (int t = 0; t < n; ++t) {
      CUdevResourceDesc desc;
      if (!ok(cuDevResourceGenerateDesc(&desc, &parts[static_cast<size_t>(t)], 1), "cuDevResourceGenerateDesc", t)) return 1;
      if (!ok(cuGreenCtxCreate(&gctx[static_cast<size_t>(t)], desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate", t))
        return 1;
    }
    cuCtxSetCurrent(primary);
  }
  std::atomic<int> arrived{0}, gen{0};
  auto barrier = [&]() {
    const int g = gen.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
      arrived.store(0, std::memory_order_relaxed);
      gen.store(g + 1, std::memory_order_release);
    } else {
      while (gen.load(std::memory_order_acquire) == g) {
      }
    }
  };
  std::vector<float> us;
  std::atomic<int> failed{0};
  std::vector<std::thread> th;
  for (int t = 0; t < n; ++t)
    th.emplace_back([&, t] {
      cuCtxSetCurrent(primary);
      CUstream ps = nullptr, ws = nullptr;  // the caller's stream; where the kernel goes
      CUevent ea = nullptr, eb = nullptr;
      bool good = ok(cuStreamCreate(&ps, CU_STREAM_NON_BLOCKING), "cuStreamCreate", t) &&
                  ok(cuEventCreate(&ea, CU_EVENT_DISABLE_TIMING), "cuEventCreate", t);
      if (green) {
        CUcontext gc = nullptr;
        good = good && ok(cuGreenCtxStreamCreate(&ws, gctx[static_cast<size_t>(t)], CU_STREAM_NON_BLOCKING, 0),
                          "cuGreenCtxStreamCreate", t) &&
               ok(cuCtxFromGreenCtx(&gc, gctx[static_cast<size_t>(t)]), "cuCtxFromGreenCtx", t);
        if (good) {
          cuCtxSetCurrent(gc);
          good = ok(cuEventCreate(&eb, CU_EVENT_DISABLE_TIMING), "cuEventCreate (green)", t);
          cuCtxSetCurrent(primary);
        }
      } else {
        good = good && ok(cuStreamCreate(&ws, CU_STREAM_NON_BLOCKING), "cuStreamCreate (2)", t) &&
               ok(cuEventCreate(&eb, CU_EVENT_DISABLE_TIMING), "cuEventCreate (2)", t);
      }
      if (mode == "primary") ws = ps;
      const bool ordered = mode == "ordered" || mode == "pordered";
      for (int i = 0; good && i < 20; ++i)
        good = ok(cuLaunchKernel(reinterpret_cast<CUfunction>(k), 1, 1, 1, 32, 1, 1, 0, ws, nullptr, nullptr),
                  "cuLaunchKernel (warm)", t);
      if (good) good = ok(cuStreamSynchronize(ws), "cuStreamSynchronize", t);
      if (!good) ++failed;
      barrier();
      if (failed.load() != 0) return;
      auto last = std::chrono::steady_clock::now();
      for (int r = 0; r < rounds; ++r) {
        if (ordered) {
          good = good && ok(cuEventRecord(ea, ps), "cuEventRecord (caller)", t) &&
                 ok(cuStreamWaitEvent(ws, ea, 0), "cuStreamWaitEvent (kernel's stream)", t);
        }
        good = good && ok(cuLaunchKernel(reinterpret_cast<CUfunction>(k), 1, 1, 1, 32, 1, 1, 0, ws, nullptr, nullptr),
                          "cuLaunchKernel", t);
        if (ordered) {
          good = good && ok(cuEventRecord(eb, ws), "cuEventRecord (kernel's stream)", t) &&
                 ok(cuStreamWaitEvent(ps, eb, 0), "cuStreamWaitEvent (caller)", t);
        }
        barrier();
        if (t == 0) {
          const auto now = std::chrono::steady_clock::now();
          us.push_back(std::chrono::duration<float, std::micro>(now - last).count());
          last = now;
        }
      }
      if (!good) ++failed;
      cuStreamSynchronize(ps);
      cuStreamSynchronize(ws);
    });
  for (auto& x : th) x.join();
  std::sort(us.begin(), us.end());
  std::printf("n=%d mode=%s: %s; us per round median %.2f p99 %.2f (%zu rounds)\n", n, mode.c_str(),
              failed.load() ? "FAILED" : "ok", us.empty() ? -1.0 : us[us.size() / 2],
              us.empty() ? -1.0 : us[static_cast<size_t>(0.99 * (us.size() - 1))], us.size());
  return failed.load() ? 1 : 0;
}
