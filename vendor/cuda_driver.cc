#include "vendor/cuda_driver.h"

#include <cuda.h>

#include <atomic>
#include <mutex>
#include <string>

#include "vendor/cuda_driver_vmm.h"

namespace mkernel {
namespace cudrv {
namespace {

// Signatures of the _v2 memops (CUDA 12+), which is what cudaGetDriverEntryPointByVersion(12000)
// returns for these names.
using WriteValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WaitValue32Fn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

struct MemOps {
  WriteValue32Fn write32 = nullptr;
  WaitValue32Fn wait32 = nullptr;
  Result status = Result::Success;
  std::string why;
};

Result lookup(const char* name, void** fn, std::string* why, unsigned int version = 12000) {
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, fn, version, cudaEnableDefault, &q);
  if (err != cudaSuccess || q != cudaDriverEntryPointSuccess || *fn == nullptr) {
    *why = std::string("CUDA driver entry point ") + name + " unavailable (" +
           (err != cudaSuccess ? cudaGetErrorString(err) : "symbol not found") + ")";
    return Result::UnhandledCudaError;
  }
  return Result::Success;
}

MemOps& memOps() {
  static MemOps ops;
  static std::once_flag once;
  std::call_once(once, [] {
    void* w = nullptr;
    void* v = nullptr;
    ops.status = lookup("cuStreamWriteValue32", &w, &ops.why);
    if (ops.status == Result::Success) ops.status = lookup("cuStreamWaitValue32", &v, &ops.why);
    ops.write32 = reinterpret_cast<WriteValue32Fn>(w);
    ops.wait32 = reinterpret_cast<WaitValue32Fn>(v);
  });
  return ops;
}

using CtxGetFlagsFn = CUresult (*)(unsigned int*);
using CtxSetFlagsFn = CUresult (*)(unsigned int);

}  // namespace

Result keepLocalMemory() {
  static CtxGetFlagsFn getFlags = nullptr;
  static CtxSetFlagsFn setFlags = nullptr;
  static Result status = Result::Success;
  static std::string why;
  static std::once_flag once;
  std::call_once(once, [] {
    void* g = nullptr;
    void* s = nullptr;
    status = lookup("cuCtxGetFlags", &g, &why, 12010);
    if (status == Result::Success) status = lookup("cuCtxSetFlags", &s, &why, 12010);
    getFlags = reinterpret_cast<CtxGetFlagsFn>(g);
    setFlags = reinterpret_cast<CtxSetFlagsFn>(s);
  });
  if (status != Result::Success) return MK_ERROR(status, "%s", why.c_str());
  unsigned int flags = 0;
  CUresult r = getFlags(&flags);
  if (r == CUDA_SUCCESS && (flags & CU_CTX_LMEM_RESIZE_TO_MAX) != 0) return Result::Success;
  if (r == CUDA_SUCCESS) r = setFlags(flags | CU_CTX_LMEM_RESIZE_TO_MAX);
  if (r != CUDA_SUCCESS)
    return MK_ERROR(Result::UnhandledCudaError,
                    "setting CU_CTX_LMEM_RESIZE_TO_MAX on the context failed: CUresult %d",
                    static_cast<int>(r));
  return Result::Success;
}

using detail::Vmm;

namespace {

// Read-write access for device cuDev to the mapping [base, base + size).
CUresult setReadWrite(const Vmm& v, CUdeviceptr base, size_t size, CUdevice cuDev) {
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = cuDev;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return v.setAccess(base, size, &access, 1);
}

Result cuFailed(const char* call, CUresult r) {
  return MK_ERROR(Result::UnhandledCudaError, "%s failed: CUresult %d", call, static_cast<int>(r));
}

std::atomic<const Vmm*> testVmm{nullptr};

}  // namespace

namespace detail {

const Vmm& vmm() {
  if (const Vmm* fake = testVmm.load(std::memory_order_acquire)) return *fake;
  static Vmm v;
  static std::once_flag once;
  std::call_once(once, [] {
    const struct {
      const char* name;
      void** fn;
    } table[] = {
        {"cuDeviceGet", reinterpret_cast<void**>(&v.deviceGet)},
        {"cuDeviceGetAttribute", reinterpret_cast<void**>(&v.deviceGetAttribute)},
        {"cuMemGetAllocationGranularity", reinterpret_cast<void**>(&v.granularity)},
        {"cuMemCreate", reinterpret_cast<void**>(&v.create)},
        {"cuMemAddressReserve", reinterpret_cast<void**>(&v.reserve)},
        {"cuMemMap", reinterpret_cast<void**>(&v.map)},
        {"cuMemSetAccess", reinterpret_cast<void**>(&v.setAccess)},
        {"cuMemRetainAllocationHandle", reinterpret_cast<void**>(&v.retain)},
        {"cuMemRelease", reinterpret_cast<void**>(&v.release)},
        {"cuMemGetAddressRange", reinterpret_cast<void**>(&v.addressRange)},
        {"cuMemUnmap", reinterpret_cast<void**>(&v.unmap)},
        {"cuMemAddressFree", reinterpret_cast<void**>(&v.addressFree)},
        {"cuMemExportToShareableHandle", reinterpret_cast<void**>(&v.exportFd)},
        {"cuMemImportFromShareableHandle", reinterpret_cast<void**>(&v.importFd)},
    };
    for (const auto& e : table) {
      v.status = lookup(e.name, e.fn, &v.why);
      if (v.status != Result::Success) return;
    }
  });
  return v;
}

void setVmmForTest(const Vmm* fake) {
  testVmm.store(fake, std::memory_order_release);
}

Result mapReadWrite(const Vmm& v, CUmemGenericAllocationHandle handle, size_t size, size_t align,
                    CUdevice cuDev, bool keep, void** ptr) {
  CUdeviceptr base = 0;
  CUresult r = v.reserve(&base, size, align, 0, 0);
  if (r != CUDA_SUCCESS) {
    (void)v.release(handle);
    return cuFailed("cuMemAddressReserve", r);
  }
  r = v.map(base, size, 0, handle, 0);
  if (r != CUDA_SUCCESS) {
    (void)v.addressFree(base, size);
    (void)v.release(handle);
    return cuFailed("cuMemMap", r);
  }
  if (!keep)
    (void)v.release(handle);  // the mapping holds the memory from here on (cuMemRelease's contract)
  r = setReadWrite(v, base, size, cuDev);
  if (r != CUDA_SUCCESS) {
    (void)v.unmap(base, size);
    (void)v.addressFree(base, size);
    if (keep) (void)v.release(handle);
    return cuFailed("cuMemSetAccess", r);
  }
  *ptr = reinterpret_cast<void*>(base);
  return Result::Success;
}

}  // namespace detail

using detail::mapReadWrite;
using detail::vmm;

namespace {

// The entry points, and the driver's handle of runtime device `dev`. Error: an entry point is
// missing, or cuDeviceGet failed.
Result vmmOn(int dev, const Vmm** v, CUdevice* cuDev) {
  const Vmm& t = vmm();
  if (t.status != Result::Success) return MK_ERROR(t.status, "%s", t.why.c_str());
  const CUresult r = t.deviceGet(cuDev, dev);
  if (r != CUDA_SUCCESS) return cuFailed("cuDeviceGet", r);
  *v = &t;
  return Result::Success;
}

}  // namespace

Result vmmAlloc(void** ptr, size_t bytes) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaSetDevice(dev);  // the primary context, as cudaMalloc would
  if (err != cudaSuccess)
    return MK_ERROR(Result::UnhandledCudaError, "cudaSetDevice(%d) failed: %s", dev,
                    cudaGetErrorString(err));
  const Vmm* vp = nullptr;
  CUdevice cuDev = 0;
  MK_CHECK(vmmOn(dev, &vp, &cuDev));
  const Vmm& v = *vp;
  int rdma = 0;
  if (v.deviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                           cuDev) != CUDA_SUCCESS)
    rdma = 0;
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = cuDev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (rdma != 0) prop.allocFlags.gpuDirectRDMACapable = 1;
  size_t gran = 0;
  CUresult r = v.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r != CUDA_SUCCESS || gran == 0) return cuFailed("cuMemGetAllocationGranularity", r);
  const size_t size = (bytes + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle handle = 0;
  r = v.create(&handle, size, &prop, 0);
  if (r != CUDA_SUCCESS) return cuFailed("cuMemCreate", r);
  // The handle's reference is kept, as NCCL keeps it: vmmFree and NCCL's ncclMemFree each free the
  // other's mappings.
  return mapReadWrite(v, handle, size, gran, cuDev, /*keep=*/true, ptr);
}

Result vmmFree(void* ptr) {
  const Vmm& v = vmm();
  if (v.status != Result::Success) return MK_ERROR(v.status, "%s", v.why.c_str());
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = v.retain(&handle, ptr);
  if (r != CUDA_SUCCESS)
    return MK_ERROR(
        Result::UnhandledCudaError,
        "%p is not a mapping of ncclMemAlloc (cuMemRetainAllocationHandle: CUresult %d)", ptr,
        static_cast<int>(r));
  (void)v.release(handle);  // the reference the retain just took; the allocation's own is below
  CUdeviceptr base = 0;
  size_t size = 0;
  r = v.addressRange(&base, &size, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) return cuFailed("cuMemGetAddressRange", r);
  r = v.unmap(base, size);
  if (r != CUDA_SUCCESS) return cuFailed("cuMemUnmap", r);
  r = v.release(handle);  // the last reference: the memory goes
  if (r != CUDA_SUCCESS) return cuFailed("cuMemRelease", r);
  r = v.addressFree(base, size);
  if (r != CUDA_SUCCESS) return cuFailed("cuMemAddressFree", r);
  return Result::Success;
}

Result vmmExportFd(void* ptr, int* fd, size_t* size) {
  *fd = -1;
  const Vmm& v = vmm();
  if (v.status != Result::Success) return MK_ERROR(v.status, "%s", v.why.c_str());
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = v.retain(&handle, ptr);
  if (r != CUDA_SUCCESS)
    return MK_ERROR(Result::UnhandledCudaError,
                    "%p is not a cuMem mapping (cuMemRetainAllocationHandle: CUresult %d)", ptr,
                    static_cast<int>(r));
  CUdeviceptr base = 0;
  r = v.addressRange(&base, size, reinterpret_cast<CUdeviceptr>(ptr));
  if (r == CUDA_SUCCESS) r = v.exportFd(fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  (void)v.release(handle);  // the retain's reference
  if (r != CUDA_SUCCESS) {
    *fd = -1;
    return cuFailed("cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)", r);
  }
  return Result::Success;
}

Result vmmImportFd(int fd, size_t size, int device, void** ptr) {
  *ptr = nullptr;
  const Vmm* vp = nullptr;
  CUdevice cuDev = 0;
  MK_CHECK(vmmOn(device, &vp, &cuDev));
  const Vmm& v = *vp;
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = v.importFd(&handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS)
    return cuFailed("cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR)", r);
  return mapReadWrite(v, handle, size, 0, cuDev, /*keep=*/false, ptr);
}

Result vmmGrantAccess(void* ptr, int device) {
  const Vmm* vp = nullptr;
  CUdevice cuDev = 0;
  MK_CHECK(vmmOn(device, &vp, &cuDev));
  const Vmm& v = *vp;
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = v.addressRange(&base, &size, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) return cuFailed("cuMemGetAddressRange", r);
  r = setReadWrite(v, base, size, cuDev);
  if (r != CUDA_SUCCESS) return cuFailed("cuMemSetAccess (another GPU of this process)", r);
  return Result::Success;
}

Result vmmUnmap(void* ptr) {
  const Vmm& v = vmm();
  if (v.status != Result::Success) return MK_ERROR(v.status, "%s", v.why.c_str());
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = v.addressRange(&base, &size, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) return cuFailed("cuMemGetAddressRange", r);
  r = v.unmap(base, size);
  if (r != CUDA_SUCCESS) return cuFailed("cuMemUnmap", r);
  r = v.addressFree(base, size);
  if (r != CUDA_SUCCESS) return cuFailed("cuMemAddressFree", r);
  return Result::Success;
}

Result loadMemOps() {
  MemOps& ops = memOps();
  if (ops.status != Result::Success) return MK_ERROR(ops.status, "%s", ops.why.c_str());
  return Result::Success;
}

Result streamWriteValue32(cudaStream_t stream, uint32_t* addr, uint32_t value) {
  MK_CHECK(loadMemOps());
  CUresult r = memOps().write32(stream, reinterpret_cast<CUdeviceptr>(addr), value,
                                CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r != CUDA_SUCCESS)
    return MK_ERROR(Result::UnhandledCudaError, "cuStreamWriteValue32(%p, %u) failed: CUresult %d",
                    static_cast<void*>(addr), value, static_cast<int>(r));
  return Result::Success;
}

Result streamWaitValue32(cudaStream_t stream, uint32_t* addr, uint32_t value, WaitCmp cmp) {
  MK_CHECK(loadMemOps());
  CUresult r =
      memOps().wait32(stream, reinterpret_cast<CUdeviceptr>(addr), value,
                      cmp == WaitCmp::Geq ? CU_STREAM_WAIT_VALUE_GEQ : CU_STREAM_WAIT_VALUE_EQ);
  if (r != CUDA_SUCCESS)
    return MK_ERROR(Result::UnhandledCudaError, "cuStreamWaitValue32(%p, %u) failed: CUresult %d",
                    static_cast<void*>(addr), value, static_cast<int>(r));
  return Result::Success;
}

}  // namespace cudrv
}  // namespace mkernel
