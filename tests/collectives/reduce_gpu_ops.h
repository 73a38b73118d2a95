// NCCL's device arithmetic, run on the GPU with the same CUDA intrinsics NCCL 2.28 uses
// (src/device/reduce_kernel.h, sm_90), so that a gpu-label test can compare collectives/
// reduce_host.h with the hardware bit for bit. Plain host header; reduce_gpu_ops.cu implements it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "collectives/types.h"

namespace mkernel {
namespace coll {
namespace test {

enum class GpuBinaryOp : int { Add = 0, Mul = 1, Min = 2, Max = 3 };

// false (with *why) when there is no usable GPU.
bool gpuAvailable(std::string* why);

// out[i] = a[i] OP b[i] in dtype `t` (raw element bits), as NCCL's FuncSum / FuncProd /
// FuncMinMax compute one element on sm_90. n elements of each buffer.
bool gpuBinary(DataType t, GpuBinaryOp op, const void* a, const void* b, void* out, size_t n,
               std::string* why);

// out[i] = in[i] converted to `t` (fp16/bf16: round to nearest; fp8: __nv_cvt_float_to_fp8 with
// __NV_SATFINITE, what NCCL uses for Avg's scalar).
bool gpuFromFloat(DataType t, const float* in, void* out, size_t n, std::string* why);

// out[i] = the half in[i] converted to fp8 by the constructor NCCL's fp8 reductions use.
bool gpuHalfToFp8(bool e5m2, const uint16_t* in, uint8_t* out, size_t n, std::string* why);

}  // namespace test
}  // namespace coll
}  // namespace mkernel
