// mkernel-p2pbench: what NVLink gives a CTA-based data mover, measured the way the persistent
// kernel moves data (docs/PERFORMANCE.md). Both GPUs of a pair run the same pattern
// at once against each other (as in a collective), each on its own stream, timed with CUDA events:
//
//   local      dst <- src                   (one GPU's HBM; the ceiling of any reducing kernel)
//   pull       dst <- peer's src            (remote loads: the direct algorithms' reads)
//   push       peer's inbox <- src          (remote stores: the staged algorithms' writes)
//   rs-pull    dst <- src + peer's src      (ReduceScatter on 2 ranks, direct)
//   ar-pull    dst, peer's inbox <- src + peer's src  (two-shot AllReduce on 2 ranks, direct)
//   rs-real / ar-real: the same two through the kernel's own reduceCopy (collectives/device/
//              reduce.cuh), so the hand-written loops above are its yardstick;
//   rs-real-rf / ar-real-rf: with the peer's source first, as on rank 1 (sources go in rank
//              order, so one rank of two always reads the remote one first).
//
// The hand-written loops issue every load of an iteration (U 16-byte vectors per source and
// thread) before any arithmetic. Each CTA moves a contiguous share, threads striding inside it,
// as the kernel's CTAs do. GB/s = bytes of dst per GPU / median time (over --iters after warm-up);
// for the remote patterns that is also the NVLink bytes per direction. With one GPU only `local`
// and the real reduceCopy on local buffers run.
//
//   mkernel-p2pbench [--bytes N] [--ctas 16,32,64,128] [--iters 20] [--threads 512]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/check.h"
#include "collectives/device/reduce.cuh"
#include "tools/cli.h"

namespace {

namespace dev = mkernel::coll::dev;

enum Mode { kCopy = 0, kReduce = 1 };

__device__ __forceinline__ uint4 addF4(uint4 x, uint4 y) {
  float* a = reinterpret_cast<float*>(&x);
  const float* b = reinterpret_cast<const float*>(&y);
#pragma unroll
  for (int e = 0; e < 4; ++e) a[e] += b[e];
  return x;
}

// One CTA moves vectors [begin, end) of its contiguous share.
template <int U, int MODE>
__global__ void __launch_bounds__(512)
    moveKernel(const uint4* a, const uint4* b, uint4* d0, uint4* d1, size_t nVec) {
  const size_t per = (nVec + gridDim.x - 1) / gridDim.x;
  const size_t begin = per * blockIdx.x;
  const size_t end = begin + per < nVec ? begin + per : nVec;
  const size_t stride = size_t(blockDim.x) * U;
  for (size_t v0 = begin + threadIdx.x; v0 < end; v0 += stride) {
    uint4 x[U], y[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t v = v0 + size_t(u) * blockDim.x;
      if (v < end) x[u] = __ldcg(a + v);
    }
    if (MODE == kReduce) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const size_t v = v0 + size_t(u) * blockDim.x;
        if (v < end) y[u] = __ldcg(b + v);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t v = v0 + size_t(u) * blockDim.x;
      if (v >= end) continue;
      uint4 r = MODE == kReduce ? addF4(x[u], y[u]) : x[u];
      d0[v] = r;
      if (d1 != nullptr) d1[v] = r;
    }
  }
}

// The kernel's own reduceCopy over the same contiguous CTA shares.
__global__ void __launch_bounds__(512)
    realKernel(const char* a, const char* b, char* d0, char* d1, size_t count) {
  __shared__ dev::CopyPlan plan;
  if (threadIdx.x == 0) {
    const size_t per =
        ((count + gridDim.x - 1) / gridDim.x + 3) / 4 * 4;  // 16-byte multiples of floats
    const size_t begin = per * blockIdx.x < count ? per * blockIdx.x : count;
    const size_t end = begin + per < count ? begin + per : count;
    plan.src[0] = a + begin * 4;
    plan.src[1] = b + begin * 4;
    plan.nSrc = 2;
    plan.dst[0] = d0 + begin * 4;
    plan.dst[1] = d1 != nullptr ? d1 + begin * 4 : nullptr;
    plan.nDst = d1 != nullptr ? 2 : 1;
    plan.count = end - begin;
    plan.aligned = true;
  }
  __syncthreads();
  dev::Reducer<float, dev::kFamilySum> red{};
  dev::reduceCopy<float, dev::kFamilySum>(plan, red);
}

struct Gpu {
  int dev = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  char* src = nullptr;
  char* src2 = nullptr;
  char* dst = nullptr;
  char* inbox = nullptr;  // what the peer pushes into
};

struct Pattern {
  const char* name;
  bool remote;
  int mode;          // kCopy / kReduce, or -1: the real reduceCopy
  bool pushDst;      // stores go to the peer (push) rather than to dst
  bool alsoPeer;     // ar-*: the result also goes to the peer's inbox
  bool remoteFirst;  // *-rf: the peer's source is source 0
};

void launch(const Pattern& pt, int unroll, int ctas, int threads, Gpu& g, Gpu& peer, size_t bytes) {
  const size_t nVec = bytes / 16;
  const char* a = pt.mode == kCopy && pt.remote && !pt.pushDst ? peer.src : g.src;
  const char* b = pt.remote ? peer.src : g.src2;
  char* d0 = pt.pushDst ? peer.inbox : g.dst;
  char* d1 = pt.alsoPeer ? peer.inbox : nullptr;
  if (pt.mode < 0) {
    if (pt.remoteFirst) std::swap(a, b);
    realKernel<<<ctas, threads, 0, g.stream>>>(a, b, d0, d1, bytes / 4);
    return;
  }
  auto* A = reinterpret_cast<const uint4*>(a);
  auto* B = reinterpret_cast<const uint4*>(b);
  auto* D0 = reinterpret_cast<uint4*>(d0);
  auto* D1 = reinterpret_cast<uint4*>(d1);
  if (pt.mode == kCopy) {
    if (unroll == 4)
      moveKernel<4, kCopy><<<ctas, threads, 0, g.stream>>>(A, B, D0, D1, nVec);
    else
      moveKernel<8, kCopy><<<ctas, threads, 0, g.stream>>>(A, B, D0, D1, nVec);
  } else {
    if (unroll == 4)
      moveKernel<4, kReduce><<<ctas, threads, 0, g.stream>>>(A, B, D0, D1, nVec);
    else
      moveKernel<8, kReduce><<<ctas, threads, 0, g.stream>>>(A, B, D0, D1, nVec);
  }
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = size_t(256) << 20;
  std::vector<int> ctasList{16, 32, 64, 128};
  int iters = 20, threads = 512;
  CLI::App app(
      "NVLink read / write / reduce bandwidth of CTA data movers, both GPUs of a pair at once, "
      "beside the\n"
      "kernel's own reduceCopy.",
      "mkernel-p2pbench");
  mktools::setupApp(app);
  app.add_option("--bytes", bytes,
                 "buffer size, rounded down to a multiple of 4096 (K, M, G accepted)")
      ->transform(mktools::kSize)
      ->default_str("256M");
  mktools::listOf(app.add_option("--ctas", ctasList, "CTA counts, one row each"))
      ->check(mktools::kPositive)
      ->default_str("16,32,64,128");
  app.add_option("--iters", iters, "timed runs per row")
      ->check(mktools::kPositive)
      ->capture_default_str();
  app.add_option("--threads", threads, "threads per CTA, a multiple of 32 up to 512")
      ->capture_default_str();
  const int rc = mktools::parseArgs(app, argc, argv);
  if (rc >= 0) return rc;
  bytes = bytes / 4096 * 4096;
  if (bytes == 0 || iters < 1 || threads < 32 || threads > 512 || threads % 32 != 0) {
    std::fprintf(
        stderr,
        "mkernel-p2pbench: --bytes >= 4096, --iters >= 1, --threads a multiple of 32 up to 512\n");
    return 2;
  }
  int nDev = 0;
  MK_CUDA_OR_EXIT(cudaGetDeviceCount(&nDev));
  if (nDev < 1) {
    std::fprintf(stderr, "mkernel-p2pbench: no CUDA device\n");
    return 1;
  }
  int canPeer = 0;
  if (nDev >= 2) MK_CUDA_OR_EXIT(cudaDeviceCanAccessPeer(&canPeer, 0, 1));
  const int nGpu = nDev >= 2 && canPeer ? 2 : 1;
  Gpu gpu[2];
  for (int g = 0; g < nGpu; ++g) {
    Gpu& G = gpu[g];
    G.dev = g;
    MK_CUDA_OR_EXIT(cudaSetDevice(g));
    if (nGpu == 2) MK_CUDA_OR_EXIT(cudaDeviceEnablePeerAccess(1 - g, 0));
    MK_CUDA_OR_EXIT(cudaStreamCreateWithFlags(&G.stream, cudaStreamNonBlocking));
    MK_CUDA_OR_EXIT(cudaEventCreate(&G.start));
    MK_CUDA_OR_EXIT(cudaEventCreate(&G.stop));
    for (char** p : {&G.src, &G.src2, &G.dst, &G.inbox}) {
      MK_CUDA_OR_EXIT(cudaMalloc(p, bytes));
      MK_CUDA_OR_EXIT(cudaMemset(*p, 0, bytes));
    }
  }
  if (nGpu == 1) gpu[1] = gpu[0];  // "peer" = self: remote patterns are skipped
  cudaDeviceProp prop{};
  MK_CUDA_OR_EXIT(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "# mkernel-p2pbench: %s x %d%s, %zu MiB per buffer, %d threads per CTA, median of %d\n",
      prop.name, nGpu,
      nGpu == 2 ? " (peer access, both GPUs at once)" : " (no peer: local patterns only)",
      bytes >> 20, threads, iters);
  const Pattern patterns[] = {
      {"local", false, kCopy, false, false, false},
      {"pull", true, kCopy, false, false, false},
      {"push", true, kCopy, true, false, false},
      {"rs-pull", true, kReduce, false, false, false},
      {"ar-pull", true, kReduce, false, true, false},
      {"rs-real", true, -1, false, false, false},
      {"rs-real-rf", true, -1, false, false, true},
      {"ar-real", true, -1, false, true, false},
      {"ar-real-rf", true, -1, false, true, true},
      {"local-real", false, -1, false, false, false},
  };
  std::printf("%-12s %6s %6s %12s %12s\n", "pattern", "ctas", "unroll", "GPU0 GB/s", "GPU1 GB/s");
  for (const Pattern& pt : patterns) {
    if (pt.remote && nGpu < 2) continue;
    for (int unroll : {4, 8}) {
      if (pt.mode < 0 && unroll == 8) continue;  // reduceCopy has its own
      for (int ctas : ctasList) {
        std::vector<float> ms[2];
        for (int it = -3; it < iters; ++it) {
          for (int g = 0; g < nGpu; ++g) {
            MK_CUDA_OR_EXIT(cudaSetDevice(g));
            MK_CUDA_OR_EXIT(cudaStreamSynchronize(gpu[g].stream));
          }
          for (int g = 0; g < nGpu; ++g) {
            MK_CUDA_OR_EXIT(cudaSetDevice(g));
            MK_CUDA_OR_EXIT(cudaEventRecord(gpu[g].start, gpu[g].stream));
            launch(pt, unroll, ctas, threads, gpu[g], gpu[nGpu == 2 ? 1 - g : g], bytes);
            MK_CUDA_OR_EXIT(cudaGetLastError());
            MK_CUDA_OR_EXIT(cudaEventRecord(gpu[g].stop, gpu[g].stream));
          }
          for (int g = 0; g < nGpu; ++g) {
            MK_CUDA_OR_EXIT(cudaSetDevice(g));
            MK_CUDA_OR_EXIT(cudaEventSynchronize(gpu[g].stop));
            float t = 0;
            MK_CUDA_OR_EXIT(cudaEventElapsedTime(&t, gpu[g].start, gpu[g].stop));
            if (it >= 0) ms[g].push_back(t);
          }
        }
        double gbs[2] = {0, 0};
        for (int g = 0; g < nGpu; ++g) {
          std::sort(ms[g].begin(), ms[g].end());
          gbs[g] = static_cast<double>(bytes) / (ms[g][ms[g].size() / 2] * 1e-3) / 1e9;
        }
        char second[32] = "-";
        if (nGpu == 2) std::snprintf(second, sizeof(second), "%.1f", gbs[1]);
        std::printf("%-12s %6d %6s %12.1f %12s\n", pt.name, ctas,
                    pt.mode < 0 ? "real" : std::to_string(unroll).c_str(), gbs[0], second);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
