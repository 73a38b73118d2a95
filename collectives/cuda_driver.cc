#include "collectives/cuda_driver.h"

#include <cuda.h>

#include <mutex>
#include <string>

namespace mkernel {
namespace coll {
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
    return MK_ERROR(Result::UnhandledCudaError, "setting CU_CTX_LMEM_RESIZE_TO_MAX on the context failed: CUresult %d",
                    static_cast<int>(r));
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
  CUresult r = memOps().wait32(stream, reinterpret_cast<CUdeviceptr>(addr), value,
                               cmp == WaitCmp::Geq ? CU_STREAM_WAIT_VALUE_GEQ : CU_STREAM_WAIT_VALUE_EQ);
  if (r != CUDA_SUCCESS)
    return MK_ERROR(Result::UnhandledCudaError, "cuStreamWaitValue32(%p, %u) failed: CUresult %d",
                    static_cast<void*>(addr), value, static_cast<int>(r));
  return Result::Success;
}

}  // namespace cudrv
}  // namespace coll
}  // namespace mkernel
