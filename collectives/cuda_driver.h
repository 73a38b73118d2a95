// The CUDA driver entry points mkernel needs beyond the runtime: stream memory operations
// (cuStreamWriteValue32 / cuStreamWaitValue32), the doorbells of the persistent kernel.
//
// They are looked up at run time through cudaGetDriverEntryPointByVersion (the runtime finds
// libcuda itself), so libmkernel.so links no libcuda and loads on hosts without a driver; a
// missing entry point is an error message, never a crash.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/result.h"

namespace mkernel {
namespace coll {
namespace cudrv {

// Resolves the entry points once per process (thread-safe). Error: which one is missing.
Result loadMemOps();

// *addr = value when `stream` reaches this point (with a memory barrier before the write, so
// everything earlier on the stream is visible first). Legal during CUDA graph capture.
Result streamWriteValue32(cudaStream_t stream, uint32_t* addr, uint32_t value);
// Blocks `stream` until *addr == value. Legal during CUDA graph capture.
Result streamWaitValue32(cudaStream_t stream, uint32_t* addr, uint32_t value);

}  // namespace cudrv
}  // namespace coll
}  // namespace mkernel
