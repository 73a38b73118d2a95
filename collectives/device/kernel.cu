// The kernels' host side: launching the persistent kernel and the launch path's kernels, warm-up,
// occupancy and local-memory queries. The device code is one translation unit, this one: the
// files below hold one algorithm each and are included here in order (docs/KERNEL.md).
#include <cuda_runtime.h>

#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/algo/algo.h"
#include "collectives/device/launch.h"
#include "collectives/device/reduce.cuh"
#include "collectives/device/sync.cuh"
#include "collectives/algo/hier_staged.h"
#include "collectives/route/launch_path.h"
#include "collectives/algo/staged.h"
#include "collectives/algo/staged_ring.h"
#include "collectives/types.h"

#include "collectives/device/common.cuh"
#include "collectives/device/direct.cuh"
#include "collectives/device/staged.cuh"
#include "collectives/device/hier.cuh"
#include "collectives/device/persistent.cuh"
#include "collectives/device/launch_direct.cuh"
#include "collectives/device/ll.cuh"
#include "collectives/device/launch_kernels.cuh"
#include "collectives/device/ll_batch.cuh"

namespace mkernel {
namespace coll {
namespace dev {

__global__ void probeKernel() {}
}  // namespace dev

int probeFreshStreams(int n, double seconds) {
  std::vector<cudaStream_t> streams;
  for (int i = 0; i < n; ++i) {
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) break;
    dev::probeKernel<<<1, 32, 0, s>>>();
    streams.push_back(s);
  }
  (void)cudaGetLastError();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int ran = 0;
  std::vector<bool> done(streams.size(), false);
  while (std::chrono::steady_clock::now() < deadline && ran < static_cast<int>(streams.size())) {
    for (size_t i = 0; i < streams.size(); ++i)
      if (!done[i] && cudaStreamQuery(streams[i]) == cudaSuccess) {
        done[i] = true;
        ++ran;
      }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  (void)cudaGetLastError();
  for (cudaStream_t s : streams) (void)cudaStreamDestroy(s);  // pending work still completes
  return ran;
}

Result persistentKernelLocalBytes(size_t* out) {
  cudaFuncAttributes attr;
  // Also loads the kernels now (CUDA's lazy loading would load a kernel at its first launch, and
  // loading waits for running kernels; NCCL queries its kernels at init for the same reason).
  cudaError_t err = cudaFuncGetAttributes(&attr, dev::launchLlBatchKernel);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "attributes of the LL batch kernel: %s",
                    cudaGetErrorString(err));
  size_t batchLocal = attr.localSizeBytes;
  err = cudaFuncGetAttributes(&attr, dev::launchLlKernel);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "attributes of the LL kernel: %s",
                    cudaGetErrorString(err));
  if (attr.localSizeBytes > batchLocal) batchLocal = attr.localSizeBytes;
  err = cudaFuncGetAttributes(&attr, dev::launchDirectKernel);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "attributes of the direct-mode kernel: %s",
                    cudaGetErrorString(err));
  if (attr.localSizeBytes > batchLocal) batchLocal = attr.localSizeBytes;
  err = cudaFuncGetAttributes(&attr, dev::launchKernel);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "attributes of the launch-path kernel: %s",
                    cudaGetErrorString(err));
  const size_t launchLocal = attr.localSizeBytes > batchLocal ? attr.localSizeBytes : batchLocal;
  err = cudaFuncGetAttributes(&attr, dev::persistentKernel);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "attributes of the persistent kernel: %s",
                    cudaGetErrorString(err));
  *out = attr.localSizeBytes > launchLocal ? attr.localSizeBytes : launchLocal;
  return Result::Success;
}

Result warmKernels(cudaStream_t stream) {
  KernelParams p{};
  p.warmup = 1;
  dev::persistentKernel<<<1, kKernelThreads, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) {
    dev::launchKernel<<<1, kLaunchThreads, 0, stream>>>(p, WorkDesc{}, 0, 0, 0);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    dev::launchLlBatchKernel<<<1, kLaunchThreads, 0, stream>>>(p, LlBatch{});
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    dev::launchLlKernel<<<1, kLaunchThreads, 0, stream>>>(p, WorkDesc{}, 0, 0);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    dev::launchDirectKernel<<<1, kDirectThreads, 0, stream>>>(p, WorkDesc{}, 0, 0);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "warm-up launches of the kernels failed: %s",
                    cudaGetErrorString(err));
  return Result::Success;
}

Result launchPersistentKernel(const KernelParams& p, cudaStream_t stream) {
  dev::persistentKernel<<<p.nCtas, kKernelThreads, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError,
                    "rank %d: launching the persistent kernel (%d CTAs) failed: %s", p.rank,
                    p.nCtas, cudaGetErrorString(err));
  return Result::Success;
}

namespace {
// A launch-path kernel: with MKERNEL_PDL, through cudaLaunchKernelEx with programmatic stream
// serialization (the kernel then waits for the stream's earlier work itself: pdlEnter).
template <typename... Params, typename... Args>
cudaError_t launchPath(void (*kernel)(Params...), const KernelParams& p, int nCtas, int threads,
                       cudaStream_t stream, Args&&... args) {
  if (p.pdl == 0) {
    kernel<<<nCtas, threads, 0, stream>>>(std::forward<Args>(args)...);
    return cudaGetLastError();
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(nCtas));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
}  // namespace

Result launchCollective(const KernelParams& p, const WorkDesc& d, int nCtas, uint64_t epoch,
                        uint64_t opIndex, int mode, cudaStream_t stream) {
  cudaError_t err;
  if (mode == kLaunchModeLl && p.nRanks > 1 && (p.ownKernels & kOwnKernelLl) != 0)
    err = launchPath(dev::launchLlKernel, p, nCtas, kLaunchThreads, stream, p, d, epoch, opIndex);
  else if (mode == kLaunchModeDirect && (p.ownKernels & kOwnKernelDirect) != 0)
    err =
        launchPath(dev::launchDirectKernel, p, nCtas, kDirectThreads, stream, p, d, epoch, opIndex);
  else
    err =
        launchPath(dev::launchKernel, p, nCtas, kLaunchThreads, stream, p, d, epoch, opIndex, mode);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError,
                    "rank %d: launching the launch-path kernel (%d CTAs) failed: %s", p.rank, nCtas,
                    cudaGetErrorString(err));
  return Result::Success;
}

Result launchLlBatch(const KernelParams& p, const LlBatch& b, int nCtas, cudaStream_t stream) {
  cudaError_t err = launchPath(dev::launchLlBatchKernel, p, nCtas, kLaunchThreads, stream, p, b);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError,
                    "rank %d: launching a batch of %d LL collectives (%d CTAs) failed: %s", p.rank,
                    b.nOps, nCtas, cudaGetErrorString(err));
  return Result::Success;
}

Result launchKernelCtasPerSm(int* out) {
  int batch = 0;
  cudaError_t err =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, dev::launchKernel, kLaunchThreads, 0);
  if (err == cudaSuccess)
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&batch, dev::launchLlBatchKernel,
                                                        kLaunchThreads, 0);
  int own = 0;
  if (err == cudaSuccess)
    err =
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&own, dev::launchLlKernel, kLaunchThreads, 0);
  if (err == cudaSuccess && own < batch) batch = own;
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError,
                    "occupancy query of the launch-path kernels failed: %s",
                    cudaGetErrorString(err));
  if (batch < *out) *out = batch;  // an LL batch takes up to as many CTAs as one op
  return Result::Success;
}

Result directKernelCtasPerSm(int* out) {
  cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, dev::launchDirectKernel,
                                                                  kDirectThreads, 0);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError,
                    "occupancy query of the direct-mode kernel failed: %s",
                    cudaGetErrorString(err));
  return Result::Success;
}

Result persistentKernelCtasPerSm(int* out) {
  cudaError_t err =
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, dev::persistentKernel, kKernelThreads, 0);
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError,
                    "occupancy query of the persistent kernel failed: %s", cudaGetErrorString(err));
  return Result::Success;
}

}  // namespace coll
}  // namespace mkernel
