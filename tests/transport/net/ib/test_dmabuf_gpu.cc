// The GPU half of GPU-memory registration for verbs: no machine here has a
// GPU and an RDMA NIC together, so the DMA-BUF export runs on the GPU machine (label gpu) and the
// registration of an fd runs in the Soft-RoCE VM with host memory (test_net_verbs).
#include "tests/catch.h"

#include <cuda_runtime_api.h>
#include <sys/types.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "transport/net/ib/cuda_dmabuf.h"

namespace ib = mkernel::net::ib;

TEST_CASE("gpu: device memory exports as a DMA-BUF fd of its size (cuMemGetHandleForAddressRange)",
          "[gpu]") {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
    FAIL("no CUDA device: the gpu tier needs one");
  std::string why;
  const ib::CudaGpuSupport& s = ib::cudaGpuSupport(&why);
  INFO(why);
  REQUIRE(s.gpuPresent);
  const size_t bytes = size_t(4) << 20;
  void* dev = nullptr;
  REQUIRE(cudaMalloc(&dev, bytes) == cudaSuccess);
  std::vector<char> host(16);
  CHECK(ib::cudaIsDevicePointer(dev));
  CHECK_FALSE(ib::cudaIsDevicePointer(host.data()));
  WARN("DMA-BUF supported by every device: " << (s.dmabufSupported ? "yes" : "no")
                                             << "; compute capability " << s.minComputeMajor
                                             << ".x");
  int fd = -1;
  const mkernel::Result r = ib::cudaExportDmabuf(reinterpret_cast<uintptr_t>(dev), bytes, &fd);
  if (s.dmabufSupported) {
    INFO(mkernel::lastError());
    REQUIRE(r == mkernel::Result::Success);
    REQUIRE(fd >= 0);
    const off_t size = lseek(fd, 0, SEEK_END);  // a DMA-BUF fd reports its buffer's size
    CHECK(size >= static_cast<off_t>(bytes));
    close(fd);
  } else {
    CHECK(r != mkernel::Result::Success);
    CHECK(std::string(mkernel::lastError()).find("cuMemGetHandleForAddressRange") !=
          std::string::npos);
  }
  cudaFree(dev);
}
