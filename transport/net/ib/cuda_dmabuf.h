// The few CUDA driver calls the verbs backend needs to register GPU memory, loaded with dlopen of
// libcuda.so.1 (docs/ARCHITECTURE.md, vendor libraries: the library loads, and the verbs backend
// runs, on hosts without a GPU). Used to export a device buffer as a DMA-BUF file descriptor for
// ibv_reg_dmabuf_mr, and to tell whether GPU memory can be registered at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/result.h"

namespace mkernel {
namespace net {
namespace ib {

struct CudaGpuSupport {
  bool gpuPresent = false;       // libcuda loads, cuInit succeeds, at least one device
  bool dmabufSupported = false;  // every device reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
  int minComputeMajor = 0;       // lowest compute capability major over the devices
};

// Probes once per process; never fails (no GPU is a valid answer), the reason goes to *why.
const CudaGpuSupport& cudaGpuSupport(std::string* why = nullptr);

// Whether `ptr` is device memory according to the CUDA driver (false without a GPU).
bool cudaIsDevicePointer(const void* ptr);

// Exports [base, base + size) (host-page aligned) of device memory as a DMA-BUF fd; the caller
// closes it.
Result cudaExportDmabuf(uintptr_t base, size_t size, int* fd);

}  // namespace ib
}  // namespace net
}  // namespace mkernel
