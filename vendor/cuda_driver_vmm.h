// The cuMem entry points behind cuda_driver.h's vmm* functions, and the mapping step that
// vmmAlloc and vmmImportFd share. Internal to vendor/cuda_driver.cc; declared here so that
// tests/vendor/test_cuda_vmm.cc can run those functions against a fake driver (no GPU), with
// each call failing in turn.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <string>

#include "common/result.h"

namespace mkernel {
namespace cudrv {
namespace detail {

// The virtual-memory entry points (CUDA 10.2+; cuMemGetAddressRange is its _v2).
struct Vmm {
  CUresult (*deviceGet)(CUdevice*, int) = nullptr;
  CUresult (*deviceGetAttribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*,
                          CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                     unsigned long long) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                  unsigned long long) = nullptr;
  CUresult (*setAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*retain)(CUmemGenericAllocationHandle*, void*) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*addressRange)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*addressFree)(CUdeviceptr, size_t) = nullptr;
  CUresult (*exportFd)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                       unsigned long long) = nullptr;
  CUresult (*importFd)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType) = nullptr;
  Result status = Result::Success;
  std::string why;
};

// The entry points every vmm* function uses: the driver's, looked up once per process, or the
// table a test set.
const Vmm& vmm();
// Tests only: every vmm* function uses `fake` until this is called with nullptr. Not for use while
// another thread is inside a vmm* function.
void setVmmForTest(const Vmm* fake);

// Reserves `size` bytes of address space (aligned to `align`, 0: the default), maps `handle` there
// and lets cuDev read and write it, undoing its own steps when one fails. The handle's reference
// is the caller's: `keep` keeps it once mapped (vmmAlloc: the reference vmmFree and ncclMemFree
// release), otherwise it is released after the map, which then holds the memory (an import);
// on failure it is released either way. Error: which call failed.
Result mapReadWrite(const Vmm& v, CUmemGenericAllocationHandle handle, size_t size, size_t align,
                    CUdevice cuDev, bool keep, void** ptr);

}  // namespace detail
}  // namespace cudrv
}  // namespace mkernel
