#include "transport/net/ib/cuda_dmabuf.h"

#include <cuda.h>
#include <dlfcn.h>

#include <mutex>

#include "common/dl.h"
#include "common/log.h"

namespace mkernel {
namespace net {
namespace ib {
namespace {

struct CudaDriver {
  CUresult (*init)(unsigned int) = nullptr;
  CUresult (*deviceGetCount)(int*) = nullptr;
  CUresult (*deviceGet)(CUdevice*, int) = nullptr;
  CUresult (*deviceGetAttribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*pointerGetAttribute)(void*, CUpointer_attribute, CUdeviceptr) = nullptr;
  CUresult (*memGetHandleForAddressRange)(void*, CUdeviceptr, size_t, CUmemRangeHandleType,
                                          unsigned long long) = nullptr;
  CUresult (*getErrorString)(CUresult, const char**) = nullptr;
  bool ok = false;
};

struct Probe {
  CudaDriver drv;
  CudaGpuSupport support;
  std::string why;
};

void probe(Probe* p) {
  static const char* const kNames[] = {"libcuda.so.1", "libcuda.so", nullptr};
  void* h = dlOpenFirst(kNames, RTLD_NOW | RTLD_LOCAL, &p->why);
  if (h == nullptr) {
    p->why = "no CUDA driver (" + p->why + ")";
    return;
  }
  CudaDriver& d = p->drv;
  DlSymbol syms[] = {
      {"cuInit", reinterpret_cast<void**>(&d.init), true},
      {"cuDeviceGetCount", reinterpret_cast<void**>(&d.deviceGetCount), true},
      {"cuDeviceGet", reinterpret_cast<void**>(&d.deviceGet), true},
      {"cuDeviceGetAttribute", reinterpret_cast<void**>(&d.deviceGetAttribute), true},
      {"cuPointerGetAttribute", reinterpret_cast<void**>(&d.pointerGetAttribute), true},
      {"cuMemGetHandleForAddressRange", reinterpret_cast<void**>(&d.memGetHandleForAddressRange),
       false},
      {"cuGetErrorString", reinterpret_cast<void**>(&d.getErrorString), false},
  };
  if (dlLoadSymbols(h, "libcuda", syms, int(sizeof(syms) / sizeof(syms[0])), &p->why) !=
      Result::Success)
    return;
  int count = 0;
  if (d.init(0) != CUDA_SUCCESS || d.deviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
    p->why = "no CUDA device";
    return;
  }
  d.ok = true;
  CudaGpuSupport& s = p->support;
  s.gpuPresent = true;
  s.dmabufSupported = d.memGetHandleForAddressRange != nullptr;
  s.minComputeMajor = 1 << 20;
  for (int i = 0; i < count; ++i) {
    CUdevice dev;
    int dmabuf = 0, major = 0;
    if (d.deviceGet(&dev, i) != CUDA_SUCCESS) continue;
    d.deviceGetAttribute(&dmabuf, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev);
    d.deviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    if (!dmabuf) s.dmabufSupported = false;
    if (major < s.minComputeMajor) s.minComputeMajor = major;
  }
  MK_INFO(kLogInit | kLogNet, "NET/IB: %d CUDA device(s), DMA-BUF %s, lowest sm %d", count,
          s.dmabufSupported ? "supported" : "not supported", s.minComputeMajor);
}

Probe& probed() {
  static Probe p;
  static std::once_flag once;
  std::call_once(once, [] { probe(&p); });
  return p;
}

}  // namespace

const CudaGpuSupport& cudaGpuSupport(std::string* why) {
  Probe& p = probed();
  if (why) *why = p.why;
  return p.support;
}

bool cudaIsDevicePointer(const void* ptr) {
  Probe& p = probed();
  if (!p.drv.ok) return false;
  unsigned int type = 0;
  if (p.drv.pointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS)
    return false;
  return type == CU_MEMORYTYPE_DEVICE;
}

Result cudaExportDmabuf(uintptr_t base, size_t size, int* fd) {
  Probe& p = probed();
  if (!p.drv.ok || p.drv.memGetHandleForAddressRange == nullptr)
    return MK_ERROR(Result::SystemError,
                    "NET/IB: DMA-BUF export needs a CUDA driver with "
                    "cuMemGetHandleForAddressRange (%s)",
                    p.why.c_str());
  CUresult r = p.drv.memGetHandleForAddressRange(fd, static_cast<CUdeviceptr>(base), size,
                                                 CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (r != CUDA_SUCCESS) {
    const char* s = "unknown";
    if (p.drv.getErrorString) p.drv.getErrorString(r, &s);
    return MK_ERROR(Result::UnhandledCudaError,
                    "NET/IB: cuMemGetHandleForAddressRange(0x%lx, %zu) failed: %s",
                    static_cast<unsigned long>(base), size, s);
  }
  return Result::Success;
}

}  // namespace ib
}  // namespace net
}  // namespace mkernel
