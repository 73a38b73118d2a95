// GPU side of test_reduce_gpu.cc: one element per thread, the intrinsics NCCL 2.28 uses on sm_90
// (reduce_kernel.h: __hadd/__hmul/__hmin/__hmax for fp16 and bf16; fp8 through __half and back
// with the saturating constructor; fminf/fmaxf for float, fmin/fmax for double).
#include "reduce_gpu_ops.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstring>

namespace mkernel {
namespace coll {
namespace test {
namespace {

template <typename T>
struct Ops;

template <>
struct Ops<__half> {
  static __device__ __half add(__half a, __half b) { return __hadd(a, b); }
  static __device__ __half mul(__half a, __half b) { return __hmul(a, b); }
  static __device__ __half min(__half a, __half b) { return __hmin(a, b); }
  static __device__ __half max(__half a, __half b) { return __hmax(a, b); }
};
template <>
struct Ops<__nv_bfloat16> {
  static __device__ __nv_bfloat16 add(__nv_bfloat16 a, __nv_bfloat16 b) { return __hadd(a, b); }
  static __device__ __nv_bfloat16 mul(__nv_bfloat16 a, __nv_bfloat16 b) { return __hmul(a, b); }
  static __device__ __nv_bfloat16 min(__nv_bfloat16 a, __nv_bfloat16 b) { return __hmin(a, b); }
  static __device__ __nv_bfloat16 max(__nv_bfloat16 a, __nv_bfloat16 b) { return __hmax(a, b); }
};
template <typename F8>
struct Fp8Ops {
  static __device__ F8 add(F8 a, F8 b) { return F8(__hadd(__half(a), __half(b))); }
  static __device__ F8 mul(F8 a, F8 b) { return F8(__hmul(__half(a), __half(b))); }
  static __device__ F8 min(F8 a, F8 b) { return F8(__hmin(__half(a), __half(b))); }
  static __device__ F8 max(F8 a, F8 b) { return F8(__hmax(__half(a), __half(b))); }
};
template <>
struct Ops<__nv_fp8_e4m3> : Fp8Ops<__nv_fp8_e4m3> {};
template <>
struct Ops<__nv_fp8_e5m2> : Fp8Ops<__nv_fp8_e5m2> {};
template <>
struct Ops<float> {
  static __device__ float add(float a, float b) { return a + b; }
  static __device__ float mul(float a, float b) { return a * b; }
  static __device__ float min(float a, float b) { return fminf(a, b); }
  static __device__ float max(float a, float b) { return fmaxf(a, b); }
};
template <>
struct Ops<double> {
  static __device__ double add(double a, double b) { return a + b; }
  static __device__ double mul(double a, double b) { return a * b; }
  static __device__ double min(double a, double b) { return fmin(a, b); }
  static __device__ double max(double a, double b) { return fmax(a, b); }
};

template <typename T>
__global__ void binaryKernel(int op, const T* a, const T* b, T* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    T x = a[i], y = b[i];
    switch (op) {
      case 0:
        out[i] = Ops<T>::add(x, y);
        break;
      case 1:
        out[i] = Ops<T>::mul(x, y);
        break;
      case 2:
        out[i] = Ops<T>::min(x, y);
        break;
      default:
        out[i] = Ops<T>::max(x, y);
        break;
    }
  }
}

__global__ void fromFloatKernel(int dtype, const float* in, uint8_t* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    float f = in[i];
    switch (static_cast<DataType>(dtype)) {
      case DataType::Float16:
        reinterpret_cast<__half*>(out)[i] = __float2half_rn(f);
        break;
      case DataType::Bfloat16:
        reinterpret_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(f);
        break;
      case DataType::Fp8E4M3:
        out[i] = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
        break;
      default:
        out[i] = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2);
        break;
    }
  }
}

__global__ void halfToFp8Kernel(bool e5m2, const __half* in, uint8_t* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    if (e5m2) {
      __nv_fp8_e5m2 v(in[i]);
      out[i] = v.__x;
    } else {
      __nv_fp8_e4m3 v(in[i]);
      out[i] = v.__x;
    }
  }
}

// Device buffers for one call, freed on every path.
struct DevBufs {
  void* p[4] = {};
  ~DevBufs() {
    for (void* q : p)
      if (q) cudaFree(q);
  }
};

bool check(cudaError_t e, const char* what, std::string* why) {
  if (e == cudaSuccess) return true;
  *why = std::string(what) + ": " + cudaGetErrorString(e);
  return false;
}

template <typename T>
bool runBinary(int op, const void* a, const void* b, void* out, size_t n, std::string* why) {
  DevBufs d;
  const size_t bytes = n * sizeof(T);
  for (int i = 0; i < 3; ++i)
    if (!check(cudaMalloc(&d.p[i], bytes ? bytes : 1), "cudaMalloc", why)) return false;
  if (!check(cudaMemcpy(d.p[0], a, bytes, cudaMemcpyHostToDevice), "copy a", why)) return false;
  if (!check(cudaMemcpy(d.p[1], b, bytes, cudaMemcpyHostToDevice), "copy b", why)) return false;
  binaryKernel<T><<<1024, 256>>>(op, static_cast<const T*>(d.p[0]), static_cast<const T*>(d.p[1]),
                                 static_cast<T*>(d.p[2]), n);
  if (!check(cudaGetLastError(), "launch", why)) return false;
  return check(cudaMemcpy(out, d.p[2], bytes, cudaMemcpyDeviceToHost), "copy out", why);
}

}  // namespace

bool gpuAvailable(std::string* why) {
  int n = 0;
  if (!check(cudaGetDeviceCount(&n), "cudaGetDeviceCount", why)) return false;
  if (n == 0) {
    *why = "no CUDA device";
    return false;
  }
  cudaDeviceProp prop{};
  if (!check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties", why)) return false;
  if (prop.major < 9) {
    *why = "NCCL's fp8 arithmetic needs sm_90; device 0 is sm_" +
           std::to_string(prop.major * 10 + prop.minor);
    return false;
  }
  return true;
}

bool gpuBinary(DataType t, GpuBinaryOp op, const void* a, const void* b, void* out, size_t n,
               std::string* why) {
  const int o = static_cast<int>(op);
  switch (t) {
    case DataType::Float16:
      return runBinary<__half>(o, a, b, out, n, why);
    case DataType::Bfloat16:
      return runBinary<__nv_bfloat16>(o, a, b, out, n, why);
    case DataType::Fp8E4M3:
      return runBinary<__nv_fp8_e4m3>(o, a, b, out, n, why);
    case DataType::Fp8E5M2:
      return runBinary<__nv_fp8_e5m2>(o, a, b, out, n, why);
    case DataType::Float32:
      return runBinary<float>(o, a, b, out, n, why);
    case DataType::Float64:
      return runBinary<double>(o, a, b, out, n, why);
    default:
      *why = "gpuBinary: integer types are not tested on the GPU";
      return false;
  }
}

bool gpuFromFloat(DataType t, const float* in, void* out, size_t n, std::string* why) {
  DevBufs d;
  const size_t es = dataTypeSize(t);
  if (!check(cudaMalloc(&d.p[0], n * 4 + 1), "cudaMalloc", why)) return false;
  if (!check(cudaMalloc(&d.p[1], n * es + 1), "cudaMalloc", why)) return false;
  if (!check(cudaMemcpy(d.p[0], in, n * 4, cudaMemcpyHostToDevice), "copy in", why)) return false;
  fromFloatKernel<<<1024, 256>>>(static_cast<int>(t), static_cast<const float*>(d.p[0]),
                                 static_cast<uint8_t*>(d.p[1]), n);
  if (!check(cudaGetLastError(), "launch", why)) return false;
  return check(cudaMemcpy(out, d.p[1], n * es, cudaMemcpyDeviceToHost), "copy out", why);
}

bool gpuHalfToFp8(bool e5m2, const uint16_t* in, uint8_t* out, size_t n, std::string* why) {
  DevBufs d;
  if (!check(cudaMalloc(&d.p[0], n * 2 + 1), "cudaMalloc", why)) return false;
  if (!check(cudaMalloc(&d.p[1], n + 1), "cudaMalloc", why)) return false;
  if (!check(cudaMemcpy(d.p[0], in, n * 2, cudaMemcpyHostToDevice), "copy in", why)) return false;
  halfToFp8Kernel<<<1024, 256>>>(e5m2, static_cast<const __half*>(d.p[0]),
                                 static_cast<uint8_t*>(d.p[1]), n);
  if (!check(cudaGetLastError(), "launch", why)) return false;
  return check(cudaMemcpy(out, d.p[1], n, cudaMemcpyDeviceToHost), "copy out", why);
}

}  // namespace test
}  // namespace coll
}  // namespace mkernel
