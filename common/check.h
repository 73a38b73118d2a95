// Checks of the calls mkernel makes into CUDA and the operating system, in the manner of NCCL's
// checks.h: one header, one form per kind of call. Each returns from the calling function with
// mkernel's Result and a message (MK_ERROR: logged at WARN, kept for ncclGetLastError) made of the
// caller's context and the error, as in "rank 2: cudaMalloc of the staging buffer failed: out of
// memory".
//   MK_CUDA_CHECK(call, fmt, ...)  a CUDA runtime call (cudaError_t): Result::UnhandledCudaError
//   MK_SYS_CHECK(call, fmt, ...)   a system call that returns -1 and sets errno:
//   Result::SystemError MK_CHECK(call)                 an mkernel call (common/result.h):
//   propagates its Result
// Programs that end at the first failure (the tools, the GPU tests' helpers) use
//   MK_CUDA_OR_EXIT(call)          prints "PROGRAM: CALL failed: ERROR (FILE:LINE)" to stderr and
//                                  exits with status 2
// The CUDA forms expand to cudaGetErrorString: the including file includes a CUDA runtime header.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/result.h"

#define MK_CUDA_CHECK(call, ...)                                                                 \
  do {                                                                                           \
    const cudaError_t mk_cuda_err_ = (call);                                                     \
    if (mk_cuda_err_ != cudaSuccess)                                                             \
      return ::mkernel::setErrorCause(::mkernel::Result::UnhandledCudaError, __FILE__, __LINE__, \
                                      cudaGetErrorString(mk_cuda_err_), __VA_ARGS__);            \
  } while (0)

#define MK_SYS_CHECK(call, ...)                                                           \
  do {                                                                                    \
    if ((call) == -1)                                                                     \
      return ::mkernel::setErrorCause(::mkernel::Result::SystemError, __FILE__, __LINE__, \
                                      std::strerror(errno), __VA_ARGS__);                 \
  } while (0)

#define MK_CUDA_OR_EXIT(call)                                                                   \
  do {                                                                                          \
    const cudaError_t mk_cuda_err_ = (call);                                                    \
    if (mk_cuda_err_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s: %s failed: %s (%s:%d)\n", program_invocation_short_name, #call, \
                   cudaGetErrorString(mk_cuda_err_), __FILE__, __LINE__);                       \
      std::exit(2);                                                                             \
    }                                                                                           \
  } while (0)
